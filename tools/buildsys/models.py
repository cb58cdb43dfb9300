"""The models dist/ ships: each engine's built-in model, as its spec declares.

Rules
- A model is a folder of models/ named by an engine's build declaration
  (`buildsys.engines.engine_builds`: ``models: [{source, dest, files}]``);
  its declared files go to ``dist/<dest>/`` under the same relative paths.
- Every model file is checked against its folder's ``SHA256SUMS`` before it is
  copied; a missing, unlisted or differing file stops the build.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from buildsys import paths
from buildsys.base import BuildError, DistWriter, sha256_file
from buildsys.engines import engine_builds


def read_sha256sums(path: Path) -> dict[str, str]:
    """Parse a ``sha256sum`` file: ``<hex>  <name>`` (or ``<hex> *<name>``) per line."""
    sums: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        match = re.fullmatch(r"([0-9a-fA-F]{64}) [ *](.+)", line.strip())
        if match:
            sums[match.group(2)] = match.group(1).lower()
    return sums


def model_sources(model: Mapping[str, Any]) -> list[Path]:
    """A declared model's files in models/ and its ``SHA256SUMS`` (existing or not)."""
    folder = paths.MODELS / model["source"]
    return [folder / "SHA256SUMS", *(folder / name for name in model["files"])]


def copy_model_folder(out: DistWriter, model: Mapping[str, Any]) -> dict[str, Any]:
    """Copy one declared model (``{source, dest, files}``) to ``dist/<dest>/``, checked.

    Returns ``{path: dest, files: {name: sha256}, bytes}``.
    Raises: BuildError when SHA256SUMS or a file is missing, or a file is
    unlisted in SHA256SUMS or does not match it.
    """
    folder = paths.MODELS / model["source"]
    sums_file = folder / "SHA256SUMS"
    if not sums_file.is_file():
        raise BuildError(f"{sums_file.relative_to(paths.ROOT)} is missing")
    sums = read_sha256sums(sums_file)
    size = 0
    for name in model["files"]:
        path = folder / name
        if name not in sums or not path.is_file() or sha256_file(path) != sums[name]:
            raise BuildError(
                f"{path.relative_to(paths.ROOT)} is missing or does not match SHA256SUMS"
            )
        out.copy(path, f"{model['dest']}/{name}")
        size += path.stat().st_size
    files = {name: sums[name] for name in model["files"]}
    return {"path": model["dest"], "files": files, "bytes": size}


def copy_models(
    out: DistWriter, builds: list[dict[str, Any]] | None = None
) -> dict[str, list[dict[str, Any]]]:
    """Copy every engine's declared models (`copy_model_folder`); by kind, in order.

    ``builds``: the build declarations (default: every engine's, `engine_builds`).
    Raises: BuildError as `copy_model_folder` does.
    """
    builds = engine_builds() if builds is None else builds
    return {
        build["kind"]: [copy_model_folder(out, model) for model in build.get("models", ())]
        for build in builds
    }
