r"""Class tables under tokenizers 1.x: a candidate from the ``regex`` package, checked by the reference.

tokenizers 1.x exposes no regex engine and runs only the Split patterns it knows, so the class bits
of :mod:`delta_ray._core.charclass` come from the ``regex`` package there (the same ``\p{..}`` syntax, its
own Unicode tables). They are trusted only where the reference confirms them, code point by code
point, through its own pre-tokenizer:

1. **The reference's pieces, observable.** :func:`delta_ray._core.reference_api.split_probe_tokenizer`
   loads a tokenizer with the family's own Split stages and a WordLevel model: each piece becomes
   one ID (named when it is a known fragment, ``<unk>`` otherwise), probes are joined by a special
   added token (split off before pre-tokenization, so each probe is pre-tokenized alone).
2. **Contexts.** Every code point ``c`` is probed alone, doubled, next to a representative of every
   class the patterns distinguish on each side (Lu, Ll, Lt, Lm, Lo, M, N, one and two digits, space,
   two spaces, tab, CR, LF, punctuation, ``'``, ``/``, `` !``, ``'s``, ``x'``) and inside every
   case-insensitive alternative (each of its letters replaced by ``c``, then a letter).
3. **Prediction.** Code points with the same *signature* (candidate class bits, membership in each
   bracket expression of the patterns that names non-ASCII characters) are interchangeable for
   the patterns under the ``regex`` package; ASCII and case-fold-sensitive code points are their own
   groups. The pieces of each context are computed with the ``regex`` package once per group
   (Split semantics: Isolated, or Removed with invert) and mapped to IDs as the WordLevel model does.
4. **Verdict.** A code point is *verified* when the reference's IDs equal its group's prediction in
   every context; otherwise it is unverified, and :mod:`delta_ray._core.families` gives it a class next to
   which no cut is accepted (and the fast tier's guard sends texts holding it to the reference).

Before use, :func:`check_sensitivity` confirms that the contexts tell every pair of family classes
apart under the prediction, so a code point the reference places in another family class than the
candidate cannot look verified. docs/proof.md §10 gives the argument and its limits.
"""
from __future__ import annotations

import hashlib
import json
from functools import lru_cache, partial
from typing import Any, Final, Protocol, Sequence, cast

import numpy as np
import regex
from tokenizers import Tokenizer

from delta_ray._core import charclass as cc

from .case_groups import alternatives, case_insensitive_groups, fold_letters, letter_runs, unicode_folds
from .reference_api import PROBE_SEPARATOR, encode_batch_ids, split_probe_tokenizer
from .table_cache import cached_table

VERIFY_VERSION = 3
REPRESENTATIVES: tuple[str, ...] = (
    "a", "A", "\u01c5", "\u02b0", "\u4e2d", "\u0301", "1", "11", " ", "  ", "\t", "\r", "\n",
    "!", "'", "/", " !", "'s", "x'",
)
_BASE: Final = 128  # IDs per position in a probe's key (the vocabulary stays below it)
_MAX_PIECES: Final = 7  # a probe with more pieces is judged unverified (no context has that many)
_CHUNK = 1 << 16  # probes per reference call


class ClassFamily(Protocol):
    """What verification reads of a family (a :class:`delta_ray._core.families.Family`)."""

    @property
    def name(self) -> str: ...

    @property
    def patterns(self) -> tuple[str, ...]: ...

    @property
    def split_behaviors(self) -> tuple[tuple[str, bool], ...]: ...

    def candidate_table(self) -> np.ndarray: ...


def _stage_json(pattern: str, behavior: str, invert: bool) -> dict[str, Any]:
    return {"type": "Split", "pattern": {"Regex": pattern},
            "behavior": {"isolated": "Isolated", "removed": "Removed"}[behavior], "invert": invert}


def family_stages(family: ClassFamily) -> list[list[dict[str, Any]]]:
    """One Split-stage list per accepted behavior of the family (o200k: Isolated, and Removed+invert)."""
    return [[_stage_json(p, beh, inv) for p in family.patterns] for beh, inv in family.split_behaviors]


