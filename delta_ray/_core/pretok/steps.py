"""A ``tokenizer.json`` pre-tokenizer, read as a list of split steps the cut rule understands.

Every step the reference runs is a split of each current piece by a pattern's matches, followed by
one way of folding matches and the gaps between them into pieces (``SplitDelimiterBehavior``):

* ``Split``: its regex (or plain string, matched literally), behavior and ``invert``;
* ``ByteLevel(use_regex=true)``: GPT-2's pattern (``GPT2_PATTERN``, the one the reference compiles),
  isolated; its byte mapping acts per piece and moves no boundary;
* ``Digits``: each numeric character (the reference's predicate) is a match, isolated when
  ``individual_digits``, else contiguous;
* ``Punctuation``: each punctuation character, with its behavior;
* ``WhitespaceSplit``: each whitespace character, removed; ``Whitespace``: its regex ``\\w+|[^\\w\\s]+``,
  inverted and removed.

Anything else is refused with its reason.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .positions import Facts, analyze
from .regex_syntax import Atom, Unsupported, literal_tree, parse

#: The pattern ``ByteLevel(use_regex=true)`` splits with (tokenizers' ``pre_tokenizers/byte_level.rs``).
GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
WHITESPACE_PATTERN = r"\w+|[^\w\s]+"
BEHAVIORS = ("removed", "isolated", "merged_with_previous", "merged_with_next", "contiguous")


@dataclass(frozen=True)
class Step:
    """One split: the facts of its pattern, how matches fold into pieces, and whether it is inverted."""

    facts: Facts
    behavior: str
    invert: bool = False
    label: str = ""


_NEVER = Facts((), frozenset(), frozenset(), frozenset(), frozenset())  # a step that never splits


def _predicate_step(name: str, behavior: str, label: str) -> Step:
    atom = Atom(f"<{name}>")  # a predicate atom: its members come from the reference's step itself
    facts = Facts((atom,), frozenset(), frozenset((0,)), frozenset((0,)), frozenset())
    return Step(facts, behavior, False, label)


def _behavior(step: dict[str, Any]) -> str:
    b = str(step.get("behavior", "isolated")).lower()
    aliases = {"mergedwithprevious": "merged_with_previous", "mergedwithnext": "merged_with_next"}
    b = aliases.get(b.replace("_", ""), b)
    if b not in BEHAVIORS:
        raise Unsupported(f"split behavior {step.get('behavior')!r}")
    return b


@dataclass(frozen=True)
class Pipeline:
    """What the cut rule reads of a normalizer and pre-tokenizer: the split steps, the one-to-one
    character map applied before them (``Replace`` of one character by one, ``Metaspace``'s space),
    whether bytes are mapped last, the character a piece after a cut must start with (a
    ``Metaspace`` that prepends its separator to a piece that does not start with it, a ``Prepend``
    normalizer that adds one to every section), and whether a piece after a cut leaves that
    character out (a ``Prepend`` writes it back)."""

    steps: tuple[Step, ...]
    byte_level: bool
    char_map: tuple[tuple[str, str], ...] = ()
    right_required: str | None = None
    prepends: bool = False


def read_normalizer(cfg: Any) -> tuple[tuple[tuple[str, str], ...], str | None]:
    """A normalizer made of one-character ``Replace`` steps and at most one one-character
    ``Prepend``: its character map (none: empty) and the character the ``Prepend`` leaves at the
    start of every section of text, as the later maps turn it (None without one)."""
    if cfg is None:
        return (), None
    items = cfg.get("normalizers") if cfg.get("type") == "Sequence" else [cfg]
    if [n.get("type") for n in items or []] == ["NFC"]:
        return (), None  # not a character map: the cut predicate's NFC guard covers it (_core/cut_predicate.py)
    out: list[tuple[str, str]] = []
    prepend: str | None = None
    for n in items or []:
        if n.get("type") == "Prepend":
            p = n.get("prepend")
            if prepend is not None or not isinstance(p, str) or len(p) != 1:
                raise Unsupported("a Prepend normalizer that is not one character, or more than one")
            prepend = p
            continue
        if n.get("type") != "Replace":
            raise Unsupported(f"normalizer {n.get('type')!r} is not a one-character map")
        pat, content = n.get("pattern") or {}, n.get("content")
        if "String" not in pat or len(pat["String"]) != 1 or not isinstance(content, str) or len(content) != 1:
            raise Unsupported("a Replace normalizer that is not one character by one")
        out.append((pat["String"], content))
        if prepend == pat["String"]:  # a map after the Prepend turns the character it added
            prepend = content
    return tuple(out), prepend


def read_pipeline(normalizer: Any, pre_tokenizer: Any) -> Pipeline:
    """The steps, character map and constraints of a normalizer (one-character maps, a ``Prepend``)
    and pre-tokenizer."""
    char_map, prepend = read_normalizer(normalizer)
    steps, byte_level = read_steps(pre_tokenizer)
    right = prepend  # a piece after a cut starts with the character the Prepend adds (docs/proof.md §3)
    if pre_tokenizer is not None and pre_tokenizer.get("type") == "Metaspace":
        if prepend is not None:
            raise Unsupported("a Prepend normalizer before a Metaspace pre-tokenizer")
        rep = pre_tokenizer.get("replacement", "\u2581")
        if not isinstance(rep, str) or len(rep) != 1:
            raise Unsupported("Metaspace with a replacement that is not one character")
        if pre_tokenizer.get("prepend_scheme", "always") not in ("always", "first", "never"):
            raise Unsupported(f"Metaspace prepend_scheme {pre_tokenizer.get('prepend_scheme')!r}")
        char_map = char_map + ((" ", rep),)
        if pre_tokenizer.get("prepend_scheme", "always") != "never":
            right = rep  # a piece that starts with the separator gets none prepended
    if prepend is not None and steps:
        raise Unsupported("a Prepend normalizer before a splitting pre-tokenizer")
    return Pipeline(tuple(steps), byte_level, char_map, right, prepend is not None)


def read_steps(cfg: Any) -> tuple[list[Step], bool]:
    """The split steps of a pre-tokenizer config and whether it ends with a byte-level mapping."""
    if cfg is None:
        return [], False
    flat = list(cfg.get("pretokenizers") or []) if cfg.get("type") == "Sequence" else [cfg]
    steps: list[Step] = []
    byte_level = False
    for i, step in enumerate(flat):
        t = step.get("type")
        if byte_level:
            raise Unsupported(f"pre-tokenizer step {t!r} after ByteLevel")
        if t == "Metaspace":
            if len(flat) != 1:
                raise Unsupported("Metaspace in a sequence of pre-tokenizers")
            if step.get("split", True):  # the separator is a match, merged with the piece after it
                sep = step.get("replacement", "\u2581")
                steps.append(Step(analyze(literal_tree(sep)), "merged_with_next", False, "Metaspace"))
            else:
                steps.append(Step(_NEVER, "isolated", False, "Metaspace"))
            continue
        if t == "Split":
            pat = step.get("pattern") or {}
            if "Regex" in pat:
                tree, label = parse(pat["Regex"]), f"Split({pat['Regex']!r})"
            elif "String" in pat:
                tree, label = literal_tree(pat["String"]), f"Split(string {pat['String']!r})"
            else:
                raise Unsupported("Split without a pattern")
            steps.append(Step(analyze(tree), _behavior(step), bool(step.get("invert", False)), label))
        elif t == "ByteLevel":
            if step.get("add_prefix_space"):
                raise Unsupported("ByteLevel add_prefix_space adds a space to every piece")
            if step.get("use_regex", True):
                steps.append(Step(analyze(parse(GPT2_PATTERN)), "isolated", False, "ByteLevel regex"))
            byte_level = True
        elif t == "Digits":
            individual = bool(step.get("individual_digits", False))
            steps.append(_predicate_step("digits", "isolated" if individual else "contiguous", "Digits"))
        elif t == "Punctuation":
            steps.append(_predicate_step("punctuation", _behavior(step), "Punctuation"))
        elif t == "WhitespaceSplit":
            steps.append(_predicate_step("whitespace", "removed", "WhitespaceSplit"))
        elif t == "Whitespace":
            steps.append(Step(analyze(parse(WHITESPACE_PATTERN)), "removed", True, "Whitespace"))
        else:
            raise Unsupported(f"pre-tokenizer step {t!r} is not covered")
    return steps, byte_level
