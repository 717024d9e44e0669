"""The one request path: route a request, plan its pieces, run them on an executor, finish.

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
from typing import Sequence

from delta_ray.core import constants as C


def split_at(text: str, cuts: Sequence[int]) -> list[str]:
    """``text`` cut at the sorted offsets ``cuts``: consecutive pieces that join back to it."""
    if not cuts:
        return [text]
    bounds = [0, *cuts, len(text)]
    return [text[a:b] for a, b in zip(bounds, bounds[1:])]


@dataclass(frozen=True)
class Plan:
    """What to encode for one text: pieces between safe cuts, or the whole text by the reference."""

    text: str
    cuts: tuple[int, ...] = ()
    by_reference: bool = False  # unadmitted: the reference encodes the text whole, template included

    @property
    def pieces(self) -> list[str]:
        return split_at(self.text, self.cuts)


class Route(str, Enum):
    """Where a request goes (:class:`Router`): one decision for the in-process tokenizer, the pool
    and Serve."""

    SESSION = "session"  # a keyed session: repair the tail after the stored text's last safe cut
    SESSION_WHOLE = "session_whole"  # a keyed session re-encoded whole: too little to reuse to pay for a repair
    CONTENT = "content"  # keyless, reusing a stored text that shares its prefix (inside its tenant)
    CHUNKED = "chunked"  # keyless and long: pieces between safe cuts, in parallel
    WHOLE = "whole"  # keyless and short: one encode by the current engine
    REFERENCE = "reference"  # keyless, unadmitted configuration: the reference, whole, template included


SESSION, SESSION_WHOLE, CONTENT, CHUNKED, WHOLE, REFERENCE = (
    Route.SESSION, Route.SESSION_WHOLE, Route.CONTENT, Route.CHUNKED, Route.WHOLE, Route.REFERENCE)

# The repair's own cost beyond encoding its tail (finding the checkpoint, splicing the kept IDs, the
# kept part's Arrow slice), in characters the engine encodes in the same time: measured with
# bench/bench_turns.py's --splice on this machine (about 0.02 ms; fast engine ~100 chars/us, the
# reference ~1.5 chars/us). Below this much reusable text a whole re-encode is the cheaper turn.
SPLICE_CHARS_FAST = 2048
SPLICE_CHARS_REFERENCE = 32


@dataclass(frozen=True)
class Router:
    """The routing decision of one tokenizer (or pool), built once from its admission and thresholds.

    ``content_reuse``: keyless texts are reused by content; ``content_below`` (a pool) keeps that to
    texts shorter than it, longer ones being chunked over the cluster. An unadmitted configuration
    has no cuts and no repairs: its keyless texts are :data:`REFERENCE` (a keyed session still keeps
    its text, so that ``extend`` works).
    """

    admitted: bool
    cut_threshold: int
    content_reuse: bool = False
    content_below: int | None = None
    small_bytes: int = C.LOCAL_MAX_BYTES  # under this much UTF-8 a text is encoded where it is

    def route(self, text: str, session: str | None) -> Route:
        """The path of a request for ``text`` (with ``session``, its key)."""
        if session is not None:
            return SESSION
        if not self.admitted:
            return REFERENCE
        n = len(text)
        if self.content_reuse and (self.content_below is None or n < self.content_below):
            return CONTENT
        return CHUNKED if n >= self.cut_threshold else WHOLE

    def turn(self, reusable: int, *, fast: bool) -> Route:
        """A session turn's cost-based choice, once the stored state is read: ``reusable`` (the
        characters the new text shares with the stored one, an upper bound of what a repair keeps)
        under the repair's fixed cost makes it a whole re-encode by the current engine (``fast``:
        the fast tier). Either way the new state is a complete one (IDs and checkpoints), so the
        next turn repairs from it. An unadmitted configuration never repairs."""
        if self.admitted and reusable < (SPLICE_CHARS_FAST if fast else SPLICE_CHARS_REFERENCE):
            return SESSION_WHOLE
        return SESSION

    def is_small(self, text: str) -> bool:
        """Whether ``text`` is under ``small_bytes`` of UTF-8 (read only when the length alone
        cannot tell: an ASCII text's length is its size, and UTF-8 takes at most 4 bytes a character)."""
        n = len(text)
        if n >= self.small_bytes:
            return False
        if text.isascii() or n * 4 < self.small_bytes:
            return True
        return len(text.encode("utf-8", "surrogatepass")) < self.small_bytes
