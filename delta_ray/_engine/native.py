"""The fast encoder tier: a native BPE engine behind the :class:`~delta_ray._core.encoder.Encoder` seam.

Two third-party engines read a HF ``tokenizer.json`` and encode 10-200x faster than the reference
``tokenizers`` pipeline on one thread:

``fastokens`` (default)
    Loaded with ``Tokenizer.from_json_str`` (its ``from_file`` also merges a sibling
    ``tokenizer_config.json``, which the reference does not). Encoded with
    ``encode_batch_flat(texts, add_special_tokens=False)``: one call for the whole list, the IDs come
    back as one little-endian uint32 buffer plus uint64 offsets, so no per-token Python object is
    built. It releases the GIL while it encodes. Its intra-request parallelism is a rayon pool sized
    by ``FASTOKENS_BPE_THREADS``, read once per process when the pool is first built: this module
    sets ``FASTOKENS_BPE_THREADS=1`` at import time when it is unset (see
    :func:`fast_engine_threads`); the transformers drop-in lifts that pin in its own process
    (:func:`allow_native_threads`). Its opt-in caches stay off: the segment cache is switched off per
    tokenizer with ``enable_segment_cache(0)``; the prefix cache (``FASTOKENS_INPUT_CACHE``) is off
    unless that variable is set, which this module does not do.

``gigatoken``
    Loaded with ``gigatoken.load_hf_json(bytes)`` (the Rust backend, no Hub lookups). Encoded one
    text at a time with ``backend.encode(text)`` which returns a uint32 numpy array and runs on the
    calling thread (its ``encode_batch*`` methods default to a process-global rayon pool and are
    never used here). It holds the GIL for the whole encode.

Neither engine adds post-processor tokens on these calls, so both are compared with the reference's
``add_special_tokens=False``; special-token strings inside the text are still matched as added
tokens, as the reference does.

Why fastokens is the default (``bench/bench_engines.py`` and the guard probe compare them):

* exactness: the guard probe (every code point in 11 contexts, plus composition pairs) finds **no**
  code point on which fastokens disagrees with the reference, on all six bundled tokenizers;
  gigatoken disagrees on thousands per tokenizer (characters assigned in Unicode 15-17, whose
  classes its tables do not share with the reference's Oniguruma 16 / NFC 9.0), so with gigatoken
  every text holding one of them falls back to the reference;
* speed (CPU time, one thread): both are far faster than the reference; fastokens is ahead on
  English, code and short multilingual texts, gigatoken on long multilingual texts;
* concurrency: fastokens drops the GIL while it encodes (gigatoken holds it), so an event loop or a
  second encoder thread keeps running.

Caveats: ``FASTOKENS_BPE_THREADS`` is process-wide and read once, when fastokens first builds its
pool; set it in the environment of the worker processes (e.g. Ray ``runtime_env={"env_vars":
{"FASTOKENS_BPE_THREADS": "1"}}``) if fastokens may run before this module is imported. Never set
``FASTOKENS_INPUT_CACHE`` for exactness-critical work (an older fastokens had a stale-match bug in
a similar cache). Loading an engine takes seconds: use :func:`cached_fast_encoder` to load once per
process.

An engine is only as exact as its checks: :mod:`delta_ray._verify.guard_probe` derives, per tokenizer and per
installed versions, the code points on which the engine may disagree with the reference, and runs a
verification battery before the engine is admitted. Use :func:`delta_ray._verify.admit.admit_fast`
or ``GuardSet.allows`` before trusting a :class:`FastEncoder` with a text.
"""
from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.metadata
import json
import os
import sys
import threading
import unicodedata
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence, Union, cast

import numpy as np

from .._core.assembly import flat_from_pieces
from .._core.charclass import candidate_source
from .._core.encoder import Encoder, PiecesEncoder
from .._core.errors import DeltaRayError
from .._core.reference_api import FULL_API
from .._core.reference_version import reference_version
from .._runtime import exit_guard
from .._runtime.exit_guard import checkpoint

_LITTLE = sys.byteorder == "little"
_I32, _I64 = np.dtype(np.int32), np.dtype(np.int64)

FAST_BACKENDS = ("fastokens", "gigatoken")
DEFAULT_BACKEND = "fastokens"  # no guarded code point on the six tokenizers, GIL-free, fastest on 1 thread

