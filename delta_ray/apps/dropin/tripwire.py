"""Noticing that a transformers backend was changed in place, so that a drop-in snapshot of it is stale.

The drop-in encodes from a snapshot of the live backend (:mod:`~delta_ray.apps.dropin.snapshot`).
Code can change that backend object afterwards (``tok.backend_tokenizer.add_tokens([...])``,
``tok.backend_tokenizer.normalizer = ...``, ``tok.backend_tokenizer.pre_tokenizer[1].add_prefix_space
= True``, ``tok.backend_tokenizer.model = ...``). The Rust object has no hook for that, and its
getters return a new Python wrapper on each access, so no identity says that a component was
replaced. Two checks stand in:

* the quick one, on every call (about 0.1 microsecond): the token at the ID the next added token
  would get, which adding a token not in the vocabulary fills (``get_vocab_size(with_added_tokens=
  True)`` would say the same, but it counts the added tokens on each call: 20 microseconds with 800);
* the full one (:func:`fingerprint`): the serialized normalizer, pre-tokenizer and post-processor;
  the model's kind, settings, vocabulary size, a few of its entries and its tokenization of a probe
  word; the added tokens with their flags (its cost grows with them: about 10 microseconds with 26
  added tokens, 400 with 800). It runs every :attr:`Tripwire.every` calls, on calls of at
  least :attr:`Tripwire.long_chars` characters, and on the first call after code outside
  transformers read ``tok.backend_tokenizer`` (:mod:`~delta_ray.apps.dropin.hf`).

Not compared: the decoder (no part of an encode), truncation, padding and ``encode_special_tokens``
(transformers sets them for each call; the drop-in reads the call's arguments). Not seen at all: a
model replaced by one of the same kind, settings and size whose sampled entries and probe
tokenization agree with the old one's (merges that differ elsewhere); ``refresh()`` covers that.
And where stock itself is not one tokenizer: a BPE model's setting changed in place
(``model.end_of_word_suffix = ...``) leaves the words its cache holds tokenized the old way, so
stock answers by its history; a new snapshot tokenizes every word the new way.
"""
from __future__ import annotations

import types
from typing import Any

from tokenizers import Tokenizer

__all__ = ["DEFAULT_EVERY", "MAX_EVERY", "Tripwire", "fingerprint"]

DEFAULT_EVERY = 64  # the full check's interval in calls, plus two per added token (Tripwire)
MAX_EVERY = 4096
LONG_CHARS_PER_CALL = 1024  # a call of every * this many characters gets the full check itself
_COMPONENTS = ("normalizer", "pre_tokenizer", "post_processor")
_PROBE = "internationalizationHellothe1234tokenization"  # one word: every model kind takes it
_SAMPLES = 8
_settings: dict[type, tuple[str, ...]] = {}  # model class -> its settable attributes (dropout, unk_token...)


def _model_settings(model) -> tuple:
    cls = type(model)
    names = _settings.get(cls)
    if names is None:
        names = _settings[cls] = tuple(n for n in dir(cls) if not n.startswith("_")
                                       and isinstance(getattr(cls, n, None), types.GetSetDescriptorType))
    return tuple(getattr(model, n) for n in names)


def fingerprint(backend: Tokenizer) -> tuple:
    """What an encode depends on in ``backend``, cheaply: equal tuples for an unchanged backend.

    Raises what a component's serialization raises (a custom Python component cannot be
    serialized, and neither can the snapshot then)."""
    parts: list[Any] = []
    for name in _COMPONENTS:
        component = getattr(backend, name)
        parts.append(None if component is None else component.__getstate__())
    model = backend.model
    size = backend.get_vocab_size(with_added_tokens=False)
    settings = _model_settings(model)
    parts += [type(model), settings, size,
              tuple(model.id_to_token(i * size // _SAMPLES) for i in range(_SAMPLES))]
    # BPE dropout makes the probe's tokenization random: there it would trip on every check
    probe = None if getattr(model, "dropout", None) else tuple(t.id for t in model.tokenize(_PROBE))
    parts += [probe, backend.get_added_tokens_decoder()]  # AddedToken compares content and flags
    return tuple(parts)


def _next_id(backend: Tokenizer) -> int:
    """The ID ``add_tokens`` gives the next token not in the vocabulary: one past the highest added
    ID, or the model's size."""
    added = backend.get_added_tokens_decoder()
    return max([backend.get_vocab_size(with_added_tokens=False), *(i + 1 for i in added)])


class Tripwire:
    """The quick and the full fingerprint of one backend, taken before its snapshot is serialized
    (a change in between then trips the next check: a rebuild, never a stale snapshot).

    ``every``: the full check's interval in calls; None: :data:`DEFAULT_EVERY` plus two calls per
    added token (the check costs about 0.45 microseconds more per added token, so that on average it
    adds about 0.2 microseconds to a call), at most :data:`MAX_EVERY`.
    """

    __slots__ = ("next_id", "next_token", "full", "every", "long_chars")

    def __init__(self, backend: Tokenizer, every: int | None = None):
        self.next_id = _next_id(backend)
        self.next_token = backend.id_to_token(self.next_id)  # None, unless the model has IDs past its size
        self.full = fingerprint(backend)
        if every is None:
            every = min(MAX_EVERY, DEFAULT_EVERY + 2 * len(self.full[-1]))
        self.every = every
        self.long_chars = every * LONG_CHARS_PER_CALL

    def quick_holds(self, backend: Tokenizer) -> bool:
        """No token outside the vocabulary was added to ``backend`` since (checked on every call)."""
        return backend.id_to_token(self.next_id) == self.next_token

    def full_holds(self, backend: Tokenizer) -> bool:
        """Everything :func:`fingerprint` reads is as it was; False also where it cannot be read."""
        try:
            return fingerprint(backend) == self.full
        except Exception:  # noqa: BLE001 - e.g. a custom component now: the rebuild decides
            return False
