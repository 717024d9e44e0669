"""The accepted class transitions of a pre-tokenizer, derived from its own steps (docs/proof.md §3).

A cut at b between x = text[b-1] and y = text[b] is safe for the pre-tokenizer when its pieces of
the text are its pieces of text[:b] followed by its pieces of text[b:]. Per step, over the step's
matches and the gaps between them:

* **transparent** (T): no match can contain both x and y, and a lookahead evaluated right after x
  cannot see y (``Facts.pairs``). Then every match attempt before b returns the same result on the
  prefix as on the text (a path that reads b either fails there on both or would have made a match
  across b), and attempts from b on never read before b: the step's segments of the two parts are
  its segments of the text, with the one holding b split at b.
* **a boundary** (B): T, and x or y is a character every attempt at which succeeds
  (``Facts.single``), so b ends a match or starts one.
* **robust**: B, and the step's behavior does not fold the segments on either side of b together:
  ``isolated``/``removed`` never do; ``merged_with_previous`` does only when a gap precedes a match,
  ``merged_with_next`` only when a match precedes a gap, ``contiguous`` only when two matches meet
  (``invert`` swaps the roles of matches and gaps). A character in no atom the pattern consumes is
  always in a gap.

Later steps act on each piece alone, so b is safe for the whole pre-tokenizer when some step is
robust at (x, y) and every earlier step is transparent there. The classes are the code points'
atom signatures (one class per distinct set of atoms a code point belongs to); a code point that
alone matches a multi-character ``(?i)`` word, and every surrogate, is its own *poisoned* class that
no transition accepts.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from ..charclass import N_CODEPOINTS
from . import atoms as atom_tables
from .merges import ModelGuard, model_guard
from .regex_syntax import Atom, Unsupported
from .steps import Pipeline, Step, read_pipeline

MAX_CLASSES = 255


@dataclass(frozen=True, eq=False)
class DerivedTransitions:
    """A pre-tokenizer's classes and accepted transitions (what :class:`~delta_ray._core.cut_predicate.CutPredicate`
    reads)."""

    name: str
    classes: np.ndarray  # uint8 class id per code point
    accept: np.ndarray  # bool (n_classes, n_classes)
    byte_level: bool
    steps: tuple[str, ...]
    piece_skip: int = 0  # characters a piece after a cut leaves out (a Prepend normalizer writes them back)

    def class_table(self) -> np.ndarray:
        return self.classes

    @property
    def accept_matrix(self) -> np.ndarray:
        return self.accept


def _members(atom: Atom) -> np.ndarray:
    s = atom.source
    if s.startswith("<") and s.endswith(">"):
        return atom_tables.predicate_members(s[1:-1])
    return atom_tables.regex_members(atom.pattern)


def _step_matrices(step: Step, member: np.ndarray, col: dict[Atom, int]) -> tuple[np.ndarray, np.ndarray]:
    """(transparent, robust) over classes for one step; ``member`` is (n_classes, n_atoms) bool."""
    f = step.facts
    idx = np.array([col[a] for a in f.atoms], dtype=np.int64)
    m = member[:, idx].astype(np.uint8)  # class x this step's atoms
    pairs = np.zeros((len(f.atoms), len(f.atoms)), dtype=np.uint8)
    for a, b in f.pairs:
        pairs[a, b] = 1
    forbid = (m @ pairs @ m.T) > 0
    # (a 2-D array reduced along axis 1: one bool per class)
    single = cast(np.ndarray, m[:, sorted(f.single)].any(axis=1)) if f.single else np.zeros(len(m), dtype=bool)
    never = ~cast(np.ndarray, m[:, sorted(f.consumed)].any(axis=1)) if f.consumed else np.ones(len(m), dtype=bool)
    transparent = ~forbid
    boundary = transparent & (single[:, None] | single[None, :])
    match, gap = (never, single) if step.invert else (single, never)
    if step.behavior in ("isolated", "removed"):
        keep = np.ones_like(boundary)
    elif step.behavior == "merged_with_previous":
        keep = match[:, None] | gap[None, :]
    elif step.behavior == "merged_with_next":
        keep = gap[:, None] | match[None, :]
    else:  # contiguous
        keep = gap[:, None] | gap[None, :]
    return transparent, boundary & keep


def derive_from_steps(steps: list[Step], byte_level: bool = False, name: str = "derived", *,
                      char_map: tuple[tuple[str, str], ...] = (), right_required: str | None = None,
                      model: ModelGuard | None = None, prepends: bool = False) -> DerivedTransitions:
    """The classes and accepted transitions of split steps (:func:`~delta_ray._core.pretok.steps.read_steps`),
    after a one-to-one character map, optionally with the model's own guard inside one piece.
    ``prepends``: a ``Prepend`` normalizer adds ``right_required`` to every section, so a piece
    after a cut leaves that character out, and no two cuts are adjacent (docs/proof.md §3)."""
    if not steps and model is None:
        raise Unsupported("no pre-tokenizer step splits the text")
    atoms: list[Atom] = []
    col: dict[Atom, int] = {}
    for step in steps:
        for a in step.facts.atoms:
            if a not in col:
                col[a] = len(atoms)
                atoms.append(a)
    poison = np.zeros(N_CODEPOINTS, dtype=bool)
    poison[0xD800:0xE000] = True
    words = tuple(sorted(set().union(*(s.facts.fold_words for s in steps))))
    if words:
        poison |= atom_tables.folded_into(words)
    extra = [model.left, model.right] if model is not None else []
    if right_required is not None:
        required = np.zeros(N_CODEPOINTS, dtype=bool)
        required[ord(right_required)] = True
        extra.append(required)
    bits = np.stack([_members(a) for a in atoms] + extra + [poison], axis=1)  # code point x columns
    packed = np.packbits(bits, axis=1)
    keys = np.ascontiguousarray(packed).view(np.dtype((np.void, packed.shape[1]))).ravel()
    uniq, first, classes = np.unique(keys, return_index=True, return_inverse=True)
    if len(uniq) > MAX_CLASSES:
        raise Unsupported(f"the pre-tokenizer's atoms make {len(uniq)} classes (at most {MAX_CLASSES})")
    member = bits[first]  # class x columns, from one representative each
    n_atoms = len(atoms)
    accept = np.zeros((len(uniq), len(uniq)), dtype=bool)
    through = np.ones_like(accept)
    for step in steps:
        transparent, robust = _step_matrices(step, member[:, :n_atoms], col)
        accept |= through & robust
        through &= transparent
    if model is not None:  # inside a piece every step left whole: the vocabulary's guard
        accept |= through & member[:, n_atoms][:, None] & member[:, n_atoms + 1][None, :]
    if right_required is not None:
        accept &= member[:, -2][None, :]
        if prepends:  # a cut right after a cut would leave an empty piece: never both sides required
            accept &= ~member[:, -2][:, None]
    elif prepends:
        raise Unsupported("a Prepend without the character it adds")
    bad = member[:, -1]
    accept[bad, :] = False
    accept[:, bad] = False
    base = classes.astype(np.uint8).reshape(-1)
    class_of = base.copy()
    # The steps see a character after every map: so does its class (maps apply in order, so a
    # character mapped to one that a later map turns again ends where that one ends).
    image = {raw: raw for raw, _ in char_map}
    for raw, mapped in char_map:
        for c, now in image.items():
            if now == raw:
                image[c] = mapped
    for raw, final in image.items():
        class_of[ord(raw)] = base[ord(final)]
    return DerivedTransitions(name, class_of, accept, byte_level, tuple(s.label for s in steps)
                              + (("BPE vocabulary guard",) if model is not None else ()), 1 if prepends else 0)


def derive_pipeline(pipe: Pipeline, model: dict[str, Any] | None, name: str) -> DerivedTransitions:
    """Derive the transitions of a read pipeline; the model's guard joins when it is sound."""
    atom_tables.require_engine()
    guard = None
    if model is not None and not pipe.byte_level:
        try:
            guard = model_guard(model)
        except Unsupported:
            if not pipe.steps:
                raise
    return derive_from_steps(list(pipe.steps), pipe.byte_level, name, char_map=pipe.char_map,
                             right_required=pipe.right_required, model=guard, prepends=pipe.prepends)


_BY_DIGEST: dict[str, DerivedTransitions] = {}


def derive_transitions(config: dict[str, Any], digest: str | None = None) -> DerivedTransitions:
    """The classes and accepted transitions of a ``tokenizer.json`` config (its normalizer's
    character maps, pre-tokenizer and BPE vocabulary); raises
    :class:`~delta_ray._core.pretok.regex_syntax.Unsupported` with the reason for a step not covered.
    ``digest`` (the config's SHA-256) keys a per-process cache."""
    if digest is not None and digest in _BY_DIGEST:
        return _BY_DIGEST[digest]
    pipe = read_pipeline(config.get("normalizer"), config.get("pre_tokenizer"))
    key = json.dumps([config.get("normalizer"), config.get("pre_tokenizer")], sort_keys=True, ensure_ascii=False)
    name = "derived-" + hashlib.sha256(key.encode("utf-8")).hexdigest()[:12]
    out = derive_pipeline(pipe, config.get("model"), name)
    if digest is not None:
        if len(_BY_DIGEST) >= 16:  # a process loads few tokenizers; a test session may load many
            _BY_DIGEST.clear()
        _BY_DIGEST[digest] = out
    return out
