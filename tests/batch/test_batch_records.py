"""The batch reader's lines: newline-free inputs are neither held whole nor scanned quadratically;
one line is capped by ``max_record_bytes`` with an error naming the file and the byte offset."""
from __future__ import annotations

import gzip
import json
import random
import tracemalloc
import zlib

import pytest

import delta_ray.batch.inputs as bi
from delta_ray._core.text_columns import BatchSpec
from delta_ray.batch.files import check_text_column
from delta_ray.batch.inputs import RecordTooLong, line_chunks, stream_tables

MiB = 1 << 20


def _gz_bomb(path, size: int, head: bytes = b"", byte: bytes = b"a") -> None:
    """A gzip file of ``head`` then ``size`` bytes without a newline (a few KiB on disk)."""
    comp = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = byte * MiB
    with open(path, "wb") as fh:
        fh.write(comp.compress(head))
        for _ in range(size // MiB):
            fh.write(comp.compress(block))
        fh.write(comp.flush())


def _old_chunks(data: bytes, max_bytes: int) -> list[bytes]:
    """The pieces the reader gave before the cap (the rows must stay exactly the same)."""
    out, rest = [], b""
    for i in range(0, len(data), max_bytes):
        buf = rest + data[i:i + max_bytes]
        cut = buf.rfind(b"\n") + 1
        if cut == 0:
            rest = buf
            continue
        rest = buf[cut:]
        out.append(buf[:cut])
    return out + ([rest] if rest else [])


def test_a_newline_free_gz_is_refused_early_with_bounded_memory(tmp_path):
    """48 MiB without a newline in a .gz of a few KiB: refused once the line passes the cap, holding
    about the cap plus a block (it was held whole: 192 MiB took 707 MiB), naming file and offset."""
    path = tmp_path / "bomb.txt.gz"
    _gz_bomb(path, 48 * MiB, head=b"ok\n" * 1000)
    assert path.stat().st_size < 200_000
    cap, block = 2 * MiB, 256 * 1024
    small = tmp_path / "small.txt"
    small.write_bytes(b"warm\n")
    list(stream_tables(str(small), "text", BatchSpec()))  # imports done before memory is traced
    tracemalloc.start()
    try:
        with pytest.raises(RecordTooLong, match="max_record_bytes") as info:
            for _ in stream_tables(str(path), "text", BatchSpec(batch_bytes=block, max_record_bytes=cap)):
                pass
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert isinstance(info.value, ValueError)
    assert str(path) in str(info.value) and "byte 3,000 " in str(info.value)  # after the 1,000 short lines
    assert peak < cap + 4 * block, f"held {peak / MiB:.1f} MiB for a cap of {cap / MiB:.0f} MiB"


def test_the_schema_check_reads_a_bounded_head(tmp_path):
    """The JSONL schema check takes the first whole line: on a newline-free input it stops at the
    cap (it read the whole input in 1 MiB steps, O(n^2))."""
    path = tmp_path / "bomb.jsonl.gz"
    _gz_bomb(path, 48 * MiB, head=b'{"text": "')
    small = tmp_path / "small.jsonl"
    small.write_bytes(b'{"text": "warm"}\n')
    check_text_column(str(small), BatchSpec())  # imports done before memory is traced
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match="byte 0 .*max_record_bytes"):
            check_text_column(str(path), BatchSpec(max_record_bytes=4 * MiB))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * MiB + 4 * MiB, f"held {peak / MiB:.1f} MiB for a cap of 4 MiB"


@pytest.mark.parametrize("n_blocks", [16, 64])
def test_a_long_line_is_scanned_once(tmp_path, monkeypatch, n_blocks):
    """Each block is searched for a newline once: the bytes scanned equal the input's size for any
    line length (scanning the held line again at each block was quadratic: 4x the line, 16x work)."""
    block = 4096
    data = b"x" * (n_blocks * block - 1) + b"\n" + b"tail"
    path = tmp_path / "long.txt.gz"
    path.write_bytes(gzip.compress(data))
    scanned = [0]
    real = bi.newline_cut

    def counting(buf):
        scanned[0] += len(buf)
        return real(buf)
    monkeypatch.setattr(bi, "newline_cut", counting)
    chunks = list(line_chunks(str(path), block, max_record_bytes=len(data)))
    assert chunks == [data[:-4], b"tail"]
    assert scanned[0] == len(data)


def test_pieces_are_unchanged_and_the_cap_is_exact(tmp_path):
    """Under the cap the pieces are exactly the earlier reader's (so the rows are too), for blocks
    smaller and larger than the cap; a line of exactly the cap passes, one byte more is refused at
    its own offset, wherever it lies relative to the blocks."""
    rng = random.Random(7)
    lines = [b"y" * rng.choice([0, 1, 2, 5, 17, 40, 99]) for _ in range(400)]
    data = b"\n".join(lines) + b"\n" + b"last line without newline"
    path = tmp_path / "lines.txt"
    path.write_bytes(data)
    for max_bytes in (1, 3, 16, 64, 1000, len(data) + 5):
        assert list(line_chunks(str(path), max_bytes, max_record_bytes=1000)) == _old_chunks(data, max_bytes)
    cap = 50
    for before in (0, 7, 63, 64, 130):
        for max_bytes in (8, 64, 200):  # blocks smaller and larger than the cap
            ok = b"z" * before + b"\n" + b"w" * cap + b"\n" + b"short\n"
            p = tmp_path / "cap.txt"
            p.write_bytes(ok)
            assert b"".join(line_chunks(str(p), max_bytes, max_record_bytes=max(cap, before))) == ok
            bad = b"z" * 3 + b"\n" + b"q" * before + b"\n" + b"w" * (cap + 1) + b"\nafter\n"
            p.write_bytes(bad)
            if before > cap:
                start = 4  # the first line over the cap is the one of `before` bytes
            else:
                start = 4 + before + 1
            with pytest.raises(RecordTooLong, match=f"byte {start:,} "):
                list(line_chunks(str(p), max_bytes, max_record_bytes=cap))
    end = tmp_path / "end.txt"
    end.write_bytes(b"a\n" + b"b" * (cap + 1))  # an over-long last line without a newline
    with pytest.raises(RecordTooLong, match="byte 2 "):
        list(line_chunks(str(end), 16, max_record_bytes=cap))


def test_the_cli_refuses_a_newline_free_input_before_any_work(tmp_path, tokenizer_paths, capsys):
    """``delta-ray tokenize --max-record-bytes``: a usage error (status 2) naming the file, no output."""
    from delta_ray.apps.cli import main

    path = tmp_path / "bomb.jsonl.gz"
    _gz_bomb(path, 8 * MiB, head=b'{"text": "')
    out = tmp_path / "out"
    rc = main(["tokenize", "--tokenizer", tokenizer_paths["qwen-3"], str(path), "--output", str(out),
               "--max-record-bytes", str(MiB)])
    err = capsys.readouterr().err
    assert rc == 2 and str(path) in err and "byte 0 " in err and "1,048,576" in err
    assert not out.exists()
    ok = tmp_path / "ok.jsonl"
    ok.write_text(json.dumps({"text": "x" * 100}) + "\n")
    assert main(["tokenize", "--tokenizer", tokenizer_paths["qwen-3"], str(ok), "--output", str(out),
                 "--max-record-bytes", "0"]) == 2
    assert "max_record_bytes" in capsys.readouterr().err
