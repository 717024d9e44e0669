"""Routing: CRC-32 homes, content keys, session vs stateless routes, chunk counts, purity."""
from __future__ import annotations

import hashlib
import subprocess
import sys
import zlib

import pytest

from delta_ray.scheduler.routing import content_key, home_worker

WORKERS = ["w2", "w0", "w3", "w1"]


def test_home_worker_is_crc32_mod_live_count_over_sorted_ids():
    ordered = sorted(WORKERS)
    for key in ["alice", "bob", "", "séance-日本", "x" * 10_000]:
        expected = ordered[zlib.crc32(key.encode("utf-8")) % len(ordered)]
        assert home_worker(key, WORKERS) == expected


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


def test_content_key_is_blake2b_128_of_first_4096_utf8_bytes():
    text = "é" * 5000  # 2 bytes per char: the cut falls at char 2048
    expected = hashlib.blake2b(text.encode("utf-8")[:4096], digest_size=16).hexdigest()
    assert content_key(text) == expected
    assert len(content_key(text)) == 32
    # Only the first 4,096 bytes count.
    assert content_key("a" * 4096 + "tail one") == content_key("a" * 4096 + "tail two")
    assert content_key("short one") != content_key("short two")


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