# Pin fastokens' own worker pool to the calling thread before anything can build it. The pool is
# built once per process from this variable, so a value set after the first large encode is ignored.
# A pool worker or chunk task must not spread one encode over every core of its node: Ray gave it one
# CPU. Only a process that asks (:func:`allow_native_threads`, the transformers drop-in) lifts it.
_PINNED_HERE = "FASTOKENS_BPE_THREADS" not in os.environ  # the pin is ours, not the user's setting
if _PINNED_HERE:
    os.environ["FASTOKENS_BPE_THREADS"] = "1"
_fastokens_loaded = False  # set when delta-ray first builds a fastokens tokenizer (its pool may exist after)
_native_lifted = False  # allow_native_threads() removed our pin before fastokens could read it

TokenizerSource = Union[str, os.PathLike[str], bytes, bytearray, memoryview]


class FastEngineUnavailable(DeltaRayError, RuntimeError):
    """The fast engine cannot be used: package missing, or it refused the tokenizer.json."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def package_version(dist: str) -> str | None:
    """The installed version of a distribution, or None."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def fast_engine_versions() -> dict[str, str | None]:
    """Installed versions of the reference and of each fast engine (None when not installed).

    Part of every cache key that records what a fast engine did (guard sets, verdicts)."""
    return {"tokenizers": package_version("tokenizers"),
            **{name: package_version(name) for name in FAST_BACKENDS}}


def engine_key(tokenizer_json_bytes: bytes, backend: str | None, backend_version: str | None) -> dict[str, Any]:
    """What anything cached about an engine on a tokenizer depends on (guard sets, verdicts): the
    tokenizer's SHA-256, the reference's version (and, under tokenizers 1.x, what its class tables
    were derived with), the engine's name and version, and Python's Unicode tables.

    Computable from package metadata alone: loading an engine costs seconds, a cache lookup should not.
    """
    key = {"tokenizer_sha256": hashlib.sha256(tokenizer_json_bytes).hexdigest(),
           "tokenizers": reference_version(),
           "backend": backend, "backend_version": backend_version,
           "python_unicodedata": unicodedata.unidata_version}
    if not FULL_API:  # 1.x: the fold set and class checks start from the regex package's tables
        key["reference_tables"] = candidate_source()
    return key


def in_ray_worker() -> bool:
    """Whether this process is a Ray worker (a task or actor process), without importing ray.

    The raylet starts every worker with ``RAY_RAYLET_PID`` set (a Ray-internal flag stripped from
    user job environments); a worker also runs ray's ``WORKER_MODE``."""
    if "RAY_RAYLET_PID" in os.environ:
        return True
    ray = sys.modules.get("ray")
    try:
        # third-party seam: Ray's worker mode (1 is its WORKER_MODE); no public API says it
        return ray is not None and ray._private.worker.global_worker.mode == 1
    except Exception:  # noqa: BLE001 - a ray without this attribute: not known to be a worker
        return False


def allow_native_threads(*, in_worker: bool = False) -> bool:
    """Let fastokens spread one encode over its own native threads in this process; returns whether
    it will (its pool is sized once per process, when first used, so this decides for the process).

    * ``FASTOKENS_BPE_THREADS`` set by the user (before delta-ray was imported, or a Ray
      ``runtime_env`` as the pool's workers get): their setting stands; True when it is above 1.
    * Otherwise the one-thread pin this module set at import is removed (fastokens' own default, every
      core up to its cap, applies), unless delta-ray already loaded a fastokens tokenizer in this
      process (the pool may exist: too late, False) or the process is a Ray worker and ``in_worker``
      is False (a task or actor holds the CPUs Ray gave it, not the node's).

    Exactness does not depend on it (docs/dropin.md §14): the guard, confinement and shadow check
    judge each text's answer, whichever threads computed it. Other delta-ray tokenizers of the
    process get the native threads too (each long piece then uses fastokens' pool besides its own
    Python thread; the pool is shared first-come first-served, so this oversubscribes by at most the
    pool's size).
    """
    global _native_lifted
    if not _PINNED_HERE:  # the user's setting (or none left by them since): fastokens reads it as it is
        value = os.environ.get("FASTOKENS_BPE_THREADS")
        if value is None:
            return (os.cpu_count() or 1) > 1
        return value.strip().isdigit() and int(value) > 1
    if _native_lifted:
        return True
    if _fastokens_loaded or (in_ray_worker() and not in_worker):
        return False
    os.environ.pop("FASTOKENS_BPE_THREADS", None)
    _native_lifted = True
    return (os.cpu_count() or 1) > 1


