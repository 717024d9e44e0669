"""Differential checking against the reference: every fast-path test funnels through here."""
from __future__ import annotations

import itertools
from typing import Iterable, Sequence

from tokenizers import Tokenizer

from delta_ray._core.cut_predicate import CutPredicate
from delta_ray._core.reference_api import added_token_contents

# Fragments that stress each guard: normalization (decomposed accents, U+0958, Hangul jamo,
# reordering marks), the regex families (contractions, digit runs, whitespace and CR/LF runs,
# punctuation before newlines, case changes, CJK/kana next to Latin), and emoji with ZWJ.
ADVERSARIAL = [
    "a", "Z", "é", "e\u0301", "\u0301", "\u0335", "\u0301\u0335", "\u093c", "\u0958", "\u0958/",
    "\u0915\u093f", "\u1100", "\u1161", "\u11a8", "\uac00", "\u1100\u1161\u11a8", " ", "  ", "   ",
    "\t", "\n", "\n\n", "\r\n", "\r", " \n", "\n  ", "'", "'s", "'LL", "n't", "don't", "5", "12",
    "1234", "12345", ".", "...", "!?", ".\n", "},\r\n", "中", "文字", "あ", "カタカナ", "ー", "😀",
    "\u200d", "👩\u200d💻", "\u00a0", "ſ", "Hello", "WORLD", "helloWorld", "x", "-", "_", "(",
    "\u3000", "\u2028", "١٢", "ـ", "ا", "\u0644\u0627", "\uff5c", "\u2581", "[", "]", "<", ">",
    "|", "/", "//", "ǅ", "ʰ", "\u0345", "\U0001F3FB", "\ufeff", "\u00ad", "Å", "A\u030a", "\u212b",
    "\u0d4c", "\u0d46\u0d57", "\u0b47\u0b3e", "\u30ab\u3099", "\u304b\u3099", "\u2000", "\u1e9b\u0323",
    # case-insensitive contraction groups: a letter run whose "W'" is a token, then fold variants
    " I'", " I", "'\u017f", "\u00df", "\ufb06", "\u212a", "'S", "'Ll", " I'\u017f",
]

# Class representatives for the exhaustive tier.
REPRESENTATIVES = ["a", "B", "ǅ", "ʰ", "中", "カ", "5", "٣", " ", "\t", "\n", "\r", "'", ".", "/",
                   "\u0301", "\u0958", "\u1161", "😀", "\u200d", "<", "\u00a0", "\uac00", "\u0915"]


CONFIGS: dict[int, dict] = {}  # id(reference) -> its tokenizer.json (tokenizers 1.x lists no added tokens)


