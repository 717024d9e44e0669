"""One transformers backend as delta-ray sees it: a ``DeltaTokenizer`` built from the LIVE backend.

transformers rebuilds its backend (``tok._tokenizer``) from its own config, so the backend's
``to_str()`` can differ from the tokenizer.json on disk; the live backend is the reference the
drop-in must agree with. A :class:`Snapshot` serializes it once (truncation and padding stripped:
transformers sets those per call, and the drop-in applies them itself or falls back), loads that
into a ``DeltaTokenizer`` (which decides admission and routing), and reads from the same JSON the
two facts about the post-processor the drop-in needs: how many special tokens it adds before and
after a single sequence, and the type id of every position. Everything it cannot read exactly is
``None``, and the caller then falls back to the backend.

:class:`LazyEncoding` stands in for a ``tokenizers.Encoding``: its length and attention mask are
known; any other attribute (IDs, tokens, offsets, word ids, ``char_to_token``...) encodes the text
once with a private copy of the snapshot under the same settings, so those are the reference's own
values (``ids`` included: a fresh list at each read, as stock's, never the ``input_ids`` list the
caller got, which it may mutate).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from tokenizers import Encoding, Tokenizer

from ..._core.loading import LoadedTokenizer
from ...tokenizer import DeltaTokenizer
from .sessions import DropinSessions
from .tripwire import Tripwire

NATIVE_KEY = "native_threads"  # drop-in options (patch._options), not DeltaTokenizer ones
RENDER_KEY = "fast_render"  # chat templates render through render.memo_render
RENDER_DEFAULT = True  # also for a state pickled before the option existed
CHECK_KEY = "check_every"  # the tripwire's full-check interval in calls (tripwire.Tripwire)
SESSIONS_KEY = "sessions"  # one-text encodes reuse a conversation's state (sessions.DropinSessions)
CONTENT_KEY = "content_reuse"  # ... found by content when the request names no session
_DROPIN_KEYS = (NATIVE_KEY, RENDER_KEY, CHECK_KEY, SESSIONS_KEY, CONTENT_KEY)

__all__ = ["LazyEncoding", "Snapshot", "TemplateShape", "template_of"]


@dataclass(frozen=True)
class TemplateShape:
    """What the post-processor does to ONE sequence: ``prefix`` and ``suffix`` special-token counts
    (with ``add_special_tokens``) and whether every type id it writes is 0."""

    prefix: int
    suffix: int
    zero_type_ids: bool


def _template_processing(pp: dict) -> TemplateShape | None:
    specials = pp.get("special_tokens") or {}
    prefix = suffix = 0
    seen_sequence = False
    zero = True
    for piece in pp.get("single") or []:
        if "Sequence" in piece:
            if seen_sequence or piece["Sequence"].get("id") != "A":
                return None
            seen_sequence = True
            zero = zero and piece["Sequence"].get("type_id", 0) == 0
        elif "SpecialToken" in piece:
            st = piece["SpecialToken"]
            ids = (specials.get(st.get("id")) or {}).get("ids")
            if ids is None:
                return None
            zero = zero and st.get("type_id", 0) == 0
            if seen_sequence:
                suffix += len(ids)
            else:
                prefix += len(ids)
        else:
            return None
    return TemplateShape(prefix, suffix, zero) if seen_sequence else None


def template_of(post_processor: dict | None) -> TemplateShape | None:
    """The single-sequence template of a serialized post-processor; None where unknown."""
    if post_processor is None:
        return TemplateShape(0, 0, True)
    kind = post_processor.get("type")
    if kind == "ByteLevel":  # rewrites offsets only
        return TemplateShape(0, 0, True)
    if kind == "TemplateProcessing":
        return _template_processing(post_processor)
    if kind == "Sequence":
        found = TemplateShape(0, 0, True)
        for step in post_processor.get("processors") or []:
            t = template_of(step)
            if t is None:
                return None
            if t.prefix or t.suffix or not t.zero_type_ids:
                if found.prefix or found.suffix or not found.zero_type_ids:
                    return None  # two templates in a row: not worth modelling
                found = t
        return found
    return None


class Snapshot:
    """A ``DeltaTokenizer`` for the live backend as it was when the snapshot was taken, and the
    :class:`~delta_ray.apps.dropin.tripwire.Tripwire` that says when the backend changed since."""

    def __init__(self, backend: Tokenizer, options: dict[str, Any]):
        self.tripwire = Tripwire(backend, options.get(CHECK_KEY))  # first: a change while serializing trips it
        if backend.truncation is not None or backend.padding is not None:
            # Per-call settings: transformers sets them on the backend for each call, and the drop-in
            # reads the call's own arguments instead; left in, admission would refuse the
            # configuration. Cleared on a copy (the live backend is the caller's).
            backend = Tokenizer.from_str(backend.to_str())
            backend.no_truncation()
            backend.no_padding()
        self.config_json = backend.to_str()  # no JSON round trip here: a vocabulary parses in seconds
        loaded = LoadedTokenizer.from_bytes(self.config_json.encode("utf-8"), source="<transformers backend>")
        self.tokenizer = DeltaTokenizer(loaded, **{k: v for k, v in options.items() if k not in _DROPIN_KEYS})
        self.template = template_of(loaded.config.get("post_processor"))
        core = self.tokenizer.core
        # Sessions need the cut predicate (an admitted configuration); they live in the core's store.
        self.sessions = DropinSessions(core.sessions, content=options.get(CONTENT_KEY, False)) \
            if options.get(SESSIONS_KEY, False) and core.predicate is not None else None
        self._private: Tokenizer | None = None
        self._private_lock = threading.Lock()

    def reference_encoding(self, text: str, add_special_tokens: bool, truncation: dict | None):
        """The reference's own ``Encoding`` of ``text`` under these settings (a private copy, so no
        other caller's per-call settings can leak in)."""
        with self._private_lock:
            if self._private is None:
                self._private = Tokenizer.from_str(self.config_json)
            ref = self._private
            if truncation is None:
                ref.no_truncation()
            else:
                ref.enable_truncation(**truncation)
            ref.encode_special_tokens = False
            return ref.encode(text, add_special_tokens=add_special_tokens)


