"""Request bodies parsed in steps that hold the GIL briefly (delta_ray/server/request_body.py), Ray-free: the
item bound is an upper bound of what a parse creates, and the sliced /detokenize parse answers
exactly as one orjson parse of the whole body does."""
from __future__ import annotations

import json
import random

import orjson
import pytest

from delta_ray.server import request_body as rb
from delta_ray.server.http_api import BadRequest


def _items(value) -> int:
    """Values and object keys in a parsed JSON value (what a parse creates)."""
    if isinstance(value, dict):
        return 1 + sum(1 + _items(v) for v in value.values())
    if isinstance(value, list):
        return 1 + sum(_items(v) for v in value)
    return 1


def _random_json(rng: random.Random, depth: int = 0):
    kind = rng.randrange(7 if depth < 4 else 4)
    if kind == 0:
        return rng.randrange(-10 ** 6, 10 ** 6)
    if kind == 1:  # strings full of what the scan must not count, and of escapes
        alphabet = ',:[{}]"\\ \n\tab\u00e9\u65e5\U0001F600'
        return "".join(rng.choice(alphabet) for _ in range(rng.randrange(12)))
    if kind == 2:
        return rng.choice([True, False, None, 1.5])
    if kind == 3:
        return "\\" * rng.randrange(1, 9) + '"' * rng.randrange(3)
    if kind in (4, 5):
        return [_random_json(rng, depth + 1) for _ in range(rng.randrange(6))]
    return {str(_random_json(rng, 4)): _random_json(rng, depth + 1) for _ in range(rng.randrange(5))}


def test_the_item_bound_is_an_upper_bound_and_tight_on_structure(monkeypatch):
    """Escaped quotes and backslash runs across slice boundaries, structural bytes inside strings:
    the bound never falls below what a parse creates, and counts nothing inside strings."""
    monkeypatch.setattr(rb, "SCAN_SLICE_BYTES", 7)  # every body crosses many slice boundaries
    rng = random.Random(47)
    for _ in range(3000):
        value = _random_json(rng)
        for raw in (orjson.dumps(value), json.dumps(value, indent=1).encode(), json.dumps(value).encode()):
            assert rb.item_bound(raw, 10 ** 9) >= _items(value), raw
    # Strings carry no weight however many structural bytes (or escaped quotes) they hold.
    assert rb.item_bound(orjson.dumps({"prompt": ',:[{"\\' * 10_000}), 10 ** 9) == 3
    assert rb.item_bound(orjson.dumps([{}] * 1000), 10 ** 9) == 1 + 1 + 1000 + 999  # opens and commas, plus one
    assert rb.item_bound(orjson.dumps([0] * 100_000), 5_000) > 5_000  # stops early past the limit
    assert rb.item_bound(b'"' * 100_000, 5_000) > 5_000  # many strings are many items


def test_a_body_past_the_item_bound_is_refused_before_it_is_parsed(monkeypatch):
    calls = []
    monkeypatch.setattr(rb, "loads_json", lambda raw: calls.append(raw))
    big = orjson.dumps({"messages": [{"role": "user", "content": "x"}] * 20_000})
    with pytest.raises(BadRequest) as info:
        rb.parse_bounded(big, 65_536)
    assert info.value.status == 413 and "65,536" in str(info.value) and not calls
    long_prompt = orjson.dumps({"prompt": "a, b: [c] {d}" * 100_000})  # structure only in its string
    rb.parse_bounded(long_prompt, 65_536)
    assert calls == [long_prompt]


def _same_as_whole(raw: bytes, max_tokens: int = 10 ** 6):
    """parse_id_body's answer equals orjson's on the whole body, or both refuse it."""
    try:
        want = orjson.loads(raw)
    except orjson.JSONDecodeError:
        want = BadRequest
    try:
        got = rb.parse_id_body(raw, max_tokens, 65_536)
    except BadRequest:
        got = BadRequest
    if want is not BadRequest and got is BadRequest:  # refused only where the IDs are not integers
        tokens = want.get("tokens") if isinstance(want, dict) else None
        assert not (isinstance(tokens, list) and all(type(t) is int for t in tokens)), raw[:200]
        return
    assert got == want, raw[:200]


