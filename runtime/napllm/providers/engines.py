"""In-browser engines (wasm: llama.cpp through wllama; webllm: WebLLM on WebGPU):
the protocol side that needs no JavaScript.

Both engines speak OpenAI chat completions, so requests and chunks go
through `openai_chat` (`lmsp_to_chat`, `ChatStreamToLmsp`); this module only
holds what is specific to each engine, as data and pure functions, so it is
tested under CPython (docs/design.md, "Layout": a provider module holds the protocol side).
The JS bridge lives in `napllm.browser.engines`.

Rules (wasm / wllama)
- The built-in connection is TinyChat (`models/tinychat/`), served from the
  shell's own folder: `builtin-tinychat`, model `tinychat-q8_0`, route
  "This browser -> llama.cpp on WebAssembly (this device)". It needs no GPU
  and no network, so it is always available.
- Capabilities: JSON output (wllama turns `response_format` into a grammar),
  tools with the modes llama.cpp's server honours (`auto`, `none`; wllama
  parses Hermes `<tool_call>` blocks into `tool_calls`), no images.
- Temperature 0 means greedy decoding: `top_k: 1` is sent along, so the
  answer does not depend on how the sampler treats a zero temperature.
- Threads: 1 without cross-origin isolation (no `SharedArrayBuffer`), half
  the logical cores (at most 8) with it. No GPU layers (`n_gpu_layers: 0`):
  wllama's WebGPU start-up aborts on adapters without `shader-f16`.

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
  the last chunk only (WebLLM's chat_completion.ts): such streams are mapped with
  `tool_text_in_content`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import ErrorCode, ProviderFailure
from ..kinds import route_for
from ..lmsp import LmspRequest
from ..records import Capabilities, Connection
from .chat_request import lmsp_to_chat

# --------------------------------------------------------------------------
# wasm: llama.cpp through wllama

TINYCHAT_ID = "builtin-tinychat"
TINYCHAT_NAME = "TinyChat (on this device)"
TINYCHAT_MODEL = "tinychat-q8_0"
#: Relative to the shell page (dist/): build.py copies the model there.
TINYCHAT_PATH = "models/tinychat/tiny-chat-q8_0.gguf"
#: TinyChat was trained with a 512-token context.
TINYCHAT_CONTEXT = 512
#: Order of built-in connections (`settings.rank`, lower first): a WebLLM
#: model whose weights are cached ranks 0, TinyChat 10, other WebLLM models 50.
TINYCHAT_RANK = 10

WASM_CAPABILITIES = Capabilities(
    images=False, json_output=True, tools=True, tool_choice_modes=("auto", "none")
)

#: Default context size for user-chosen GGUF models (tokens).
WASM_DEFAULT_CONTEXT = 4096


def wllama_threads(cross_origin_isolated: bool, hardware_concurrency: int) -> int:
    """llama.cpp threads for wllama: 1 without cross-origin isolation.

    With isolation (COOP/COEP, so `SharedArrayBuffer` exists) half the
    logical cores, at most 8: 2 or more from 4 cores up. Below 4 cores it
    stays 1, because the page's own thread (Pyodide, the runtime) needs a
    core too: on 2 cores, 2 llama.cpp threads made TinyChat slower, not
    faster (bench/bench_wasm.py).
    """
    if not cross_origin_isolated:
        return 1
    return max(1, min(8, hardware_concurrency // 2))


def wasm_load_params(
    settings: Mapping[str, Any], *, cross_origin_isolated: bool, hardware_concurrency: int
) -> dict[str, Any]:
    """wllama `LoadModelParams` for a wasm connection's `settings`.

    `settings.contextSize` (tokens, 64..131072) overrides the default
    context; returns `{n_ctx, n_threads, n_gpu_layers: 0}`.
    """
    context = settings.get("contextSize")
    if not (isinstance(context, int) and not isinstance(context, bool) and 64 <= context <= 131072):
        context = WASM_DEFAULT_CONTEXT
    return {
        "n_ctx": context,
        "n_threads": wllama_threads(cross_origin_isolated, hardware_concurrency),
        "n_gpu_layers": 0,
    }


def wasm_chat_body(request: LmspRequest) -> dict[str, Any]:
    """The streamed chat body wllama's `createChatCompletion` takes (LMSP 6.1).

    `lmsp_to_chat` with `json_schema` response format (wllama's server
    turns it into a grammar), `stream: true` with usage in the last chunk,
    and `top_k: 1` when the temperature is 0 (greedy decoding).
    """
    body = lmsp_to_chat(request, response_format_style="json_schema")
    body["stream"] = True
    body["stream_options"] = {"include_usage": True}
    if request.temperature == 0:
        body["top_k"] = 1
    return body


def tinychat_connection() -> Connection:
    """The built-in TinyChat connection (always available, offline)."""
    return Connection(
        id=TINYCHAT_ID,
        name=TINYCHAT_NAME,
        kind="wasm",
        model=TINYCHAT_MODEL,
        route=route_for("wasm", {}),
        capabilities=WASM_CAPABILITIES,
        settings={
            "url": TINYCHAT_PATH,
            "contextSize": TINYCHAT_CONTEXT,
            "builtin": True,
            "rank": TINYCHAT_RANK,
        },
    )


def wasm_capabilities(model: str, settings: Mapping[str, Any]) -> Capabilities:
    """Capabilities of a user-chosen GGUF (`settings.url`).

    Raises `ValueError` when `settings.url` is not an http(s) or relative
    URL. Every GGUF gets grammar-constrained JSON and template-driven tools
    (the runtime judges the calls it returns); wllama here takes no images.
    """
    url = settings.get("url")
    if not isinstance(url, str) or not url or url.startswith(("javascript:", "data:", "blob:")):
        raise ValueError("a GGUF URL is required")
    if "://" in url and not url.startswith(("http://", "https://")):
        raise ValueError("the GGUF URL must be http(s)")
    return WASM_CAPABILITIES


# --------------------------------------------------------------------------
# webllm: WebLLM on WebGPU

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
    """What the page learnt about WebGPU (see web/engines/webllm-engine.js `probe`).

    `adapter`: an adapter was granted; `reason`: why not (a sentence from
    `NO_ADAPTER_REASONS`, chosen by the probe's reason code);
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
            reason = NO_ADAPTER_REASONS.get(code, NO_WEBGPU) if isinstance(code, str) else NO_WEBGPU
            return cls(adapter=False, reason=reason)

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


NO_WEBGPU = "WebGPU is not available in this browser (no GPU adapter)."
#: The probe's reason codes (web/engines/webllm-engine.js) -> user-facing text.
NO_ADAPTER_REASONS: dict[str, str] = {
    "no-webgpu": "WebGPU is not available in this browser.",
    "no-adapter": NO_WEBGPU,
    "timeout": "WebGPU is not available: GPU detection did not answer in time.",
}


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
        route=route_for("webllm", {}),
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
    body = lmsp_to_chat(request, response_format_style="json_object_schema")
    body["stream"] = True
    body["stream_options"] = {"include_usage": True}
    fmt = body.get("response_format")
    if isinstance(fmt, dict) and "schema" in fmt:
        body["response_format"] = {"type": "json_object", "schema": json.dumps(fmt["schema"])}
    if body.get("tool_choice") == "none":
        body.pop("tools", None)
        body.pop("tool_choice", None)
    return body


# --------------------------------------------------------------------------
# Engine errors (reported by the JS side as a `kind`)

#: User hints for the shell UI, by error kind (never sent to a napplet).
ENGINE_HINTS: dict[str, str] = {
    "download": "The model file could not be downloaded.",
    "load": "The model file could not be loaded; it may be corrupt or not a GGUF model.",
    "webgpu": "WebGPU is not available in this browser, so this model cannot run here.",
    "feature": "This GPU lacks a WebGPU feature the model needs (shader-f16).",
    "device": "This model needs more GPU memory or buffer space than this device offers.",
    "network": (
        "The model could not be fetched; a WebLLM model needs its model host "
        "(or weights already in the browser cache)."
    ),
    "storage": "The browser ran out of storage space for the model.",
    "context": "The conversation is longer than the model's context window.",
    "inference": "The model failed while generating.",
    "busy": "The engine is still busy with another request.",
    "unknown": "The in-browser engine failed.",
}


def engine_failure(kind: object, engine: str) -> ProviderFailure:
    """A `ProviderFailure` for an engine error `kind` (see `ENGINE_HINTS`).

    `context` (context window exhausted) is `quota-exceeded`; every other
    kind is `provider-error`. The JS error text is never used.
    """
    key = kind if isinstance(kind, str) and kind in ENGINE_HINTS else "unknown"
    code = ErrorCode.QUOTA_EXCEEDED if key == "context" else ErrorCode.PROVIDER_ERROR
    return ProviderFailure(code, user_hint=ENGINE_HINTS[key], detail=f"{engine}: {key}")
