"""``patch_transformers`` / ``unpatch_transformers`` (fastokens' convention) and ``wrap_tokenizer``.

``patch_transformers()`` wraps ``TokenizersBackend.from_pretrained`` as fastokens does under
transformers 5, so every tokenizer ``AutoTokenizer`` (or any model class) loads afterwards carries
a :class:`~delta_ray.apps.dropin.hf.DropinState`, and installs the class hooks of
:mod:`delta_ray.apps.dropin.hf`. ``wrap_tokenizer(tok)`` does the same for one object already loaded.

Options are ``DeltaTokenizer``'s (``engine``, ``threads``, ``cut_threshold``...; ``threads``
defaults to 1 here, see ``_options``), plus

``sessions`` (on by default): a one-text encode (``encode``, ``__call__`` with one text,
``apply_chat_template(tokenize=True)`` of one chat) re-encodes only what changed since its
conversation's last call and builds its list from the one it kept
(:mod:`delta_ray.apps.dropin.sessions`). The conversation is the session key bound by
:func:`delta_ray.request_scope` inside its tenant or, without a key, found by content inside the
tenant (no tenant: the shared namespace of requests without one, as they share an engine's prefix
cache). Nothing is shared across tenants. ``sessions=False``: every call is stateless.

``content_reuse``: whether a request without a session key is looked up by content (``None``, the
default: as ``sessions``; ``False``: keyed sessions only, every keyless call stateless, which is
what the drop-in did before it had sessions; ``True`` needs ``sessions``).

``max_session_bytes`` / ``max_sessions``: the bounds of the session table (kept lists at about 36
bytes a token, the core's states, the keys), LRU; default :data:`SESSION_BYTES` and 4096.

``fast_render``: a wrapped tokenizer's ``apply_chat_template`` renders through transformers' own
jinja sandbox with the sandbox's per-(type, attribute) decisions memoized (same text, same
refusals; :mod:`delta_ray.apps.dropin.render`). On by default; ``False``: transformers' render.

``native_threads``: the fast engine (fastokens) spreads one text over its own native threads, as
fastokens' own patch does, instead of the one thread delta-ray pins it to at import. ``None`` (the
default): on, unless the process is a Ray worker; ``True``: on, also in a Ray worker; ``False``: the
pin stays. Decided for the whole process, by the first call that passes options (fastokens sizes
its pool once, on first use): it can no longer be turned on once delta-ray has loaded a fastokens
tokenizer in this process, and a ``FASTOKENS_BPE_THREADS`` set by the user always stands.

``check_every``: how often, in calls, a wrapped tokenizer checks its backend fully for changes made
to it in place (:mod:`delta_ray.apps.dropin.tripwire`). ``None`` (the default): every 64 calls plus
two per added token (the check's cost grows with them), so that it adds about 0.2 microseconds to a
call on average; ``1``: every call (a change is seen at once, for 10-400 microseconds a call).
"""
from __future__ import annotations

import threading
from typing import Any

from ..._core.config import tokenizer_config
from ..._engine.native import allow_native_threads
from .hf import STATE_ATTR, DropinState, hooks_installed, install_hooks, remove_hooks, state_of
from .snapshot import CHECK_KEY, CONTENT_KEY, NATIVE_KEY, RENDER_DEFAULT, RENDER_KEY, SESSIONS_KEY

__all__ = ["patch_transformers", "unpatch_transformers", "wrap_tokenizer", "unwrap_tokenizer", "refresh",
           "is_wrapped", "loading_wrapped"]

# A server's default: about 90 conversations of 1M characters or 900 of 100K (qwen-3, English and
# code: an entry counts 45-50 bytes an ID, docs/dropin.md §17).
SESSION_BYTES = 1 << 30
_lock = threading.Lock()
_patch: dict[str, Any] = {}  # while patched: {"options": ..., "had_own": bool, "own": original attr}
_scoped = threading.local()  # loading_wrapped(): wrap loads on this thread only


def _native(native_threads: bool | None) -> bool:
    """Whether the fast engine may spread one text over its own native threads in this process
    (decided once per process: see :func:`delta_ray._engine.native.allow_native_threads`)."""
    if native_threads is not None and not isinstance(native_threads, bool):
        raise TypeError(f"native_threads must be a bool or None, not {type(native_threads).__name__}")
    if native_threads is False:
        return False
    # None: yes, unless this is a Ray worker (a task or actor holds the CPUs Ray gave it); True: yes
    return allow_native_threads(in_worker=native_threads is True)


