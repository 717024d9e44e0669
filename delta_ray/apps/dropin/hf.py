"""transformers 5 drop-in: a wrapped tokenizer encodes through delta-ray, exactly as stock would.

In transformers 5, ``__call__``, ``encode``, ``tokenize`` and ``apply_chat_template(tokenize=True)``
all arrive in ``TokenizersBackend._encode_plus``, which sets truncation/padding on the backend and
calls ``self._tokenizer.encode_batch``. The drop-in hooks that one method on the class, and only a
tokenizer that carries a :class:`DropinState` takes the delta-ray path; every other tokenizer, and
every call the path does not cover, runs the original method unchanged. The backend object itself
is never replaced, so decoding, ``DecodeStream``, ``get_vocab``, deepcopy and pickle are stock.

Covered (IDs from ``TokenizerCore.encode_list`` for one text, straight into the Python list
transformers returns, or, for one text that is not a batch, from its conversation's session
(:mod:`~delta_ray.apps.dropin.sessions`, keyed by :func:`delta_ray.request_scope`); and
``encode_batch_ids`` for a list of texts; with the call's ``add_special_tokens``): one text or a
list of texts; no pair, no pre-tokenized input, no padding,
no ``split_special_tokens``, special-tokens mask or overflow; offsets (``return_offsets_mapping``)
for one text that is not a batch, from its session where the configuration's offsets splice at a
checkpoint (:mod:`delta_ray._core.offsets`); truncation with
``longest_first``/``only_first`` where the post-processor's template is known (the IDs are cut as
the reference cuts them: before the template, ``max_length`` minus the special tokens it adds);
type ids where the template writes only 0. Everything else falls back to the original method.
The fields of the returned encodings (their IDs, tokens, offsets, word ids) come from the reference
on first use (:class:`~delta_ray.apps.dropin.snapshot.LazyEncoding`), so ``encodings[0].ids`` is
never the ``input_ids`` list itself. A non-bool ``add_special_tokens`` (``0``, ``1``, ``None``,
``"false"``, ``numpy.bool_``) takes the original method, which raises or accepts it as stock does.

The snapshot the IDs come from is the live backend when the tokenizer was wrapped. transformers'
own mutators (``add_tokens``, ``add_special_tokens``, ``update_post_processor`` behind
``add_bos_token``/``add_eos_token``) and a replaced ``_tokenizer`` make the next call rebuild it.
Changes made to the backend object itself are caught by a tripwire
(:mod:`~delta_ray.apps.dropin.tripwire`): a token added to it, on the next call; anything else, on
the next call after code outside transformers read ``tok.backend_tokenizer`` (the hooked property
marks the state), and otherwise at the next full check, up to ``check_every`` calls later: the calls
in between still encode with the old snapshot. :func:`refresh` makes a change seen at once.
"""
from __future__ import annotations

import contextlib
import copy
import functools
import inspect
import logging
import sys
import threading
from typing import Any

from ..._core.id_lists import int_list
from .render import install, memo_render, uninstall
from .scope import current_scope
from .snapshot import RENDER_DEFAULT, RENDER_KEY, SESSIONS_KEY, LazyEncoding, Snapshot

log = logging.getLogger("delta_ray.apps.dropin")

STATE_ATTR = "_delta_ray_dropin"
_SUSPECT = 1 << 62  # DropinState._since_check past any interval: the next call checks the backend fully
_EXPECTED_PARAMS = (
    "self", "text", "text_pair", "add_special_tokens", "padding_strategy", "truncation_strategy",
    "max_length", "stride", "is_split_into_words", "pad_to_multiple_of", "padding_side", "return_tensors",
    "return_token_type_ids", "return_attention_mask", "return_overflowing_tokens",
    "return_special_tokens_mask", "return_offsets_mapping", "return_length", "verbose",
    "split_special_tokens", "kwargs",
)
_NO_SCOPE = (None, None)  # no request_scope: keyless, in the shared namespace
_no_memo = contextlib.nullcontext()  # fast_render off: the template renders as stock
_hook_lock = threading.Lock()
_originals: dict[str, Any] = {}  # method name -> the function TokenizersBackend had before the hooks


