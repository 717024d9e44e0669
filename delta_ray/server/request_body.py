"""A request body from bytes to JSON in steps that each hold the GIL briefly: a bound on the
number of JSON items before any parse, and /detokenize's ID list parsed in slices.

A parse in a thread still stalls the replica's event loop: orjson holds the GIL for a whole parse
(tens of nanoseconds per item: a million IDs or 200,000 chat messages held the loop for 40-400 ms
on a 2-core VM), and the loop cannot run until it ends. So every body past a few kilobytes is
first scanned in slices of at most ``SCAN_SLICE_BYTES`` (each a handful of C calls, the GIL free
between them) for an upper bound on the items a parse would create; a body over the bound is
refused with 413 before it is parsed. A /detokenize body, whose size is its ID list, is parsed a
slice of IDs at a time instead (:func:`parse_id_body`). Ray-free.
"""
from __future__ import annotations

import re
import secrets
from typing import Any

import orjson

from .._core.json_scan import SLICE_BYTES, Structure, items_in
from .http_api import BadRequest, loads_json
from .serve_config import DEFAULT_MAX_JSON_ITEMS  # noqa: F401 - the bound's default, re-exported

BOUND_FROM_BYTES = 16 * 1024  # smaller bodies are parsed at once (under 8,192 items: well under a millisecond)
SCAN_SLICE_BYTES = SLICE_BYTES  # bytes one step of the item scan reads
ID_SLICE_BYTES = 256 * 1024  # bytes of a /detokenize ID list one orjson call parses (under 128K IDs)
BYTES_PER_ID = 16  # a /detokenize body may spend this many bytes per allowed ID ("\n        128000,")
ID_BODY_OTHER_BYTES = 64 * 1024  # what a sliced /detokenize body may carry besides its ID list

_NOT_STRUCTURAL = bytes(b for b in range(256) if b not in b",:[{")
_TOKENS_ARRAY = re.compile(rb'"tokens"[ \t\n\r]*:[ \t\n\r]*\[')  # JSON whitespace only
_ID_BYTES = b"0123456789-, \t\n\r"
_TRIES = 4  # '"tokens": [' occurrences tried before the body is scanned as any other


def detokenize_max_bytes(max_tokens: int, max_body: int) -> int:
    """The largest /detokenize body read: ``BYTES_PER_ID`` per allowed ID plus room for the other
    fields, at most ``max_body`` (a body past it is refused by its Content-Length, unread)."""
    return min(max_body, max_tokens * BYTES_PER_ID + ID_BODY_OTHER_BYTES)


def item_bound(raw: bytes, limit: int) -> int:
    """An upper bound on the items (values and object keys) a JSON parse of ``raw`` would create,
    or some number past ``limit`` as soon as that is certain.

    Counts ``,`` ``:`` ``[`` ``{`` outside strings, plus one: each container's first item, each
    further item and each key needs one of them. Strings are found by the shared bytes-level scan
    (:class:`delta_ray._core.json_scan.Structure`, which bounds JSONL inputs too), slice by slice: a
    slice may end inside a string or a run of backslashes. A byte that is not valid JSON where it
    stands only makes the count after it inexact, and a parse stops there, so the bound holds for
    what a parse reads.
    """
    structure, count, quotes = Structure(), 1, 0
    for pos in range(0, len(raw), SCAN_SLICE_BYTES):
        _, codes, q = structure.scan(raw[pos:pos + SCAN_SLICE_BYTES])
        quotes += q
        if quotes > 2 * limit + 2:  # more strings than the limit allows items
            return limit + 1
        count += items_in(codes)
        if count > limit:
            return count
    return count


