"""The subset of Oniguruma's syntax that ``tokenizer.json`` split patterns use, parsed into a tree.

The tree keeps what the safe-cut derivation needs and nothing else: alternation, concatenation,
repetition (greedy or lazy: the derivation considers every path, so laziness cannot matter),
lookahead, and *atoms*, each a set of single characters given by its own source text. An atom's
members are never interpreted here: :mod:`delta_ray._core.pretok.atoms` asks the reference's own
regex engine which code points the atom's source matches, so the tree cannot disagree with the
engine about a class, a property or a case fold.

The end anchors are lookaheads: ``$`` (Ruby syntax: the end or a line feed next) is
``(?![^\\n])`` and ``\\z`` is ``(?![\\s\\S])``. Anything else whose meaning the derivation does not
cover is refused with its reason (:class:`Unsupported`): start anchors and boundaries
(``^ \\b \\A \\Z \\G``), lookbehind, atomic groups, possessive
quantifiers, back-references, inline flag switches other than a scoped ``(?i:...)``, ``\\R``/``\\X``
(which can match more than one character), and, under ``(?i)``, anything but ASCII literals and
case-free escapes (a class or a non-ASCII literal could match a multi-character case fold).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from ..errors import DeltaRayError

#: The most copies a bounded repetition ``{m,n}`` is expanded into (its minimum; the rest is ``*``).
MAX_REPEAT_MIN = 16


class Unsupported(DeltaRayError, ValueError):
    """A construct the safe-cut derivation does not cover; the message names it."""


@dataclass(frozen=True)
class Atom:
    """One character of the subject, matched by ``source`` (a standalone pattern) under ``fold``."""

    source: str
    fold: bool = False  # inside (?i:...): the engine evaluates ``(?i:source)``

    @property
    def pattern(self) -> str:
        """A pattern that matches exactly this atom's characters, one at a time."""
        return f"(?i:{self.source})" if self.fold else self.source


@dataclass(frozen=True)
class Cat:
    items: tuple[Node, ...]


@dataclass(frozen=True)
class Alt:
    options: tuple[Node, ...]


@dataclass(frozen=True)
class Repeat:
    item: Node
    min: int
    max: int | None  # None: unbounded


@dataclass(frozen=True)
class Look:
    """A lookahead ``(?=body)`` or ``(?!body)``: it reads the subject and consumes nothing."""

    negative: bool
    body: Node


#: A parsed pattern (:func:`parse`): a tree of these.
Node = Union[Atom, Cat, Alt, Repeat, Look]


_CASE_FREE_ESCAPES = set("sSdDwW")  # \h is a hex digit in Ruby syntax (case-dependent): refused under (?i)
_CLASS_ESCAPES = set("sSdDwWhH")
_CONTROL = {"n": "\n", "r": "\r", "t": "\t", "f": "\f", "v": "\v", "a": "\a", "e": "\x1b"}
_REFUSED_ESCAPES = {"b": "a word boundary", "B": "a word boundary", "A": "an anchor",
                    "Z": "an anchor", "G": "an anchor", "R": "\\R (it can match two characters)",
                    "X": "\\X (it can match several characters)", "K": "\\K", "k": "a back-reference",
                    "g": "a subexpression call", "y": "a grapheme boundary", "Y": "a grapheme boundary",
                    "O": "\\O", "N": "\\N", "c": "a control escape", "C": "a control escape", "M": "a meta escape"}


def literal_source(ch: str) -> str:
    """A standalone pattern matching exactly the character ``ch``."""
    if ch.isascii() and ch.isalnum():
        return ch
    return "\\x{%x}" % ord(ch)


def literal_char(pattern: str) -> str | None:
    """The character a case-sensitive literal atom's pattern (:func:`literal_source`) stands for, else None."""
    if len(pattern) == 1 and pattern.isascii() and pattern.isalnum():
        return pattern
    if pattern.startswith("\\x{") and pattern.endswith("}") and pattern[3:-1].isalnum():
        try:
            return chr(int(pattern[3:-1], 16))
        except ValueError:
            return None
    return None


