"""The Ray Data batch pipeline (``tokenize_dataset``) and ``delta-ray tokenize``: every row's IDs equal
the reference ``Tokenizer.from_file(p).encode(text, add_special_tokens=...).ids``."""
from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.dataset as pds
import pytest
from tokenizers import Tokenizer

from delta_ray import DeltaTokenizer, load_tokenizer
from delta_ray._core.reference_api import tokenizer_from_str

pytestmark = pytest.mark.ray

LONG_CHARS = 300_000
SMALL = dict(chunk_size=16_384, cut_threshold=32_768, threads=16)  # many cuts per long text


def _repeat(text: str, n: int) -> str:
    return (text * (n // max(1, len(text)) + 1))[:n]


def _short_texts(real_texts: dict[str, str]) -> list[str]:
    out = ["", " ", "\n\n", "a", "1234567", "e\u0301\u0301 caf\u00e9", "\U0001F600\U0001F468\u200d\U0001F469",
           "<|begin_of_text|>hello<|end_of_text|>", "<|endoftext|><|im_start|>user\nhi<|im_end|>",
           "[gMASK]<sop> x", "  leading and trailing  ",
           "\u4f60\u597d\uff0c\u4e16\u754c\u3002\u3053\u3093\u306b\u3061\u306f"]
    for kind, text in real_texts.items():
        paras = [p for p in text.split("\n\n") if p.strip()]
        out += paras[:120]
        out += [text[i:i + 1500] for i in range(0, min(len(text), 40_000), 3_001)]
    return out


@pytest.fixture(scope="module")
def mixed_texts(real_texts) -> list[str]:
    """Many short texts with a few long ones (>= 300K characters) spread among them."""
    short = _short_texts(real_texts)
    longs = [_repeat(real_texts["english"], LONG_CHARS + 123),
             _repeat(real_texts["code"], LONG_CHARS + 4_567),
             _repeat(real_texts["multilingual"], LONG_CHARS + 89)]
    texts = list(short)
    for i, t in enumerate(longs):
        texts.insert((i + 1) * len(texts) // (len(longs) + 1), t)
    return texts


def _table(ds) -> pa.Table:
    import ray

    return pa.concat_tables(ray.get(ds.to_arrow_refs()))


def _check_rows(table: pa.Table, texts: list[str], ref: Tokenizer, ids_col: str, count_col: str | None,
                add_special_tokens: bool) -> None:
    assert table.schema.field(ids_col).type == pa.list_(pa.int32())
    table = table.sort_by("id")
    assert table.column("id").to_pylist() == list(range(len(texts)))
    ids = table.column(ids_col)
    if count_col is not None:
        assert table.schema.field(count_col).type == pa.int32()
        counts = table.column(count_col).to_numpy()
    bad = []
    for i, text in enumerate(texts):
        want = ref.encode(text, add_special_tokens=add_special_tokens).ids
        got = ids[i].values.to_numpy(zero_copy_only=False)
        if got.tolist() != want or (count_col is not None and counts[i] != len(want)):
            bad.append((i, len(text)))
    assert not bad, f"rows differing from the reference (row, chars): {bad[:10]} of {len(bad)}"


@pytest.mark.parametrize("name", ["llama3.2", "qwen-3"])
def test_every_row_matches_reference(ray_session, name, tokenizer_paths, mixed_texts):
    ray = ray_session
    from delta_ray.actors.data import tokenize_dataset

    path = tokenizer_paths[name]
    ref = Tokenizer.from_file(path)
    longs = [t for t in mixed_texts if len(t) >= LONG_CHARS]
    assert len(longs) == 3
    # Not vacuous: the long texts are cut with both settings the pipeline uses below.
    loaded = load_tokenizer(path)
    assert all(DeltaTokenizer(loaded, reuse="none").cuts(t) for t in longs)
    assert all(len(DeltaTokenizer(loaded, reuse="none", **SMALL).cuts(t)) >= 10 for t in longs)

    ds = ray.data.from_items([{"id": i, "text": t} for i, t in enumerate(mixed_texts)], override_num_blocks=6)
    # One execution, two pools: with special tokens (a path, default settings) and without them
    # (a tokenizers.Tokenizer object, small chunks so every long text is cut many times, no counts).
    ds = tokenize_dataset(ds, path, concurrency=2, batch_size=64)
    # ... and batches encoded in slices of at most 20,000 bytes (a generator to Ray Data)
    ds = tokenize_dataset(ds, ref, add_special_tokens=False, output_column="ids_plain",
                          count_column=None, concurrency=1, batch_size=48, batch_bytes=20_000, **SMALL)
    table = _table(ds)
    assert table.column_names == ["id", "text", "input_ids", "num_tokens", "ids_plain"]
    _check_rows(table, mixed_texts, ref, "input_ids", "num_tokens", True)
    _check_rows(table, mixed_texts, ref, "ids_plain", None, False)


def test_default_tasks_fuse_with_read_and_write(ray_session, tokenizer_paths, mixed_texts, tmp_path):
    """The default form: Ray Data tasks that it fuses with the read and the write (one task per block
    reads, tokenizes and writes: no actor pool, no object-store trip between the stages), every row
    exact, two stages (the second in slices of 20,000 bytes, many cuts per long text) in one task."""
    import pyarrow.parquet as pq

    ray = ray_session
    from delta_ray.actors.data import tokenize_dataset

    path = tokenizer_paths["llama3.2"]
    ref = Tokenizer.from_file(path)
    src = tmp_path / "in"
    src.mkdir()
    table = pa.table({"id": list(range(len(mixed_texts))), "text": mixed_texts})
    third = -(-len(mixed_texts) // 3)
    for i in range(3):
        pq.write_table(table.slice(i * third, third), src / f"part{i}.parquet")
    ds = tokenize_dataset(ray.data.read_parquet(str(src)), path)
    ds = tokenize_dataset(ds, ref, add_special_tokens=False, output_column="ids_plain", count_column=None,
                          batch_bytes=20_000, **SMALL)
    ds.write_parquet(str(tmp_path / "out"))
    fused = [ln for ln in ds.stats().splitlines() if "MapBatches(tokenize_batch_task)" in ln]
    assert fused and all("ReadFiles" in ln and "->Write" in ln for ln in fused), fused
    out = _read_output(tmp_path / "out")
    assert out.column_names == ["id", "text", "input_ids", "num_tokens", "ids_plain"]
    _check_rows(out, mixed_texts, ref, "input_ids", "num_tokens", True)
    _check_rows(out, mixed_texts, ref, "ids_plain", None, False)


def test_read_blocks_rule():
    """One read task per file where Ray Data would split the files (fewer than its blocks) and the
    files are at least as many as the CPUs, else Ray's choice."""
    from delta_ray.actors.data_reads import read_blocks

    assert read_blocks(24, 2, 100) == 24
    assert read_blocks(4, 4.0, 8) == 4
    assert read_blocks(3, 4, 8) is None  # fewer files than CPUs: Ray Data's split spreads the work
    assert read_blocks(1, 0, 200) == 1
    assert read_blocks(10_000, 2, 200) is None  # Ray Data groups them into 200 tasks: no split
    assert read_blocks(200, 2, 200) is None


def _jsonl_files(real_texts, tmp_path, n_files):
    paras = [p for p in real_texts["english"].split("\n\n") if p.strip()]
    files, docs = [], []
    for i in range(n_files):
        rows = [_repeat(paras[(i * 7 + j) % len(paras)], 4000) for j in range(400)]  # about 1.6 MB a file
        f = tmp_path / f"part{i}.jsonl"
        f.write_text("".join(json.dumps({"id": len(docs) + k, "text": t}) + "\n" for k, t in enumerate(rows)),
                     encoding="utf-8")
        files.append(str(f))
        docs += rows
    return files, docs


def test_file_reads_fuse_where_ray_would_split_them(ray_session, tokenizer_paths, real_texts, tmp_path,
                                                    monkeypatch):
    """``tokenize_dataset`` on a bare ``read_json(files)`` of as many files as CPUs, and the CLI's
    read (``--ray-data``), are one task per file that reads, tokenizes and writes. Without
    ``per_file_read`` Ray Data's default read of the same files splits each file's output (it aims
    at 2 blocks per CPU of at least 1 MiB), which stops the fusion. Rows exact."""
    ray = ray_session
    import delta_ray.actors.data as data_mod
    from delta_ray.actors.data import tokenize_dataset
    from delta_ray.apps.tokenize_cli import _read

    path = tokenizer_paths["llama3.2"]
    files, docs = _jsonl_files(real_texts, tmp_path, int(ray.cluster_resources()["CPU"]))

    def stages(ds, out):
        ds = tokenize_dataset(ds, path)
        ds.write_parquet(str(out))
        return [ln for ln in ds.stats().splitlines() if "MapBatches(tokenize_batch_task)" in ln]

    with monkeypatch.context() as m:
        m.setattr(data_mod, "per_file_read", lambda ds: ds)
        split = stages(ray.data.read_json(files), tmp_path / "split")
    assert split and not any("Read" in ln for ln in split), split  # Ray's default read: not fused
    for out, ds in (("user", ray.data.read_json(files)), ("cli", _read({"json": files}, "text"))):
        fused = stages(ds, tmp_path / out)
        assert fused and all("Read" in ln and "->Write" in ln for ln in fused), (out, fused)
    ref = Tokenizer.from_file(path)
    for out in ("split", "user", "cli"):
        table = _read_output(tmp_path / out)
        assert sorted(table.column("id").to_pylist()) == list(range(len(docs)))
        ids, texts = table.column("input_ids"), table.column("text").to_pylist()
        for r in range(0, table.num_rows, 97):  # every row is checked by the tests above; a sample here
            assert texts[r] == docs[table.column("id")[r].as_py()]
            assert ids[r].as_py() == ref.encode(texts[r], add_special_tokens=True).ids


def test_per_file_read_changes_only_bare_reads(ray_session, real_texts, tmp_path):
    """Only a bare file read with Ray Data's block count is re-read, one task per file, with the
    same rows in the same order; a read with its block count set, stages after a read, another
    source or fewer files than CPUs are taken as given, and the caller's dataset is unchanged."""
    ray = ray_session
    from delta_ray.actors.data_reads import per_file_read

    cpus = int(ray.cluster_resources()["CPU"])
    files, docs = _jsonl_files(real_texts, tmp_path, cpus + 1)
    ctx = ray.data.DataContext.get_current()
    keep, ctx.execution_options.preserve_order = ctx.execution_options.preserve_order, True
    try:  # datasets made now take the order-keeping context
        ds = ray.data.read_json(files)
        ours = per_file_read(ds)
        assert ours is not ds and ours.context is not ds.context
        assert ours.materialize().num_blocks() == len(files)
        assert [r["id"] for r in ours.take_all()] == list(range(len(docs)))
        assert [r["id"] for r in ds.take_all()] == list(range(len(docs)))  # the caller's read still works
        assert ds._logical_plan.dag.parallelism == -1  # and is still Ray Data's to size
    finally:
        ctx.execution_options.preserve_order = keep
    given = [ray.data.read_json(files, override_num_blocks=2), ds.select_columns(["text"]),
             ray.data.from_items([{"text": "a"}] * 10)]
    if cpus > 1:
        given.append(ray.data.read_json(files[:cpus - 1]))  # fewer files than CPUs
    for same in given:
        assert per_file_read(same) is same
    # files at least as many as Ray Data's blocks: it groups them into tasks and splits nothing
    keep_min, ctx.read_op_min_num_blocks = ctx.read_op_min_num_blocks, 1
    try:
        grouped = ray.data.read_json(files + files[:cpus - 1])  # 2 per CPU: Ray's floor here
        assert per_file_read(grouped) is grouped
    finally:
        ctx.read_op_min_num_blocks = keep_min


def test_task_form_uses_the_one_bounded_process_cache(tokenizer_paths, real_texts):
    """In-process: the task form takes its tokenizer from the process's one cache (the pool's tasks
    share it): built once per configuration whatever the batch spec, at most MAX_ENTRIES
    configurations (the least recently used one goes), entries of the same bytes sharing one
    LoadedTokenizer; outputs stay exact."""
    import delta_ray.actors.data as data_mod
    from delta_ray._core.config import TokenizerConfig
    from delta_ray._core.text_columns import BatchSpec
    from delta_ray.actors import tokenizer_cache

    loaded = load_tokenizer(tokenizer_paths["qwen-3"])
    ref = Tokenizer.from_file(tokenizer_paths["qwen-3"])
    configs = [TokenizerConfig(reuse="none"), TokenizerConfig(reuse="none", chunk_size=8192),
               TokenizerConfig(reuse="none", chunk_size=4096)]
    texts = ["", "Hello World", real_texts["english"][:5000]]
    batch = pa.table({"text": texts})
    specs = [BatchSpec(), BatchSpec(add_special_tokens=False), BatchSpec(output_column="ids")]
    assert tokenizer_cache.MAX_ENTRIES == 2

    def call(config, spec):
        source = data_mod.TokenizerSource(loaded.config_bytes, loaded.digest, config)
        return data_mod.tokenize_batch_task(batch, source, spec)

    def cached():
        return list(tokenizer_cache._CACHE.values())

    tokenizer_cache.clear()
    try:
        out = call(configs[0], specs[0])
        assert out.column("input_ids").to_pylist() == [ref.encode(t).ids for t in texts]
        (first,) = cached()
        out = call(configs[0], specs[1])  # another spec, the same tokenizer
        assert out.column("input_ids").to_pylist() == [ref.encode(t, add_special_tokens=False).ids for t in texts]
        assert call(configs[0], specs[2]).column("ids").to_pylist() == [ref.encode(t).ids for t in texts]
        assert cached() == [first]  # built once, reused
        call(configs[1], specs[0])
        second = cached()[1]
        assert second.loaded is first.loaded  # the same bytes: one LoadedTokenizer
        call(configs[0], specs[0])  # configs[0] is now the most recently used: configs[1] goes next
        out = call(configs[2], specs[0])
        assert out.column("input_ids").to_pylist() == [ref.encode(t).ids for t in texts]
        assert len(cached()) == 2 and cached()[0] is first and second not in cached()
        assert [k[1] for k in tokenizer_cache._CACHE] == [configs[0], configs[2]]
    finally:
        tokenizer_cache.clear()


def test_task_form_builds_the_reference_only_when_needed(tokenizer_paths, real_texts):
    """In-process: once this machine's admissions are cached, a worker encodes fast-tier batches
    without building the reference (about a CPU-second per process); what needs it builds it first:
    the shadow check (in its own thread) and a guarded text sent to the reference. Every output
    equals the reference. (This machine's cache: a private one would re-derive the fast tier's
    admission, minutes here.)"""
    import delta_ray.actors.data as data_mod
    from delta_ray._core.config import TokenizerConfig
    from delta_ray._core.text_columns import BatchSpec
    from delta_ray.actors import tokenizer_cache

    path = tokenizer_paths["llama3.2"]
    data = open(path, "rb").read()
    loaded = load_tokenizer(path)
    ref = Tokenizer.from_file(path)
    texts = ["", "Hello World", real_texts["english"][:5000], real_texts["code"][:3000],
             _repeat(real_texts["multilingual"], 200_000)]
    spec = BatchSpec(engine="fast")

    def call(texts, **kw):
        config = TokenizerConfig(reuse="none", engine="fast", **kw)
        source = data_mod.TokenizerSource(data, loaded.digest, config, True)
        out = data_mod.tokenize_batch_task(pa.table({"text": texts}), source, spec)
        assert out.column("input_ids").to_pylist() == [ref.encode(t).ids for t in texts]
        return source.core()

    tokenizer_cache.clear()
    try:
        call(texts[:2], shadow_rate=0.0)  # admits (and caches) whatever is not cached yet
        tokenizer_cache.clear()  # a fresh process, as a later task of the dataset finds it
        core = call(texts, shadow_rate=0.0)
        assert core.uses_fast_engine and core.admission.admitted
        assert not core.loaded.built  # fast tier throughout: no reference
        tokenizer_cache.clear()
        core = call(texts, shadow_rate=1.0)  # the shadow check builds it in its own thread and compares
        core.shadow.drain()
        assert core.loaded.built and core.shadow.comparisons > 0 and core.shadow.mismatches == 0
        guarded = sorted(core.engine.now().tier.guard.code_points)
        if guarded:  # a guarded code point goes to the reference, which is then built first
            tokenizer_cache.clear()
            core = call(texts[:2], shadow_rate=0.0)
            assert not core.loaded.built
            call([f"a {chr(guarded[0])} b", "plain"], shadow_rate=0.0)
            assert core.loaded.built
    finally:
        tokenizer_cache.clear()


def test_admission_is_cached_for_lazy_loads(private_cache, tokenizer_paths):
    """A lazily loaded tokenizer takes its admission from the on-disk record when one matches (no
    reference built), computes and records it otherwise, and discards a record that fails its
    checks."""
    import hashlib
    import json as _json

    from delta_ray._core.admission import admit
    from delta_ray._core.loading import LoadedTokenizer

    data = open(tokenizer_paths["llama3.2"], "rb").read()
    eager = admit(LoadedTokenizer.from_bytes(data))
    assert eager.admitted and not list(private_cache.rglob("*admission*"))  # eager: nothing recorded
    first = LoadedTokenizer.from_bytes(data, lazy=True)
    assert admit(first) == eager and first.built  # a miss: computed with the reference, recorded
    (record,) = list(private_cache.rglob("*admission*"))
    second = LoadedTokenizer.from_bytes(data, lazy=True)
    assert admit(second) == eager and not second.built  # a hit: no reference
    body = _json.loads(record.read_bytes())
    body["payload"]["prefix_ids"] = [1]  # altered (its digest no longer matches): discarded
    record.write_text(_json.dumps(body))
    third = LoadedTokenizer.from_bytes(data, lazy=True)
    assert admit(third) == eager and third.built
    body = _json.loads(record.read_bytes())
    body["payload"]["family"] = "no-such-family"  # re-sealed but invalid: discarded too
    body.pop("sha256")
    from delta_ray._runtime.cache_store import _canonical
    body["sha256"] = hashlib.sha256(_canonical(body)).hexdigest()
    record.write_text(_json.dumps(body))
    fourth = LoadedTokenizer.from_bytes(data, lazy=True)
    assert admit(fourth) == eager and fourth.built


def test_source_prefetches_the_tokenizer_when_unpickled(tokenizer_paths, monkeypatch):
    """A TokenizerSource unpickled in a process without its tokenizer (a Ray task starting, before
    its read) starts building it in the background; the task's call then takes that same build (one
    per process), and an unpickle that finds it cached starts nothing."""
    import pickle

    import delta_ray.actors.data as data_mod
    from delta_ray._core.config import TokenizerConfig
    from delta_ray.actors import tokenizer_cache

    loaded = load_tokenizer(tokenizer_paths["qwen-3"])
    builds = []
    real = tokenizer_cache.build_tokenizer
    monkeypatch.setattr(tokenizer_cache, "build_tokenizer", lambda *a, **k: builds.append(1) or real(*a, **k))
    source = data_mod.TokenizerSource(loaded.config_bytes, loaded.digest, TokenizerConfig(reuse="none"))
    tokenizer_cache.clear()
    try:
        copy = pickle.loads(pickle.dumps(source))
        import time
        deadline = time.monotonic() + 30
        while not builds and time.monotonic() < deadline:
            time.sleep(0.01)
        assert builds == [1]  # started by the unpickle alone
        core = copy.core()
        assert builds == [1] and tokenizer_cache.cached(source.digest, source.config)
        assert pickle.loads(pickle.dumps(source)).core() is core and builds == [1]
        ref = Tokenizer.from_file(tokenizer_paths["qwen-3"])
        assert core.encode_ids("Hello World").tolist() == ref.encode("Hello World").ids
    finally:
        tokenizer_cache.clear()


def test_bad_input_raises_before_running(ray_session, tokenizer_paths):
    ray = ray_session
    from delta_ray.actors.data import tokenize_dataset

    path = tokenizer_paths["qwen-3"]
    ds = ray.data.from_items([{"id": 1, "body": "x", "raw": b"y"}])
    with pytest.raises(ValueError, match="no text column 'text'"):
        tokenize_dataset(ds, path)
    with pytest.raises(TypeError, match="must hold strings"):
        tokenize_dataset(ds, path, text_column="id")
    with pytest.raises(TypeError, match="decode the bytes"):
        tokenize_dataset(ds, path, text_column="raw")
    with pytest.raises(ValueError, match="distinct"):
        tokenize_dataset(ds, path, text_column="body", output_column="body")
    with pytest.raises(ValueError, match="concurrency"):
        tokenize_dataset(ds, path, text_column="body", concurrency=0)
    with pytest.raises(ValueError, match="num_cpus"):
        tokenize_dataset(ds, path, text_column="body", num_cpus=0)
    with pytest.raises(FileNotFoundError):
        tokenize_dataset(ds, path + ".missing", text_column="body")


def test_a_json_read_runs_nothing_until_consumed(ray_session, tokenizer_paths, real_texts, tmp_path):
    """Ray Data learns a JSON read's schema only by reading: tokenize_dataset must not fetch it (a
    whole file read and a worker start, 4.8 s of a 20 s bench run), and must stay lazy; the rows
    are still exact, and a missing column still fails clearly, on the first batch."""
    ray = ray_session
    from delta_ray.actors.data import tokenize_dataset

    texts = [t for t in _short_texts(real_texts) if t][:40]
    folder = tmp_path / "jsonl"
    folder.mkdir()
    with open(folder / "a.jsonl", "w", encoding="utf-8") as fh:
        for i, t in enumerate(texts):
            fh.write(json.dumps({"id": i, "text": t}) + "\n")
    ds = ray.data.read_json(str(folder))
    fetched = []
    real_schema = ds.schema

    def schema(fetch_if_missing: bool = True):
        fetched.append(fetch_if_missing)
        return real_schema(fetch_if_missing=fetch_if_missing)

    ds.schema = schema
    path = tokenizer_paths["llama3.2"]
    out = tokenize_dataset(ds, path)
    assert True not in fetched, "tokenize_dataset ran the JSON read to learn its schema"
    _check_rows(_table(out), texts, Tokenizer.from_file(path), "input_ids", "num_tokens", True)
    with pytest.raises(Exception, match="no text column 'body'"):
        tokenize_dataset(ray.data.read_json(str(folder)), path, text_column="body").materialize()


@pytest.mark.parametrize("concurrency", [None, 1])  # tasks (the default), an actor pool
def test_null_text_fails_clearly(ray_session, tokenizer_paths, concurrency):
    ray = ray_session
    from delta_ray.actors.data import tokenize_dataset

    tok = DeltaTokenizer(tokenizer_paths["qwen-3"], reuse="none")  # a DeltaTokenizer is accepted too
    ds = ray.data.from_items([{"text": "fine"}, {"text": None}])
    with pytest.raises(Exception, match="null text") as info:
        tokenize_dataset(ds, tok, concurrency=concurrency).materialize()
    assert "'text'" in str(info.value)


def test_a_lone_surrogate_is_named_in_delta_rays_words(ray_session, tokenizer_paths):
    """A str holding a lone surrogate makes Ray Data store the column as pickled Python objects:
    the error is a ValueError naming the column and the row that holds text the reference refuses,
    not Ray's extension type."""
    ray = ray_session
    from delta_ray.actors.data import tokenize_dataset

    ds = ray.data.from_items([{"id": 0, "text": "fine"}, {"id": 1, "text": "bad \ud800 x"},
                              {"id": 2, "text": "ok"}], override_num_blocks=1)
    assert "pickled" in str(ds.schema().types[1])  # what Ray Data makes of it
    with pytest.raises(Exception, match=r"text column 'text', row 1 of its batch: not valid Unicode "
                                        r"\(a lone surrogate U\+D800 at character 4\)") as info:
        tokenize_dataset(ds, tokenizer_paths["qwen-3"]).materialize()
    # Ray Data wraps the worker's exception and keeps its text: a ValueError, in delta-ray's words
    assert "ValueError: text column 'text', row 1 of its batch" in str(info.value)
    assert "ArrowPythonObject" not in str(info.value) and "pickled" not in str(info.value)


def test_pickled_text_rows_are_checked_one_by_one(tokenizer_paths, real_texts):
    """In process, the column Ray Data pickles: valid texts get exactly the reference's IDs; a
    surrogate, a null or a non-str is named by its row; no class is ever loaded to look."""
    import hashlib
    import pickle

    from ray.air.util.object_extensions.arrow import ArrowPythonObjectType

    def pickled(objects):  # the column as Ray Data builds it
        kind = ArrowPythonObjectType()
        return kind.wrap_array(pa.array([pickle.dumps(o) for o in objects], kind.storage_type))

    data = open(tokenizer_paths["llama3.2"], "rb").read()
    fn = _batch_fn(data, hashlib.sha256(data).hexdigest())
    ref = Tokenizer.from_file(tokenizer_paths["llama3.2"])
    texts = ["", "Hello World", real_texts["multilingual"][:3000], _repeat(real_texts["code"], 140_000)]
    out = fn(pa.table({"id": [0, 1, 2, 3], "text": pickled(texts)}))
    assert out.column("input_ids").to_pylist() == [ref.encode(t).ids for t in texts]
    assert out.column("text").to_pylist() == texts

    class Loud:
        def __reduce__(self):
            return (print, ("a class was loaded",))
    for bad, err, message in ((["a", "b", "x\udfff"], ValueError, r"row 2 .* U\+DFFF at character 1"),
                              (["a", None], ValueError, "null text .row 1"),
                              ([5, "a"], TypeError, "row 0 of its batch holds another"),
                              (["a", Loud()], TypeError, "row 1 of its batch holds another")):
        with pytest.raises(err, match=message):
            fn(pa.table({"text": pickled(bad)}))


# -- delta-ray tokenize ----------------------------------------------------------------------------

def _read_output(out_dir) -> pa.Table:
    return pds.dataset(str(out_dir), format="parquet").to_table()


def _compare_by_text(table: pa.Table, texts: list[str], ref: Tokenizer, text_col: str,
                     add_special_tokens: bool) -> None:
    assert table.schema.field("input_ids").type == pa.list_(pa.int32())
    assert table.schema.field("num_tokens").type == pa.int32()
    got = sorted(zip(table.column(text_col).to_pylist(), table.column("input_ids").to_pylist(),
                     table.column("num_tokens").to_pylist()))
    want = sorted((t, ref.encode(t, add_special_tokens=add_special_tokens).ids) for t in texts)
    assert [g[0] for g in got] == [w[0] for w in want]
    for (text, ids, n), (_, want_ids) in zip(got, want):
        assert ids == want_ids, f"IDs differ for a text of {len(text)} characters"
        assert n == len(want_ids)


def test_cli_jsonl_and_txt(ray_session, tokenizer_paths, real_texts, tmp_path, capsys):
    from delta_ray.apps.cli import main

    name = "llama3.2"
    docs = [p for p in real_texts["multilingual"].split("\n") if p.strip()][:60]
    docs.append(_repeat(real_texts["english"], 150_000))  # long enough to be cut
    jsonl = tmp_path / "docs.jsonl"
    jsonl.write_text("".join(json.dumps({"text": t, "source": f"d{i}"}) + "\n" for i, t in enumerate(docs)),
                     encoding="utf-8")
    lines = [ln for ln in real_texts["code"].split("\n")[:400] if ln]
    txt = tmp_path / "lines.txt"
    txt.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "out"
    rc = main(["tokenize", "--tokenizer", tokenizer_paths[name], str(jsonl), str(txt), "--output", str(out)])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "tokens/s" in printed
    table = _read_output(out)
    assert table.num_rows == len(docs) + len(lines)
    total = sum(table.column("num_tokens").to_pylist())
    assert f"{total:,} tokens" in printed
    _compare_by_text(table, docs + lines, Tokenizer.from_file(tokenizer_paths[name]), "text", True)


@pytest.mark.parametrize("path", ["local", "ray-data"])
def test_cli_text_column_no_special_tokens(ray_session, tokenizer_paths, real_texts, tmp_path, path):
    import argparse

    from delta_ray.apps import tokenize_cli

    name = "qwen-3"
    docs = [p for p in real_texts["english"].split("\n\n") if p.strip()][:80] + ["<|im_start|>x<|im_end|>"]
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"body": t, "n": i}) + "\n" for i, t in enumerate(docs)), encoding="utf-8")
    parser = argparse.ArgumentParser()
    tokenize_cli.add_arguments(parser)
    extra = ["--ray-data", "--concurrency", "1", "--engine", "fast", "--threads", "2", "--verify", "20"] \
        if path == "ray-data" else ["--engine", "fast", "--threads", "2"]
    args = parser.parse_args(["--tokenizer", tokenizer_paths[name], str(src), "--output", str(tmp_path / "o"),
                              "--text-column", "body", "--no-special-tokens", *extra])
    assert tokenize_cli.run(args) == 0
    missing = parser.parse_args(["--tokenizer", tokenizer_paths[name], str(src), "--output", str(tmp_path / "o2")])
    assert tokenize_cli.run(missing) == 2  # no "text" column: refused before the pool starts
    table = _read_output(tmp_path / "o")
    assert set(table.column_names) == {"body", "n", "input_ids", "num_tokens"}
    _compare_by_text(table, docs, Tokenizer.from_file(tokenizer_paths[name]), "body", False)


