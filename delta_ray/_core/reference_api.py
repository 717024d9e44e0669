"""What delta-ray asks of the reference ``tokenizers``, under 0.x and under 1.x alike.

``tokenizers`` 1.x keeps ``Tokenizer.from_file``, ``encode``, ``encode_batch``, ``decode``,
``decode_tokens`` and ``Encoding.ids`` (plus numpy views such as ``ids_array``) and drops
``from_str``, ``to_str``, ``encode_batch_fast``, ``id_to_token``, ``get_vocab_size``,
``get_added_tokens_decoder``, ``normalizers``, ``pre_tokenizers`` and ``Regex``. Every use of the
reference goes through this module, which takes the 0.x call where it exists and otherwise an
equivalent built from what 1.x exposes:

* a tokenizer from JSON text: ``from_str``, else a private temporary file and ``from_file``;
* IDs of a batch: ``encode_batch_fast``, else ``encode_batch`` (both release the GIL);
* a decode that lets other threads run: ``decode_batch`` of one list (it releases the GIL), else
  ``decode``;
* the reference's own normalizers (NFC, NFD): ``normalizers.X().normalize_str``, else a *synthetic
  tokenizer* the reference loads (that normalizer, a byte-level BPE with the 256 byte symbols and
  no merges, a byte-level decoder): ``decode(encode(s))`` is then exactly the normalized ``s``,
  computed by the reference's normalizer (every byte has its own token and the byte-level decoder
  maps the tokens back to those bytes);
* the vocabulary (``id_to_token``, its size) and the added tokens: read from ``tokenizer.json``;
* character offsets (``Encoding.offsets``): none under 1.x (:data:`OFFSETS_API`), so no session
  splices them there.

Nothing here guesses: where 1.x offers no exact equivalent, the caller falls back to whole
reference encodes (see :mod:`delta_ray._core.charclass` for the class tables).
"""
from __future__ import annotations

import json
import os
import tempfile
from functools import lru_cache
from typing import Any, Callable, Sequence

import numpy as np
import tokenizers
from tokenizers import Tokenizer

#: The 0.x Python API (Regex, normalizers, pre_tokenizers) is available.
FULL_API = all(hasattr(tokenizers, n) for n in ("Regex", "normalizers", "pre_tokenizers"))
#: Encodings carry character offsets (``Encoding.offsets``): 0.x; 1.x's ``Encoding`` has none.
OFFSETS_API = FULL_API


def api_generation() -> int:
    """0 for the 0.x API, 1 for the reduced 1.x API."""
    return 0 if FULL_API else 1


def tokenizer_from_str(text: str) -> Tokenizer:
    """A reference tokenizer from tokenizer.json text (``from_str`` or, under 1.x, a private temp file)."""
    if hasattr(Tokenizer, "from_str"):
        return Tokenizer.from_str(text)
    fd, path = tempfile.mkstemp(prefix="delta-ray-", suffix=".json")  # mode 0600, O_EXCL
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        return Tokenizer.from_file(path)
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass


class ReferenceRefused(ValueError):
    """The installed reference loads this tokenizer.json but cannot encode with it."""


def check_encodes(tok: Tokenizer) -> Tokenizer:
    """``tok`` if the reference can encode with it; :class:`ReferenceRefused` with its reason otherwise.

    tokenizers 1.x loads a tokenizer.json whose Split pattern it does not recognize (Qwen3.5's) and
    refuses at the first encode ("needs a system-regex backend"): say so when the tokenizer is
    loaded, not on the first request. (0.x encodes whatever it loads: no probe there.)
    """
    if FULL_API:
        return tok
    try:
        tok.encode("a", add_special_tokens=False)
    except Exception as exc:  # noqa: BLE001 - the reference's own refusal, reported as is
        raise ReferenceRefused(f"tokenizers {tokenizers.__version__} cannot encode with this tokenizer.json: "
                               f"{exc}") from exc
    return tok


def tokenizer_to_str(tok: Tokenizer) -> str:
    """The tokenizer.json text of a loaded tokenizer (0.x only: 1.x cannot serialize)."""
    to_str = getattr(tok, "to_str", None)
    if to_str is None:
        raise TypeError(f"tokenizers {tokenizers.__version__} cannot serialize a loaded Tokenizer: "
                        "pass the path of its tokenizer.json instead")
    text: str = to_str()
    return text


