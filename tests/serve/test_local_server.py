"""The one-process server (``delta-ray serve --local``): no Ray, and the options only Ray Serve has are
refused. Its HTTP behaviour is tested with the Serve app's in test_http.py."""
from __future__ import annotations

import pytest

from delta_ray.apps.cli import main as cli


def test_serve_local_answers_without_ever_importing_ray(run_own_process):
    assert "LOCAL NO RAY OK" in run_own_process("local_no_ray_check.py", timeout=300)


@pytest.mark.parametrize("flags", [["--replicas", "2"], ["--workers", "2"], ["--autoscale", "1:3"],
                                   ["--direct-ingress"]])
def test_serve_local_refuses_what_needs_ray(flags, capsys):
    assert cli(["serve", "--local", "--tokenizer", "qwen-3", *flags]) == 2
    assert "need Ray Serve" in capsys.readouterr().err


def test_local_app_refuses_a_pool(tokenizer_paths):
    from delta_ray.server.local import local_app
    with pytest.raises(TypeError, match="pool runs on Ray"):
        local_app(tokenizer_paths["qwen-3"], num_workers=2)
    with pytest.raises(ValueError, match="reuse"):  # the same validation as serve_app's
        local_app(tokenizer_paths["qwen-3"], reuse="content")
