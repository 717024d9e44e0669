"""The drop-in's kept lists and Python's cyclic collector (issue 58, part 3): each session keeps its
IDs as a Python list of ints, which can be on no reference cycle, so the list is untracked where it
is made (``delta_ray._core.id_lists.untrack_ints``). A full ``gc.collect()`` then walks about as many
references with the table full as with it empty, and every answer is still stock's.

What a collection walks is counted, not timed: in a process that holds a whole test suite's heap a
full collection takes hundreds of milliseconds, and its noise is larger than a table's lists cost.
``bench_dropin.py --gc`` times it (``docs/performance.md``).
"""
from __future__ import annotations

import copy
import gc

import numpy as np
import pytest

transformers = pytest.importorskip("transformers", reason="the drop-in tests need transformers 5.23: "
                                                          "pip install 'transformers==5.23.*' (the test extra)")

from delta_ray import request_scope  # noqa: E402
from delta_ray._core.id_lists import untrack_ints  # noqa: E402
from delta_ray.apps.dropin import hf as dropin_hf  # noqa: E402
from delta_ray.apps.dropin import unpatch_transformers, wrap_tokenizer  # noqa: E402
from delta_ray.apps.dropin.folders import bundled_hf_folder  # noqa: E402

pytestmark = pytest.mark.skipif(not transformers.__version__.startswith("5."),
                                reason=f"the drop-in hooks transformers 5 (found {transformers.__version__})")

CUTS = {"cut_threshold": 4096, "chunk_size": 2048}
KEYED, KEYLESS = 10, 10  # conversations of about 285K IDs each: 20 in the table
UNTRACKABLE = gc.is_tracked([]) and untrack_ints([]) is not None and not gc.is_tracked(untrack_ints([]))


@pytest.fixture(scope="module")
def stock(tmp_path_factory):
    from transformers import AutoTokenizer
    yield AutoTokenizer.from_pretrained(bundled_hf_folder("qwen-3", tmp_path_factory.mktemp("hf")))
    unpatch_transformers()


def _walked(chunk: int = 100_000) -> int:
    """The references a full collection visits: every tracked object's referents (what its
    ``tp_traverse`` reports), counted in chunks so that no one list of them is large."""
    gc.collect()
    tracked = gc.get_objects()
    return sum(len(gc.get_referents(*tracked[i:i + chunk])) for i in range(0, len(tracked), chunk))


def test_untrack_ints_unit():
    ids = np.arange(1000, 5000, dtype=np.int32).tolist()
    assert gc.is_tracked(ids)
    assert untrack_ints(ids) is ids
    if not UNTRACKABLE:
        pytest.skip("not CPython: untrack_ints leaves lists as they are")
    assert not gc.is_tracked(ids)
    assert untrack_ints(ids) is ids and not gc.is_tracked(ids)  # idempotent
    del ids[10:]
    ids += np.arange(7, 9000, dtype=np.int32).tolist()  # what a warm turn does: stays untracked
    assert not gc.is_tracked(ids) and ids[:10] == list(range(1000, 1010)) and ids[-1] == 8999
    assert gc.is_tracked(ids.copy()) and gc.is_tracked([1] + ids)  # a caller's copy is an ordinary list
    for other in (tuple(range(3)), {"a": 1}, type("L", (list,), {})([1, 2])):
        untrack_ints(other)  # anything but an exact list: left alone
    assert gc.is_tracked(type("L", (list,), {})([1, 2]))
    del ids  # freed by reference counting as any list


def test_a_full_table_is_out_of_the_collectors_sight(stock, real_texts):
    """20 conversations of about 285K IDs (10 keyed, 10 keyless of which 8 forked from another):
    every kept list untracked, a full collection walking a small share of the references that
    tracked copies of the same lists add, and every answer equal to stock's, turn after turn, with
    the caller's list its own (tracked, not the kept one)."""
    if not UNTRACKABLE:
        pytest.skip("not CPython: the kept lists stay tracked")
    tok = wrap_tokenizer(copy.copy(stock), engine="reference", **CUTS)
    table = tok.__dict__[dropin_hf.STATE_ATTR].current(tok).sessions
    base = (real_texts["english"] + real_texts["code"]) * 4  # about 1.3M characters, 285K IDs
    other = real_texts["code"] + real_texts["english"]

    def tail(j: int) -> str:  # diverges from every other keyless conversation by more than the slack
        return f" conversation {j} " + other[j * 7000:j * 7000 + 40000]

    empty = _walked()

    def turn(text: str, *, session: str | None = None, tenant: str | None = None, check: bool = False) -> None:
        with request_scope(session=session, tenant=tenant):
            got = tok.encode(text)
        if check:
            assert got == stock.encode(text)
            assert gc.is_tracked(got)  # the caller's own list, not a kept one
            assert all(got is not ids for ids in table.sessions.store.kept_lists())
            got.reverse()  # the caller may do what it likes with it (and drops it: not kept here,
            # where it would count in the collections timed below)

    for i in range(KEYED):
        turn(f"[conversation {i}]\n" + base, session=f"c{i}", check=i == 0)
    for j in range(KEYLESS):
        turn(base + tail(j), tenant=f"t{j % 2}", check=j == 3)
    assert len(table) == KEYED + KEYLESS
    assert table.stats["new"] == KEYED + 2 and table.stats["forked"] == KEYLESS - 2, table.stats
    kept = table.sessions.store.kept_lists()
    n_ids = sum(map(len, kept))
    assert min(map(len, kept)) > 280_000

    # What a full collection walks: with the table full (its lists untracked), then with tracked
    # copies of the same lists beside it; the table's extra over an empty process must be a small
    # share of what the tracked copies add (their IDs, one reference each).
    full = _walked()
    copies = [ids.copy() for ids in kept]
    with_copies = _walked()
    del copies
    lists = with_copies - full
    print(f"{n_ids:,} IDs kept: a full collection walks {full - empty:+,} references over the empty table "
          f"({lists:+,} more with tracked copies of the kept lists)")
    assert lists >= n_ids, (empty, full, with_copies)  # the premise: a tracked list is walked item by item
    assert full - empty < 0.02 * n_ids, (
        f"{n_ids:,} IDs kept: a full collection walks {full - empty:+,} references over the empty table")
    assert not any(gc.is_tracked(ids) for ids in kept)

    # Warm turns on a keyed and a forked keyless conversation: continued from the kept lists (which
    # stay untracked and are not the caller's), equal to stock's.
    keyed, keyless = "[conversation 0]\n" + base, base + tail(3)
    for t in range(2):
        more = f"\n\nturn {t}: " + other[50000 + t * 3000:50000 + (t + 1) * 3000]
        keyed, keyless = keyed + more, keyless + more
        turn(keyed, session="c0", check=True)
        turn(keyless, tenant="t1", check=True)
    assert table.stats["continued"] >= 4, table.stats
    assert len(table) == KEYED + KEYLESS
    assert not any(gc.is_tracked(ids) for ids in table.sessions.store.kept_lists())
    table.clear()