def fast_engine_threads() -> dict[str, str]:
    """The threading settings the engines run under (for logs and benchmark headers)."""
    return {"FASTOKENS_BPE_THREADS": os.environ.get("FASTOKENS_BPE_THREADS", "<unset>"),
            "native_threads": "allowed by the drop-in" if _native_lifted else "pinned" if _PINNED_HERE else "user's",
            "FASTOKENS_INPUT_CACHE": os.environ.get("FASTOKENS_INPUT_CACHE", "<unset>"),
            "gigatoken": "encode() on the calling thread (no rayon pool)"}


def available_backends() -> list[str]:
    """The fast engines whose package is importable, default first."""
    out = []
    for name in FAST_BACKENDS:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - a broken install is as unavailable as a missing one
            continue
        out.append(name)
    return out


def _read_source(src: TokenizerSource) -> bytes:
    if isinstance(src, (bytes, bytearray, memoryview)):
        return bytes(src)
    if isinstance(src, (str, os.PathLike)):
        try:
            return Path(src).read_bytes()
        except OSError as exc:
            raise FastEngineUnavailable(f"cannot read tokenizer.json at {src!r}: {exc}") from exc
    raise TypeError(f"expected a tokenizer.json path or its bytes, got {type(src).__name__}")


def _added_contents(data: bytes) -> list[str]:
    """The added tokens' strings of a tokenizer.json, read without parsing the vocabulary (which
    takes seconds); [] where the list is not found or malformed."""
    at = data.find(b'"added_tokens"')
    start = data.find(b"[", at) if at >= 0 else -1
    if start < 0:
        return []
    try:
        # the text before the list is ASCII JSON here: decode from the list on
        tokens, _ = json.JSONDecoder().raw_decode(data[start:].decode("utf-8", "replace"))
        return [t["content"] for t in tokens if isinstance(t, dict) and isinstance(t.get("content"), str)]
    except (ValueError, TypeError):
        return []


