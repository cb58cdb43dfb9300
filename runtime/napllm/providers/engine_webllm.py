"""The `webllm` engine's spec: WebLLM's prebuilt models on WebGPU.

Pure data and functions, tested under CPython; the one provider every
engine shares is `providers.engine.EngineProvider`, and the page side is
the engine host (web/engines/engine-host.js) with WebLLM's adapter,
web/engines/webllm-engine.js (its worker: webllm-worker.js).

Rules (webllm)
- Model records are WebLLM's `prebuiltAppConfig.model_list` entries
  (`ModelRecord`: `model_id`, `vram_required_MB`, `required_features`,
  `model_type` 0 LLM / 1 embedding / 2 VLM, `low_resource_required`,
  `buffer_size_required_bytes`). Embedding models are never connections.
- A model is available on a device when WebGPU gives an adapter, the
  adapter has every `required_features` entry (`shader-f16`), its storage
  buffer limits cover `buffer_size_required_bytes` (WebLLM's default 256 MB
  when absent), and `vram_required_MB` fits the device memory the browser
  reports (`navigator.deviceMemory`, when known). Otherwise the connection
  is listed with `available: false` and the reason.
- Capabilities per model: JSON for every chat model (WebLLM's grammar
  engine), tools only for WebLLM's `functionCallingModelIds` (modes `auto`
  and `none`; for `none` the tools are not sent at all, since WebLLM
  ignores `tool_choice`), images only for VLMs.
- Only a handful of recommended small models are listed by default (one
  variant each: f16 where the adapter has `shader-f16`, else f32); any other
  prebuilt id can be added through the connection form (kind `webllm`).
- WebLLM streams a tool call's raw JSON as content and reports the calls in
  the last chunk only (docs/design.md, "Known behaviours"): such streams are
  mapped with `tool_text_in_content`.
- The page reports the GPU, WebLLM's catalogue, its function-calling ids
  and which recommended models are cached (the adapter's `report()`) when the shell
  starts; until then every model is blocked as `webgpu`.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..lmsp import LmspRequest
from ..records import Capabilities, Connection
from .chat_request import lmsp_to_chat
from .chat_stream import ChatStreamToLmsp
from .engine import (
    ENGINE_HINTS,
    NO_WEBGPU,
    WEBGPU_HOW,
    WEBGPU_NEEDS,
    SpecDefaults,
    no_adapter_reason,
)

#: User hints by error kind: the shared table, in WebLLM's words.
WEBLLM_HINTS: dict[str, str] = ENGINE_HINTS | {
    "network": (
        "The model could not be fetched; a WebLLM model needs its model host "
        "(or weights already in the browser cache)."
    ),
    "feature": "This GPU lacks a WebGPU feature the model needs (shader-f16).",
}

#: The route of every WebLLM connection (`EngineSpec.route`).
WEBLLM_ROUTE = "This browser (WebGPU, WebLLM) on this device"

#: WebLLM's default `buffer_size_required_bytes` (src/config.ts), 256 MB.
WEBLLM_DEFAULT_BUFFER_BYTES = 262_144_000

#: Recommended prebuilt models, smallest first: (base id without the
#: quantisation suffix, why it is listed). The variant is picked per device.
WEBLLM_RECOMMENDED: tuple[tuple[str, str], ...] = (
    ("SmolLM2-360M-Instruct", "small and fast"),
    ("Qwen2.5-0.5B-Instruct", "small, multilingual"),
    ("Llama-3.2-1B-Instruct", "good quality for its size"),
    ("Hermes-3-Llama-3.1-8B", "tool calling"),
    ("Phi-3.5-vision-instruct", "image input"),
)


@dataclass(frozen=True)
class WebLLMRecord:
    """The fields of WebLLM's `ModelRecord` that decide availability and capabilities."""

    model_id: str
    vram_required_mb: float | None = None
    required_features: tuple[str, ...] = ()
    model_type: int = 0  # 0 LLM, 1 embedding, 2 VLM
    low_resource_required: bool = False
    buffer_size_required_bytes: int | None = None

    @classmethod
    def from_json(cls, raw: object) -> WebLLMRecord | None:
        """Parse one record; `None` for anything that is not a usable record."""
        if not isinstance(raw, dict):
            return None
        model_id = raw.get("model_id")
        if not isinstance(model_id, str) or not model_id:
            return None
        vram = raw.get("vram_required_MB")
        features = raw.get("required_features")
        model_type = raw.get("model_type")
        buffer = raw.get("buffer_size_required_bytes")
        return cls(
            model_id=model_id,
            vram_required_mb=float(vram)
            if isinstance(vram, int | float) and not isinstance(vram, bool)
            else None,
            required_features=tuple(f for f in features if isinstance(f, str))
            if isinstance(features, list)
            else (),
            model_type=model_type
            if isinstance(model_type, int) and not isinstance(model_type, bool)
            else 0,
            low_resource_required=raw.get("low_resource_required") is True,
            buffer_size_required_bytes=buffer
            if isinstance(buffer, int) and not isinstance(buffer, bool)
            else None,
        )

    @property
    def is_chat(self) -> bool:
        """LLMs and VLMs chat; embedding models do not."""
        return self.model_type in (0, 2)