def _options(sessions: bool, content_reuse: bool | None, options: dict[str, Any]) -> dict[str, Any]:
    if "reuse" in options:
        raise TypeError("the drop-in's reuse is set by sessions= and content_reuse=, not reuse=")
    if not isinstance(sessions, bool):
        raise TypeError(f"sessions must be a bool, not {type(sessions).__name__}")
    if content_reuse is not None and not isinstance(content_reuse, bool):
        raise TypeError(f"content_reuse must be a bool or None, not {type(content_reuse).__name__}")
    if content_reuse and not sessions:
        raise ValueError("content_reuse=True needs sessions=True (a keyless text continues a conversation)")
    options = dict(options)
    native = options.pop(NATIVE_KEY, None)
    fast_render = options.pop(RENDER_KEY, RENDER_DEFAULT)
    if not isinstance(fast_render, bool):
        raise TypeError(f"fast_render must be a bool, not {type(fast_render).__name__}")
    check_every = options.pop(CHECK_KEY, None)
    if check_every is not None and (not isinstance(check_every, int) or isinstance(check_every, bool)):
        raise TypeError(f"check_every must be an int or None, not {type(check_every).__name__}")
    if check_every is not None and check_every < 1:
        raise ValueError(f"check_every must be at least 1, got {check_every}")
    # One thread per call unless asked: transformers wants Python lists, and building them holds the
    # GIL, so helper threads mostly wait for each other (bench/bench_dropin.py compares).
    out = {"threads": 1, "max_session_bytes": SESSION_BYTES, **options, "reuse": "session" if sessions else "none"}
    # validate now (ValueError/TypeError), not at the first encode; `encoder` replaces the engine (tests)
    tokenizer_config(None, {k: v for k, v in out.items() if k != "encoder"})
    # Last, once the options are known to be valid: it may lift the process's one-thread pin.
    out[NATIVE_KEY] = _native(native)
    out[RENDER_KEY] = fast_render
    out[CHECK_KEY] = check_every
    out[SESSIONS_KEY] = sessions
    out[CONTENT_KEY] = sessions if content_reuse is None else content_reuse
    return out


def _attach(tok, options: dict[str, Any], eager: bool = True):
    from transformers.tokenization_utils_tokenizers import TokenizersBackend
    if not isinstance(tok, TokenizersBackend):
        return tok  # a Python ("slow") or mistral-common tokenizer: not covered, left stock
    if not install_hooks():
        return tok
    state = DropinState(options)
    tok.__dict__[STATE_ATTR] = state
    if eager:
        snap = state.current(tok)  # serialize the live backend and admit now, not in the first request
        if snap is not None:
            snap.tokenizer.core.prepare_lists()  # the engine's list entry point, checked in the background from now
    return tok


def wrap_tokenizer(tok, *, sessions: bool = True, content_reuse: bool | None = None, **options):
    """Make one transformers tokenizer encode through delta-ray (exactly as stock); returns it.

    Anything but a ``TokenizersBackend`` (transformers' Rust-backed tokenizer) is returned as it is.
    """
    return _attach(tok, _options(sessions, content_reuse, options))


def unwrap_tokenizer(tok):
    """Undo :func:`wrap_tokenizer` on one object; returns it."""
    tok.__dict__.pop(STATE_ATTR, None)
    return tok


def is_wrapped(tok) -> bool:
    """Whether ``tok`` encodes through delta-ray (wrapped and the hooks installed)."""
    state = state_of(tok)
    return state is not None and hooks_installed() and state.failed is None


def refresh(tok) -> None:
    """Re-snapshot ``tok``'s backend now, after code changed it in place (``tok._tokenizer.x = ...``):
    the tripwire would see most such changes by itself, but only at its next full check.
    transformers' own mutators (``add_tokens``, ``add_bos_token``...) need no call."""
    state = state_of(tok)
    if state is not None:
        state.invalidate()
        state.current(tok)


def _wrapping_from_pretrained(original):
    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        tok = original.__func__(cls, *args, **kwargs)
        options = _patch.get("options")
        scoped = getattr(_scoped, "options", None)
        if scoped is not None:
            options = scoped
        if options is not None:
            _attach(tok, options)
        return tok
    return from_pretrained


def _install_from_pretrained() -> None:
    from transformers.tokenization_utils_tokenizers import TokenizersBackend
    if "installed" in _patch:
        return
    _patch["had_own"] = "from_pretrained" in TokenizersBackend.__dict__
    _patch["own"] = TokenizersBackend.__dict__.get("from_pretrained")
    TokenizersBackend.from_pretrained = _wrapping_from_pretrained(TokenizersBackend.from_pretrained)
    _patch["installed"] = True


def patch_transformers(*, sessions: bool = True, content_reuse: bool | None = None, **options) -> None:
    """Every transformers tokenizer loaded from now on encodes through delta-ray, with exactly stock
    transformers' outputs. Call before ``AutoTokenizer.from_pretrained``; idempotent (a second call
    replaces the options for later loads)."""
    opts = _options(sessions, content_reuse, options)
    with _lock:
        if not install_hooks():
            return
        _install_from_pretrained()
        _patch["options"] = opts


def unpatch_transformers() -> None:
    """Restore transformers: loads are stock again, and so are tokenizers wrapped earlier (the class
    hooks go; the objects keep their state, unused until the next patch or wrap)."""
    from transformers.tokenization_utils_tokenizers import TokenizersBackend
    with _lock:
        if "installed" in _patch:
            # The inherited classmethod comes back by deleting ours (assigning the bound method
            # captured at patch time back would pin `cls` for subclasses; fastokens notes the same).
            if _patch["had_own"]:
                TokenizersBackend.from_pretrained = _patch["own"]
            else:
                del TokenizersBackend.from_pretrained
        _patch.clear()
        remove_hooks()


class loading_wrapped:
    """``with loading_wrapped(**options): AutoTokenizer.from_pretrained(...)``: wrap the tokenizers
    this thread loads inside the block, without patching loads elsewhere (vLLM's tokenizer mode uses
    it, so the object its cached-tokenizer ``__reduce__`` pickles already carries the state)."""

    def __init__(self, *, sessions: bool = True, content_reuse: bool | None = None, **options):
        self.options = _options(sessions, content_reuse, options)

    def __enter__(self):
        with _lock:
            if install_hooks():
                _install_from_pretrained()
        self._saved = getattr(_scoped, "options", None)
        _scoped.options = self.options
        return self

    def __exit__(self, *exc):
        _scoped.options = self._saved
        return False
