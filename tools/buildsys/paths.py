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
MODEL_DIR = ROOT / "models" / "tinychat"
MODEL_FILE = "tiny-chat-q8_0.gguf"
#: TinyChat exported to ONNX for the transformers.js engine (models/tinychat/onnx/).
ONNX_MODEL_DIR = MODEL_DIR / "onnx"
ONNX_MODEL_DEST = "models/tinychat-onnx"
#: TinyChat compiled for WebLLM (models/tinychat/webllm/). WebLLM reads a
#: model folder at `<model>/resolve/<revision>/`, its hub layout.
WEBLLM_MODEL_DIR = MODEL_DIR / "webllm"
WEBLLM_MODEL_DEST = "models/tinychat-webllm/resolve/main"
#: The files of that folder WebLLM fetches (the rest is its build kit).
WEBLLM_MODEL_FILES = (
    "mlc-chat-config.json",
    "tensor-cache.json",
    "params_shard_0.bin",
    "tokenizer.json",
    "tokenizer_config.json",
    "tinychat-webgpu.wasm",
)

#: Exact versions of every CPython package the test and service extras pull
#: in (pip constraints, made by pip-compile from pyproject.toml; the README's
#: "Set-up" section says how to update it). A fresh machine installs what CI
#: tested, not whatever is newest that day.
PYTHON_LOCK = ROOT / "requirements" / "lock.txt"
