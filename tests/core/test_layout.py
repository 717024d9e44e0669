"""The package's dependency rule, read from the source (function-local imports included).

Parts, bottom up (docs/design.md, "Map"):
  delta_ray/_runtime  what a process needs around the core: the private cache and its lock, clean
                     exit, the heap kept out of full collections. Imports nothing else of the project.
  delta_ray/_core     the exact core: loading, admission, cut predicate, planner, repair, session
                     store, assembly, the encoder protocol. Imports the runtime.
  delta_ray/_engine   what runs an engine at request time: the Engine (the one object that encodes,
                     read once per call), the native engines, the guard, the shadow verifier, the
                     admission records. Imports core, runtime.
  delta_ray/_verify   what admits an engine: probe, fuzzer, battery, admission. Imports core, runtime, engine.
  delta_ray/*.py     the tokenizer (TokenizerCore composes core, engine and verify; DeltaTokenizer is
                     the user's facade) and the package's lazy front door.
  delta_ray/batch    batch files without Ray (inputs, local tokenization). Imports the tokenizer and below.
  delta_ray/server   the HTTP service without Ray (handler, ASGI app, one-process server). Same.
  scheduler          Ray-free queue policy: routing, queues, policies, estimates, dispatcher,
                     placement (and the clock, constants and task records they use). Imports only itself.
  actors             the Ray glue (pool, workers, chunk tasks, Serve, Data): everything above, never apps.
  delta_ray/apps     the applications: the CLI, the drop-in, the bundled tokenizers. Everything; actors
                     only inside a function (Ray stays lazy).
  delta_ray/serving  the public home of the server's entry points: the server and below; actors only
                     lazily (Ray and Serve load when a name that needs them is asked for).
No import cycle among modules; no module imports another module's underscore names; an import inside
a function imports a heavy or optional module (LAZY_MODULES) or says why it is there (``# lazy: ...``).
An import under ``if TYPE_CHECKING:`` never runs: it counts as lazy, for type checkers only.

Outside the package, bench/ (the benchmarks, the demo, the peers, the scale-out lab) may import
the package; the package never imports bench/. Within bench/ the same two rules hold (no cycle, no
underscore names of another module), and a bench reaches another's code through its package path
(``bench.harness``), never as a sibling script (``import bench_files``).
"""
from __future__ import annotations

import ast
import pathlib
import subprocess
import sys
import warnings

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
FOLDERS = {"delta_ray": "delta_ray", "actors": "delta_ray.actors", "scheduler": "delta_ray.scheduler"}
BENCH = {"bench": "bench"}  # not installed: the benchmarks, the demo, the peers, the scale-out lab
SCHEDULER = {"clock", "constants", "dispatcher", "estimates", "placement", "policies", "queues", "routing", "tasks"}
# What each part may import (module level and inside functions alike), besides itself.
ALLOWED = {
    "runtime": set(),
    "core": {"runtime"},
    "engine": {"core", "runtime"},
    "verify": {"core", "runtime", "engine"},
    "top": {"core", "runtime", "engine", "verify", "apps", "actors"},  # __init__ exposes the pool lazily
    "batch": {"core", "runtime", "top"},
    "server": {"core", "runtime", "top"},
    "actors": {"core", "runtime", "engine", "verify", "top", "batch", "server", "scheduler"},
    "apps": {"core", "runtime", "engine", "verify", "top", "batch", "server", "actors"},
    "serving": {"core", "runtime", "top", "server", "actors", "scheduler"},
    "scheduler": set(),
}
LAZY_ONLY = {("apps", "actors"), ("top", "actors"), ("top", "apps"), ("serving", "actors")}  # inside functions only
# Imported inside a function without a comment: Ray, and what only some processes load (transformers, an
# inference engine, a native tokenizer engine). Any other function-level import says why (LAZY_MARK).
LAZY_MODULES = {"ray", "transformers", "vllm", "sglang", "fastokens", "gigatoken"}
LAZY_MARK = "# lazy:"
# A signal, not a rule: a module this long may hold more than one concept. It is split by concept
# when it does, never trimmed of its comments to fit a number.
SOFT_MAX_LINES = 800


def _modules(folders: dict[str, str] = FOLDERS) -> dict[str, pathlib.Path]:
    out = {}
    for folder, pkg in folders.items():
        for path in (ROOT / folder).rglob("*.py"):
            rel = path.relative_to(ROOT / folder).with_suffix("")
            name = ".".join((pkg, *rel.parts))
            out[name.removesuffix(".__init__")] = path
    return out


