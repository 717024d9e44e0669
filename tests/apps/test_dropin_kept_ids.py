"""A conversation's kept IDs (apps/dropin/kept_ids.py): blocks that always read back as the list a
plain model gives, that the garbage collector stops tracking, and that nobody can change through
what was handed out."""
import gc
import random

import pytest

from delta_ray.apps.dropin.kept_ids import BLOCK, KeptIds


def test_turns_read_back_as_the_model_list():
    rng = random.Random(0)
    model: list[int] = []
    kept = KeptIds()
    for _ in range(300):
        k = rng.choice([0, len(model), rng.randrange(len(model) + 1),
                        max(0, len(model) - rng.randrange(40)), (len(model) // BLOCK) * BLOCK])
        size = rng.choice([0, 1, 17, 600, BLOCK - 1, BLOCK, 3 * BLOCK + 5])
        tail = [rng.randrange(1000, 150_000) for _ in range(size)]
        model = model[:k] + tail
        kept.replace_tail(k, tail, True)
        assert kept.n == len(model)
        assert kept.to_list([], []) == model
        assert all(len(b) == BLOCK for b in kept.blocks[:-1]) and all(kept.blocks)
    assert kept.to_list([1, 2], [3]) == [1, 2] + model + [3]
    with pytest.raises(ValueError):
        kept.replace_tail(len(model) + 1, [], True)


def test_blocks_leave_the_collectors_sight():
    kept = KeptIds(list(range(1000, 1000 + 5 * BLOCK + 7)))
    kept.replace_tail(2 * BLOCK + 3, list(range(9000, 9100)), True)
    gc.collect()
    assert not any(gc.is_tracked(b) for b in kept.blocks)  # a list would be traversed at every collection


def test_what_is_handed_out_is_the_callers_own():
    ids = list(range(2000, 2000 + BLOCK + 10))
    kept = KeptIds(ids)
    ids[0] = -1  # the list the blocks were made from
    out = kept.to_list([], [])
    out[5] = -2
    out.append(7)
    fork = kept.copy()
    fork.replace_tail(3, [1, 2], True)
    assert kept.to_list([], []) == list(range(2000, 2000 + BLOCK + 10))
    assert fork.to_list([], []) == [2000, 2001, 2002, 1, 2]


def test_bytes_count_pointers_and_unshared_ints():
    n = 10 * BLOCK
    ids = list(range(100_000, 100_000 + n))
    assert 8 * n <= KeptIds(ids, shared=True).nbytes < 8 * n + 1000
    assert 36 * n <= KeptIds(ids, shared=False).nbytes < 36 * n + 1000
    kept = KeptIds(ids, shared=True)
    kept.replace_tail(n, [5], False)  # one turn whose ints were its own: all counted, an upper bound
    assert kept.nbytes >= 36 * n
