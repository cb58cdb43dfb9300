"""Engine port in the page: the `onnx` provider (transformers.js on WebGPU).

Rules (as for the other engine ports, napllm.browser.engines)
- The JS module is web/engines/transformers-engine.js, imported by URL
  relative to the shell page; Python holds no JS object beyond one call and
  everything crossing the bridge is JSON text or a plain string.
- The built-in TinyChat (WebGPU) connection is listed on every device; where
  WebGPU gives no adapter it is unavailable, with the reason, and never
  offered, so the library is never fetched there. A user-added `onnx`
  connection is judged the same way.
- Chunks are mapped by `chat_stream.ChatStreamToLmsp`, with `<tool_call>`
  blocks parsed into tool calls when the request has tools (the wasm
  engine's parser). Cancellation closes the iterator, whose `finally` aborts
  the JS stream: the worker interrupts the generation and stays usable.
- Failures are `ProviderFailure`s from error kinds (`providers.onnx_engine`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from pyodide.ffi import JsException  # type: ignore[import-not-found]

from ..jsontext import read_json
from ..lmsp import LmspEvent, LmspRequest
from ..providers.base import Provider
from ..providers.chat_stream import ChatStreamToLmsp
from ..providers.onnx_engine import (
    onnx_capabilities,
    onnx_chat_body,
    onnx_dtype,
    onnx_failure,
    onnx_source,
    onnx_tinychat_connection,
    webgpu_unavailable_reason,
)
from ..records import Capabilities, Connection
from .engines import import_module, stream_chunks

log = logging.getLogger("napllm.browser.onnx_engine")

TRANSFORMERS_MODULE = "engines/transformers-engine.js"


class OnnxProvider:
    """`Provider` for one `onnx` connection: transformers.js in a worker."""

    def __init__(self, engine: OnnxEngine, connection: Connection) -> None:
        self._engine = engine
        self._connection = connection

    def respond(self, request: LmspRequest) -> AsyncIterator[LmspEvent]:
        """Stream one chat completion as LMSP events (6.3). Raises `ProviderFailure`."""
        return self._respond(request)

    async def _respond(self, request: LmspRequest) -> AsyncIterator[LmspEvent]:
        api = await import_module(TRANSFORMERS_MODULE)
        if await self._engine.unavailable(api) is not None:
            raise onnx_failure("webgpu")
        key = await self._engine.ensure_model(self._connection, api)
        body = onnx_chat_body(request)
        state = ChatStreamToLmsp(parse_tool_call_blocks=bool(request.tools))
        try:
            stream_id = str(api.startChat(key, json.dumps(body), self._engine.delay_ms))
        except JsException as exc:
            raise onnx_failure("inference") from exc
        async for event in stream_chunks(api, stream_id, state, "onnx"):
            yield event


class OnnxEngine:
    """The `onnx` engine: TinyChat (WebGPU) built in, any ONNX chat model on request."""

    kind = "onnx"

    def __init__(self) -> None:
        self.delay_ms = 0
        self._reason: str | None = None
        self._probed = False

    async def unavailable(self, api: Any) -> str | None:
        """Why WebGPU cannot run models here (a sentence), or `None` (probed once)."""
        if not self._probed:
            try:
                probe = read_json(str(await api.probe()))
            except (JsException, ValueError):
                probe = None
            self._reason = webgpu_unavailable_reason(probe)
            self._probed = True
        return self._reason

    async def ensure_model(self, connection: Connection, api: Any) -> str:
        """Load the connection's model (once) in its worker; returns its key.

        Raises `ProviderFailure` (`download`, `load` hints) when it fails.
        """
        try:
            source = onnx_source(connection.model, connection.settings)
        except ValueError as exc:
            raise onnx_failure("load") from exc
        dtype = onnx_dtype(connection.settings)
        key = json.dumps([source, "webgpu", dtype], sort_keys=True)
        if api.isLoaded(key) is True:
            return key
        try:
            text = await api.ensureModel(
                key, json.dumps(source), "webgpu", dtype, connection.id, connection.name
            )
            result = read_json(str(text))
        except (JsException, ValueError) as exc:
            raise onnx_failure("load") from exc
        if not isinstance(result, dict) or result.get("ok") is not True:
            raise onnx_failure(result.get("kind") if isinstance(result, dict) else None)
        return key

    def provider_for(self, connection: Connection) -> Provider:
        """A provider for `connection` (kind `onnx`)."""
        return OnnxProvider(self, connection)

    def capabilities_for(self, model: str, settings: dict[str, Any]) -> Capabilities:
        """Capabilities of a user-chosen ONNX model; `ValueError` without a usable source."""
        return onnx_capabilities(model, settings)

    def unavailable_reason(self, model: str) -> str | None:
        """Why `onnx` models cannot run on this device, or `None` (after the probe)."""
        return self._reason

    async def default_connections(self) -> list[Connection]:
        """TinyChat (WebGPU), unavailable with the reason where WebGPU is absent."""
        try:
            api = await import_module(TRANSFORMERS_MODULE)
            reason = await self.unavailable(api)
        except JsException:
            log.warning("onnx: the engine module could not be loaded")
            return []
        return [onnx_tinychat_connection(reason)]
