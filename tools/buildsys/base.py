"""The build's shared parts: its error, progress lines, commands, stamps, the dist/ writer.

Rules
- A failing step raises `BuildError` with the step and the reason; nothing else
  escapes a step.
- A set-up step records the digest of its inputs in ``build/stamps/<name>``
  and is skipped while the digest matches (`stamp_matches`, `write_stamp`).
- Files reach dist/ only through `DistWriter`: written when they differ, and
  everything the build did not write is pruned at the end.
- Builds run one at a time (`build_lock`, an exclusive lock on build/.lock).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from buildsys import paths


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


def run(cmd: list[str], cwd: Path = paths.ROOT) -> None:
    """Run a command, raising BuildError with its output when it fails."""
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr)[-4000:]
        raise BuildError(f"command failed ({proc.returncode}): {' '.join(cmd)}\n{tail}")


def stamp_matches(name: str, value: str) -> bool:
    """True when the stamp file ``build/stamps/<name>`` holds ``value``."""
    path = paths.STAMPS / name
    return path.is_file() and path.read_text(encoding="utf-8") == value


def write_stamp(name: str, value: str) -> None:
    """Record ``value`` as the input digest of a finished set-up step."""
    paths.STAMPS.mkdir(parents=True, exist_ok=True)
    (paths.STAMPS / name).write_text(value, encoding="utf-8")


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

    def prune(self, keep: frozenset[Path] = frozenset()) -> int:
        """Delete files of dist/ not written by this build (nor in `keep`), then empty folders."""
        removed = 0
        for path in sorted(self.root.rglob("*"), reverse=True):
            if path.is_file() or path.is_symlink():
                if path not in self.written and path not in keep:
                    path.unlink()
                    removed += 1
            elif path.is_dir() and not any(path.iterdir()):
                path.rmdir()
        return removed


@contextlib.contextmanager
def build_lock() -> Iterator[None]:
    """Hold an exclusive lock on build/.lock so concurrent builds run one at a time."""
    paths.BUILD.mkdir(parents=True, exist_ok=True)
    with (paths.BUILD / ".lock").open("w", encoding="utf-8") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
