"""Admission: which tokenizer configurations the exactness argument covers.

Everything not admitted still works: every request goes to the reference encode, and
``Admission.reason`` says why. The flags are read from the loaded configuration, never assumed.
"""
from __future__ import annotations

import functools
import importlib.metadata
import threading
import warnings
from dataclasses import dataclass, field
from typing import Any

from .._runtime import cache_store
from .errors import DeltaRayError
from .families import FAMILIES, Family, family_for_patterns
from .loading import LoadedTokenizer, padding_is_neutral
from .pretok.regex_syntax import Unsupported
from .pretok.steps import read_normalizer
from .pretok.transitions import derive_transitions
from .reference_api import FULL_API
from .reference_version import reference_version

#: How a pre-tokenizer's safe transitions are known: derived from its own steps (the reference exposes
#: its regex engine), or a hand-written family whose classes the reference confirms (tokenizers 1.x).
GUARDS = ("derived", "family")


@dataclass(frozen=True)
class Admission:
    """Whether the fast paths may serve a tokenizer, and why (or why not)."""

    admitted: bool
    reason: str
    family: str | None = None  # the hand-written family the guard is, when ``guard == "family"``
    normalizer: str | None = None  # None (identity), "nfc", or "map" (one-character Replace steps, a Prepend)
    prefix_ids: tuple[int, ...] = ()  # post-processing: added before the sequence
    suffix_ids: tuple[int, ...] = ()  # and after it
    added_tokens: tuple[str, ...] = field(default=(), repr=False)
    engine: str = "reference"
    guard: str | None = None  # one of GUARDS when admitted

    def __bool__(self) -> bool:
        return self.admitted


class NotAdmitted(DeltaRayError, ValueError):
    """A configuration the exactness argument does not cover; the message names the pipeline step.

    Raised to the caller only with ``strict=True``; otherwise the tokenizer is served by the
    reference alone and :class:`NotAdmittedWarning` says why, once per configuration."""


class NotAdmittedWarning(UserWarning):
    """A tokenizer is served by the reference alone (no cuts, no session reuse, no fast engine)."""


_WARNED: set[str] = set()
_WARNED_LOCK = threading.Lock()


def announce_refusal(admission: Admission, digest: str, *, strict: bool) -> None:
    """Make a refusal visible: raise :class:`NotAdmitted` under ``strict``, else warn once per configuration."""
    if admission.admitted:
        return
    if strict:
        raise NotAdmitted(f"delta-ray does not admit this tokenizer: {admission.reason}")
    with _WARNED_LOCK:
        if digest in _WARNED:
            return
        _WARNED.add(digest)
    warnings.warn(f"delta-ray serves this tokenizer with the reference alone (no cuts, no session reuse, "
                  f"no fast engine): {admission.reason}. Pass strict=True to raise instead.",
                  NotAdmittedWarning, stacklevel=4)


def _normalizer_kind(cfg: Any) -> str | None:
    if cfg is None:
        return None
    t = cfg.get("type")
    if t == "Sequence" and not cfg.get("normalizers"):
        return None
    if t == "NFC":
        return "nfc"
    if t == "Sequence" and len(cfg["normalizers"]) == 1:
        return _normalizer_kind(cfg["normalizers"][0])
    if FULL_API:  # one-character Replace maps: the derivation reads them (_core/pretok/steps.py)
        try:
            char_map, prepend = read_normalizer(cfg)
            return "map" if char_map or prepend else None
        except Unsupported as exc:
            raise NotAdmitted(f"normalizer: {exc}") from None
    raise NotAdmitted(f"normalizer {t!r} is not covered (only none, an empty Sequence or NFC)")


