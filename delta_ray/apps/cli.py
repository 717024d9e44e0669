"""The ``delta-ray`` command line: ``demo``, ``serve``, ``tokenize``."""
from __future__ import annotations

import argparse
import importlib
import sys

# Subcommands that need Ray live in actors/; each module offers add_arguments(parser) and run(args).
_RAY_COMMANDS = {
    "serve": ("delta_ray.actors.serve_cli", "start the HTTP tokenization service (vLLM/SGLang-compatible /tokenize)"),
    "tokenize": ("delta_ray.actors.tokenize_job",
                 "tokenize text/JSONL/Parquet files into Parquet (this machine, or a cluster with --ray-data)"),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="delta-ray", description="Exact tokenization on Ray")
    sub = parser.add_subparsers(dest="cmd", required=True)
    demo = sub.add_parser("demo", help="delta-ray beside fastokens and the reference, every result checked")
    demo.add_argument("--tokenizer", help="path to tokenizer.json (default: the bundled qwen-3)")
    demo.add_argument("--in-process", action="store_true", help="only the in-process sections (no Ray, no corpus)")
    demo.add_argument("--quick", action="store_true", help="smaller sizes and fewer turns (30-45 s on an idle 2-core machine once the fast tier is admitted)")
    modules = {}
    for name, (module, help_text) in _RAY_COMMANDS.items():
        p = sub.add_parser(name, help=help_text)
        try:
            modules[name] = importlib.import_module(module)
            modules[name].add_arguments(p)
        except ImportError as exc:  # not built yet or Ray missing: say so when it is used
            modules[name] = exc
    args = parser.parse_args(argv)
    if args.cmd == "demo":
        from .demo import main as demo_main
        return demo_main(args)
    mod = modules[args.cmd]
    if isinstance(mod, Exception):
        print(f"delta-ray {args.cmd} is unavailable: {mod}", file=sys.stderr)
        return 2
    return mod.run(args)


if __name__ == "__main__":
    sys.exit(main())
