"""A pattern's position automaton (Glushkov's construction) and the facts the cut rule reads from it.

Each atom occurrence is a *position*; a lookahead is a zero-width pseudo-position that carries its
body. ``first``, ``last`` and ``follow`` are the textbook sets, with lookaheads treated as positions,
so every path of the pattern through its characters, and every lookahead it passes, is a walk of
``follow`` from ``first`` to ``last``. A bounded repetition ``e{m,n}`` is built as ``m`` copies of
``e`` followed by ``e?`` (``n == m + 1``) or ``e*`` (``n`` larger or unbounded): this adds paths,
never removes one, and keeps every path of one character exactly.

What :func:`analyze` answers, each an over- or under-approximation in the safe direction:

* ``pairs``: atom pairs (a, b) such that some path (of the pattern or of a lookahead body) may
  consume a character of ``a`` immediately followed by one of ``b``; plus, for every lookahead
  reachable right after consuming an ``a`` whose body cannot match the empty string, (a, b) for
  every ``b`` that may begin the body (the lookahead reads the next character, which a prefix of
  the text does not have). A superset: more pairs only forbid more cuts.
* ``single``: atoms one character of which is a whole match by a path that passes no lookahead.
  An attempt at such a character always succeeds, so the character is always inside a match.
  A subset: fewer only forbid more cuts.
* ``consumed``: atoms the pattern (not a lookahead) may consume; a character in none of them is
  never inside a match.
* ``fold_words``: strings of two or three consecutive ``(?i)`` literal characters a path may
  consume, whose multi-character case folds (``ss`` ~ ``ß``) the atoms' single-character sets do
  not show (:mod:`delta_ray._core.pretok.atoms` marks those code points).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from .regex_syntax import Alt, Atom, Cat, Look, Node, Repeat, Unsupported

MAX_POSITIONS = 4096

# What a subtree is built into: (first, last, nullable with lookaheads as positions, nullable with
# lookaheads as empty).
Built = tuple[frozenset[int], frozenset[int], bool, bool]


@dataclass(frozen=True)
class Facts:
    """What the cut rule needs of one pattern, over its distinct atoms (``atoms``)."""

    atoms: tuple[Atom, ...]
    pairs: frozenset[tuple[int, int]]
    single: frozenset[int]
    consumed: frozenset[int]
    fold_words: frozenset[str]


class _Builder:
    def __init__(self) -> None:
        self.atom_of: list[Atom | None] = []  # per position: its atom, or None for a lookahead
        self.body_of: dict[int, Built] = {}  # lookahead position -> what its body was built into
        self.follow: list[set[int]] = []
        self.in_body: list[bool] = []
        self._body_depth = 0

    def position(self, atom: Atom | None) -> int:
        if len(self.atom_of) >= MAX_POSITIONS:
            raise Unsupported(f"the pattern expands to more than {MAX_POSITIONS} positions")
        self.atom_of.append(atom)
        self.follow.append(set())
        self.in_body.append(self._body_depth > 0)
        return len(self.atom_of) - 1

    def build(self, node: Node) -> Built:
        """(first, last, nullable with lookaheads as positions, nullable with lookaheads as empty)."""
        if isinstance(node, Atom):
            p = self.position(node)
            return frozenset((p,)), frozenset((p,)), False, False
        if isinstance(node, Look):
            self._body_depth += 1
            body = self.build(node.body)
            self._body_depth -= 1
            p = self.position(None)
            self.body_of[p] = body
            return frozenset((p,)), frozenset((p,)), False, True
        if isinstance(node, Alt):
            parts = [self.build(o) for o in node.options]
            return (frozenset().union(*(f for f, _, _, _ in parts)),
                    frozenset().union(*(last for _, last, _, _ in parts)),
                    any(n for _, _, n, _ in parts), any(e for _, _, _, e in parts))
        if isinstance(node, Cat):
            return self.concat([self.build(i) for i in node.items])
        if isinstance(node, Repeat):
            parts = [self.build(node.item) for _ in range(node.min)]
            if node.max is None or node.max > node.min:
                f, last, n, e = self.build(node.item)
                if node.max is None or node.max > node.min + 1:
                    for q in last:
                        self.follow[q] |= f
                parts.append((f, last, True, True))
            return self.concat(parts) if parts else (frozenset(), frozenset(), True, True)
        raise TypeError(f"not a pattern node: {node!r}")

    def concat(self, parts: list[Built]) -> Built:
        first: frozenset[int] = frozenset()
        last: frozenset[int] = frozenset()
        nullable, empty = True, True
        for f, part_last, n, e in parts:
            for q in last:
                self.follow[q] |= f
            first = first | f if nullable else first
            last = part_last | last if n else part_last
            nullable = nullable and n
            empty = empty and e
        return first, last, nullable, empty


def analyze(tree: Node) -> Facts:
    """The facts of one parsed pattern (:func:`delta_ray._core.pretok.regex_syntax.parse`)."""
    b = _Builder()
    first, last, _, empty = b.build(tree)
    if empty:
        raise Unsupported("the pattern can match the empty string")
    atoms: list[Atom] = []
    index: dict[Atom, int] = {}
    for a in b.atom_of:
        if a is not None and a not in index:
            index[a] = len(atoms)
            atoms.append(a)

    def atom_at(q: int) -> Atom:
        """The atom of a character position (every position a path consumes is one)."""
        return cast(Atom, b.atom_of[q])

    def chars_after(p: int) -> tuple[set[int], set[int]]:
        """Character positions a path may consume right after p, and the lookaheads it passes."""
        chars, looks, todo = set(), set(), list(b.follow[p])
        while todo:
            q = todo.pop()
            if b.atom_of[q] is None:
                if q not in looks:
                    looks.add(q)
                    todo.extend(b.follow[q])
            else:
                chars.add(q)
        return chars, looks

    pairs: set[tuple[int, int]] = set()
    fold_words: set[str] = set()
    for p, a in enumerate(b.atom_of):
        if a is None:
            continue
        chars, looks = chars_after(p)
        for q in chars:
            pairs.add((index[a], index[atom_at(q)]))
        for ell in looks:
            bfirst, _, _, bempty = b.body_of[ell]
            if not bempty:
                for q in bfirst:
                    pairs.add((index[a], index[atom_at(q)]))
        if a.fold:
            for q in chars:
                aq = atom_at(q)
                if aq.fold:
                    fold_words.add(_char(a) + _char(aq))
                    for r in chars_after(q)[0]:
                        if atom_at(r).fold:
                            fold_words.add(_char(a) + _char(aq) + _char(atom_at(r)))
    single = {index[atom_at(p)] for p in first & last if b.atom_of[p] is not None}
    consumed = {index[a] for p, a in enumerate(b.atom_of) if a is not None and not b.in_body[p]}
    return Facts(tuple(atoms), frozenset(pairs), frozenset(single), frozenset(consumed), frozenset(fold_words))


def _char(a: Atom) -> str:
    """The literal character of a folded literal atom (its source is the character or ``\\x{..}``)."""
    s = a.source
    if s.startswith("\\x{"):
        return chr(int(s[3:-1], 16))
    if len(s) == 1:
        return s
    raise Unsupported(f"a case-folded atom that is not a literal: {s!r}")
