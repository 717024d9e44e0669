"""JSONL lines are bounded before pyarrow's reader sees them (delta_ray/_core/json_scan.py, applied by
delta_ray/batch/inputs.py): nesting depth, items and keys per line, found by a bytes-level scan
that does not count what lies inside strings. A 20,000-deep line made pyarrow's parser overflow its
stack (SIGSEGV: ``delta-ray tokenize`` died with status -11 and nothing on stderr), and a line of
200,000 distinct keys took hundreds of MB; both are now a ValueError naming the file and the byte
where the line starts."""
from __future__ import annotations

import gzip
import json
import os
import random
import re
import subprocess
import sys

import pyarrow as pa
import pyarrow.json as pj
import pytest

import delta_ray._core.json_scan as js
import delta_ray.batch.inputs as bi
from delta_ray._core import constants as C
from delta_ray._core.text_columns import BatchSpec
from delta_ray.batch.files import check_text_column

DEEP = 100_000


def _deep_line(n: int = DEEP) -> bytes:
    return b'{"text": "a", "x": ' + b"[" * n + b"]" * n + b"}\n"


def _cli(*args: str) -> subprocess.CompletedProcess:
    """``delta-ray tokenize`` in its own process: a crash there is a signal, not this test's."""
    env = dict(os.environ, RAY_ENABLE_AUTO_CONNECT="0")
    return subprocess.run([sys.executable, "-m", "delta_ray.apps.cli", "tokenize", *args],
                          capture_output=True, text=True, timeout=300, env=env)


def test_a_deep_line_is_a_clean_error_not_a_crash(tmp_path, tokenizer_paths):
    """100,000 levels (200 KB): refused by the schema check as the first line (status 2), and during
    the run past the first MiB (status 1), with a message naming the file and the line's byte;
    without the scan pyarrow's parser died of SIGSEGV (status -11, empty stderr) in both places."""
    first = tmp_path / "deep_first.jsonl"
    first.write_bytes(_deep_line())
    late = tmp_path / "deep_late.jsonl"
    normal = b'{"text": "hello world"}\n' * 100_000  # 2.4 MB: past the schema check's first MiB
    late.write_bytes(normal + _deep_line())
    for path, rc, offset in ((first, 2, 0), (late, 1, len(normal))):
        out = tmp_path / f"out-{path.stem}"
        proc = _cli("--tokenizer", tokenizer_paths["qwen-3"], str(path), "--output", str(out))
        assert proc.returncode == rc, (proc.returncode, proc.stderr[-2000:])
        assert str(path) in proc.stderr and f"byte {offset:,} " in proc.stderr, proc.stderr[-2000:]
        assert "MAX_JSON_DEPTH" in proc.stderr and "Traceback" not in proc.stderr
        assert not out.exists() or not list(out.glob("*.parquet"))


def test_depth_is_exact_and_strings_do_not_count():
    """A line as deep as the limit reads; one level more is refused, at its own line. Brackets,
    braces, commas, colons, escaped quotes and runs of backslashes inside strings count for
    nothing (100,000 of each in one line reads fine); a value spread over lines is as deep as its
    parse (pyarrow parses ``{"a":\\n[1]}`` as one record), so its depth carries across lines."""
    limit = C.MAX_JSON_DEPTH
    ok = b'{"text": "a", "x": ' + b"[" * (limit - 1) + b"]" * (limit - 1) + b"}\n"
    assert bi.json_table(ok).num_rows == 1
    noise = '[[[{{{,,,:::"\\\\' * 100_000 + '\\"[' + "\\" * 7 + '"]}'
    strings = json.dumps({"text": noise, "k": {"[": "]{", "\\": ['"', "\\\\\"", "[[[\\"]}}) + "\n"
    assert json.loads(strings)["text"] == noise
    table = bi.json_table(strings.encode() + ok)
    assert table.column("text").to_pylist() == [noise, "a"]
    deeper = b'{"text": "a", "x": ' + b"[" * limit + b"]" * limit + b"}\n"
    with pytest.raises(ValueError, match=f"byte {len(strings.encode()) + len(ok):,} .*deeper than {limit}"):
        bi.json_table(strings.encode() + ok + deeper, "f.jsonl")
    # 1,000 levels opened 20 a line: each line is shallow, the record is not (pyarrow reads it whole).
    spread = b'{"text": "a", "x":\n' + b"[" * 20 + b"\n" + (b"[" * 20 + b"\n") * 49 + b"]" * 1000 + b"}\n"
    assert pj.read_json(pa.BufferReader(spread)).num_rows == 1  # what a parse would do with it
    with pytest.raises(ValueError, match="deeper than"):
        bi.json_table(spread)


