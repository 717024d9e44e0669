"""The one request path: decide a request's route, plan its pieces, run them on an executor, finish.

Every path (a stateless text, a batch, a session's first encode) becomes a :class:`Plan`: the
consecutive pieces between safe cuts, each encoded with no post-processing, whose IDs concatenate
to the whole text's; the template (BOS, suffix) is applied once when finishing. A configuration the
exactness argument does not cover is a plan with no cuts that the reference encodes whole, its own
post-processing included: one encode, never a guess. ``TokenizerCore`` runs plans on its threads;
``TokenizerPool`` runs the same plans on Ray (``TokenizerCore.run_pieces`` here, the orchestrator's
dispatcher there).
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Callable, Sequence

from delta_ray._core import constants as C


def split_at(text: str, cuts: Sequence[int], skip: int = 0) -> list[str]:
    """``text`` cut at the sorted offsets ``cuts``: consecutive pieces that join back to it, but for
    the ``skip`` characters each piece after a cut leaves out (:func:`pieces_between`)."""
    if not cuts:
        return [text]
    return pieces_between(text, [0, *cuts, len(text)], skip)


def pieces_between(text: str, bounds: Sequence[int], skip: int, origin: int = 0) -> list[str]:
    """The pieces ``text[a:b]`` between consecutive ``bounds`` (empty ones left out), ``text`` being
    a window that starts at ``origin`` of the whole text. A piece that starts at a cut (any bound
    past the whole text's start) leaves out its first ``skip`` characters: the pipeline's ``Prepend``
    writes them back (:attr:`~delta_ray._core.cut_predicate.CutPredicate.piece_skip`, docs/proof.md §3)."""
    out = []
    for a, b in zip(bounds, bounds[1:]):
        if b > a:
            out.append(text[a + skip:b] if skip and origin + a > 0 else text[a:b])
    return out


@dataclass(frozen=True)
class Plan:
    """What to encode for one text: pieces between safe cuts, or the whole text by the reference."""

    text: str
    cuts: tuple[int, ...] = ()
    by_reference: bool = False  # unadmitted: the reference encodes the text whole, template included
    skip: int = 0  # characters a piece after a cut leaves out (CutPredicate.piece_skip)

    @property
    def pieces(self) -> list[str]:
        return split_at(self.text, self.cuts, self.skip)


class Route(str, Enum):
    """Where a request goes: :meth:`Router.decide` makes this decision once per request, on every
    host (a tokenizer in process, a pool's caller side, a Serve replica), and the host matches on it."""

    SESSION = "session"  # a named session's turn, on the host that holds the session
    REFERENCE_SESSION = "reference_session"  # unadmitted: the reference, whole; the text kept so that extend works
    CONTENT = "content"  # keyless, reusing a stored text that shares its prefix (inside its tenant)
    POOL = "pool"  # keyless: to a pool, whose workers and tasks run its plan
    CHUNKED = "chunked"  # keyless and long: pieces between safe cuts, in parallel in this process
    HERE = "here"  # keyless: one encode in this process by the engine in use
    UNADMITTED = "unadmitted"  # keyless, configuration not admitted: the reference, whole, template included
    # What a session turn is, decided once its stored state is read (:meth:`Router.turn`):
    REPAIR = "repair"  # re-encode only the tail after the stored text's last valid checkpoint
    REENCODE = "reencode"  # re-encode whole: too little to reuse to pay for a repair (a complete new state)


SESSION, REFERENCE_SESSION, CONTENT, POOL, CHUNKED, HERE, UNADMITTED = (
    Route.SESSION, Route.REFERENCE_SESSION, Route.CONTENT, Route.POOL, Route.CHUNKED, Route.HERE, Route.UNADMITTED)
REPAIR, REENCODE = Route.REPAIR, Route.REENCODE


class Host(str, Enum):
    """Which kind of host a :class:`Router` decides for."""

    PROCESS = "process"  # a tokenizer in this process (DeltaTokenizer, a pool's worker)
    POOL = "pool"  # a pool's caller side: the caller's own threads, or the pool's workers and tasks
    SERVE = "serve"  # a Serve replica: its own process, and a pool if it has one


# The repair's own cost beyond encoding its tail (finding the checkpoint, splicing the kept IDs, the
# kept part's Arrow slice), in characters the engine encodes in the same time: measured with
# bench/bench_turns.py's --splice on this machine (about 0.02 ms; fast engine ~100 chars/us, the
# reference ~1.5 chars/us). Below this much reusable text a whole re-encode is the cheaper turn.
SPLICE_CHARS_FAST = 2048
SPLICE_CHARS_REFERENCE = 32


@dataclass(frozen=True)
class Router:
    """The routing decisions of one host, built once from its admission and thresholds: the only
    place a request's route is decided, a length compared with a threshold or admission read.

    ``content_reuse``: keyless texts are reused by content (in process: ``reuse="content"``; a
    pool: under ``cut_threshold``, longer ones being planned over the pool; a Serve replica: texts
    too large to encode in passing). ``pool_from``: a Serve replica with a pool sends it keyless
    texts this long, and its overflow while busy. ``place_here``: a pool's placement model (is a
    keyless text done sooner by the caller itself?); None keeps every text not small on the pool.
    An unadmitted configuration has no cuts and no repairs: its keyless texts are encoded whole by
    the reference, and so are its sessions' (which keep their text so that ``extend`` works).
    """

    admitted: bool
    cut_threshold: int
    host: Host = Host.PROCESS
    content_reuse: bool = False
    pool_from: int | None = None
    place_here: Callable[[str], bool] | None = None
    small_bytes: int = C.LOCAL_MAX_BYTES  # under this much UTF-8 a keyless text is encoded where it is

    def decide(self, text: str, session: str | None = None, *, batch: bool = False, busy: bool = False) -> Route:
        """The route of a request for ``text`` (with ``session``, its name). ``batch``: a row of a
        batch, encoded once (never kept for reuse, never placed alone: the batch runs together);
        ``busy``: the host is past its own concurrency (a Serve replica then overflows keyless
        texts to its pool)."""
        if session is not None:
            return self.session_route()
        n = len(text)
        host = self.host
        if host is Host.SERVE:
            if self.pool_from is not None and (n >= self.pool_from or busy):
                return POOL
            if self.is_small(text) or batch:
                return self.in_passing()
            return CONTENT
        if host is Host.POOL:
            if self.is_small(text):  # encoded by the caller: a call to the pool costs more
                return self.in_passing()
            if self.admitted and not batch and self.place_here is not None and self.place_here(text):
                return CHUNKED if n >= self.cut_threshold else HERE
            if self.admitted and not batch and self.content_reuse and n < self.cut_threshold:
                return CONTENT  # sticky by content on a worker
            return POOL
        if not self.admitted:
            return UNADMITTED
        if self.content_reuse and not batch:
            return CONTENT
        return CHUNKED if n >= self.cut_threshold else HERE

    def in_passing(self) -> Route:
        """A text encoded whole where it is, kept for nothing: by the fast paths when admitted, else
        by the reference (a small text, or a keyless one too short to be looked up by content)."""
        return HERE if self.admitted else UNADMITTED

    def session_route(self) -> Route:
        """A named session's route: its turn, or the reference's whole encode when unadmitted."""
        return SESSION if self.admitted else REFERENCE_SESSION

    def turn(self, reusable: int, *, fast: bool) -> Route:
        """What an admitted session's turn is, once the stored state is read: ``reusable`` (the
        characters the new text shares with the stored one, an upper bound of what a repair keeps)
        under the repair's fixed cost makes it a whole re-encode by the current engine (``fast``:
        the fast tier). Either way the new state is a complete one (IDs and checkpoints), so the
        next turn repairs from it."""
        if reusable < (SPLICE_CHARS_FAST if fast else SPLICE_CHARS_REFERENCE):
            return REENCODE
        return REPAIR

    def batch(self, *, fast: bool, reference_native: bool) -> Route:
        """A batch's route as a whole: the reference's own batch call (texts whole, parallel across
        them) when unadmitted, or when the reference encodes now and is a native-speed engine
        (tokenizers 1.x: per-text planning would cost more than it saves); else CHUNKED: each row
        by :meth:`decide`, all pieces in one flat call."""
        if not self.admitted or (reference_native and not fast):
            return UNADMITTED
        return CHUNKED

    def cuts(self, text: str) -> bool:
        """Whether ``text`` is long enough to be cut into chunks (a session's first encode on a pool
        is then cut over its workers and tasks)."""
        return len(text) >= self.cut_threshold

    def is_small(self, text: str) -> bool:
        """Whether ``text`` is under ``small_bytes`` of UTF-8 (read only when the length alone
        cannot tell: an ASCII text's length is its size, and UTF-8 takes at most 4 bytes a character)."""
        n = len(text)
        if n >= self.small_bytes:
            return False
        if text.isascii() or n * 4 < self.small_bytes:
            return True
        return len(text.encode("utf-8", "surrogatepass")) < self.small_bytes