def _family_guard(cfg: Any) -> Family:
    """Under tokenizers 1.x: the hand-written family whose split patterns these are exactly."""
    if not cfg or cfg.get("type") != "Sequence":
        raise NotAdmitted("pre-tokenizer must be a Sequence of Split(s) followed by ByteLevel")
    steps = cfg.get("pretokenizers") or []
    if len(steps) < 2 or steps[-1].get("type") != "ByteLevel":
        raise NotAdmitted("pre-tokenizer must end with ByteLevel")
    bl = steps[-1]
    if bl.get("add_prefix_space"):
        raise NotAdmitted("ByteLevel add_prefix_space would add a space to every chunk")
    if bl.get("use_regex", True):
        raise NotAdmitted("ByteLevel with its own regex is not a known family")
    patterns, behaviors = [], []
    for step in steps[:-1]:
        if step.get("type") != "Split":
            raise NotAdmitted(f"pre-tokenizer step {step.get('type')!r} is not covered")
        pat = step.get("pattern") or {}
        if "Regex" not in pat:
            raise NotAdmitted("Split with a plain string pattern is not a known family")
        patterns.append(pat["Regex"])
        behaviors.append((str(step.get("behavior", "")).lower(), bool(step.get("invert", False))))
    fam = family_for_patterns(tuple(patterns))
    if fam is None:
        raise NotAdmitted("pre-tokenizer pattern(s) belong to no family with a known transition table "
                          "(tokenizers 1.x exposes no regex engine to derive one from)")
    allowed = set(fam.split_behaviors)
    if any(b not in allowed for b in behaviors):
        raise NotAdmitted(f"Split behavior {behaviors} is not covered for family {fam.name}")
    return fam


def _pre_tokenizer_guard(config: Any, digest: str) -> tuple[str, str | None, str]:
    """(guard, family, description) of a config's pre-tokenizer, or NotAdmitted with the step's reason."""
    if not FULL_API:
        fam = _family_guard(config.get("pre_tokenizer"))
        return "family", fam.name, f"family {fam.name}"
    try:
        derived = derive_transitions(config, digest)
    except Unsupported as exc:
        raise NotAdmitted(f"pre-tokenizer: {exc}") from None
    return "derived", None, f"pre-tokenizer {' + '.join(derived.steps)} ({len(derived.accept)} classes)"


def _template_ids(cfg: Any, loaded: LoadedTokenizer) -> tuple[tuple[int, ...], tuple[int, ...]]:
    if cfg is None:
        return (), ()
    t = cfg.get("type")
    if t == "ByteLevel":
        return (), ()  # offsets only; IDs unchanged
    if t == "Sequence":
        pre: tuple[int, ...] = ()
        suf: tuple[int, ...] = ()
        for proc in cfg.get("processors", []):
            p, s = _template_ids(proc, loaded)
            pre, suf = p + pre, suf + s
        return pre, suf
    if t == "TemplateProcessing":
        single = cfg.get("single") or []
        specials = cfg.get("special_tokens") or {}
        seq_at = [i for i, item in enumerate(single) if "Sequence" in item]
        if len(seq_at) != 1 or single[seq_at[0]]["Sequence"].get("id") != "A":
            raise NotAdmitted("TemplateProcessing single template must hold sequence A once")
        ids: list[list[int]] = [[], []]
        for i, item in enumerate(single):
            if "SpecialToken" in item:
                name = item["SpecialToken"]["id"]
                if name not in specials:
                    raise NotAdmitted(f"template special token {name!r} has no ids")
                ids[0 if i < seq_at[0] else 1].extend(specials[name]["ids"])
        return tuple(ids[0]), tuple(ids[1])
    raise NotAdmitted(f"post-processor {t!r} may do more than add special tokens")


ADMISSION_FORMAT = 2  # bump when admit()'s rules change: cached decisions of older rules are then ignored


@functools.lru_cache(maxsize=1)
def _our_version() -> str:
    """delta-ray's installed version, read once per process (``importlib.metadata`` scans every
    distribution on ``sys.path``: milliseconds, on every lazy admission before this cache)."""
    try:
        return importlib.metadata.version("delta-ray")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - run from a source tree
        return "0+unknown"


def _admission_key(digest: str) -> dict[str, Any]:
    """What an admission depends on: the configuration's bytes, the reference (the template check
    runs on it) and these rules (delta-ray's version and ADMISSION_FORMAT)."""
    return {"digest": digest, "reference": reference_version(), "delta_ray": _our_version(),
            "format": ADMISSION_FORMAT}