class _FastokensBackend:
    name = "fastokens"

    def __init__(self, data: bytes):
        try:
            import fastokens
        except Exception as exc:  # noqa: BLE001
            raise FastEngineUnavailable(f"fastokens is not importable ({exc}); pip install 'fastokens>=0.3.5'") from exc
        global _fastokens_loaded
        _fastokens_loaded = True  # from here fastokens may size its pool: too late to lift the pin
        try:
            tok = fastokens.Tokenizer.from_json_str(data.decode("utf-8"))
        except Exception as exc:  # noqa: BLE001 - ValueError for configs it does not support
            raise FastEngineUnavailable(f"fastokens refused the tokenizer.json: {exc}") from exc
        if hasattr(tok, "enable_segment_cache"):
            tok.enable_segment_cache(0)  # caches off: the engine's answer may depend on nothing but the text
        self._tok = tok
        # The engine's own flat call for a caller that reads its buffers itself (a session turn):
        # little-endian u32 IDs (below 2**31, so int32) and u64 offsets, on little-endian hosts.
        self.raw_flat = functools.partial(tok.encode_batch_flat, add_special_tokens=False) if _LITTLE else None

    def encode_pieces(self, texts: list[str]) -> list[np.ndarray]:
        buf, offs = self._tok.encode_batch_flat(texts, add_special_tokens=False)
        ids = np.frombuffer(buf, dtype="<u4").astype(np.int32)  # one copy: writable, native order
        if len(texts) == 1:
            return [ids]
        bounds = np.frombuffer(offs, dtype="<u8").tolist()  # a few pieces: slices beat np.split
        return [ids[a:b] for a, b in zip(bounds, bounds[1:])]

    def encode_lists(self, texts: list[str]) -> list[list[int]] | None:
        """Each text's IDs as a Python list built by the engine itself (its ``Encoding.ids``: on its
        own threads, from ints it keeps, 2-4x faster than ``ndarray.tolist``); None where the
        tokenizer carries truncation or padding, which this entry point would apply."""
        if self._tok.truncation is not None or self._tok.padding is not None:
            return None
        return [e.ids for e in self._tok.encode_batch(texts, add_special_tokens=False)]

    def encode_flat(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """All texts' IDs in one int32 buffer plus int64 offsets (n + 1), straight from the engine's
        own output: the values are a zero-copy view (IDs are below 2**31)."""
        buf, offs = self._tok.encode_batch_flat(texts, add_special_tokens=False)
        if _LITTLE:  # the engine's little-endian u32/u64 read as int32/int64 directly (IDs < 2**31)
            return np.frombuffer(buf, dtype=_I32), np.frombuffer(offs, dtype=_I64)
        values = np.frombuffer(buf, dtype="<u4").view("<i4")
        offsets = np.frombuffer(offs, dtype="<u8").view("<i8")
        return values.astype(np.int32), offsets.astype(np.int64)  # big-endian hosts


class _GigatokenBackend:
    name = "gigatoken"

    def __init__(self, data: bytes):
        try:
            from gigatoken.gigatoken_rs import load_hf_json
        except Exception as exc:  # noqa: BLE001
            raise FastEngineUnavailable(f"gigatoken is not importable ({exc}); "
                                        "pip install 'gigatoken>=0.10.0'") from exc
        try:
            self._backend = load_hf_json(data)
        except Exception as exc:  # noqa: BLE001 - RuntimeError for configs it does not support
            raise FastEngineUnavailable(f"gigatoken refused the tokenizer.json: {str(exc).splitlines()[0]}") from exc
        self._encode = self._backend.encode

    def encode_pieces(self, texts: list[str]) -> list[np.ndarray]:
        enc = self._encode
        out = []
        for t in texts:
            ids = enc(t)
            out.append(ids.view(np.int32) if ids.dtype == np.uint32 else ids.astype(np.int32))
        return out


class NativeBackend(Protocol):
    """A loaded native engine (one of the classes above): per-text int32 arrays; its optional entry
    points (``encode_flat``, ``raw_flat``, ``encode_lists``) are read once by :class:`FastEncoder`."""

    def encode_pieces(self, texts: list[str]) -> list[np.ndarray]: ...


FlatCall = Callable[[list[str]], tuple[np.ndarray, np.ndarray]]
RawFlatCall = Callable[[list[str]], tuple[bytes, bytes]]  # LE int32 IDs, LE int64 offsets
ListsCall = Callable[[list[str]], Union[list[list[int]], None]]



class NativeEngine(Encoder, Protocol):
    """A fast engine as :class:`~delta_ray._engine.engine.Engine` runs it: the core's three output
    shapes, its native flat call where it has one, and the check of its list entry point."""

    @property
    def raw_flat(self) -> RawFlatCall | None:
        """The engine's flat call answering raw buffers (LE int32 IDs, LE int64 offsets), or None."""
        ...

    def check_lists(self, *, background: bool = False) -> bool | None:
        """Check the list entry point (in the background when asked); None where it has none or
        the check runs."""
        ...


class PiecesEngine(PiecesEncoder):
    """A fast engine that makes only arrays (an engine under test, a wrapper): no raw flat call and
    no list entry point."""

    name = "fast"
    raw_flat: RawFlatCall | None = None

    def check_lists(self, *, background: bool = False) -> bool | None:
        return None


_LISTS_CHECK_LOCK = threading.Lock()
_BACKEND_CLASSES: dict[str, Callable[[bytes], NativeBackend]] = {"fastokens": _FastokensBackend,
                                                                  "gigatoken": _GigatokenBackend}


class FastEncoder:
    """A native engine implementing the ``Encoder`` protocol (``name = "fast"``).

    ``encode_pieces`` returns one int32 array per text, meant to equal the reference's IDs with
    ``add_special_tokens=False``. Exactness is *checked*, not assumed: gate texts with
    :class:`delta_ray._engine.guard.GuardSet` and admit the engine with
    :func:`delta_ray._verify.admit.admit_fast`.

    ``backend="auto"`` takes the first loadable engine among :data:`FAST_BACKENDS` (fastokens, then
    gigatoken). A missing package or a tokenizer.json the engine refuses raises
    :class:`FastEngineUnavailable` with the reason.
    """

    name = "fast"

    def __init__(self, tokenizer_json: TokenizerSource, backend: str = "auto"):
        data = _read_source(tokenizer_json)
        self.digest = hashlib.sha256(data).hexdigest()
        self._added = _added_contents(data)
        if backend == "auto":
            candidates = list(FAST_BACKENDS)
        elif backend in _BACKEND_CLASSES:
            candidates = [backend]
        else:
            raise ValueError(f"unknown fast backend {backend!r}; choose 'auto' or one of {FAST_BACKENDS}")
        reasons = []
        for cand in candidates:
            try:
                self._impl = _BACKEND_CLASSES[cand](data)
            except FastEngineUnavailable as exc:
                reasons.append(f"{cand}: {exc.reason}")
                continue
            self.backend = cand
            self.backend_version = package_version(cand)
            self._flat: FlatCall | None = getattr(self._impl, "encode_flat", None)  # looked up once, not per call
            # see _FastokensBackend; None for others
            self.raw_flat: RawFlatCall | None = getattr(self._impl, "raw_flat", None)
            self._lists: ListsCall | None = getattr(self._impl, "encode_lists", None)
            self._lists_checked: bool | None = None if self._lists is not None else False
            self._lists_check_started = False
            break
        else:
            raise FastEngineUnavailable("; ".join(reasons))

    @property
    def cache_key(self) -> str:
        """tokenizer digest + engine name/version + reference version, for anything cached about it."""
        return f"{self.digest}:{self.backend}-{self.backend_version}:tokenizers-{package_version('tokenizers')}"

    def encode_pieces(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Encode each text (no post-processing); reject what the reference rejects with ValueError."""
        if not texts:
            return []
        checkpoint()  # a background thread of delta-ray never enters the engine once the process exits
        texts = list(texts)
        try:
            return self._impl.encode_pieces(texts)
        except (TypeError, UnicodeEncodeError) as exc:  # lone surrogates: the reference refuses them too
            raise ValueError(f"the fast engine ({self.backend}) rejected the text: {exc}") from exc

    def encode(self, text: str) -> np.ndarray:
        """One text's IDs as an int32 array."""
        return self.encode_pieces([text])[0]

    def encode_flat(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """All texts' IDs as one int32 buffer plus int64 offsets (len(texts) + 1)."""
        checkpoint()
        if type(texts) is not list:
            texts = list(texts)
        try:
            if self._flat is not None:
                return self._flat(texts)
            return flat_from_pieces(self._impl.encode_pieces(texts) if texts else [])
        except (TypeError, UnicodeEncodeError) as exc:
            raise ValueError(f"the fast engine ({self.backend}) rejected the text: {exc}") from exc

    def encode_lists(self, texts: Sequence[str]) -> list[list[int]] | None:
        """Each text's IDs as a Python list (transformers' container) from the engine's own list entry
        point, or None where there is none or it is not trusted yet: used only once it gave exactly
        :meth:`encode_flat`'s IDs on :func:`list_entry_texts` (checked once per instance, docs/dropin.md
        §14). The first call starts that check in a background thread and returns None, as every
        call does until the check has passed: the caller converts :meth:`encode_flat`'s output
        meanwhile (the same IDs), so no request waits the check's 0.4-0.8 s. The guard applies as
        to :meth:`encode_flat` (same engine, same texts)."""
        checked = self._lists_checked
        if not checked:
            if checked is None:
                self.check_lists(background=True)
            return None
        checkpoint()
        lists = cast(ListsCall, self._lists)  # checked: there is one
        try:
            return lists(texts if type(texts) is list else list(texts))
        except (TypeError, UnicodeEncodeError) as exc:
            raise ValueError(f"the fast engine ({self.backend}) rejected the text: {exc}") from exc

    def check_lists(self, *, background: bool = False) -> bool | None:
        """The list entry point's check (:meth:`encode_lists`): its verdict, run here if not run yet;
        with ``background``, started in a daemon thread once per instance (None until it ends)."""
        if self._lists_checked is not None or not background:
            if self._lists_checked is None:
                self._lists_checked = self._check_lists()
            return self._lists_checked
        with _LISTS_CHECK_LOCK:
            if self._lists_check_started:
                return None
            self._lists_check_started = True

        def run() -> None:
            verdict = self._check_lists()
            if self._lists_checked is None:
                self._lists_checked = verdict
        exit_guard.start_thread(run, "delta-ray-list-check")  # None once exiting: the flat path stays
        return None

    def _check_lists(self) -> bool:
        texts = list_entry_texts(self._added)
        try:
            lists = cast(ListsCall, self._lists)(texts)  # called while unchecked: there is one
            values, offsets = self.encode_flat(texts)
        except Exception:  # noqa: BLE001 - an entry point that fails here is not used
            return False
        if lists is None or len(lists) != len(texts):
            return False
        bounds = offsets.tolist()
        return all(lst == values[a:b].tolist() for lst, a, b in zip(lists, bounds, bounds[1:]))

    def __repr__(self) -> str:
        return f"FastEncoder(backend={self.backend!r}, version={self.backend_version!r}, digest={self.digest[:12]})"


# The list entry point's check (below): fragments of the character classes the verification battery
# (guard_battery.ALPHABETS) covers, kept here since that module imports this one.
_CHECK_TEXT = ("The quick brown fox jumps over the lazy dog. It's 12:45 and we've got 3,000,000 reasons -- "
               "don't we? Mr. O'Neil's caf\u00e9 served cr\u00e8me br\u00fbl\u00e9e.\n\n"
               "def f(x: int) -> list[int]:\n    return [x]  # TODO\r\n\tif (x != 0 && y >= 10) { return -1; }\n"
               "\u041c\u043e\u0441\u043a\u0432\u0430 \u2014 \u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac. "
               "\u05e2\u05d1\u05e8\u05d9\u05ea \u0627\u0644\u0639\u0631\u0628\u064a\u0629 \u0661\u0662\u0663.\n"
               "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8 English \u4e2d\u6587\uff0c\ud55c\uad6d\uc5b4. "
               "\u0939\u093f\u0928\u094d\u0926\u0940 \u0e20\u0e32\u0e29\u0e32\u0e44\u0e17\u0e22 "
               "Ti\u1ebfng Vi\u1ec7t.\n")
_CHECK_FRAGMENTS = [
    " ", "  ", "\t", "\n", "\r\n", "\r", "\n\n", " \n", "\u00a0", "\u3000", "\u200b", "\x0b", "\x85", "\u2028",
    "'s", "'t", "'re", "'LL", "'", "\u2019s", "n't", "I'm", "don't", "0", "12", "123", "1234", "3.14", "\u0663",
    "\uff11", "\u00b2", "\u00bd", "!", "!!!", "...", "?!", "\u3002", "\u2014", "###", "```", "//", "->", "<|", "|>",
    "e\u0301", "a\u0300", "\u0301", "\u0345", "\u0915\u093c", "\uf900", "\uac00", "\u1100\u1161", "\u093f", "\u302a",
    "\u65e5", "\u30c6\u30b9\u30c8", "\uff21", "\U00020000", "a", "Z", "Hello", "WORLD", "camelCase", "\u00df",
    "\u0131", "\u0130", "\u01c5", "\u1e9e", "\U0001f468\u200d\U0001f469\u200d\U0001f467", "\U0001f44d\U0001f3fd",
    "\u2764\ufe0f", "\U0001f1fa\U0001f1f8", "\u0899", "\u1acf", "\U0001e4ec", "\U00011f41", "\x00", "\x7f",
    "\u00ad", "\ufeff", "\ufffd", "\ue000", "\U0010ffff", "\u202e", "\u0600",
]


def list_entry_texts(added: Sequence[str] = ()) -> list[str]:
    """What the engine's list entry point must agree with its flat one on before it is used: fragments
    of every character class the verification battery covers (and the tokenizer's ``added`` token
    strings), alone and in pairs, and long inputs past the engine's internal chunking and parallel
    thresholds, chat-shaped ones included (added tokens between runs of text)."""
    frags = _CHECK_FRAGMENTS + list(added)[:64]
    out = frags + [a + b for a in frags[::2] for b in frags[::3]]
    filler = (_CHECK_TEXT * 40)[:5000]
    mixed = "".join(f + _CHECK_TEXT[:200] for f in frags)
    out += [_CHECK_TEXT, filler + " " * 700 + "x" + filler[:2000], filler + " " * 701, "a" * 3000,
            " " * 5000 + "b", "ab1 " * 6000, _CHECK_TEXT * 30, mixed * 4, (_CHECK_TEXT * 200)[:70000] + mixed]
    return out


_LOADED: dict[tuple[str, str], FastEncoder] = {}


def cached_fast_encoder(tokenizer_json: TokenizerSource, backend: str = "auto") -> FastEncoder:
    """A process-wide FastEncoder per (tokenizer.json digest, backend): loading costs 0.5-3 s.

    The engines keep no per-call state (fastokens' caches are off), so one instance serves every
    caller of the process; fastokens encodes with the GIL released, so threads may share it.
    """
    data = _read_source(tokenizer_json)
    digest = hashlib.sha256(data).hexdigest()
    if backend != "auto":
        enc = _LOADED.get((digest, backend))
        if enc is None:
            enc = _LOADED[(digest, backend)] = FastEncoder(data, backend)
        return enc
    reasons = []
    for cand in FAST_BACKENDS:  # "auto": the first engine that loads, as FastEncoder does
        try:
            return cached_fast_encoder(data, cand)
        except FastEngineUnavailable as exc:
            reasons.append(f"{cand}: {exc.reason}")
    raise FastEngineUnavailable("; ".join(reasons))