def _part(module: str) -> str:
    rest = module.split(".")[1:]
    if not rest:
        return "top"
    part = rest[0].lstrip("_")  # an internal package is named with a leading underscore
    return part if part in ALLOWED else "top"


def _type_checking_only(node: ast.AST) -> bool:
    """An ``if TYPE_CHECKING:`` block: its imports never run."""
    return isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"


def _imports(name: str, path: pathlib.Path, modules: dict) -> list[tuple[str, bool, list[str]]]:
    """(target module, inside a function, imported names) for every project import of a module."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    in_func = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or _type_checking_only(node):
            in_func |= {id(n) for n in ast.walk(node) if isinstance(n, (ast.Import, ast.ImportFrom))}
    base = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                parts = base.split(".")[:len(base.split(".")) - node.level + 1]
                mod = ".".join(parts + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            for alias in node.names:
                full = f"{mod}.{alias.name}"
                target = full if full in modules else mod
                if target in modules:
                    out.append((target, id(node) in in_func, [] if target == full else [alias.name]))
        elif isinstance(node, ast.Import):
            out += [(a.name, id(node) in in_func, []) for a in node.names if a.name in modules]
    return out


def test_parts_import_only_what_the_rule_allows():
    modules = _modules()
    bad = []
    for name, path in modules.items():
        src = _part(name)
        for target, lazy, _ in _imports(name, path, modules):
            dst = _part(target)
            if dst == src:
                continue
            if dst not in ALLOWED[src] or ((src, dst) in LAZY_ONLY and not lazy):
                bad.append(f"{name} -> {target}{' (in a function)' if lazy else ''}")
    assert not bad, "imports against the dependency rule:\n" + "\n".join(bad)


def _graph_and_private_names(modules: dict[str, pathlib.Path]) -> tuple[dict[str, set[str]], list[str]]:
    """Who imports whom among ``modules``, and every import of another module's underscore name."""
    graph = {name: set() for name in modules}
    private = []
    for name, path in modules.items():
        for target, _, names in _imports(name, path, modules):
            if target != name:
                graph[name].add(target)
            private += [f"{name} imports {target}.{n}" for n in names if n.startswith("_") and not n.startswith("__")]
    return graph, private


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components: a component of more than one module is a cycle."""
    index, low, stack, on, cycles, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in graph:
        if v not in index:
            visit(v)
    return cycles


def test_no_import_cycle_and_no_private_names():
    graph, private = _graph_and_private_names(_modules())
    assert not private, private
    cycles = _cycles(graph)
    assert not cycles, cycles


SEAM = "third-party seam"  # the comment that marks a deliberate read of another project's internals


def _private_reads(path: pathlib.Path) -> list[str]:
    """``x._name`` reads (and ``getattr(x, "_name")``) where ``x`` is not ``self``/``cls`` or a class of
    the same module, and neither the line nor the one above it says why (``# third-party seam``)."""
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines()
    tree = ast.parse(source)
    own_classes = {n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}

    def private(name: str) -> bool:
        return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))

    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and private(node.attr):
            base = node.value
            if isinstance(base, ast.Name) and (base.id in ("self", "cls") or base.id in own_classes):
                continue
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("getattr", "hasattr", "setattr") and len(node.args) >= 2
              and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
              and private(node.args[1].value)):
            base = node.args[0]
            if isinstance(base, ast.Name) and base.id in ("self", "cls"):
                continue
        else:
            continue
        said = lines[node.lineno - 1] + (lines[node.lineno - 2] if node.lineno > 1 else "")
        if SEAM not in said:
            out.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)[:70]}")
    return out


def test_no_module_reads_another_objects_private_names():
    """A private name is its object's own: reaching into another module's object (a session state's
    cache, a verifier's counters, an engine's native handle) breaks silently when that object
    changes, so the shipped code reads only public names; another project's internals are read
    only where a comment marks the seam."""
    bad = [line for path in sorted(_modules().values()) for line in _private_reads(path)]
    assert not bad, "private names read across objects:\n" + "\n".join(bad)


def test_the_private_read_check_catches_one(tmp_path):
    probe = ROOT / "delta_ray" / "_core" / "_probe_private_read.py"
    probe.write_text("def f(state):\n    return state._head\n\n\ndef g(tok):\n"
                     "    return tok._tokenizer  # third-party seam: named\n", encoding="utf-8")
    try:
        assert [x.split(": ", 1)[1] for x in _private_reads(probe)] == ["state._head"]
    finally:
        probe.unlink()