def _valid_admission(p: dict[str, Any]) -> bool:
    def ints(v: object) -> bool:
        return isinstance(v, list) and all(type(i) is int for i in v)

    return (set(p) == {"admitted", "reason", "family", "normalizer", "prefix_ids", "suffix_ids", "added_tokens",
                       "guard"}
            and isinstance(p["admitted"], bool) and isinstance(p["reason"], str)
            and (p["guard"] in GUARDS if p["admitted"] else p["guard"] is None)
            and (p["family"] is None or p["family"] in FAMILIES) and p["normalizer"] in (None, "nfc", "map")
            and ints(p["prefix_ids"]) and ints(p["suffix_ids"])
            and isinstance(p["added_tokens"], list) and all(isinstance(t, str) for t in p["added_tokens"])
            and (p["admitted"] or p["family"] is None))


def admit(loaded: LoadedTokenizer) -> Admission:
    """Decide admission from the configuration, then confirm the template against the reference.

    A lazily loaded tokenizer whose reference is not built yet (a Ray Data worker) first looks the
    decision up in the on-disk cache (:mod:`delta_ray._runtime.cache_store`, a checked record bound to
    the configuration's SHA-256, the reference's version and these rules): the decision is a
    function of exactly those, so a cached one is the one this process would compute, without
    building the reference (about a CPU-second). A miss computes it and records it."""
    if loaded.built:
        return _admit(loaded)
    key = _admission_key(loaded.digest)
    rec = cache_store.load_record("admission", key, validate=_valid_admission)
    if rec is not None:
        return Admission(rec["admitted"], rec["reason"], family=rec["family"], normalizer=rec["normalizer"],
                         prefix_ids=tuple(rec["prefix_ids"]), suffix_ids=tuple(rec["suffix_ids"]),
                         added_tokens=tuple(rec["added_tokens"]), guard=rec["guard"])
    adm = _admit(loaded)
    cache_store.save_record("admission", key, {"admitted": adm.admitted, "reason": adm.reason, "family": adm.family,
                                   "normalizer": adm.normalizer, "prefix_ids": list(adm.prefix_ids),
                                   "suffix_ids": list(adm.suffix_ids), "added_tokens": list(adm.added_tokens),
                                   "guard": adm.guard})
    return adm


def _admit(loaded: LoadedTokenizer) -> Admission:
    cfg = loaded.config
    try:
        model = cfg.get("model") or {}
        if model.get("type") != "BPE":
            raise NotAdmitted(f"model {model.get('type')!r} is not BPE")
        if model.get("dropout") not in (None, 0, 0.0):
            raise NotAdmitted("BPE dropout makes encodes random")
        if model.get("byte_fallback") and not FULL_API:
            raise NotAdmitted("byte_fallback is not a byte-level configuration")
        if cfg.get("truncation") is not None or loaded.tokenizer.truncation is not None:
            raise NotAdmitted("truncation is set")
        if not (cfg.get("padding") is None or padding_is_neutral(cfg.get("padding"))) \
                or loaded.tokenizer.padding is not None:
            raise NotAdmitted("padding is set (to a fixed length or a multiple: it changes a one-text encode)")
        norm = _normalizer_kind(cfg.get("normalizer"))
        guard, family, described = _pre_tokenizer_guard(cfg, loaded.digest)
        added = cfg.get("added_tokens") or []
        for tok in added:
            if tok.get("lstrip") or tok.get("rstrip") or tok.get("single_word"):
                raise NotAdmitted(f"added token {tok['content']!r} uses lstrip/rstrip/single_word")
            if tok.get("normalized") and norm is not None:
                raise NotAdmitted(f"added token {tok['content']!r} is matched after a non-identity normalizer")
        prefix, suffix = _template_ids(cfg.get("post_processor"), loaded)
    except NotAdmitted as exc:
        return Admission(False, str(exc))
    # The template must be exactly "prefix + sequence + suffix" on the reference itself.
    ref = loaded.tokenizer
    for probe in ("", "Hello world", " a\n\n b 12345 é"):
        whole = ref.encode(probe, add_special_tokens=True).ids
        bare = ref.encode(probe, add_special_tokens=False).ids
        if whole != list(prefix) + bare + list(suffix):
            return Admission(False, "post-processing is not a fixed prefix/suffix on this tokenizer")
    return Admission(True, f"admitted: BPE, {described}, normalizer {norm or 'none'}",
                     family=family, normalizer=norm, prefix_ids=prefix, suffix_ids=suffix,
                     added_tokens=tuple(t["content"] for t in added), guard=guard)