class _Parser:
    def __init__(self, pattern: str):
        self.s = pattern
        self.i = 0

    def parse(self) -> Node:
        tree = self.alt(fold=False)
        if self.i != len(self.s):
            raise Unsupported(f"unbalanced ')' at {self.i} in {self.s!r}")
        return tree

    def peek(self) -> str:
        return self.s[self.i] if self.i < len(self.s) else ""

    def alt(self, fold: bool) -> Node:
        options = [self.cat(fold)]
        while self.peek() == "|":
            self.i += 1
            options.append(self.cat(fold))
        return options[0] if len(options) == 1 else Alt(tuple(options))

    def cat(self, fold: bool) -> Node:
        items: list[Node] = []
        while self.i < len(self.s) and self.peek() not in "|)":
            items.append(self.quantified(self.atom(fold)))
        return items[0] if len(items) == 1 else Cat(tuple(items))

    def quantified(self, item: Node) -> Node:
        while True:
            c = self.peek()
            if c in ("?", "*", "+"):
                self.i += 1
                lo, hi = {"?": (0, 1), "*": (0, None), "+": (1, None)}[c]
            elif c == "{" and (bounds := self.braces()) is not None:
                lo, hi = bounds
            else:
                return item
            nxt = self.peek()
            if nxt == "+":
                raise Unsupported(f"possessive quantifier at {self.i} in {self.s!r}")
            if nxt == "?":  # lazy: the same set of paths
                self.i += 1
            if isinstance(item, Look):
                raise Unsupported(f"a quantified lookahead at {self.i} in {self.s!r}")
            if lo > MAX_REPEAT_MIN:
                raise Unsupported(f"repetition minimum {lo} exceeds {MAX_REPEAT_MIN} in {self.s!r}")
            item = Repeat(item, lo, hi)

    def braces(self) -> tuple[int, int | None] | None:
        """``{m}``, ``{m,}``, ``{m,n}`` or ``{,n}`` at the cursor (consumed), else None (a literal ``{``)."""
        j = self.s.find("}", self.i)
        if j < 0:
            return None
        body = self.s[self.i + 1:j]
        lo_s, comma, hi_s = body.partition(",")
        if not (lo_s.isdigit() or (comma and lo_s == "")) or not (hi_s == "" or hi_s.isdigit()):
            return None
        if not lo_s and not hi_s:
            return None
        lo = int(lo_s) if lo_s else 0
        hi = (int(hi_s) if hi_s else None) if comma else lo
        if hi is not None and hi < lo:
            raise Unsupported(f"repetition {{{body}}} has max < min in {self.s!r}")
        self.i = j + 1
        return lo, hi

    def atom(self, fold: bool) -> Node:
        c = self.peek()
        if c == "(":
            return self.group(fold)
        if c == "[":
            src = self.char_class()
            if fold:
                raise Unsupported(f"a character class under (?i) in {self.s!r} (multi-character case folds)")
            return Atom(src)
        if c == "\\":
            return self.escape(fold)
        if c == ".":
            self.i += 1
            if fold:
                raise Unsupported(f"'.' under (?i) in {self.s!r}")
            return Atom(".")
        if c == "$":  # Ruby syntax: the end of the input or before a line feed, i.e. (?![^\n])
            self.i += 1
            return Look(True, Atom("[^\\n]"))
        if c == "^":
            raise Unsupported(f"anchor {c!r} in {self.s!r}")
        if c in ("*", "+", "?"):
            raise Unsupported(f"quantifier {c!r} with nothing to repeat in {self.s!r}")
        self.i += 1
        return self.literal(c, fold)

    def literal(self, ch: str, fold: bool) -> Atom:
        if fold and not ch.isascii():
            raise Unsupported(f"non-ASCII literal {ch!r} under (?i) in {self.s!r}")
        return Atom(literal_source(ch), fold)

    def group(self, fold: bool) -> Node:
        s, i = self.s, self.i
        if s.startswith("(?:", i):
            self.i += 3
            inner = self.alt(fold)
        elif s.startswith("(?i:", i):
            self.i += 4
            inner = self.alt(True)
        elif s.startswith("(?-i:", i):
            self.i += 5
            inner = self.alt(False)
        elif s.startswith("(?=", i) or s.startswith("(?!", i):
            negative = s[i + 2] == "!"
            self.i += 3
            body = self.alt(fold)
            if _has_look(body):
                raise Unsupported(f"a lookahead inside a lookahead in {s!r}")
            inner = Look(negative, body)
        elif s.startswith("(?", i):
            raise Unsupported(f"group construct {s[i:i + 4]!r}... in {s!r} (lookbehind, atomic, named or flags)")
        else:
            self.i += 1  # a capturing group: captures do not change what matches
            inner = self.alt(fold)
        if self.peek() != ")":
            raise Unsupported(f"unclosed group at {i} in {s!r}")
        self.i += 1
        return inner

    def escape(self, fold: bool) -> Atom | Look:
        s = self.s
        if self.i + 1 >= len(s):
            raise Unsupported(f"trailing backslash in {s!r}")
        e = s[self.i + 1]
        if e in ("p", "P"):
            j = s.find("}", self.i)
            if s[self.i + 2:self.i + 3] != "{" or j < 0:
                raise Unsupported(f"malformed property escape in {s!r}")
            src = s[self.i:j + 1]
            self.i = j + 1
            if fold:
                raise Unsupported(f"property {src} under (?i) in {s!r}")
            return Atom(src)
        if e in _CLASS_ESCAPES:
            self.i += 2
            if fold and e not in _CASE_FREE_ESCAPES:
                raise Unsupported(f"\\{e} under (?i) in {s!r}")
            return Atom("\\" + e)
        if e in _CONTROL:
            self.i += 2
            return Atom(literal_source(_CONTROL[e]))
        if e in ("x", "u"):
            return self.literal(self.code_escape(), fold)
        if e.isdigit():
            raise Unsupported(f"numeric escape \\{e} in {s!r} (back-reference or octal)")
        if e == "z":  # the end of the input: no character follows
            self.i += 2
            return Look(True, Atom("[\\s\\S]"))
        if e in _REFUSED_ESCAPES:
            raise Unsupported(f"{_REFUSED_ESCAPES[e]} (\\{e}) in {s!r}")
        if e.isascii() and e.isalnum():
            raise Unsupported(f"escape \\{e} in {s!r}")
        self.i += 2
        return self.literal(e, fold)  # an escaped punctuation or non-ASCII character stands for itself

    def code_escape(self) -> str:
        s, i = self.s, self.i
        if s[i + 1] == "x" and s[i + 2:i + 3] == "{":
            j = s.find("}", i)
            digits, end = s[i + 3:j], j + 1
        elif s[i + 1] == "x":
            digits, end = s[i + 2:i + 4], i + 4
        else:
            digits, end = s[i + 2:i + 6], i + 6
        try:
            cp = int(digits, 16)
            ch = chr(cp)
        except ValueError:
            raise Unsupported(f"malformed code escape in {s!r}") from None
        self.i = end
        return ch

    def char_class(self) -> str:
        """The source of the bracket expression at the cursor (nested brackets and escapes kept)."""
        s, start = self.s, self.i
        depth, i = 0, self.i
        while i < len(s):
            c = s[i]
            if c == "\\":
                i += 2
                continue
            if c == "[":
                depth += 1
                i += 1
                if s[i:i + 1] == "^":
                    i += 1
                if s[i:i + 1] == "]":  # a leading ']' is a member
                    i += 1
                continue
            if c == "]":
                depth -= 1
                i += 1
                if depth == 0:
                    self.i = i
                    return s[start:i]
                continue
            i += 1
        raise Unsupported(f"unclosed character class in {s!r}")


def _has_look(node: Node) -> bool:
    if isinstance(node, Look):
        return True
    if isinstance(node, Cat):
        return any(_has_look(n) for n in node.items)
    if isinstance(node, Alt):
        return any(_has_look(n) for n in node.options)
    if isinstance(node, Repeat):
        return _has_look(node.item)
    return False


def parse(pattern: str) -> Node:
    """The tree of ``pattern``; raises :class:`Unsupported` naming the first construct not covered."""
    if not isinstance(pattern, str) or not pattern:
        raise Unsupported("an empty pattern")
    return _Parser(pattern).parse()


def literal_tree(text: str) -> Node:
    """The tree of a plain string pattern (``Split`` with ``{"String": ...}``): its characters in order."""
    if not text:
        raise Unsupported("an empty string pattern")
    atoms = tuple(Atom(literal_source(ch)) for ch in text)
    return atoms[0] if len(atoms) == 1 else Cat(atoms)
