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
from buildsys.bundles import bundle_js, bundle_prompt_api, write_webllm_catalog
from buildsys.content import copy_napplets, copy_web
from buildsys.engines import service_worker_part, write_engine_declarations
from buildsys.installs import ensure_node_modules, npm_version
from buildsys.models import copy_model, copy_onnx_model, copy_webllm_model
from buildsys.pyodide import copy_pyodide, fetch_wheels
from buildsys.service_worker import build_service_worker
from buildsys.wheel import build_napllm_wheel, napllm_sources


def write_build_info(
    out: DistWriter, pyodide: dict[str, Any], model: dict[str, Any], napplets: int
) -> dict[str, Any]:
    """Write dist/build-info.json: versions and the size of every file in dist/.

    Shape: ``{"pyodide", "python", "packages": {name: version}, "napllm",
    "wllama", "web-llm", "transformers", "onnxruntime-web", "model":
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
        "model": model,
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
    files += [paths.MODEL_DIR / paths.MODEL_FILE, paths.MODEL_DIR / "SHA256SUMS"]
    files += [p for p in paths.ONNX_MODEL_DIR.rglob("*") if p.is_file() and p.suffix != ".py"]
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
        bundle_js(out)
        write_webllm_catalog(out, [copy_webllm_model(out)])
        copy_web(out)
        bundle_prompt_api(out)
        napplets = copy_napplets(out)
        model = copy_model(out)
        copy_onnx_model(out)
        engines = write_engine_declarations(out)
        precache = build_service_worker(out, service_worker_part(engines))
        info = write_build_info(out, pyodide, model, len(napplets))
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


#: dist-test/ files replaced by a test hook (a file of tests/hooks/), and where
#: the product's file is kept for the hook to import (None: not kept).
TEST_OVERRIDES: dict[str, tuple[str, str | None]] = {
    "js/boot-runtime.js": ("boot-runtime.js", None),
    "engines/webllm-engine.js": ("webllm-engine.js", "engines/webllm-engine.product.js"),
    "vendor/web-llm/web-llm.js": ("web-llm.js", "vendor/web-llm/web-llm.product.js"),
    # small download ceilings, so a host that never stops is refused quickly
    "engines/limits.js": ("engine-limits.js", None),
    # a local model host and simulated devices for the model catalogue
    "catalogue/source.js": ("catalogue-source.js", "catalogue/source.product.js"),
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
    if not (paths.DIST / "build-info.json").is_file():
        raise BuildError("dist/ is not built; run `python build.py` first")
    with build_lock():
        out = DistWriter(paths.DIST_TEST)
        paths.DIST_TEST.mkdir(exist_ok=True)
        for src in sorted(paths.DIST.rglob("*")):
            if not src.is_file():
                continue
            rel = src.relative_to(paths.DIST).as_posix()
            target = TEST_OVERRIDES[rel][1] if rel in TEST_OVERRIDES else rel
            if target is None:
                continue
            _link(src, paths.DIST_TEST / target)
            out.written.add(paths.DIST_TEST / target)
        hooks = {rel: name for rel, (name, _) in TEST_OVERRIDES.items()} | TEST_ADDITIONS
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
