"""int32 IDs to Python lists (_core/id_lists.py): always ``tolist()``'s values, from shared ints when long."""
import numpy as np
import pytest

from delta_ray._core import id_lists
from delta_ray._core.id_lists import MAX_SHARED, int_list


def _same(got: list, arr: np.ndarray) -> None:
    want = arr.tolist()
    assert type(got) is list and got == want
    assert all(type(x) is int for x in got)


@pytest.mark.parametrize("n", [0, 1, 100, 4095, 4096, 70_000])
def test_values_equal_tolist_at_every_length(n):
    arr = np.random.default_rng(n).integers(0, 151_669, n).astype(np.int32)
    _same(int_list(arr), arr)


def test_long_lists_share_their_ints():
    arr = np.random.default_rng(1).integers(1000, 151_669, 10_000).astype(np.int32)
    a, b = int_list(arr), int_list(arr)
    assert a == b and a is not b
    assert all(x is y for x, y in zip(a, b))  # no int allocated per ID: both lists hold the table's


def test_a_caller_mutating_its_list_changes_no_other_list():
    arr = np.arange(1000, 6000, dtype=np.int32)
    a, b = int_list(arr), int_list(arr)
    a[0] += 1
    a[1] = -5
    assert b == arr.tolist() and int_list(arr) == arr.tolist()


def test_ids_outside_the_table_and_other_arrays_are_converted_plainly():
    rng = np.random.default_rng(2)
    base = rng.integers(0, 50_000, 8192).astype(np.int32)
    for top in (MAX_SHARED - 1, MAX_SHARED, 2**31 - 1, -1):
        arr = base.copy()
        arr[4000] = top  # grows the table, or (negative, too large) is left to tolist
        _same(int_list(arr), arr)
    _same(int_list(base.astype(np.int64)), base.astype(np.int64))  # not int32: never reinterpreted
    _same(int_list(base[::3]), base[::3])  # a strided view
    assert len(id_lists._table) <= MAX_SHARED
