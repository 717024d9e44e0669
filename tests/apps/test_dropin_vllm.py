"""The vLLM tier: ``tokenizer_mode="delta_ray"`` through vLLM's own loader, chat renderer and OpenAI chat
front end (a stub engine client) equals vLLM's default mode, ``DELTA_RAY_VLLM=1`` keeps the mode and
renderer vLLM picks and its prompt IDs, and each request's tenant and session key
reach the tokenizing thread. Opt-in: ``python3 tests/tools/vllm_tier.py [--vllm 0.33|0.34|all]`` builds .venv-vllm
(or .venv-vllm-0.34: vllm --no-deps and a torch) and runs this file there; in the default environment it is skipped."""
from __future__ import annotations

import asyncio
import copy
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="the vLLM tier: run `python3 tests/tools/vllm_tier.py [--vllm 0.34]` (installs "
                                   "vllm --no-deps and torch into .venv-vllm or .venv-vllm-0.34)")

import exactness  # noqa: E402
from delta_ray.apps.dropin.folders import bundled_hf_folder  # noqa: E402
from delta_ray.apps.dropin.hf import STATE_ATTR  # noqa: E402

NAMES = ("qwen-3", "glm-4", "minimax-m3")  # the bundled tokenizers with a chat template


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("vllm")
    return {n: bundled_hf_folder(n, root) for n in NAMES}


@pytest.fixture(scope="module", params=NAMES)
def both(request, folders):
    from vllm.plugins import load_general_plugins
    from vllm.tokenizers import get_tokenizer
    load_general_plugins()  # as every vLLM process does: our entry point registers the mode
    folder = folders[request.param]
    return get_tokenizer(folder, tokenizer_mode="hf"), get_tokenizer(folder, tokenizer_mode="delta_ray")


def test_entry_point_registers_mode_and_renderer():
    from vllm.plugins import load_general_plugins
    from vllm.renderers.registry import RENDERER_REGISTRY
    from vllm.tokenizers.registry import TokenizerRegistry
    load_general_plugins()
    assert "delta_ray" in TokenizerRegistry.tokenizers and "delta_ray" in RENDERER_REGISTRY.renderers


def test_get_tokenizer_equals_default_mode(both, real_texts):
    hf, ours = both
    assert STATE_ATTR in ours.__dict__ and STATE_ATTR not in hf.__dict__
    texts = exactness.ADVERSARIAL + [real_texts["english"][:20000], real_texts["code"][:20000]]
    for t in texts:
        for ast in (True, False):
            assert ours.encode(t, add_special_tokens=ast) == hf.encode(t, add_special_tokens=ast)
    assert ours(texts)["input_ids"] == hf(texts)["input_ids"]
    ids = hf.encode(real_texts["multilingual"][:2000])
    assert ours.decode(ids) == hf.decode(ids)


def test_pickle_and_thread_pool_keep_the_mode(both, real_texts):
    """vLLM's cached tokenizer pickles by rebuilding its subclass around the original object, and its
    renderer deep-copies it into a thread pool: both must keep encoding through delta-ray."""
    from vllm.tokenizers.hf import maybe_make_thread_pool
    hf, ours = both
    t = real_texts["code"][:8000] + " I'\u017f"
    back = pickle.loads(pickle.dumps(ours))
    assert type(back).__name__.startswith("Cached") and STATE_ATTR in back.__dict__
    pooled = maybe_make_thread_pool(copy.copy(ours), 2)
    for tok in (back, pooled):
        assert tok.encode(t) == hf.encode(t)