@dataclass(frozen=True)
class GpuReport:
    """What the page learnt about WebGPU (see web/engines/webllm-engine.js `report`).

    `adapter`: an adapter was granted; `reason`: why not (a sentence from
    `engine.NO_ADAPTER_REASONS`, chosen by the probe's reason code);
    `features`: adapter features; `max_buffer_size` and
    `max_storage_buffer_binding_size`: adapter limits in bytes;
    `fallback`: a software adapter (SwiftShader); `device_memory_gb`:
    `navigator.deviceMemory` when the browser reports it.
    """

    adapter: bool = False
    reason: str | None = None
    features: frozenset[str] = field(default_factory=frozenset)
    max_buffer_size: int = 0
    max_storage_buffer_binding_size: int = 0
    fallback: bool = False
    device_memory_gb: float | None = None

    @classmethod
    def from_json(cls, raw: object) -> GpuReport:
        """Parse the probe's JSON; anything malformed reads as "no adapter"."""
        if not isinstance(raw, dict) or raw.get("adapter") is not True:
            code = raw.get("reason") if isinstance(raw, dict) else None
            return cls(adapter=False, reason=no_adapter_reason(code))

        def count(key: str) -> int:
            value = raw.get(key)
            if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
                return int(value)
            return 0

        features = raw.get("features")
        memory = raw.get("deviceMemory")
        return cls(
            adapter=True,
            features=frozenset(f for f in features if isinstance(f, str))
            if isinstance(features, list)
            else frozenset(),
            max_buffer_size=count("maxBufferSize"),
            max_storage_buffer_binding_size=count("maxStorageBufferBindingSize"),
            fallback=raw.get("fallback") is True,
            device_memory_gb=float(memory)
            if isinstance(memory, int | float) and not isinstance(memory, bool) and memory > 0
            else None,
        )


def webllm_unavailable_reason(record: WebLLMRecord, gpu: GpuReport) -> str | None:
    """Why `record` cannot run on `gpu` (a user-facing sentence), or `None` if it can."""
    if not gpu.adapter:
        return gpu.reason or NO_WEBGPU
    if not record.is_chat:
        return "This is an embedding model, not a chat model."
    missing = [f for f in record.required_features if f not in gpu.features]
    if missing:
        return f"The GPU lacks the WebGPU feature {', '.join(sorted(missing))} this model needs."
    need = record.buffer_size_required_bytes or WEBLLM_DEFAULT_BUFFER_BYTES
    limit = min(gpu.max_buffer_size, gpu.max_storage_buffer_binding_size)
    if limit < need:
        return (
            f"The GPU's buffer limit ({limit // 2**20} MB) is below the "
            f"{need // 2**20} MB this model needs."
        )
    if (
        record.vram_required_mb is not None
        and gpu.device_memory_gb is not None
        and record.vram_required_mb > gpu.device_memory_gb * 1024
    ):
        return (
            f"This model needs about {round(record.vram_required_mb)} MB of memory; "
            f"this device reports {gpu.device_memory_gb:g} GB."
        )
    return None


def webllm_blocker(record: WebLLMRecord | None, gpu: GpuReport) -> str | None:
    """The engine error kind that stops `record` on `gpu` before any download.

    `webgpu` without an adapter, `feature` for a missing WebGPU feature,
    `device` when buffers or memory fall short, `None` when it may run. An
    id without a record (not in WebLLM's catalogue) is judged by the adapter
    alone.
    """
    if not gpu.adapter:
        return "webgpu"
    if record is None or webllm_unavailable_reason(record, gpu) is None:
        return None
    if any(f not in gpu.features for f in record.required_features):
        return "feature"
    return "device"


