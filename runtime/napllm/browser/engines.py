"""Engine ports in the page: the wasm (wllama) and webllm (WebLLM) providers.

Rules (docs/design.md, "The data path" and "Known behaviours"; providers/base.py)
- Each engine is a JS module under web/engines/ (copied to dist/engines/),
  imported with a dynamic `import()` of an absolute URL built from the
  page's base URL, so the shell works under any sub-path. Each module's
  namespace is imported once and kept for the page's lifetime (the browser
  keeps one instance per URL anyway): a request then makes no `import()`
  and no event-loop turn for it. Beyond those few namespaces Python holds
  no JS object longer than one call.
- Everything crossing the bridge is JSON text or a plain string: the chat
  body goes in as JSON, chunks come back in batches of JSON text
  (web/engines/streams.js): every chunk the engine produced since the last
  read, so the engine runs ahead and the runtime works per batch. The
  workers send each batch's runs of text-only chunks merged into one chunk
  (web/engines/batcher.js), so the runtime parses and maps per run, not per
  token (`chat_stream.ChatStreamToLmsp` accepts text split anywhere).
  No proxy is created (JS never calls back into Python).
- Cancellation is task cancellation: the provider's iterator is closed, and
  its `finally` aborts the JS stream (wllama: AbortSignal; WebLLM:
  `interruptGenerate` with a per-request guard and the stream drained).
- Failures are `ProviderFailure`s built from an error kind reported by the
  JS side (`providers.engines.engine_failure`): a fixed user hint in the
  shell UI, `provider-error` (or `quota-exceeded`) to the napplet.
- `delay_ms` of an engine (0 here) is the delivery delay the JS side waits
  between chunks (web/engines/streams.js). The product never changes it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urljoin

from js import document  # type: ignore[import-not-found]
from pyodide.code import run_js  # type: ignore[import-not-found]
from pyodide.ffi import JsException  # type: ignore[import-not-found]

from ..errors import ProviderFailure
from ..jsontext import read_json, read_stream_payload
from ..lmsp import LmspEvent, LmspRequest
from ..providers.base import Provider
from ..providers.chat_stream import ChatStreamToLmsp
from ..providers.engines import (
    GpuReport,
    WebLLMRecord,
    engine_failure,
    tinychat_connection,
    wasm_capabilities,
    wasm_chat_body,
    wasm_load_params,
    webllm_blocker,
    webllm_capabilities,
    webllm_chat_body,
    webllm_connection,
    webllm_recommended,
    webllm_unavailable_reason,
)
from ..records import Capabilities, Connection

log = logging.getLogger("napllm.browser.engines")

WLLAMA_MODULE = "engines/wllama-engine.js"
WEBLLM_MODULE = "engines/webllm-engine.js"


#: path -> the JS module's namespace, imported once (module rules).
_modules: dict[str, Any] = {}


async def import_module(path: str) -> Any:
    """The JS module at `path` (relative to the shell page), imported once.

    A failed import raises `JsException` and is tried again next time.
    """
    module = _modules.get(path)
    if module is None:
        url = urljoin(str(document.baseURI), path)
        module = await run_js(f"import({json.dumps(url)})")
        _modules[path] = module
    return module


async def stream_chunks(
    api: Any,
    stream_id: str,
    state: ChatStreamToLmsp,
    engine: str,
) -> AsyncIterator[LmspEvent]:
    """LMSP events of stream `stream_id` of engine module `api`.

    Aborts the stream unless it was read to the end (cancellation, a
    failure). Raises `ProviderFailure` for an engine error or a malformed
    batch. `api` is held only while this generation runs.
    """
    finished = False
    try:
        while True:
            try:
                batch = read_stream_payload(str(await api.nextChunks(stream_id)))
            except (ValueError, JsException) as exc:
                raise ProviderFailure(detail=f"{engine}: unreadable chunk batch") from exc
            if not isinstance(batch, dict) or not isinstance(batch.get("chunks"), list):
                raise ProviderFailure(detail=f"{engine}: malformed chunk batch")
            for chunk in batch["chunks"]:
                for event in state.feed(chunk):
                    yield event
            if batch.get("done") is True:
                error = batch.get("error")
                if isinstance(error, dict):
                    finished = True
                    raise engine_failure(error.get("kind"), engine)
                break
        finished = True
        for event in state.finish():
            yield event
    finally:
        if not finished:
            try:
                api.abort(stream_id)
            except JsException:
                log.warning("%s: the stream could not be aborted", engine)


# --------------------------------------------------------------------------
# wasm


class WasmProvider:
    """`Provider` for one wasm connection: llama.cpp through wllama."""

    def __init__(self, engine: WasmEngine, connection: Connection) -> None:
        self._engine = engine
        self._connection = connection

    def respond(self, request: LmspRequest) -> AsyncIterator[LmspEvent]:
        """Stream one chat completion as LMSP events (6.3). Raises `ProviderFailure`."""
        return self._respond(request)

    async def _respond(self, request: LmspRequest) -> AsyncIterator[LmspEvent]:
        api = await import_module(WLLAMA_MODULE)
        key = await self._engine.ensure_model(self._connection, api)
        body = wasm_chat_body(request)
        state = ChatStreamToLmsp(parse_tool_call_blocks=bool(request.tools))
        try:
            stream_id = str(api.startChat(key, json.dumps(body), self._engine.delay_ms))
        except JsException as exc:
            raise engine_failure("inference", "wasm") from exc
        async for event in stream_chunks(api, stream_id, state, "wasm"):
            yield event


class WasmEngine:
    """The `wasm` engine: TinyChat built in, any GGUF URL on request."""

    kind = "wasm"

    def __init__(self) -> None:
        self.delay_ms = 0
        self._environment: dict[str, Any] | None = None

    def _env(self, api: Any) -> dict[str, Any]:
        if self._environment is None:
            data = read_json(str(api.environment()))
            self._environment = data if isinstance(data, dict) else {}
        return self._environment

    async def ensure_model(self, connection: Connection, api: Any) -> str:
        """Load the connection's GGUF (once) through module `api`; returns its model key.

        Raises `ProviderFailure` (`download` or `load` hint) when it fails.
        """
        env = self._env(api)
        params = wasm_load_params(
            connection.settings,
            cross_origin_isolated=env.get("crossOriginIsolated") is True,
            hardware_concurrency=int(env.get("hardwareConcurrency") or 1),
        )
        url = str(connection.settings.get("url", ""))
        key = json.dumps([url, params], sort_keys=True)
        if api.isLoaded(key) is True:
            return key  # no promise to await: this is on every request's path
        try:
            text = await api.ensureModel(
                key, url, json.dumps(params), connection.id, connection.name
            )
            result = read_json(str(text))
        except (JsException, ValueError) as exc:
            raise engine_failure("load", "wasm") from exc
        if not isinstance(result, dict) or result.get("ok") is not True:
            kind = result.get("kind") if isinstance(result, dict) else None
            raise engine_failure(kind, "wasm")
        return key

    def provider_for(self, connection: Connection) -> Provider:
        """A provider for `connection` (kind `wasm`)."""
        return WasmProvider(self, connection)

    def capabilities_for(self, model: str, settings: dict[str, Any]) -> Capabilities:
        """Capabilities of a user-chosen GGUF; `ValueError` without a usable URL."""
        return wasm_capabilities(model, settings)

    async def default_connections(self) -> list[Connection]:
        """TinyChat, always available (it ranks after a WebLLM model in cache)."""
        return [tinychat_connection()]


# --------------------------------------------------------------------------
# webllm


class WebLLMProvider:
    """`Provider` for one WebLLM model (WebGPU, in a worker)."""

    def __init__(self, engine: WebLLMEngine, connection: Connection) -> None:
        self._engine = engine
        self._connection = connection

    def respond(self, request: LmspRequest) -> AsyncIterator[LmspEvent]:
        """Stream one chat completion as LMSP events (6.3). Raises `ProviderFailure`."""
        return self._respond(request)

    async def _respond(self, request: LmspRequest) -> AsyncIterator[LmspEvent]:
        connection = self._connection
        blocker = self._engine.blocker(connection.model)
        if blocker is not None:
            raise engine_failure(blocker, "webllm")
        api = await import_module(WEBLLM_MODULE)
        try:
            text = await api.ensureEngine(connection.model, connection.id, connection.name)
            result = read_json(str(text))
        except (JsException, ValueError) as exc:
            raise engine_failure("unknown", "webllm") from exc
        if not isinstance(result, dict) or result.get("ok") is not True:
            raise engine_failure(result.get("kind") if isinstance(result, dict) else None, "webllm")
        body = webllm_chat_body(request)
        state = ChatStreamToLmsp(tool_text_in_content="tools" in body)
        try:
            stream_id = str(
                api.startChat(connection.model, json.dumps(body), self._engine.delay_ms)
            )
        except JsException as exc:
            raise engine_failure("inference", "webllm") from exc
        async for event in stream_chunks(api, stream_id, state, "webllm"):
            yield event


class WebLLMEngine:
    """The `webllm` engine: a handful of recommended prebuilt models, any other by id."""

    kind = "webllm"

    def __init__(self) -> None:
        self.delay_ms = 0
        self._records: dict[str, WebLLMRecord] = {}
        self._function_calling: tuple[str, ...] = ()
        self.gpu = GpuReport()

    async def default_connections(self) -> list[Connection]:
        """Recommended models for this device (unavailable ones say why)."""
        try:
            api = await import_module(WEBLLM_MODULE)
            data = read_json(str(await api.catalog()))
        except (JsException, ValueError):
            log.warning("webllm: the WebLLM catalogue could not be read")
            return []
        if not isinstance(data, dict):
            return []
        self.gpu = GpuReport.from_json(data.get("gpu"))
        raw_records = data.get("records")
        records = [
            r for r in (WebLLMRecord.from_json(x) for x in (raw_records or [])) if r is not None
        ]
        self._records = {r.model_id: r for r in records}
        ids = data.get("functionCallingIds")
        self._function_calling = (
            tuple(i for i in ids if isinstance(i, str)) if isinstance(ids, list) else ()
        )
        cached_raw = data.get("cached")
        cached = (
            {c for c in cached_raw if isinstance(c, str)} if isinstance(cached_raw, list) else set()
        )
        return [
            webllm_connection(r, self.gpu, self._function_calling, cached=r.model_id in cached)
            for r in webllm_recommended(records, self.gpu)
        ]

    def blocker(self, model: str) -> str | None:
        """Why `model` cannot start on this device (an engine error kind), or `None`."""
        return webllm_blocker(self._records.get(model), self.gpu)

    def unavailable_reason(self, model: str) -> str | None:
        """Why a prebuilt model cannot run on this device (a sentence), or `None`."""
        record = self._records.get(model)
        return webllm_unavailable_reason(record, self.gpu) if record is not None else None

    def capabilities_for(self, model: str, settings: dict[str, Any]) -> Capabilities:
        """Capabilities of a prebuilt model id; `ValueError` for an unknown id."""
        record = self._records.get(model)
        if record is None or not record.is_chat:
            raise ValueError("not a WebLLM prebuilt chat model id")
        return webllm_capabilities(record, self._function_calling)

    def provider_for(self, connection: Connection) -> Provider:
        """A provider for `connection` (kind `webllm`)."""
        return WebLLMProvider(self, connection)


def register_engines(engines: dict[str, Any]) -> None:
    """Add the wasm, webllm and onnx engines to `BrowserProviders.engines`."""
    engines["wasm"] = WasmEngine()
    engines["webllm"] = WebLLMEngine()
    # The onnx engine (transformers.js on WebGPU) lives in its own module.
    from .onnx_engine import OnnxEngine

    engines["onnx"] = OnnxEngine()


__all__ = ["ProviderFailure", "WasmEngine", "WebLLMEngine", "register_engines"]
