#!/usr/bin/env python3
"""Build the static napllm shell into ``dist/`` from the package registries only.

Rules
- Every byte in ``dist/`` comes from this repository, from npm (through the
  committed ``package-lock.json``) or from PyPI (through the pinned wheels in
  ``WHEELS`` below, each checked against its sha256). Nothing is fetched at run
  time from anywhere but the page's own origin, and every URL the build writes
  is relative, so the shell works from any sub-path.
- Pyodide is served from ``dist/pyodide/`` with a ``pyodide-lock.json`` merged
  with our wheels, so ``pyodide.loadPackage("napllm")`` and
  ``micropip.install("napllm")`` resolve every dependency by name, offline.
- The build is idempotent: set-up steps (``npm ci``, ``pip download``, the
  ``napllm`` wheel, the esbuild bundles) are skipped when their inputs did not
  change, files are copied only when they differ, and files in ``dist/`` that
  the build no longer produces are removed.
- ``python build.py serve`` serves ``dist/`` with the headers the shell needs:
  ``Cross-Origin-Opener-Policy: same-origin`` and
  ``Cross-Origin-Embedder-Policy: require-corp`` (cross-origin isolation, so
  wllama can use threads), ``Cross-Origin-Resource-Policy: same-origin``,
  exact MIME types for wasm/JavaScript/JSON/manifests and
  ``Cache-Control: no-cache`` (always revalidate).

Layout of ``dist/`` (the contract for the host page and the tests)::

    index.html, *.js, *.css, ...      web/ (without web/vendor-entry/)
    pyodide/                          Pyodide runtime + our wheels + merged lock
    vendor/wllama/wllama.js           @wllama/wllama ESM bundle (exports wasmPaths)
    vendor/wllama/wllama.wasm
    vendor/web-llm/web-llm.js         @mlc-ai/web-llm ESM bundle
    vendor/transformers/transformers.js  @huggingface/transformers ESM bundle (exports wasmPaths)
    vendor/transformers/ort-wasm-simd-threaded.asyncify.{mjs,wasm}  onnxruntime-web's wasm
    vendor/pyscript/core.js, core.css @pyscript/core dist
    vendor/pyscript/config.json       PyScript config: local Pyodide, packages ["napllm"]
    napplets/<name>/index.html        example napplets
    napplets/index.json               [{"name", "title", "description", "icon", "path"}]
    models/tinychat/tiny-chat-q8_0.gguf
    models/tinychat-onnx/             TinyChat as ONNX (config, tokenizer, onnx/model.onnx)
    models/tinychat-webllm/resolve/main/  TinyChat for WebLLM (weights, config, tokenizer, .wasm)
    build-info.json                   versions and file sizes

``python build.py build --with-test-hooks`` also writes ``dist-test/``, the
test build the browser tests use: every file of ``dist/`` (hard links, so
it takes a moment) with the test hooks of ``tests/hooks/`` added (see
:data:`TEST_OVERRIDES`). ``dist/`` itself never contains a test hook.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import email.parser
import fcntl
import functools
import gzip
import hashlib
import html.parser
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
# Serving dist/ (headers, MIME types) is shared with the tests, the benchmarks
# and napllm-check; the module is standard library only.
sys.path.insert(0, str(ROOT / "runtime"))
# MIME_TYPES, DistRequestHandler and DistServer stay importable from here.
from napllm.devtools.headless import (  # noqa: E402, F401
    MIME_TYPES,
    DistRequestHandler,
    DistServer,
    make_server,
)

DIST = ROOT / "dist"
#: The test build: dist/ (hard links) plus the test hooks of tests/hooks/.
DIST_TEST = ROOT / "dist-test"
TEST_HOOKS = ROOT / "tests" / "hooks"
BUILD = ROOT / "build"
WHEEL_CACHE = BUILD / "wheels"
STAMPS = BUILD / "stamps"
NODE_MODULES = ROOT / "node_modules"
WEB = ROOT / "web"
NAPPLETS = ROOT / "napplets"
MODEL_DIR = ROOT / "models" / "tinychat"
MODEL_FILE = "tiny-chat-q8_0.gguf"
#: TinyChat exported to ONNX for the transformers.js engine (models/tinychat/onnx/).
ONNX_MODEL_DIR = MODEL_DIR / "onnx"
ONNX_MODEL_DEST = "models/tinychat-onnx"
#: TinyChat compiled for WebLLM (models/tinychat/webllm/). WebLLM reads a
#: model folder at `<model>/resolve/<revision>/`, its hub layout.
WEBLLM_MODEL_DIR = MODEL_DIR / "webllm"
WEBLLM_MODEL_DEST = "models/tinychat-webllm/resolve/main"
#: The files of that folder WebLLM fetches (the rest is its build kit).
WEBLLM_MODEL_FILES = (
    "mlc-chat-config.json",
    "tensor-cache.json",
    "params_shard_0.bin",
    "tokenizer.json",
    "tokenizer_config.json",
    "tinychat-webgpu.wasm",
)

#: Pyodide's ABI for Python 3.14 (pyodide 314.x): the platform tag of its wheels.
PYODIDE_PLATFORM = "pyemscripten_2026_0_wasm32"
PYODIDE_PYTHON = "3.14"

#: Marker environment of Pyodide, used to drop requirements that do not apply there.
PYODIDE_MARKERS = {
    "python_version": PYODIDE_PYTHON,
    "python_full_version": PYODIDE_PYTHON + ".2",
    "sys_platform": "emscripten",
    "platform_system": "Emscripten",
    "platform_machine": "wasm32",
    "os_name": "posix",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "extra": "",
}


@dataclass(frozen=True)
class Wheel:
    """A wheel taken from PyPI: project name, exact version, sha256 of the file.

    ``platform`` is set only for the one binary wheel (pydantic_core for
    Pyodide); all others are pure-Python wheels downloaded for Python 3.14.
    """

    name: str
    version: str
    sha256: str
    platform: str | None = None

    @property
    def file_prefix(self) -> str:
        """The start of the wheel's file name (PEP 427 escaping of the name)."""
        return f"{re.sub(r'[-_.]+', '_', self.name).lower()}-{self.version}-"


#: The Python side of dist/: pinned and hash-checked. pydantic 2.14.4 needs
#: pydantic-core 2.50.5, the newest core with a Pyodide 314 wheel on PyPI.
WHEELS: tuple[Wheel, ...] = (
    Wheel("micropip", "0.11.1", "768de165adb8e66906039d8fec4127a57f522dfdf8e6fbff877a4616941ecfd3"),
    Wheel("pydantic", "2.14.4", "653a2ad9f6d8858529c77c72717d0ea991d6c6837fe683246b2f4b2bbfc3fadc"),
    Wheel(
        "pydantic-core",
        "2.50.5",
        "b2910ec0fa5aeb9bef70156f2b79f4783978fdcfaa7b2f1b5d1814458d2e79a1",
        platform=PYODIDE_PLATFORM,
    ),
    Wheel(
        "typing-extensions",
        "4.16.0",
        "481caa481374e813c1b176ada14e97f1f67a4539ce9cfeb3f350d78d6370c2e8",
    ),
    Wheel(
        "annotated-types",
        "0.8.0",
        "f072f4d804ea359e4eaf198b1af7a8b0943881a87f31bb764f8bf219bb9419e0",
    ),
    Wheel(
        "typing-inspection",
        "0.4.5",
        "bc210535442b39e1bf2805e0c7a17dfd6a4ace760c84c7f7d16245d23a6b1c39",
    ),
    Wheel("jschon", "0.11.1", "2350e8b6747b17358022960f91208bea70de448b914827af3184d30e20500f0f"),
    Wheel("rfc3986", "2.0.0", "50b1502b60e289cb37883f3dfd34532b8873c7de9f49bb546641ce9cbd256ebd"),
)

#: Files of the npm pyodide package that the browser needs (no maps, types, consoles).
PYODIDE_FILES = (
    "pyodide.mjs",
    "pyodide.js",
    "pyodide.asm.mjs",
    "pyodide.asm.wasm",
    "python_stdlib.zip",
)

#: esbuild bundles: (entry file under web/vendor-entry/, output path under dist/).
BUNDLES = (
    ("wllama.js", "vendor/wllama/wllama.js"),
    ("web-llm.js", "vendor/web-llm/web-llm.js"),
    ("transformers.js", "vendor/transformers/transformers.js"),
)

