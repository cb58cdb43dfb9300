"""The engine bridge in the page: each engine's JS module behind `EngineBridge`.

Every engine's provider is `providers.engine.EngineProvider`, driven by the
engine's spec (`ENGINE_SPECS`); this module only reaches the JS modules.

Rules (docs/design.md, "The data path", "Known behaviours" and "Adding an
engine"; providers/engine.py)
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
- A failed JS call is `EngineBridgeError`; its text stays in the console.
  A failed import is tried again next time.
- Cancellation aborts the JS stream (wllama: AbortSignal; WebLLM:
  `interruptGenerate` with a per-request guard and the stream drained;
  transformers.js: the worker interrupts and stays usable).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any
from urllib.parse import urljoin

from js import document  # type: ignore[import-not-found]
from pyodide.code import run_js  # type: ignore[import-not-found]
from pyodide.ffi import JsException  # type: ignore[import-not-found]

from ..providers.engine import Engine, EngineBridge, EngineBridgeError, EngineSpec, SpecEngine
from ..providers.engine_onnx import ONNX
from ..providers.engine_wasm import WASM
from ..providers.engine_webllm import WEBLLM

#: Every engine of the page, in the order their built-in connections are listed.
ENGINE_SPECS: tuple[EngineSpec, ...] = (WASM, WEBLLM, ONNX)


class JsEngineModule:
    """`EngineBridge` over one engine's JS module namespace (module rules)."""

    def __init__(self, module: Any) -> None:
        self._module = module

    async def report(self, function: str) -> str:
        """The module's device report (a sync or async function returning JSON text)."""
        try:
            answer = getattr(self._module, function)()
            if not isinstance(answer, str):
                answer = await answer
            return str(answer)
        except JsException as exc:
            raise EngineBridgeError(function) from exc

    def is_loaded(self, key: str) -> bool:
        """The module's `isLoaded(key)`; False for a module without one."""
        check = getattr(self._module, "isLoaded", None)
        try:
            return check is not None and check(key) is True
        except JsException:
            return False

    async def load(self, function: str, key: str, args: Sequence[str]) -> str:
        """`function(key, *args)` of the module; its JSON text answer."""
        try:
            return str(await getattr(self._module, function)(key, *args))
        except JsException as exc:
            raise EngineBridgeError(function) from exc

    def start_chat(self, key: str, body: str, delay_ms: int) -> str:
        """`startChat(key, body, delay_ms)`; the stream id."""
        try:
            return str(self._module.startChat(key, body, delay_ms))
        except JsException as exc:
            raise EngineBridgeError("startChat") from exc

    async def next_chunks(self, stream_id: str) -> str:
        """`nextChunks(stream_id)`: the next batch as JSON text."""
        try:
            return str(await self._module.nextChunks(stream_id))
        except JsException as exc:
            raise EngineBridgeError("nextChunks") from exc

    def abort(self, stream_id: str) -> None:
        """`abort(stream_id)`."""
        try:
            self._module.abort(stream_id)
        except JsException as exc:
            raise EngineBridgeError("abort") from exc


#: path -> the bridge over its JS module, imported once (module rules).
_bridges: dict[str, JsEngineModule] = {}


async def open_bridge(path: str) -> EngineBridge:
    """The bridge to the JS module at `path` (relative to the shell page).

    Raises `EngineBridgeError` when the import fails (tried again next time).
    """
    bridge = _bridges.get(path)
    if bridge is None:
        url = urljoin(str(document.baseURI), path)
        try:
            module = await run_js(f"import({json.dumps(url)})")
        except JsException as exc:
            raise EngineBridgeError(path) from exc
        bridge = _bridges[path] = JsEngineModule(module)
    return bridge


def register_engines(engines: dict[str, Engine]) -> None:
    """Add an engine per spec of `ENGINE_SPECS` to `BrowserProviders.engines`."""
    for spec in ENGINE_SPECS:
        engines[spec.kind] = SpecEngine(spec, open_bridge)


__all__ = ["ENGINE_SPECS", "JsEngineModule", "open_bridge", "register_engines"]