def test_chat_renderer_equals_default_mode(both, real_texts):
    """vLLM's HfRenderer renders and tokenizes every chat turn with safe_apply_chat_template (the
    template given, as a served model's is once resolved, so no model config is needed here)."""
    from vllm.renderers.hf import safe_apply_chat_template
    hf, ours = both
    chat, template = [], hf.chat_template
    for turn in range(5):
        chat.append({"role": "user", "content": real_texts["english"][turn * 4000:(turn + 1) * 4000]})
        kw = dict(chat_template=template, tokenize=True, add_generation_prompt=True)
        want = safe_apply_chat_template(None, hf, chat, **kw)
        got = safe_apply_chat_template(None, ours, chat, **kw)
        assert isinstance(got, list) and got == want
        chat.append({"role": "assistant", "content": real_texts["code"][turn * 4000:(turn + 1) * 4000]})
    from delta_ray.apps.dropin import render
    assert template in render._compiled  # the mode's renders went through the memoized sandbox


# -- vLLM's OpenAI chat front end (bench/peers/vllm_front.py: vLLM's own request path, a stub engine) -----
@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """qwen-3 served by vLLM's chat front end in the default mode and in ``delta_ray``'s."""
    from bench.peers.vllm_front import FrontEnd, model_folder
    folder = model_folder("qwen-3", tmp_path_factory.mktemp("served"))
    return FrontEnd(folder, "hf"), FrontEnd(folder, "delta_ray")


class _ScopeSpy:
    """Every encode transformers' backend runs on a wrapped tokenizer, with the scope its thread saw
    (the class hook is delta-ray's; the spy wraps it, so it sees what the drop-in reads)."""

    def __init__(self, monkeypatch):
        from transformers.tokenization_utils_tokenizers import TokenizersBackend

        from delta_ray.apps.dropin.scope import current_scope
        self.calls: list[tuple[str, object]] = []
        hook = TokenizersBackend._encode_plus

        def spy(tok, text, *args, **kwargs):
            if STATE_ATTR in tok.__dict__ and isinstance(text, str):
                self.calls.append((text, current_scope()))
            return hook(tok, text, *args, **kwargs)
        monkeypatch.setattr(TokenizersBackend, "_encode_plus", spy)


def _agent_chat(real_texts, marker: str, turns: int, first: int = 12000, step: int = 700):
    """An agent's chat as it grows: a long first message, then assistant turns (with reasoning and a
    tool call) and tool/user messages; ``marker`` makes every render of it recognisable."""
    eng, code = real_texts["english"], real_texts["code"]
    chat = [{"role": "system", "content": f"[{marker}] You are an agent."},
            {"role": "user", "content": eng[:first]}]
    out = [list(chat)]
    for t in range(1, turns):
        a = eng[first + t * step:first + t * step + step]
        if t % 2:
            chat.append({"role": "assistant", "content": f"<think>{a[:200]}</think>{a[200:]}",
                         "tool_calls": [{"id": f"c{t}", "type": "function",
                                         "function": {"name": "read", "arguments": json.dumps({"line": t})}}]})
            chat.append({"role": "tool", "tool_call_id": f"c{t}", "content": code[t * step:(t + 1) * step]})
        else:
            chat.append({"role": "assistant", "content": a})
            chat.append({"role": "user", "content": code[(t + 7) * step:(t + 8) * step]})
        out.append(list(chat))
    return out


def test_the_mode_serves_through_the_scoped_renderer(served):
    from delta_ray.apps.dropin.binding import is_carrying
    from delta_ray.apps.dropin.vllm_scope import POOLS
    hf, ours = served
    assert type(hf.renderer).__name__ == "HfRenderer" and type(ours.renderer).__name__ == "DeltaRayRenderer"
    assert all(is_carrying(getattr(ours.renderer, pool)) for pool in POOLS)
    assert STATE_ATTR in ours.renderer.tokenizer.__dict__


