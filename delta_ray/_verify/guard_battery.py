"""The admission battery: real and adversarial texts a fast engine must encode exactly as the reference.

:func:`adversarial_battery` builds deterministic texts for one tokenizer (class alphabets, added-token
strings whole and cut, real multilingual text, long inputs that cross engine-internal thresholds);
:func:`verify_fast_engine` compares the engine with the reference on them, as one batch and again one
text at a time in reverse order.
"""
from __future__ import annotations

import random
from typing import Iterable

import numpy as np

from .._core.reference_api import added_token_contents, encode_batch_ids
from .._engine.guard import GuardSet
from .._runtime.exit_guard import checkpoint

REAL_TEXT = (
    "The quick brown fox jumps over the lazy dog. It's 12:45 and we've got 3,000,000 reasons to "
    "stay -- don't we? Mr. O'Neil's café served crème brûlée in Zürich.\n\n"
    "def encode(self, text: str) -> list[int]:\n    return [ord(c) for c in text]  # TODO\r\n"
    "\tif (x != 0 && y >= 10) { return -1; }\n"
    "Москва — столица России. Ελληνικά γράμματα. עברית מימין לשמאל. العربية ١٢٣.\n"
    "日本語のテキストと English が混ざる。中文句子，还有标点！한국어 문장입니다.\n"
    "हिन्दी में लिखा गया वाक्य। ภาษาไทยไม่มีช่องว่าง Tiếng Việt có dấu.\n"
)

ALPHABETS: dict[str, list[str]] = {
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


def _special_strings(ref_tokenizer, config: dict | None = None) -> list[str]:
    return added_token_contents(ref_tokenizer, config)


def adversarial_battery(ref_tokenizer, *, seed: int = 0, n_random: int = 1000,
                        config: dict | None = None) -> list[str]:
    """Deterministic adversarial texts for this tokenizer (special-token strings included; under
    tokenizers 1.x they are read from ``config``, the tokenizer.json)."""
    rng = random.Random(seed)
    specials = all_specials = _special_strings(ref_tokenizer, config)
    if len(specials) > 12:  # a spread of them: shortest, longest and between
        step = (len(specials) - 1) / 11
        specials = sorted({sorted(specials, key=len)[round(i * step)] for i in range(12)})
    alph = dict(ALPHABETS)
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
    out += ([s + "\n" for s in all_specials] + [" " + s + " " for s in all_specials]
            + ["x" + s + "y" for s in all_specials])
    out += REAL_TEXT.splitlines(keepends=True) + [REAL_TEXT]
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
    filler = (REAL_TEXT * 40)[:5000]
    out += [filler + " " * 700 + "x" + filler[:2000], filler + " " * 701, filler + " " * 700 + "\n",
            filler + " " * 700 + "\tx", "a" * 3000, " " * 5000 + "b", ("ab1 " * 6000), (REAL_TEXT * 30)]
    return out


def _utf8_ok(text: str) -> bool:
    """Texts with lone surrogates are refused by both engines alike; the battery leaves them out."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def verify_fast_engine(ref_tokenizer, fast_encoder, texts: Iterable[str] = (), *,
                       guard: GuardSet | None = None, seed: int = 0,
                       config: dict | None = None) -> tuple[bool, str]:
    """Admission battery: ``fast_encoder`` must equal the reference on real + adversarial texts.

    ``texts`` (e.g. a sample of the workload) come first, then :func:`adversarial_battery`. With
    ``guard``, texts it does not allow are skipped (they will never reach the engine). The battery is
    encoded as one batch, then again one text at a time in reverse order, so an engine whose answer
    depends on what it encoded before is caught. Returns ``(ok, reason)``.
    """
    battery = [t for t in texts if _utf8_ok(t)] + adversarial_battery(ref_tokenizer, seed=seed, config=config)
    skipped = 0
    if guard is not None:
        kept = [t for t in battery if guard.allows(t)]
        skipped = len(battery) - len(kept)
        battery = kept
    try:
        expected = encode_batch_ids(ref_tokenizer, battery, False)
    except Exception as exc:  # noqa: BLE001
        return False, f"the reference rejected a battery text: {exc}"
    try:
        got_batch = fast_encoder.encode_pieces(battery)
        got_single = [None] * len(battery)
        for i in range(len(battery) - 1, -1, -1):
            checkpoint()  # one native call per text: a background admission stops here at exit
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
                               f"text={battery[i][:80]!r} reference={e[at:at + 6].tolist()} "
                               f"fast={g[at:at + 6].tolist()}")
    return True, f"{len(battery)} texts equal to the reference ({skipped} skipped by the guard)"


