"""The event loop decides by work, not by length: with the fast tier in use, a prompt the guard
refuses and a tiny append to a session that ends in a long run without a safe cut both run in a
thread, and a coroutine ticking on the handler's loop is never held longer than a well-behaved busy
thread holds it. Every answer is compared with the reference."""
from __future__ import annotations

import asyncio
import importlib.util
import json
import re

import pytest
from test_serve_handler import _chunks, _longest_stall, _NoMetrics, _spin

from delta_ray._core.config import TokenizerConfig
from delta_ray._core.keys import session_key
from delta_ray._core.loading import load_tokenizer
from delta_ray._tokenizer_core import TokenizerCore
from delta_ray.server.serve_handler import RequestHandler

NAME = "qwen-3"  # its fast tier guards U+017F
GUARDED = "\u017f"

pytestmark = pytest.mark.skipif(importlib.util.find_spec("fastokens") is None, reason="fastokens is not installed")


@pytest.fixture(scope="module")
def fast_handler(tokenizer_paths):
    loaded = load_tokenizer(tokenizer_paths[NAME])
    core = TokenizerCore(loaded, TokenizerConfig(engine="fast", shadow_rate=0.0, threads=1))
    assert core.uses_fast_engine and not core.fast_allows(GUARDED)
    return RequestHandler(loaded, core, served={NAME}, record=_NoMetrics())


def _body(**fields) -> bytes:
    return json.dumps(fields).encode()


def _stalls(h: RequestHandler, requests: dict) -> tuple[float, dict, dict]:
    """(the bound, each request's least stall of three runs in ms, each one's last answer)."""
    async def run():
        baseline, _ = await _longest_stall(lambda: asyncio.to_thread(_spin, 0.3))
        stalls, answers = {}, {}
        for name, request in requests.items():
            best = None
            for _ in range(3):
                stall, out = await _longest_stall(request)
                best = stall if best is None else min(best, stall)
            stalls[name], answers[name] = round(best * 1000, 1), out
        return max(0.05, 3 * baseline), stalls, answers
    return asyncio.run(run())


def test_a_guarded_prompt_is_encoded_off_the_loop(fast_handler, references):
    """120K characters of the guarded code point: under the fast engine's length budget, but the
    reference encodes them (about 60 ms), so they run in a thread. Each run sends a new text (a
    text seen before would be a held session's or content entry's cheap turn)."""
    h, ref = fast_handler, references[NAME]
    sent: list[str] = []

    def request(**fields):
        text = f"{len(sent)} " + GUARDED * 120_000
        sent.append(text)
        return h.http("tokenize", None, _chunks(_body(prompt=text, **fields)))
    bound, stalls, answers = _stalls(h, {
        "keyless": lambda: request(),
        "session": lambda: request(session_id=f"g{len(sent)}", cache_salt="t"),
    })
    assert all(ms < bound * 1000 for ms in stalls.values()), (bound, stalls)
    for (status, data, _), text in zip(answers.values(), (sent[2], sent[5])):
        assert status == 200 and json.loads(data)["tokens"] == ref.encode(text).ids


def test_a_tiny_append_to_a_run_without_cuts_is_encoded_off_the_loop(fast_handler, references, real_texts):
    """A session ending in 4M characters with no safe cut: each 10-character append re-encodes the
    whole run (as the reference would), so it runs in a thread, whatever the append's size."""
    h, ref = fast_handler, references[NAME]
    text = real_texts["english"][:5_000] + "a" * 4_000_000
    status, data, _ = asyncio.run(h.http("tokenize", None, _chunks(_body(prompt=text, session_id="run",
                                                                         cache_salt="t"))))
    assert status == 200
    state = {"version": json.loads(data)["session_version"], "text": text}
    assert h.sessions.turn_chars(session_key("run", "t"), 10) > 4_000_000

    async def append():
        out = await h.http("tokenize", None, _chunks(_body(append="aaaaaaaaaa", session_id="run", cache_salt="t",
                                                           session_version=state["version"])))
        # the client's parse of ~250K IDs would stall this loop itself (and its allocations start
        # full collections of the test process's heap): only the version is read here
        version = re.search(rb'"session_version":\s*"([0-9a-f]+)"', out[1])
        state["version"], state["text"] = version.group(1).decode(), state["text"] + "aaaaaaaaaa"
        return out
    bound, stalls, answers = _stalls(h, {"append": append})
    assert stalls["append"] < bound * 1000, (bound, stalls)
    status, data, _ = answers["append"]
    want = ref.encode(state["text"]).ids
    answer = json.loads(data)
    assert status == 200 and answer["count"] == len(want) and answer["tokens"] == want[answer["start"]:]
