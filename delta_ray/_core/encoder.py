"""The encoder seam: whatever turns a piece of text into token IDs.

Every fast path in delta-ray (chunks, repair tails, short texts) asks an ``Encoder`` for the IDs of
pieces of text *without post-processing*; post-processing (BOS, templates) is applied once to the
assembled sequence by :mod:`delta_ray._core.assembly`. The planner, the repair, the store, the pool and the
batch pipeline never care which encoder ran, so a faster engine can replace the reference one piece
at a time as long as it returns the same IDs.
"""
from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable

import numpy as np
from tokenizers import Tokenizer

from .assembly import flat_from_pieces
from .loading import LoadedTokenizer
from .reference_api import encode_batch as _reference_batch
from .reference_api import ids_of

PARALLEL_MIN_CHARS = 32768  # below this total, pieces are encoded sequentially


@runtime_checkable
class Encoder(Protocol):
    """Encodes pieces of text to int32 IDs with no post-processing, in each output shape a caller
    needs: one array per text, one flat buffer with offsets, or Python lists (the drop-in's
    container). Every shape is declared, so no caller probes an encoder for one."""

    @property
    def name(self) -> str: ...

    def encode_pieces(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Return one int32 array per text, equal to the reference's IDs with add_special_tokens=False."""
        ...

    def encode_flat(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """The IDs of ``texts`` concatenated, and each text's start in them (len(texts) + 1 offsets)."""
        ...

    def encode_lists(self, texts: Sequence[str]) -> list[list[int]] | None:
        """One Python list of IDs per text where the encoder makes them itself, or None: the caller
        then converts :meth:`encode_flat`'s values."""
        ...


class ArraysByIndex(Protocol):
    """int32 ID arrays read by index: a list of them, or a view that makes each one when read."""

    def __len__(self) -> int: ...

    def __getitem__(self, i: int, /) -> np.ndarray: ...


class Guard(Protocol):
    """The fast tier's guard: which texts the fast engine may encode."""

    def allows(self, text: str) -> bool:
        """Whether the fast engine's IDs of ``text`` are the reference's (no guarded code point)."""
        ...

    def positions(self, text: str) -> np.ndarray:
        """Indices of every guarded code point in ``text``."""
        ...

    def __len__(self) -> int: ...


class PiecesEncoder:
    """An encoder that makes only arrays: its flat output is assembled from them, and it has no
    lists of its own. Subclasses implement :meth:`encode_pieces`."""

    name = "pieces"

    def encode_pieces(self, texts: Sequence[str]) -> list[np.ndarray]:
        raise NotImplementedError

    def encode_flat(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`encode_pieces`' arrays as one buffer and offsets."""
        return flat_from_pieces(self.encode_pieces(texts))

    def encode_lists(self, texts: Sequence[str]) -> list[list[int]] | None:
        """None: the caller converts :meth:`encode_flat`'s values."""
        return None


class ReferenceEncoder(PiecesEncoder):
    """The reference ``tokenizers`` pipeline, used through its GIL-releasing batch form.

    ``encode_batch_fast`` (``encode_batch`` under tokenizers 1.x, :mod:`delta_ray._core.reference_api`)
    skips offsets and releases the GIL, so other threads (an event loop, a Serve replica) keep
    running while it encodes; with several inputs it spreads them over the tokenizers thread pool.
    """

    name = "reference"

    def __init__(self, tokenizer: "Tokenizer | LoadedTokenizer"):
        """``tokenizer``: the reference, or a :class:`~delta_ray._core.loading.LoadedTokenizer` whose
        reference is then built on this encoder's first use (a worker whose texts all go to the
        fast tier never pays for it)."""
        self._source = tokenizer

    @property
    def tokenizer(self) -> Tokenizer:
        src = self._source
        return src.tokenizer if isinstance(src, LoadedTokenizer) else src

    def encode_pieces(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Encode each text with the reference, no special tokens; reject what it rejects with ValueError."""
        return self.encode_texts(texts, add_special_tokens=False)

    def encode_texts(self, texts: Sequence[str], add_special_tokens: bool) -> list[np.ndarray]:
        """The reference's own IDs of whole texts, its post-processing included when asked (the one
        place that turns the reference's refusal of a text into ValueError)."""
        if not texts:
            return []
        try:
            if len(texts) > 1 and sum(map(len, texts)) < PARALLEL_MIN_CHARS:
                # Small pieces (a repair's tail): a parallel batch costs more in thread hand-offs
                # than it saves, so encode them one by one on this thread.
                encs = [_reference_batch(self.tokenizer, [t], add_special_tokens)[0] for t in texts]
            else:
                encs = _reference_batch(self.tokenizer, texts, add_special_tokens)
        except Exception as exc:  # the reference's own refusal (e.g. lone surrogates)
            raise ValueError(f"the reference tokenizer rejected the text: {exc}") from exc
        out = []
        for enc in encs:
            out.append(ids_of(enc))
        del encs  # Encoding objects are heavy; free them before the caller goes on
        return out

    def encode_offsets(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        """The reference's IDs of one text (no special tokens) and each one's character offsets,
        an (n, 2) int32 array (``encode_batch``: it keeps offsets and releases the GIL)."""
        try:
            enc = self.tokenizer.encode_batch([text], add_special_tokens=False)[0]
        except Exception as exc:  # the reference's own refusal (e.g. lone surrogates)
            raise ValueError(f"the reference tokenizer rejected the text: {exc}") from exc
        offsets = np.array(enc.offsets, dtype=np.int32).reshape(-1, 2)
        return ids_of(enc), offsets
