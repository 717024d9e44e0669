"""One error tree: delta-ray's own refusals share a base and keep their familiar builtin bases."""
from __future__ import annotations

import delta_ray
from delta_ray import DeltaRayError


def test_every_exported_error_derives_from_the_base():
    names = ["SessionNotFound", "FastEngineUnavailable", "UnsupportedReference", "PoolClosed",
             "PoolStartupError", "PoolAuthError"]
    for n in names:
        assert n in delta_ray.__all__
        assert issubclass(getattr(delta_ray, n), DeltaRayError), n
    assert issubclass(delta_ray.SessionNotFound, KeyError)
    assert issubclass(delta_ray.UnsupportedReference, ImportError)
    assert issubclass(delta_ray.PoolAuthError, PermissionError)


def test_the_core_imports_no_ray():
    import subprocess
    import sys
    code = "import sys, delta_ray; assert 'ray' not in sys.modules, 'the core imported ray'"
    subprocess.run([sys.executable, "-c", code], check=True)
