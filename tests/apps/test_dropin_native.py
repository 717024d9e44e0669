"""The drop-in with the fast engine on its own native threads (``native_threads``), in a fresh process.

fastokens sizes its thread pool once per process, and delta-ray pins it to one thread at import, so
the mode can only be tested in a process where nothing has used fastokens yet: each test runs a
script in a child process. Texts are above the default cut threshold (131,072 characters), so they
are cut at safe cuts and the pieces go to the engine in one call that spreads them over its threads;
every answer is compared with stock transformers.
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
import threading

import pytest

pytest.importorskip("transformers", reason="the drop-in tests need transformers 5.23 (the test extra)")
pytestmark = pytest.mark.skipif(importlib.util.find_spec("fastokens") is None,
                                reason="the fast tier's engine (fastokens) is not installed")

_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")

# Shared by the child scripts: a fastokens engine that is wrong on every text holding U+017F (it
# reverses that text's IDs), so a guard that is skipped shows up as a wrong answer.
_PRELUDE = textwrap.dedent("""
    import copy, os, sys, tempfile
    import numpy as np
    from transformers import AutoTokenizer
    from delta_ray.apps.dropin import wrap_tokenizer
    from delta_ray.apps.dropin import hf as dropin_hf
    from delta_ray.apps.dropin.folders import bundled_hf_folder
    from delta_ray.apps.sample_text import corpus
    from delta_ray._core.encoder import ReferenceEncoder
    from delta_ray._engine import native
    from delta_ray._engine.native import FastEncoder
    from delta_ray._verify.guard_probe import guard_set_for
    from delta_ray._engine.engine import FastTier

    class WrongOnLongS(FastEncoder):
        calls = 0
        def _lie(self, t, ids):
            return ids[::-1].copy() if "\\u017f" in t else ids
        def encode_pieces(self, texts):
            WrongOnLongS.calls += 1
            return [self._lie(t, a) for t, a in zip(texts, super().encode_pieces(texts))]
        def encode_flat(self, texts):
            from delta_ray._core.assembly import flat_from_pieces
            return flat_from_pieces(self.encode_pieces(list(texts)))
        def encode_lists(self, texts):
            lists = super().encode_lists(texts)
            WrongOnLongS.calls += 1
            return None if lists is None else [l[::-1] if "\\u017f" in t else l for t, l in zip(texts, lists)]

    root = tempfile.mkdtemp()
    prose, code, multi = corpus("english", 400_000), corpus("code", 400_000), corpus("multilingual", 100_000)

    def live(tok):
        return tok.__dict__[dropin_hf.STATE_ATTR].current(tok).tokenizer.core

    def engine_threads():
        # fastokens' own worker threads in this process (it names them fastokens-N)
        names = []
        for t in os.listdir("/proc/self/task"):
            try:
                names.append(open(f"/proc/self/task/{t}/comm").read().strip())
            except OSError:
                pass
        return sum(n.startswith("fastokens") for n in names)
