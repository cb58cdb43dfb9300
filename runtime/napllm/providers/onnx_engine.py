"""The `onnx` engine (transformers.js running ONNX chat models on WebGPU):
the protocol side that needs no JavaScript.

The engine speaks OpenAI chat completions (web/engines/transformers-worker.js
renders the model's own chat template and streams OpenAI chunks), so
requests and chunks go through `chat_request` and `chat_stream` like the other in-browser
engines; this module holds what is specific to it, as data and pure
functions tested under CPython. The JS bridge is `napllm.browser.onnx_engine`.

Rules
- Connection kind "ONNX model in this browser (WebGPU)". The built-in
  connection is TinyChat exported to ONNX (`models/tinychat/onnx/`, shipped
  in `dist/models/tinychat-onnx/`): `builtin-tinychat-webgpu`, model
  `tinychat-onnx`, read from the shell's own folder with remote models off.
  It ranks after the llama.cpp TinyChat (same answers, and that one needs no
  GPU).
- A user adds any transformers.js-compatible ONNX chat model by the URL of
  its folder (http(s); the folder holding `config.json`, `tokenizer.json`,
  `onnx/model.onnx`) or by Hugging Face hub id (`owner/name`), used when
  online.
- It runs only where WebGPU gives an adapter. Without one every `onnx`
  connection is listed as unavailable, with the reason (no WASM fallback:
  the llama.cpp engine is the CPU path, and TinyChat is there already).
- Capabilities: JSON output (the runtime validates the text; no grammar),
  tools through the model's chat template with the modes `auto` and `none`
  (Hermes `<tool_call>` blocks in the text become tool calls, parsed by
  `chat_stream.ChatStreamToLmsp` as for the wasm engine), no images.
- Temperature 0 (or none) is greedy decoding in the worker.
- Engine failures are kinds reported by JS, turned into fixed hints here;
  no engine text reaches a napplet.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from ..errors import ErrorCode, ProviderFailure
from ..kinds import route_for
from ..lmsp import LmspRequest
from ..records import Capabilities, Connection
from .chat_request import lmsp_to_chat
from .engines import NO_ADAPTER_REASONS, NO_WEBGPU

ONNX_TINYCHAT_ID = "builtin-tinychat-webgpu"
ONNX_TINYCHAT_NAME = "TinyChat (WebGPU, transformers.js)"
ONNX_TINYCHAT_MODEL = "tinychat-onnx"
#: Folder (relative to the shell page) holding the model folder `tinychat-onnx/`.
ONNX_TINYCHAT_BASE = "models/"
#: After the llama.cpp TinyChat (10), before models still to fetch (50).
ONNX_TINYCHAT_RANK = 20

ONNX_CAPABILITIES = Capabilities(
    images=False, json_output=True, tools=True, tool_choice_modes=("auto", "none")
)

#: A Hugging Face hub id: `name` or `owner/name`.
HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}(/[A-Za-z0-9][A-Za-z0-9._-]{0,95})?")
#: transformers.js dtypes a user may pick (`settings.dtype`); absent: the model's default.
DTYPES = frozenset({"fp32", "fp16", "q8", "int8", "uint8", "q4", "bnb4", "q4f16"})


def onnx_source(model: str, settings: Mapping[str, Any]) -> dict[str, str]:
    """Where the worker reads the model: `{"kind": "path", "base", "model"}`
    or `{"kind": "hub", "model"}`.

    `settings.source` (set for the built-in connection) wins; otherwise
    `model` is a model folder URL (http(s), split into the folder above it
    and the folder's name) or a hub id. Raises `ValueError` for anything else.
    """
    source = settings.get("source")
    if isinstance(source, dict):
        base, name = source.get("base"), source.get("model")
        if source.get("kind") == "path" and isinstance(base, str) and isinstance(name, str):
            return {"kind": "path", "base": base, "model": name}
        raise ValueError("malformed ONNX model source")
    text = model.strip()
    if text.startswith(("http://", "https://")):
        parts = urlsplit(text)
        path = parts.path.rstrip("/")
        parent, _, name = path.rpartition("/")
        if not parts.netloc or not name or parts.query or parts.fragment:
            raise ValueError("the model URL must name a model folder")
        return {"kind": "path", "base": f"{parts.scheme}://{parts.netloc}{parent}/", "model": name}
    if "://" in text or not HUB_ID.fullmatch(text) or ".." in text:
        raise ValueError("expected a Hugging Face model id (owner/name) or an http(s) folder URL")
    return {"kind": "hub", "model": text}


def onnx_dtype(settings: Mapping[str, Any]) -> str:
    """The transformers.js dtype of a connection ('' for the model's default)."""
    dtype = settings.get("dtype")
    return dtype if isinstance(dtype, str) and dtype in DTYPES else ""


def onnx_capabilities(model: str, settings: Mapping[str, Any]) -> Capabilities:
    """Capabilities of an ONNX chat model; `ValueError` when `model` names no source."""
    onnx_source(model, settings)
    return ONNX_CAPABILITIES


def webgpu_unavailable_reason(probe: object) -> str | None:
    """Why the engine cannot run here, from the JS probe's JSON, or `None`.

    `probe`: `{"webgpu": bool, "reason"?: "no-webgpu"|"no-adapter"|"timeout"}`;
    anything malformed reads as "no adapter".
    """
    if isinstance(probe, dict) and probe.get("webgpu") is True:
        return None
    code = probe.get("reason") if isinstance(probe, dict) else None
    return NO_ADAPTER_REASONS.get(code, NO_WEBGPU) if isinstance(code, str) else NO_WEBGPU


def onnx_tinychat_connection(unavailable_reason: str | None = None) -> Connection:
    """The built-in "TinyChat (WebGPU, transformers.js)" connection."""
    return Connection(
        id=ONNX_TINYCHAT_ID,
        name=ONNX_TINYCHAT_NAME,
        kind="onnx",
        model=ONNX_TINYCHAT_MODEL,
        route=route_for("onnx", {}),
        capabilities=ONNX_CAPABILITIES,
        settings={
            "source": {"kind": "path", "base": ONNX_TINYCHAT_BASE, "model": ONNX_TINYCHAT_MODEL},
            "dtype": "fp32",
            "builtin": True,
            "rank": ONNX_TINYCHAT_RANK,
        },
        available=unavailable_reason is None,
        unavailable_reason=unavailable_reason,
    )


def onnx_chat_body(request: LmspRequest) -> dict[str, Any]:
    """The streamed chat body the worker takes (LMSP 6.1).

    `lmsp_to_chat` with `stream: true` and usage in the last chunk. The
    worker ignores `response_format` (no grammar: the runtime validates JSON
    output) and renders `tools` into the prompt through the chat template.
    """
    body = lmsp_to_chat(request, response_format_style="json_object")
    body["stream"] = True
    body["stream_options"] = {"include_usage": True}
    return body


#: User hints for the shell UI, by error kind (never sent to a napplet).
ONNX_HINTS: dict[str, str] = {
    "download": "The ONNX model files could not be downloaded.",
    "load": "The ONNX model could not be loaded; it may not be a transformers.js chat model.",
    "webgpu": "WebGPU is not available in this browser, so this model cannot run here.",
    "context": "The conversation is longer than the model's context window.",
    "inference": "The model failed while generating.",
    "unknown": "The in-browser engine failed.",
}


def onnx_failure(kind: object) -> ProviderFailure:
    """A `ProviderFailure` for an engine error `kind` (see `ONNX_HINTS`).

    `context` is `quota-exceeded`; every other kind is `provider-error`.
    """
    key = kind if isinstance(kind, str) and kind in ONNX_HINTS else "unknown"
    code = ErrorCode.QUOTA_EXCEEDED if key == "context" else ErrorCode.PROVIDER_ERROR
    return ProviderFailure(code, user_hint=ONNX_HINTS[key], detail=f"onnx: {key}")