class DropinState:
    """What one wrapped tokenizer carries: its options and the snapshot of its live backend.

    Copies of the tokenizer (``copy.copy``, ``copy.deepcopy``, as vLLM's thread pool makes) share
    the snapshot, which is thread-safe, and so its session table; a pickled tokenizer carries only
    the options and rebuilds the snapshot (with an empty table) from its own backend on first use.
    """

    def __init__(self, options: dict[str, Any]):
        self.options = dict(options)
        self.snapshot: Snapshot | None = None
        self.backend = None  # the backend object the snapshot was taken from
        self.failed: str | None = None
        self._lock = threading.Lock()
        # calls since the tripwire's last full check (per object: copies check their own); _SUSPECT
        # after code outside transformers read tok.backend_tokenizer: the next call checks fully
        self._since_check = 0

    def current(self, tok, chars: int = 0) -> Snapshot | None:
        """The snapshot for ``tok``'s backend as it is now (rebuilt if the backend was replaced,
        marked changed, or its tripwire says it changed in place); None if it cannot be built (the
        tokenizer then stays stock). ``chars``: the call's text length (a long call is checked fully)."""
        backend = tok._tokenizer  # third-party seam: transformers' backend object, read without its property hook
        snap = self.snapshot
        if snap is not None and self.backend is backend:
            wire = snap.tripwire
            if wire.quick_holds(backend):  # every call
                self._since_check += 1
                if self._since_check < wire.every and chars < wire.long_chars:
                    return snap
                self._since_check = 0
                if wire.full_holds(backend):
                    return snap
            log.warning("delta-ray drop-in: the backend of %s changed in place; taking a new snapshot (calls "
                        "since the last check may have used the old one; call refresh(tok) after such a change)",
                        type(tok).__name__)
        if self.failed is not None:
            return None
        with self._lock:
            if self.snapshot is not None and self.snapshot is not snap and self.backend is backend:
                return self.snapshot  # another thread rebuilt it meanwhile
            try:
                self.snapshot = Snapshot(backend, self.options)
                self.backend = backend
                self._since_check = 0
            except BaseException as exc:  # noqa: BLE001 - stock transformers serves instead, exactly
                if not isinstance(exc, Exception) and type(exc).__name__ != "PanicException":
                    raise  # KeyboardInterrupt, SystemExit; pyo3's PanicException (a bad config) falls back
                self.snapshot = self.backend = None
                self.failed = f"{type(exc).__name__}: {exc}"
                log.warning("delta-ray drop-in disabled for %s: %s", type(tok).__name__, self.failed)
                return None
            return self.snapshot

    def suspect(self) -> None:
        """Code may be about to change the backend in place: check it fully on the next call."""
        self._since_check = _SUSPECT

    def invalidate(self) -> None:
        """The backend changed in place: rebuild the snapshot before the next encode."""
        with self._lock:
            self.snapshot = None
            self.backend = None
            self.failed = None

    def __deepcopy__(self, memo):
        new = DropinState(self.options)
        new.failed = self.failed
        if self.snapshot is not None and self.backend is not None:
            new.snapshot = self.snapshot  # shared: the copy's backend is an equal deep copy
            new.backend = copy.deepcopy(self.backend, memo)  # the very object the copy's _tokenizer is
        return new

    def __getstate__(self):
        return {"options": self.options}

    def __setstate__(self, state):
        self.__init__(state["options"])
        install_hooks()  # an unpickled wrapped tokenizer keeps encoding through delta-ray


def state_of(tok) -> DropinState | None:
    return tok.__dict__.get(STATE_ATTR)


# -- the fast path -----------------------------------------------------------------------------
def _truncated(ids: list[int], template, add_special_tokens: bool, trunc: dict | None) -> list[int] | None:
    """``ids`` (template included) as the reference truncates them, or None where not modelled."""
    if trunc is None:
        return ids
    if template is None:
        return None
    added = template.prefix + template.suffix if add_special_tokens else 0
    max_length = trunc["max_length"]
    if max_length < added:  # the reference's own arithmetic would underflow here: let it decide
        return None
    if len(ids) <= max_length:
        return ids
    target = max_length - added
    if target <= 0 or trunc["stride"] >= target or trunc["strategy"] not in ("longest_first", "only_first"):
        return None
    p = template.prefix if add_special_tokens else 0
    s = template.suffix if add_special_tokens else 0
    body = ids[p:len(ids) - s]
    body = body[:target] if trunc["direction"] == "right" else body[len(body) - target:]
    return ids[:p] + body + ids[len(ids) - s:]


