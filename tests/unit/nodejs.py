"""Running ES module text in node, for the parts of web/ tested from pytest."""

from __future__ import annotations

import json
import shutil
import subprocess
from typing import Any

import pytest

#: Mark for tests that need node (the suite installs it; a bare machine may not have it).
needs_node = pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")


def run_module(
    script: str, *args: str, node_options: tuple[str, ...] = (), timeout: float = 60
) -> Any:
    """Run `script` as an ES module in node with `args` as its arguments; its stdout as JSON.

    `node_options` go to node itself (e.g. `--expose-gc`). Fails the
    calling test (with node's stderr) when node exits non-zero; gives up
    after `timeout` seconds.
    """
    proc = subprocess.run(
        ["node", *node_options, "--input-type=module", "-e", script, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)
