"""The answer paths never import pandas: pyarrow's ``to_numpy(zero_copy_only=False)`` does on its
first call (seconds on the first request of a server or a drop-in tokenizer)."""
import subprocess
import sys

import numpy as np
import pyarrow as pa

from delta_ray._core.assembly import ids_to_numpy


def test_ids_to_numpy_views_and_joins():
    a = pa.array(np.arange(10, dtype=np.int32))
    assert np.array_equal(ids_to_numpy(a.slice(3, 4)), [3, 4, 5, 6])
    c = pa.chunked_array([a.slice(0, 2), a.slice(7, 3)])
    assert np.array_equal(ids_to_numpy(c), [0, 1, 7, 8, 9])
    assert ids_to_numpy(pa.chunked_array([], type=pa.int32())).dtype == np.int32


def test_an_encode_and_its_numpy_view_do_not_import_pandas(tokenizer_paths):
    tokenizer_path = tokenizer_paths["qwen-3"]
    code = (
        "import sys\n"
        "from delta_ray import DeltaTokenizer\n"
        "from delta_ray._core.assembly import ids_to_numpy\n"
        f"tok = DeltaTokenizer({str(tokenizer_path)!r}, engine='reference')\n"
        "ids_to_numpy(tok.encode('hello world ' * 50))\n"
        "ids_to_numpy(tok.encode('hello world ' * 50, session='s'))\n"
        "tok.decode(tok.encode('hello'))\n"
        "print('pandas' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "False"
