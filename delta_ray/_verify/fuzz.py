"""A differential fuzzer: the fast engine behind its guard against the reference, on generated text.

The probe (:mod:`delta_ray._verify.guard_probe`) tests one code point at a time in derived contexts; the fuzzer
tests what the probe's model of an engine leaves out: interactions of several characters, case
variants of the case-insensitive groups, special-token strings (whole, truncated, overlapping) and
real text. Texts are random concatenations of fragments drawn from

* one representative of each class the pattern distinguishes, with the leading characters its
  alternatives admit (:data:`delta_ray._verify.probe_contexts.CLASS_NEIGHBOURS`, the guard's alphabets);
* every letter of every ``(?i:...)`` group in both cases, every alternative in several case
  variants, the contraction witness, and the fold-sensitive code points;
* the tokenizer's added tokens, whole, truncated and overlapping;
* fragments of real English, code and multilingual text.

Texts the guard does not allow are skipped: they never reach the engine. A disagreement is shrunk
to a minimal text; the caller then guards its non-ASCII code points or refuses the engine. It runs
at admission for a bounded time, for a few seconds in CI's default tier, and for a million
comparisons per tokenizer and engine in the slow tier.
"""
from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from .._core.case_groups import case_insensitive_groups, fold_letters, split_patterns
from .guard_battery import ALPHABETS, REAL_TEXT
from .probe_contexts import CLASS_NEIGHBOURS, contraction_witness, fold_sensitive_code_points

EncodeFn = Callable[[list[str]], list[np.ndarray]]


@dataclass
class FuzzResult:
    """What a fuzz run compared and the minimal texts on which the engines disagreed."""

    comparisons: int = 0
    skipped: int = 0
    seconds: float = 0.0
    disagreements: list[str] = field(default_factory=list)


def _case_variants(s: str, rng: random.Random, n: int = 3) -> list[str]:
    out = {s, s.upper(), s.lower()}
    for _ in range(n):
        out.add("".join(ch.upper() if rng.random() < 0.5 else ch.lower() for ch in s))
    return sorted(out)


def fuzz_alphabet(tokenizer_json: dict, added_tokens: Sequence[str], *, seed: int = 0) -> list[str]:
    """The fragments the fuzzer concatenates, derived from this tokenizer's pipeline."""
    rng = random.Random(seed)
    frags: list[str] = list(CLASS_NEIGHBOURS)
    frags += [v for vals in ALPHABETS.values() for v in vals]
    patterns = split_patterns(tokenizer_json)
    groups = case_insensitive_groups(patterns)
    if groups:
        witness = contraction_witness(tokenizer_json)
        frags += [witness, witness + "'", witness.strip()]
        for letter in sorted(fold_letters(patterns)):
            frags += [letter, letter.upper()]
        for g in groups:
            for alt in g.split("|"):
                frags += _case_variants(alt, rng)
        frags += [chr(c) for c in sorted(fold_sensitive_code_points(tokenizer_json))]
    specials = sorted(set(added_tokens), key=lambda s: (len(s), s))
    if len(specials) > 24:
        step = (len(specials) - 1) / 23
        specials = sorted({specials[round(i * step)] for i in range(24)})
    for s in specials:
        frags += [s, s[:-1], s[1:], s[: len(s) // 2], s + s[1:]]
    words = REAL_TEXT.replace("\n", " \n ").split(" ")
    frags += [w for w in words if w] + [" " + w for w in words if w]
    return [f for f in frags if f]


def generate(rng: random.Random, alphabet: Sequence[str], n: int, max_parts: int = 12) -> list[str]:
    """``n`` random concatenations of 1..max_parts fragments."""
    k = len(alphabet)
    return ["".join(alphabet[rng.randrange(k)] for _ in range(rng.randint(1, max_parts))) for _ in range(n)]


def _differs(text: str, reference: EncodeFn, engine: EncodeFn) -> bool:
    try:
        return not np.array_equal(reference([text])[0], engine([text])[0])
    except Exception:  # noqa: BLE001 - a text the reference refuses is not a disagreement
        return False


def shrink(text: str, reference: EncodeFn, engine: EncodeFn, allows: Callable[[str], bool],
           budget: int = 400) -> str:
    """A shorter text on which the engines still disagree (greedy removal of spans, then characters)."""
    cur = text
    span = max(1, len(cur) // 2)
    while span >= 1 and budget > 0:
        i, changed = 0, False
        while i < len(cur) and budget > 0:
            cand = cur[:i] + cur[i + span:]
            budget -= 1
            if cand and allows(cand) and _differs(cand, reference, engine):
                cur, changed = cand, True
            else:
                i += span
        if not changed:
            span //= 2
    return cur


def fuzz(reference: EncodeFn, engine: EncodeFn, alphabet: Sequence[str], *,
         allows: Callable[[str], bool] = lambda t: True, seconds: float | None = None,
         comparisons: int | None = None, seed: int = 0, batch: int = 4096, max_parts: int = 12,
         max_disagreements: int = 8) -> FuzzResult:
    """Compare ``engine`` with ``reference`` on generated texts until the time or count budget ends."""
    if seconds is None and comparisons is None:
        raise ValueError("give seconds= or comparisons=")
    rng = random.Random(seed)
    res = FuzzResult()
    t0 = time.perf_counter()
    while True:
        if seconds is not None and time.perf_counter() - t0 >= seconds:
            break
        if comparisons is not None and res.comparisons >= comparisons:
            break
        texts = generate(rng, alphabet, batch, max_parts)
        kept = [t for t in texts if allows(t)]
        res.skipped += len(texts) - len(kept)
        if not kept:
            continue
        want = reference(kept)
        got = engine(kept)
        res.comparisons += len(kept)
        for t, w, g in zip(kept, want, got):
            if not np.array_equal(w, g):
                res.disagreements.append(shrink(t, reference, engine, allows))
                if len(res.disagreements) >= max_disagreements:
                    res.seconds = time.perf_counter() - t0
                    return res
    res.seconds = time.perf_counter() - t0
    return res
