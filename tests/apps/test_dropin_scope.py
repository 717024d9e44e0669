"""``delta_ray.request_scope``: a request's identity as the wrapped tokenizer sees it (nesting, threads,
asyncio, argument checks). The sessions it selects are tested in ``test_dropin_sessions.py``."""
from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

import delta_ray
from delta_ray.apps.dropin.scope import Scope, current_scope, request_scope


def test_the_public_name_is_the_modules():
    assert delta_ray.request_scope is request_scope
    assert "request_scope" in delta_ray.__all__


def test_nesting_inner_wins_whole_and_the_outer_comes_back():
    assert current_scope() is None
    with request_scope(session="a", tenant="t") as s:
        assert s == Scope("a", "t") and current_scope() == s
        with request_scope(session="b"):
            assert current_scope() == Scope("b", None)  # the tenant is not inherited
        assert current_scope() == Scope("a", "t")
        with request_scope():
            assert current_scope() == Scope(None, None)
        assert current_scope() == Scope("a", "t")
    assert current_scope() is None


def test_one_object_entered_twice_restores_both():
    scope = request_scope(session="x")
    with scope:
        with request_scope(session="y"):
            with scope:
                assert current_scope() == Scope("x", None)
            assert current_scope() == Scope("y", None)
        assert current_scope() == Scope("x", None)
    assert current_scope() is None


def test_an_exception_restores_the_outer_scope():
    with request_scope(session="outer"):
        with pytest.raises(RuntimeError):
            with request_scope(session="inner"):
                raise RuntimeError("boom")
        assert current_scope() == Scope("outer", None)


def test_bad_arguments_are_refused():
    for bad in ({"session": 3}, {"tenant": b"salt"}, {"session": ["a"]}, {"tenant": 1.5}):
        with pytest.raises(TypeError):
            request_scope(**bad)
    assert "salt" not in repr(request_scope(session="s", tenant="salt"))  # a cache_salt is a secret


def test_threads_see_the_scope_only_when_carried():
    """Thread pools do not copy context variables; ``request_scope.bind`` carries the scope, and a
    bound function may run on several threads at once."""
    with request_scope(session="s", tenant="t"):
        with ThreadPoolExecutor(4) as ex:
            assert ex.submit(current_scope).result() is None
            bound = request_scope.bind(current_scope)
            assert [f.result() for f in [ex.submit(bound) for _ in range(16)]] == [Scope("s", "t")] * 16
        seen = []
        t = threading.Thread(target=request_scope.bind(lambda: seen.append(current_scope())))
        t.start()
        t.join()
        assert seen == [Scope("s", "t")]
    # the bound function restores the thread's own scope afterwards
    with ThreadPoolExecutor(1) as ex:
        with request_scope(session="s"):
            bound = request_scope.bind(current_scope)
        assert ex.submit(lambda: (bound(), current_scope())).result() == (Scope("s", None), None)


def test_asyncio_tasks_and_to_thread_carry_it():
    async def main():
        async def one(i):
            with request_scope(session=f"s{i}", tenant="t"):
                await asyncio.sleep(0)
                here = current_scope()
                there = await asyncio.to_thread(current_scope)
                loop = asyncio.get_running_loop()
                pooled = await loop.run_in_executor(None, request_scope.bind(current_scope))
                return here, there, pooled
        return await asyncio.gather(*(one(i) for i in range(8)))
    for i, (here, there, pooled) in enumerate(asyncio.run(main())):
        assert here == there == pooled == Scope(f"s{i}", "t")