def _depth_items_keys(value) -> tuple[int, int, int]:
    """A parsed value's nesting depth, items (values and keys) and keys."""
    if isinstance(value, dict):
        kids = [_depth_items_keys(v) for v in value.values()]
        return (1 + max([d for d, _, _ in kids], default=0), 1 + len(value) + sum(i for _, i, _ in kids),
                len(value) + sum(k for _, _, k in kids))
    if isinstance(value, list):
        kids = [_depth_items_keys(v) for v in value]
        return 1 + max([d for d, _, _ in kids], default=0), 1 + sum(i for _, i, _ in kids), sum(k for _, _, k in kids)
    return 0, 1, 0


def _random_json(rng: random.Random, depth: int = 0):
    kind = rng.randrange(7 if depth < 6 else 3)
    if kind == 0:
        return rng.randrange(-10 ** 6, 10 ** 6)
    if kind == 1:  # strings full of what the scan must not count, and of escapes
        return "".join(rng.choice(',:[{}]"\\ \t\x01ab\u00e9\U0001F600') for _ in range(rng.randrange(12)))
    if kind == 2:
        return "\\" * rng.randrange(1, 9) + '"' * rng.randrange(3) + "[" * rng.randrange(3)
    if kind in (3, 4):
        return [_random_json(rng, depth + 1) for _ in range(rng.randrange(5))]
    return {_random_json(rng, 6) if rng.random() < 0.5 else f"k{i}": _random_json(rng, depth + 1)
            for i in range(rng.randrange(5))}


@pytest.mark.parametrize("dense", [0, 10 ** 9])  # backslashes found among the events / blanked by bytes.replace
def test_the_scan_is_exact_on_random_lines_cut_anywhere(monkeypatch, dense):
    """Random records (strings of brackets, quotes and backslash runs) fed in random cuts and slices
    of a few bytes: each limit set to a record's real depth or keys passes, one less is refused
    naming that record's line; items are counted from the structure (an upper bound of what a
    parse creates: ``,`` ``:`` ``[`` ``{`` outside strings, plus one)."""
    monkeypatch.setattr(js, "ESCAPES_DENSE", dense)
    rng = random.Random(5)
    for _ in range(300):
        monkeypatch.setattr(js, "SLICE_BYTES", rng.randrange(1, 40))
        records = [{"text": _random_json(rng, 5), "v": _random_json(rng)} for _ in range(4)]
        lines = [json.dumps(r, ensure_ascii=rng.random() < 0.5).encode() + rng.choice([b"\n", b"\r\n"])
                 for r in records]
        data = b"".join(lines)
        stats = [_depth_items_keys(r) for r in records]
        depth, keys = max(s[0] for s in stats), max(s[2] for s in stats)

        def feed(**limits):
            bound = js.JsonLinesBound("f", 7, **limits)
            at = 0
            while at < len(data):
                step = rng.randrange(1, 50)
                bound.feed(data[at:at + step])
                at += step

        items = max(_items_bound(ln) for ln in lines)
        feed(max_depth=depth, max_items=items, max_keys=keys)  # at the limits: read
        for limits, what in (({"max_depth": depth - 1}, "deeper"), ({"max_keys": keys - 1}, "object keys"),
                             ({"max_items": items - 1}, "JSON items")):
            first = next(n for n, ln in enumerate(lines) if {"deeper": stats[n][0] > depth - 1,
                                                            "object keys": stats[n][2] > keys - 1,
                                                            "JSON items": _items_bound(ln) > items - 1}[what])
            start = 7 + sum(len(ln) for ln in lines[:first])
            with pytest.raises(js.JsonTooComplex, match=f"byte {start:,} .*{what}"):
                feed(**limits)
        for (d, i, k), ln in zip(stats, lines):
            assert _items_bound(ln) >= i and d <= depth and k <= keys


def _items_bound(line: bytes) -> int:
    """``,`` ``:`` ``[`` ``{`` outside strings, plus one, by a plain state machine."""
    count, inside, esc = 1, False, False
    for b in line:
        if esc:
            esc = False
        elif b == 0x5C:
            esc = True
        elif b == 0x22:
            inside = not inside
        elif not inside and b in b",:[{":
            count += 1
    return count