#: The Prompt API layer (web/prompt-api.js, with its JSON Schema validator):
#: bundled into one script and shipped as the text of this module, which the
#: shell's frames.js inlines into the frames of napplets that opt in.
PROMPT_API_ENTRY = "prompt-api.js"
PROMPT_API_MODULE = "js/prompt-api-source.js"
#: The global the bundle defines inside the layer's own function scope.
PROMPT_API_GLOBAL = "napllmPromptApi"

#: onnxruntime-web's wasm build that transformers.js loads for WebGPU and WASM
#: (copied next to its bundle; the library's default would be a CDN).
ORT_WASM_FILES = ("ort-wasm-simd-threaded.asyncify.mjs", "ort-wasm-simd-threaded.asyncify.wasm")


class BuildError(RuntimeError):
    """A build step failed; the message says which and why."""


def log(message: str) -> None:
    """Print one progress line to stderr."""
    print(f"[build] {message}", file=sys.stderr, flush=True)


def sha256_file(path: Path) -> str:
    """Return the hex sha256 of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(functools.partial(f.read, 1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def run(cmd: list[str], cwd: Path = ROOT) -> None:
    """Run a command, raising BuildError with its output when it fails."""
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr)[-4000:]
        raise BuildError(f"command failed ({proc.returncode}): {' '.join(cmd)}\n{tail}")


def stamp_matches(name: str, value: str) -> bool:
    """True when the stamp file ``build/stamps/<name>`` holds ``value``."""
    path = STAMPS / name
    return path.is_file() and path.read_text(encoding="utf-8") == value


def write_stamp(name: str, value: str) -> None:
    """Record ``value`` as the input digest of a finished set-up step."""
    STAMPS.mkdir(parents=True, exist_ok=True)
    (STAMPS / name).write_text(value, encoding="utf-8")


class DistWriter:
    """Writes files into dist/ only when they differ, and remembers what it wrote.

    At the end of a build, :meth:`prune` removes every file of dist/ that this
    build did not produce (a napplet that was deleted, an old bundle name).
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.written: set[Path] = set()

    def copy(self, src: Path, rel: str) -> Path:
        """Copy ``src`` to ``dist/<rel>`` unless an identical copy is there."""
        dst = self.root / rel
        self.written.add(dst)
        if dst.is_file():
            s, d = src.stat(), dst.stat()
            # copy2 keeps the source's mtime (in ns), so equal size and mtime mean "same file".
            if s.st_size == d.st_size and s.st_mtime_ns == d.st_mtime_ns:
                return dst
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = dst.with_name(dst.name + ".tmp")
        shutil.copy2(src, tmp)
        tmp.chmod(0o644)
        os.replace(tmp, dst)
        return dst

    def write_bytes(self, rel: str, data: bytes) -> Path:
        """Write ``data`` to ``dist/<rel>`` unless the file already holds it."""
        dst = self.root / rel
        self.written.add(dst)
        if dst.is_file() and dst.read_bytes() == data:
            return dst
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = dst.with_name(dst.name + ".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, dst)
        return dst

    def write_json(self, rel: str, value: Any) -> Path:
        """Write ``value`` as indented UTF-8 JSON to ``dist/<rel>``."""
        text = json.dumps(value, indent=1, ensure_ascii=False, sort_keys=False) + "\n"
        return self.write_bytes(rel, text.encode())

    def claim(self, rel: str) -> Path:
        """Mark a file produced by an external tool (esbuild) as part of this build."""
        dst = self.root / rel
        self.written.add(dst)
        return dst

    def prune(self) -> int:
        """Delete files of dist/ not written by this build, then empty folders."""
        removed = 0
        for path in sorted(self.root.rglob("*"), reverse=True):
            if path.is_file() or path.is_symlink():
                if path not in self.written:
                    path.unlink()
                    removed += 1
            elif path.is_dir() and not any(path.iterdir()):
                path.rmdir()
        return removed


# --------------------------------------------------------------------------- set-up


def ensure_node_modules() -> None:
    """Install the npm packages from the committed lock (``npm ci``) when needed.

    Skipped when ``node_modules/`` was installed from the same
    ``package-lock.json`` (digest kept in ``build/stamps/npm``). Install
    scripts are not run: none of our packages needs one (esbuild finds its
    binary through its optional platform package).
    """
    lock = ROOT / "package-lock.json"
    if not lock.is_file():
        raise BuildError("package-lock.json is missing; run `npm install` once and commit it")
    digest = sha256_file(lock)
    if stamp_matches("npm", digest) and (NODE_MODULES / ".package-lock.json").is_file():
        return
    if shutil.which("npm") is None:
        raise BuildError("npm is not installed (Node 20 or newer is required)")
    log("npm ci (from package-lock.json)")
    run(["npm", "ci", "--no-audit", "--no-fund", "--ignore-scripts"])
    write_stamp("npm", digest)


def npm_version(package: str) -> str:
    """The installed version of an npm package (from its package.json)."""
    meta = json.loads((NODE_MODULES / package / "package.json").read_text(encoding="utf-8"))
    return str(meta["version"])


def find_cached_wheel(wheel: Wheel) -> Path | None:
    """The cached file of ``wheel`` in build/wheels/ if present with the right sha256."""
    for path in sorted(WHEEL_CACHE.glob(wheel.file_prefix + "*.whl")):
        if sha256_file(path) == wheel.sha256:
            return path
    return None


def fetch_wheels() -> dict[str, Path]:
    """Download the pinned wheels from PyPI into build/wheels/ (once), hash-checked.

    Pure wheels are downloaded for Python 3.14; pydantic-core as its Pyodide
    build (``cp314-pyemscripten_2026_0_wasm32``). pip verifies each file
    against the sha256 in ``WHEELS`` (``--require-hashes``).

    Returns: canonical project name -> wheel path.
    Raises: BuildError when pip fails or a hash does not match.
    """
    WHEEL_CACHE.mkdir(parents=True, exist_ok=True)
    found: dict[str, Path] = {}
    for wheel in WHEELS:
        path = find_cached_wheel(wheel)
        if path is None:
            log(f"pip download {wheel.name}=={wheel.version}")
            with tempfile.TemporaryDirectory() as tmp:
                req = Path(tmp) / "requirements.txt"
                req.write_text(
                    f"{wheel.name}=={wheel.version} --hash=sha256:{wheel.sha256}\n",
                    encoding="utf-8",
                )
                cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps"]
                cmd += ["--only-binary=:all:", "--python-version", PYODIDE_PYTHON]
                if wheel.platform:
                    cmd += ["--platform", wheel.platform, "--implementation", "cp"]
                    cmd += ["--abi", "cp" + PYODIDE_PYTHON.replace(".", "")]
                cmd += ["--require-hashes", "-r", str(req), "-d", str(WHEEL_CACHE)]
                run(cmd)
            path = find_cached_wheel(wheel)
            if path is None:
                raise BuildError(f"{wheel.name}=={wheel.version}: no wheel with the pinned sha256")
        found[canonical_name(wheel.name)] = path
    return found


#: Parts of runtime/napllm that run only under CPython (the LMSP service, the
#: napplet checker, the httpx port) and so stay out of the browser wheel: they
#: are not shipped to every visitor.
CPYTHON_ONLY = ("lmsp_service", "devtools", "providers/http_httpx.py")


def napllm_sources() -> list[Path]:
    """The files that make up the browser's napllm wheel (package sources and metadata).

    Everything under runtime/ except the CPython-only packages (`CPYTHON_ONLY`).
    """
    files = [ROOT / "pyproject.toml"]
    files += [ROOT / name for name in ("LICENSE",) if (ROOT / name).is_file()]
    skipped = [ROOT / "runtime" / "napllm" / name for name in CPYTHON_ONLY]
    for path in sorted((ROOT / "runtime").rglob("*")):
        if not path.is_file() or "__pycache__" in path.parts or path.suffix == ".pyc":
            continue
        if any(part == path or part in path.parents for part in skipped):
            continue
        files.append(path)
    return files


def tree_digest(files: list[Path]) -> str:
    """A sha256 over the relative paths and contents of ``files``."""
    digest = hashlib.sha256()
    for path in files:
        digest.update(str(path.relative_to(ROOT)).encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def build_napllm_wheel() -> Path:
    """Build the ``napllm`` wheel with ``pip wheel --no-deps`` (cached by source digest).

    The sources are staged into a temporary copy first: setuptools keeps a
    ``build/lib`` tree next to the project that would otherwise mix stale
    modules into the wheel and collide with our own ``build/`` cache.

    Returns: the path of the wheel in build/napllm-wheel/.
    """
    files = napllm_sources()
    digest = tree_digest(files)
    out = BUILD / "napllm-wheel"
    existing = sorted(out.glob("napllm-*.whl"))
    if stamp_matches("napllm-wheel", digest) and len(existing) == 1:
        return existing[0]
    log("pip wheel napllm")
    with tempfile.TemporaryDirectory() as tmp:
        stage = Path(tmp) / "src"
        for path in files:
            target = stage / path.relative_to(ROOT)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)
        # The browser reads no long description: the README stays out of the
        # wheel's METADATA (about 15 kB of every first visit).
        project = stage / "pyproject.toml"
        project.write_text(
            re.sub(r"(?m)^readme\s*=.*\n", "", project.read_text(encoding="utf-8")),
            encoding="utf-8",
        )
        wheel_dir = Path(tmp) / "wheel"
        run(
            [
                *(sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps"),
                *("-w", str(wheel_dir), str(stage)),
            ]
        )
        built = sorted(wheel_dir.glob("napllm-*.whl"))
        if len(built) != 1:
            raise BuildError("pip wheel did not produce exactly one napllm wheel")
        add_bytecode(built[0])
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        result = out / built[0].name
        shutil.copy2(built[0], result)
    write_stamp("napllm-wheel", digest)
    return result


#: Run by node with the Pyodide of node_modules/: compiles every module of the
#: wheel named by argv[2] with Pyodide's own Python and prints JSON
#: {"tag": cache tag, "pyc": {path in the wheel: base64 bytecode}}.
COMPILE_JS = r"""
const { loadPyodide } = require(process.argv[2] + "/pyodide.js");
(async () => {
  const quiet = () => {};
  const py = await loadPyodide({ indexURL: process.argv[2] + "/", stdout: quiet, stderr: quiet });
  // The wheel goes into Pyodide's in-memory file system, in its working folder.
  py.FS.writeFile("napllm.whl", require("fs").readFileSync(process.argv[3]));
  const out = py.runPython(`
import ast, base64, importlib.util, json, sys, zipfile
from importlib._bootstrap_external import _code_to_hash_pyc
DOCUMENTED = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
def is_docstring(statement):
    return (
        isinstance(statement, ast.Expr)
        and isinstance(statement.value, ast.Constant)
        and isinstance(statement.value.value, str)
    )
found = {}
with zipfile.ZipFile("napllm.whl") as zf:
    for name in zf.namelist():
        if not name.endswith(".py"):
            continue
        source = zf.read(name)
        tree = ast.parse(source, name)
        for node in ast.walk(tree):
            if isinstance(node, DOCUMENTED) and node.body and is_docstring(node.body[0]):
                if len(node.body) == 1:
                    node.body[0] = ast.copy_location(ast.Pass(), node.body[0])
                else:
                    del node.body[0]
        code = compile(tree, name, "exec", dont_inherit=True)
        data = _code_to_hash_pyc(code, importlib.util.source_hash(source), checked=False)
        found[name] = base64.b64encode(bytes(data)).decode()
json.dumps({"tag": sys.implementation.cache_tag, "pyc": found})
`);
  process.stdout.write(out);
})().catch((error) => { console.error(String(error)); process.exit(1); });
"""


def add_bytecode(wheel: Path) -> None:
    """Add Pyodide-compiled bytecode (``__pycache__/*.pyc``) to the napllm wheel in place.

    The browser would otherwise compile every napllm module at each start
    (Pyodide's own packages ship compiled; ours did not): about a second of
    a warm reload. The bytecode comes from the Pyodide in node_modules/ (the
    one dist/ ships, so the magic number matches) and is written as
    unchecked-hash pycs, which the import system uses without comparing
    timestamps. The bytecode leaves out docstrings (nothing in the browser
    reads them; a quarter of the bytecode's size), with every line number
    kept; the sources stay in the wheel, so tracebacks show their lines.
    Raises `BuildError` when node or Pyodide fails.
    """
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "compile.cjs"
        script.write_text(COMPILE_JS, encoding="utf-8")
        proc = subprocess.run(
            ["node", str(script), str(NODE_MODULES / "pyodide"), str(wheel)],
            capture_output=True,
            text=True,
            check=False,
        )
    if proc.returncode != 0:
        raise BuildError(f"compiling the napllm wheel with Pyodide failed:\n{proc.stderr[-2000:]}")
    result = json.loads(proc.stdout)
    tag = str(result["tag"])
    with zipfile.ZipFile(wheel, "a", compression=zipfile.ZIP_DEFLATED) as zf:
        names = set(zf.namelist())
        record = next(n for n in names if n.endswith(".dist-info/RECORD"))
        lines = zf.read(record).decode()
        added: list[str] = []
        for source, data in sorted(result["pyc"].items()):
            folder, _, file = source.rpartition("/")
            target = f"{folder}/__pycache__/{file[:-3]}.{tag}.pyc"
            if target in names:
                continue
            zf.writestr(target, base64.b64decode(data))
            added.append(f"{target},,\n")
    # A wheel's RECORD lists every file; bytecode may go without a hash.
    rewrite_member(wheel, record, (lines + "".join(added)).encode())


def rewrite_member(archive: Path, name: str, data: bytes) -> None:
    """Replace member `name` of zip `archive` with `data` (the other members copied)."""
    tmp = archive.with_name(archive.name + ".tmp")
    with zipfile.ZipFile(archive) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            if info.filename == name:
                dst.writestr(info, data)
            else:
                dst.writestr(info, src.read(info.filename))
    tmp.replace(archive)


# --------------------------------------------------------------------------- Pyodide


def canonical_name(name: str) -> str:
    """PEP 503 normalised project name (``Typing_Extensions`` -> ``typing-extensions``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_applies(marker: str) -> bool:
    """Whether a Requires-Dist marker holds in Pyodide without extras."""
    try:
        from packaging.markers import Marker
    except ImportError:  # pip always vendors the same library
        from pip._vendor.packaging.markers import Marker  # type: ignore[assignment]
    return bool(Marker(marker).evaluate(dict(PYODIDE_MARKERS)))


def wheel_lock_entry(path: Path) -> dict[str, Any]:
    """A ``pyodide-lock.json`` package entry for one wheel.

    Shape: ``{name, version, file_name, install_dir, sha256, package_type,
    imports, depends, unvendored_tests}``. ``depends`` comes from the wheel's
    ``Requires-Dist`` metadata, without extras and without requirements whose
    environment marker is false in Pyodide; ``imports`` are the wheel's
    top-level modules.
    """
    with zipfile.ZipFile(path) as zf:
        names = zf.namelist()
        meta_name = next(n for n in names if n.endswith(".dist-info/METADATA"))
        meta = email.parser.Parser().parsestr(zf.read(meta_name).decode())
    tops = set()
    for n in names:
        top = n.split("/")[0]
        if top.endswith((".dist-info", ".data")):
            continue
        tops.add(top.removesuffix(".py"))
    depends = []
    for req in meta.get_all("Requires-Dist") or []:
        spec, _, marker = req.partition(";")
        if marker.strip() and not _requirement_applies(marker.strip()):
            continue
        match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", spec)
        if match:
            depends.append(canonical_name(match.group(1)))
    return {
        "name": canonical_name(meta["Name"]),
        "version": meta["Version"],
        "file_name": path.name,
        "install_dir": "site",
        "sha256": sha256_file(path),
        "package_type": "package",
        "imports": sorted(tops),
        "depends": sorted(set(depends)),
        "unvendored_tests": False,
    }


def copy_pyodide(out: DistWriter, wheels: list[Path]) -> dict[str, Any]:
    """Copy Pyodide into dist/pyodide/ with our wheels and a merged lock file.

    Our entries replace Pyodide's own for the same names (micropip, pydantic,
    pydantic-core, typing-*, annotated-types) and add jschon, rfc3986 and
    napllm, so ``loadPackage(name)`` and ``micropip.install(name)`` find them
    in the lock and load them from the same folder.

    Returns: the merged lock's ``info`` plus our package versions.
    """
    src = NODE_MODULES / "pyodide"
    for name in PYODIDE_FILES:
        out.copy(src / name, f"pyodide/{name}")
    lock = json.loads((src / "pyodide-lock.json").read_text(encoding="utf-8"))
    ours: dict[str, str] = {}
    entries = [wheel_lock_entry(path) for path in wheels]
    for path, entry in zip(wheels, entries, strict=True):
        key = entry["name"]
        lock["packages"][key] = {**lock["packages"].get(key, {}), **entry}
        ours[key] = entry["version"]
        out.copy(path, f"pyodide/{path.name}")
    for entry in entries:
        missing = [d for d in entry["depends"] if d not in ours]
        if missing:
            raise BuildError(f"{entry['name']} depends on {missing}, which no wheel provides")
    out.write_bytes("pyodide/pyodide-lock.json", json.dumps(lock, separators=(",", ":")).encode())
    return {"info": lock["info"], "packages": ours}


# --------------------------------------------------------------------------- JavaScript


def bundle_js(out: DistWriter) -> None:
    """Bundle wllama, web-llm and transformers.js with esbuild into dist/vendor/.

    ESM, minified. Entries are ``web/vendor-entry/*.js``. The wllama bundle
    gets its ``wllama.wasm`` next to it, the transformers.js bundle
    onnxruntime-web's ``ort-wasm-simd-threaded.asyncify.{mjs,wasm}``. Skipped
    when the lock, the entries and the outputs are unchanged.
    """
    esbuild = NODE_MODULES / ".bin" / "esbuild"
    entries = ROOT / "web" / "vendor-entry"
    digest = hashlib.sha256(sha256_file(ROOT / "package-lock.json").encode())
    for entry, _ in BUNDLES:
        digest.update((entries / entry).read_bytes())
    outputs = [out.claim(rel) for _, rel in BUNDLES]
    if not (stamp_matches("esbuild", digest.hexdigest()) and all(p.is_file() for p in outputs)):
        for (entry, rel), dst in zip(BUNDLES, outputs, strict=True):
            log(f"esbuild {rel}")
            dst.parent.mkdir(parents=True, exist_ok=True)
            run(
                [
                    *(str(esbuild), str(entries / entry), "--bundle", "--format=esm"),
                    *("--minify", "--target=es2022", "--log-level=warning", f"--outfile={dst}"),
                ]
            )
        write_stamp("esbuild", digest.hexdigest())
    out.copy(
        NODE_MODULES / "@wllama" / "wllama" / "esm" / "wasm" / "wllama.wasm",
        "vendor/wllama/wllama.wasm",
    )
    for name in ORT_WASM_FILES:
        out.copy(NODE_MODULES / "onnxruntime-web" / "dist" / name, f"vendor/transformers/{name}")


def bundle_prompt_api(out: DistWriter) -> None:
    """Bundle the Prompt API layer and write it as ``dist/js/prompt-api-source.js``.

    esbuild bundles ``web/prompt-api.js`` with ``@cfworker/json-schema`` into
    one minified IIFE (``var napllmPromptApi = ...``); the module written
    exports its text as ``PROMPT_API_SOURCE``. The shell places that text in
    an inline ``<script>`` of a napplet's srcdoc, so it must not hold
    ``</script`` or ``<!--`` (checked here).

    Raises: BuildError when esbuild fails or the bundle could end the script early.
    """
    esbuild = NODE_MODULES / ".bin" / "esbuild"
    BUILD.mkdir(parents=True, exist_ok=True)
    bundle = BUILD / "prompt-api.iife.js"
    run(
        [
            *(str(esbuild), str(WEB / PROMPT_API_ENTRY), "--bundle", "--format=iife"),
            *(f"--global-name={PROMPT_API_GLOBAL}", "--minify", "--target=es2022"),
            *("--charset=ascii", "--log-level=warning", f"--outfile={bundle}"),
        ]
    )
    text = bundle.read_text(encoding="utf-8").strip()
    if re.search(r"</script|<!--", text, re.I):
        raise BuildError("the Prompt API bundle holds '</script' or '<!--'; it cannot be inlined")
    module = (
        "// Generated by build.py from web/prompt-api.js (see there); do not edit.\n"
        f"export const PROMPT_API_SOURCE = {json.dumps(text)};\n"
    )
    out.write_bytes(PROMPT_API_MODULE, module.encode("utf-8"))


#: Fields of WebLLM's model records the shell needs to judge a device.
WEBLLM_RECORD_FIELDS = (
    "model_id",
    "vram_required_MB",
    "required_features",
    "model_type",
    "low_resource_required",
    "buffer_size_required_bytes",
)


def sri_sha256(hex_digest: str) -> str:
    """A Subresource Integrity value (``sha256-<base64>``) for a hex sha256."""
    return "sha256-" + base64.b64encode(bytes.fromhex(hex_digest)).decode()


def webllm_tinychat_record(sums: dict[str, str]) -> dict[str, Any]:
    """WebLLM's ``ModelRecord`` for the bundled TinyChat, URLs relative to dist/.

    ``integrity`` (WebLLM checks it after each download: config, model
    library, tokenizer) comes from ``models/tinychat/webllm/SHA256SUMS``.
    TinyChat needs no ``shader-f16`` and only small buffers (its whole
    weights are 2 MB), so it runs on software adapters.
    """
    return {
        "model_id": "TinyChat-q0f32-MLC",
        "model": f"{WEBLLM_MODEL_DEST}/",
        "model_lib": f"{WEBLLM_MODEL_DEST}/tinychat-webgpu.wasm",
        "model_type": 0,
        "required_features": [],
        "vram_required_MB": 32,
        "low_resource_required": True,
        "buffer_size_required_bytes": 32 * 1024 * 1024,
        "integrity": {
            "config": sri_sha256(sums["mlc-chat-config.json"]),
            "model_lib": sri_sha256(sums["tinychat-webgpu.wasm"]),
            "tokenizer": {"tokenizer.json": sri_sha256(sums["tokenizer.json"])},
            "onFailure": "error",
        },
    }


def write_webllm_catalog(out: DistWriter, bundled: list[dict[str, Any]] | None = None) -> None:
    """Write ``vendor/web-llm/catalog.json``: WebLLM's prebuilt model records.

    The shell lists WebLLM models at boot; reading the records from this
    small file means the 6 MB web-llm bundle is only loaded on a device with
    a WebGPU adapter. Node imports the bundle once per bundle version.
    ``bundled``: records of models shipped in dist/ (:func:`copy_webllm_model`),
    written under ``bundled``.
    """
    bundle = DIST / "vendor" / "web-llm" / "web-llm.js"
    cache = BUILD / "webllm-catalog.json"
    digest = sha256_file(bundle)
    if not (stamp_matches("webllm-catalog", digest) and cache.is_file()):
        script = (
            "const lib = await import(process.argv[1]);"
            "const fields = JSON.parse(process.argv[2]);"
            "const records = lib.prebuiltAppConfig.model_list.map((r) =>"
            " Object.fromEntries(fields.filter((k) => k in r).map((k) => [k, r[k]])));"
            "process.stdout.write(JSON.stringify({records,"
            " functionCallingIds: [...(lib.functionCallingModelIds || [])]}));"
        )
        result = subprocess.run(
            [
                "node",
                "--input-type=module",
                "-e",
                script,
                bundle.as_uri(),
                json.dumps(WEBLLM_RECORD_FIELDS),
            ],
            check=True,
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
        catalog = json.loads(result.stdout)
        if not catalog.get("records"):
            raise BuildError("web-llm's prebuilt model list is empty")
        BUILD.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps(catalog), encoding="utf-8")
        write_stamp("webllm-catalog", digest)
    catalog = json.loads(cache.read_text(encoding="utf-8"))
    catalog["bundled"] = list(bundled or [])
    out.write_json("vendor/web-llm/catalog.json", catalog)


def copy_pyscript(out: DistWriter) -> None:
    """Copy @pyscript/core's dist/ to dist/vendor/pyscript/ and write its config.

    ``config.json`` points the interpreter at the local Pyodide
    (``../pyodide/pyodide.mjs``, relative to the config file) and asks for
    ``napllm`` by name, which the merged lock resolves offline. A page uses
    ``<script type="py" config="vendor/pyscript/config.json">``.
    """
    src = NODE_MODULES / "@pyscript" / "core" / "dist"
    for path in sorted(src.iterdir()):
        if path.is_file() and not path.name.endswith(".map"):
            out.copy(path, f"vendor/pyscript/{path.name}")
    config = {"interpreter": "../pyodide/pyodide.mjs", "packages": ["napllm"]}
    out.write_json("vendor/pyscript/config.json", config)


# --------------------------------------------------------------------------- content


def copy_web(out: DistWriter) -> int:
    """Copy the host page (web/, without web/vendor-entry/) to the root of dist/.

    A missing web/ is not an error (the build then has no host page).
    Returns the number of files copied.
    """
    if not WEB.is_dir():
        return 0
    count = 0
    for path in sorted(WEB.rglob("*")):
        rel = path.relative_to(WEB)
        if not path.is_file() or rel.parts[0] == "vendor-entry" or "__pycache__" in rel.parts:
            continue
        if rel.as_posix() == PROMPT_API_ENTRY:
            continue  # shipped bundled, as js/prompt-api-source.js (bundle_prompt_api)
        # web/ may be edited while we build: a file that vanished is simply not copied.
        with contextlib.suppress(FileNotFoundError):
            out.copy(path, rel.as_posix())
            count += 1
    return count


#: Bounds of what a napplet's own page may put into the gallery (dist/napplets/index.json).
#: Napplet HTML is untrusted: only bounded, whitespace-normalised text and an
#: icon that is a small data: image or a small image file inside its own folder.
CARD_TITLE_MAX = 60
CARD_DESCRIPTION_MAX = 160
CARD_ICON_DATA_MAX = 16 * 1024
CARD_ICON_FILE_MAX = 64 * 1024
#: Media types an icon data: URL may name (all render as inert images in <img>).
CARD_ICON_DATA_RE = re.compile(
    r"data:image/(?:png|gif|jpeg|webp|svg\+xml)(?:;base64)?,[^\s\"'<>\\]*", re.I
)
CARD_ICON_SUFFIXES = frozenset({".png", ".gif", ".jpg", ".jpeg", ".webp", ".svg", ".ico"})
#: Characters an icon file path may use (relative to the napplet's folder).
CARD_ICON_PATH_RE = re.compile(r"[A-Za-z0-9_.-]+(?:/[A-Za-z0-9_.-]+)*")
#: Controls, and the invisible format characters that reorder or hide text
#: (bidi marks, overrides and isolates, zero-width and word-joiner
#: characters, the byte order mark, interlinear annotation marks, tags).
_CONTROL_RE = re.compile(
    r"[\x00-\x1f\x7f-\x9f\u061c\u180e\u200b-\u200f\u202a-\u202e\u2060-\u206f"
    r"\ufeff\ufff9-\ufffb\U000e0000-\U000e007f]"
)


class _HeadParser(html.parser.HTMLParser):
    """Collects a page's first <title> text, first description meta and first icon link.

    Only the attributes named here are read; everything else in the page is
    ignored. Character references are decoded by html.parser itself.
    """

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self._inside = False
        self._done = False
        self.parts: list[str] = []
        self.description: str | None = None
        self.icon: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = {name.lower(): value or "" for name, value in attrs}
        if tag == "title" and not self._done:
            self._inside = True
        elif tag == "meta" and self.description is None:
            if values.get("name", "").strip().lower() == "description":
                self.description = values.get("content", "")
        elif (
            tag == "link" and self.icon is None and "icon" in values.get("rel", "").lower().split()
        ):
            self.icon = values.get("href", "")

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)

    def handle_endtag(self, tag: str) -> None:
        if tag == "title" and self._inside:
            self._inside = False
            self._done = True

    def handle_data(self, data: str) -> None:
        if self._inside:
            self.parts.append(data)


def _parse_head(path: Path) -> _HeadParser:
    parser = _HeadParser()
    parser.feed(path.read_text(encoding="utf-8", errors="replace"))
    parser.close()
    return parser


def card_text(text: str, limit: int) -> str:
    """``text`` as one line of plain text: control and direction-override characters
    dropped, whitespace collapsed, at most ``limit`` characters (cut with "…")."""
    clean = " ".join(_CONTROL_RE.sub(" ", text).split())
    if len(clean) > limit:
        clean = clean[: limit - 1].rstrip() + "…"
    return clean


def html_title(path: Path) -> str:
    """The whitespace-normalised <title> of an HTML file ('' when it has none)."""
    return " ".join("".join(_parse_head(path).parts).split())


def card_icon(href: str, folder: Path, prefix: str) -> str:
    """The gallery icon of a napplet from its ``<link rel="icon" href>``, or ''.

    Accepted: a ``data:image/(png|gif|jpeg|webp|svg+xml)`` URL of at most
    :data:`CARD_ICON_DATA_MAX` characters (kept as it is), or a relative path
    to an image file inside the napplet's own ``folder`` (so inside dist/) of
    at most :data:`CARD_ICON_FILE_MAX` bytes, returned as ``prefix`` + path
    (relative to dist/). Anything else (other schemes, absolute or escaping
    paths, queries, other file types, large files) gives ''.
    """
    href = href.strip()
    if href.lower().startswith("data:"):
        ok = len(href) <= CARD_ICON_DATA_MAX and CARD_ICON_DATA_RE.fullmatch(href)
        return href if ok else ""
    if not CARD_ICON_PATH_RE.fullmatch(href) or ".." in href.split("/"):
        return ""
    target = folder / href
    if target.suffix.lower() not in CARD_ICON_SUFFIXES or not target.is_file():
        return ""
    try:
        inside = target.resolve().is_relative_to(folder.resolve())
        small = target.stat().st_size <= CARD_ICON_FILE_MAX
    except OSError:
        return ""
    return prefix + href if inside and small else ""


def napplet_card(folder: Path) -> dict[str, str]:
    """The gallery entry of the napplet in ``folder`` (its ``index.html`` is read as
    untrusted text): ``{"name", "title", "description", "icon", "path"}``.

    ``title`` is the page's <title> (the folder name when empty), ``description``
    its ``<meta name="description">`` content, both plain bounded text
    (:func:`card_text`); ``icon`` is :func:`card_icon` of its first icon link;
    ``path`` is relative to dist/.
    """
    head = _parse_head(folder / "index.html")
    prefix = f"napplets/{folder.name}/"
    return {
        "name": folder.name,
        "title": card_text("".join(head.parts), CARD_TITLE_MAX) or folder.name,
        "description": card_text(head.description or "", CARD_DESCRIPTION_MAX),
        "icon": card_icon(head.icon or "", folder, prefix),
        "path": prefix + "index.html",
    }


def _napplet_files(folder: Path) -> list[Path]:
    """The regular files under ``folder``, sorted, reached without following any link.

    A napplet's folder is untrusted: a symbolic link in it (to a key file, a
    home folder) would otherwise publish what it points to in dist/.
    """
    files: list[Path] = []
    for root, dirs, names in os.walk(folder, followlinks=False):
        dirs[:] = [d for d in dirs if not (Path(root) / d).is_symlink()]
        for name in names:
            path = Path(root) / name
            if not path.is_symlink() and path.is_file():
                files.append(path)
    return sorted(files)


def copy_napplets(out: DistWriter) -> list[dict[str, str]]:
    """Copy napplets/<name>/ to dist/napplets/ and write dist/napplets/index.json.

    Only folders with an ``index.html`` are napplets; symbolic links (a
    napplet folder, its page, or anything inside) are never followed or
    copied (:func:`_napplet_files`). The index lists them
    sorted by name as :func:`napplet_card` entries (``path`` and a file
    ``icon`` relative to dist/). A missing napplets/ gives an empty index.
    """
    index: list[dict[str, str]] = []
    if NAPPLETS.is_dir():
        for folder in sorted(p for p in NAPPLETS.iterdir() if p.is_dir() and not p.is_symlink()):
            page = folder / "index.html"
            if not page.is_file() or page.is_symlink():
                continue
            for path in _napplet_files(folder):
                rel = path.relative_to(NAPPLETS)
                if "__pycache__" not in rel.parts:
                    with contextlib.suppress(FileNotFoundError):  # edited while we build
                        out.copy(path, f"napplets/{rel.as_posix()}")
            index.append(napplet_card(folder))
    out.write_json("napplets/index.json", index)
    return index


def read_sha256sums(path: Path) -> dict[str, str]:
    """Parse a ``sha256sum`` file: ``<hex>  <name>`` (or ``<hex> *<name>``) per line."""
    sums: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        match = re.fullmatch(r"([0-9a-fA-F]{64}) [ *](.+)", line.strip())
        if match:
            sums[match.group(2)] = match.group(1).lower()
    return sums


def copy_model(out: DistWriter) -> dict[str, Any]:
    """Copy the default model to dist/models/tinychat/, checking its sha256.

    Raises: BuildError when the file is missing, unlisted in SHA256SUMS or
    does not match it.
    """
    model = MODEL_DIR / MODEL_FILE
    sums_file = MODEL_DIR / "SHA256SUMS"
    if not model.is_file() or not sums_file.is_file():
        raise BuildError(f"{model.relative_to(ROOT)} or its SHA256SUMS is missing")
    expected = read_sha256sums(sums_file).get(MODEL_FILE)
    actual = sha256_file(model)
    if expected != actual:
        raise BuildError(f"{MODEL_FILE}: sha256 {actual} does not match SHA256SUMS")
    out.copy(model, f"models/tinychat/{MODEL_FILE}")
    size = model.stat().st_size
    return {"path": f"models/tinychat/{MODEL_FILE}", "sha256": actual, "bytes": size}


def copy_onnx_model(out: DistWriter) -> dict[str, Any]:
    """Copy TinyChat's ONNX export to dist/models/tinychat-onnx/, checking SHA256SUMS.

    Every file listed in ``models/tinychat/onnx/SHA256SUMS`` is copied under
    the same relative path (transformers.js reads ``config.json``,
    ``generation_config.json``, ``tokenizer*.json`` and ``onnx/model.onnx``).
    Returns ``{path, files: {name: sha256}, bytes}``.
    Raises: BuildError when a file is missing or does not match its sum.
    """
    sums_file = ONNX_MODEL_DIR / "SHA256SUMS"
    if not sums_file.is_file():
        raise BuildError(f"{sums_file.relative_to(ROOT)} is missing")
    sums = read_sha256sums(sums_file)
    if "onnx/model.onnx" not in sums:
        raise BuildError("the ONNX SHA256SUMS does not list onnx/model.onnx")
    size = 0
    for name, expected in sorted(sums.items()):
        path = ONNX_MODEL_DIR / name
        if not path.is_file() or sha256_file(path) != expected:
            raise BuildError(f"models/tinychat/onnx/{name} is missing or does not match SHA256SUMS")
        out.copy(path, f"{ONNX_MODEL_DEST}/{name}")
        size += path.stat().st_size
    return {"path": ONNX_MODEL_DEST, "files": sums, "bytes": size}


def copy_webllm_model(out: DistWriter) -> dict[str, Any]:
    """Copy TinyChat for WebLLM to dist/models/tinychat-webllm/resolve/main/, checking SHA256SUMS.

    Returns WebLLM's model record for it (:func:`webllm_tinychat_record`).
    Raises: BuildError when a file is missing, unlisted or does not match.
    """
    sums_file = WEBLLM_MODEL_DIR / "SHA256SUMS"
    if not sums_file.is_file():
        raise BuildError(f"{sums_file.relative_to(ROOT)} is missing")
    sums = read_sha256sums(sums_file)
    for name in WEBLLM_MODEL_FILES:
        path = WEBLLM_MODEL_DIR / name
        if name not in sums or not path.is_file() or sha256_file(path) != sums[name]:
            raise BuildError(
                f"models/tinychat/webllm/{name} is missing or does not match SHA256SUMS"
            )
        out.copy(path, f"{WEBLLM_MODEL_DEST}/{name}")
    return webllm_tinychat_record(sums)


def write_build_info(
    out: DistWriter, pyodide: dict[str, Any], model: dict[str, Any], napplets: int
) -> dict[str, Any]:
    """Write dist/build-info.json: versions and the size of every file in dist/.

    Shape: ``{"pyodide", "python", "packages": {name: version}, "napllm",
    "wllama", "web-llm", "transformers", "onnxruntime-web", "pyscript", "model":
    {path, sha256, bytes},
    "napplets", "files": {relative path: bytes}, "total_bytes"}``.
    """
    files = {
        p.relative_to(out.root).as_posix(): p.stat().st_size
        for p in sorted(out.written)
        if p.is_file() and p.name != "build-info.json"
    }
    info = {
        "pyodide": npm_version("pyodide"),
        "python": pyodide["info"].get("python"),
        "packages": dict(sorted(pyodide["packages"].items())),
        "pydantic": pyodide["packages"].get("pydantic"),
        "pydantic_core": pyodide["packages"].get("pydantic-core"),
        "napllm": pyodide["packages"].get("napllm"),
        "wllama": npm_version("@wllama/wllama"),
        "web-llm": npm_version("@mlc-ai/web-llm"),
        "transformers": npm_version("@huggingface/transformers"),
        "onnxruntime-web": npm_version("onnxruntime-web"),
        "pyscript": npm_version("@pyscript/core"),
        "model": model,
        "napplets": napplets,
        "files": files,
        "total_bytes": sum(files.values()),
    }
    out.write_json("build-info.json", info)
    return info


# --------------------------------------------------------------------------- offline (PWA)

#: Files of dist/ the service worker precaches: everything the shell loads to
#: boot and answer with TinyChat offline (the web-llm bundle included: the
#: shell imports it at start to probe WebGPU). PyScript is not used by the shell.
PRECACHE_PATTERNS = (
    "index.html",
    "*.{js,css,webmanifest}",
    "js/**/*.js",
    "engines/**/*.js",
    "icons/*.png",
    "napplets/**/*",
    "pyodide/*.{mjs,wasm,zip,json,whl}",
    "vendor/wllama/*",
    "vendor/web-llm/*",
    "vendor/workbox-window/*",
    f"models/tinychat/{MODEL_FILE}",
)
PRECACHE_IGNORES = ("sw.js", "sw-build.js", "sw-napllm.js", "pyodide/pyodide.js")
#: Scripts sw.js imports before Workbox's own code (relative to sw.js):
#: this build's names, then napllm's part of the worker (web/sw-napllm.js).
SW_IMPORTS = ("sw-build.js", "sw-napllm.js")
#: Workbox refuses files above 2 MB by default; the wasm files are ~10 MB.
PRECACHE_MAX_BYTES = 64 * 1024 * 1024
#: Cache Storage name shared with web/js/pwa.js (the Storage section).
MODEL_CACHE = "napllm-models"
ICON_SIZES = (192, 512)

