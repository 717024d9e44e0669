r"""Guarding the fast encoder: where it may disagree with the reference, and the admission battery.

A native engine (:mod:`delta_ray.fast_engine`) reimplements the reference's normalizer, pre-tokenizer
regex and BPE. Its Unicode tables are not the reference's: the reference's regex classes come from its
Oniguruma build (Unicode 16) and its NFC from Unicode 9.0 tables, while an engine may use older or newer
ones. So, per tokenizer (SHA-256 of its tokenizer.json) and per installed pair of versions, this module

1. **probes every code point** (U+0000..U+10FFFF, surrogates excluded) in a set of contexts against the
   reference and collects the code points on which the engine's IDs differ -- the *guard set*;
2. caches that set on disk (``$DELTA_RAY_CACHE/guard`` or ``~/.cache/delta_ray/guard``), keyed by
   (tokenizer digest, tokenizers version, engine name + version, probe format);
3. answers ``GuardSet.allows(text)``: the fast engine may encode a text only when it holds none of the
   guarded code points (an ``isascii`` fast path, then one precompiled character class);
4. runs :func:`verify_fast_engine`, a battery of real and adversarial texts the engine must pass before
   it is admitted.

How the probe isolates probes
-----------------------------
Probes are joined into chunks with a *separator* that is one of the tokenizer's own special added tokens
(``special``, not ``normalized``, no ``lstrip``/``rstrip``/``single_word``). The reference extracts such
tokens from the raw text *before* normalization and pre-tokenization and runs the normalizer and the
pre-tokenizer on each piece between them on its own, so each probe is encoded exactly as it would be
alone, and the chunk's IDs are the probes' IDs joined by the separator's ID. Probes that could form or
break a separator match (code points that occur in any added token's content) are never joined: they
are encoded one by one. The split is checked, not assumed: a chunk whose reference IDs do not hold
exactly one separator ID between consecutive probes is re-encoded probe by probe, and
:func:`check_probe_isolation` compares joined and one-by-one IDs on a sample.

Each chunk is encoded by both engines; equal chunks clear all their probes at once; in a chunk that
differs, the IDs are cut at the separator and compared probe by probe.

Contexts per code point ``c`` (``|`` marks the separator, a special-token string) come from
:func:`delta_ray.probe_contexts.derived_contexts`: the two below, then a chain that puts ``c`` next
to a representative of every class the pattern distinguishes and after a contraction witness
(``" I'"``). Code points that some engine may case-fold into a ``(?i:...)`` group are guarded
wholesale (:func:`delta_ray.probe_contexts.fold_sensitive_code_points`):

* ``|c|`` -- alone, i.e. next to a special-token string on both sides;
* ``|c 's c ␠ c 123 c ␠␠ c \r\n c \u0301 c ' c c a! c|`` (␠ is a space): a chain whose 10 instances
  of ``c`` each have a different left and right neighbour. ``c`` is seen after and before a letter,
  digits, one and two spaces, an apostrophe, punctuation, CR/LF, a combining mark (U+0301), itself
  (doubled) and a special token. The neighbours are chosen so that the pre-tokenizer classes of ``c``
  show in the IDs even when ``c``'s own bytes merge with nothing: whether ``c`` takes the apostrophe
  of a following ``'s`` (punctuation) or leaves the contraction whole (letter, digit, space); whether
  ``c`` joins a following ``123`` into a digit group; whether a preceding double space stays whole
  (digit) or lends ``c`` its last space (letter, punctuation);
* pair probes ``|x y|`` and ``|a x y \u0301|`` for every canonical composition pair known to Python's
  ``unicodedata``, for Hangul L+V and LV+T jamo, and for every pair of code points inside the blocks
  whose compositions were added after Unicode 9.0 (Dives Akuru, Tulu-Tigalari, Gurung Khema, Kirat Rai,
  ...), since the reference's NFC tables predate them.

Guarded code points are the ones in a probe whose IDs differ (both code points of a pair probe).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import time
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np

from delta_ray.fast_engine import FastEncoder, FastEngineUnavailable, fast_engine_versions
from delta_ray.probe_contexts import BASE_CONTEXTS, derived_contexts

GUARD_FORMAT = 5  # bump when the probe changes: old cache entries are then ignored

_SURROGATES = range(0xD800, 0xE000)
ALL_CODE_POINTS = np.concatenate([np.arange(0, 0xD800), np.arange(0xE000, 0x110000)]).astype(np.int64)

# The fixed contexts of format 3 ("{c}" is the probed code point); the probe now uses
# probe_contexts.derived_contexts(tokenizer_json), which starts with these.
CONTEXTS: tuple[str, ...] = BASE_CONTEXTS

# Blocks (start, end) whose canonical compositions are newer than the reference's Unicode 9.0 NFC
# tables; every ordered pair inside each is probed. Python's unicodedata (14.0 on 3.11) knows the
# Dives Akuru pair; the Unicode 16 scripts are beyond it, hence whole-block pairs.
NEW_COMPOSITION_BLOCKS: tuple[tuple[int, int], ...] = (
    (0x11900, 0x1195F),  # Dives Akuru (13.0)
    (0x11380, 0x113FF),  # Tulu-Tigalari (16.0)
    (0x16100, 0x1613F),  # Gurung Khema (16.0)
    (0x16D40, 0x16D7F),  # Kirat Rai (16.0)
)




# ----------------------------------------------------------------------------------------------
# GuardSet
# ----------------------------------------------------------------------------------------------

def _ranges(cps: Iterable[int]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for cp in sorted(set(cps)):
        if out and cp == out[-1][1] + 1:
            out[-1] = (out[-1][0], cp)
        else:
            out.append((cp, cp))
    return out


def _class_pattern(cps: Iterable[int]) -> re.Pattern | None:
    parts = []
    for lo, hi in _ranges(cps):
        if lo == hi:
            parts.append(re.escape(chr(lo)) if lo > 0x20 else f"\\x{lo:02x}")
        else:
            a = re.escape(chr(lo)) if lo > 0x20 else f"\\x{lo:02x}"
            b = re.escape(chr(hi)) if hi > 0x20 else f"\\x{hi:02x}"
            parts.append(f"{a}-{b}")
    if not parts:
        return None
    return re.compile("[" + "".join(parts) + "]")


def _str_header() -> int | None:
    """Bytes of a compact non-ASCII str object besides its characters (CPython), or None."""
    try:
        h = sys.getsizeof("\u00e9") - 2
        if (sys.getsizeof("\u0101\u0101") == h + 3 * 2 and sys.getsizeof("\U0001f600") == h + 2 * 4
                and sys.getsizeof("\u00e9" * 9) == h + 10):
            return h
    except TypeError:  # pragma: no cover - no getsizeof (PyPy)
        pass
    return None  # pragma: no cover


_STR_HEADER = _str_header()


def _str_kind(text: str) -> int:
    """1, 2 or 4: bytes per character of a non-ASCII str (its widest character fits), 0 if unknown."""
    if _STR_HEADER is None:  # pragma: no cover
        return 0
    k, r = divmod(sys.getsizeof(text) - _STR_HEADER, len(text) + 1)
    return k if r == 0 and k in (1, 2, 4) else 0


@dataclass(frozen=True)
class GuardSet:
    """The code points on which a fast engine may disagree with the reference, for one tokenizer.

    ``allows(text)`` is True when the text holds none of them. It costs nothing when the set is empty
    or the text is ASCII (the str's own flag, O(1)), and nothing more than a width check when the text's
    widest character is below every guarded one (CPython stores a str with 1, 2 or 4 bytes per
    character, which ``sys.getsizeof`` reveals); otherwise one pass: a precompiled character class
    (``re``) over 1- and 2-byte strings, a numpy lookup table over the UTF-32 form of 4-byte ones.
    """

    code_points: frozenset[int]
    key: dict = field(default_factory=dict, compare=False)
    stats: dict = field(default_factory=dict, compare=False)

    def __post_init__(self):
        cps = sorted(self.code_points)
        bmp = [c for c in cps if c < 0x10000]
        lut = np.zeros(0x110000, dtype=bool)
        if cps:
            lut[np.asarray(cps, dtype=np.int64)] = True
        setattr_ = object.__setattr__
        setattr_(self, "_empty", not cps)
        setattr_(self, "_ascii_ok", not cps or cps[0] >= 0x80)
        setattr_(self, "_latin1_ok", not cps or cps[0] >= 0x100)
        setattr_(self, "_ucs2_ok", not bmp)
        setattr_(self, "_bmp_pattern", _class_pattern(bmp))
        setattr_(self, "_lut", lut)

    def allows(self, text: str) -> bool:
        """True when ``text`` contains no guarded code point (the fast engine may encode it)."""
        if self._empty:
            return True
        if text.isascii():
            return self._ascii_ok or self._bmp_pattern.search(text) is None
        kind = _str_kind(text)
        if kind == 1:
            return self._latin1_ok or self._bmp_pattern.search(text) is None
        if kind == 2:
            return self._ucs2_ok or self._bmp_pattern.search(text) is None
        return not self._lut.take(np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)).any()

    def positions(self, text: str) -> np.ndarray:
        """Indices of every guarded code point in ``text``."""
        if self._empty or not text:
            return np.zeros(0, dtype=np.int64)
        return np.flatnonzero(self._lut.take(np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)))

    def first_guarded(self, text: str) -> int | None:
        """Index of the first guarded code point in ``text``, or None."""
        if self._empty or not text:
            return None
        hits = np.flatnonzero(self._lut.take(np.frombuffer(text.encode("utf-32-le", "surrogatepass"),
                                                            dtype=np.uint32)))
        return int(hits[0]) if len(hits) else None

    def __contains__(self, cp: object) -> bool:
        if isinstance(cp, str):
            cp = ord(cp)
        return cp in self.code_points

    def __len__(self) -> int:
        return len(self.code_points)

    def ranges(self) -> list[tuple[int, int]]:
        return _ranges(self.code_points)

    def __repr__(self) -> str:
        return f"GuardSet({len(self.code_points)} code points, backend={self.key.get('backend')})"


# ----------------------------------------------------------------------------------------------
# The probe
# ----------------------------------------------------------------------------------------------

def _pick_separator(tokenizer_json: dict) -> tuple[str, int]:
    """The shortest special added token that is matched verbatim with no stripping."""
    cands = []
    for t in tokenizer_json.get("added_tokens") or []:
        if (t.get("special") and not t.get("normalized") and not t.get("lstrip") and not t.get("rstrip")
                and not t.get("single_word") and len(t["content"]) >= 2):
            cands.append((len(t["content"].encode()), t["content"], int(t["id"])))
    if not cands:
        raise FastEngineUnavailable("the tokenizer has no special added token to isolate probes with")
    cands.sort()
    return cands[0][1], cands[0][2]


def _added_token_chars(tokenizer_json: dict) -> set[int]:
    return {ord(ch) for t in tokenizer_json.get("added_tokens") or [] for ch in t["content"]}


def _composition_pairs() -> list[tuple[int, int]]:
    """Code point pairs whose canonical composition an engine's NFC tables may know and the reference's not."""
    pairs = set()
    for cp in range(0x110000):
        if cp in _SURROGATES:
            continue
        d = unicodedata.decomposition(chr(cp))
        if d and not d.startswith("<"):
            parts = [int(x, 16) for x in d.split()]
            if len(parts) == 2:
                pairs.add((parts[0], parts[1]))
    # Hangul (composed by arithmetic, not tables): every L+V, and every LV syllable with three T jamo
    for l_ in range(0x1100, 0x1113):
        for v in range(0x1161, 0x1176):
            pairs.add((l_, v))
    for lv in range(0xAC00, 0xD7A4, 28):
        for t in range(0x11A8, 0x11C3, 9):
            pairs.add((lv, t))
    for lo, hi in NEW_COMPOSITION_BLOCKS:
        for a in range(lo, hi + 1):
            for b in range(lo, hi + 1):
                pairs.add((a, b))
    return sorted(pairs)


@dataclass
class ProbeResult:
    """What one probe run found and what it cost."""

    disagreeing: set[int]
    seconds: float
    probes: int
    chunks: int
    differing_chunks: int
    separator: str
    one_by_one: int
    timings: dict = field(default_factory=dict)
    reference_chunks: int = 0


def _workers() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def _encode_ref(ref_tokenizer, texts: list[str]) -> list[np.ndarray]:
    if not texts:
        return []
    encs = ref_tokenizer.encode_batch_fast(texts, add_special_tokens=False)
    out = [np.asarray(e.ids, dtype=np.int32) for e in encs]
    del encs
    return out


def _encode_ref_parallel(ref_tokenizer, texts: list[str], pool) -> list[np.ndarray]:
    """The reference on every core, whatever TOKENIZERS_PARALLELISM says (its batch call drops the GIL)."""
    n = _workers()
    if pool is None or n == 1 or len(texts) < 2 * n:
        return _encode_ref(ref_tokenizer, texts)
    step = -(-len(texts) // (4 * n))
    futs = [pool.submit(_encode_ref, ref_tokenizer, texts[i:i + step]) for i in range(0, len(texts), step)]
    out: list[np.ndarray] = []
    for fu in futs:
        out.extend(fu.result())
    return out


def _digest_text(text: str) -> str:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=12).hexdigest()


def _digest_ids(ids: np.ndarray) -> str:
    return hashlib.blake2b(np.ascontiguousarray(ids, dtype="<i4").tobytes(), digest_size=12).hexdigest()


def _compare_chunk(r: np.ndarray, f: np.ndarray, nseg: int, sep_id: int) -> list[int] | None:
    """Indices of the differing probes of a chunk, or None when its split cannot be trusted."""
    pr = np.flatnonzero(r == sep_id)
    if len(pr) != nseg - 1:
        return None
    pf = np.flatnonzero(f == sep_id)
    if len(pf) != nseg - 1:
        return None  # the engine split the chunk differently: judge its probes one by one
    if len(r) == len(f) and np.array_equal(pr, pf):
        bad_pos = np.flatnonzero(r != f)
        return sorted(set(np.searchsorted(pr, bad_pos).tolist()))
    return [i for i, (a, b) in enumerate(zip(np.split(r, pr), np.split(f, pf))) if not np.array_equal(a, b)]


def _probe_texts(code_points: list[int], contexts: Sequence[str], pairs: Sequence[tuple[int, int]],
                 batch: int = 1 << 17):
    """Yield (probe texts, owners) in batches of at most ``batch`` probes: each context, then the pairs."""
    for tmpl in contexts:
        fmt = tmpl.replace("{c}", "%s")
        n = tmpl.count("{c}")
        for i in range(0, len(code_points), batch):
            part = code_points[i:i + batch]
            if tmpl == "{c}":
                texts = [chr(c) for c in part]
            else:
                texts = [fmt % ((chr(c),) * n) for c in part]
            yield texts, [(c,) for c in part]
    texts, owners = [], []
    for a, b in pairs:
        ab = chr(a) + chr(b)
        texts.append(ab)
        texts.append("a" + ab + "\u0301")
        owners.append((a, b))
        owners.append((a, b))
    for i in range(0, len(texts), batch):
        yield texts[i:i + batch], owners[i:i + batch]


def probe_disagreements(ref_tokenizer, fast: FastEncoder | Callable[[list[str]], list[np.ndarray]],
                        tokenizer_json: dict, *, code_points: Sequence[int] | np.ndarray | None = None,
                        contexts: Sequence[str] | None = None, pairs: Sequence[tuple[int, int]] | None = None,
                        chunk_probes: int = 2048, ref_digests: dict[str, str] | None = None) -> ProbeResult:
    """Probe code points (default: all but surrogates) in ``contexts`` and return where the engines differ.

    ``fast`` is a :class:`FastEncoder` or any callable mapping a list of texts to int32 arrays.
    The reference runs on every core (``encode_batch_fast`` on slices, from a thread pool); the
    fast engine runs on the calling thread. ``ref_digests`` (chunk text digest -> digest of the
    reference's IDs, filled in as the reference runs) lets a later probe of the same tokenizer skip
    the reference on every chunk where the engine's IDs hash to the recorded ones.
    """
    from concurrent.futures import ThreadPoolExecutor

    t0 = time.perf_counter()
    fast_encode = fast.encode_pieces if hasattr(fast, "encode_pieces") else fast
    if contexts is None:
        contexts = derived_contexts(tokenizer_json)
    sep, sep_id = _pick_separator(tokenizer_json)
    risky = _added_token_chars(tokenizer_json)
    cps = [int(c) for c in (ALL_CODE_POINTS if code_points is None else code_points)]
    if pairs is None:
        pairs = _composition_pairs()
        if code_points is not None:
            wanted = set(cps)
            pairs = [(a, b) for a, b in pairs if a in wanted or b in wanted]
    timings = {"build": 0.0, "fast": 0.0, "reference_wait": 0.0, "compare": 0.0}

    disagreeing: set[int] = set()
    alone: list[tuple[str, tuple[int, ...]]] = []
    counts = {"probes": 0, "chunks": 0, "differing": 0, "reference_chunks": 0}
    n_workers = _workers()

    def prepare(texts, owners, pool) -> dict:
        """Main thread: chunk the batch, run the engine, start the reference where it is needed."""
        t = time.perf_counter()
        counts["probes"] += len(texts)
        keep_t, keep_o = [], []
        for txt, own in zip(texts, owners):
            if any(c in risky for c in own):
                alone.append((txt, own))
            else:
                keep_t.append(txt)
                keep_o.append(own)
        chunks_txt = [sep.join(keep_t[i:i + chunk_probes]) for i in range(0, len(keep_t), chunk_probes)]
        chunks_own = [keep_o[i:i + chunk_probes] for i in range(0, len(keep_o), chunk_probes)]
        counts["chunks"] += len(chunks_txt)
        timings["build"] += time.perf_counter() - t
        t = time.perf_counter()
        fast_ids = fast_encode(chunks_txt)
        timings["fast"] += time.perf_counter() - t
        t = time.perf_counter()
        tkeys: list[str] = []
        if ref_digests is not None:  # chunks whose reference IDs are known to equal the engine's
            tkeys = [_digest_text(c) for c in chunks_txt]
            need = [j for j, (k, f) in enumerate(zip(tkeys, fast_ids)) if ref_digests.get(k) != _digest_ids(f)]
        else:
            need = list(range(len(chunks_txt)))
        counts["reference_chunks"] += len(need)
        step = max(1, -(-len(need) // (4 * n_workers)))
        futs = [pool.submit(_encode_ref, ref_tokenizer, [chunks_txt[j] for j in need[i:i + step]])
                for i in range(0, len(need), step)]
        timings["compare"] += time.perf_counter() - t
        return {"txt": chunks_txt, "own": chunks_own, "fast": fast_ids, "keys": tkeys, "need": need, "futs": futs}

    def finish(batch: dict) -> None:
        """Collect the reference's IDs of a batch and compare them probe by probe where they differ."""
        t = time.perf_counter()
        ref_ids: list[np.ndarray] = []
        for fu in batch["futs"]:
            ref_ids.extend(fu.result())
        timings["reference_wait"] += time.perf_counter() - t
        t = time.perf_counter()
        for j, r in zip(batch["need"], ref_ids):
            f, own = batch["fast"][j], batch["own"][j]
            sep_ok = np.count_nonzero(r == sep_id) == len(own) - 1
            if ref_digests is not None and sep_ok:
                ref_digests[batch["keys"][j]] = _digest_ids(r)
            if sep_ok and len(r) == len(f) and np.array_equal(r, f):
                continue
            counts["differing"] += 1
            bad = _compare_chunk(r, f, len(own), sep_id)
            if bad is None:  # cannot trust the split: every probe of the chunk goes one by one
                alone.extend(zip(batch["txt"][j].split(sep), own))
                continue
            for i in bad:
                disagreeing.update(own[i])
        timings["compare"] += time.perf_counter() - t

    # Pipelined: while the reference encodes batch k on the pool's threads (it drops the GIL), the
    # calling thread builds batch k+1 and runs the engine on it.
    with ThreadPoolExecutor(max_workers=n_workers) as pool:
        pending = None
        for texts, owners in _probe_texts(cps, contexts, pairs):
            batch = prepare(texts, owners, pool)
            del texts, owners
            if pending is not None:
                finish(pending)
            pending = batch
        if pending is not None:
            finish(pending)
        del pending
        if alone:
            t = time.perf_counter()
            texts = [txt for txt, _ in alone]
            for (txt, own), r, f in zip(alone, _encode_ref_parallel(ref_tokenizer, texts, pool), fast_encode(texts)):
                if not np.array_equal(r, f):
                    disagreeing.update(own)
            timings["one_by_one"] = time.perf_counter() - t
    return ProbeResult(disagreeing, time.perf_counter() - t0, counts["probes"], counts["chunks"],
                       counts["differing"], sep, len(alone), {k: round(v, 2) for k, v in timings.items()},
                       counts["reference_chunks"])


def check_probe_isolation(ref_tokenizer, tokenizer_json: dict, probes: Sequence[str]) -> bool:
    """True when the reference's IDs for the separator-joined probes equal its one-by-one IDs joined."""
    sep, sep_id = _pick_separator(tokenizer_json)
    whole = _encode_ref(ref_tokenizer, [sep.join(probes)])[0]
    parts = _encode_ref(ref_tokenizer, list(probes))
    expect = []
    for i, p in enumerate(parts):
        if i:
            expect.append(np.array([sep_id], dtype=np.int32))
        expect.append(p)
    return np.array_equal(whole, np.concatenate(expect) if expect else whole)


# ----------------------------------------------------------------------------------------------
# The guard set, cached per (tokenizer, versions)
# ----------------------------------------------------------------------------------------------

def guard_key(tokenizer_json_bytes: bytes, fast: FastEncoder | None = None, *, backend: str | None = None,
              backend_version: str | None = None) -> dict:
    """What a guard set depends on: the tokenizer, the reference's and the engine's versions, the probe.

    Computable from package metadata alone (``backend``/``backend_version``): loading an engine
    costs seconds, and a cached admission should not.
    """
    # The derived contexts are a function of the tokenizer's bytes and this code (GUARD_FORMAT), both
    # in the key already: no need to parse a 10 MB tokenizer.json to look a cached verdict up.
    return {"format": GUARD_FORMAT,
            "tokenizer_sha256": hashlib.sha256(tokenizer_json_bytes).hexdigest(),
            "tokenizers": fast_engine_versions()["tokenizers"],
            "backend": fast.backend if fast is not None else backend,
            "backend_version": fast.backend_version if fast is not None else backend_version,
            "python_unicodedata": unicodedata.unidata_version}


def ranges_digest(ranges: Sequence[Sequence[int]]) -> str:
    """SHA-256 of a guard set's canonical range list (part of every record that carries one)."""
    return hashlib.sha256(json.dumps([[int(a), int(b)] for a, b in ranges]).encode()).hexdigest()


def valid_ranges(ranges: object) -> bool:
    """Sorted, disjoint, in-range ``[lo, hi]`` integer pairs (what a stored guard set must be)."""
    if not isinstance(ranges, list):
        return False
    prev = -2
    for r in ranges:
        if (not isinstance(r, list) or len(r) != 2 or not all(type(v) is int for v in r)
                or not prev + 1 < r[0] <= r[1] <= 0x10FFFF):
            return False
        prev = r[1]
    return True


def guard_from_ranges(ranges: Sequence[Sequence[int]], key: dict, stats: dict) -> GuardSet:
    return GuardSet(frozenset(c for lo, hi in ranges for c in range(lo, hi + 1)), key=key, stats=stats)


def _valid_guard_payload(p: dict) -> bool:
    return (valid_ranges(p.get("ranges")) and p.get("ranges_sha256") == ranges_digest(p["ranges"])
            and isinstance(p.get("stats"), dict))


def _load_cached(key: dict) -> GuardSet | None:
    from .cache_store import load_record
    doc = load_record("guardset", key, validate=_valid_guard_payload)
    if doc is None:
        return None
    return guard_from_ranges(doc["ranges"], key, {**doc["stats"], "cached": True})


def _store(guard: GuardSet) -> None:
    from .cache_store import save_record
    ranges = [list(r) for r in guard.ranges()]
    save_record("guardset", guard.key, {"ranges": ranges, "ranges_sha256": ranges_digest(ranges),
                                        "stats": guard.stats})


def _as_bytes(tokenizer_json) -> bytes:
    if isinstance(tokenizer_json, (bytes, bytearray, memoryview)):
        return bytes(tokenizer_json)
    return Path(tokenizer_json).read_bytes()


def guard_set_for(tokenizer_json_bytes: bytes | str | os.PathLike, backend: str | FastEncoder = "auto", *,
                  ref_tokenizer=None, use_cache: bool = True,
                  code_points: Sequence[int] | None = None) -> GuardSet:
    """The guard set of ``backend`` (a name or a loaded :class:`FastEncoder`) for this tokenizer.json.

    Loaded from the on-disk cache when an entry with the same key exists, else probed (every code
    point but the surrogates; 20-40 s on 2 cores) and stored. ``code_points`` restricts the probe to
    a subset (tests, diagnostics); the subset is part of the cache key, and a guard set derived from
    a subset only covers that subset. Raises :class:`FastEngineUnavailable` when the engine cannot
    load the tokenizer.
    """
    data = _as_bytes(tokenizer_json_bytes)
    fast = backend if isinstance(backend, FastEncoder) else FastEncoder(data, backend)
    if fast.digest != hashlib.sha256(data).hexdigest():
        raise ValueError("the FastEncoder was loaded from another tokenizer.json")
    key = guard_key(data, fast)
    if code_points is not None:
        code_points = sorted({int(c) for c in code_points if not 0xD800 <= int(c) < 0xE000})
        key["code_points"] = hashlib.sha256(np.asarray(code_points, dtype=np.int64).tobytes()).hexdigest()[:32]
    if use_cache:
        hit = _load_cached(key)
        if hit is not None:
            return hit
    if ref_tokenizer is None:
        from tokenizers import Tokenizer
        ref_tokenizer = Tokenizer.from_str(data.decode("utf-8"))
    from .cache_store import load_record, save_record
    from .probe_contexts import fold_sensitive_code_points
    cfg = json.loads(data)
    ref_key = {"tokenizer_sha256": key["tokenizer_sha256"], "tokenizers": key["tokenizers"]}
    ref_digests: dict[str, str] = {}
    if use_cache:
        ref_digests = dict(load_record("refdigests", ref_key, validate=lambda p: all(
            isinstance(k, str) and isinstance(v, str) for k, v in p.items())) or {})
    n_known = len(ref_digests)
    res = probe_disagreements(ref_tokenizer, fast, cfg, code_points=code_points,
                              contexts=derived_contexts(cfg), ref_digests=ref_digests)
    if use_cache and len(ref_digests) != n_known:
        save_record("refdigests", ref_key, ref_digests)
    # Case-insensitive groups: code points some engine may fold to a group letter are guarded
    # wholesale, whatever the probe saw (see probe_contexts and docs/design.md section 8).
    fold = set(fold_sensitive_code_points(cfg))
    if code_points is not None:
        fold &= set(code_points)
    guard = GuardSet(frozenset(res.disagreeing) | frozenset(fold), key=key,
                     stats={"probe_seconds": round(res.seconds, 2), "probes": res.probes, "chunks": res.chunks,
                            "differing_chunks": res.differing_chunks, "separator": res.separator,
                            "one_by_one": res.one_by_one, "reference_chunks": res.reference_chunks,
                            "timings": res.timings, "fold_guarded": len(fold), "cached": False})
    if use_cache:
        _store(guard)
    return guard


# ----------------------------------------------------------------------------------------------
# The verification battery
# ----------------------------------------------------------------------------------------------

_REAL_TEXT = (
    "The quick brown fox jumps over the lazy dog. It's 12:45 and we've got 3,000,000 reasons to "
    "stay -- don't we? Mr. O'Neil's café served crème brûlée in Zürich.\n\n"
    "def encode(self, text: str) -> list[int]:\n    return [ord(c) for c in text]  # TODO\r\n"
    "\tif (x != 0 && y >= 10) { return -1; }\n"
    "Москва — столица России. Ελληνικά γράμματα. עברית מימין לשמאל. العربية ١٢٣.\n"
    "日本語のテキストと English が混ざる。中文句子，还有标点！한국어 문장입니다.\n"
    "हिन्दी में लिखा गया वाक्य। ภาษาไทยไม่มีช่องว่าง Tiếng Việt có dấu.\n"
)

_ALPHABETS: dict[str, list[str]] = {
    "decomposed": ["e\u0301", "a\u0300", "o\u0308", "n\u0303", "c\u0327", "A\u030a", "u\u0308\u0301",
                   "a\u0327\u0301", "a\u0301\u0327", "e\u0323\u0302", "i\u0307", "\u0301", "\u0345"],
    "exclusions": ["\u0958", "\u0959", "\u095f", "\u09dc", "\u0a33", "\u0b5c", "\u0f43", "\u0f73", "\ufb1d",
                   "\ufb2a", "\u2126", "\u212b", "\u0340", "\u0341", "\u0374", "\u037e", "\u0387", "\u1f71",
                   "\u0915\u093c", "\u0915", "\u093c", "\uf900", "\U0002f800"],
    "hangul": ["\u1100", "\u1161", "\u11a8", "\u1100\u1161", "\u1100\u1161\u11a8", "\uac00", "\uac00\u11a8",
               "\ud55c", "\uad6d", "\uc5b4", "\u3131", "\u314f", "\u115f", "\u1160", "\u3164"],
    "marks": ["\u0300", "\u0301", "\u0302", "\u0303", "\u0308", "\u030a", "\u0327", "\u0328", "\u0336",
              "\u20dd", "\u20e3", "\ufe0f", "\ufe0e", "\u200d", "\u200c", "\u093f", "\u0e31", "\u0650",
              "\u05b7", "\u1ab0", "\u1dc0", "\u302a", "\u3099", "\u309a"],
    "space": [" ", "  ", "\t", "\n", "\r\n", "\r", "\n\n", " \n", "\u00a0", "\u2009", "\u3000", "\u200b",
              "\x0b", "\x0c", "\x85", "\u2028", "\u2029", "\u1680", "\u180e"],
    "contraction": ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'LL", "'", "''",
                    "\u2019s", "n't", "I'm", "don't", "rock'n'roll"],
    "digits": ["0", "1", "12", "123", "1234", "12345", "3.14", "1,000", "\u0663", "\u0664", "\uff11",
               "\u2460", "\u00b2", "\u00bd", "\u0e51", "\u096a", "\u216b", "\U0001d7d8"],
    "punct": ["!", "!!!", "...", "?!", "---", ":)", "\u3002", "\uff01", "\u00bf", "\u2014", "\u2026",
              "###", "```", "//", "/*", "*/", "->", "=>", "<", ">", "|", "<|", "|>", "[", "]", "~"],
    "cjk": ["\u65e5", "\u672c", "\u8a9e", "\u4e2d\u6587", "\u3042", "\u30c6\u30b9\u30c8", "\u30fc",
            "\uff21", "\uff41", "\u3400", "\U00020000", "\U0002a700", "\u3005", "\u3007"],
    "latin": ["a", "b", "Z", "word", "Hello", "WORLD", "camelCase", "x", "\u00e9", "\u00df", "\u0131",
              "\u0130", "\u01c5", "\u1e9e", "\u00c5", "\u2c65"],
    "emoji": ["\U0001f468\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466", "\U0001f3f3\ufe0f\u200d\U0001f308",
              "\U0001f44d\U0001f3fd", "\u2764\ufe0f", "\U0001f1fa\U0001f1f8", "1\ufe0f\u20e3",
              "\U0001f600", "\U0001f9d1\u200d\U0001f4bb", "\u263a", "\U0001faf6"],
    # assigned in Unicode 14-17: where engines' tables and the reference's (Oniguruma 16, NFC 9.0) part
    "recent": ["\u0899", "\u08cf", "\u0c3c", "\u1abf", "\u1ac3", "\u1acf", "\u1aeb", "\u1df6", "\u1dfa",
               "\ua7cf", "\U00010efd", "\U00011f00", "\U00011f41", "\U0001e4d0", "\U0001e4ec",
               "\U00016d67\U00016d67", "\U0001611e\U0001611e", "\U000113c2\U000113c2", "\U00031350",
               "\U0002ebf0", "\U0001fae8", "\U00011de0", "\U00016ff4"],
    "other": ["\x00", "\x01", "\x7f", "\u00ad", "\ufeff", "\ufffd", "\ue000", "\U000f0000", "\U0010ffff",
              "\U000e0041", "\u202e", "\u0600", "\U00011a00"],
}


def _special_strings(ref_tokenizer) -> list[str]:
    try:
        dec = ref_tokenizer.get_added_tokens_decoder()
        return sorted({tok.content for tok in dec.values()})
    except Exception:  # noqa: BLE001 - older tokenizers
        return []


def adversarial_battery(ref_tokenizer, *, seed: int = 0, n_random: int = 1000) -> list[str]:
    """Deterministic adversarial texts for this tokenizer (special-token strings included)."""
    import random

    rng = random.Random(seed)
    specials = all_specials = _special_strings(ref_tokenizer)
    if len(specials) > 12:  # a spread of them: shortest, longest and between
        step = (len(specials) - 1) / 11
        specials = sorted({sorted(specials, key=len)[round(i * step)] for i in range(12)})
    alph = dict(_ALPHABETS)
    sp_frag = []
    for s in specials:
        sp_frag += [s, s[:-1], s[1:], s[: len(s) // 2], s + s, s[:-1] + s, s + s[1:]]
    alph["special"] = sp_frag or ["<|", "|>"]
    out: list[str] = []
    # every element alone, and next to each other class's first element
    firsts = [v[0] for v in alph.values()]
    for vals in alph.values():
        for v in vals:
            out.append(v)
            for f in firsts:
                out.append(f + v)
                out.append(v + f)
    out += [s + "\n" for s in all_specials] + [" " + s + " " for s in all_specials] + ["x" + s + "y" for s in all_specials]
    out += _REAL_TEXT.splitlines(keepends=True) + [_REAL_TEXT]
    out += ["a" + " " * n + "b" for n in (1, 2, 3, 7, 16, 33)] + [" " * n for n in (1, 2, 5, 40)]
    out += ["x" + "\r\n" * 3 + "  \n \r\n\t\n" + "y", "word!!!\n\nnext", "end...\r\n", "a?\n", "ok:)\n\n\n"]
    out += ["1" * n for n in (1, 2, 3, 4, 5, 6, 7, 10, 31)] + ["v1.2.3-rc4", "0x7fffffff", "2024-01-01T00:00:00Z"]
    out += ["\u0958\u093f\u0928\u093e", "\u0915\u093c\u093f\u0928\u093e", "\u1100\u1161\u11a8\u1100\u1161\u11a8\uac00",
            "Cafe\u0301 re\u0301sume\u0301 na\u0308i\u0308ve", "\u0301\u0301\u0301abc", "\u00e9\u0301\u0327"]
    keys = list(alph)
    for _ in range(n_random):
        k = rng.randint(1, 12)
        parts = []
        for _ in range(k):
            cls = keys[rng.randrange(len(keys))]
            parts.append(rng.choice(alph[cls]))
        out.append("".join(parts))
    # long inputs: shapes that cross engine-internal thresholds (chunking, prefix reuse)
    filler = (_REAL_TEXT * 40)[:5000]
    out += [filler + " " * 700 + "x" + filler[:2000], filler + " " * 701, filler + " " * 700 + "\n",
            filler + " " * 700 + "\tx", "a" * 3000, " " * 5000 + "b", ("ab1 " * 6000), (_REAL_TEXT * 30)]
    return out


def _utf8_ok(text: str) -> bool:
    """Texts with lone surrogates are refused by both engines alike; the battery leaves them out."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def verify_fast_engine(ref_tokenizer, fast_encoder, texts: Iterable[str] = (), *,
                       guard: GuardSet | None = None, seed: int = 0) -> tuple[bool, str]:
    """Admission battery: ``fast_encoder`` must equal the reference on real + adversarial texts.

    ``texts`` (e.g. a sample of the workload) come first, then :func:`adversarial_battery`. With
    ``guard``, texts it does not allow are skipped (they will never reach the engine). The battery is
    encoded as one batch, then again one text at a time in reverse order, so an engine whose answer
    depends on what it encoded before is caught. Returns ``(ok, reason)``.
    """
    battery = [t for t in texts if _utf8_ok(t)] + adversarial_battery(ref_tokenizer, seed=seed)
    skipped = 0
    if guard is not None:
        kept = [t for t in battery if guard.allows(t)]
        skipped = len(battery) - len(kept)
        battery = kept
    try:
        expected = _encode_ref(ref_tokenizer, battery)
    except Exception as exc:  # noqa: BLE001
        return False, f"the reference rejected a battery text: {exc}"
    try:
        got_batch = fast_encoder.encode_pieces(battery)
        got_single = [None] * len(battery)
        for i in range(len(battery) - 1, -1, -1):
            got_single[i] = fast_encoder.encode_pieces([battery[i]])[0]
    except Exception as exc:  # noqa: BLE001
        return False, f"the fast engine failed: {type(exc).__name__}: {exc}"
    for how, got in (("batch", got_batch), ("one by one", got_single)):
        if len(got) != len(expected):
            return False, f"the fast engine returned {len(got)} arrays for {len(expected)} texts ({how})"
        for i, (e, g) in enumerate(zip(expected, got)):
            if g.dtype != np.int32:
                return False, f"text #{i} ({how}): dtype {g.dtype}, expected int32"
            if not np.array_equal(e, g):
                n = min(len(e), len(g))
                mism = np.flatnonzero(e[:n] != g[:n])
                at = int(mism[0]) if len(mism) else n
                return False, (f"text #{i} ({how}) differs from the reference at token {at}: "
                               f"text={battery[i][:80]!r} reference={e[at:at + 6].tolist()} fast={g[at:at + 6].tolist()}")
    return True, f"{len(battery)} texts equal to the reference ({skipped} skipped by the guard)"


# ----------------------------------------------------------------------------------------------
# A guarded encoder: the fast engine where the guard allows it, the reference elsewhere
# ----------------------------------------------------------------------------------------------

class GuardedEncoder:
    """``Encoder`` that sends each text to the fast engine when the guard allows it, else to the reference."""

    name = "fast"

    def __init__(self, fast: FastEncoder, guard: GuardSet, fallback, *, verdict_key: dict | None = None):
        self.fast = fast
        self.guard = guard
        self.fallback = fallback  # an Encoder, e.g. delta_ray.encoder.ReferenceEncoder
        self.verdict_key = verdict_key  # where a caught mismatch persists the rejection
        self.fast_texts = 0
        self.fallback_texts = 0

    def encode_flat(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Flat IDs straight from the engine when the guard allows every text, else via pieces."""
        texts = list(texts)
        if all(self.guard.allows(t) for t in texts):
            self.fast_texts += len(texts)
            return self.fast.encode_flat(texts)
        from .fast_engine import flat_from_pieces
        return flat_from_pieces(self.encode_pieces(texts))

    def encode_pieces(self, texts: Sequence[str]) -> list[np.ndarray]:
        texts = list(texts)
        if not texts:
            return []
        ok = [self.guard.allows(t) for t in texts]
        if all(ok):
            self.fast_texts += len(texts)
            return self.fast.encode_pieces(texts)
        out: list[np.ndarray | None] = [None] * len(texts)
        fast_idx = [i for i, k in enumerate(ok) if k]
        slow_idx = [i for i, k in enumerate(ok) if not k]
        for i, ids in zip(fast_idx, self.fast.encode_pieces([texts[i] for i in fast_idx]) if fast_idx else []):
            out[i] = ids
        for i, ids in zip(slow_idx, self.fallback.encode_pieces([texts[i] for i in slow_idx])):
            out[i] = ids
        self.fast_texts += len(fast_idx)
        self.fallback_texts += len(slow_idx)
        return out  # type: ignore[return-value]
