"""Arrow/numpy assembly: the template inserted into a flat batch equals wrapping each row."""
from __future__ import annotations

import numpy as np
import pytest

from delta_ray.core.assembly import flat_list_array, insert_template


@pytest.mark.parametrize("prefix,suffix", [((7,), ()), ((), (9,)), ((1, 2), (3,)), ((5,), (6, 7, 8)), ((), ())])
def test_insert_template_wraps_every_row(prefix, suffix):
    rng = np.random.default_rng(3)
    for _ in range(30):
        lengths = rng.integers(0, 6, size=rng.integers(0, 12))
        values = rng.integers(0, 1000, size=int(lengths.sum())).astype(np.int32)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        out, new_offsets = insert_template(values, offsets, prefix, suffix)
        want = [list(prefix) + values[a:b].tolist() + list(suffix) for a, b in zip(offsets, offsets[1:])]
        got = [out[a:b].tolist() for a, b in zip(new_offsets, new_offsets[1:])]
        assert got == want and out.dtype == np.int32 and len(out) == new_offsets[-1]
        assert flat_list_array(out, new_offsets).to_pylist() == want
