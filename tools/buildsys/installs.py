"""Set-up: the npm packages (``npm ci``) and what the test suite needs.

Rules
- npm packages come from the committed ``package-lock.json`` only, without
  install scripts; CPython packages from ``requirements/lock.txt`` (pip
  constraints), so a fresh machine gets what CI tested.
- Each install is skipped when what it installs is already there.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from buildsys import paths
from buildsys.base import BuildError, log, run, sha256_file, stamp_matches, write_stamp
from buildsys.paths import PYTHON_LOCK
from napllm.devtools.headless import CHROMIUM


def ensure_node_modules() -> None:
    """Install the npm packages from the committed lock (``npm ci``) when needed.

    Skipped when ``node_modules/`` was installed from the same
    ``package-lock.json`` (digest kept in ``build/stamps/npm``). Install
    scripts are not run: none of our packages needs one (esbuild finds its
    binary through its optional platform package).
    """
    lock = paths.ROOT / "package-lock.json"
    if not lock.is_file():
        raise BuildError("package-lock.json is missing; run `npm install` once and commit it")
    digest = sha256_file(lock)
    if stamp_matches("npm", digest) and (paths.NODE_MODULES / ".package-lock.json").is_file():
        return
    if shutil.which("npm") is None:
        raise BuildError("npm is not installed (Node 20 or newer is required)")
    log("npm ci (from package-lock.json)")
    run(["npm", "ci", "--no-audit", "--no-fund", "--ignore-scripts"])
    write_stamp("npm", digest)


def npm_version(package: str) -> str:
    """The installed version of an npm package (from its package.json)."""
    meta = json.loads((paths.NODE_MODULES / package / "package.json").read_text(encoding="utf-8"))
    return str(meta["version"])


def ensure_test_dependencies() -> None:
    """Install what the test suite needs, skipping what is already there.

    Debian's ``chromium`` (``apt-get``, as root), the project with its test and
    service extras (``pip install -e``, constrained to the exact versions of
    ``requirements/lock.txt``), which compiles ``llama-cpp-python`` only
    when the locked version is missing (minutes on a fresh machine).
    """
    if not Path(CHROMIUM).exists():
        if os.geteuid() != 0:
            raise BuildError("Debian's chromium is missing; install it: apt-get install chromium")
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
        subprocess.run(["apt-get", "install", "-y", "-qq", "chromium"], check=True, env=env)
    pip = [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    if importlib.util.find_spec("llama_cpp") is None:
        log("installing llama-cpp-python (it compiles llama.cpp: about five minutes)")
    run([*pip, "-c", str(PYTHON_LOCK), "-e", ".[test,service,cpython]"])
