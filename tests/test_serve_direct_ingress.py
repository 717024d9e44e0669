"""Serve with direct ingress (replicas listening for HTTP themselves, no proxy): own Ray, own process."""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

pytestmark = pytest.mark.ray


def test_direct_ingress_replicas_answer_sessions_and_appends_exactly():
    script = pathlib.Path(__file__).parent / "direct_ingress_check.py"
    env = dict(os.environ, RAY_ENABLE_AUTO_CONNECT="0")
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "DIRECT INGRESS OK" in proc.stdout
