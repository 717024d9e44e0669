"""Safe shipped defaults: nothing listens beyond loopback unless the user asks."""
from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_no_shipped_file_binds_all_interfaces():
    for path in [ROOT / "cluster.yaml", *sorted((ROOT / "examples").glob("*.py")),
                 *sorted((ROOT / "delta_ray" / "apps" / "server").glob("*.py"))]:
        for line in path.read_text().splitlines():
            if line.lstrip().startswith("#"):
                continue
            assert "0.0.0.0" not in line, f"{path.name}: {line.strip()}"


def test_the_dashboard_stays_on_loopback():
    text = (ROOT / "cluster.yaml").read_text()
    hosts = re.findall(r"--dashboard-host=(\S+)", text)
    assert hosts and all(h == "127.0.0.1" for h in hosts)


def test_one_default_policy():
    """The pool's default queue policy is the scheduler's (one default, not two that drift)."""
    from delta_ray._core.config import PoolConfig
    from delta_ray.scheduler.constants import DEFAULT_POLICY
    assert PoolConfig().policy == DEFAULT_POLICY
