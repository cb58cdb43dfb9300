"""The `onnx` engine's spec: transformers.js running ONNX chat models on WebGPU.

The worker (web/engines/transformers-worker.js) renders the model's own
chat template and streams OpenAI chunks, so requests and chunks go through
`chat_request` and `chat_stream` like the other engines. Pure data and
functions, tested under CPython; the one provider every engine shares is
`providers.engine.EngineProvider`, and the page module is
the engine host (web/engines/engine-host.js) around
web/engines/transformers-worker.js, one worker per model (`OnnxSpec.page`).

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
- Engine failures are kinds reported by JS, turned into fixed hints
  (`ONNX_HINTS`: the shared table, with the download and load sentences
  about ONNX model files); no engine text reaches a napplet.
- The page probes WebGPU (the host's `webgpu` report) when the shell starts, and before the
  first chat if it could not then.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from ..lmsp import LmspRequest
from ..records import Capabilities, Connection
from .chat_request import lmsp_to_chat
from .chat_stream import ChatStreamToLmsp
from .engine import (
    ENGINE_HINTS,
    WEBGPU_HOW,
    WEBGPU_NEEDS,
    SpecDefaults,
    builtin_connection,
    no_adapter_reason,
)

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

    `settings.source` (the built-in connection's; a user connection's as
    `onnx_settings` resolved it) wins; otherwise `model` is a model folder
    URL (http(s), split into the folder above it and the folder's name) or a
    hub id. Raises `ValueError` for anything else.
    """
    source = settings.get("source")
    if isinstance(source, dict):
        base, name = source.get("base"), source.get("model")
        if source.get("kind") == "path" and isinstance(base, str) and isinstance(name, str):
            return {"kind": "path", "base": base, "model": name}
        if source.get("kind") == "hub" and isinstance(name, str) and base is None:
            return onnx_source(name, {})
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


def onnx_settings(model: str, settings: Mapping[str, Any]) -> dict[str, Any]:
    """A user connection's settings with its source resolved once (`settings.source`).

    The model names the source (a form's own `source` is replaced), so the
    page reads where the engine looks ("Download for offline use", the
    storage panel) without a copy of `onnx_source`. `ValueError` as it.
    """
    rest = {key: value for key, value in settings.items() if key != "source"}
    return rest | {"source": onnx_source(model, rest)}


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
    return no_adapter_reason(probe.get("reason") if isinstance(probe, dict) else None)


def onnx_tinychat_connection(unavailable_reason: str | None = None) -> Connection:
    """The built-in "TinyChat (WebGPU, transformers.js)" connection."""
    source = {"kind": "path", "base": ONNX_TINYCHAT_BASE, "model": ONNX_TINYCHAT_MODEL}
    settings = {"source": source, "dtype": "fp32", "rank": ONNX_TINYCHAT_RANK}
    ids = (ONNX_TINYCHAT_ID, ONNX_TINYCHAT_NAME, ONNX_TINYCHAT_MODEL)
    return builtin_connection(ONNX, ids, ONNX_CAPABILITIES, settings, unavailable_reason)


def onnx_chat_body(request: LmspRequest) -> dict[str, Any]:
    """The streamed chat body the worker takes (LMSP 6.1).

    `lmsp_to_chat` with `stream: true` and usage in the last chunk. The
    worker ignores `response_format` (no grammar: the runtime validates JSON
    output) and renders `tools` into the prompt through the chat template.
    """
    body = lmsp_to_chat(request, response_format_style="json_object", stream=True)
    return body


#: User hints by error kind: the shared table, in the words of ONNX model files.
ONNX_HINTS: dict[str, str] = ENGINE_HINTS | {
    "download": "The ONNX model files could not be downloaded.",
    "load": "The ONNX model could not be loaded; it may not be a transformers.js chat model.",
}


@dataclass(frozen=True)
class OnnxDevice:
    """What the page's WebGPU probe said: `unavailable`, why models cannot run (or None)."""

    unavailable: str | None = None


#: What the page's engine host works from (`EngineSpec.page`): one worker per
#: model (a failed load ends it); WebGPU is probed without starting one.
#: For the storage panel, the build and the service worker: transformers.js
#: keeps model files of other origins in its cache `transformers-cache` (a
#: model's weights under `onnx/`, beside its config); its bundle and the
#: bundled TinyChat are kept once first used (30 MB a first visit should not
#: download); weights are verified and at most 8 GiB. "Download for offline
#: use" asks a worker for transformers.js's own list (engines/offline-onnx.js).
ONNX_PAGE: Mapping[str, Any] = {
    "kind": "onnx",
    "urlFields": ["source.base"],
    "workers": "per-model",
    "worker": "engines/transformers-worker.js",
    "report": "webgpu",
    "offline": "engines/offline-onnx.js",
    "caches": {"transformers-cache": {"label": "transformers.js", "trim": "onnx/"}},
    "lazy": ["vendor/transformers/", "models/tinychat-onnx/"],
    "weights": [
        {"suffix": ".onnx", "limit": 8 * 1024**3},
        {"suffix": ".onnx_data", "limit": 8 * 1024**3},
    ],
}

