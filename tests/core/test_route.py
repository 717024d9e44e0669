"""The one routing decision (delta_ray.core.plan.Router): every entry point asks it, none re-derives it."""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from delta_ray.core.plan import CHUNKED, CONTENT, REFERENCE, SESSION, WHOLE, Router


@pytest.mark.parametrize("router, text, session, want", [
    (Router(True, 100), "x" * 10, "s", SESSION),
    (Router(False, 100), "x" * 10, "s", SESSION),  # unadmitted sessions keep their text (extend works)
    (Router(False, 100), "x" * 1000, None, REFERENCE),  # unadmitted keyless: the reference, whole
    (Router(True, 100), "x" * 99, None, WHOLE),
    (Router(True, 100), "x" * 100, None, CHUNKED),
    (Router(True, 100, content_reuse=True), "x" * 1000, None, CONTENT),  # in process: any length
    (Router(True, 100, content_reuse=True, content_below=100), "x" * 99, None, CONTENT),  # a pool
    (Router(True, 100, content_reuse=True, content_below=100), "x" * 100, None, CHUNKED),
])
def test_route(router, text, session, want):
    assert router.route(text, session) is want


@given(st.text(max_size=40), st.integers(min_value=1, max_value=64))
def test_is_small_is_the_utf8_size(text, small_bytes):
    router = Router(True, 100, small_bytes=small_bytes)
    assert router.is_small(text) == (len(text.encode("utf-8", "surrogatepass")) < small_bytes)


def test_every_entry_point_routes_through_the_router():
    """The tokenizer, the pool's orchestrator and Serve's handler hold no routing formula of their
    own: no call of a free route function, no local byte-size rule."""
    import pathlib
    root = pathlib.Path(__file__).resolve().parents[2]
    for rel in ("delta_ray/tokenizer_core.py", "actors/orchestrator.py", "delta_ray/apps/server/serve_handler.py"):
        src = (root / rel).read_text(encoding="utf-8")
        assert "LOCAL_MAX_BYTES" not in src, rel
        assert " route(" not in src, rel