def test_cli_usage_errors(tokenizer_paths, tmp_path, capsys):
    from delta_ray.apps.cli import main

    tok = tokenizer_paths["qwen-3"]
    (tmp_path / "a.csv").write_text("text\nx\n")
    (tmp_path / "ok.txt").write_text("x\n")
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "old.parquet").write_bytes(b"")
    cases = [
        ([str(tmp_path / "missing.jsonl")], str(tmp_path / "o1"), "no such input file"),
        ([str(tmp_path / "a.csv")], str(tmp_path / "o2"), "unknown input type"),
        ([str(tmp_path / "ok.txt")], str(busy), "new or empty directory"),
    ]
    for inputs, out, message in cases:
        assert main(["tokenize", "--tokenizer", tok, *inputs, "--output", out]) == 2
        assert message in capsys.readouterr().err
    assert main(["tokenize", "--tokenizer", str(tmp_path / "nope.json"), str(tmp_path / "ok.txt"),
                 "--output", str(tmp_path / "o3")]) == 2
    assert "--tokenizer" in capsys.readouterr().err


def _batch_fn(config: bytes, digest: str, **kw):
    from delta_ray._core.config import TokenizerConfig
    from delta_ray._core.text_columns import BatchSpec
    from delta_ray.actors.data import TokenizeBatch

    return TokenizeBatch(config, digest, TokenizerConfig(chunk_size=65_536, cut_threshold=131_072, reuse="none"),
                         BatchSpec(**kw))