def webllm_capabilities(record: WebLLMRecord, function_calling_ids: Iterable[str]) -> Capabilities:
    """Capabilities of one WebLLM model (module rules)."""
    tools = record.model_id in set(function_calling_ids)
    return Capabilities(
        images=record.model_type == 2,
        json_output=record.is_chat,
        tools=tools,
        tool_choice_modes=("auto", "none") if tools else (),
    )


def _variant(base: str, f16: bool) -> tuple[str, ...]:
    order = ("q4f16_1", "q4f32_1") if f16 else ("q4f32_1", "q4f16_1")
    return tuple(f"{base}-{quant}-MLC" for quant in order)


def webllm_recommended(records: Iterable[WebLLMRecord], gpu: GpuReport) -> list[WebLLMRecord]:
    """One record per recommended model: f16 when the adapter has `shader-f16`, else f32.

    Models missing from `records` are left out.
    """
    by_id = {r.model_id: r for r in records}
    f16 = "shader-f16" in gpu.features
    chosen: list[WebLLMRecord] = []
    for base, _why in WEBLLM_RECOMMENDED:
        for candidate in _variant(base, f16):
            if candidate in by_id:
                chosen.append(by_id[candidate])
                break
    return chosen


def webllm_connection(
    record: WebLLMRecord,
    gpu: GpuReport,
    function_calling_ids: Iterable[str],
    *,
    cached: bool = False,
) -> Connection:
    """The built-in connection for one WebLLM model (`webllm-<model id>`).

    `cached`: the weights are already in the browser's cache (so the model
    is ready offline and ranks before TinyChat).
    """
    reason = webllm_unavailable_reason(record, gpu)
    size = f", about {round(record.vram_required_mb)} MB" if record.vram_required_mb else ""
    ready = reason is None and cached
    return Connection(
        id=f"webllm-{record.model_id}",
        name=f"{record.model_id} (WebLLM{size})",
        kind="webllm",
        model=record.model_id,
        route=WEBLLM_ROUTE,
        capabilities=webllm_capabilities(record, function_calling_ids),
        settings={"builtin": True, "cached": cached, "rank": 0 if ready else 50},
        available=reason is None,
        unavailable_reason=reason,
    )


def webllm_chat_body(request: LmspRequest) -> dict[str, Any]:
    """The streamed body for WebLLM's `chat.completions.create` (LMSP 6.1).

    WebLLM takes `response_format: {"type": "json_object", "schema": <JSON
    text>}`, rejects `tool_choice` values other than its own and ignores
    `none`: with `none` the tools are not sent (module rules).
    """
    body = lmsp_to_chat(request, response_format_style="json_object_schema", stream=True)
    fmt = body.get("response_format")
    if isinstance(fmt, dict) and "schema" in fmt:
        body["response_format"] = {"type": "json_object", "schema": json.dumps(fmt["schema"])}
    if body.get("tool_choice") == "none":
        body.pop("tools", None)
        body.pop("tool_choice", None)
    return body


# --------------------------------------------------------------------------- TinyChat in dist/

# TinyChat compiled for WebLLM: the built-in "TinyChat (WebGPU, WebLLM)" connection.
#
# Rules
# - The model (``models/tinychat/webllm/``: weights, ``mlc-chat-config.json``,
# tokenizer and the WebGPU model library) is served from the shell's own
# folder (``dist/models/tinychat-webllm/resolve/main/``). Its WebLLM
# ``ModelRecord`` (`webllm_tinychat_record`) is written by the build into
# ``vendor/web-llm/catalog.json`` under ``bundled`` (`webllm_catalog`, which
# `WEBLLM_BUILD` names), with URLs relative to the shell page;
# web/engines/webllm-engine.js resolves them and hands WebLLM an
# ``appConfig`` of its prebuilt records plus these. So the model is loaded,
# cached and run by WebLLM exactly like a prebuilt one, with no model host.
# - Availability and capabilities are WebLLM's own rules
# (``providers.engine_webllm``): WebGPU must give an adapter; the record needs no
# ``shader-f16`` and small buffers, so Chromium's software adapter
# (SwiftShader) runs it.
# - Tools: the model is not in WebLLM's function-calling list, and WebLLM
# refuses a request with ``tools`` for such a model, so the connection has
# ``tools: false`` and the runtime answers a tool request with
# `unsupported` before anything is submitted (NAP-LLM capabilities).
# - JSON output is WebLLM's grammar (``response_format`` with a schema;
# ``webllm_chat_body`` always sends one).