@pytest.mark.parametrize("slice_bytes", [5, 64, 1 << 18])
def test_sliced_ids_parse_as_the_whole_body_does(monkeypatch, slice_bytes):
    monkeypatch.setattr(rb, "BOUND_FROM_BYTES", 0)  # every body takes the sliced path
    monkeypatch.setattr(rb, "ID_SLICE_BYTES", slice_bytes)
    ids = list(range(0, 300_000, 7))
    bodies = [
        orjson.dumps({"tokens": ids}), json.dumps({"model": "m", "tokens": ids}, indent=2).encode(),
        json.dumps({"tokens": ids, "cache_salt": "s"}).encode(), b'{"tokens":[]}', b'{"tokens": [ ] }',
        b'{"tokens":[1,2,]}', b'{"tokens":[1,,2]}', b'{"tokens":[,1]}', b'{"tokens":[1 2]}', b'{"tokens":[01]}',
        b'{"tokens":[1,-0,3]}', b'{"tokens":[1,2.5]}', b'{"tokens":[1,true]}', b'{"tokens":[1,"2"]}',
        b'{"tokens":[1,[2]]}', b'{"tokens":[1,{"a":2}]}', b'{"tokens":[1,null]}', b'{"tokens":[18446744073709551616]}',
        # the span found is inside a string, a nested key, a duplicate, or the key is escaped
        b'{"model":"\\"tokens\\":[5]","tokens":[1,2]}', b'{"model":"tokens","tokens":[1,2]}',
        b'{"cache_salt":{"tokens":[9,9]},"tokens":[1,2]}', b'{"tokens":[1,2],"tokens":[3]}',
        b'{"tokens":[1,2],"tokens":[]}', b'{"tokens":[3],"tokens":[1,2]}', b'{"\\u0074okens":[1,2]}',
        b'{"model":"[1,2]","tokens":[7]}', b'{"tokens":[1,2]', b'{"tokens":[1,2]} x', b'[{"tokens":[1]}]',
        b'{"tokens":[1,2]}\n{"tokens":[3]}', b'{"tokens":[1,2],"model":"m"}',
    ]
    whole = []
    real = rb.loads_json
    monkeypatch.setattr(rb, "loads_json", lambda raw: whole.append(raw) or real(raw))
    for raw in bodies[:3]:  # the shapes clients send are read a slice at a time, never whole
        _same_as_whole(raw)
    assert whole == []
    for raw in bodies[3:]:
        _same_as_whole(raw)
    rng = random.Random(7)
    for _ in range(300):  # random edits of a valid body
        raw = bytearray(b'{"model": "m", "tokens": [1, 22, 333, 4444, 55555], "cache_salt": "x"}')
        for _ in range(rng.randrange(1, 3)):
            i = rng.randrange(len(raw))
            raw[i:i + rng.randrange(2)] = bytes([rng.choice(b'0123456789,-[]{}":. etk\\')])
        _same_as_whole(bytes(raw))


def test_sliced_ids_stop_at_the_limit(monkeypatch):
    monkeypatch.setattr(rb, "ID_SLICE_BYTES", 1024)
    seen = []
    real = orjson.loads
    monkeypatch.setattr(rb.orjson, "loads", lambda b: seen.append(len(b)) or real(b))
    with pytest.raises(BadRequest) as info:
        rb.parse_id_body(orjson.dumps({"tokens": [1] * 1_000_000}), 10_000, 65_536)
    assert info.value.status == 413
    assert sum(seen) < 64 * 1024  # a few slices past the limit were read, not two megabytes


def test_a_detokenize_body_is_capped_by_its_id_limit():
    assert rb.detokenize_max_bytes(1 << 20, 64 << 20) == (1 << 20) * 16 + 64 * 1024
    assert rb.detokenize_max_bytes(1 << 20, 1 << 20) == 1 << 20  # never past the body limit


def test_a_million_ids_are_parsed_a_slice_per_call(monkeypatch):
    """orjson holds the GIL for a whole call, so the event loop waits for the longest one: a
    million IDs (a 30-40 ms parse at once) go through calls of at most a slice each."""
    seen = []
    real = orjson.loads
    monkeypatch.setattr(rb.orjson, "loads", lambda b: seen.append(len(b)) or real(b))
    ids = [9906, 1917, 13] * 333_333
    for raw in (orjson.dumps({"model": "m", "tokens": ids}), json.dumps({"tokens": ids, "model": "m"}).encode()):
        seen.clear()
        assert rb.parse_id_body(raw, 1 << 20, 65_536) == {"model": "m", "tokens": ids}
        assert len(seen) > 10 and max(seen) <= rb.ID_SLICE_BYTES + 16


def test_the_cheap_bound_spares_prose_the_string_aware_scan(monkeypatch):
    """Counting structural bytes everywhere is an upper bound too: a prompt of prose stays under the
    limit with it, so the escape-aware scan never runs; past it the exact scan still decides."""
    scans = []
    real = rb.item_bound
    monkeypatch.setattr(rb, "item_bound", lambda raw, limit: scans.append(len(raw)) or real(raw, limit))
    prose = orjson.dumps({"prompt": 'He said "yes", then: no.\n' * 40_000})  # 1 MB, 80,000 structural bytes
    assert rb.structural_bound(prose, 10 ** 9) == 1 + 80_000 + 2  # inside the string, the object and its colon
    rb.parse_bounded(prose, 100_000)
    assert scans == []
    assert rb.parse_bounded(prose, 65_536)["prompt"].startswith("He said")  # loose bound over: the exact scan
    assert scans == [len(prose)]
    for value in ([0] * 70_000, {"messages": [{"role": "user"}] * 40_000}):
        with pytest.raises(BadRequest):  # both bounds over: refused unparsed
            rb.parse_bounded(orjson.dumps(value), 65_536)
