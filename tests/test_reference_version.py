"""tokenizers 1.x under a delta-ray that does not support it: a clear error, never a crash deep inside."""
from __future__ import annotations

import subprocess
import sys

import pytest

from delta_ray.reference_version import UnsupportedReference, check_reference


def test_supported_versions_pass():
    assert check_reference("0.23.3") == "0.23.3"
    assert check_reference("0.20.0") == "0.20.0"


@pytest.mark.parametrize("version", ["1.0.0rc3", "1.0.0", "2.1.0"])
def test_1x_is_refused_with_instructions(version):
    with pytest.raises(UnsupportedReference, match=r"pip install 'tokenizers>=0.20,<1'"):
        check_reference(version)


def test_import_under_a_forced_1x_says_why():
    """Simulate a forced 1.x install: `import delta_ray` raises our ImportError, not `cannot import name`."""
    code = ("import importlib.metadata as m\n"
            "real = m.version\n"
            "m.version = lambda d: '1.0.0rc3' if d == 'tokenizers' else real(d)\n"
            "try:\n"
            "    import delta_ray\n"
            "except ImportError as e:\n"
            "    print(type(e).__name__, e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "UnsupportedReference" in out.stdout and "tokenizers 1.0.0rc3 is installed" in out.stdout, out.stderr


def test_the_pin_keeps_fresh_installs_on_0x():
    import pathlib
    text = (pathlib.Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    assert '"tokenizers>=0.20,<1"' in text