def structural_bound(raw: bytes, limit: int) -> int:
    """A looser upper bound than :func:`item_bound`, several times cheaper: ``,`` ``:`` ``[`` ``{``
    counted everywhere, inside strings too, plus one (or some number past ``limit`` once certain).

    A prompt's text has a few structural bytes per hundred, so for most bodies this bound is
    already under the limit and the string-aware scan (whose escape handling costs about 4 ms a
    megabyte here) never runs."""
    count = 1
    for pos in range(0, len(raw), SCAN_SLICE_BYTES):
        count += len(raw[pos:pos + SCAN_SLICE_BYTES].translate(None, _NOT_STRUCTURAL))
        if count > limit:
            return count
    return count


def parse_bounded(raw: bytes, max_items: int) -> Any:
    """``raw`` parsed, if it carries at most ``max_items`` items; else a 413 before any parse."""
    if len(raw) > BOUND_FROM_BYTES and structural_bound(raw, max_items) > max_items \
            and item_bound(raw, max_items) > max_items:
        raise BadRequest(f"the request body carries more than {max_items:,} JSON values", 413)
    return loads_json(raw)


def parse_id_body(raw: bytes, max_tokens: int, max_items: int) -> Any:
    """A /detokenize body parsed with its ``tokens`` list read ``ID_SLICE_BYTES`` at a time; a
    list past ``max_tokens`` IDs is refused (413) as soon as a slice passes it.

    The list is found by ``"tokens": [`` and the first ``]`` after it, then proven to be the
    body's ``tokens`` value: the body with that span replaced by a random number (the sentinel)
    must parse to an object whose ``tokens`` is that number. Nobody can guess the sentinel, so a
    span inside a string, a nested object or a duplicate key never passes. Bodies this cannot
    read (a key spelled with escapes, long other fields) are parsed whole, within ``max_items``.
    """
    if len(raw) <= BOUND_FROM_BYTES:
        return loads_json(raw)
    for i, m in enumerate(_TOKENS_ARRAY.finditer(raw)):
        if i == _TRIES:
            break
        start = m.end()
        end = raw.find(b"]", start)
        if end < 0 or len(raw) - (end - start) > ID_BODY_OTHER_BYTES:
            continue
        sentinel = -(10 ** 18 + secrets.randbelow(10 ** 18))
        try:
            body = orjson.loads(b"%s%d%s" % (raw[:start - 1], sentinel, raw[end + 1:]))
        except orjson.JSONDecodeError:
            continue
        if isinstance(body, dict) and type(body.get("tokens")) is int and body["tokens"] == sentinel:
            body["tokens"] = _parse_ids(raw, start, end, max_tokens)
            return body
    if item_bound(raw, max_items) > max_items:
        raise BadRequest(f"a /detokenize body with more than {max_items:,} JSON values must be an object with "
                         f"'tokens' (a list of integers) and at most {ID_BODY_OTHER_BYTES:,} bytes of other "
                         "fields", 413)
    return loads_json(raw)


def _parse_ids(raw: bytes, start: int, end: int, max_tokens: int) -> list:
    """The JSON array whose elements are ``raw[start:end]``, parsed a slice at a time (each slice
    ends before a comma, so each is a run of whole elements and parses as the whole would)."""
    ids: list = []
    pos, first = start, True
    while True:
        cut = raw.find(b",", pos + ID_SLICE_BYTES, end) if pos + ID_SLICE_BYTES < end else -1
        last = cut < 0
        piece = raw[pos:end if last else cut]
        if piece.translate(None, _ID_BYTES):  # a string, a nested value, a float, true/false/null...
            raise BadRequest("field 'tokens' must be a list of integers")
        try:
            got = orjson.loads(b"[%s]" % piece)
        except orjson.JSONDecodeError as exc:
            raise BadRequest(f"malformed JSON in 'tokens': {str(exc)[:200]}") from None
        if not got and not (first and last):  # an empty element: "[1,,2]" or "[1, ]"
            raise BadRequest("malformed JSON in 'tokens': an empty element")
        ids += got
        if len(ids) > max_tokens:
            raise BadRequest(f"more than {max_tokens:,} token ids: the limit per request", 413)
        if last:
            return ids
        pos, first = cut + 1, False