def test_served_turns_equal_the_default_mode_and_see_their_own_tenant(served, real_texts, monkeypatch):
    """Agent chats through vLLM's OpenAI chat layer, concurrently: keyed (the session bound as the
    x-session-id middleware binds it) and keyless, in two cache_salt tenants and without one; every
    turn's prompt IDs equal the default mode's, and every encode on vLLM's renderer threads sees its
    own request's tenant and key. Fails if the renderer's pools do not carry the scope (the threads
    would tokenize in the shared namespace) or a request is bound another's salt."""
    from delta_ray.apps.dropin.scope import Scope, request_scope
    hf, ours = served
    spy = _ScopeSpy(monkeypatch)
    plan = [(f"conv{i}", ("alpha", "beta", None)[i % 3], i % 2 == 0) for i in range(6)]
    chats = {m: _agent_chat(real_texts, m, turns=5, first=9000 + 700 * i) for i, (m, _, _) in enumerate(plan)}

    async def turn(front, t):
        async def one(marker, salt, keyed):
            request = front.request(chats[marker][t], cache_salt=salt)
            if keyed:
                with request_scope(session=marker):
                    return (await front.chat(request))[0]
            return (await front.chat(request))[0]
        return await asyncio.gather(*(one(*p) for p in plan))

    for t in range(5):
        want, got = asyncio.run(turn(hf, t)), asyncio.run(turn(ours, t))
        assert got == want, f"turn {t}"
    seen = {}
    for text, scope in spy.calls:
        markers = [m for m, _, _ in plan if f"[{m}]" in text]
        assert len(markers) == 1, text[:80]
        seen.setdefault(markers[0], set()).add(scope)
    for marker, salt, keyed in plan:
        assert seen[marker] == {Scope(marker if keyed else None, salt)}, (marker, seen[marker])


def test_served_request_options_equal_the_default_mode(served, real_texts):
    """Request fields that change the encode: ``add_special_tokens``, ``truncate_prompt_tokens``
    (vLLM's renderer truncates through the tokenizer), a completion-style continued final message."""
    hf, ours = served
    chat = _agent_chat(real_texts, "opts", turns=3)[-1]
    variants = [{}, {"add_special_tokens": True}, {"truncate_prompt_tokens": 1000},
                {"truncate_prompt_tokens": 1000, "truncation_side": "left"},
                {"add_generation_prompt": False, "continue_final_message": True}]
    for fields in variants:
        want = asyncio.run(hf.chat(hf.request(chat, cache_salt="x", **fields)))[0]
        got = asyncio.run(ours.chat(ours.request(chat, cache_salt="x", **fields)))[0]
        assert got == want, fields


def test_no_state_crosses_tenants_through_the_front_end(served, real_texts):
    """With the drop-in's sessions: the same chat in two cache_salt tenants (and the same session key)
    never continues the other tenant's conversation, while within a tenant it does. Skipped where the
    drop-in has no sessions."""
    from delta_ray.apps.dropin.scope import request_scope
    hf, ours = served
    snap = ours.renderer.tokenizer.__dict__[STATE_ATTR].current(ours.renderer.tokenizer)
    table = getattr(snap, "sessions", None)
    if table is None:
        pytest.skip("this drop-in has no sessions")
    turns = _agent_chat(real_texts, "tenants", turns=3, first=20000)

    def serve(t, salt, keyed):
        async def go():
            request = ours.request(turns[t], cache_salt=salt)
            if keyed:
                with request_scope(session="same-key"):
                    return (await ours.chat(request))[0]
            return (await ours.chat(request))[0]
        got = asyncio.run(go())
        assert got == asyncio.run(hf.chat(hf.request(turns[t], cache_salt=salt)))[0]

    for keyed in (True, False):
        table.clear()
        before = dict(table.stats)
        serve(0, "tenant-a", keyed)
        serve(1, "tenant-b", keyed)  # extends tenant-a's conversation: must not continue it
        serve(1, None, keyed)
        assert table.stats["continued"] == before["continued"], keyed
        serve(1, "tenant-a", keyed)  # within tenant-a it does
        assert table.stats["continued"] == before["continued"] + 1, keyed


