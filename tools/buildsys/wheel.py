"""The ``napllm`` wheel for the browser, with bytecode compiled by Pyodide.

Rules
- The wheel holds runtime/ without the CPython-only parts (`CPYTHON_ONLY`) and
  without the README (no long description in its metadata).
- It is rebuilt only when its sources change (a digest of paths and bytes).
- Its bytecode is compiled by the Pyodide that dist/ ships, without docstrings,
  as unchecked-hash pycs.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from buildsys import paths
from buildsys.base import BuildError, log, run, stamp_matches, write_stamp

#: Parts of runtime/napllm that run only under CPython (the LMSP service, the
#: napplet checker, the httpx port) and so stay out of the browser wheel: they
#: are not shipped to every visitor.
CPYTHON_ONLY = ("lmsp_service", "devtools", "providers/http_httpx.py")


def napllm_sources() -> list[Path]:
    """The files that make up the browser's napllm wheel (package sources and metadata).

    Everything under runtime/ except the CPython-only packages (`CPYTHON_ONLY`).
    """
    files = [paths.ROOT / "pyproject.toml"]
    files += [paths.ROOT / name for name in ("LICENSE",) if (paths.ROOT / name).is_file()]
    skipped = [paths.ROOT / "runtime" / "napllm" / name for name in CPYTHON_ONLY]
    for path in sorted((paths.ROOT / "runtime").rglob("*")):
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
        digest.update(str(path.relative_to(paths.ROOT)).encode() + b"\0")
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
    out = paths.BUILD / "napllm-wheel"
    existing = sorted(out.glob("napllm-*.whl"))
    if stamp_matches("napllm-wheel", digest) and len(existing) == 1:
        return existing[0]
    log("pip wheel napllm")
    with tempfile.TemporaryDirectory() as tmp:
        stage = Path(tmp) / "src"
        for path in files:
            target = stage / path.relative_to(paths.ROOT)
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
            ["node", str(script), str(paths.NODE_MODULES / "pyodide"), str(wheel)],
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