def _snapshot_for(self, state: DropinState, texts: list[str], is_batched: bool) -> Snapshot | None:
    """The snapshot a call encodes with (the tripwire checked), or None: the tokenizer is stock."""
    # A long call triggers the tripwire's full check because it costs far more than the check; a
    # session turn's cost is its change, not its length, so its length does not count.
    session_turn = len(texts) == 1 and not is_batched and state.options.get(SESSIONS_KEY, False)
    return state.current(self, 0 if session_turn else sum(map(len, texts)))


def _delta_lists(snap: Snapshot, texts: list[str], is_batched: bool,
                 add_special_tokens: bool) -> list[list[int]] | None:
    """One fresh list of IDs per text (templates in, untruncated) from delta-ray; one text that is
    not a batch continues its conversation. None to fall back: a text the reference refuses (the
    original call raises its own error)."""
    core = snap.tokenizer.core
    try:
        if len(texts) == 1:  # a chat turn: the IDs straight into the list transformers returns
            ids = None
            sessions = snap.sessions
            if sessions is not None and not is_batched:  # one text: its conversation's state, if any
                scope = current_scope()
                ids = sessions.encode(texts[0], *(scope or _NO_SCOPE), add_special_tokens)
            return [ids if ids is not None else core.encode_list(texts[0], add_special_tokens=add_special_tokens)]
        return [int_list(a) for a in core.encode_batch_ids(texts, add_special_tokens=add_special_tokens)]
    except (TypeError, ValueError):
        return None


def _delta_offsets(snap: Snapshot, text: str, is_batched: bool,
                   add_special_tokens: bool) -> tuple[list[int], list[tuple[int, int]]] | None:
    """One text's IDs and character offsets (templates in, untruncated) from its conversation's
    session (:meth:`~delta_ray.apps.dropin.sessions.DropinSessions.encode_offsets`); None to fall
    back: a batch, sessions off, a keyless text not kept, a configuration whose offsets do not splice,
    a text the reference refuses."""
    sessions = snap.sessions
    if sessions is None or is_batched:
        return None
    try:
        return sessions.encode_offsets(text, *(current_scope() or _NO_SCOPE), add_special_tokens)
    except (TypeError, ValueError):
        return None


def _delta_encode_plus(self, state: DropinState, texts: list[str], is_batched: bool, add_special_tokens: bool,
                       trunc: dict | None, max_length, return_tensors, return_token_type_ids,
                       return_attention_mask, return_offsets_mapping: bool, return_length: bool, verbose: bool):
    """The BatchEncoding stock ``_encode_plus`` builds, with IDs (and offsets) from delta-ray; None to
    fall back."""
    from transformers.tokenization_utils_base import BatchEncoding

    if return_token_type_ids is None:
        return_token_type_ids = "token_type_ids" in self.model_input_names
    if return_attention_mask is None:
        return_attention_mask = "attention_mask" in self.model_input_names
    snap = _snapshot_for(self, state, texts, is_batched)
    if snap is None:
        return None
    template = snap.template
    if return_token_type_ids and (template is None or not template.zero_type_ids):
        return None
    offsets = None
    if return_offsets_mapping:  # one text (the hook's condition): its conversation's offsets, or stock's
        pair = _delta_offsets(snap, texts[0], is_batched, add_special_tokens)
        offsets = _truncated(pair[1], template, add_special_tokens, trunc) if pair is not None else None
        if pair is None or offsets is None:
            return None
        lists = [pair[0]]
    else:
        lists = _delta_lists(snap, texts, is_batched, add_special_tokens)
    if lists is None:
        return None
    all_ids = []
    for ids in lists:
        ids = _truncated(ids, template, add_special_tokens, trunc)
        if ids is None:
            return None
        all_ids.append(ids)
    data: dict[str, list] = {"input_ids": all_ids}
    if return_token_type_ids:
        data["token_type_ids"] = [[0] * len(ids) for ids in all_ids]
    if return_attention_mask:
        data["attention_mask"] = [[1] * len(ids) for ids in all_ids]
    if offsets is not None:  # stock's key order: the mask, then the offsets, then the length
        data["offset_mapping"] = [offsets]
    if return_length:
        data["length"] = [len(ids) for ids in all_ids]
    encodings = [LazyEncoding(ids, t, add_special_tokens, trunc, snap) for ids, t in zip(all_ids, texts)]
    for ids in all_ids:
        self._eventual_warn_about_too_long_sequence(ids, max_length, verbose)
    out = BatchEncoding(data, encodings, tensor_type=return_tensors)
    if not is_batched and return_tensors is None:
        out = BatchEncoding({k: (v[0] if v and isinstance(v[0], list) else v) for k, v in out.items()},
                            out.encodings)
    return out


