"""The demo's DeltaTokenizer on the fast tier: admitted before anything is timed.

``engine="auto"`` would start on the reference and admit the fast tier in the background, so a
demo timed at once would show the reference's figures. The demo instead admits now, once per
machine (cached on disk), with a progress bar: its figures are the fast tier's, warm, as a server
that has been up for a minute sees them. Without a fast engine installed (or when this tokenizer's
configuration is outside the exactness argument) it says so and shows the reference's figures.
"""
from __future__ import annotations

import time

from delta_ray._core.loading import LoadedTokenizer
from delta_ray._engine.native import FastEngineUnavailable, available_backends
from delta_ray._verify.admit import cached_admission_exists
from delta_ray.tokenizer import DeltaTokenizer

from .report import out, progress

ADMISSION_ESTIMATE_S = 90.0  # measured 60-160 s on a 2-core machine (one core per probe batch)
WHY = ("  why: the fast tier (fastokens inside delta-ray's cuts) is 50-200x faster than the reference and is "
       "used only once proven to give its IDs for this tokenizer; proven once per machine and version, then cached")


def fast_tier_tokenizer(loaded: LoadedTokenizer) -> tuple[DeltaTokenizer, str]:
    """A DeltaTokenizer on the fast tier when it can be admitted, else on the reference; and a
    one-line description of which engine the figures are from."""
    probe = DeltaTokenizer(loaded, engine="reference")
    if not probe.admission:
        return probe, f"reference only: {probe.admission.reason}"
    if not available_backends():
        return probe, "reference only: no fast engine installed (pip install 'fastokens>=0.3.5')"
    if not cached_admission_exists(loaded.config_bytes):
        out("The fast tier is not admitted on this machine yet: admitting it now (once).")
        out(WHY)
        t0 = time.perf_counter()
        try:
            with progress("admission", ADMISSION_ESTIMATE_S):
                dt = DeltaTokenizer(loaded, engine="fast")
        except FastEngineUnavailable as exc:
            return probe, f"reference only: {exc}"
        out(f"  admitted in {time.perf_counter() - t0:.0f} s, cached for later runs")
        return dt, dt.admission.engine
    try:
        dt = DeltaTokenizer(loaded, engine="fast")  # loads the cached admission (no probing)
    except FastEngineUnavailable as exc:
        return probe, f"reference only: {exc}"
    return dt, dt.admission.engine