def special_fragments(ref: Tokenizer, limit: int = 6) -> list[str]:
    """Added-token strings whole, truncated, overlapping and adjacent."""
    added = added_token_contents(ref, CONFIGS.get(id(ref)))
    added.sort(key=len, reverse=True)
    picks = added[:limit // 2] + added[-(limit // 2):]
    out = []
    for t in picks:
        out += [t, t[:-1], t[1:], t[: len(t) // 2], t[len(t) // 2:], t + t, t[:-1] + t, t[0] + t]
    return out


class Battery:
    """Collects (text, cut) checks and runs them against the reference in batches.

    Besides the IDs it compares the pre-tokenized pieces (the reference's word ids): a cut that
    moves a piece boundary is a predicate bug even where BPE happens to give equal IDs.
    """

    def __init__(self, ref: Tokenizer, pieces: bool = True, skip: int = 0):
        """``pieces=False`` compares IDs only: for cuts the model's guard makes inside one piece.
        ``skip``: characters the piece after a cut leaves out (``CutPredicate.piece_skip``)."""
        self.ref = ref
        self.pieces = pieces
        self.skip = skip
        self._cache: dict[str, tuple[list[int], list[int]]] = {}

    def signatures(self, texts: Iterable[str]) -> list[tuple[list[int], list[int]]]:
        texts = list(texts)
        missing = [t for t in dict.fromkeys(texts) if t not in self._cache]
        for i in range(0, len(missing), 4096):
            batch = missing[i:i + 4096]
            for t, enc in zip(batch, self.ref.encode_batch(batch, add_special_tokens=False)):
                w = getattr(enc, "word_ids", None)  # tokenizers 1.x has no word ids: the IDs alone
                starts = [j for j in range(len(w)) if j == 0 or w[j] != w[j - 1]] if w is not None else []
                self._cache[t] = (enc.ids, starts)
        return [self._cache[t] for t in texts]

    def ids(self, texts: Iterable[str]) -> list[list[int]]:
        return [sig[0] for sig in self.signatures(texts)]

    def clear(self):
        self._cache.clear()

    def _joined_equal(self, whole: str, left: str, right: str) -> bool:
        (iw, sw), (il, sl), (ir, sr) = self._cache[whole], self._cache[left], self._cache[right]
        return iw == il + ir and (not self.pieces or sw == sl + [len(il) + j for j in sr])

    def cut_failures(self, pairs: Sequence[tuple[str, int]]) -> list[tuple[str, int]]:
        """Pairs (text, b) where the encoding of text is not that of its two pieces at b
        (:func:`delta_ray._core.plan.split_at`: text[:b], then text[b:] less ``skip`` characters)."""
        k = self.skip
        self.signatures(t for text, b in pairs for t in (text, text[:b], text[b + k:]))
        return [(text, b) for text, b in pairs if not self._joined_equal(text, text[:b], text[b + k:])]

    def continuation_failures(self, triples: Sequence[tuple[str, int, str]]) -> list[tuple[str, int, str]]:
        """(stored, b, delta) where stored+delta does not encode as stored[:b] then its piece from b."""
        k = self.skip
        self.signatures(t for s, b, d in triples for t in (s + d, s[:b], (s + d)[b + k:]))
        return [(s, b, d) for s, b, d in triples if not self._joined_equal(s + d, s[:b], (s + d)[b + k:])]


def chat_messages(real_texts: dict, n_msgs: int, start: int = 0) -> list[str]:
    """ChatML messages of 300-1,400 characters cut from the shipped real texts (prose, code,
    multilingual), alternating user and assistant: a session's turns, deterministic."""
    src = real_texts["english"] + real_texts["code"] + real_texts["multilingual"]
    out = []
    for i in range(start, start + n_msgs):
        body = src[(i * 977) % (len(src) - 1500):][:300 + (i * 131) % 1100]
        out.append(f"<|im_start|>{'user' if i % 2 == 0 else 'assistant'}\n{body}<|im_end|>\n")
    return out


def accepted_cuts(pred: CutPredicate, text: str, open_end: bool = False) -> list[int]:
    """Every position the predicate accepts (for continuations: with evidence inside the text)."""
    out = []
    for b in range(1, len(text)):
        span = pred.check(text, b, open_end)
        if span is not None and (not open_end or span[1] <= len(text)):
            out.append(b)
    return out


def all_strings(alphabet: Sequence[str], max_len: int) -> Iterable[str]:
    for n in range(2, max_len + 1):
        for combo in itertools.product(alphabet, repeat=n):
            yield "".join(combo)


def class_representatives(table, per_class: int = 2, seed: int = 0) -> list[str]:
    """Up to ``per_class`` code points of every class a transition table names (the lowest assigned
    one and a random other), so that exhaustive strings reach every pair of classes."""
    import numpy as np

    classes = np.asarray(table.class_table())
    rnd = np.random.default_rng(seed)
    out: list[str] = []
    for c in np.unique(classes).tolist():
        members = np.flatnonzero(classes == c)
        members = members[(members < 0xD800) | (members > 0xDFFF)]
        if len(members) == 0:
            continue
        picks = {int(members[0])} | {int(x) for x in rnd.choice(members, size=min(per_class - 1, len(members)),
                                                                replace=False)}
        out.extend(chr(cp) for cp in sorted(picks))
    return out
