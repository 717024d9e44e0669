"""Safe-cut transitions derived from the pre-tokenizer's own steps (delta_ray/_core/pretok), against
the reference: the five hand-written families reproduced or tightened, every step kind and split
behavior checked exhaustively over class representatives, and controls that make the battery fail."""
from __future__ import annotations

import json

import numpy as np
import pytest

from delta_ray import DeltaTokenizer
from delta_ray._core.cut_predicate import CutPredicate
from delta_ray._core.families import CLASS_NAMES, FAMILIES, UNV
from delta_ray._core.pretok.positions import analyze
from delta_ray._core.pretok.regex_syntax import Alt, Cat, Look, Repeat, Unsupported, parse
from delta_ray._core.pretok.steps import GPT2_PATTERN, Step, read_steps
from delta_ray._core.pretok.transitions import derive_from_steps, derive_transitions
from delta_ray._core.reference_api import FULL_API, tokenizer_from_str
from delta_ray._core.special_tokens import SpecialTokenIndex
from exactness import ADVERSARIAL, Battery, accepted_cuts, all_strings, class_representatives

pytestmark = pytest.mark.skipif(not FULL_API, reason="derivation needs the reference's regex engine (tokenizers 0.x)")


def _family_config(fam) -> dict:
    beh, inv = fam.split_behaviors[-1]
    return {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": p}, "behavior": beh.capitalize(), "invert": inv} for p in fam.patterns]
        + [{"type": "ByteLevel", "add_prefix_space": False, "use_regex": False}]}


def _compare(fam, derived):
    """(pairs the hand table accepts and the derivation does not, and the converse) over joint classes,
    each as the two hand class names and a representative pair of code points."""
    hand = fam.candidate_table()
    joint = hand.astype(np.int64) * 256 + derived.classes
    uj, rep = np.unique(joint, return_index=True)
    hc, dc = uj // 256, uj % 256
    ha = fam.accept_matrix[hc[:, None], hc[None, :]]
    da = derived.accept[dc[:, None], dc[None, :]]
    name = lambda i, j: (CLASS_NAMES[hc[i]], CLASS_NAMES[hc[j]], chr(rep[i]) + chr(rep[j]))  # noqa: E731
    return [name(i, j) for i, j in np.argwhere(ha & ~da)], [name(i, j) for i, j in np.argwhere(da & ~ha)]


# Every transition the derivation accepts beyond a hand table, by the hand table's classes, with the
# reason it is safe (docs/proof.md, "Derived transitions"); the battery below checks each on the reference.
GAINED = {
    # a letter run ends at a letter; no alternative consumes a letter then an apostrophe
    "qwen3": {("L", "APOS"), ("N", "APOS")},
    "qwen3.5": {("L", "APOS"), ("N", "APOS")},
    "llama3": {("L", "APOS"), ("N", "APOS")},
    # o200k: a lower-case run never continues into an upper-case letter (camelCase boundary)
    "o200k": {("L", "L"), ("N", "APOS")},
    # DeepSeek-V3: the CJK split (level 2) makes the boundary before a level-3 lookahead runs;
    # a character no level-3 alternative can end a match with is a gap before punctuation
    "deepseek-v3": {("CRLF", "K"), ("CRLF", "N"), ("G", "CRLF"), ("G", "PS"), ("G", "W"), ("PS", "L"),
                    ("W", "K"), ("W", "N")},
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_derivation_reproduces_or_extends_the_hand_tables(family):
    fam = FAMILIES[family]
    derived = derive_transitions({"pre_tokenizer": _family_config(fam)})
    lost, gained = _compare(fam, derived)
    # Only surrogates are lost: the derivation poisons them (no text the reference encodes holds one).
    assert all(any(0xD800 <= ord(c) <= 0xDFFF for c in pair) for _, _, pair in lost), lost
    assert {(x, y) for x, y, _ in gained} == GAINED[family], gained
    assert all(x != CLASS_NAMES[UNV] and y != CLASS_NAMES[UNV] for x, y, _ in gained)


def _tokenizer(base_path: str, pre_tokenizer: dict):
    cfg = json.load(open(base_path, encoding="utf-8"))
    cfg["pre_tokenizer"] = pre_tokenizer
    cfg["normalizer"] = None
    return tokenizer_from_str(json.dumps(cfg))


def _bl(steps, use_regex=False):
    return {"type": "Sequence", "pretokenizers": steps + [{"type": "ByteLevel", "add_prefix_space": False,
                                                          "use_regex": use_regex, "trim_offsets": False}]}


def _split(regex, behavior="Isolated", invert=False, string=None):
    pattern = {"String": string} if string is not None else {"Regex": regex}
    return {"type": "Split", "pattern": pattern, "behavior": behavior, "invert": invert}


# One pre-tokenizer of each step kind and split behavior the derivation covers.
KINDS = {
    "gpt2-bytelevel-regex": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True, "trim_offsets": False},
    "gaps": _bl([_split(r"\w+|\s+")]),
    "tekken": _bl([_split(r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|"
                          r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?"
                          r"[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")]),
    "deepseek-v2-digits": _bl([_split(r"[\r\n]"), _split(r"\s?[A-Za-z\u00c0-\u024f]+"), _split(r"\s?[!-/:-~]+"),
                               _split(r"[\u4e00-\u9fa5]+"),
                               {"type": "Digits", "individual_digits": True}]),
    "digit-runs": _bl([{"type": "Digits", "individual_digits": False}, _split(r"\s+|[^\s\d]+")]),
    "merged-with-previous": _bl([_split(None, "MergedWithPrevious", string=" ")]),
    "merged-with-next": _bl([_split(r"\s", "MergedWithNext")]),
    "contiguous": _bl([_split(r"\p{P}", "Contiguous")]),
    "removed-inverted": _bl([_split(r"\p{L}+|\p{N}+|\s+(?!\S)|\s+|[^\s\p{L}\p{N}]+", "Removed", invert=True)]),
    "punctuation-whitespace": _bl([{"type": "Punctuation", "behavior": "Isolated"}, {"type": "WhitespaceSplit"}]),
    "whitespace": _bl([{"type": "Whitespace"}]),
    "case-folded": _bl([_split(r"(?i:'s|'ll|'st)|\p{L}+|\s+(?!\S)|\s+|[^\s\p{L}]+")]),
    # DeepSeek V2's shape: trailing whitespace of a piece isolated by an end-of-line anchor
    "end-of-line": _bl([_split(r"[\r\n]"), _split(r"\s?\p{L}+"), _split(r"\s?[!-/:-~]+"), _split(r"\s+$"),
                        {"type": "Digits", "individual_digits": True}]),
    "end-of-input": _bl([_split(r"\s+\z|\p{L}+|\s|[^\s\p{L}]+")]),
}


