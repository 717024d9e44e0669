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


# Where a request goes (one decision for the in-process tokenizer and the pool):
SESSION = "session"  # a keyed session: repair the tail after the stored text's last safe cut
CONTENT = "content"  # keyless, reusing a stored text that shares its prefix
CHUNKED = "chunked"  # keyless and long: pieces between safe cuts, in parallel
WHOLE = "whole"  # keyless and short (or unadmitted): one encode


def route(n_chars: int, session: str | None, *, admitted: bool, cut_threshold: int, content_reuse: bool) -> str:
    """The path a request takes: its session, content reuse, chunks, or one whole encode.

    An unadmitted configuration has no cuts and no repairs: keyless texts are one whole encode
    (a keyed session still keeps its text, so that ``extend`` works)."""
    if session is not None:
        return SESSION
    if not admitted:
        return WHOLE
    if content_reuse:
        return CONTENT
    return CHUNKED if n_chars >= cut_threshold else WHOLE