#: onnxruntime-web's wasm build that transformers.js loads for WebGPU and WASM
#: (copied next to its bundle; the library's default would be a CDN).
ORT_WASM_FILES = ("ort-wasm-simd-threaded.asyncify.mjs", "ort-wasm-simd-threaded.asyncify.wasm")

#: What the build makes of it (`EngineSpec.build`): transformers.js bundled
#: with onnxruntime-web's wasm build beside it, and TinyChat's ONNX export
#: (`models/tinychat/onnx/`, transformers.js' layout) checked against its
#: SHA256SUMS.
ONNX_BUILD: Mapping[str, Any] = {
    "bundles": [{"entry": "transformers.js", "output": "vendor/transformers/transformers.js"}],
    "packages": ["@huggingface/transformers", "onnxruntime-web"],
    "vendor": [
        {"from": f"onnxruntime-web/dist/{name}", "to": f"vendor/transformers/{name}"}
        for name in ORT_WASM_FILES
    ],
    "models": [
        {
            "source": "tinychat/onnx",
            "dest": f"{ONNX_TINYCHAT_BASE}{ONNX_TINYCHAT_MODEL}",
            "files": [
                "config.json",
                "generation_config.json",
                "tokenizer.json",
                "tokenizer_config.json",
                "onnx/model.onnx",
            ],
        }
    ],
}


class OnnxSpec(SpecDefaults):
    """The `onnx` engine (`providers.engine.EngineSpec`; module rules)."""

    kind = "onnx"
    form: Mapping[str, Any] = {
        "label": "ONNX model in this browser (WebGPU)",
        "summary": "Runs an ONNX model with transformers.js inside this page on the GPU.",
        "model_hint": "A Hugging Face model id (owner/name) or the URL of an ONNX model folder.",
        "needs": WEBGPU_NEEDS,
        "needs_how": WEBGPU_HOW,
    }
    route = "This browser (WebGPU, transformers.js) on this device"
    page = ONNX_PAGE
    build = ONNX_BUILD
    report_at_start = True
    hints: Mapping[str, str] = ONNX_HINTS

    def read_device(self, report: object) -> OnnxDevice:
        """`webgpu_unavailable_reason` of the probe."""
        return OnnxDevice(webgpu_unavailable_reason(report))

    def built_in(self, device: OnnxDevice | None) -> list[Connection]:
        """TinyChat (WebGPU), unavailable with the reason where WebGPU is absent."""
        return [onnx_tinychat_connection(device.unavailable if device else None)]

    def capabilities(
        self, model: str, settings: Mapping[str, Any], device: OnnxDevice | None
    ) -> Capabilities:
        """`onnx_capabilities`; `ValueError` without a usable source."""
        return onnx_capabilities(model, settings)

    def settings_for(self, model: str, settings: Mapping[str, Any]) -> dict[str, Any]:
        """`onnx_settings`: the source resolved once, for the page too."""
        return onnx_settings(model, settings)

    def unavailable_reason(self, model: str, device: OnnxDevice | None) -> str | None:
        """Why ONNX models cannot run on this device (None before the probe)."""
        return device.unavailable if device else None

    def blocker(self, model: str, device: OnnxDevice | None) -> str | None:
        """`webgpu` when the probe found no adapter."""
        return "webgpu" if device and device.unavailable is not None else None

    def load_call(
        self, connection: Connection, device: OnnxDevice | None
    ) -> tuple[str, dict[str, Any]]:
        """Key `[source, "webgpu", dtype]` (JSON); load fields `source`,
        `device` and `dtype` (transformers-worker.js). `ValueError` without a source."""
        source = onnx_source(connection.model, connection.settings)
        dtype = onnx_dtype(connection.settings)
        key = json.dumps([source, "webgpu", dtype], sort_keys=True)
        return key, {"source": source, "device": "webgpu", "dtype": dtype}

    def chat_body(self, request: LmspRequest) -> dict[str, Any]:
        """`onnx_chat_body`."""
        return onnx_chat_body(request)

    def chunk_mapping(self, request: LmspRequest, body: Mapping[str, Any]) -> ChatStreamToLmsp:
        """Hermes `<tool_call>` blocks in the text become calls when tools were sent."""
        return ChatStreamToLmsp(parse_tool_call_blocks=bool(request.tools))


ONNX = OnnxSpec()