def _stock_side_effects(self, padding_strategy, truncation_strategy, max_length, stride, pad_to_multiple_of,
                        padding_side) -> None:
    """What stock ``_encode_plus`` leaves on the backend (later direct backend calls see it)."""
    self.set_truncation_and_padding(padding_strategy=padding_strategy, truncation_strategy=truncation_strategy,
                                    max_length=max_length, stride=stride, pad_to_multiple_of=pad_to_multiple_of,
                                    padding_side=padding_side)
    if self._tokenizer.encode_special_tokens:  # third-party seam: transformers' backend object
        self._tokenizer.encode_special_tokens = False


def _make_encode_plus(original):
    from transformers.tokenization_utils_base import TruncationStrategy
    from transformers.utils import PaddingStrategy

    do_not_pad, do_not_truncate = PaddingStrategy.DO_NOT_PAD, TruncationStrategy.DO_NOT_TRUNCATE
    covered_truncation = (do_not_truncate, TruncationStrategy.LONGEST_FIRST, TruncationStrategy.ONLY_FIRST)

    def _encode_plus(self, text, text_pair=None, add_special_tokens=True, padding_strategy=do_not_pad,
                     truncation_strategy=do_not_truncate, max_length=None, stride=0, is_split_into_words=False,
                     pad_to_multiple_of=None, padding_side=None, return_tensors=None, return_token_type_ids=None,
                     return_attention_mask=None, return_overflowing_tokens=False, return_special_tokens_mask=False,
                     return_offsets_mapping=False, return_length=False, verbose=True, split_special_tokens=None,
                     **kwargs):
        state = self.__dict__.get(STATE_ATTR)
        # add_special_tokens exactly a bool: the backend refuses anything else (TypeError, even 0/1 and
        # None) and accepts numpy.bool_; the original call does either, as stock does
        if state is not None and type(add_special_tokens) is bool and text_pair is None \
                and not is_split_into_words \
                and padding_strategy == do_not_pad and truncation_strategy in covered_truncation \
                and not (return_overflowing_tokens or return_special_tokens_mask) \
                and (not return_offsets_mapping or isinstance(text, str)) \
                and not kwargs.get("sanitize_control_tokens") \
                and not (self.split_special_tokens if split_special_tokens is None else split_special_tokens):
            if isinstance(text, str):
                texts, is_batched = [text], False
            elif isinstance(text, (list, tuple)) and text and all(isinstance(t, str) for t in text):
                texts, is_batched = list(text), True
            else:
                texts = None
            if texts is not None:
                _stock_side_effects(self, padding_strategy, truncation_strategy, max_length, stride,
                                    pad_to_multiple_of, padding_side)
                trunc = None if truncation_strategy == do_not_truncate else {
                    "max_length": max_length, "stride": stride, "strategy": truncation_strategy.value,
                    "direction": self.truncation_side}
                if trunc is None or max_length is not None:
                    out = _delta_encode_plus(self, state, texts, is_batched, add_special_tokens, trunc, max_length,
                                             return_tensors, return_token_type_ids, return_attention_mask,
                                             return_offsets_mapping, return_length, verbose)
                    if out is not None:
                        return out
        return original(self, text, text_pair, add_special_tokens, padding_strategy, truncation_strategy,
                        max_length, stride, is_split_into_words, pad_to_multiple_of, padding_side, return_tensors,
                        return_token_type_ids, return_attention_mask, return_overflowing_tokens,
                        return_special_tokens_mask, return_offsets_mapping, return_length, verbose,
                        split_special_tokens, **kwargs)

    _encode_plus.__wrapped__ = original
    _encode_plus.__doc__ = original.__doc__
    return _encode_plus