#: The record's `model_id` (`webllm_tinychat_record`).
WEBLLM_TINYCHAT_MODEL = "TinyChat-q0f32-MLC"
WEBLLM_TINYCHAT_ID = "builtin-tinychat-webllm"
WEBLLM_TINYCHAT_NAME = "TinyChat (WebGPU, WebLLM)"
#: After llama.cpp's TinyChat (10) and transformers.js' (20).
WEBLLM_TINYCHAT_RANK = 30
#: Where the build puts TinyChat: WebLLM reads a model folder at
#: `<model>/resolve/<revision>/`, its hub layout.
WEBLLM_TINYCHAT_FOLDER = "models/tinychat-webllm/resolve/main"
#: The files of models/tinychat/webllm/ WebLLM fetches (the rest is its build kit).
WEBLLM_TINYCHAT_FILES = (
    "mlc-chat-config.json",
    "tensor-cache.json",
    "params_shard_0.bin",
    "tokenizer.json",
    "tokenizer_config.json",
    "tinychat-webgpu.wasm",
)
#: Fields of WebLLM's model records the shell needs to judge a device.
WEBLLM_RECORD_FIELDS = (
    "model_id",
    "vram_required_MB",
    "required_features",
    "model_type",
    "low_resource_required",
    "buffer_size_required_bytes",
)


def sri_sha256(hex_digest: str) -> str:
    """A Subresource Integrity value (``sha256-<base64>``) for a hex sha256.

    Raises `ValueError` when `hex_digest` is not hexadecimal.
    """
    return "sha256-" + base64.b64encode(bytes.fromhex(hex_digest)).decode()


