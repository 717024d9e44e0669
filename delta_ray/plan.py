"""The one request path: route a request, plan its pieces, run them on an executor, finish.

Every path (a stateless text, a batch, a session's first encode) becomes a :class:`Plan`: the
consecutive pieces between safe cuts, each encoded with no post-processing, whose IDs concatenate
to the whole text's; the template (BOS, suffix) is applied once when finishing. A configuration the
exactness argument does not cover is a plan with no cuts that the reference encodes whole, its own
post-processing included: one encode, never a guess. ``DeltaTokenizer`` runs plans on its threads;
``TokenizerPool`` runs the same plans on Ray (``DeltaTokenizer.run_pieces`` here, the orchestrator's
dispatcher there).
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Sequence


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
    """Where a request goes: one decision for the in-process tokenizer and the pool (``route``)."""

    SESSION = "session"  # a keyed session: repair the tail after the stored text's last safe cut
    SESSION_WHOLE = "session_whole"  # a keyed session re-encoded whole: too little to reuse to pay for a repair
    CONTENT = "content"  # keyless, reusing a stored text that shares its prefix
    CHUNKED = "chunked"  # keyless and long: pieces between safe cuts, in parallel
    WHOLE = "whole"  # keyless and short (or unadmitted): one encode


SESSION, SESSION_WHOLE, CONTENT, CHUNKED, WHOLE = (Route.SESSION, Route.SESSION_WHOLE, Route.CONTENT,
                                                  Route.CHUNKED, Route.WHOLE)

# The repair's own cost beyond encoding its tail (finding the checkpoint, splicing the kept IDs, the
# kept part's Arrow slice), in characters the engine encodes in the same time: measured with
# bench/bench_turns.py's --splice on this machine (about 0.02 ms; fast engine ~100 chars/us, the
# reference ~1.5 chars/us). Below this much reusable text a whole re-encode is the cheaper turn.
SPLICE_CHARS_FAST = 2048
SPLICE_CHARS_REFERENCE = 32


def route(n_chars: int, session: str | None, *, admitted: bool, cut_threshold: int, content_reuse: bool,
          reusable: int | None = None, fast: bool = False) -> Route:
    """The path a request takes: its session, content reuse, chunks, or one whole encode.

    An unadmitted configuration has no cuts and no repairs: keyless texts are one whole encode
    (a keyed session still keeps its text, so that ``extend`` works). For a session turn,
    ``reusable`` (the characters the new text shares with the stored one, an upper bound of what a
    repair keeps) makes it a cost-based choice: a whole re-encode by the current engine (``fast``:
    the fast tier) when that is estimated cheaper than repairing. Either way the new state is a
    complete one (IDs and checkpoints), so the next turn repairs from it."""
    if session is not None:
        if reusable is not None and admitted and reusable < (SPLICE_CHARS_FAST if fast else SPLICE_CHARS_REFERENCE):
            return SESSION_WHOLE
        return SESSION
    if not admitted:
        return WHOLE
    if content_reuse:
        return CONTENT
    return CHUNKED if n_chars >= cut_threshold else WHOLE