""")


def _run(script: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTOKENS_") and k != "RAY_RAYLET_PID"}
    env["PYTHONPATH"] = os.path.abspath(_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    res = subprocess.run([sys.executable, "-c", _PRELUDE + textwrap.dedent(script)], capture_output=True,
                         text=True, env=env, cwd=_ROOT, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-6000:]
    return res.stdout


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts threads in /proc")
def test_native_threads_equal_stock_above_the_cut_threshold():
    """qwen-3 (no template) and llama3.2 (a BOS template): long texts and chats, cut at safe cuts into
    several pieces that the engine encodes on its own threads, joined in order; a guarded code point
    inside some pieces (the engine is made wrong on it, so a skipped guard fails); equal to stock."""
    out = _run("""
        assert native.allow_native_threads(in_worker=True), native.fast_engine_threads()
        cores = len(os.sched_getaffinity(0))
        for name in ("qwen-3", "llama3.2"):
            folder = bundled_hf_folder(name, root)
            stock = AutoTokenizer.from_pretrained(folder)
            plain = wrap_tokenizer(copy.copy(stock), native_threads=True, engine="reference")
            loaded = live(plain).loaded  # the live backend's configuration and reference
            wrong = WrongOnLongS(loaded.config_bytes, "fastokens")
            assert wrong.check_lists() is True  # here, not in the background: every call below uses the lists
            guard = guard_set_for(loaded.config_bytes, wrong, ref_tokenizer=loaded.tokenizer, use_cache=False,
                                  code_points=[0x17F, 0xE9, ord("a")])
            assert not guard.allows("\\u017f") and guard.allows("a")
            tok = wrap_tokenizer(copy.copy(stock), native_threads=True, sessions=False,  # the stateless cut path
                                 encoder=FastTier(wrong, guard))
            core = live(tok)
            assert core.threads == 1 and core.planner.cut_threshold == 131072
            texts = [prose[:150000] + code[:60000],
                     prose[:90000] + " I'\\u017f caf\\u00e9 " + code[:80000] + "\\u017f" + multi[:20000],
                     code[:140000] + multi[:40000]]
            chat = [{"role": "system", "content": "Be brief."}]
            for i in range(12):
                chat.append({"role": "user", "content": prose[i * 6600:(i + 1) * 6600]})
                chat.append({"role": "assistant", "content": code[i * 6600:(i + 1) * 6600]})
            chat.append({"role": "user", "content": "Why \\u017f? " + prose[:3000]})
            for t in texts:
                assert len(t) > core.planner.cut_threshold and len(core.plan(t, 2).cuts) >= 1
            calls = WrongOnLongS.calls
            for t in texts:
                for ast in (True, False):
                    got = tok.encode(t, add_special_tokens=ast)
                    assert type(got) is list and got == stock.encode(t, add_special_tokens=ast), (name, len(t))
                assert tok(t)["input_ids"] == stock(t)["input_ids"]
            if stock.chat_template is not None:
                want = stock.apply_chat_template(chat, tokenize=True, add_generation_prompt=True)
                assert len(stock.apply_chat_template(chat, tokenize=False)) > core.planner.cut_threshold
                assert tok.apply_chat_template(chat, tokenize=True, add_generation_prompt=True) == want
            assert core.stats["chunked"] >= 2 * len(texts), dict(core.stats)  # the cut path ran
            assert WrongOnLongS.calls > calls  # the (wrong-on-U+017F) engine served the pieces
            assert wrong._lists_checked is True  # through its list entry point, once checked
            if cores > 1:
                assert engine_threads() >= 1, "fastokens started no thread of its own"
            # the same engine without its guard is wrong on these texts: the comparison can fail
            bare = wrap_tokenizer(copy.copy(stock), native_threads=True, encoder=wrong)
            assert bare.encode(texts[1]) != stock.encode(texts[1])
            print(name, "ok")
    """)
    assert "qwen-3 ok" in out and "llama3.2 ok" in out


def test_native_threads_minimax_long_s_equal_stock():
    """minimax-m3, where fastokens itself is wrong on " I'\u017f": inside long texts on native threads,
    the guarded engine gives stock's IDs and the unguarded one does not."""
    out = _run("""
        assert native.allow_native_threads(in_worker=True)
        folder = bundled_hf_folder("minimax-m3", root)
        stock = AutoTokenizer.from_pretrained(folder)
        loaded = live(wrap_tokenizer(copy.copy(stock), native_threads=True, engine="reference")).loaded
        fast = FastEncoder(loaded.config_bytes, "fastokens")
        guard = guard_set_for(loaded.config_bytes, fast, ref_tokenizer=loaded.tokenizer,
                              code_points=[0x17F, 0x212A, ord("I"), ord("S")])
        tok = wrap_tokenizer(copy.copy(stock), native_threads=True,
                             encoder=FastTier(fast, guard))
        bare = wrap_tokenizer(copy.copy(stock), native_threads=True, encoder=fast)
        text = prose[:100000] + " I'\\u017f x" + code[:60000] + " I'\\u017f\\u017f" + prose[100000:130000]
        assert len(live(tok).plan(text, 2).cuts) >= 1
        want = stock.encode(text)
        assert tok.encode(text) == want
        assert bare.encode(text) != want  # fastokens alone is wrong here
        print("minimax ok")
    """)
    assert "minimax ok" in out