def _fold_contexts(patterns: Sequence[str]) -> list[str]:
    out = []
    for g in case_insensitive_groups(patterns):
        for alt in alternatives(g):
            for i, ch in enumerate(alt):
                if ch.isascii() and ch.isalpha():
                    t = alt[:i] + "{c}" + alt[i + 1:] + "a"
                    out += [t, "a" + t]
    return sorted(set(out))


def contexts(patterns: Sequence[str]) -> list[str]:
    """The probe templates (``{c}`` is the probed code point)."""
    out = ["{c}", "{c}{c}"]
    for r in REPRESENTATIVES:
        out += [r + "{c}", "{c}" + r]
    return out + _fold_contexts(patterns)


def _predictions(stages: list[dict[str, Any]], templates: Sequence[str], vocab: dict[str, int],
                 cps: Sequence[int]) -> np.ndarray:
    """Predicted key of every template (columns) for each code point (rows), with the ``regex`` package."""
    return np.array([[_key([vocab.get(p, 0) for p in _simulate(stages, t.replace("{c}", chr(cp)))])
                      for t in templates] for cp in cps], dtype=np.int64)


def _indistinct(pred: np.ndarray, fam_cls: np.ndarray) -> np.ndarray:
    """Pairs of rows in different family classes with the same prediction in every column."""
    same = np.ones((len(pred), len(pred)), dtype=bool)
    for j in range(pred.shape[1]):
        same &= pred[:, j][:, None] == pred[:, j][None, :]
    indistinct: np.ndarray = same & (fam_cls[:, None] != fam_cls[None, :])
    return indistinct


def _distinguishing(pred: np.ndarray, fam_cls: np.ndarray) -> list[int]:
    """A small set of template columns that gives different predictions to every pair of rows in
    different family classes that some column tells apart (greedy cover)."""
    n, m = pred.shape
    need = (fam_cls[:, None] != fam_cls[None, :]) & ~_indistinct(pred, fam_cls)
    chosen: list[int] = []
    while need.any():
        gains = [int((need & (pred[:, j][:, None] != pred[:, j][None, :])).sum()) for j in range(m)]
        j = int(np.argmax(gains))
        chosen.append(j)
        need &= ~(pred[:, j][:, None] != pred[:, j][None, :])
    return sorted(chosen)


def _fragments(templates: Sequence[str]) -> list[str]:
    """Every substring of every literal part of the templates: the pieces the WordLevel model names."""
    frags = set()
    for t in templates:
        for part in t.split("{c}"):
            frags |= {part[i:j] for i in range(len(part)) for j in range(i + 1, len(part) + 1)}
    return sorted(frags)


def _brackets(patterns: Sequence[str]) -> list[Any]:
    """Compiled bracket expressions of the patterns that name non-ASCII characters (DeepSeek's CJK range)."""
    out = []
    for pat in patterns:
        for m in regex.finditer(r"\[(?:\\.|[^\]\\])*\]", pat):
            if not m.group().isascii():
                out.append(regex.compile(m.group()))
    return out


def fold_sensitive_regex(patterns: Sequence[str]) -> set[int]:
    """Non-ASCII code points the ``regex`` package matches to a letter of a case-insensitive group."""
    letters = fold_letters(patterns)
    if not letters:
        return set()
    rx = regex.compile("(?i:[" + "".join(sorted(letters)) + "])")
    text, cps = cc.all_codepoints_text()
    return {int(cps[m.start()]) for m in rx.finditer(text) if cps[m.start()] >= 0x80}


def signatures(patterns: Sequence[str]) -> np.ndarray:
    """Group id per code point: equal ids behave alike for the patterns under the ``regex`` package."""
    bits = cc.class_table().astype(np.int64)
    text, cps = cc.all_codepoints_text()
    for k, rx in enumerate(_brackets(patterns)):
        inside = np.zeros(cc.N_CODEPOINTS, dtype=bool)
        for m in rx.finditer(text):
            inside[cps[m.start()]] = True
        bits |= inside.astype(np.int64) << (16 + k)
    own = np.arange(cc.N_CODEPOINTS, dtype=np.int64) + (1 << 40)  # a group of its own
    single = np.zeros(cc.N_CODEPOINTS, dtype=bool)
    single[:0x80] = True
    for ch in "".join(contexts(patterns)).replace("{c}", ""):  # context characters are named pieces
        single[ord(ch)] = True
    for cp in fold_sensitive_regex(patterns):
        single[cp] = True
    letters = fold_letters(patterns)
    if letters:  # Unicode's case mappings onto the group letters (what other engines may fold)
        for cp in unicode_folds(letters, letter_runs(case_insensitive_groups(patterns))):
            single[cp] = True
    return np.where(single, own, bits)


