"""Files to Parquet on this machine: every row exact, output from flat buffers, atomic and resumable."""
from __future__ import annotations

import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from delta_ray import DeltaTokenizer
from delta_ray._tokenizer_core import TokenizerCore
from delta_ray.batch.files import Options, output_name, tokenize_files, verify_outputs
from delta_ray.batch.inputs import byte_slices


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, real_texts):
    d = tmp_path_factory.mktemp("inputs")
    src = real_texts["english"] + real_texts["multilingual"] + real_texts["code"]
    rows = [src[i * 311:i * 311 + 50 + (i * 97) % 3000] for i in range(600)] + [src[:150_000], ""]
    pq.write_table(pa.table({"id": list(range(len(rows))), "text": rows}), d / "a.parquet", row_group_size=64)
    (d / "b.txt").write_text("\n".join(r.replace("\n", " ") for r in rows[:200] if r) + "\n\n", encoding="utf-8")
    with gzip.open(d / "c.jsonl.gz", "wt", encoding="utf-8") as fh:
        for i, r in enumerate(rows[200:400]):
            fh.write(json.dumps({"text": r, "n": i}) + "\n")
    return [str(d / "a.parquet"), str(d / "b.txt"), str(d / "c.jsonl.gz")]


def _rows(path):
    if path.endswith(".parquet"):
        return pq.read_table(path).column("text").to_pylist()
    if path.endswith(".txt"):
        return [ln for ln in open(path, encoding="utf-8").read().splitlines() if ln]
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        return [json.loads(ln)["text"] for ln in fh]


@pytest.mark.parametrize("name", ["llama3.2", "minimax-m3"])
def test_every_row_is_exact_and_order_is_kept(name, inputs, tmp_path, tokenizer_paths, references):
    ref = references[name]
    # the user's facade (DeltaTokenizer) and the core it wraps are both accepted
    make = TokenizerCore if name == "llama3.2" else DeltaTokenizer
    dt = make(tokenizer_paths[name], chunk_size=8192, cut_threshold=20_000, reuse="none")
    opts = Options(batch_bytes=64 * 1024)
    summary = tokenize_files(inputs, str(tmp_path), dt, opts, threads=2)
    assert summary.skipped == 0 and summary.documents == sum(len(_rows(p)) for p in inputs)
    for p in inputs:
        table = pq.read_table(tmp_path / output_name(p))
        texts = _rows(p)
        assert table.column("text").to_pylist() == texts
        want = [e.ids for e in ref.encode_batch(texts)]
        assert table.column("input_ids").to_pylist() == want
        assert table.column("num_tokens").to_pylist() == [len(w) for w in want]
        assert table.schema.field("input_ids").type == pa.list_(pa.int32())
    checked, bad = verify_outputs(inputs, str(tmp_path), ref, opts, 40)
    assert checked == 40 and bad == []


def test_a_killed_run_rerun_gives_the_uninterrupted_output(inputs, tmp_path, tokenizer_paths):
    dt = TokenizerCore(tokenizer_paths["qwen-3"], reuse="none")
    opts = Options(batch_bytes=32 * 1024)
    whole = tmp_path / "whole"
    tokenize_files(inputs, str(whole), dt, opts, threads=2)
    killed = tmp_path / "killed"
    calls = {"n": 0}

    def die(done, total, tokens):
        calls["n"] += 1
        if calls["n"] == 5:  # mid-run, with a half-written output of the first input on disk
            raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        tokenize_files(inputs, str(killed), dt, opts, threads=2, progress=die)
    assert not (killed / output_name(inputs[0])).exists()  # nothing half-written under a final name
    again = tokenize_files(inputs, str(killed), dt, opts, threads=2)
    assert again.skipped == 0
    for p in inputs:
        assert pq.read_table(killed / output_name(p)).equals(pq.read_table(whole / output_name(p)))
    assert not [f for f in killed.iterdir() if "tmp" in f.name]
    rerun = tokenize_files(inputs, str(killed), dt, opts, threads=2)  # everything done: all skipped
    assert rerun.skipped == len(inputs) and rerun.documents == 0


def test_a_changed_input_is_redone(inputs, tmp_path, tokenizer_paths, references):
    import shutil
    src = tmp_path / "x.parquet"
    shutil.copy(inputs[0], src)
    dt = TokenizerCore(tokenizer_paths["glm-4"], reuse="none")
    out = tmp_path / "out"
    tokenize_files([str(src)], str(out), dt, Options(), threads=1)
    pq.write_table(pa.table({"text": ["changed text"]}), src)
    s = tokenize_files([str(src)], str(out), dt, Options(), threads=1)
    assert s.skipped == 0
    assert pq.read_table(out / output_name(str(src))).column("input_ids").to_pylist() == \
        [references["glm-4"].encode("changed text").ids]


