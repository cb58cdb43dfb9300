"""Assembling dist/ from the steps, the test build dist-test/, and cleaning.

Rules
- `build` runs every step under the build lock and prunes what it no longer
  produces; ``build-info.json`` is written last (its mtime says when dist/
  was built, `dist_is_stale`).
- dist/ never holds a test hook: `build_test_dist` writes dist-test/ (hard
  links to dist/ plus the files of tests/hooks/).
"""

from __future__ import annotations

import gzip
import os
import shutil
import time
from pathlib import Path
from typing import Any

from buildsys import paths
from buildsys.base import BuildError, DistWriter, build_lock
from buildsys.bundles import bundle_js, bundle_prompt_api, write_catalogs
from buildsys.content import copy_napplets, copy_web
from buildsys.engines import engine_builds, service_worker_part, write_engine_declarations
from buildsys.installs import ensure_node_modules, npm_version
from buildsys.models import copy_models, model_sources
from buildsys.pyodide import copy_pyodide, fetch_wheels
from buildsys.service_worker import build_service_worker
from buildsys.wheel import build_napllm_wheel, napllm_sources


def write_build_info(
    out: DistWriter,
    pyodide: dict[str, Any],
    models: dict[str, list[dict[str, Any]]],
    napplets: int,
    builds: list[dict[str, Any]],
) -> dict[str, Any]:
    """Write dist/build-info.json: versions and the size of every file in dist/.

    Shape: ``{"pyodide", "python", "packages": {name: version}, "napllm",
    <library>: version for each npm package an engine's build declares
    (named without its scope: ``@wllama/wllama`` is ``wllama``), "models":
    {kind: [{path, files: {name: sha256}, bytes}]} (`copy_models`),
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
        **{
            package.rsplit("/", 1)[-1]: npm_version(package)
            for build in builds
            for package in build.get("packages", ())
        },
        "models": models,
        "napplets": napplets,
        "files": files,
        "total_bytes": sum(files.values()),
    }
    out.write_json("build-info.json", info)
    return info


def build_inputs() -> list[Path]:
    """Every source file whose change makes dist/ stale (for the test harness)."""
    files = [paths.ROOT / "build.py", *sorted(Path(__file__).parent.glob("*.py"))]
    files += [paths.ROOT / "package-lock.json", *napllm_sources()]
    try:
        builds = engine_builds()
    except BuildError:
        builds = []  # the build itself says why
    files += [p for b in builds for model in b.get("models", ()) for p in model_sources(model)]
    for folder in (paths.WEB, paths.NAPPLETS):
        if folder.is_dir():
            files += [p for p in folder.rglob("*") if p.is_file()]
    return [p for p in files if p.is_file()]


def dist_is_stale() -> bool:
    """True when dist/ is missing or older than any of its sources."""
    info = paths.DIST / "build-info.json"
    if not info.is_file():
        return True
    built = info.stat().st_mtime
    return any(p.stat().st_mtime > built for p in build_inputs())


def build(*, gzip_sizes: bool = False) -> dict[str, Any]:
    """Run every step and return the build info (see :func:`write_build_info`).

    Raises: BuildError (with the failing step's reason) on any failure.
    """
    started = time.monotonic()
    with build_lock():
        ensure_node_modules()
        wheels = fetch_wheels()
        napllm = build_napllm_wheel()
        out = DistWriter(paths.DIST)
        paths.DIST.mkdir(exist_ok=True)
        pyodide = copy_pyodide(out, [*wheels.values(), napllm])
        builds = engine_builds()
        bundle_js(out, builds)
        models = copy_models(out, builds)
        write_catalogs(out, models, builds)
        copy_web(out)
        bundle_prompt_api(out)
        napplets = copy_napplets(out)
        engines = write_engine_declarations(out)
        precache = build_service_worker(out, service_worker_part(engines))
        info = write_build_info(out, pyodide, models, len(napplets), builds)
        out.prune()
        os.utime(paths.DIST / "build-info.json")
    elapsed = time.monotonic() - started
    summary = f"dist/: {len(info['files'])} files, {info['total_bytes'] / 1e6:.1f} MB"
    summary += f", precache {precache['count']} files {precache['size'] / 1e6:.1f} MB"
    if gzip_sizes:
        packed = sum(
            len(gzip.compress((paths.DIST / rel).read_bytes(), 6)) for rel in info["files"]
        )
        summary += f" ({packed / 1e6:.1f} MB gzip)"
    print(f"{summary}, built in {elapsed:.1f} s", flush=True)
    return info


#: dist-test/ files of the shell replaced by a test hook (a file of
#: tests/hooks/), and where the product's file is kept for the hook to import
#: (None: not kept). An engine's own hooks are its build declaration's
#: ``test`` (`dist_test_hooks`).
TEST_OVERRIDES: dict[str, tuple[str, str | None]] = {
    "js/boot-runtime.js": ("boot-runtime.js", None),
    # small download ceilings, so a host that never stops is refused quickly
    "engines/limits.js": ("engine-limits.js", None),
    # a local model host and simulated devices for the model catalogue
    "catalogue/source.js": ("catalogue-source.js", "catalogue/source.product.js"),
}
#: Files only the test build has: dist-test path -> file of tests/hooks/.
TEST_ADDITIONS: dict[str, str] = {
    "testhooks/napllm_testhooks.py": "napllm_testhooks.py",
}


def dist_test_hooks(
    builds: list[dict[str, Any]],
) -> tuple[dict[str, tuple[str, str | None]], dict[str, str]]:
    """The test build's overrides and additions: the shell's and each engine's.

    Shapes as `TEST_OVERRIDES` and `TEST_ADDITIONS`; an engine's come from
    its build declaration's ``test: {replace: {path: {hook, product?}},
    add: {path: hook}}``.
    Raises: BuildError when two of them name the same dist-test/ file.
    """
    overrides, additions = dict(TEST_OVERRIDES), dict(TEST_ADDITIONS)
    for build in builds:
        test = build.get("test", {})
        for rel, hook in test.get("replace", {}).items():
            if rel in overrides:
                raise BuildError(f"two test hooks replace {rel}")
            overrides[rel] = (hook["hook"], hook.get("product"))
        for rel, name in test.get("add", {}).items():
            if rel in additions:
                raise BuildError(f"two test hooks add {rel}")
            additions[rel] = name
    return overrides, additions


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
    file under the name `dist_test_hooks` gives: :data:`TEST_OVERRIDES` and the
    engines' declared ones), the hook files are copied in, and files no
    longer produced are removed.

    Raises: BuildError when dist/ is not built, a hook file is missing or a
    build declaration is malformed.
    """
    if not (paths.DIST / "build-info.json").is_file():
        raise BuildError("dist/ is not built; run `python build.py` first")
    overrides, additions = dist_test_hooks(engine_builds())
    with build_lock():
        out = DistWriter(paths.DIST_TEST)
        paths.DIST_TEST.mkdir(exist_ok=True)
        for src in sorted(paths.DIST.rglob("*")):
            if not src.is_file():
                continue
            rel = src.relative_to(paths.DIST).as_posix()
            target = overrides[rel][1] if rel in overrides else rel
            if target is None:
                continue
            _link(src, paths.DIST_TEST / target)
            out.written.add(paths.DIST_TEST / target)
        hooks = {rel: name for rel, (name, _) in overrides.items()} | additions
        for rel, name in hooks.items():
            source = paths.TEST_HOOKS / name
            if not source.is_file():
                raise BuildError(f"test hook {name} is missing from tests/hooks/")
            out.copy(source, rel)
        out.prune()
    return paths.DIST_TEST


def clean() -> None:
    """Remove dist/, dist-test/ and the build cache build/ (node_modules/ is kept)."""
    for path in (paths.DIST, paths.DIST_TEST, paths.BUILD):
        shutil.rmtree(path, ignore_errors=True)
    print("removed dist/, dist-test/ and build/")
