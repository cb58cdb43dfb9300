"""The models dist/ ships: TinyChat as GGUF, as ONNX and compiled for WebLLM.

Rules
- Every model file is checked against its folder's ``SHA256SUMS`` before it is
  copied; a missing or differing file stops the build.
- WebLLM's record for TinyChat carries Subresource Integrity values from the
  same sums, and URLs relative to dist/.
"""

from __future__ import annotations

import base64
import re
from pathlib import Path
from typing import Any

from buildsys import paths
from buildsys.base import BuildError, DistWriter, sha256_file
from buildsys.paths import WEBLLM_MODEL_FILES


def sri_sha256(hex_digest: str) -> str:
    """A Subresource Integrity value (``sha256-<base64>``) for a hex sha256."""
    return "sha256-" + base64.b64encode(bytes.fromhex(hex_digest)).decode()


def webllm_tinychat_record(sums: dict[str, str]) -> dict[str, Any]:
    """WebLLM's ``ModelRecord`` for the bundled TinyChat, URLs relative to dist/.

    ``integrity`` (WebLLM checks it after each download: config, model
    library, tokenizer) comes from ``models/tinychat/webllm/SHA256SUMS``.
    TinyChat needs no ``shader-f16`` and only small buffers (its whole
    weights are 2 MB), so it runs on software adapters.
    """
    return {
        "model_id": "TinyChat-q0f32-MLC",
        "model": f"{paths.WEBLLM_MODEL_DEST}/",
        "model_lib": f"{paths.WEBLLM_MODEL_DEST}/tinychat-webgpu.wasm",
        "model_type": 0,
        "required_features": [],
        "vram_required_MB": 32,
        "low_resource_required": True,
        "buffer_size_required_bytes": 32 * 1024 * 1024,
        "integrity": {
            "config": sri_sha256(sums["mlc-chat-config.json"]),
            "model_lib": sri_sha256(sums["tinychat-webgpu.wasm"]),
            "tokenizer": {"tokenizer.json": sri_sha256(sums["tokenizer.json"])},
            "onFailure": "error",
        },
    }


def read_sha256sums(path: Path) -> dict[str, str]:
    """Parse a ``sha256sum`` file: ``<hex>  <name>`` (or ``<hex> *<name>``) per line."""
    sums: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        match = re.fullmatch(r"([0-9a-fA-F]{64}) [ *](.+)", line.strip())
        if match:
            sums[match.group(2)] = match.group(1).lower()
    return sums


def copy_model(out: DistWriter) -> dict[str, Any]:
    """Copy the default model to dist/models/tinychat/, checking its sha256.

    Raises: BuildError when the file is missing, unlisted in SHA256SUMS or
    does not match it.
    """
    model = paths.MODEL_DIR / paths.MODEL_FILE
    sums_file = paths.MODEL_DIR / "SHA256SUMS"
    if not model.is_file() or not sums_file.is_file():
        raise BuildError(f"{model.relative_to(paths.ROOT)} or its SHA256SUMS is missing")
    expected = read_sha256sums(sums_file).get(paths.MODEL_FILE)
    actual = sha256_file(model)
    if expected != actual:
        raise BuildError(f"{paths.MODEL_FILE}: sha256 {actual} does not match SHA256SUMS")
    out.copy(model, f"models/tinychat/{paths.MODEL_FILE}")
    size = model.stat().st_size
    return {"path": f"models/tinychat/{paths.MODEL_FILE}", "sha256": actual, "bytes": size}


def copy_onnx_model(out: DistWriter) -> dict[str, Any]:
    """Copy TinyChat's ONNX export to dist/models/tinychat-onnx/, checking SHA256SUMS.

    Every file listed in ``models/tinychat/onnx/SHA256SUMS`` is copied under
    the same relative path (transformers.js reads ``config.json``,
    ``generation_config.json``, ``tokenizer*.json`` and ``onnx/model.onnx``).
    Returns ``{path, files: {name: sha256}, bytes}``.
    Raises: BuildError when a file is missing or does not match its sum.
    """
    sums_file = paths.ONNX_MODEL_DIR / "SHA256SUMS"
    if not sums_file.is_file():
        raise BuildError(f"{sums_file.relative_to(paths.ROOT)} is missing")
    sums = read_sha256sums(sums_file)
    if "onnx/model.onnx" not in sums:
        raise BuildError("the ONNX SHA256SUMS does not list onnx/model.onnx")
    size = 0
    for name, expected in sorted(sums.items()):
        path = paths.ONNX_MODEL_DIR / name
        if not path.is_file() or sha256_file(path) != expected:
            raise BuildError(f"models/tinychat/onnx/{name} is missing or does not match SHA256SUMS")
        out.copy(path, f"{paths.ONNX_MODEL_DEST}/{name}")
        size += path.stat().st_size
    return {"path": paths.ONNX_MODEL_DEST, "files": sums, "bytes": size}


def copy_webllm_model(out: DistWriter) -> dict[str, Any]:
    """Copy TinyChat for WebLLM to dist/models/tinychat-webllm/resolve/main/, checking SHA256SUMS.

    Returns WebLLM's model record for it (:func:`webllm_tinychat_record`).
    Raises: BuildError when a file is missing, unlisted or does not match.
    """
    sums_file = paths.WEBLLM_MODEL_DIR / "SHA256SUMS"
    if not sums_file.is_file():
        raise BuildError(f"{sums_file.relative_to(paths.ROOT)} is missing")
    sums = read_sha256sums(sums_file)
    for name in WEBLLM_MODEL_FILES:
        path = paths.WEBLLM_MODEL_DIR / name
        if name not in sums or not path.is_file() or sha256_file(path) != sums[name]:
            raise BuildError(
                f"models/tinychat/webllm/{name} is missing or does not match SHA256SUMS"
            )
        out.copy(path, f"{paths.WEBLLM_MODEL_DEST}/{name}")
    return webllm_tinychat_record(sums)