def test_too_many_keys_or_items_are_refused_before_pyarrow(tmp_path, monkeypatch):
    """A line of 70,000 distinct keys (pyarrow: a column each, hundreds of MB) or of 1.1 million
    values is refused, naming the file and the line, before pyarrow reads anything; one under
    the limits reads."""
    parsed = []
    real = pj.read_json
    monkeypatch.setattr(bi.pj, "read_json", lambda *a, **k: parsed.append(1) or real(*a, **k))
    head = b'{"text": "ok"}\n' * 10
    many_keys = b'{"text": "a", ' + b",".join(b'"k%d": 1' % i for i in range(C.MAX_JSON_KEYS + 10)) + b"}\n"
    many_items = b'{"text": "a", "ids": [' + b",".join([b"0"] * (C.MAX_JSON_ITEMS + 10)) + b"]}\n"
    for name, line, what in (("keys", many_keys, "object keys"), ("items", many_items, "JSON items")):
        path = tmp_path / f"{name}.jsonl.gz"
        path.write_bytes(gzip.compress(head + line + head))
        spec = BatchSpec()
        with pytest.raises(ValueError, match=f"{re.escape(str(path))}: .*byte {len(head)} .*more than .*{what}"):
            list(bi.stream_tables(str(path), "json", spec))
        with pytest.raises(ValueError, match=f"byte {len(head)} "):
            bi.check_json_file(str(path))
        assert parsed == []
    under = b'{"text": "a", ' + b",".join(b'"k%d": 1' % i for i in range(1000)) + b"}\n"
    assert bi.json_table(under).num_columns == 1001 and parsed == [1]


def test_the_schema_check_refuses_a_deep_first_line(tmp_path):
    """The schema check parses the first MiB with pyarrow: bounded too (it crashed first)."""
    path = tmp_path / "deep.jsonl"
    path.write_bytes(_deep_line(C.MAX_JSON_DEPTH + 1))
    with pytest.raises(ValueError, match=f"{re.escape(str(path))}: .*byte 0 .*deeper than"):
        check_text_column(str(path), BatchSpec())


def test_ray_data_reads_are_checked_first(tmp_path, monkeypatch):
    """``--ray-data`` hands JSONL files to Ray Data's ``read_json`` (pyarrow's reader in the
    workers, past inputs.py): each file is scanned before it is handed over."""
    import ray.data

    from delta_ray.apps import tokenize_cli

    handed = []
    monkeypatch.setattr(ray.data, "read_json", lambda paths, **kw: handed.append(paths) or pytest.fail("read"))
    path = tmp_path / "deep.jsonl"
    path.write_bytes(b'{"text": "ok"}\n' + _deep_line())
    with pytest.raises(ValueError, match=f"{re.escape(str(path))}: .*byte 15 .*deeper than"):
        tokenize_cli._read({"json": [str(path)]}, "text")
    assert handed == []


def test_a_normal_file_reads_identically_and_every_byte_is_scanned(tmp_path, monkeypatch):
    """Ordinary JSONL (nested records, escapes, non-ASCII, CRLF, a last line without a newline)
    reads exactly as pyarrow reads it unchecked, in pieces of any size; the scan sees each byte of
    the input once."""
    rng = random.Random(11)
    rows = [{"text": "".join(rng.choice(['a', ' ', '"', '\\', '[', '{', ',', ':', '\u00e9', '\n', '\U0001F600'])
                             for _ in range(rng.randrange(200))),
             "meta": {"id": i, "tags": [rng.choice(["x", "y"]) for _ in range(rng.randrange(4))]},
             "score": rng.random()} for i in range(3000)]
    data = "".join(json.dumps(r, ensure_ascii=i % 2 == 0) + ("\r\n" if i % 7 == 0 else "\n")
                   for i, r in enumerate(rows)).encode()[:-1]
    path = tmp_path / "normal.jsonl"
    path.write_bytes(data)
    want = pj.read_json(pa.BufferReader(data), read_options=pj.ReadOptions(block_size=len(data) + 1))
    scanned = []
    real = js.JsonLinesBound.feed
    monkeypatch.setattr(js.JsonLinesBound, "feed", lambda self, d: scanned.append(len(d)) or real(self, d))
    assert bi.read_json(str(path)).equals(want)
    assert sum(scanned) == len(data)
    for batch_bytes in (4096, 100_000):
        scanned.clear()
        pieces = bi.stream_tables(str(path), "json", BatchSpec(batch_bytes=batch_bytes))
        got = [row for t in pieces for row in t.to_pylist()]
        assert got == rows and sum(scanned) == len(data)
    scanned.clear()
    bi.check_json_file(str(path), block_bytes=777)
    assert sum(scanned) == len(data)