#: Node program run by build_service_worker: workbox-build's generateSW with the
#: JSON options in $NAPLLM_SW_OPTIONS, plus the runtime-caching rules (they are
#: functions, which JSON cannot carry). Prints {"count", "size"} as JSON.
_GENERATE_SW_JS = r"""
const { generateSW } = require("workbox-build");
const opts = JSON.parse(process.env.NAPLLM_SW_OPTIONS);
const caches = JSON.parse(process.env.NAPLLM_SW_CACHES);
generateSW({
  ...opts,
  ignoreURLParametersMatching: [/.*/],
  runtimeCaching: [
    {
      // HEAD requests (wllama asks for a model's size before loading it):
      // answered from the headers of a cached copy, so they work offline.
      // Precache keys carry a revision parameter, hence ignoreSearch for
      // this origin's files; other origins must match exactly.
      urlPattern: ({ request }) => request.method === "HEAD",
      method: "HEAD",
      handler: async ({ request, url }) => {
        const cached =
          (await caches.match(request.url, { ignoreMethod: true })) ||
          (url.origin === self.location.origin
            ? await caches.match(request.url, { ignoreMethod: true, ignoreSearch: true })
            : undefined);
        if (!cached) return fetch(request);
        return new Response(null, { status: cached.status, headers: cached.headers });
      },
    },
    {
      // GGUF models the user adds (any origin): kept until deleted in the
      // Storage section. The built-in TinyChat is precached instead.
      urlPattern: ({ url, request }) =>
        request.method === "GET" && url.pathname.toLowerCase().endsWith(".gguf"),
      handler: "CacheFirst",
      options: {
        cacheName: caches.models,
        rangeRequests: true,
        // Stored only once verified (web/sw-napllm.js): a 200 text/html
        // fallback page or a cut-off download never becomes the "model".
        plugins: [
          {
            cacheWillUpdate: async ({ response }) =>
              self.napllmSw.verifiedModel(response, { gguf: true }),
          },
        ],
      },
    },
  ],
}).then(({ count, size, warnings }) => {
  for (const w of warnings) console.error(w);
  process.stdout.write(JSON.stringify({ count, size }));
}, (error) => {
  console.error(String(error && error.stack ? error.stack : error));
  process.exit(1);
});
"""