# -- DELTA_RAY_VLLM=1: under whatever mode vLLM picks (tests/tools/vllm_switch_check.py, one process each) --
def _switch_models(root, real_texts):
    """qwen-3 (vLLM's `hf` mode), DeepSeek V4 (vLLM picks `deepseek_v4` by architecture: DeepSeek's
    Python encoder renders the prompt), Mistral Tekken as a transformers folder (`hf`) and as a
    Mistral repository (vLLM picks `mistral`: mistral_common's tokenizer, which delta-ray leaves)."""
    from importlib.resources import files

    from bench import zoo
    from bench.peers.vllm_front import folder_with_config, model_folder
    tekken = folder_with_config(zoo.tokenizer_path("mistral-tekken-240911").parent, "mistral", root)
    repo = Path(folder_with_config(tekken, "mistral", root / "repo"))
    (repo / "tekken.json").write_bytes((files("mistral_common") / "data" / "tekken_240911.json").read_bytes())
    (repo / "consolidated.safetensors").write_bytes(b"")  # what vLLM looks for to call a folder a Mistral repo
    return [{"name": "qwen-3", "folder": model_folder("qwen-3", root)},
            {"name": "deepseek-v4",
             "folder": folder_with_config(zoo.tokenizer_path("otc-deepseek-v4").parent, "deepseek-v4", root)},
            {"name": "tekken-hf", "folder": tekken},
            {"name": "tekken-mistral", "folder": str(repo)}]


def _run_switch_check(spec_path, out_path, on: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "DELTA_RAY_VLLM"}
    if on:
        env["DELTA_RAY_VLLM"] = "1"
    tool = Path(__file__).resolve().parents[1] / "tools" / "vllm_switch_check.py"
    done = subprocess.run([sys.executable, str(tool), str(spec_path), str(out_path)], env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(Path(out_path).read_text())


def test_the_switch_keeps_vllms_own_mode_renderer_and_ids(tmp_path, real_texts):
    """With ``DELTA_RAY_VLLM=1`` every model is rendered by the renderer vLLM picks without it, with
    the request's scope bound, its transformers tokenizer encodes through delta-ray (its sessions
    continue the chat turn after turn) and every turn's prompt IDs equal vLLM's without delta-ray;
    the `mistral` mode is left as vLLM loads it. Fails if the switch replaces a model-specific
    renderer (DeepSeek V4's prompt would be rendered by the Jinja path, or not at all), or wraps no
    tokenizer."""
    models = _switch_models(tmp_path, real_texts)
    chats = [[dict(m) for m in chat] for chat in _agent_chat(real_texts, "switch", turns=4, first=40000)]
    for chat in chats:  # plain user/assistant/tool turns: every renderer here takes them
        for m in chat:
            m.pop("tool_calls", None)
            if m["role"] == "tool":
                m["role"] = "user"
                m.pop("tool_call_id", None)
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"models": models, "chats": chats}))
    stock = _run_switch_check(spec, tmp_path / "stock.json", on=False)
    ours = _run_switch_check(spec, tmp_path / "ours.json", on=True)
    expected_modes = {"qwen-3": "hf", "deepseek-v4": "deepseek_v4", "tekken-hf": "hf", "tekken-mistral": "mistral"}
    for name, want_mode in expected_modes.items():
        a, b = stock[name], ours[name]
        assert a["mode"] == b["mode"] == want_mode, (name, a["mode"], b["mode"])
        assert not a["wrapped"] and not a["carrying"], name
        for turn, (x, y) in enumerate(zip(a["ids"], b["ids"])):
            assert x == y, (name, turn)
        if want_mode == "mistral":
            assert b["renderer"] == a["renderer"] and not b["wrapped"], name
        else:
            assert b["renderer"] == f"Scoped{a['renderer']}" and b["wrapped"] and b["carrying"], name
            # Tekken's template writes the system prompt into the LAST user message, so a turn that
            # adds a user message rewrites the text far from its end: a new conversation, exactly
            continued = 1 if name == "tekken-hf" else len(chats) - 1
            assert b["continued"] >= continued, (name, b["stats"])
