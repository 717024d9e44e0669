r"""The guard probe: where a fast engine may disagree with the reference, per tokenizer (cached).

A native engine (:mod:`delta_ray._engine.native`) reimplements the reference's normalizer, pre-tokenizer
regex and BPE. Its Unicode tables are not the reference's: the reference's regex classes come from its
Oniguruma build (Unicode 16) and its NFC from Unicode 9.0 tables, while an engine may use older or newer
ones. So, per tokenizer (SHA-256 of its tokenizer.json) and per installed pair of versions, this module

1. **probes every code point** (U+0000..U+10FFFF, surrogates excluded) in a set of contexts against the
   reference and collects the code points on which the engine's IDs differ -- the *guard set*;
2. caches that set on disk (``$DELTA_RAY_CACHE/guard`` or ``~/.cache/delta_ray/guard``), keyed by
   (tokenizer digest, tokenizers version, engine name + version, probe format);
3. hands it to :class:`delta_ray._engine.guard.GuardSet`, whose ``allows(text)`` lets the fast engine
   encode a text only when it holds none of the guarded code points; the admission battery that
   follows is :mod:`delta_ray._verify.guard_battery`.

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
:func:`delta_ray._verify.probe_contexts.derived_contexts`: the two below, then a chain that puts ``c`` next
to a representative of every class the pattern distinguishes and after a contraction witness
(``" I'"``). Code points that some engine may case-fold into a ``(?i:...)`` group are guarded
wholesale (:func:`delta_ray._verify.probe_contexts.fold_sensitive_code_points`):

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

import contextlib
import hashlib
import json
import os
import time
import unicodedata
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from .._core.reference_api import encode_batch_ids, tokenizer_from_str
from .._engine.guard import GuardSet, guard_from_ranges, ranges_digest, valid_guard_payload
from .._engine.native import FastEncoder, FastEngineUnavailable, engine_key
from .._runtime.cache_store import load_record, save_record
from .._runtime.exit_guard import checkpoint
from .probe_contexts import BASE_CONTEXTS, derived_contexts, fold_sensitive_code_points

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





def _pick_separator(tokenizer_json: dict) -> tuple[str, int]:
    """The shortest special added token that is matched verbatim with no stripping (a ``normalized``
    one too when the normalizer is the identity: it is then matched on the text as it is)."""
    norm = tokenizer_json.get("normalizer")
    identity = norm is None or (norm.get("type") == "Sequence" and not norm.get("normalizers"))
    cands = []
    for t in tokenizer_json.get("added_tokens") or []:
        if (t.get("special") and (identity or not t.get("normalized")) and not t.get("lstrip") and not t.get("rstrip")
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
    return encode_batch_ids(ref_tokenizer, texts, False)


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


@contextlib.contextmanager
def _cancel_queued_on_error(pool):
    """On any exception (an exit's :class:`~delta_ray._runtime.exit_guard.ExitCancelled` included), drop the
    reference slices still queued: the pool's shutdown then waits only for those already running."""
    try:
        yield
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        raise


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
    t0 = time.perf_counter()
    fast_encode = fast.encode_pieces if isinstance(fast, FastEncoder) else fast
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
    with ThreadPoolExecutor(max_workers=n_workers) as pool, _cancel_queued_on_error(pool):
        pending = None
        for texts, owners in _probe_texts(cps, contexts, pairs):
            checkpoint()  # between native calls: a background probe stops here when the process exits
            batch = prepare(texts, owners, pool)
            del texts, owners
            if pending is not None:
                finish(pending)
            pending = batch
        if pending is not None:
            finish(pending)
        del pending
        if alone:
            checkpoint()
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
    # in the key already: no need to parse a 10 MB tokenizer.json to look a cached verdict up. The
    # engine's module builds the rest (the tokenizer, the reference's version, the engine's).
    if fast is not None:
        backend, backend_version = fast.backend, fast.backend_version
    return {"format": GUARD_FORMAT, **engine_key(tokenizer_json_bytes, backend, backend_version)}


def _load_cached(key: dict) -> GuardSet | None:
    doc = load_record("guardset", key, validate=valid_guard_payload)
    if doc is None:
        return None
    return guard_from_ranges(doc["ranges"], key, {**doc["stats"], "cached": True})


def _store(guard: GuardSet) -> None:
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
    point but the surrogates; tens of seconds) and stored. ``code_points`` restricts the probe to
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
        ref_tokenizer = tokenizer_from_str(data.decode("utf-8"))
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
    # wholesale, whatever the probe saw (see probe_contexts and docs/proof.md §8).
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