def _png(size: int) -> bytes:
    """A ``size``x``size`` RGBA PNG of the napllm app icon.

    Drawn here with zlib and struct (a rounded square with a speech-bubble
    dot pattern) so the build needs no imaging library for two icons.
    """
    import struct
    import zlib

    bg, fg = (0x1F, 0x4E, 0x8C, 255), (255, 255, 255, 255)
    radius = size * 0.18
    rows = []
    for y in range(size):
        row = bytearray([0])  # filter type 0 (None) per scanline
        for x in range(size):
            cx, cy = min(x + 0.5, size - x - 0.5), min(y + 0.5, size - y - 0.5)
            outside = (
                cx < radius and cy < radius and (radius - cx) ** 2 + (radius - cy) ** 2 > radius**2
            )
            colour = (0, 0, 0, 0) if outside else bg
            # Three dots across the middle: "a model is answering".
            for i in (-1, 0, 1):
                dx, dy = x + 0.5 - size * (0.5 + 0.22 * i), y + 0.5 - size * 0.5
                if dx * dx + dy * dy <= (size * 0.08) ** 2:
                    colour = fg
            row += bytes(colour)
        rows.append(bytes(row))

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", size, size, 8, 6, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(b"".join(rows), 9))
        + chunk(b"IEND", b"")
    )


