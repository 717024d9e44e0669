"""The transport seam: how the pool's orchestrator reaches a worker, and the few ways that can fail.

``WorkerTransport.call(wid, call)`` runs one :class:`~delta_ray.actors.calls.Call` on worker
``wid`` (or, with ``wid=None``, a shared call as a chunk task) and returns its answer. A worker's
own exception (a refused text, ``SessionNotFound``) is raised as the worker raised it; the
transport's failures are only these three, so the orchestrator's failure policy is written once:

* :class:`WorkerDead` -- the worker is gone: retire it, its sessions move, its calls are retried;
* :class:`ConnectionLost` -- a live worker's connection dropped mid-call and the call may have
  been applied (only for calls that are not idempotent; idempotent ones are re-run here);
* :class:`NoAnswer` -- raised by the orchestrator's own timer, never by a transport.

``RayTransport`` uses actor calls and chunk tasks; ``ChannelTransport`` sends the calls the
channel may carry over the authenticated same-node side channel and everything else through Ray.
Tests use an in-process fake (tests/pool/test_orchestrator.py) with no Ray at all.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable, Protocol

from delta_ray._core.errors import DeltaRayError

from .calls import Call
from .worker_channel import ChannelClosed, ChannelNotSent

log = logging.getLogger("delta_ray.pool")

#: The cancel message of a call abandoned as hung (``task.cancel(HUNG)``). Only such a chunk task
#: is force-cancelled: any other cancellation (the pool closing, a caller gone) leaves the task to
#: finish and drops its answer, because ``ray.cancel`` racing a task's own completion aborts the
#: calling process inside Ray (task_manager.cc "Tried to complete task that was not pending",
#: ray-project/ray#54798). A hung task is not completing, so its cancel has no such race to lose.
HUNG = "abandoned as hung"


class TransportFailure(DeltaRayError, RuntimeError):
    """Base of the transport's own failures (never a worker's answer)."""


class WorkerDead(TransportFailure):
    """The worker process is gone."""

    def __init__(self, wid: str | None, detail: str = ""):
        super().__init__(f"worker {wid} is dead{': ' + detail if detail else ''}")
        self.wid = wid


class ConnectionLost(TransportFailure):
    """A live worker's connection dropped during a call that must not be re-run."""

    def __init__(self, wid: str):
        super().__init__(f"the connection to worker {wid} was lost mid-call")
        self.wid = wid


class NoAnswer(TransportFailure):
    """No answer within the request timeout (the orchestrator's timer)."""


class WorkerTransport(Protocol):
    async def call(self, wid: str | None, call: Call) -> Any:
        """Run ``call`` on worker ``wid`` (a chunk task when None); raise only the failures above
        or the worker's own exception."""
        ...

    def retire(self, wid: str, *, kill: bool) -> None:
        """Stop using worker ``wid``; with ``kill`` (a hung worker) also stop the process, when this
        process owns it."""
        ...

    def close(self) -> None:
        ...


def _unwrap(exc: BaseException) -> BaseException:
    cause = getattr(exc, "cause", None)  # RayTaskError wraps the worker's own exception
    return cause if isinstance(cause, BaseException) else exc


class RayTransport:
    """Actor calls on the workers and chunk tasks for shared calls."""

    def __init__(self, workers: dict[str, Any], chunk_task: Callable[[Call], Any], *, owner: bool):
        self._workers = workers
        self._chunk_task = chunk_task
        self._owner = owner

    async def call(self, wid: str | None, call: Call) -> Any:
        import ray

        try:
            if wid is None:
                ref = self._chunk_task(call)
            else:
                ref = getattr(self._workers[wid], call.kind.method).remote(*call.args)
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as exc:
            raise WorkerDead(wid, str(exc)) from exc  # a handle to an actor already known dead
        try:
            return await asyncio.wrap_future(ref.future())
        except asyncio.CancelledError as exc:
            if wid is None and exc.args == (HUNG,):  # a hung chunk task: free its process
                try:
                    ray.cancel(ref, force=True)
                except Exception:  # noqa: BLE001 - best effort
                    pass
            raise
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as exc:
            raise WorkerDead(wid, type(exc).__name__) from exc
        except ray.exceptions.RayTaskError as exc:
            raise _unwrap(exc) from None

    async def alive(self, wid: str) -> bool:
        try:
            await asyncio.wrap_future(self._workers[wid].ready.remote().future())
        except Exception:  # noqa: BLE001 - any failure to answer 'ready' means not usable
            return False
        return True

    def retire(self, wid: str, *, kill: bool) -> None:
        if not (kill and self._owner):
            return
        import ray
        try:
            ray.kill(self._workers[wid])
        except Exception:  # noqa: BLE001 - already gone
            pass

    def close(self) -> None:
        pass


class ChannelTransport:
    """The side channel for the calls it may carry, Ray for the rest and for workers without one.

    A request the channel could not send (no connection, or the worker's end was found closed
    before sending; the client reconnects on its own next time) was not applied, so it goes through
    Ray whatever its kind. A connection lost after sending says nothing certain, so Ray decides: a
    dead worker is :class:`WorkerDead`; a live one gets idempotent calls re-run through Ray, and a
    call that is not idempotent raises :class:`ConnectionLost` (it may have been applied: the
    orchestrator must not guess). A client that failed authentication is dropped for good.
    """

    def __init__(self, ray_transport: RayTransport, clients: dict[str, Any]):
        self._ray = ray_transport
        self._clients = clients

    @property
    def channels(self) -> dict[str, Any]:
        return self._clients

    async def call(self, wid: str | None, call: Call) -> Any:
        client = self._clients.get(wid) if wid is not None and call.kind.channel else None
        if client is None or not client.usable:
            return await self._ray.call(wid, call)
        try:
            return await client.call(call.kind.method, call.args)
        except ChannelNotSent as exc:
            sent = False
            detail = str(exc)
        except ChannelClosed as exc:
            sent = True
            detail = str(exc)
        if client.closed:  # authentication failed, or the answer was not the worker's
            self._clients.pop(wid, None)
        if not await self._ray.alive(wid):
            raise WorkerDead(wid, "its side channel closed")
        log.warning("side channel to live worker %s: %s; this call goes through Ray", wid, detail)
        if not sent or call.kind.idempotent:
            return await self._ray.call(wid, call)
        raise ConnectionLost(wid)

    def retire(self, wid: str, *, kill: bool) -> None:
        client = self._clients.pop(wid, None)
        if client is not None:
            client.close()
        self._ray.retire(wid, kill=kill)

    def close(self) -> None:
        for client in list(self._clients.values()):
            client.close()
        self._clients.clear()