def test_native_threads_stay_pinned_in_a_ray_worker_and_after_a_load():
    """``native_threads=None`` (the default) keeps the one-thread pin in a Ray worker process, and the
    pin cannot be lifted once delta-ray has loaded a fastokens tokenizer in the process."""
    out = _run("""
        from delta_ray.apps.dropin.patch import _options
        os.environ["RAY_RAYLET_PID"] = "1"  # what the raylet sets in every worker it starts
        assert native.in_ray_worker()
        assert _options(True, None, {})["native_threads"] is False
        assert os.environ["FASTOKENS_BPE_THREADS"] == "1"
        del os.environ["RAY_RAYLET_PID"]
        FastEncoder(open(os.path.join(bundled_hf_folder("qwen-3", root), "tokenizer.json"), "rb").read(), "fastokens")
        assert _options(True, None, {})["native_threads"] is False  # too late: fastokens may have sized its pool
        assert os.environ["FASTOKENS_BPE_THREADS"] == "1"
        assert _options(True, None, {"native_threads": False})["native_threads"] is False
        print("pinned ok")
    """)
    assert "pinned ok" in out


def test_engine_lists_are_used_only_once_they_match_the_flat_output(tokenizer_paths):
    """``FastEncoder.encode_lists`` (the engine's own Python lists) is used only after it gave exactly
    ``encode_flat``'s IDs on the check texts; an entry point that disagrees is never used, and the
    list path (``parallel_encode.ids_list``) then converts the flat output instead."""
    from delta_ray._core.parallel_encode import ids_list
    from delta_ray._engine.native import FastEncoder, list_entry_texts

    good = FastEncoder(tokenizer_paths["qwen-3"], "fastokens")
    texts = ["Hello world, it's 12:45.", "caf\u00e9 " * 5000]
    want = [a.tolist() for a in good.encode_pieces(texts)]
    assert good.check_lists() is True and good.encode_lists(texts) == want

    bad = FastEncoder(tokenizer_paths["qwen-3"], "fastokens")
    lists = bad._lists
    # wrong only past the check's longest text: the check must cover long inputs to catch it
    bad._lists = lambda ts: [lst[:-1] if len(t) > 50000 else lst for t, lst in zip(ts, lists(ts))]
    assert max(map(len, list_entry_texts(bad._added))) > 50000
    assert bad.check_lists() is False and bad.encode_lists(texts) is None
    assert ids_list(bad, texts) == want[0] + want[1]


def test_the_list_check_never_runs_on_the_request_path(tokenizer_paths):
    """The first ``encode_lists`` call does not wait for the check (0.4-0.8 s): it starts it in the
    background and returns None (the caller converts the flat output: the same IDs); once the check
    passed, the engine's lists are used (a failing check: the test above)."""
    import time

    from delta_ray._core.parallel_encode import ids_list
    from delta_ray._engine.native import FastEncoder

    enc = FastEncoder(tokenizer_paths["qwen-3"], "fastokens")
    texts = ["Hello world, it's 12:45.", "caf\u00e9 " * 5000]
    want = [a.tolist() for a in enc.encode_pieces(texts)]
    gate = threading.Event()
    check = enc._check_lists
    enc._check_lists = lambda: gate.wait(30) and check()  # a check that takes as long as we say
    t0 = time.perf_counter()
    assert enc.encode_lists(texts) is None  # not checked yet: the flat path
    assert time.perf_counter() - t0 < 0.2 and enc._lists_checked is None
    assert ids_list(enc, texts) == want[0] + want[1]  # exact meanwhile
    gate.set()
    deadline = time.monotonic() + 30
    while enc._lists_checked is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert enc._lists_checked is True and enc.encode_lists(texts) == want