def _simulate(stages: list[dict[str, Any]], text: str) -> list[str]:
    """The pieces of ``text`` under Split stages, computed with the ``regex`` package."""
    pieces = [text]
    for st in stages:
        rx = _compiled(st["pattern"]["Regex"])
        removed, invert = st["behavior"] == "Removed", bool(st.get("invert"))
        nxt = []
        for p in pieces:
            spans, pos = [], 0
            for m in rx.finditer(p):
                if m.start() == m.end():
                    continue
                if m.start() > pos:
                    spans.append((pos, m.start(), False))
                spans.append((m.start(), m.end(), True))
                pos = m.end()
            if pos < len(p):
                spans.append((pos, len(p), False))
            for a, b, is_match in spans:
                delimiter = is_match != invert
                if removed and delimiter:
                    continue
                nxt.append(p[a:b])
        pieces = nxt
    return pieces


@lru_cache(maxsize=64)
def _compiled(pattern: str) -> Any:
    return regex.compile(pattern)


def _key(ids: Sequence[int]) -> int:
    if len(ids) > _MAX_PIECES:
        return -1
    k = 0
    for i, v in enumerate(ids):
        k += int(v) * _BASE ** i
    return k + len(ids) * _BASE ** _MAX_PIECES


def _keys_of_ids(ids: np.ndarray, n_probes: int) -> np.ndarray:
    """Per-probe keys from the IDs of probes joined by the separator (ID 1); -2 if the split is off."""
    ids = ids.astype(np.int64)
    is_sep = ids == 1
    if int(is_sep.sum()) != n_probes - 1:
        return np.full(n_probes, -2, dtype=np.int64)
    seg = np.cumsum(is_sep)[~is_sep]
    vals = ids[~is_sep]
    lens = np.bincount(seg, minlength=n_probes)
    starts = np.concatenate([[0], np.cumsum(lens)[:-1]])
    pos = np.arange(len(seg)) - starts[seg]
    ok = pos < _MAX_PIECES
    weights = vals[ok].astype(np.float64) * (float(_BASE) ** pos[ok])
    key = np.bincount(seg[ok], weights=weights, minlength=n_probes).astype(np.int64)
    key += lens.astype(np.int64) * _BASE ** _MAX_PIECES
    key[lens > _MAX_PIECES] = -1
    return key


def _joined(template: str, cps: np.ndarray) -> str:
    """``template`` with each code point of ``cps``, joined by the separator (built as UTF-32 rows)."""
    parts = template.split("{c}")
    sep = np.frombuffer(PROBE_SEPARATOR.encode("utf-32-le"), dtype=np.uint32)
    cols: list[np.ndarray | None] = []
    for i, p in enumerate(parts):
        cols += [np.uint32(ord(ch)) for ch in p]
        if i < len(parts) - 1:
            cols.append(None)
    rows = np.empty((len(cps), len(cols) + len(sep)), dtype=np.uint32)
    for j, col in enumerate(cols):
        rows[:, j] = cps if col is None else col
    rows[:, len(cols):] = sep
    return rows.reshape(-1)[:-len(sep)].tobytes().decode("utf-32-le")


def _reference_keys(tok: Tokenizer, template: str, cps: np.ndarray) -> np.ndarray:
    """The reference's key of ``template`` with each code point, batched through the separator."""
    out = np.empty(len(cps), dtype=np.int64)
    bounds = [(i, min(len(cps), i + _CHUNK)) for i in range(0, len(cps), _CHUNK)]
    texts = [_joined(template, cps[a:b]) for a, b in bounds]
    for (a, b), ids in zip(bounds, encode_batch_ids(tok, texts, False)):
        keys = _keys_of_ids(ids, b - a)
        if keys[0] == -2:  # the separator split is not trusted: probe by probe
            probes = [template.replace("{c}", chr(c)) for c in cps[a:b].tolist()]
            keys = np.array([_key(x.tolist()) for x in encode_batch_ids(tok, probes, False)], dtype=np.int64)
        out[a:b] = keys
    return out