def test_bad_inputs_are_clear_errors(tmp_path, tokenizer_paths):
    dt = TokenizerCore(tokenizer_paths["glm-4"], reuse="none")
    p = tmp_path / "n.parquet"
    pq.write_table(pa.table({"text": ["a", None]}), p)
    with pytest.raises(ValueError, match="null"):
        tokenize_files([str(p)], str(tmp_path / "o"), dt, Options(), threads=1)
    q = tmp_path / "m.parquet"
    pq.write_table(pa.table({"body": ["a"]}), q)
    with pytest.raises(ValueError, match="no text column"):
        tokenize_files([str(q)], str(tmp_path / "o2"), dt, Options(), threads=1)


def test_many_inputs_are_written_concurrently_without_a_thread_each(tmp_path, tokenizer_paths, references):
    """Each input has its own writer thread while it is written, and only then: 300 small inputs
    never hold 300 threads, and every output is exact and complete."""
    import threading
    dt = TokenizerCore(tokenizer_paths["qwen-3"], reuse="none")
    files = []
    for i in range(300):
        p = tmp_path / f"in{i:03d}.parquet"
        pq.write_table(pa.table({"text": [f"document {i}: hello", f"world {i * 7}", ""]}), p)
        files.append(str(p))
    peak = [0]

    def seen(*_):
        peak[0] = max(peak[0], threading.active_count())
    s = tokenize_files(files, str(tmp_path / "out"), dt, Options(), threads=2, progress=seen)
    assert s.documents == 900 and peak[0] <= threading.active_count() + 2 + 2 * 2 + 1
    for p in files[::37]:
        got = pq.read_table(tmp_path / "out" / output_name(p)).column("input_ids").to_pylist()
        assert got == [references["qwen-3"].encode(t).ids for t in pq.read_table(p).column("text").to_pylist()]


def test_a_large_row_group_is_split_into_units_that_encode_in_parallel(tmp_path, real_texts, tokenizer_paths,
                                                                      references, monkeypatch):
    """pyarrow writes a file as one row group by default: it must not become one unit (one thread,
    every text of the file as Python strings at once). Its batches keep the input's row order."""
    import delta_ray.batch.files as bf
    src = real_texts["english"] + real_texts["multilingual"] + real_texts["code"]
    rows = [src[i * 173:i * 173 + 20 + (i * 131) % 2500] for i in range(900)] + [src[:60_000], "", src[5:9]]
    path = tmp_path / "layout.parquet"
    table = pa.table({"text": rows})
    with pq.ParquetWriter(path, table.schema) as w:  # a small group, a large one, a small one
        for a, b in ((0, 20), (20, len(rows) - 20), (len(rows) - 20, len(rows))):
            w.write_table(table.slice(a, b - a))
    assert pq.ParquetFile(path).metadata.num_row_groups == 3
    opts = Options(batch_bytes=64 * 1024)
    sizes = []
    real = bf.encode_table
    monkeypatch.setattr(bf, "encode_table", lambda dt, table, o: sizes.append(table.num_rows) or real(dt, table, o))
    dt = TokenizerCore(tokenizer_paths["llama3.2"], chunk_size=8192, cut_threshold=20_000, reuse="none")
    tokenize_files([str(path)], str(tmp_path / "out"), dt, opts, threads=2)
    assert len(sizes) > 10 and sum(sizes) == len(rows)  # many units, every row once
    table = pq.read_table(tmp_path / "out" / output_name(str(path)))
    assert table.column("text").to_pylist() == rows
    assert table.column("input_ids").to_pylist() == [e.ids for e in references["llama3.2"].encode_batch(rows)]


@pytest.mark.parametrize("limit", [1, 5, 64, 1000])
def test_byte_slices_cover_every_row_once_within_the_limit(limit):
    texts = pa.array(["", "a", "é" * 40, "x" * 7, "语" * 300, "", "b" * 64, "c"], pa.string())
    lengths = [len(t.encode("utf-8")) for t in texts.to_pylist()]
    slices = list(byte_slices(texts, limit))
    assert [a for a, _ in slices] == [0] + [b for _, b in slices[:-1]] and slices[-1][1] == len(texts)
    for a, b in slices:
        assert b > a and (sum(lengths[a:b]) <= limit or b - a == 1)
        assert b == len(texts) or sum(lengths[a:b + 1]) > limit  # no slice stops short of the limit


