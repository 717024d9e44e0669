"""``python -m bench.demo``: the demo's command line (``python3 bootstrap.py demo`` runs it)."""
from __future__ import annotations

import argparse
import sys

from . import main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The demo's flags."""
    ap = argparse.ArgumentParser(prog="python -m bench.demo",
                                 description="delta-ray beside fastokens and the reference, every result checked")
    ap.add_argument("--tokenizer", help="path to tokenizer.json (default: the bundled qwen-3)")
    ap.add_argument("--in-process", action="store_true", help="only the in-process sections (no Ray, no corpus)")
    ap.add_argument("--quick", action="store_true",
                    help="smaller sizes and fewer turns (30-45 s on an idle 2-core machine once the fast tier is "
                         "admitted)")
    return ap.parse_args(argv)


if __name__ == "__main__":
    sys.exit(main(parse_args()))
