"""The vLLM tier: ``tokenizer_mode="delta_ray"`` through vLLM's own loader and chat renderer equals
vLLM's default mode. Opt-in: ``python3 tests/tools/vllm_tier.py`` builds .venv-vllm (vllm --no-deps and a
torch) and runs this file there; in the default environment it is skipped."""
from __future__ import annotations

import copy
import pickle

import pytest

pytest.importorskip("vllm", reason="the vLLM tier: run `python3 tests/tools/vllm_tier.py` (installs vllm==0.33.0 "
                                   "--no-deps and torch into .venv-vllm)")

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
