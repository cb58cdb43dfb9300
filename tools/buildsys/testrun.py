"""``build.py test``: set up, build dist/, run the whole pytest suite."""

from __future__ import annotations

import subprocess
import sys

from buildsys import paths
from buildsys.base import log
from buildsys.dist import build
from buildsys.installs import ensure_test_dependencies


def run_tests(pytest_args: list[str]) -> int:
    """Set up, build dist/, run pytest; "no tests collected" counts as a failure."""
    ensure_test_dependencies()
    build()
    command = [sys.executable, "-m", "pytest", *pytest_args]
    log("running " + " ".join(command[1:]))
    status = subprocess.call(command, cwd=paths.ROOT)
    if status == 5:
        print("pytest collected no tests: treating this as a failure", file=sys.stderr)
        return 1
    return status