# apply_chat_template's parameters that reach its tokenize step, at the values under which that step is
# ``self(text, add_special_tokens=False)["input_ids"]`` with every other option at its default
_PLAIN_TOKENIZE = (("sanitize_control_tokens", False), ("padding", False), ("truncation", False),
                   ("max_length", None), ("return_tensors", None), ("return_assistant_tokens_mask", False),
                   ("tokenizer_kwargs", None))
_plain_classes: dict[type, bool] = {}  # tokenizer class -> whether its __call__ is stock's over the hook


def _plain_class(cls: type) -> bool:
    """Whether ``cls`` tokenizes one text exactly as transformers' own ``__call__`` over the hooked
    ``_encode_plus`` (a subclass that overrides either, or switches input modes, is not)."""
    plain = _plain_classes.get(cls)
    if plain is None:
        from transformers.tokenization_utils_base import PreTrainedTokenizerBase
        plain = _plain_classes[cls] = (cls.__call__ is PreTrainedTokenizerBase.__call__
                                       and cls._encode_plus is _backend_class().__dict__["_encode_plus"]
                                       and getattr(cls, "_switch_to_input_mode", None) is None)
    return plain


@functools.lru_cache(maxsize=None)
def _plain_strategies() -> tuple:
    """(no padding, no truncation): what ``padding=False, truncation=False`` resolve to (imported on
    first use: transformers stays lazy)."""
    from transformers.tokenization_utils_base import TruncationStrategy
    from transformers.utils import PaddingStrategy
    return PaddingStrategy.DO_NOT_PAD, TruncationStrategy.DO_NOT_TRUNCATE


def _plain_chat(args: tuple, kwargs: dict) -> bool:
    """Whether an ``apply_chat_template`` call renders one chat and returns its IDs as a list
    (``tokenize=True, return_dict=False``, as vLLM and SGLang call it) with a plain tokenize step."""
    if kwargs.get("tokenize", True) is not True or kwargs.get("return_dict", True) is not False or len(args) > 1:
        return False
    for name, default in _PLAIN_TOKENIZE:
        if kwargs.get(name, default) is not default:
            return False
    chat = args[0] if args else kwargs.get("conversation")
    return isinstance(chat, list) and bool(chat) and type(chat[0]) is dict  # one chat, not a batch


def _chat_ids(self, state: DropinState, text: str) -> list[int] | None:
    """What stock's tokenize step of a plain chat call returns for the rendered ``text``
    (``self(text, add_special_tokens=False)["input_ids"]``, with the same side effects on the
    backend and the same length warning), without building the BatchEncoding only to read one key
    of it; None where the hooked ``_encode_plus`` would fall back."""
    if self.split_special_tokens:
        return None
    _stock_side_effects(self, *_plain_strategies(), None, 0, None, None)
    snap = _snapshot_for(self, state, [text], False)
    lists = None if snap is None else _delta_lists(snap, [text], False, False)
    if lists is None:
        return None
    self._eventual_warn_about_too_long_sequence(lists[0], None, True)
    return lists[0]


