"""The ``delta-ray`` command line."""
from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="delta-ray", description="Exact tokenization on Ray")
    sub = parser.add_subparsers(dest="cmd", required=True)
    demo = sub.add_parser("demo", help="run the main job on a bundled tokenizer and check every result")
    demo.add_argument("--tokenizer", help="path to tokenizer.json (default: the bundled qwen-3)")
    demo.add_argument("--in-process", action="store_true", help="skip the Ray part")
    args = parser.parse_args(argv)
    if args.cmd == "demo":
        from .demo import main as demo_main
        return demo_main(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
