"""The `wasm` engine's spec: llama.cpp compiled to WebAssembly through wllama.

Pure data and functions, tested under CPython; the one provider every
engine shares is `providers.engine.EngineProvider`, and the page side is
the engine host (web/engines/engine-host.js) around its worker,
web/engines/wllama-worker.js, as `WasmSpec.page` declares.

Rules
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
  wllama's WebGPU start-up aborts on adapters without `shader-f16`. The page
  reports isolation and cores (the host's `environment` report) before the
  first load.
- A model is loaded once per key (the GGUF URL and the load parameters),
  all of them in one worker. Before a download the file must fit in the
  browser's storage (the host's `room` check: one copy, the service
  worker's); a failed load removes the file from every cache (the worker).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..lmsp import LmspRequest
from ..records import Capabilities, Connection
from .chat_request import lmsp_to_chat
from .chat_stream import ChatStreamToLmsp
from .engine import ENGINE_HINTS, SpecDefaults, builtin_connection

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
    body = lmsp_to_chat(request, response_format_style="json_schema", stream=True)
    if request.temperature == 0:
        body["top_k"] = 1
    return body


def tinychat_connection() -> Connection:
    """The built-in TinyChat connection (always available, offline)."""
    settings = {"url": TINYCHAT_PATH, "contextSize": TINYCHAT_CONTEXT, "rank": TINYCHAT_RANK}
    ids = (TINYCHAT_ID, TINYCHAT_NAME, TINYCHAT_MODEL)
    return builtin_connection(WASM, ids, WASM_CAPABILITIES, settings)


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


#: User hints by error kind: the shared table, in the words of a GGUF file.
WASM_HINTS: dict[str, str] = ENGINE_HINTS | {
    "load": "The model file could not be loaded; it may be corrupt or not a GGUF model.",
}


@dataclass(frozen=True)
class WasmDevice:
    """What the page reports for wllama (the engine host's `environment` report)."""

    cross_origin_isolated: bool = False
    hardware_concurrency: int = 1


#: What the page's engine host works from (`EngineSpec.page`): one worker for
#: every model; the GGUF URL is read against the page and must fit in storage.
#: For the build and the service worker: wllama's bundle and TinyChat are
#: precached; a GGUF (any origin) goes to the service worker's model cache
#: once verified (the magic `GGUF`, at most 4 GiB); "Download for offline
#: use" lists a connection's shards (engines/offline-gguf.js).
WASM_PAGE: Mapping[str, Any] = {
    "kind": "wasm",
    "worker": "engines/wllama-worker.js",
    "report": "environment",
    "urlFields": ["url"],
    "room": "url",
    "progressVerb": "Downloading",
    "offline": "engines/offline-gguf.js",
    "leftovers": "engines/leftovers-wllama.js",
    "precache": ["vendor/wllama/*", TINYCHAT_PATH],
    "weights": [{"suffix": ".gguf", "limit": 4 * 1024**3, "magic": "GGUF", "modelCache": True}],
}

#: What the build makes of it (`EngineSpec.build`): wllama bundled with its
#: wasm beside it, and TinyChat's GGUF checked against models/tinychat/SHA256SUMS.
WASM_BUILD: Mapping[str, Any] = {
    "bundles": [{"entry": "wllama.js", "output": "vendor/wllama/wllama.js"}],
    "packages": ["@wllama/wllama"],
    "vendor": [{"from": "@wllama/wllama/esm/wasm/wllama.wasm", "to": "vendor/wllama/wllama.wasm"}],
    "models": [
        {
            "source": "tinychat",
            "dest": TINYCHAT_PATH.rsplit("/", 1)[0],
            "files": [TINYCHAT_PATH.rsplit("/", 1)[1]],
        }
    ],
}


class WasmSpec(SpecDefaults):
    """The `wasm` engine (`providers.engine.EngineSpec`; module rules)."""

    kind = "wasm"
    form: Mapping[str, Any] = {
        "label": "llama.cpp in this browser (WebAssembly)",
        "summary": (
            "Runs a GGUF model inside this page on the processor; nothing leaves the device."
        ),
        "model_url": True,
        "model_hint": "Optional: the GGUF file's name is used when left blank.",
    }
    route = "This browser (WebAssembly, llama.cpp) on this device"
    page = WASM_PAGE
    build = WASM_BUILD
    hints: Mapping[str, str] = WASM_HINTS

    def read_device(self, report: object) -> WasmDevice:
        """Isolation and core count; anything missing reads as 1 thread."""
        if not isinstance(report, dict):
            return WasmDevice()
        cores = report.get("hardwareConcurrency")
        return WasmDevice(
            cross_origin_isolated=report.get("crossOriginIsolated") is True,
            hardware_concurrency=cores
            if isinstance(cores, int) and not isinstance(cores, bool) and cores > 0
            else 1,
        )

    def built_in(self, device: WasmDevice | None) -> list[Connection]:
        """TinyChat, always available (it ranks after a WebLLM model in cache)."""
        return [tinychat_connection()]

    def capabilities(
        self, model: str, settings: Mapping[str, Any], device: WasmDevice | None
    ) -> Capabilities:
        """`wasm_capabilities`; `ValueError` without a usable GGUF URL."""
        return wasm_capabilities(model, settings)

    def unavailable_reason(self, model: str, device: WasmDevice | None) -> str | None:
        """Never: llama.cpp on WebAssembly runs on every device."""
        return None

    def blocker(self, model: str, device: WasmDevice | None) -> str | None:
        """Never (see `unavailable_reason`)."""
        return None

    def load_call(
        self, connection: Connection, device: WasmDevice | None
    ) -> tuple[str, dict[str, Any]]:
        """Key `[url, params]` (JSON); load fields `url` and `params` (wllama's)."""
        device = device or WasmDevice()
        params = wasm_load_params(
            connection.settings,
            cross_origin_isolated=device.cross_origin_isolated,
            hardware_concurrency=device.hardware_concurrency,
        )
        url = str(connection.settings.get("url", ""))
        key = json.dumps([url, params], sort_keys=True)
        return key, {"url": url, "params": params}

    def chat_body(self, request: LmspRequest) -> dict[str, Any]:
        """`wasm_chat_body`."""
        return wasm_chat_body(request)

    def chunk_mapping(self, request: LmspRequest, body: Mapping[str, Any]) -> ChatStreamToLmsp:
        """wllama returns Hermes `<tool_call>` blocks as text: parse them when tools were sent."""
        return ChatStreamToLmsp(parse_tool_call_blocks=bool(request.tools))


WASM = WasmSpec()