def _unexplained_local_imports(path: pathlib.Path) -> list[str]:
    """Imports inside a function that neither import a module of LAZY_MODULES nor say why: ``# lazy:
    reason`` on the import, or on a comment line just above the run of imports it belongs to."""
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines()
    tree = ast.parse(source)
    import_lines = {i for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
                    for i in range(n.lineno, n.end_lineno + 1)}
    local = {}
    for f in ast.walk(tree):
        if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)):
            local.update({id(n): n for n in ast.walk(f) if isinstance(n, (ast.Import, ast.ImportFrom))})
    out = []
    for node in sorted(local.values(), key=lambda n: n.lineno):
        mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
        if not getattr(node, "level", 0) and all(m.split(".")[0] in LAZY_MODULES for m in mods):
            continue
        if any(LAZY_MARK in lines[i - 1] for i in range(node.lineno, node.end_lineno + 1)):
            continue
        above = node.lineno - 1
        while above in import_lines:
            above -= 1
        if above >= 1 and lines[above - 1].strip().startswith(LAZY_MARK):
            continue
        out.append(f"{path.relative_to(ROOT)}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    return out


def test_function_level_imports_say_why():
    """A module's imports are at its top, where a reader sees what it depends on; one inside a
    function keeps a heavy or optional module out of the processes that do not need it, and says so."""
    bad = [line for path in sorted(_modules().values()) for line in _unexplained_local_imports(path)]
    assert not bad, "imports inside functions without a reason (# lazy: ...):\n" + "\n".join(bad)


def test_the_local_import_check_catches_one():
    probe = ROOT / "delta_ray" / "_core" / "_probe_local_import.py"
    probe.write_text("def f():\n    import json\n    import ray\n    from transformers import x\n"
                     "    import fcntl  # lazy: Unix only\n\n    # lazy: the Ray glue\n"
                     "    from delta_ray.actors import pool\n    from delta_ray.actors import data\n\n"
                     "    from . import plan\n    return json, ray, x, fcntl, pool, data, plan\n", encoding="utf-8")
    try:
        assert [x.split(": ", 1)[1] for x in _unexplained_local_imports(probe)] == ["import json", "from . import plan"]
    finally:
        probe.unlink()


def test_every_package_is_installed():
    """pyproject's package list names every folder of the package (a new part would not be in the wheel)."""
    tomllib = pytest.importorskip("tomllib")
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]["packages"])
    found = {name for name, path in _modules().items() if path.name == "__init__.py"}
    assert found == listed, {"not listed": sorted(found - listed), "listed, not found": sorted(listed - found)}


def test_long_modules_are_flagged():
    """A module past SOFT_MAX_LINES gets a warning in the run's summary; nothing fails for length."""
    modules = _modules()
    assert modules, f"no modules found under {ROOT}"
    for path in sorted(modules.values()):
        n = len(path.read_text(encoding="utf-8").splitlines())
        if n > SOFT_MAX_LINES:
            warnings.warn(f"{path.relative_to(ROOT)} has {n} lines (over {SOFT_MAX_LINES}): does it hold one concept?",
                          stacklevel=1)


def test_the_package_never_imports_bench():
    """bench/ holds what the installed package must not: the demo's peers, the simulation."""
    modules, bench = _modules(), _modules(BENCH)
    both = {**modules, **bench}
    bad = [f"{name} -> {target}{' (in a function)' if lazy else ''}" for name, path in modules.items()
           for target, lazy, _ in _imports(name, path, both) if target in bench]
    assert not bad, "the package imports bench/:\n" + "\n".join(bad)