@pytest.fixture(scope="module")
def kinds(tokenizer_paths):
    return {k: _tokenizer(tokenizer_paths["qwen-3"], pre) for k, pre in KINDS.items()}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_step_kind_exhaustively_over_its_classes(kind, kinds):
    """All strings of length 2-3 over two representatives of every derived class (plus adversarial
    fragments), cut at every accepted position, encode as their two parts (IDs and pieces)."""
    ref = kinds[kind]
    dt = DeltaTokenizer(ref, strict=True)
    pred = dt.core._predicate
    table = derive_transitions({"pre_tokenizer": KINDS[kind]})
    reps = class_representatives(table)
    texts = list(all_strings(reps, 3)) if len(reps) <= 40 else list(all_strings(reps, 2))
    texts += ["".join(t) for t in all_strings(ADVERSARIAL[::3], 2)]
    pairs = [(t, b) for t in texts for b in accepted_cuts(pred, t)]
    assert len(pairs) > 100, kind  # the derivation accepts cuts here: the test can fail
    assert Battery(ref).cut_failures(pairs) == []
    text = "".join(ADVERSARIAL) * 30
    assert dt.encode(text).to_pylist() == ref.encode(text, add_special_tokens=True).ids


def _without_lookaheads(node):
    if isinstance(node, Cat):
        items = tuple(_without_lookaheads(i) for i in node.items if not isinstance(i, Look))
        return items[0] if len(items) == 1 else Cat(items)
    if isinstance(node, Alt):
        return Alt(tuple(_without_lookaheads(o) for o in node.options))
    if isinstance(node, Repeat):
        return Repeat(_without_lookaheads(node.item), node.min, node.max)
    return node


def test_control_without_the_lookahead_condition_fails(tokenizer_paths, references):
    """Derived without the lookahead condition (``\\s+(?!\\S)`` read as ``\\s+``), the table accepts
    cuts that the reference does not keep: the battery reaches the case the condition is for."""
    ref = references["llama3.2"]
    cfg = json.load(open(tokenizer_paths["llama3.2"], encoding="utf-8"))["pre_tokenizer"]
    pattern = cfg["pretokenizers"][0]["pattern"]["Regex"]
    steps = [Step(analyze(_without_lookaheads(parse(pattern))), "isolated")]
    loose = CutPredicate(derive_from_steps(steps, name="control"), SpecialTokenIndex([]))
    exact = CutPredicate(derive_transitions({"pre_tokenizer": cfg}), SpecialTokenIndex([]))
    reps = class_representatives(derive_transitions({"pre_tokenizer": cfg}))
    texts = list(all_strings(reps, 3))
    assert Battery(ref).cut_failures([(t, b) for t in texts for b in accepted_cuts(loose, t)])
    assert Battery(ref).cut_failures([(t, b) for t in texts for b in accepted_cuts(exact, t)]) == []


