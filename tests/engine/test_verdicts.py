"""Admission records that cannot be poisoned or half-read, and a cache only this user can write."""
from __future__ import annotations

import importlib.util
import json
import logging
import os

import pytest

from delta_ray._engine.verdicts import load_verdict, reject_verdict, save_verdict
from delta_ray._runtime import cache_store
from delta_ray._verify.admit import verdict_key

HAS_FAST = importlib.util.find_spec("fastokens") is not None


pytestmark = pytest.mark.usefixtures("private_cache")  # a fresh admission cache per test


@pytest.fixture
def key(tokenizer_paths):
    data = open(tokenizer_paths["glm-4"], "rb").read()
    return verdict_key(data, "fastokens", "0.3.5")


def _record_file(tmp_path):
    files = list((tmp_path / "cache" / "guard").glob("verdict-*.json"))
    assert len(files) == 1
    return files[0]


def test_roundtrip_and_key_binding(key, tokenizer_paths):
    assert save_verdict(key, True, "battery passed", [[0x17F, 0x17F], [0xDF, 0xDF]][::-1])
    rec = load_verdict(key)
    assert rec["ok"] is True and rec["ranges"] == [[0xDF, 0xDF], [0x17F, 0x17F]]
    for field in ("tokenizer_sha256", "backend", "backend_version", "tokenizers", "delta_ray", "format",
                  "python_unicodedata", "battery"):
        assert field in key
    other = dict(key, backend_version="0.3.6")
    assert load_verdict(other) is None  # another engine version is another record