def webllm_tinychat_record(folder: str, sums: Mapping[str, str]) -> dict[str, Any]:
    """WebLLM's ``ModelRecord`` for the bundled TinyChat, in `folder` of dist/.

    `sums`: hex sha256 by file name (the folder's SHA256SUMS); WebLLM checks
    `integrity` after each download (config, model library, tokenizer).
    TinyChat needs no ``shader-f16`` and only small buffers (its whole
    weights are 2 MB), so it runs on software adapters. Raises `KeyError`
    when `sums` lacks the config, the library or the tokenizer.
    """
    return {
        "model_id": WEBLLM_TINYCHAT_MODEL,
        "model": f"{folder}/",
        "model_lib": f"{folder}/tinychat-webgpu.wasm",
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


def webllm_catalog(
    exports: Mapping[str, Any], models: Iterable[Mapping[str, Any]]
) -> dict[str, Any]:
    """The catalogue the page reads at boot (`WEBLLM_BUILD`'s `catalog`).

    `exports`: WebLLM's `prebuiltAppConfig` and `functionCallingModelIds`,
    read from its bundle by the build; `models`: the folders the build
    shipped (`{path, files: {name: sha256}}`). Shape: `{records: [the
    prebuilt records, `WEBLLM_RECORD_FIELDS` only], functionCallingIds,
    bundled: [TinyChat's record]}`; reading this small file means the 6 MB
    bundle is only loaded on a device with a WebGPU adapter. Raises
    `ValueError` when the prebuilt list is empty or missing.
    """
    config = exports.get("prebuiltAppConfig")
    listed = config.get("model_list") if isinstance(config, Mapping) else None
    records = [
        {key: record[key] for key in WEBLLM_RECORD_FIELDS if key in record}
        for record in (listed if isinstance(listed, list) else [])
        if isinstance(record, Mapping)
    ]
    if not records:
        raise ValueError("web-llm's prebuilt model list is empty")
    return {
        "records": records,
        "functionCallingIds": list(exports.get("functionCallingModelIds") or []),
        "bundled": [webllm_tinychat_record(m["path"], m["files"]) for m in models],
    }


def bundled_records(raw: object) -> list[WebLLMRecord]:
    """The chat records of the catalogue's `bundled` list (malformed entries dropped)."""
    if not isinstance(raw, list):
        return []
    records = [WebLLMRecord.from_json(item) for item in raw]
    return [r for r in records if r is not None and r.is_chat]


def webllm_tinychat_connection(
    record: WebLLMRecord, gpu: GpuReport, function_calling_ids: Iterable[str]
) -> Connection:
    """The built-in connection for the bundled TinyChat record (module rules).

    Unavailable, with WebLLM's reason, where the device cannot run it.
    """
    base = webllm_connection(record, gpu, function_calling_ids)
    settings = {**base.settings, "rank": WEBLLM_TINYCHAT_RANK, "bundled": True}
    return base.model_copy(
        update={"id": WEBLLM_TINYCHAT_ID, "name": WEBLLM_TINYCHAT_NAME, "settings": settings}
    )


@dataclass(frozen=True)
class WebLLMDevice:
    """What the page reported (`report()` of webllm-engine.js), read strictly.

    `gpu`: the WebGPU facts; `records`: WebLLM's prebuilt records by model
    id (the models shipped in dist/ among them); `function_calling`: ids
    WebLLM calls tools with; `cached`: the recommended models whose weights
    are in the browser's cache; `bundled`: the chat records shipped in
    dist/ (the catalogue's `bundled` list, "TinyChat in dist/" below).
    """

    gpu: GpuReport = field(default_factory=GpuReport)
    records: Mapping[str, WebLLMRecord] = field(default_factory=dict)
    function_calling: tuple[str, ...] = ()
    cached: frozenset[str] = frozenset()
    bundled: tuple[WebLLMRecord, ...] = ()

    @classmethod
    def from_json(cls, raw: object) -> WebLLMDevice:
        """Parse the catalogue report; anything malformed reads as empty."""
        if not isinstance(raw, dict):
            return cls()
        listed = raw.get("records")
        parsed = (WebLLMRecord.from_json(x) for x in (listed if isinstance(listed, list) else []))
        records = [r for r in parsed if r is not None]
        shipped = raw.get("bundled")
        bundled = tuple(
            r
            for r in (
                WebLLMRecord.from_json(x) for x in (shipped if isinstance(shipped, list) else [])
            )
            if r is not None and r.is_chat
        )
        ids = raw.get("functionCallingIds")
        cached = raw.get("cached")
        return cls(
            gpu=GpuReport.from_json(raw.get("gpu")),
            records={r.model_id: r for r in (*records, *bundled)},
            bundled=bundled,
            function_calling=tuple(i for i in ids if isinstance(i, str))
            if isinstance(ids, list)
            else (),
            cached=frozenset(c for c in cached if isinstance(c, str))
            if isinstance(cached, list)
            else frozenset(),
        )


#: What the page's engine host works from (`EngineSpec.page`): WebLLM's own
#: page-side client drives its worker, so an adapter module connects,
#: reports the catalogue and names failures; one model at a time.
#: For the storage panel, the build and the service worker: WebLLM's own
#: caches (a model library is an entry of its own), its bundle precached
#: (the shell imports it at start to probe WebGPU), the bundled TinyChat kept
#: once first used, parameter shards verified and at most 1 GiB each.
#: "Download for offline use" reads the model record's lists
#: (engines/offline-webllm.js).
WEBLLM_PAGE: Mapping[str, Any] = {
    "kind": "webllm",
    "adapter": "engines/webllm-engine.js",
    "report": "adapter",
    "oneModel": True,
    "offline": "engines/offline-webllm.js",
    "caches": {
        "webllm/config": {"label": "WebLLM"},
        "webllm/model": {"label": "WebLLM"},
        "webllm/wasm": {"label": "WebLLM", "entry": "file"},
    },
    "precache": ["vendor/web-llm/*"],
    "lazy": ["models/tinychat-webllm/"],
    "weights": [{"pattern": "/params_shard_\\d+\\.bin$", "limit": 1024**3}],
}

#: What the build makes of it (`EngineSpec.build`): web-llm bundled, TinyChat
#: checked against models/tinychat/webllm/SHA256SUMS, the catalogue
#: (`webllm_catalog`), and for the test build a WebLLM double (the adapter
#: and the bundle replaced, the product files kept beside them).
WEBLLM_BUILD: Mapping[str, Any] = {
    "bundles": [{"entry": "web-llm.js", "output": "vendor/web-llm/web-llm.js"}],
    "packages": ["@mlc-ai/web-llm"],
    "models": [
        {
            "source": "tinychat/webllm",
            "dest": WEBLLM_TINYCHAT_FOLDER,
            "files": list(WEBLLM_TINYCHAT_FILES),
        }
    ],
    "catalog": {
        "bundle": "vendor/web-llm/web-llm.js",
        "exports": ["prebuiltAppConfig", "functionCallingModelIds"],
        "file": "vendor/web-llm/catalog.json",
        "make": "webllm_catalog",
    },
    "test": {
        "replace": {
            "engines/webllm-engine.js": {
                "hook": "webllm-engine.js",
                "product": "engines/webllm-engine.product.js",
            },
            "vendor/web-llm/web-llm.js": {
                "hook": "web-llm.js",
                "product": "vendor/web-llm/web-llm.product.js",
            },
        },
        "add": {"testhooks/webllm-factory.js": "webllm-factory.js"},
    },
}


class WebLLMSpec(SpecDefaults):
    """The `webllm` engine (`providers.engine.EngineSpec`; module rules)."""

    kind = "webllm"
    form: Mapping[str, Any] = {
        "label": "WebLLM in this browser (WebGPU)",
        "summary": "Runs a WebLLM prebuilt model inside this page on the GPU.",
        "model_hint": "A WebLLM prebuilt model id, such as Llama-3.2-1B-Instruct-q4f16_1-MLC.",
        "needs": WEBGPU_NEEDS,
        "needs_how": WEBGPU_HOW,
    }
    route = WEBLLM_ROUTE
    page = WEBLLM_PAGE
    build = WEBLLM_BUILD
    hints: Mapping[str, str] = WEBLLM_HINTS
    report_at_start = True
    report_before_chat = False
    load_error = "unknown"

    def read_device(self, report: object) -> WebLLMDevice:
        """`WebLLMDevice.from_json`."""
        return WebLLMDevice.from_json(report)

    def built_in(self, device: WebLLMDevice | None) -> list[Connection]:
        """The recommended models for this device, then the models shipped in dist/.

        Unavailable ones say why.
        """
        device = device or WebLLMDevice()
        shipped = {r.model_id for r in device.bundled}
        return [
            webllm_connection(
                record,
                device.gpu,
                device.function_calling,
                cached=record.model_id in device.cached,
            )
            for record in webllm_recommended(
                (r for r in device.records.values() if r.model_id not in shipped), device.gpu
            )
        ] + [
            webllm_tinychat_connection(record, device.gpu, device.function_calling)
            for record in device.bundled
            if record.model_id == WEBLLM_TINYCHAT_MODEL
        ]

    def capabilities(
        self, model: str, settings: Mapping[str, Any], device: WebLLMDevice | None
    ) -> Capabilities:
        """Capabilities of a prebuilt model id; `ValueError` for an unknown id."""
        device = device or WebLLMDevice()
        record = device.records.get(model)
        if record is None or not record.is_chat:
            raise ValueError("not a WebLLM prebuilt chat model id")
        return webllm_capabilities(record, device.function_calling)

    def unavailable_reason(self, model: str, device: WebLLMDevice | None) -> str | None:
        """Why a prebuilt model cannot run on this device (a sentence), or None."""
        device = device or WebLLMDevice()
        record = device.records.get(model)
        return webllm_unavailable_reason(record, device.gpu) if record is not None else None

    def blocker(self, model: str, device: WebLLMDevice | None) -> str | None:
        """`webllm_blocker` for the model's record on this device."""
        device = device or WebLLMDevice()
        return webllm_blocker(device.records.get(model), device.gpu)

    def load_call(
        self, connection: Connection, device: WebLLMDevice | None
    ) -> tuple[str, dict[str, Any]]:
        """One engine per model id: the key is the id; no other load fields."""
        return connection.model, {}

    def chat_body(self, request: LmspRequest) -> dict[str, Any]:
        """`webllm_chat_body`."""
        return webllm_chat_body(request)

    def chunk_mapping(self, request: LmspRequest, body: Mapping[str, Any]) -> ChatStreamToLmsp:
        """Tool calls' JSON arrives as content when tools were sent (module rules)."""
        return ChatStreamToLmsp(tool_text_in_content="tools" in body)


WEBLLM = WebLLMSpec()
