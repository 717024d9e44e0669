"""Child of test_clean_exit: exit while the shadow verifier re-encodes with the reference.

The fast engine is given directly (no admission) and every answer is sampled (shadow_rate=1), so
the verifier's daemon thread is inside the reference's GIL-releasing batch encode when the main
thread returns. An object collected at finalization reports any delta-ray thread still alive then,
and runs Python meanwhile (exit_check.SlowFinalizer). Usage: exit_check_shadow.py TOKENIZER_JSON"""
import sys

from exit_check import SlowFinalizer


def main() -> None:
    from tokenizers import Tokenizer

    from delta_ray import DeltaTokenizer
    from delta_ray._engine.native import cached_fast_encoder

    path = sys.argv[1]
    tok = DeltaTokenizer(path, encoder=cached_fast_encoder(path, "fastokens"), shadow_rate=1.0)
    text = "Exiting while the shadow verifier works: the quick brown fox 12345 \u00e9t\u00e9 \u4e2d\u6587. " * 700
    if tok.encode(text).to_pylist() != Tokenizer.from_file(path).encode(text).ids:
        print("not the reference's IDs", file=sys.stderr)
        sys.exit(3)
    for i in range(60):  # sampled calls of ~50K characters queue up for the verifier
        tok.encode(f"{i} {text}")
    globals()["_finalizer"] = SlowFinalizer()
    print(f"exiting with {tok.core.shadow._queue.qsize()} comparisons queued, {tok.core.shadow.comparisons} done",
          flush=True)


if __name__ == "__main__":
    main()