def test_bench_has_no_cycle_no_private_names_and_no_sibling_scripts():
    bench = _modules(BENCH)
    assert "bench.harness" in bench
    graph, private = _graph_and_private_names(bench)
    assert not private, private
    cycles = _cycles(graph)
    assert not cycles, cycles
    stems = {path.stem for path in bench.values() if not path.stem.startswith("__")}
    siblings = []
    for name, path in bench.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            mods = ([a.name for a in node.names] if isinstance(node, ast.Import)
                    else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            siblings += [f"{name} imports {m}" for m in mods if m.split(".")[0] in stems]
    assert not siblings, siblings


def test_scheduler_holds_the_queue_policy_only():
    """The scale-out simulation and its costs live in bench/scaleout, beside the real policy, not in it."""
    held = {n.rsplit(".", 1)[1] for n in _modules() if n.startswith("delta_ray.scheduler.")}
    assert held == SCHEDULER, held ^ SCHEDULER


# What a part's modules must not load in a fresh interpreter: the parts above it, Ray, the native engines.
ABOVE = {
    "runtime": ("delta_ray._core", "delta_ray._engine", "delta_ray._verify", "delta_ray.tokenizer", "delta_ray.batch",
                "delta_ray.server", "delta_ray.actors", "delta_ray.apps", "ray", "fastokens", "gigatoken"),
    "core": ("delta_ray._engine", "delta_ray._verify", "delta_ray.tokenizer", "delta_ray.batch", "delta_ray.server",
             "delta_ray.actors", "delta_ray.apps", "ray", "fastokens", "gigatoken"),
    "engine": ("delta_ray._verify", "delta_ray.tokenizer", "delta_ray.batch", "delta_ray.server", "delta_ray.actors",
               "delta_ray.apps", "ray", "fastokens", "gigatoken"),
}


@pytest.mark.parametrize("part", sorted(ABOVE))
def test_a_part_loads_without_the_parts_above_it_or_ray(part):
    """In a fresh interpreter: the runtime's, the core's and the engine's modules import neither ray
    nor a native engine nor anything of the project above them."""
    mods = sorted(n for n in _modules() if _part(n) == part and n != f"delta_ray.{part}")
    code = ("import importlib, sys\n"
            "sys.modules['delta_ray'] = type(sys)('delta_ray')\n"  # skip the package's front door
            f"sys.modules['delta_ray'].__path__ = [{str(ROOT / 'delta_ray')!r}]\n"
            f"for m in {mods!r}:\n    importlib.import_module(m)\n"
            f"bad = sorted(m for m in sys.modules if any(m == p or m.startswith(p + '.') for p in {ABOVE[part]!r}))\n"
            "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


# What an engine object may or may not offer: declared in Protocols (_core/encoder.py's Encoder,
# _engine/native.py's NativeEngine), read through Engine.now(); only _engine/native.py reads a loaded
# backend's optional entry points, once, when it wraps the backend.
ENGINE_CAPABILITIES = frozenset({"fast", "guard", "raw_flat", "verdict_key", "encode_pieces", "encode_flat",
                                 "encode_lists", "check_lists", "prepare_lists", "fast_pieces", "fast_flat",
                                 "fast_lists"})


def _capability_probes(path: pathlib.Path) -> list[str]:
    """``getattr(x, "<capability>"...)`` / ``hasattr(x, "<capability>")`` calls in one module."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr") \
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) \
                and node.args[1].value in ENGINE_CAPABILITIES:
            out.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)[:70]}")
    return out


def test_no_capability_is_discovered_outside_the_engine():
    """The engine's capabilities are declared in Protocols and read through ``Engine.now()``: no
    module but the backends' wrapper (``_engine/native.py``) asks an object with getattr/hasattr
    whether it has one (a probe would let a path decide for itself which engine may take its pieces)."""
    wrapper = ROOT / "delta_ray" / "_engine" / "native.py"
    bad = [line for path in sorted(_modules().values()) if path != wrapper
           for line in _capability_probes(path)]
    assert not bad, "capability probes outside engine/:\n" + "\n".join(bad)


# The classes of the package that encode pieces: the core's Protocol, base and reference, the one Engine, and
# the native engine with its backends. A wrapper layer around the engine would be a new name here.
ENCODING_CLASSES = {"_core/encoder.py": {"Encoder", "PiecesEncoder", "ReferenceEncoder"},
                    "_engine/engine.py": {"Engine"},
                    "_engine/native.py": {"_FastokensBackend", "_GigatokenBackend", "NativeBackend", "FastEncoder"}}


def test_one_engine_encodes():
    """Only the classes of ENCODING_CLASSES define ``encode_pieces``: every path encodes through the
    one :class:`~delta_ray._engine.engine.Engine`, not a stack of wrappers each deciding for itself."""
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / "delta_ray").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and any(isinstance(f, ast.FunctionDef) and f.name == "encode_pieces"
                                                      for f in node.body):
                found.setdefault(str(path.relative_to(ROOT / "delta_ray")), set()).add(node.name)
    assert found == ENCODING_CLASSES


def test_the_capability_probe_check_catches_one():
    probe = ROOT / "delta_ray" / "_core" / "_probe_capability.py"
    probe.write_text("def f(enc):\n    return getattr(enc, 'guard', None), hasattr(enc, 'name')\n", encoding="utf-8")
    try:
        assert [x.split(": ", 1)[1] for x in _capability_probes(probe)] == ["getattr(enc, 'guard', None)"]
    finally:
        probe.unlink()
