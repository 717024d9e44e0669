"""Which tokenizers delta-ray accepts as its reference: 0.20+ and 1.x; a later major is refused clearly."""
from __future__ import annotations

import subprocess
import sys

import pytest

from delta_ray._core.reference_version import UnsupportedReference, check_reference


@pytest.mark.parametrize("version", ["0.20.0", "0.23.3", "1.0.0rc3", "1.0.0", "1.4.2"])
def test_supported_versions_pass(version):
    assert check_reference(version) == version


@pytest.mark.parametrize("version", ["2.0.0", "0.19.1"])
def test_unsupported_is_refused_with_instructions(version):
    with pytest.raises(UnsupportedReference, match=r"pip install 'tokenizers>=0.20,<1'"):
        check_reference(version)


def test_import_under_a_forced_2x_says_why():
    """Simulate a forced 2.x install: `import delta_ray` raises our ImportError, not a crash inside."""
    code = ("import importlib.metadata as m\n"
            "real = m.version\n"
            "m.version = lambda d: '2.0.0' if d == 'tokenizers' else real(d)\n"
            "try:\n"
            "    import delta_ray\n"
            "except ImportError as e:\n"
            "    print(type(e).__name__, e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "UnsupportedReference" in out.stdout and "tokenizers 2.0.0 is installed" in out.stdout, out.stderr


def test_the_pin_keeps_fresh_installs_on_0x():
    """Until tokenizers 1.0 is final, a fresh install gets 0.x (README says how to try 1.x)."""
    import pathlib
    text = (pathlib.Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    assert '"tokenizers>=0.20,<1"' in text