@pytest.mark.parametrize("pattern, reason", [
    (r"(?<=a)b|\s+", "lookbehind"), (r"^\w+|\s+", "anchor"), (r"\w+\b|\s+", "word boundary"),
    (r"\w+\Z", "anchor"), (r"(?=a$)a", "inside a lookahead"),
    (r"\w*", "empty string"), (r"a++|\s", "possessive"), (r"(?i:[a-z])+", "class under (?i)"),
    (r"(?i:\p{L})", "under (?i)"), (r"(?i:é)", "non-ASCII literal"), (r"(a)\1", "back-reference"),
    (r"(?>ab)", "atomic"), (r"\R", "two characters"), (r"(?=(?!a)b)c", "inside a lookahead"),
    (r"(?=a)+", "quantified lookahead"), (r"a{20}", "exceeds"),
])
def test_constructs_outside_the_subset_are_refused_with_their_reason(pattern, reason):
    with pytest.raises(Unsupported, match=reason.replace("(", r"\(").replace(")", r"\)").replace("?", r"\?")):
        read_steps({"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False})
        analyze(parse(pattern))


def test_bytelevel_regex_is_the_references_own_pattern(tokenizer_paths):
    """``ByteLevel(use_regex=true)`` pieces equal those of ``Split(GPT2_PATTERN)`` then ``ByteLevel``:
    the derivation reads the pattern the reference compiles."""
    from tokenizers import Regex, pre_tokenizers
    text = "".join(ADVERSARIAL) * 3 + " don't  stop\n\n  12345 'LL"
    a = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True).pre_tokenize_str(text)
    b = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(GPT2_PATTERN), "isolated"),
                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
                                ).pre_tokenize_str(text)
    assert a == b


def test_end_anchors_are_the_lookaheads_the_derivation_reads():
    """``$`` is ``(?![^\\n])`` and ``\\z`` is ``(?![\\s\\S])`` on the reference's engine (Ruby syntax)."""
    from tokenizers import Regex, pre_tokenizers
    text = "".join(ADVERSARIAL) + " a \n b  \r\n  c\t\n\n  "
    texts = [text[i:j] for i in range(0, len(text), 7) for j in range(i + 1, len(text) + 1, 5)]
    for anchor, look in ((r"$", r"(?![^\n])"), (r"\z", r"(?![\s\S])")):
        a = pre_tokenizers.Split(Regex(r"\s+" + anchor + r"|\S+"), "isolated")
        b = pre_tokenizers.Split(Regex(r"\s+" + look + r"|\S+"), "isolated")
        assert all(a.pre_tokenize_str(t) == b.pre_tokenize_str(t) for t in texts)


def test_chained_replace_maps_class_a_character_by_its_final_image(tokenizer_paths):
    """``Replace(x, y)`` then ``Replace(y, " ")`` turns x into a space: x is cut as a space is. A
    class taken from y's own (one map only) would accept the cut between a space and "x", which a
    pre-tokenizer keeping runs of spaces whole does not keep."""
    normalizer = {"type": "Sequence", "normalizers": [
        {"type": "Replace", "pattern": {"String": "x"}, "content": "y"},
        {"type": "Replace", "pattern": {"String": "y"}, "content": " "}]}
    pre = _bl([_split(r"\w+|\s+")])
    cfg = json.load(open(tokenizer_paths["qwen-3"], encoding="utf-8"))
    cfg["pre_tokenizer"], cfg["normalizer"] = pre, normalizer
    ref = tokenizer_from_str(json.dumps(cfg))
    table = derive_transitions({"normalizer": normalizer, "pre_tokenizer": pre})
    assert table.classes[ord("x")] == table.classes[ord("y")] == table.classes[ord(" ")]
    pred = DeltaTokenizer(ref, strict=True).core._predicate
    texts = ["".join(t) for t in all_strings(["a", "x", "y", " ", "b"], 4)]
    pairs = [(t, b) for t in texts for b in accepted_cuts(pred, t)]
    assert len(pairs) > 100
    assert Battery(ref).cut_failures(pairs) == []
    one_map = table.classes.copy()
    one_map[ord("x")] = table.classes[ord("b")]  # y's class before the second map: a letter's
    loose = CutPredicate(type(table)(table.name, one_map, table.accept, table.byte_level, table.steps),
                         SpecialTokenIndex([]))
    extra = [(t, b) for t in texts for b in accepted_cuts(loose, t) if (t, b) not in pairs]
    assert extra and Battery(ref).cut_failures(extra)
