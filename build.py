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
  ``Cache-Control: no-cache`` (always revalidate); the server is
  ``napllm.devtools.headless``'s, the one the tests, the benchmarks and
  ``napllm-check`` use.
- This file is the command line only; each step is a module of
  ``tools/buildsys/`` (its ``__init__`` lists them, ``paths`` names every folder).

Layout of ``dist/`` (the contract for the host page and the tests)::

    index.html, *.js, *.css, ...      web/ (without web/vendor-entry/)
    pyodide/                          Pyodide runtime + our wheels + merged lock
    pyodide/napplet-files.json        what Python napplets are handed: files + sha256, their lock
    vendor/wllama/wllama.js           @wllama/wllama ESM bundle (exports wasmPaths)
    vendor/wllama/wllama.wasm
    vendor/web-llm/web-llm.js         @mlc-ai/web-llm ESM bundle
    vendor/transformers/transformers.js  @huggingface/transformers ESM bundle (exports wasmPaths)
    vendor/transformers/ort-wasm-simd-threaded.asyncify.{mjs,wasm}  onnxruntime-web's wasm
    napplets/<name>/index.html        example napplets
    napplets/index.json               [{"name", "title", "description", "icon", "path"}]
    models/tinychat/tiny-chat-q8_0.gguf
    models/tinychat-onnx/             TinyChat as ONNX (config, tokenizer, onnx/model.onnx)
    models/tinychat-webllm/resolve/main/  TinyChat for WebLLM (weights, config, tokenizer, .wasm)
    build-info.json                   versions and file sizes

``python build.py build --with-test-hooks`` also writes ``dist-test/``, the
test build the browser tests use: every file of ``dist/`` (hard links, so
it takes a moment) with the test hooks of ``tests/hooks/`` added (see
``buildsys.dist.TEST_OVERRIDES``). ``dist/`` itself never contains a test hook.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
# The steps live in tools/buildsys/; it puts runtime/ on sys.path for
# napllm.devtools.headless (standard library only, usable before any install).
if str(ROOT / "tools") not in sys.path:
    sys.path.insert(0, str(ROOT / "tools"))

from buildsys import paths  # noqa: E402
from buildsys.base import BuildError  # noqa: E402
from buildsys.dist import build, build_test_dist, clean, dist_is_stale  # noqa: E402
from buildsys.serve import serve  # noqa: E402
from buildsys.testrun import run_tests  # noqa: E402

#: What the test harness, the benchmarks and tools/screenshots.py read from here.
DIST = paths.DIST
DIST_TEST = paths.DIST_TEST
NODE_MODULES = paths.NODE_MODULES

__all__ = [
    "DIST",
    "DIST_TEST",
    "NODE_MODULES",
    "ROOT",
    "BuildError",
    "build",
    "build_test_dist",
    "clean",
    "dist_is_stale",
    "main",
    "paths",
    "run_tests",
    "serve",
]


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
