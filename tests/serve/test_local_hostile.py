"""The hostile shapes of the work bound through ``delta-ray serve --local`` (the fast tier in use):
while each is encoded, a concurrent small request is answered within 100 ms, and every answer
equals the reference's."""
from __future__ import annotations

import importlib.util
import json
import threading
import time
import urllib.request

import pytest
from conftest import LocalThread

G = "\u017f"  # qwen-3's guarded code point
SHAPES = {
    "run of the guarded point": G * 120_000,
    "guarded every 7": ("hello " + G) * 17_000,
    "prose around a run": "Some prose. " * 2_000 + G * 60_000,
    "letters without a cut": "a" * 120_000,
}

pytestmark = pytest.mark.skipif(importlib.util.find_spec("fastokens") is None, reason="fastokens is not installed")


def _post(base: str, body: dict) -> dict:
    req = urllib.request.Request(f"{base}/tokenize", json.dumps(body).encode(), {"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


@pytest.fixture(scope="module")
def fast_local(tokenizer_paths):
    srv = LocalThread(tokenizer_paths["qwen-3"], engine="fast", shadow_rate=0.0, max_body_bytes=2_000_000)
    yield srv.base
    srv.stop()


@pytest.mark.parametrize("shape", list(SHAPES))
def test_a_small_request_is_answered_while_a_hostile_one_runs(fast_local, references, shape):
    ref = references["qwen-3"]
    text = SHAPES[shape]
    _post(fast_local, {"prompt": "hello"})  # warm
    got: dict = {}
    big = threading.Thread(target=lambda: got.update(_post(fast_local, {"prompt": text, "session_id": shape})))
    big.start()
    waits = []
    while big.is_alive() or not waits:
        t = time.perf_counter()
        assert _post(fast_local, {"prompt": "hello"})["tokens"] == ref.encode("hello").ids
        waits.append(time.perf_counter() - t)
        time.sleep(0.005)
    big.join()
    assert got["tokens"] == ref.encode(text).ids
    assert max(waits) < 0.1, (shape, [round(w * 1000, 1) for w in waits])
