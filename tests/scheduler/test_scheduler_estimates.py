"""Estimates: the linear model, the EWMA on b, and non-ASCII share sampling."""
from __future__ import annotations

import pytest

from delta_ray.scheduler.estimates import Estimator, nonascii_share


def test_initial_estimates():
    est = Estimator()
    assert est.estimate("stateless", 0, 0.0) == pytest.approx(0.2)
    assert est.estimate("stateless", 10_000, 0.0) == pytest.approx(0.2 + 3e-5 * 10_000)
    assert est.estimate("chunk", 10_000, 0.0) == pytest.approx(0.2 + 3e-5 * 10_000)
    assert est.estimate("session", 10_000, 0.0) == pytest.approx(0.2 + 1e-5 * 10_000)
    # Non-ASCII text weighs (1 + 5 s) per character.
    assert est.estimate("session", 10_000, 0.5) == pytest.approx(0.2 + 1e-5 * 10_000 * 3.5)
    with pytest.raises(ValueError):
        est.estimate("bogus", 1, 0.0)


def test_ewma_moves_b_toward_measured_value():
    est = Estimator()
    n, s = 100_000, 0.2
    true_b = 2e-4
    measured = 0.2 + true_b * n * (1 + 5 * s)
    b0 = est.ms_per_char("stateless")
    est.observe("stateless", n, s, measured)
    b1 = est.ms_per_char("stateless")
    assert b1 == pytest.approx(b0 + 0.05 * (true_b - b0))
    for _ in range(300):
        est.observe("stateless", n, s, measured)
    assert est.ms_per_char("stateless") == pytest.approx(true_b, rel=1e-4)
    assert est.estimate("stateless", n, s) == pytest.approx(measured, rel=1e-4)
    # Other kinds are untouched.
    assert est.ms_per_char("chunk") == 3e-5
    assert est.ms_per_char("session") == 1e-5


def test_ewma_moves_down_too_and_ignores_empty_tasks():
    est = Estimator()
    est.observe("session", 0, 0.0, 50.0)  # no characters: no information about b
    assert est.ms_per_char("session") == 1e-5
    est.observe("session", 1000, 0.0, 0.1)  # faster than the fixed cost: slope floored at 0
    assert est.ms_per_char("session") == pytest.approx(0.95 * 1e-5)


def test_nonascii_share_ascii_and_exact():
    assert nonascii_share("") == 0.0
    assert nonascii_share("plain ascii " * 1000) == 0.0
    assert nonascii_share("aé") == 0.5
    assert nonascii_share("日本語") == 1.0
    text = "é" * 512 + "a" * 1536  # exactly 2,048: counted exactly
    assert nonascii_share(text) == 0.25


def test_nonascii_share_samples_four_windows_on_long_texts():
    n = 100_000
    # Non-ASCII only in the middle, away from the four windows: the sample misses it.
    middle = "a" * 20_000 + "é" * 10_000 + "a" * (n - 30_000)
    assert nonascii_share(middle) == 0.0
    # The first and last 512 characters are windows 1 and 4: half the sample.
    ends = "é" * 512 + "a" * (n - 1024) + "é" * 512
    assert nonascii_share(ends) == 0.5
    # A uniformly mixed text is measured accurately.
    mixed = ("aé" * (n // 2))
    assert nonascii_share(mixed) == pytest.approx(0.5)
    # Windows are spread evenly: positions 0, span/3, 2 span/3, span.
    span = n - 512
    marks = ["a"] * n
    for i in range(4):
        marks[span * i // 3] = "é"
    assert nonascii_share("".join(marks)) == pytest.approx(4 / 2048)
