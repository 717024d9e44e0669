"""Routing: rendezvous homes over CRC-32, content keys, session vs stateless routes, chunk counts, purity."""
from __future__ import annotations

import subprocess
import sys
import zlib
from collections import Counter

import pytest

from delta_ray.scheduler.routing import home_worker, rendezvous_order

WORKERS = ["w2", "w0", "w3", "w1"]


def test_home_worker_is_the_highest_rendezvous_weight_over_crc32():
    """The home is the node with the highest mixed CRC-32 weight, recomputed here independently."""
    def mix(h):
        h ^= h >> 16
        h = (h * 0x85EBCA6B) & 0xFFFFFFFF
        h ^= h >> 13
        h = (h * 0xC2B2AE35) & 0xFFFFFFFF
        return h ^ (h >> 16)
    for key in ["alice", "bob", "", "séance-日本", "x" * 10_000]:
        k = zlib.crc32(key.encode("utf-8"))
        expected = max(WORKERS, key=lambda w: (mix(k ^ mix(zlib.crc32(w.encode()))), w))
        assert home_worker(key, WORKERS) == expected
        assert rendezvous_order(key, WORKERS)[0] == expected
        assert sorted(rendezvous_order(key, WORKERS + WORKERS)) == sorted(WORKERS)


def test_rendezvous_spreads_keys_evenly_and_moves_few_when_nodes_change():
    """Even spread; a node joining takes only keys for itself, a node leaving moves only its own keys."""
    keys = [f"t4:acme|s:conv-{i}" for i in range(20_000)]
    nodes = [f"replica-{c}" for c in "abcd"]
    homes = {k: home_worker(k, nodes) for k in keys}
    counts = Counter(homes.values())
    assert set(counts) == set(nodes) and all(abs(c - 5000) < 500 for c in counts.values()), counts
    grown = nodes + ["replica-e"]
    moved = [k for k in keys if home_worker(k, grown) != homes[k]]
    assert all(home_worker(k, grown) == "replica-e" for k in moved)
    assert 0.15 < len(moved) / len(keys) < 0.25  # about 1/5, not the ~4/5 a modulo moves
    shrunk = nodes[1:]
    moved = [k for k in keys if home_worker(k, shrunk) != homes[k]]
    assert {homes[k] for k in moved} == {"replica-a"}
    assert len(moved) == counts["replica-a"]
    # The next in rendezvous order is where a key goes when its home leaves.
    for k in keys[:500]:
        order = rendezvous_order(k, nodes)
        assert home_worker(k, [n for n in nodes if n != order[0]]) == order[1]


def test_home_worker_is_stable_under_listing_order_and_duplicates():
    keys = [f"session-{i}" for i in range(200)]
    homes = [home_worker(k, WORKERS) for k in keys]
    assert homes == [home_worker(k, list(reversed(WORKERS))) for k in keys]
    assert homes == [home_worker(k, WORKERS + WORKERS[:2]) for k in keys]
    assert len(set(homes)) == len(WORKERS)  # 200 keys spread over all four


def test_home_worker_needs_a_live_worker():
    with pytest.raises(ValueError):
        home_worker("k", [])


def test_home_worker_tolerates_lone_surrogates():
    assert home_worker("bad\ud800", WORKERS) in WORKERS


def test_package_reexports_its_api_and_imports_no_ray(tmp_path):
    # A fresh interpreter, so nothing else the test session imported can hide a stray import. The
    # folder installs as delta_ray.scheduler (no global `scheduler` in users' environments).
    code = (
        "import sys, importlib.util; "
        "import delta_ray.scheduler as scheduler; "
        "assert scheduler.__file__, 'scheduler imported as a namespace package'; "
        "missing = [n for n in scheduler.__all__ if not hasattr(scheduler, n)]; "
        "assert not missing, missing; "
        "bad = [m for m in sys.modules if m == 'ray' or m.startswith('ray.')]; "
        "assert not bad, bad; "
        "assert importlib.util.find_spec('scheduler') is None and importlib.util.find_spec('actors') is None"
    )
    # Run outside the checkout: what counts is what the installed package provides.
    subprocess.run([sys.executable, "-c", code], check=True, cwd=tmp_path)
