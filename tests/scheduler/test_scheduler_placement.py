"""The placement cost model: caller vs pool for a stateless text, Ray-free."""
from __future__ import annotations

from delta_ray.scheduler import PlacementModel


def test_a_fast_caller_keeps_texts_a_slow_one_sends_them_out():
    fast = PlacementModel(local_chars_per_ms=200_000, remote_chars_per_ms=200_000)
    assert fast.run_local(1_000_000, chunks=2)  # 5 ms here against transfer + overhead + 2.5 ms
    assert fast.run_local(3_000_000, chunks=2)
    slow = PlacementModel(local_chars_per_ms=1500, remote_chars_per_ms=1500)
    assert not slow.run_local(1_000_000, chunks=2)  # 667 ms here against ~340 ms as two chunks
    assert slow.run_local(1_000_000, chunks=1)  # nothing to gain remotely as one chunk


def test_many_slots_win_for_very_long_texts_even_with_a_fast_caller():
    m = PlacementModel(local_chars_per_ms=200_000, remote_chars_per_ms=200_000, transfer_ms_per_char=1e-6)
    assert not m.run_local(50_000_000, chunks=32)


def test_it_learns_from_measurements():
    m = PlacementModel()
    for _ in range(40):
        m.observe_local(1_000_000, 5.0)  # the caller turns out fast: 200 chars/us
    assert m.local_chars_per_ms > 150_000
    m.remote_chars_per_ms = m.local_chars_per_ms
    before = m.transfer_ms_per_char
    for _ in range(40):
        m.observe_remote(1_000_000, 2, 40.0)  # the pool answers slowly: transfer costs more
    assert m.transfer_ms_per_char > before
    assert m.run_local(1_000_000, chunks=2)
    m.observe_local(10, 100.0)  # tiny texts say nothing about rates
    assert m.local_chars_per_ms > 150_000


def test_each_chunk_task_costs_the_caller_a_fixed_share():
    # A fast engine on both sides, 16 chunks: the encode of 1M characters would take 10 ms here and
    # 0.6 ms a chunk there, but each of the 16 chunk tasks costs the caller about 2 ms whatever its
    # size (launch, put, result fetch; measured 2-3 ms), so the text stays in the caller. Without
    # that term the pool looked cheaper (9.6 ms against 10) and the caller paid ~40 ms.
    m = PlacementModel(local_chars_per_ms=100_000, remote_chars_per_ms=100_000)
    assert m.run_local(1_000_000, chunks=16)
    slow = PlacementModel(local_chars_per_ms=1500, remote_chars_per_ms=1500)
    assert not slow.run_local(1_000_000, chunks=16)  # a slow encode still goes out: 667 ms here

