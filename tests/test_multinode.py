"""Multi-node: a pool over a 3-node ray.cluster_utils.Cluster on this machine (own process)."""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

pytestmark = pytest.mark.ray


def test_pool_spans_nodes_sessions_stay_sticky_and_survive_node_removal():
    script = pathlib.Path(__file__).parent / "multinode_check.py"
    env = dict(os.environ, RAY_ENABLE_AUTO_CONNECT="0")
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "MULTINODE OK" in proc.stdout
