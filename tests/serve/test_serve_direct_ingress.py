"""Serve with direct ingress (replicas listening for HTTP themselves, no proxy): own Ray, own process."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.ray


def test_direct_ingress_replicas_answer_sessions_and_appends_exactly(run_own_process):
    assert "DIRECT INGRESS OK" in run_own_process("direct_ingress_check.py")