def test_actor_class_unadmitted_config_and_digest(tokenizer_paths, real_texts):
    """In-process: a configuration the fast paths refuse goes to the reference in one batch call, and
    configuration bytes that do not match their digest are refused."""
    import hashlib

    from delta_ray._core.loading import DigestMismatch

    cfg = json.loads(open(tokenizer_paths["llama3.2"], encoding="utf-8").read())
    cfg["normalizer"] = {"type": "Lowercase"}  # not absent/NFC: not admitted
    data = json.dumps(cfg).encode("utf-8")
    digest = hashlib.sha256(data).hexdigest()
    fn = _batch_fn(data, digest, add_special_tokens=True)
    assert not fn.tokenizer.admission
    ref = tokenizer_from_str(data.decode("utf-8"))
    texts = ["", "Hello World", real_texts["english"][:5000], _repeat(real_texts["code"], 140_000)]
    out = fn(pa.table({"text": pa.array(texts, pa.large_string())}))
    assert out.schema.field("input_ids").type == pa.list_(pa.int32())
    assert out.column("input_ids").to_pylist() == [ref.encode(t).ids for t in texts]
    assert out.column("num_tokens").to_pylist() == [len(ref.encode(t).ids) for t in texts]
    sliced = _batch_fn(data, digest, add_special_tokens=True, batch_bytes=6000)
    parts = list(sliced(pa.table({"text": pa.array(texts, pa.large_string())})))
    assert [p.num_rows for p in parts] == [3, 1]  # about 5,000 bytes, then the long text alone
    assert pa.concat_tables(parts).equals(out)
    with pytest.raises(DigestMismatch):
        _batch_fn(data, "0" * 64)
    with pytest.raises(TypeError, match="must hold strings"):
        fn(pa.table({"text": pa.array([1, 2])}))


