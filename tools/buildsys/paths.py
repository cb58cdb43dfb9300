"""The folders and files the build reads and writes (ROOT is the repository).

Steps read these through the module (``paths.DIST``) at call time, so a test
can point one at a temporary folder.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
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
#: The models' folders (each engine's build declaration names its own).
MODELS = ROOT / "models"

#: Exact versions of every CPython package the test and service extras pull
#: in (pip constraints, made by pip-compile from pyproject.toml; the README's
#: "Set-up" section says how to update it). A fresh machine installs what CI
#: tested, not whatever is newest that day.
PYTHON_LOCK = ROOT / "requirements" / "lock.txt"
