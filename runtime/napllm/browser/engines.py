"""The engine bridge in the page: each engine's host behind `EngineBridge`.

Every engine's provider is `providers.engine.EngineProvider`, driven by the
engine's spec (`providers.engine_specs.ENGINE_SPECS`, the one registry);
this module only reaches the page's one engine host (web/engines/engine-host.js).

Rules (docs/design.md, "The data path", "Known behaviours" and "Adding an
engine"; providers/engine.py)
- The engine host is a JS module under web/engines/ (copied to
  dist/engines/), imported with a dynamic `import()` of an absolute URL
  built from the page's base URL, so the shell works under any sub-path.
  Each engine's host is opened once with its spec's declaration
  (`EngineSpec.page`, as JSON) and kept for the page's lifetime: a request
  then makes no `import()` and no event-loop turn for it. Beyond those few
  hosts Python holds no JS object longer than one call.
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
from collections.abc import Mapping
from typing import Any
from urllib.parse import urljoin

from js import document  # type: ignore[import-not-found]
from pyodide.code import run_js  # type: ignore[import-not-found]
from pyodide.ffi import JsException  # type: ignore[import-not-found]

from ..providers.connection_kinds import EngineKind, KindTable
from ..providers.engine import EngineBridge, EngineBridgeError
from ..providers.engine_specs import ENGINE_SPECS

#: The page's one engine host, relative to the shell page.
ENGINE_HOST = "engines/engine-host.js"


class JsEngineModule:
    """`EngineBridge` over one engine's host object in the page (module rules)."""

    def __init__(self, module: Any) -> None:
        self._module = module

    async def report(self) -> str:
        """The host's device report (JSON text)."""
        try:
            return str(await self._module.report())
        except JsException as exc:
            raise EngineBridgeError("report") from exc

    def is_loaded(self, key: str) -> bool:
        """The host's `isLoaded(key)`."""
        try:
            return self._module.isLoaded(key) is True
        except JsException:
            return False

    async def load(self, key: str, fields: str, connection_id: str, label: str) -> str:
        """`ensureModel(key, fields, connection_id, label)`; its JSON text answer."""
        try:
            return str(await self._module.ensureModel(key, fields, connection_id, label))
        except JsException as exc:
            raise EngineBridgeError("ensureModel") from exc

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


#: engine kind -> the bridge over its host, opened once (module rules).
_bridges: dict[str, JsEngineModule] = {}


async def open_bridge(declaration: Mapping[str, Any]) -> EngineBridge:
    """The bridge to the engine host of `declaration` (`EngineSpec.page`).

    Raises `EngineBridgeError` when the import fails (tried again next time).
    """
    kind = str(declaration["kind"])
    bridge = _bridges.get(kind)
    if bridge is None:
        url = urljoin(str(document.baseURI), ENGINE_HOST)
        try:
            module = await run_js(f"import({json.dumps(url)})")
            host = module.hostFor(json.dumps(dict(declaration)))
        except JsException as exc:
            raise EngineBridgeError(ENGINE_HOST) from exc
        bridge = _bridges[kind] = JsEngineModule(host)
    return bridge


def register_engines(kinds: KindTable) -> None:
    """Add an `EngineKind` per spec of `ENGINE_SPECS` to the page's kinds."""
    for spec in ENGINE_SPECS:
        kinds.register(EngineKind(spec, open_bridge))


__all__ = ["ENGINE_HOST", "JsEngineModule", "open_bridge", "register_engines"]