def test_every_cli_option_reaches_both_paths(ray_session, tokenizer_paths, tmp_path, monkeypatch):
    """One batch specification: each option of ``delta-ray tokenize`` is either a field of the
    BatchSpec both paths receive, a Ray Data pool option (passed to tokenize_dataset, refused
    locally), a bound of delta-ray's own reader (a BatchSpec field, refused with --ray-data), or a
    run option; an option added without a place fails here. The --ray-data path once
    dropped --engine and --threads silently."""
    import argparse
    import dataclasses

    import delta_ray.actors.data as data_mod
    import delta_ray.batch.files as bf
    from delta_ray._core.text_columns import BatchSpec
    from delta_ray.apps import tokenize_cli

    src = tmp_path / "docs.jsonl"
    src.write_text(json.dumps({"body": "hello", "k": 1}) + "\n", encoding="utf-8")
    parser = argparse.ArgumentParser()
    tokenize_cli.add_arguments(parser)
    spec_flags = ["--text-column", "body", "--output-column", "ids", "--count-column", "n",
                  "--no-special-tokens", "--drop-text", "--batch-bytes", "12345", "--engine", "reference",
                  "--threads", "3"]
    want = BatchSpec(text_column="body", output_column="ids", count_column="n", add_special_tokens=False,
                     drop_text=True, batch_bytes=12345, engine="reference", threads=3)
    pool_flags = ["--concurrency", "2", "--num-cpus", "0.25", "--batch-size", "7"]
    local_flags = ["--max-record-bytes", "4321"]
    run_options = {"inputs", "tokenizer", "output", "verify", "ray_data"}
    dests = {a.dest for a in parser._actions if a.dest != "help"}
    spec_dests = {"text_column", "output_column", "count_column", "no_special_tokens", "drop_text", "batch_bytes",
                  "engine", "threads"}
    assert set(tokenize_cli.LOCAL_ONLY) == {"max_record_bytes"}
    assert dests == spec_dests | set(tokenize_cli.RAY_ONLY) | set(tokenize_cli.LOCAL_ONLY) | run_options
    assert {f.name for f in dataclasses.fields(BatchSpec)} == \
        (spec_dests - {"no_special_tokens"}) | {"add_special_tokens"} | set(tokenize_cli.LOCAL_ONLY)

    seen = {}

    class Stop(Exception):
        pass

    def fake_files(inputs, out, dt, spec, **kw):
        seen["local"] = (spec, dt.uses_fast_engine, kw)
        raise ValueError("stop here")

    def fake_dataset(ds, loaded, spec=None, **kw):
        seen["ray"] = (spec, kw)
        raise Stop

    monkeypatch.setattr(bf, "tokenize_files", fake_files)
    monkeypatch.setattr(data_mod, "tokenize_dataset", fake_dataset)
    base = ["--tokenizer", tokenizer_paths["qwen-3"], str(src)]
    args = parser.parse_args(base + ["--output", str(tmp_path / "a")] + spec_flags + local_flags)
    assert tokenize_cli.run(args) == 1
    spec, fast, kw = seen["local"]
    assert spec == dataclasses.replace(want, max_record_bytes=4321)
    assert fast is False and kw.get("threads") is None  # threads travel in the spec
    args = parser.parse_args(base + ["--output", str(tmp_path / "b"), "--ray-data"] + spec_flags + pool_flags)
    assert tokenize_cli.run(args) == 1
    spec, kw = seen["ray"]
    assert spec == want
    assert kw == {"concurrency": 2, "num_cpus": 0.25, "batch_size": 7}
    for flag, value in zip(pool_flags[::2], pool_flags[1::2]):  # pool options without --ray-data: refused
        args = parser.parse_args(base + ["--output", str(tmp_path / "c"), flag, value])
        assert tokenize_cli.run(args) == 2
    args = parser.parse_args(base + ["--output", str(tmp_path / "d"), "--ray-data"] + local_flags)
    assert tokenize_cli.run(args) == 2  # the local reader's bound with --ray-data: refused