def _make_apply_chat_template(original):
    """Wrap ``apply_chat_template``: a wrapped tokenizer's template renders through the memoized
    sandbox (:mod:`delta_ray.apps.dropin.render`; same text, same refusals), and a plain chat call
    (:func:`_plain_chat`) takes its IDs from the rendered text directly (:func:`_chat_ids`)."""
    def apply_chat_template(self, *args, **kwargs):
        state = self.__dict__.get(STATE_ATTR)
        if state is None:
            return original(self, *args, **kwargs)
        with memo_render() if state.options.get(RENDER_KEY, RENDER_DEFAULT) else _no_memo:
            if not (_plain_chat(args, kwargs) and _plain_class(type(self))):
                return original(self, *args, **kwargs)
            text = original(self, *args, **{**kwargs, "tokenize": False})
            ids = _chat_ids(self, state, text)
            if ids is None:  # stock's own tokenize step, as stock calls it
                ids = self(text, padding=False, truncation=False, max_length=None, add_special_tokens=False,
                           return_tensors=None, sanitize_control_tokens=False)["input_ids"]
            return ids

    apply_chat_template.__wrapped__ = original
    apply_chat_template.__name__ = original.__name__
    apply_chat_template.__doc__ = original.__doc__
    return apply_chat_template


def _make_invalidating(original):
    """Wrap a backend mutator: the snapshot of a wrapped tokenizer is rebuilt after it runs."""
    def mutator(self, *args, **kwargs):
        try:
            return original(self, *args, **kwargs)
        finally:
            state = self.__dict__.get(STATE_ATTR)
            if state is not None:
                state.invalidate()

    mutator.__wrapped__ = original
    mutator.__name__ = original.__name__
    mutator.__doc__ = original.__doc__
    return mutator


def _make_backend_property(original: property) -> property:
    """Wrap the ``backend_tokenizer`` property: when code outside transformers reads it from a
    wrapped tokenizer (the way documented for changing the backend in place), the next call checks
    the backend fully. transformers' own reads (decoding) mark nothing."""
    getter = original.fget

    def backend_tokenizer(self):
        state = self.__dict__.get(STATE_ATTR)
        # third-party seam: CPython's frame of the caller (transformers' own reads do not count)
        if state is not None and not sys._getframe(1).f_globals.get("__name__", "").startswith("transformers."):
            state.suspect()
        return getter(self)

    backend_tokenizer.__wrapped__ = getter
    backend_tokenizer.__doc__ = getter.__doc__
    return property(backend_tokenizer, original.fset, original.fdel, original.__doc__)


# -- installing the hooks ----------------------------------------------------------------------
def _backend_class():
    from transformers.tokenization_utils_tokenizers import TokenizersBackend
    return TokenizersBackend


def install_hooks() -> bool:
    """Hook ``TokenizersBackend`` (idempotent). Inert for tokenizers without a :class:`DropinState`.
    Returns False, and hooks nothing, under a transformers whose ``_encode_plus`` differs from the
    one this module was written against (wrapped tokenizers then simply stay stock)."""
    with _hook_lock:
        if _originals:
            return True
        cls = _backend_class()
        params = tuple(inspect.signature(cls._encode_plus).parameters)
        if params != _EXPECTED_PARAMS:
            log.warning("delta-ray drop-in: this transformers' TokenizersBackend._encode_plus takes %s; "
                        "not hooked, tokenizers stay stock", params)
            return False
        for name in ("_encode_plus", "_add_tokens", "update_post_processor", "backend_tokenizer"):
            _originals[name] = cls.__dict__[name]
        cls._encode_plus = _make_encode_plus(_originals["_encode_plus"])
        cls._add_tokens = _make_invalidating(_originals["_add_tokens"])
        cls.update_post_processor = _make_invalidating(_originals["update_post_processor"])
        cls.backend_tokenizer = _make_backend_property(_originals["backend_tokenizer"])
        _plain_classes.clear()  # judged against the hook installed now
        install()  # the memoized render: where it cannot hook, templates render as stock
        # inherited from PreTrainedTokenizerBase: removing ours restores it (None: delete)
        _originals["apply_chat_template"] = cls.__dict__.get("apply_chat_template")
        cls.apply_chat_template = _make_apply_chat_template(cls.apply_chat_template)
        return True


def remove_hooks() -> None:
    """Restore ``TokenizersBackend``'s own methods (wrapped tokenizers then encode as stock)."""
    with _hook_lock:
        if not _originals:
            return
        cls = _backend_class()
        for name, fn in _originals.items():
            if fn is None:
                delattr(cls, name)
            else:
                setattr(cls, name, fn)
        _originals.clear()
        uninstall()


def hooks_installed() -> bool:
    return bool(_originals)
