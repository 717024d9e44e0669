"""The demo (bench/demo): its tables, its checks (a wrong result is reported, never hidden), a machine
without fastokens, and ``python -m bench.demo --quick`` end to end (slow tier: it starts Ray and Serve)."""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest

from bench.demo import baselines
from bench.demo.in_process import chat, stateless
from bench.demo.report import Table
from bench.peers.in_process import fastokens_version
from delta_ray.apps.bundled import bundled_tokenizer_path

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_table_columns_align(capsys):
    t = Table("title", ["text", "a", "longer column"])
    t.add("1M chars", "5.0 ms", "12x")
    t.add("100K chars", "0.50 ms", "3.1x")
    t.print()
    lines = capsys.readouterr().out.splitlines()
    body = [ln for ln in lines if ln.startswith("  ")]
    assert len({len(ln) for ln in body}) == 1  # header, rule and rows have one width
    assert body[2].endswith("12x") and body[3].endswith("3.1x")  # right-aligned numbers


class _Wrong:
    """A tokenizer that gets one ID wrong: the demo must report it and return False."""

    def __init__(self, path):
        from tokenizers import Tokenizer
        self.ref = Tokenizer.from_file(path)

    def encode(self, text, session=None):
        ids = np.asarray(self.ref.encode(text).ids, dtype=np.int32)
        ids[len(ids) // 2] += 1
        return pa.array(ids)


def test_a_wrong_result_fails_the_demo(capsys):
    path = bundled_tokenizer_path("qwen-3")
    eng = baselines.Engines(path)
    assert not stateless(eng, _Wrong(path), [3000], calls=2)
    assert "MISMATCH" in capsys.readouterr().out
    assert eng.checks.count("delta-ray") == 2


def test_exact_results_pass_and_are_counted(capsys):
    from delta_ray import DeltaTokenizer
    path = bundled_tokenizer_path("qwen-3")
    eng = baselines.Engines(path)
    dt = DeltaTokenizer(path, engine="reference")
    assert stateless(eng, dt, [3000], calls=2)
    assert chat(eng, dt, [5000], turns=2, warm=1)
    text = capsys.readouterr().out
    assert "MISMATCH" not in text and "delta-ray extend" in text
    assert eng.checks.n >= 2 + 3 * 2 and not eng.checks.wrong


def test_without_fastokens_the_reference_is_shown(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "fastokens", None)  # import fastokens -> ImportError
    from delta_ray import DeltaTokenizer
    path = bundled_tokenizer_path("qwen-3")
    eng = baselines.Engines(path)
    assert eng.fastokens is None and "unavailable" in eng.fastokens_note
    assert eng.segment_cached() is None
    dt = DeltaTokenizer(path, engine="reference")
    assert chat(eng, dt, [5000], turns=2, warm=1)
    assert "n/a" in capsys.readouterr().out


@pytest.mark.slow
def test_quick_demo_end_to_end():
    """``python -m bench.demo --quick`` (what ``python3 bootstrap.py demo --quick`` runs): exit 0, every result exact,
    fastokens beside delta-ray in every section, nothing on stderr, no Ray log lines."""
    env = dict(os.environ, RAY_ENABLE_AUTO_CONNECT="0")
    env.pop("RAY_ADDRESS", None)
    env.pop("DELTA_RAY_FAST_BACKGROUND", None)
    proc = subprocess.run([sys.executable, "-m", "bench.demo", "--quick"], capture_output=True,
                          text=True, timeout=1200, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stderr == "", proc.stderr[-3000:]
    out = proc.stdout
    assert "every result of delta-ray equals the reference" in out and "MISMATCH" not in out
    for section in ("Long stateless text", "Chat session", "Pool on Ray", "HTTP: a chat session", "A corpus"):
        assert section in out, section
    # and direct ingress where it runs
    for server in ("delta-ray local server", "delta-ray on Ray Serve, through its proxy"):
        assert server in out, server
    if fastokens_version():
        assert out.count("fastokens") >= 6
    for noise in ("core_worker", "Running Dataset", "(raylet)", "WARNING", "INFO"):
        assert noise not in out, noise


def test_the_installed_cli_points_at_the_checkout_demo(capsys):
    """The demo and its peers are not installed: ``delta-ray demo`` says where it runs, whatever its flags."""
    from delta_ray.apps.cli import main
    assert main(["demo", "--quick", "--in-process"]) == 2
    assert "python3 bootstrap.py demo" in capsys.readouterr().err