def encode_batch(tok: Tokenizer, texts: Sequence[str], add_special_tokens: bool) -> list[Any]:
    """The reference's Encodings of ``texts`` (GIL released; offsets skipped where the API allows)."""
    fast = getattr(tok, "encode_batch_fast", None)
    if fast is not None:
        encs: list[Any] = fast(list(texts), add_special_tokens=add_special_tokens)
        return encs
    return tok.encode_batch(list(texts), add_special_tokens=add_special_tokens)


def ids_of(enc: Any) -> np.ndarray:
    """An Encoding's IDs as an int32 numpy array (the 1.x numpy view where there is one)."""
    arr = getattr(enc, "ids_array", None)
    if arr is not None:
        a = np.asarray(arr)
        if a.dtype == np.uint32 and a.flags.c_contiguous:  # 1.x: an owned uint32 array; IDs < 2**31
            return a.view(np.int32)
        return a if a.dtype == np.int32 else a.astype(np.int32)
    return np.asarray(enc.ids, dtype=np.int32)


def encode_batch_ids(tok: Tokenizer, texts: Sequence[str], add_special_tokens: bool = False) -> list[np.ndarray]:
    """int32 IDs of each text; the Encoding objects are dropped at once (they are heavy)."""
    if not texts:
        return []
    encs = encode_batch(tok, texts, add_special_tokens)
    out = [ids_of(e) for e in encs]
    del encs
    return out


def decode_fn(tok: Tokenizer) -> Callable[[list[int], bool], str]:
    """``decode(ids, skip_special_tokens)`` by the reference, releasing the GIL where it can.

    ``decode`` holds the GIL for the whole decode (a million IDs: over 100 ms in which no other
    thread of the process runs, an event loop included); ``decode_batch`` releases it, and one
    list decoded as a batch of one is the same call per sequence. Where there is no
    ``decode_batch``, the plain ``decode``."""
    batch = getattr(tok, "decode_batch", None)
    if batch is None:
        return lambda ids, skip: tok.decode(ids, skip_special_tokens=skip)
    return lambda ids, skip: batch([ids], skip_special_tokens=skip)[0]


def added_token_contents(tok: Tokenizer | None, config: dict[str, Any] | None = None) -> list[str]:
    """The added tokens' strings: from the loaded tokenizer (0.x) or from its tokenizer.json."""
    dec = getattr(tok, "get_added_tokens_decoder", None) if tok is not None else None
    if dec is not None:
        try:
            return sorted({t.content for t in dec().values()})
        except Exception:  # noqa: BLE001 - fall through to the configuration
            pass
    if config is None:
        return []
    return sorted({t["content"] for t in config.get("added_tokens") or []})


def config_vocab(config: dict[str, Any]) -> dict[int, str]:
    """id -> token string of the model's vocabulary and the added tokens (added tokens win)."""
    out: dict[int, str] = {}
    vocab = (config.get("model") or {}).get("vocab") or {}
    if isinstance(vocab, dict):
        out.update({int(i): t for t, i in vocab.items()})
    elif isinstance(vocab, list):  # Unigram: [[token, score], ...]
        out.update({i: t[0] for i, t in enumerate(vocab)})
    for t in config.get("added_tokens") or []:
        out[int(t["id"])] = t["content"]
    return out


def vocab_size(tok: Tokenizer, config: dict[str, Any] | None = None) -> int:
    """``get_vocab_size(with_added_tokens=True)`` (0.x), else the number of distinct IDs in tokenizer.json."""
    fn = getattr(tok, "get_vocab_size", None)
    if fn is not None:
        n: int = fn(with_added_tokens=True)
        return n
    return len(config_vocab(config or {}))


def id_to_token_fn(tok: Tokenizer, config: dict[str, Any] | None = None) -> Callable[[int], str | None]:
    """``id_to_token`` (0.x), else a lookup in tokenizer.json's vocabulary and added tokens (the same
    strings ``id_to_token`` returns: the model's token strings, None for an unknown ID)."""
    fn: Callable[[int], str | None] | None = getattr(tok, "id_to_token", None)
    if fn is not None:
        return fn
    table = config_vocab(config or {})
    return table.get