def _encoding_from_state(state) -> Encoding:
    enc = Encoding()
    enc.__setstate__(state)
    return enc


class LazyEncoding:
    """A ``tokenizers.Encoding`` for IDs that came from delta-ray; its fields, ``ids`` among them,
    come from the reference on first use (transformers keeps encodings in ``BatchEncoding`` for
    ``tokens()``, ``char_to_token()``, ``word_ids()``..., and reads none of them on its own path).

    It keeps only the IDs' count, not the list: that list is the caller's ``input_ids``, which the
    caller may mutate (stock's ``Encoding.ids`` is a new list at each read, so a caller's edit never
    shows there), and a copy of it would cost every call what only a reader of ``ids`` needs."""

    __slots__ = ("_n", "_text", "_add_special_tokens", "_truncation", "_snapshot", "_real")
    n_sequences = 1  # one sequence (pairs never take this path); read by BatchEncoding on every call

    def __init__(self, ids: list[int], text: str, add_special_tokens: bool, truncation: dict | None,
                 snapshot: Snapshot):
        self._n = len(ids)
        self._text = text
        self._add_special_tokens = add_special_tokens
        self._truncation = truncation
        self._snapshot = snapshot
        self._real = None

    @property
    def ids(self) -> list[int]:
        return self.materialize().ids  # a new list at each read, the reference's (equal to input_ids)

    @property
    def attention_mask(self) -> list[int]:
        return [1] * self._n  # no padding on this path

    def __len__(self) -> int:
        return self._n

    def materialize(self):
        """The reference ``Encoding`` this stands for (computed once)."""
        if self._real is None:
            self._real = self._snapshot.reference_encoding(self._text, self._add_special_tokens, self._truncation)
        return self._real

    def __reduce_ex__(self, protocol):
        # Pickled or copied (a BatchEncoding sent to another process): as the reference's Encoding,
        # which carries no snapshot and is what stock would have sent.
        return _encoding_from_state, (self.materialize().__getstate__(),)

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.materialize(), name)

    def __repr__(self) -> str:
        return f"LazyEncoding(num_tokens={self._n})"
