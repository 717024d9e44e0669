"""Multi-node: a pool over a 3-node ray.cluster_utils.Cluster on this machine (own process)."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.ray


def test_pool_spans_nodes_sessions_stay_sticky_and_survive_node_removal(run_own_process):
    assert "MULTINODE OK" in run_own_process("multinode_check.py")
