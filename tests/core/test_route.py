"""The one routing decision (delta_ray._core.plan.Router.decide): every host asks it, none re-derives it."""
from __future__ import annotations

import ast
import pathlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from delta_ray._core.plan import CHUNKED, CONTENT, HERE, POOL, REFERENCE_SESSION, SESSION, UNADMITTED, Host, Router

BIG = "x" * 5000  # over the 4,096 bytes encoded in passing
ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("router, text, session, want", [
    # a tokenizer in process
    (Router(True, 100), "x" * 10, "s", SESSION),
    (Router(False, 100), "x" * 10, "s", REFERENCE_SESSION),  # unadmitted sessions keep their text (extend works)
    (Router(False, 100), "x" * 1000, None, UNADMITTED),  # unadmitted keyless: the reference, whole
    (Router(True, 100), "x" * 99, None, HERE),
    (Router(True, 100), "x" * 100, None, CHUNKED),
    (Router(True, 100, content_reuse=True), "x" * 1000, None, CONTENT),
    # a pool's caller side: small texts in the caller, others sticky by content or planned over the pool
    (Router(True, 10_000, Host.POOL, content_reuse=True), "x" * 99, None, HERE),
    (Router(False, 10_000, Host.POOL, content_reuse=True), "x" * 99, None, UNADMITTED),
    (Router(True, 10_000, Host.POOL, content_reuse=True), BIG, None, CONTENT),
    (Router(True, 4096, Host.POOL, content_reuse=True), BIG, None, POOL),
    (Router(False, 10_000, Host.POOL, content_reuse=True), BIG, None, POOL),  # the reference, whole, on a worker
    (Router(True, 4096, Host.POOL, content_reuse=True, place_here=lambda t: True), BIG, None, CHUNKED),
    (Router(True, 10_000, Host.POOL, content_reuse=True, place_here=lambda t: True), BIG, None, HERE),
    (Router(False, 4096, Host.POOL, content_reuse=True, place_here=lambda t: True), BIG, None, POOL),
    # a Serve replica: its own sessions and content, its pool for long texts
    (Router(True, 100, Host.SERVE), "x" * 99, None, HERE),
    (Router(False, 100, Host.SERVE), "x" * 99, None, UNADMITTED),
    (Router(True, 100, Host.SERVE), BIG, None, CONTENT),
    (Router(True, 100, Host.SERVE, pool_from=100), BIG, None, POOL),
    (Router(True, 100_000, Host.SERVE, pool_from=100_000), BIG, None, CONTENT),
    (Router(True, 100, Host.SERVE, pool_from=100), "x" * 5, "s", SESSION),
])
def test_decide(router, text, session, want):
    assert router.decide(text, session) is want


def test_batch_rows_are_never_reused_or_placed_alone():
    pool = Router(True, 10_000, Host.POOL, content_reuse=True, place_here=lambda t: True)
    assert pool.decide(BIG, batch=True) is POOL
    assert Router(True, 100, content_reuse=True).decide("x" * 1000, batch=True) is CHUNKED
    assert Router(True, 10_000, Host.SERVE, pool_from=10_000).decide("x" * 5, busy=True) is POOL  # overflow


def test_batch_as_a_whole():
    assert Router(False, 100).batch(fast=False, reference_native=False) is UNADMITTED
    assert Router(True, 100).batch(fast=False, reference_native=True) is UNADMITTED
    assert Router(True, 100).batch(fast=True, reference_native=True) is CHUNKED


@given(st.text(max_size=40), st.integers(min_value=1, max_value=64))
def test_is_small_is_the_utf8_size(text, small_bytes):
    router = Router(True, 100, small_bytes=small_bytes)
    assert router.is_small(text) == (len(text.encode("utf-8", "surrogatepass")) < small_bytes)


HOSTS = ["delta_ray/tokenizer.py", "delta_ray/_tokenizer_core.py", "actors/orchestrator.py", "actors/pool.py",
         "actors/worker.py", "actors/data.py",
         *sorted(str(p.relative_to(ROOT)) for part in ("apps", "server", "batch")
                 for p in (ROOT / "delta_ray" / part).rglob("*.py"))]
THRESHOLDS = {"cut_threshold", "min_cut_text", "small_bytes", "pool_from", "LOCAL_MAX_BYTES"}
ADMISSION = {"admitted", "predicate", "_predicate"}


def _route_decisions(path: pathlib.Path) -> list[str]:
    """Places that decide a route themselves: a comparison with a routing threshold, an ``is_small``
    call, or a test of admission (``x.admitted``, ``x.predicate is None``) in a condition, outside
    a constructor."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    # A constructor reads admission to build its router (and what only an admitted one has):
    # configuration, not a request's route.
    setup = {id(n) for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) and f.name == "__init__"
             for n in ast.walk(f)}
    out = []
    for node in ast.walk(tree):
        if id(node) in setup:
            continue
        if isinstance(node, ast.Compare):
            names = {n.attr if isinstance(n, ast.Attribute) else n.id
                     for n in ast.walk(node) if isinstance(n, (ast.Attribute, ast.Name))}
            if names & THRESHOLDS:
                out.append(f"{path.name}:{node.lineno}: compares {sorted(names & THRESHOLDS)}")
            if names & ADMISSION:
                out.append(f"{path.name}:{node.lineno}: tests admission")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "is_small":
            out.append(f"{path.name}:{node.lineno}: is_small")
        elif isinstance(node, (ast.If, ast.IfExp, ast.While, ast.BoolOp, ast.UnaryOp)):
            test = node.test if isinstance(node, (ast.If, ast.IfExp, ast.While)) else node
            if any(isinstance(n, ast.Attribute) and n.attr in ADMISSION for n in ast.walk(test)):
                out.append(f"{path.name}:{node.lineno}: tests admission")
    return sorted(set(out))


def test_router_decide_is_the_only_place_a_route_is_decided():
    """No host holds a routing rule of its own: thresholds are compared and admission is read in
    _core/plan.py alone, and each host matches on the Route the router returns."""
    found = [d for rel in HOSTS for d in _route_decisions(ROOT / rel)]
    assert not found, "routing decided outside Router.decide:\n" + "\n".join(found)


def test_the_route_check_sees_a_second_place(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("def f(self, text):\n    if len(text) >= self.config.cut_threshold:\n        return 1\n"
                     "    if not self.admitted:\n        return 2\n    return self.router.is_small(text)\n")
    assert len(_route_decisions(probe)) == 3