def write_icons(out: DistWriter) -> None:
    """Write the manifest's icons to dist/icons/icon-<size>.png (192 and 512 px)."""
    for size in ICON_SIZES:
        rel = f"icons/icon-{size}.png"
        cached = BUILD / "icons" / f"icon-{size}.png"
        if not cached.is_file():
            cached.parent.mkdir(parents=True, exist_ok=True)
            cached.write_bytes(_png(size))
        out.copy(cached, rel)


def precache_build_id(out: DistWriter, exclude: set[Path]) -> str:
    """A 16-hex-digit id of dist/'s content: changes whenever any file changes.

    Hashes every written file's relative path and sha256 (``exclude`` left
    out). Used as the service worker's cache id, so every build precaches
    into a cache of its own (web/sw-napllm.js).
    """
    digest = hashlib.sha256()
    for path in sorted(out.written):
        if path.is_file() and path not in exclude and path.name != "build-info.json":
            digest.update(
                f"{path.relative_to(out.root).as_posix()}\0{sha256_file(path)}\0".encode()
            )
    return digest.hexdigest()[:16]


def build_service_worker(out: DistWriter) -> dict[str, Any]:
    """Generate dist/sw.js with workbox-build (``generateSW``) and copy workbox-window.

    The precache manifest (URL + revision of every file matched by
    ``PRECACHE_PATTERNS``) is computed by Workbox from dist/ itself; nothing
    is listed by hand. All precache URLs are relative to sw.js, whose scope is
    its own folder, so the shell works offline at any sub-path. The worker
    waits: ``skipWaiting`` happens only when the page posts
    ``{"type": "SKIP_WAITING"}`` (web/js/pwa.js, after the user clicks
    Reload); it claims open pages on activation so the first visit is
    controlled without a reload. Each build precaches into a cache named
    after :func:`precache_build_id`; web/sw-napllm.js (imported first, with
    the generated dist/sw-build.js) keeps serving tabs of an earlier build
    from that build's cache until they reload, and verifies model files
    before they are cached. Skipped when no precached file changed.

    Returns: ``{"count", "size"}`` of the precache (files, bytes).
    Raises: BuildError when Node or workbox-build fails.
    """
    write_icons(out)
    out.copy(
        NODE_MODULES / "workbox-window" / "build" / "workbox-window.prod.mjs",
        "vendor/workbox-window/workbox-window.prod.mjs",
    )
    sw = out.claim("sw.js")
    build_id = precache_build_id(out, exclude={sw, out.root / "sw-build.js"})
    cache_id = f"napllm-{build_id}"
    out.write_bytes(
        "sw-build.js",
        (
            "// Written by build.py: this build's names for web/sw-napllm.js.\n"
            f"self.NAPLLM_BUILD = {json.dumps({'id': build_id, 'cacheId': cache_id})};\n"
        ).encode(),
    )
    options = {
        "globDirectory": str(out.root),
        "globPatterns": list(PRECACHE_PATTERNS),
        "globIgnores": list(PRECACHE_IGNORES),
        "swDest": str(sw),
        "maximumFileSizeToCacheInBytes": PRECACHE_MAX_BYTES,
        "directoryIndex": "index.html",
        # Each build precaches into its own cache; web/sw-napllm.js deletes
        # an earlier build's cache once no open tab runs that build.
        "cacheId": cache_id,
        "cleanupOutdatedCaches": False,
        "clientsClaim": True,
        "skipWaiting": False,
        "importScripts": list(SW_IMPORTS),
        "inlineWorkboxRuntime": True,
        "mode": "production",
        "sourcemap": False,
    }
    caches = {"models": MODEL_CACHE}
    digest = hashlib.sha256(_GENERATE_SW_JS.encode() + json.dumps([options, caches]).encode())
    digest.update(sha256_file(ROOT / "package-lock.json").encode())
    for path in sorted(out.written):
        if path.is_file() and path != sw:
            stat = path.stat()
            digest.update(
                f"{path.relative_to(out.root)}\0{stat.st_size}\0{stat.st_mtime_ns}\0".encode()
            )
    stamp = BUILD / "stamps" / "sw-result.json"
    if stamp_matches("sw", digest.hexdigest()) and sw.is_file() and stamp.is_file():
        cached: dict[str, Any] = json.loads(stamp.read_text(encoding="utf-8"))
        return cached
    if shutil.which("node") is None:
        raise BuildError("node is not installed (Node 20 or newer is required)")
    log("workbox generateSW sw.js")
    env = dict(
        os.environ, NAPLLM_SW_OPTIONS=json.dumps(options), NAPLLM_SW_CACHES=json.dumps(caches)
    )
    proc = subprocess.run(
        ["node", "-e", _GENERATE_SW_JS],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise BuildError(f"workbox generateSW failed:\n{(proc.stdout + proc.stderr)[-4000:]}")
    result: dict[str, Any] = json.loads(proc.stdout)
    stamp.parent.mkdir(parents=True, exist_ok=True)
    stamp.write_text(json.dumps(result), encoding="utf-8")
    write_stamp("sw", digest.hexdigest())
    return result


# --------------------------------------------------------------------------- build


def build_inputs() -> list[Path]:
    """Every source file whose change makes dist/ stale (for the test harness)."""
    files = [ROOT / "build.py", ROOT / "package-lock.json", *napllm_sources()]
    files += [MODEL_DIR / MODEL_FILE, MODEL_DIR / "SHA256SUMS"]
    files += [p for p in ONNX_MODEL_DIR.rglob("*") if p.is_file() and p.suffix != ".py"]
    for folder in (WEB, NAPPLETS):
        if folder.is_dir():
            files += [p for p in folder.rglob("*") if p.is_file()]
    return [p for p in files if p.is_file()]


def dist_is_stale() -> bool:
    """True when dist/ is missing or older than any of its sources."""
    info = DIST / "build-info.json"
    if not info.is_file():
        return True
    built = info.stat().st_mtime
    return any(p.stat().st_mtime > built for p in build_inputs())


@contextlib.contextmanager
def build_lock() -> Iterator[None]:
    """Hold an exclusive lock on build/.lock so concurrent builds run one at a time."""
    BUILD.mkdir(parents=True, exist_ok=True)
    with (BUILD / ".lock").open("w", encoding="utf-8") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def build(*, gzip_sizes: bool = False) -> dict[str, Any]:
    """Run every step and return the build info (see :func:`write_build_info`).

    Raises: BuildError (with the failing step's reason) on any failure.
    """
    started = time.monotonic()
    with build_lock():
        ensure_node_modules()
        wheels = fetch_wheels()
        napllm = build_napllm_wheel()
        out = DistWriter(DIST)
        DIST.mkdir(exist_ok=True)
        pyodide = copy_pyodide(out, [*wheels.values(), napllm])
        bundle_js(out)
        write_webllm_catalog(out, [copy_webllm_model(out)])
        copy_pyscript(out)
        copy_web(out)
        bundle_prompt_api(out)
        napplets = copy_napplets(out)
        model = copy_model(out)
        copy_onnx_model(out)
        precache = build_service_worker(out)
        info = write_build_info(out, pyodide, model, len(napplets))
        out.prune()
        os.utime(DIST / "build-info.json")
    elapsed = time.monotonic() - started
    summary = f"dist/: {len(info['files'])} files, {info['total_bytes'] / 1e6:.1f} MB"
    summary += f", precache {precache['count']} files {precache['size'] / 1e6:.1f} MB"
    if gzip_sizes:
        packed = sum(len(gzip.compress((DIST / rel).read_bytes(), 6)) for rel in info["files"])
        summary += f" ({packed / 1e6:.1f} MB gzip)"
    print(f"{summary}, built in {elapsed:.1f} s", flush=True)
    return info


#: dist-test/ files replaced by a test hook (a file of tests/hooks/), and where
#: the product's file is kept for the hook to import (None: not kept).
TEST_OVERRIDES: dict[str, tuple[str, str | None]] = {
    "js/boot-runtime.js": ("boot-runtime.js", None),
    "engines/webllm-engine.js": ("webllm-engine.js", "engines/webllm-engine.product.js"),
    "vendor/web-llm/web-llm.js": ("web-llm.js", "vendor/web-llm/web-llm.product.js"),
    # small download ceilings, so a host that never stops is refused quickly
    "engines/limits.js": ("engine-limits.js", None),
}
#: Files only the test build has: dist-test path -> file of tests/hooks/.
TEST_ADDITIONS: dict[str, str] = {
    "testhooks/napllm_testhooks.py": "napllm_testhooks.py",
    "testhooks/webllm-factory.js": "webllm-factory.js",
}


def _link(src: Path, dst: Path) -> None:
    """Make ``dst`` a hard link to ``src`` (a copy where links are impossible)."""
    if dst.is_file() and os.path.samefile(src, dst):
        return
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(dst.name + ".tmp")
    tmp.unlink(missing_ok=True)
    try:
        os.link(src, tmp)
    except OSError:
        shutil.copy2(src, tmp)
    os.replace(tmp, dst)


def build_test_dist() -> Path:
    """Write ``dist-test/`` from the built ``dist/`` and ``tests/hooks/``; returns its path.

    Every file of dist/ is hard-linked (its product copy of an overridden
    file under the name :data:`TEST_OVERRIDES` gives), the hook files are
    copied in, and files no longer produced are removed.

    Raises: BuildError when dist/ is not built or a hook file is missing.
    """
    if not (DIST / "build-info.json").is_file():
        raise BuildError("dist/ is not built; run `python build.py` first")
    with build_lock():
        out = DistWriter(DIST_TEST)
        DIST_TEST.mkdir(exist_ok=True)
        for src in sorted(DIST.rglob("*")):
            if not src.is_file():
                continue
            rel = src.relative_to(DIST).as_posix()
            target = TEST_OVERRIDES[rel][1] if rel in TEST_OVERRIDES else rel
            if target is None:
                continue
            _link(src, DIST_TEST / target)
            out.written.add(DIST_TEST / target)
        hooks = {rel: name for rel, (name, _) in TEST_OVERRIDES.items()} | TEST_ADDITIONS
        for rel, name in hooks.items():
            source = TEST_HOOKS / name
            if not source.is_file():
                raise BuildError(f"test hook {name} is missing from tests/hooks/")
            out.copy(source, rel)
        out.prune()
    return DIST_TEST


def clean() -> None:
    """Remove dist/, dist-test/ and the build cache build/ (node_modules/ is kept)."""
    for path in (DIST, DIST_TEST, BUILD):
        shutil.rmtree(path, ignore_errors=True)
    print("removed dist/, dist-test/ and build/")


# --------------------------------------------------------------------------- serving


def serve(host: str, port: int) -> None:
    """Serve dist/ until interrupted, printing its URL."""
    if not (DIST / "build-info.json").is_file():
        raise BuildError("dist/ is not built; run `python build.py` first")
    server = make_server(DIST, host, port)
    shown = f"[{host}]" if ":" in host else host
    print(f"serving dist/ at http://{shown}:{server.server_address[1]}/", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


CHROMIUM = Path("/usr/bin/chromium")  # Debian's package; tests never download a browser

#: Exact versions of every CPython package the test and service extras pull
#: in (pip constraints, made by pip-compile from pyproject.toml; the README's
#: "Set-up" section says how to update it). A fresh machine installs what CI
#: tested, not whatever is newest that day.
PYTHON_LOCK = ROOT / "requirements" / "lock.txt"


def ensure_test_dependencies() -> None:
    """Install what the test suite needs, skipping what is already there.

    Debian's ``chromium`` (``apt-get``, as root), the project with its test and
    service extras (``pip install -e``, constrained to the exact versions of
    ``requirements/lock.txt``), which compiles ``llama-cpp-python`` only
    when the locked version is missing (minutes on a fresh machine).
    """
    if not CHROMIUM.exists():
        if os.geteuid() != 0:
            raise BuildError("Debian's chromium is missing; install it: apt-get install chromium")
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
        subprocess.run(["apt-get", "install", "-y", "-qq", "chromium"], check=True, env=env)
    pip = [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    if importlib.util.find_spec("llama_cpp") is None:
        log("installing llama-cpp-python (it compiles llama.cpp: about five minutes)")
    run([*pip, "-c", str(PYTHON_LOCK), "-e", ".[test,service,cpython]"])


def run_tests(pytest_args: list[str]) -> int:
    """Set up, build dist/, run pytest; "no tests collected" counts as a failure."""
    ensure_test_dependencies()
    build()
    command = [sys.executable, "-m", "pytest", *pytest_args]
    log("running " + " ".join(command[1:]))
    status = subprocess.call(command, cwd=ROOT)
    if status == 5:
        print("pytest collected no tests: treating this as a failure", file=sys.stderr)
        return 1
    return status


def main(argv: list[str] | None = None) -> int:
    """Command line: ``build.py [build|serve|test|clean]``; returns the exit status."""
    parser = argparse.ArgumentParser(description="Build dist/ for the napllm shell.")
    sub = parser.add_subparsers(dest="command")
    b = sub.add_parser("build", help="build dist/ (the default)")
    b.add_argument("--gzip", action="store_true", help="also print the gzip size of dist/")
    b.add_argument(
        "--with-test-hooks",
        action="store_true",
        help="also write dist-test/: dist/ plus the test hooks of tests/hooks/ (for the tests)",
    )
    s = sub.add_parser("serve", help="build, then serve dist/ with COOP/COEP headers")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--no-build", action="store_true", help="serve the existing dist/")
    sub.add_parser("clean", help="remove dist/, dist-test/ and build/")
    sub.add_parser(
        "test",
        help="install test dependencies, build, run the whole test suite "
        "(arguments after `test` go to pytest)",
    )
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["test"]:
        try:
            return run_tests(argv[1:])
        except BuildError as exc:
            print(f"build failed: {exc}", file=sys.stderr)
            return 1
    args = parser.parse_args(argv)
    try:
        if args.command == "clean":
            clean()
        elif args.command == "serve":
            if not args.no_build:
                build()
            serve(args.host, args.port)
        else:
            build(gzip_sizes=getattr(args, "gzip", False))
            if getattr(args, "with_test_hooks", False):
                print(f"test build: {build_test_dist().relative_to(ROOT)}/", flush=True)
    except BuildError as exc:
        print(f"build failed: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