# ------------------------------------------------------------------------------------------------
# Synthetic tokenizers: the reference's own normalizers and pre-tokenizer splits, through encode
# ------------------------------------------------------------------------------------------------

@lru_cache(maxsize=1)
def byte_symbols() -> dict[int, str]:
    """GPT-2's byte -> printable symbol map (what the ByteLevel pre-tokenizer and decoder use)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


_BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}


def _synthetic_config(normalizer: dict[str, Any] | None, pretokenizers: list[dict[str, Any]], model: dict[str, Any],
                      decoder: dict[str, Any] | None, added: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added or [],
            "normalizer": normalizer,
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": pretokenizers} if pretokenizers else None,
            "post_processor": None, "decoder": decoder, "model": model}


@lru_cache(maxsize=4)
def _normalizer_tokenizer(kind: str) -> Tokenizer:
    vocab = {sym: b for b, sym in byte_symbols().items()}
    model: dict[str, Any] = {
        "type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
        "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
        "vocab": vocab, "merges": []}
    cfg = _synthetic_config({"type": kind}, [_BYTE_LEVEL], model, dict(_BYTE_LEVEL))
    return tokenizer_from_str(json.dumps(cfg))


def normalizer(kind: str) -> Callable[[str], str]:
    """The reference's own ``kind`` normalizer ("NFC", "NFD", ...) as a ``str -> str`` function.

    0.x: ``normalizers.<kind>().normalize_str``. 1.x: ``decode(encode(s))`` of a synthetic
    byte-level tokenizer with that normalizer (see the module docstring); exact, a little slower.
    """
    if FULL_API:
        normalize_str: Callable[[str], str] = getattr(tokenizers.normalizers, kind)().normalize_str
        return normalize_str
    tok = _normalizer_tokenizer(kind)

    def normalize(text: str) -> str:
        if not text:
            return text
        return tok.decode(tok.encode(text, add_special_tokens=False).ids, skip_special_tokens=False)

    normalize.batch = lambda texts: [tok.decode(e.ids, skip_special_tokens=False)  # type: ignore[attr-defined]
                                     for e in tok.encode_batch(list(texts), add_special_tokens=False)]
    return normalize


PROBE_SEPARATOR = "<|delta-ray-probe|>"


def split_probe_tokenizer(pretokenizers: list[dict[str, Any]],
                          pieces: Sequence[str]) -> tuple[Tokenizer, dict[str, int]]:
    """A tokenizer that shows how the reference's own pre-tokenizer ``pretokenizers`` splits a text.

    No normalizer; the given Split stages (the tokenizer's own, byte-level stage removed); a
    WordLevel model whose vocabulary holds ``pieces`` (ID 2 onwards) and maps every other piece to
    ``<unk>`` (ID 0); :data:`PROBE_SEPARATOR` is a special added token (ID 1), split off before
    pre-tokenization, so probes joined by it are pre-tokenized independently. Each piece of a probe
    becomes one ID: the IDs between separators are the probe's pieces, named where they are in
    ``pieces``.
    """
    vocab = {"<unk>": 0, PROBE_SEPARATOR: 1}
    for p in pieces:
        vocab.setdefault(p, len(vocab))
    added = [{"id": 1, "content": PROBE_SEPARATOR, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True}]
    cfg = _synthetic_config(None, [p for p in pretokenizers if p.get("type") != "ByteLevel"],
                            {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"}, None, added)
    return tokenizer_from_str(json.dumps(cfg)), vocab


def split_stages(config: dict[str, Any]) -> list[dict[str, Any]]:
    """The pre-tokenizer's stages as a list (a Sequence flattened one level, or the single stage)."""
    pre = config.get("pre_tokenizer")
    if not isinstance(pre, dict):
        return []
    if pre.get("type") == "Sequence":
        return list(pre.get("pretokenizers") or [])
    return [pre]


def describe() -> dict[str, Any]:
    """The installed reference, for logs and benchmark headers."""
    return {"tokenizers": tokenizers.__version__, "api": api_generation()}
