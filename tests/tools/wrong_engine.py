"""A deliberately wrong fast engine for the tests that must catch one (shadow checks, purges)."""
from __future__ import annotations

from delta_ray._core.encoder import ReferenceEncoder
from delta_ray._engine.native import PiecesEngine


class WrongEngine(PiecesEngine):
    """The reference's IDs with the last one of each piece changed: wrong on every non-empty piece."""

    def __init__(self, ref):
        self.ref = ReferenceEncoder(ref)

    def encode_pieces(self, texts):
        out = self.ref.encode_pieces(texts)
        for ids in out:
            if len(ids):
                ids[-1] = (ids[-1] + 1) % 1000
        return out