@pytest.mark.parametrize("damage", ["truncate", "flip_ok", "drop_range", "bad_range", "missing_field", "not_json"])
def test_a_poisoned_or_truncated_record_is_discarded(key, tmp_path, damage, caplog):
    save_verdict(key, False, "refused", [[0x100, 0x1FF]])
    path = _record_file(tmp_path)
    raw = path.read_bytes()
    doc = json.loads(raw)
    if damage == "truncate":
        path.write_bytes(raw[: len(raw) // 2])
    elif damage == "not_json":
        path.write_bytes(b"\x00\x01garbage")
    else:
        if damage == "flip_ok":  # an attacker turns a refusal into an admission
            doc["payload"]["ok"] = True
        elif damage == "drop_range":  # or empties the guard set
            doc["payload"]["ranges"] = []
        elif damage == "bad_range":
            doc["payload"]["ranges"] = [[5, 2]]
        elif damage == "missing_field":
            del doc["payload"]["reason"]
        path.write_text(json.dumps(doc))
    with caplog.at_level(logging.WARNING, logger="delta_ray.cache"):
        assert load_verdict(key) is None


def test_guard_digest_binds_ranges_even_with_a_recomputed_record_digest(key, tmp_path):
    """Recomputing the outer digest is not enough: the guard ranges carry their own."""
    import hashlib
    save_verdict(key, True, "ok", [[0x17F, 0x17F]])
    path = _record_file(tmp_path)
    doc = json.loads(path.read_bytes())
    doc.pop("sha256")
    doc["payload"]["ranges"] = []
    doc["sha256"] = hashlib.sha256(cache_store._canonical(doc)).hexdigest()
    path.write_bytes(cache_store._canonical(doc))
    assert load_verdict(key) is None


def test_a_cache_writable_by_others_is_not_used(key, tmp_path, caplog, monkeypatch):
    # the open directory exists before this process is pointed at it: a verdict watcher left by an
    # earlier test polls $DELTA_RAY_CACHE from its own thread at any moment
    root = tmp_path / "open"
    (root / "guard").mkdir(parents=True)
    os.chmod(root / "guard", 0o777)
    with caplog.at_level(logging.WARNING, logger="delta_ray.cache"):
        monkeypatch.setenv("DELTA_RAY_CACHE", str(root))
        assert save_verdict(key, True, "ok", []) is False
        assert load_verdict(key) is None
    assert "writable by others" in caplog.text
    assert not list((root / "guard").iterdir())


def test_a_read_creates_no_cache_directory(key, tmp_path):
    """Only a write creates the cache: pollers that merely look leave the file system as it was."""
    assert load_verdict(key) is None
    assert not (tmp_path / "cache").exists()
    assert save_verdict(key, True, "ok", [])
    assert load_verdict(key)["ok"] is True


def test_symlinks_are_not_followed(key, tmp_path):
    save_verdict(key, True, "ok", [])
    path = _record_file(tmp_path)
    target = tmp_path / "elsewhere.json"
    os.replace(path, target)
    os.symlink(target, path)
    assert load_verdict(key) is None  # a planted link is not read
    victim = tmp_path / "victim"
    victim.write_text("keep")
    assert cache_store.atomic_write(tmp_path / "cache" / "guard" / "x.json", b"{}")
    assert victim.read_text() == "keep"


def test_an_unusable_cache_directory_means_in_memory_admission(key, tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("DELTA_RAY_CACHE", str(blocker))
    assert save_verdict(key, True, "ok", []) is False
    assert load_verdict(key) is None  # no crash, nothing trusted


def test_a_rejection_is_persisted(key):
    save_verdict(key, True, "battery passed", [])
    reject_verdict(key, "shadow mismatch")
    rec = load_verdict(key)
    assert rec["ok"] is False and "shadow" in rec["reason"]


def test_reference_engine_never_touches_the_cache(tokenizer_paths, tmp_path, monkeypatch):
    from delta_ray import DeltaTokenizer
    blocker = tmp_path / "nocache"
    monkeypatch.setenv("DELTA_RAY_CACHE", str(blocker))
    import threading
    calls = []
    me = threading.get_ident()  # other tokenizers' verdict watchers may poll from their own threads

    def record(*a, **k):
        if threading.get_ident() == me:
            calls.append(a)
    monkeypatch.setattr(cache_store, "load_record", record)
    monkeypatch.setattr(cache_store, "save_record", record)
    DeltaTokenizer(tokenizer_paths["glm-4"], engine="reference").encode("hello")
    assert calls == []


@pytest.mark.skipif(not HAS_FAST, reason="fastokens is not installed")
def test_a_rejected_verdict_is_not_admitted_again(tokenizer_paths):
    from delta_ray import DeltaTokenizer
    from delta_ray._engine.native import FastEngineUnavailable, package_version
    data = open(tokenizer_paths["glm-4"], "rb").read()
    k = verdict_key(data, "fastokens", package_version("fastokens"))
    reject_verdict(k, "shadow mismatch in an earlier process")
    with pytest.raises(FastEngineUnavailable, match="shadow mismatch"):
        DeltaTokenizer(tokenizer_paths["glm-4"], engine="fast")
    dt = DeltaTokenizer(tokenizer_paths["glm-4"], engine="auto")
    assert dt.admission.engine.startswith("reference")


def test_a_late_passing_verdict_never_overwrites_a_persisted_rejection(key):
    """Issue 21 (15): a slow admission that passes after another process's shadow verifier persisted
    a rejection must not turn the rejection back into an admission."""
    reject_verdict(key, "shadow mismatch in another process")
    save_verdict(key, True, "battery passed (admission started before the rejection)", [])
    rec = load_verdict(key)
    assert rec is not None and rec["ok"] is False and "shadow mismatch" in rec["reason"]
    save_verdict(key, False, "a second rejection", [])  # rejections may replace each other
    assert load_verdict(key)["ok"] is False


def test_a_rejection_written_in_the_old_layout_is_not_overwritten_either(key):
    from delta_ray._engine.verdicts import _valid_verdict  # noqa: F401 - the record format is the same
    cache_store.save_record("verdict", key, {"ok": False, "reason": "refused earlier", "at": 1.0, "ranges": [],
                                             "ranges_sha256": __import__("delta_ray._engine.guard", fromlist=["x"])
                                             .ranges_digest([]), "stats": {}})
    save_verdict(key, True, "battery passed", [])
    assert load_verdict(key)["ok"] is False


def _swapper(link, targets, seconds):
    """A process that keeps replacing ``link`` by a symlink to each of ``targets`` in turn (the
    owner of a parent directory racing a reader)."""
    import subprocess
    import sys
    code = ("import os,sys,time\nlink,a,b,s=sys.argv[1],sys.argv[2],sys.argv[3],float(sys.argv[4])\n"
            "tmp=link+'.new'\nprint('ready',flush=True)\nend=time.time()+s\n"
            "while time.time()<end:\n"
            "  for t in (a,b):\n"
            "    try: os.unlink(tmp)\n"
            "    except FileNotFoundError: pass\n"
            "    os.symlink(t,tmp); os.replace(tmp,link)\n")
    proc = subprocess.Popen([sys.executable, "-c", code, str(link), *map(str, targets), str(seconds)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def test_a_parent_directory_swapped_for_a_symlink_never_redirects_a_read(key, tmp_path, monkeypatch):
    """Issue 21 (10): the private-directory check used to cover the leaf only, and the file was then
    opened by path: whoever owns a parent directory could swap it between the check and the open and
    have a forged record read from a directory anybody can write. Now the directory is opened once,
    checked on its descriptor, and the record is read relative to it."""
    real, evil = tmp_path / "real", tmp_path / "evil"
    (real / "cache" / "guard").mkdir(parents=True)
    for d in (real, real / "cache", real / "cache" / "guard"):
        os.chmod(d, 0o700)
    monkeypatch.setenv("DELTA_RAY_CACHE", str(evil / "cache"))
    assert save_verdict(key, True, "forged: admitted without a battery", [])
    for d in (evil / "cache", evil / "cache" / "guard"):
        os.chmod(d, 0o777)  # the attacker's copy: anybody may write there, so it is never trusted
    parent = tmp_path / "parent"
    os.symlink(real, parent)
    monkeypatch.setenv("DELTA_RAY_CACHE", str(parent / "cache"))
    cache_store._WARNED.add(f"cache directory {parent / 'cache' / 'guard'} is writable by others")
    assert load_verdict(key) is None  # the genuine cache holds nothing
    import time
    proc = _swapper(parent, (real, evil), 30)
    forged = reads = 0
    try:
        end = time.monotonic() + 6
        while time.monotonic() < end and not forged:
            reads += 1
            if load_verdict(key) is not None:
                forged += 1
    finally:
        proc.kill()
        proc.wait()
    assert forged == 0, f"a forged record was read through a swapped parent (after {reads} reads)"
    assert reads > 100