def test_a_second_run_on_a_locked_output_directory_is_refused(inputs, tmp_path, tokenizer_paths):
    """Two runs on one directory: the second must not start while the first holds the directory
    (it would remove the first's temporary files and publish rows under the other's manifest).
    The lock is the documented flock on <out>/.delta-ray.lock, held here as another run would."""
    import fcntl
    import os

    from delta_ray.batch.files import is_previous_output

    out = tmp_path / "out"
    out.mkdir()
    dt = TokenizerCore(tokenizer_paths["qwen-3"], reuse="none")
    fd = os.open(out / ".delta-ray.lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(RuntimeError, match="another delta-ray tokenize"):  # OutputLocked
            tokenize_files(inputs[:1], str(out), dt, Options(), threads=1)
        assert not [f for f in out.iterdir() if f.name != ".delta-ray.lock"]  # nothing touched
    finally:
        os.close(fd)
    s = tokenize_files(inputs[:1], str(out), dt, Options(), threads=1)  # released: runs
    assert s.skipped == 0 and (out / output_name(inputs[0])).exists() and is_previous_output(str(out))


def test_a_rerun_redoes_an_output_whose_rows_differ_from_its_manifest(inputs, tmp_path, tokenizer_paths,
                                                                      references):
    """A manifest that says 602 rows over a file of 6 (another run's, or a file cut short) must
    not be skipped: the rerun checks the footer's row count and redoes the input."""
    dt = TokenizerCore(tokenizer_paths["qwen-3"], reuse="none")
    out = tmp_path / "out"
    tokenize_files(inputs[:1], str(out), dt, Options(), threads=1)
    name = out / output_name(inputs[0])
    whole = pq.read_table(name)
    pq.write_table(whole.slice(0, 6), name)
    s = tokenize_files(inputs[:1], str(out), dt, Options(), threads=1)
    assert s.skipped == 0 and s.documents == whole.num_rows
    assert pq.read_table(name).equals(whole)
    assert tokenize_files(inputs[:1], str(out), dt, Options(), threads=1).skipped == 1


_STREAM_PROBE = r"""
import resource, sys
import pyarrow.compute
from delta_ray.batch.inputs import input_kind, units
from delta_ray._core.text_columns import BatchSpec
path = sys.argv[1]
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
loaders = units(path, input_kind(path), BatchSpec(batch_bytes=1 << 20))
first = next(loaders)()
rows = first.num_rows
for _ in range(3):
    rows += next(loaders)().num_rows
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(rows, (after - before) // 1024)
"""


@pytest.mark.parametrize("kind", ["txt", "jsonl"])
def test_a_compressed_input_is_streamed_not_decompressed_whole(tmp_path, kind):
    """A 0.3 MB .gz holding 200 MB of text: drawing the first units of 1 MiB must not decompress
    (or decode) the whole input; the process grows by a few MiB, not hundreds."""
    import subprocess
    import sys
    import zlib

    line = ("all work and no play makes jack a dull boy " * 20).strip()
    row = (json.dumps({"text": line}) if kind == "jsonl" else line) + "\n"
    block = (row * (1_000_000 // len(row) + 1)).encode()
    path = tmp_path / f"bomb.{kind}.gz"
    comp = zlib.compressobj(9, zlib.DEFLATED, 31)  # gzip framing
    with open(path, "wb") as fh:
        for _ in range(200):
            fh.write(comp.compress(block))
        fh.write(comp.flush())
    assert path.stat().st_size < 2_000_000
    out = subprocess.run([sys.executable, "-c", _STREAM_PROBE, str(path)], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    rows, grown_mb = map(int, out.stdout.split())
    assert rows > 4 * 1000  # four units of about 1 MiB of lines each
    assert grown_mb < 100, f"drawing 4 units of 1 MiB grew the process by {grown_mb} MiB"


def test_a_jsonl_record_longer_than_a_mebibyte(tmp_path, real_texts, tokenizer_paths, references):
    """pyarrow's JSON reader refuses a record longer than its block (1 MiB by default): a corpus
    with one long document must still be read, checked and tokenized."""
    from delta_ray.batch.files import check_text_column

    long_doc = (real_texts["english"] * 40)[:1_500_000]
    path = tmp_path / "long.jsonl"
    path.write_text(json.dumps({"text": long_doc}) + "\n" + json.dumps({"text": "short"}) + "\n", encoding="utf-8")
    check_text_column(str(path), Options())
    dt = TokenizerCore(tokenizer_paths["llama3.2"], reuse="none")
    s = tokenize_files([str(path)], str(tmp_path / "out"), dt, Options(batch_bytes=1 << 20), threads=2)
    got = pq.read_table(tmp_path / "out" / output_name(str(path))).column("input_ids").to_pylist()
    assert s.documents == 2 and got == [references["llama3.2"].encode(t).ids for t in (long_doc, "short")]


def test_one_file_listed_twice_is_refused(tmp_path, tokenizer_paths, capsys):
    """The same path twice, a path and a symlink to it, a symlink and a hard link: one file, whose
    documents would be written twice under a manifest a rerun trusts (or two writers would race on
    one temporary file). A usage error naming both spellings, on both paths, and nothing written;
    the library call refuses alike."""
    import os

    from delta_ray.apps.cli import main

    tok = tokenizer_paths["qwen-3"]
    src = tmp_path / "docs.txt"
    src.write_text("hello\nworld\n", encoding="utf-8")
    link = tmp_path / "link.txt"
    link.symlink_to(src)
    hard = tmp_path / "hard.txt"
    os.link(src, hard)
    other = tmp_path / "other.txt"
    other.write_text("fine\n", encoding="utf-8")
    for i, (a, b) in enumerate([(src, src), (src, link), (link, hard)]):
        for extra in ([], ["--ray-data"]):
            out = tmp_path / f"out{i}{len(extra)}"
            assert main(["tokenize", "--tokenizer", tok, str(a), str(other), str(b), "--output", str(out),
                         *extra]) == 2
            err = capsys.readouterr().err
            assert "same file" in err and f"{a} and {b}" in err
            assert not out.exists()
    dt = TokenizerCore(tok, reuse="none")
    with pytest.raises(ValueError, match="same file"):
        tokenize_files([str(src), str(link)], str(tmp_path / "lib"), dt, Options(), threads=1)
    assert not (tmp_path / "lib").exists()
    s = tokenize_files([str(src), str(other)], str(tmp_path / "lib"), dt, Options(), threads=1)  # distinct: runs
    assert s.documents == 3


def test_temporary_names_are_never_shared(tmp_path):
    """Two writers of one output name (two runs that got past the lock, a stray of a killed run)
    never share a temporary file: each name carries the process id and a random part."""
    import os

    from delta_ray.batch.files import TMP_MARK, temp_path

    names = {temp_path(tmp_path, "x-0123456789.parquet") for _ in range(200)}
    assert len(names) == 200
    for n in names:
        assert n.parent == tmp_path and n.name.startswith(".x-0123456789.parquet.") and n.name.endswith(TMP_MARK)
        assert f".{os.getpid()}-" in n.name


def test_a_rerun_redoes_an_output_replaced_by_one_with_the_same_rows(inputs, tmp_path, tokenizer_paths,
                                                                     references):
    """The manifest records the output's size and SHA-256: an output replaced by another file with
    the same row count (another tokenizer's IDs), or changed in place with its size, footer and row
    count kept (one ID changed), is redone on the rerun, not trusted."""
    import os

    from delta_ray.batch.files import MANIFESTS

    dt = TokenizerCore(tokenizer_paths["qwen-3"], reuse="none")
    src = inputs[1]  # b.txt
    out = tmp_path / "out"
    tokenize_files([src], str(out), dt, Options(), threads=1)
    name = out / output_name(src)
    reference = pq.read_table(name)
    texts = _rows(src)
    assert reference.column("input_ids").to_pylist() == [references["qwen-3"].encode(t).ids for t in texts]
    doc = json.loads((out / MANIFESTS / (name.name + ".json")).read_text())
    assert doc["output_size"] == name.stat().st_size and len(doc["output_sha256"]) == 64

    other = TokenizerCore(tokenizer_paths["llama3.2"], reuse="none")  # the same rows, other IDs
    tokenize_files([src], str(tmp_path / "other"), other, Options(), threads=1)
    os.replace(tmp_path / "other" / output_name(src), name)
    assert pq.ParquetFile(name).metadata.num_rows == reference.num_rows
    s = tokenize_files([src], str(out), dt, Options(), threads=1)
    assert s.skipped == 0 and s.documents == reference.num_rows
    assert pq.read_table(name).equals(reference)

    # In place, same size and footer: one little-endian ID of the first row changed to another ID.
    data = bytearray(name.read_bytes())
    first = reference.column("input_ids")[0].as_py()
    old = first[1].to_bytes(4, "little")
    new = first[2].to_bytes(4, "little")
    meta = pq.ParquetFile(name).metadata
    leaves = [meta.row_group(0).column(i) for i in range(meta.num_columns)]
    ids_chunk = next(c for c in leaves if c.path_in_schema.startswith("input_ids."))
    at = data.find(old, ids_chunk.data_page_offset)
    assert at > 0 and old != new
    data[at:at + 4] = new
    name.write_bytes(bytes(data))
    assert pq.ParquetFile(name).metadata.num_rows == reference.num_rows
    assert pq.read_table(name).column("input_ids")[0].as_py() != first  # really changed, still readable
    s = tokenize_files([src], str(out), dt, Options(), threads=1)
    assert s.skipped == 0
    assert pq.read_table(name).equals(reference)
    assert tokenize_files([src], str(out), dt, Options(), threads=1).skipped == 1  # untouched: trusted