def derive_verified(stages: list[dict[str, Any]], fam_cls: np.ndarray) -> np.ndarray:
    """Bool per code point: the reference's pieces equal the candidate classes' prediction everywhere.

    Every code point is probed in the templates that tell the family classes apart (``fam_cls``, the
    candidate family class per code point) and ``{c}`` alone; letters (and every code point that is
    its own group) also in all the other templates, the case-insensitive ones included.
    """
    patterns = [st["pattern"]["Regex"] for st in stages]
    templates = contexts(patterns)
    tok, vocab = split_probe_tokenizer(stages, _fragments(templates))
    sig = signatures(patterns)
    _text, cps = cc.all_codepoints_text()
    groups, first, inverse = np.unique(sig[cps], return_index=True, return_inverse=True)
    rep = cps[first].astype(np.int64)
    pred = _predictions(stages, templates, vocab, rep.tolist())
    core = set(_distinguishing(pred, fam_cls[rep])) | {0}
    # Fail closed: groups the contexts cannot tell from a group of another family class are never
    # verified (none for the five families; check_sensitivity reports them).
    blind = cast(np.ndarray, _indistinct(pred, fam_cls[rep]).any(axis=1))  # one bool per row
    bits = cc.class_table()
    wide = ((bits[cps] & cc.L) > 0) | (groups[inverse] >= (1 << 40))
    ok = ~blind[inverse]
    # Characters of the separator are probed one by one (a joined probe could form or break it).
    risky = np.isin(cps, np.frombuffer(PROBE_SEPARATOR.encode("utf-32-le"), dtype=np.uint32))
    for j, tmpl in enumerate(templates):
        sel = np.arange(len(cps)) if j in core else np.flatnonzero(wide)
        got = _reference_keys(tok, tmpl, cps[sel])
        r = np.flatnonzero(risky[sel])
        if len(r):
            alone = [tmpl.replace("{c}", chr(c)) for c in cps[sel][r].tolist()]
            got[r] = [_key(x.tolist()) for x in encode_batch_ids(tok, alone, False)]
        ok[sel] &= (got == pred[inverse[sel], j]) & (got >= 0)
    verified = np.zeros(cc.N_CODEPOINTS, dtype=bool)
    verified[cps[ok]] = True
    return verified


def stages_digest(stages: list[dict[str, Any]]) -> str:
    return hashlib.sha256(json.dumps(stages, sort_keys=True).encode()).hexdigest()[:16]


@lru_cache(maxsize=None)
def verified_mask(fam: ClassFamily) -> np.ndarray:
    """Bool per code point: verified under every accepted Split behavior of the family
    (a :class:`delta_ray._core.families.Family`; cached on disk)."""
    family_name = fam.name
    fam_cls = fam.candidate_table()
    mask = np.ones(cc.N_CODEPOINTS, dtype=bool)
    for stages in family_stages(fam):
        name = f"classverify-{family_name}-{stages_digest(stages)}-{cc.candidate_source()}"
        mask &= cached_table(name, VERIFY_VERSION, partial(derive_verified, stages, fam_cls),
                             (cc.N_CODEPOINTS,), np.bool_)
    return mask


def check_sensitivity(fam: ClassFamily) -> list[tuple[int, int]]:
    """Pairs of code points in different family classes whose predicted keys agree in every context.

    Empty when the contexts tell every realized pair of family classes apart (checked over one
    representative per signature group), so a code point the reference classes differently than the
    candidate cannot pass verification.
    """
    fam_cls = fam.candidate_table()
    out = []
    for stages in family_stages(fam):
        patterns = [st["pattern"]["Regex"] for st in stages]
        templates = contexts(patterns)
        _tok, vocab = split_probe_tokenizer(stages, _fragments(templates))
        _groups, first = np.unique(signatures(patterns), return_index=True)
        rep = [int(c) for c in first if not 0xD800 <= c < 0xE000]
        pred = _predictions(stages, templates, vocab, rep)
        bad = np.argwhere(np.triu(_indistinct(pred, fam_cls[rep])))
        out += [(rep[a], rep[b]) for a, b in bad.tolist()]
    return out
