"""The case-insensitive groups of a tokenizer's split patterns, and what may fold into them.

``(?i:'s|'t|...)`` matches letters by case folding, and regex engines fold differently. Both the
class verification (tokenizers 1.x, :mod:`delta_ray._core.class_verify`) and the fast tier's probe
(:mod:`delta_ray._verify.probe_contexts`) need the same facts about these groups; they live here, read
from the pattern text alone.
"""
from __future__ import annotations

import re
from typing import Any, Iterable

_GROUP_START = "(?i:"


def split_patterns(tokenizer_json: dict[str, Any]) -> list[str]:
    """Every ``Split`` regex of the pre-tokenizer, in order (nested Sequences included)."""
    out: list[str] = []

    def walk(cfg: object) -> None:
        if not isinstance(cfg, dict):
            return
        if cfg.get("type") == "Split":
            pat = cfg.get("pattern") or {}
            if isinstance(pat, dict) and isinstance(pat.get("Regex"), str):
                out.append(pat["Regex"])
        for sub in cfg.get("pretokenizers") or []:
            walk(sub)

    walk(tokenizer_json.get("pre_tokenizer"))
    return out


def case_insensitive_groups(patterns: Iterable[str]) -> list[str]:
    """The bodies of every ``(?i:...)`` group in the patterns (parentheses balanced, escapes skipped)."""
    groups: list[str] = []
    for pat in patterns:
        start = pat.find(_GROUP_START)
        while start >= 0:
            i, depth = start + len(_GROUP_START), 1
            while i < len(pat) and depth:
                ch = pat[i]
                if ch == "\\":
                    i += 2
                    continue
                depth += (ch == "(") - (ch == ")")
                i += 1
            groups.append(pat[start + len(_GROUP_START):i - 1])
            start = pat.find(_GROUP_START, i)
    return groups


def alternatives(group: str) -> list[str]:
    """The alternatives of a group body (split at unescaped ``|``), empty ones dropped."""
    return [a for a in re.split(r"(?<!\\)\|", group) if a]


def fold_letters(patterns: Iterable[str]) -> frozenset[str]:
    """Lower-case ASCII letters that appear inside a case-insensitive group."""
    return frozenset(ch.lower() for g in case_insensitive_groups(patterns) for ch in g
                     if ch.isascii() and ch.isalpha())


def letter_runs(groups: list[str]) -> set[str]:
    """Every contiguous run of two or more letters inside the groups' alternatives, lower-cased."""
    runs = set()
    for g in groups:
        for alt in alternatives(g):
            for word in re.findall(r"[A-Za-z]+", alt):
                w = word.lower()
                runs |= {w[i:j] for i in range(len(w)) for j in range(i + 2, len(w) + 1)}
    return runs


def unicode_folds(letters: frozenset[str], runs: set[str]) -> set[int]:
    """Code points Unicode's case mappings can match to a group's letters, in any engine that
    matches whole code points: a single-character mapping onto a group letter (U+017F -> s), or a
    multi-character mapping onto a run of letters the pattern spells (none for the contractions:
    U+00DF -> ss or U+FB06 -> st spell nothing in 's|'t|'re|'ve|'m|'ll|'d)."""
    out = set()
    for cp in range(0x80, 0x110000):
        if 0xD800 <= cp < 0xE000:
            continue
        ch = chr(cp)
        for mapped in (ch.casefold(), ch.lower(), ch.upper(), ch.title()):
            if mapped == ch:
                continue
            m = mapped.lower()
            if (len(mapped) == 1 and m in letters) or (len(mapped) > 1 and m in runs):
                out.add(cp)
                break
    return out
