"""Each host uses only its interface of the tokenizer core (delta_ray/_core/hosts.py)."""
from __future__ import annotations

import ast
import pathlib

from delta_ray._core.hosts import PoolLocal, SessionHost
from delta_ray._core.sessions import Sessions

ROOT = pathlib.Path(__file__).resolve().parents[2]
# (file, how it reaches the core, the interface it is handed)
USES = [("actors/orchestrator.py", "self.core", PoolLocal),
        ("actors/pool.py", "self._orch.core", PoolLocal),
        ("actors/worker.py", "self.core", SessionHost),
        ("actors/worker.py", "self.sessions", Sessions),
        ("delta_ray/server/serve_handler.py", "self.core", SessionHost),
        ("delta_ray/server/serve_handler.py", "core", SessionHost),
        ("delta_ray/server/serve_handler.py", "self.sessions", Sessions),
        ("delta_ray/apps/dropin/sessions.py", "self.sessions", Sessions)]


def _members(protocol: type) -> set[str]:
    names = set(getattr(protocol, "__annotations__", {}))
    names |= {n for n in vars(protocol) if not n.startswith("_")}
    return names


def _used(path: pathlib.Path, reach: str) -> set[str]:
    """Attribute names read on the expression ``reach`` in ``path``."""
    used = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Attribute) and ast.unparse(node.value) == reach:
            used.add(node.attr)
    return used


def test_hosts_use_only_their_interface():
    """The pool, its workers and Serve use the core through PoolLocal and SessionHost, not through
    TokenizerCore's whole surface: a new reach into the core fails here."""
    for rel, reach, protocol in USES:
        used = _used(ROOT / rel, reach)
        assert used, f"{rel} no longer reaches the core as {reach}: update this test"
        extra = used - _members(protocol)
        assert not extra, f"{rel} uses {sorted(extra)} of the core outside {protocol.__name__}"


def test_the_core_is_each_interface():
    """TokenizerCore provides every member of both interfaces."""
    from delta_ray._tokenizer_core import TokenizerCore
    for protocol in (PoolLocal, SessionHost):
        missing = {n for n in _members(protocol) if not hasattr(TokenizerCore, n)}
        # annotated attributes are set by the constructor
        missing -= {"planner", "template", "stats", "shadow", "config", "threads", "sessions"}
        assert not missing, (protocol.__name__, missing)
