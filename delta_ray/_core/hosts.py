"""What each host asks of the tokenizer it is handed: narrow interfaces over ``TokenizerCore``.

A pool's caller side, a pool's worker and a Serve replica each hold a
:class:`~delta_ray._tokenizer_core.TokenizerCore` (the hosts of sessions also its session owner,
``sessions``), but each uses only the part of it named here
(``tests/core/test_hosts.py`` checks their source against these), so the core behind them can change
without reaching into them. The types are the concrete ones: mypy checks that ``TokenizerCore`` is
both (``_tokenizer_core.py``'s last lines). Ray-free; types only.
"""
from __future__ import annotations

from collections import Counter
from typing import Callable, Protocol, Sequence, Union

import numpy as np
import pyarrow as pa

from .admission import Admission
from .config import TokenizerConfig
from .plan import Plan, Route
from .planner import PlannerConfig
from .repair import RepairPlan
from .sessions import Sessions
from .template import Template

#: IDs as a caller hands them to decode: a list, numpy, or Arrow (pyarrow is untyped here).
IdsLike = Union[Sequence[int], np.ndarray, pa.Array, pa.ChunkedArray]


class ShadowCounts(Protocol):
    """The shadow verifier as a host reads it (``engine.shadow.ShadowVerifier``): its counters,
    and a listener told of each comparison (True: a mismatch)."""

    @property
    def comparisons(self) -> int: ...

    @property
    def mismatches(self) -> int: ...

    def add_listener(self, fn: Callable[[bool], None]) -> None: ...


class PoolLocal(Protocol):
    """A pool's own tokenizer in its caller's process: plans what the workers run, runs what the
    router keeps in the caller, assembles the workers' answers, and answers when no worker does."""

    planner: PlannerConfig
    template: Template
    config: TokenizerConfig

    @property
    def admission(self) -> Admission: ...

    @property
    def uses_fast_engine(self) -> bool: ...

    def plan(self, text: str, slots: int | None = None) -> Plan: ...

    def plan_session_init(self, text: str, slots: int) -> RepairPlan: ...

    def missed_cuts(self, text: str, plan: Plan, slots: int) -> int: ...

    def run_pieces(self, pieces: list[str]) -> list[np.ndarray]: ...

    def finish(self, ids: np.ndarray, add_special_tokens: bool) -> np.ndarray: ...

    def session_arrow(self, id_parts: Sequence[np.ndarray | pa.Array], add_special_tokens: bool) -> pa.ChunkedArray: ...

    def encode_routed(self, route: Route, text: str, session: str | None = None,
                      add_special_tokens: bool = True) -> np.ndarray: ...

    def encode_ids(self, text: str, *, session: str | None = None, add_special_tokens: bool = True) -> np.ndarray: ...

    def encode_by_reference(self, text: str, add_special_tokens: bool) -> np.ndarray: ...

    def decode(self, ids: IdsLike, *, skip_special_tokens: bool = True) -> str: ...

    def cuts(self, text: str) -> list[int]: ...


class SessionHost(Protocol):
    """The tokenizer that holds sessions where they are served (a pool's worker, a Serve replica):
    its stateless side here, its session owner as ``sessions`` (the concrete
    :class:`~delta_ray._core.sessions.Sessions`, the one holder of the process's session state)."""

    template: Template
    stats: Counter[str]
    config: TokenizerConfig
    threads: int
    sessions: Sessions

    @property
    def shadow(self) -> ShadowCounts: ...

    @property
    def admission(self) -> Admission: ...

    @property
    def digest(self) -> str: ...

    @property
    def uses_fast_engine(self) -> bool: ...

    def fast_allows(self, text: str) -> bool: ...

    def encode_routed(self, route: Route, text: str, session: str | None = None,
                      add_special_tokens: bool = True) -> np.ndarray: ...

    def encode_ids(self, text: str, *, session: str | None = None, add_special_tokens: bool = True) -> np.ndarray: ...

    def run_pieces(self, pieces: list[str]) -> list[np.ndarray]: ...
