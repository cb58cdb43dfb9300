"""The Python side of dist/: pinned wheels from PyPI and Pyodide with a merged lock.

Rules
- Every wheel is pinned to a version and a sha256 (`WHEELS`); pip checks the
  hash (``--require-hashes``) and the build refuses a cached file that differs.
- ``dist/pyodide/pyodide-lock.json`` is Pyodide's own lock with our wheels
  merged in, so ``loadPackage("napllm")`` and ``micropip.install("napllm")``
  resolve every dependency by name, offline.
"""

from __future__ import annotations

import email.parser
import json
import re
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from buildsys import paths
from buildsys.base import BuildError, DistWriter, log, run, sha256_file

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
    # Not used by the shell: pinned for Python napplets, which may name it in
    # their `napplet-python` meta or `micropip.install` it (tables as text).
    Wheel("tabulate", "0.10.0", "f0b0622e567335c8fabaaa659f1b33bcb6ddfe2e496071b743aa113f8774f2d3"),
)

#: The Pyodide files a Python napplet's frame boots from (docs/design.md,
#: "Python napplets"); with the wheels, the only files the shell hands a frame.
NAPPLET_CORE_FILES = ("pyodide.mjs", "pyodide.asm.mjs", "pyodide.asm.wasm", "python_stdlib.zip")
#: The manifest of what the shell may hand a Python napplet's frame.
NAPPLET_MANIFEST = "pyodide/napplet-files.json"

#: Files of the npm pyodide package that the browser needs (no maps, types, consoles).
PYODIDE_FILES = (
    "pyodide.mjs",
    "pyodide.js",
    "pyodide.asm.mjs",
    "pyodide.asm.wasm",
    "python_stdlib.zip",
)


def find_cached_wheel(wheel: Wheel) -> Path | None:
    """The cached file of ``wheel`` in build/wheels/ if present with the right sha256."""
    for path in sorted(paths.WHEEL_CACHE.glob(wheel.file_prefix + "*.whl")):
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
    paths.WHEEL_CACHE.mkdir(parents=True, exist_ok=True)
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
                cmd += ["--require-hashes", "-r", str(req), "-d", str(paths.WHEEL_CACHE)]
                run(cmd)
            path = find_cached_wheel(wheel)
            if path is None:
                raise BuildError(f"{wheel.name}=={wheel.version}: no wheel with the pinned sha256")
        found[canonical_name(wheel.name)] = path
    return found


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
    src = paths.NODE_MODULES / "pyodide"
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
    write_napplet_manifest(out, lock, ours)
    return {"info": lock["info"], "packages": ours}


def write_napplet_manifest(out: DistWriter, lock: dict[str, Any], ours: dict[str, str]) -> None:
    """Write `NAPPLET_MANIFEST`: every file the shell may hand a Python napplet.

    Shape: ``{"files": {file name: sha256 hex}, "lock": pyodide-lock}``:
    the `NAPPLET_CORE_FILES` and our wheels, each with the sha256 the shell
    checks before handing it over (web/js/python-files.js), and the merged
    lock cut down to our packages (``ours``), the only ones whose wheels are
    in dist/, so a napplet's ``loadPackage`` and ``micropip.install`` know
    nothing else.
    """
    files = {name: sha256_file(out.root / "pyodide" / name) for name in NAPPLET_CORE_FILES}
    packages = {name: lock["packages"][name] for name in sorted(ours)}
    for entry in packages.values():
        files[entry["file_name"]] = entry["sha256"]
    manifest = {"files": files, "lock": {"info": lock["info"], "packages": packages}}
    out.write_bytes(NAPPLET_MANIFEST, json.dumps(manifest, separators=(",", ":")).encode())
