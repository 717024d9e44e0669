"""No input costs more than a small constant times the reference's own work: hostile shapes (runs of
the fast tier's guarded code point, guarded points every k characters, long runs without a safe
cut) on every library path, each within 10x the reference's CPU on the same text and equal to its
IDs; and the confinement's scans test each position at most once."""
from __future__ import annotations

import importlib.util
import time

import pytest

from delta_ray import DeltaTokenizer
from delta_ray._core.confine import confine
from delta_ray._engine.guard import GuardSet

NAME = "qwen-3"
G = "\u017f"  # the code point qwen-3's fast tier guards
N = 20_000
SHAPES = {
    "run of the guarded point": G * N,
    "guarded every 2": (G + "a") * (N // 2),
    "guarded every 7": ("hello " + G) * (N // 7),
    "guarded and spaces": (G + " ") * (N // 2),
    "guarded every 50 in prose": ("the quick brown fox jumps over the lazy dog, again " + G) * (N // 52),
    "letters without a cut": "a" * N,
    "digits": "7" * N,
    "spaces": " " * N,
    "prose around a run": "Some prose. " * 500 + G * N + " and more prose." * 500,
}


def _cpu(fn, repeats: int = 3) -> float:
    best = None
    for _ in range(repeats):
        t = time.process_time()
        fn()
        dt = time.process_time() - t
        best = dt if best is None else min(best, dt)
    return best


@pytest.fixture(scope="module")
def fast(tokenizer_paths):
    if importlib.util.find_spec("fastokens") is None:
        pytest.skip("fastokens is not installed")
    dt = DeltaTokenizer(tokenizer_paths[NAME], engine="fast", shadow_rate=0.0, threads=1,
                        chunk_size=8192, cut_threshold=16384)
    assert dt.core.fast_allows("abc") and not dt.core.fast_allows(G)
    return dt


@pytest.mark.parametrize("shape", list(SHAPES))
def test_every_path_stays_within_10x_the_references_cpu(fast, references, shape):
    ref, text = references[NAME], SHAPES[shape]
    want = ref.encode(text).ids
    ref_cpu = max(_cpu(lambda: ref.encode(text)), 1e-3)
    counter = iter(range(1_000_000))
    paths = {
        "stateless": lambda: fast.encode(text).to_pylist(),
        "session's first turn": lambda: fast.encode(text, session=f"s{next(counter)}").to_pylist(),
        "batch (CLI, Ray Data)": lambda: fast.core.encode_batch_flat([text])[0].tolist(),
        "lists (the drop-in's keyless encode)": lambda: fast.core.encode_list(text),
    }
    ratios = {}
    for name, fn in paths.items():
        assert fn() == want, (shape, name)
        ratios[name] = round(_cpu(fn) / ref_cpu, 2)
    # appended to a held session: the turn re-encodes at most the text after its last checkpoint
    head = "An opening line of prose. " * 200
    got = None

    def append():
        nonlocal got
        key = f"a{next(counter)}"
        fast.encode(head, session=key)
        got = fast.extend(key, text).to_pylist()
    ratios["appended to a session"] = round(_cpu(append) / max(_cpu(lambda: ref.encode(head + text)), 1e-3), 2)
    assert got == ref.encode(head + text).ids
    assert all(r <= 10 for r in ratios.values()), (shape, ratios)


@pytest.mark.parametrize("shape", ["run", "every 3", "sparse", "prose"])
def test_confinement_cuts_are_safe_and_each_position_is_scanned_once(fast, references, real_texts, shape):
    """The split's sub-pieces encode to the piece's IDs, and the scans it makes cover each position
    at most once (a guarded run with no safe cut cost ~4,096 tests a character before)."""
    ref = references[NAME]
    prose = real_texts["english"][:60_000]
    piece = {"run": G * 50_000, "every 3": ("ab" + G) * 20_000,
             "sparse": prose[:20_000] + G + prose[20_000:40_000] + G * 3 + prose[40_000:],
             "prose": prose.replace("e", G, 40)}[shape]
    pred = fast.core.predicate
    guard = GuardSet(frozenset({ord(G)}))
    scanned = []
    real_scan = pred.scan_back

    def counting(text, start, stop, *a, **k):
        scanned.append(max(0, min(start, len(text) - 1) - max(stop, 1) + 1))
        return real_scan(text, start, stop, *a, **k)
    pred.scan_back = counting
    try:
        subs = confine(piece, guard, pred)
    finally:
        del pred.scan_back
    assert "".join(subs) == piece
    assert sum(scanned) <= len(piece), (shape, sum(scanned), len(piece))
    if shape in ("sparse", "prose"):
        assert len(subs) > 1  # the guarded points were confined, not the whole piece sent on
    want = ref.encode(piece, add_special_tokens=False).ids
    got = [i for s in subs for i in ref.encode(s, add_special_tokens=False).ids]
    assert got == want
