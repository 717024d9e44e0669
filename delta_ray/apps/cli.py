"""The ``delta-ray`` command line: ``serve``, ``tokenize`` (the demo runs from a checkout:
``python3 bootstrap.py demo``)."""
from __future__ import annotations

import argparse
import importlib
import sys

# Each subcommand's module offers add_arguments(parser) and run(args), and imports Ray only in run(),
# where it needs it (tokenize's Ray path lives in actors/; serve --local never imports Ray).
_COMMANDS = {
    "serve": ("delta_ray.apps.serve_cli",
              "start the HTTP tokenization service (vLLM/SGLang-compatible /tokenize): --local in this process, "
              "or on Ray Serve"),
    "tokenize": ("delta_ray.apps.tokenize_cli",
                 "tokenize text/JSONL/Parquet files into Parquet (this machine, or a cluster with --ray-data)"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["demo"]:  # whatever its flags
        print("the demo runs from a delta-ray checkout: python3 bootstrap.py demo [--quick]", file=sys.stderr)
        return 2
    parser = argparse.ArgumentParser(prog="delta-ray", description="Exact tokenization on Ray")
    sub = parser.add_subparsers(dest="cmd", required=True)
    # The demo compares delta-ray with its peers, which the installed package does not ship.
    sub.add_parser("demo", help="moved: run `python3 bootstrap.py demo` from a delta-ray checkout", add_help=False)
    modules = {}
    for name, (module, help_text) in _COMMANDS.items():
        p = sub.add_parser(name, help=help_text)
        try:
            modules[name] = importlib.import_module(module)
            modules[name].add_arguments(p)
        except ImportError as exc:  # not built yet or Ray missing: say so when it is used
            modules[name] = exc
    args = parser.parse_args(argv)
    mod = modules[args.cmd]
    if isinstance(mod, Exception):
        print(f"delta-ray {args.cmd} is unavailable: {mod}", file=sys.stderr)
        return 2
    return mod.run(args)


if __name__ == "__main__":
    sys.exit(main())
