"""The engine port: one provider for every engine that runs inside the page.

An engine is a library running a model in a worker of ours in the page
(wllama, WebLLM, transformers.js: web/engines/<name>-worker.js), reached
through the one page-side engine host (web/engines/engine-host.js), which
does every engine's model bookkeeping from the plain data the spec declares
(`EngineSpec.page`). Every engine speaks OpenAI chat completions, so the
Python side of all of them is the same provider (`EngineProvider`); what
differs is data and pure functions, one `EngineSpec` per engine
(`providers.engine_wasm`, `providers.engine_webllm`,
`providers.engine_onnx`). Nothing here imports `js`: the engine host is
reached through the `EngineBridge` port (`browser.engines.JsEngineModule` in
the page, stand-ins in the unit tests), so all of it runs under CPython.

Rules (docs/design.md, "The data path" and "Adding an engine"; LMSP 6.1, 6.3)
- A submission runs: the engine's host (opened once), the device
  report if the spec wants it before a chat and it was not read yet
  (`EngineSpec.report_before_chat`), the spec's blocker (a failure kind
  decided from the device alone, before any download), the model load
  (once per key: `EngineSpec.load_call`, the load fields the worker takes;
  skipped when `is_loaded(key)`),
  the chat body (`EngineSpec.chat_body`), the stream, read in batches
  (`read_stream`) and mapped by the spec's `chat_stream.ChatStreamToLmsp`
  (`EngineSpec.chunk_mapping`).
- Everything crossing the bridge is JSON text or a plain string; every
  text is read by `jsontext` before use. A malformed batch or load answer
  is `provider-error`.
- Failures are kinds reported by the JS side, never its text: one rule for
  every engine (`engine_failure`): a fixed user hint from the spec's
  table (`ENGINE_HINTS` plus the engine's own wording), `quota-exceeded`
  for `context` (the conversation is longer than the context window),
  `provider-error` for every other kind; an unknown kind is `unknown`.
- Cancellation is task cancellation: the stream's iterator is closed and
  its `finally` aborts the JS stream unless it was read to its end.
- `delay_ms` of an engine (0 in the product) is a delivery delay the JS
  side waits between chunks; only the test build sets it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from contextlib import aclosing
from types import MappingProxyType
from typing import Any, Protocol

from ..errors import ErrorCode, ProviderFailure
from ..jsontext import read_json, read_stream_payload
from ..lmsp import LmspEvent, LmspRequest
from ..records import Capabilities, Connection
from .base import Provider
from .chat_stream import ChatStreamToLmsp

log = logging.getLogger("napllm.engine")

# --------------------------------------------------------------------------
# Failures (one rule for every engine)

#: User hints for the shell UI, by error kind (never sent to a napplet), in
#: words that fit every engine; a spec words some kinds its own way
#: (`EngineSpec.hints`: the GGUF file, WebLLM's model host, ONNX files).
ENGINE_HINTS: dict[str, str] = {
    "download": "The model file could not be downloaded.",
    "load": (
        "The model file could not be loaded; it may be corrupt or not a model this engine runs."
    ),
    "webgpu": "WebGPU is not available in this browser, so this model cannot run here.",
    "feature": "This GPU lacks a WebGPU feature the model needs.",
    "device": "This model needs more GPU memory or buffer space than this device offers.",
    "network": (
        "The model could not be fetched; it needs its model host "
        "(or its files already in the browser's storage)."
    ),
    "storage": "The browser ran out of storage space for the model.",
    "stalled": "The engine or the model host stopped answering; try again.",
    "context": "The conversation is longer than the model's context window.",
    "inference": "The model failed while generating.",
    "unloaded": (
        "The model was unloaded while it was generating (another model was loaded in its place)."
    ),
    "busy": "The engine is still busy with another request.",
    "unknown": "The in-browser engine failed.",
}


def engine_failure(
    kind: object, engine: str, hints: Mapping[str, str] = ENGINE_HINTS
) -> ProviderFailure:
    """A `ProviderFailure` for an engine error `kind` (module rules).

    `engine`: the engine's kind, kept in the developer detail; `hints`: the
    engine's table (`EngineSpec.hints`). `context` is `quota-exceeded`,
    every other kind `provider-error`; a kind missing from `hints` (or not
    a string) is `unknown`. The JS error text is never used.
    """
    key = kind if isinstance(kind, str) and kind in hints else "unknown"
    code = ErrorCode.QUOTA_EXCEEDED if key == "context" else ErrorCode.PROVIDER_ERROR
    return ProviderFailure(code, user_hint=hints[key], detail=f"{engine}: {key}")


# --------------------------------------------------------------------------
# WebGPU, as the engines on the GPU report it

NO_WEBGPU = "WebGPU is not available in this browser (no GPU adapter)."
#: The form's words for an engine on the GPU (`EngineSpec.form`'s `needs`, `needs_how`).
WEBGPU_NEEDS = "Needs a GPU with WebGPU"
WEBGPU_HOW = (
    "Open this page in a browser with WebGPU turned on, on a device with a GPU: "
    "a recent Chrome or Edge on Windows, macOS or ChromeOS, or Safari 26 or later. "
    "On Linux, Chrome may need WebGPU enabled at chrome://flags/#enable-unsafe-webgpu. "
    "Until then, use the built-in WebAssembly model or add a connection to a model "
    "server on this computer."
)

#: The WebGPU probes' reason codes (web/engines/gpu.js) -> user-facing text.
NO_ADAPTER_REASONS: dict[str, str] = {
    "no-webgpu": "WebGPU is not available in this browser.",
    "no-adapter": NO_WEBGPU,
    "timeout": "WebGPU is not available: GPU detection did not answer in time.",
}


def no_adapter_reason(code: object) -> str:
    """The sentence for a probe's reason code; anything unknown is `NO_WEBGPU`."""
    return NO_ADAPTER_REASONS.get(code, NO_WEBGPU) if isinstance(code, str) else NO_WEBGPU


# --------------------------------------------------------------------------
# The ports


class EngineBridgeError(Exception):
    """The engine's page side failed a call (its text is not kept)."""


class EngineBridge(Protocol):
    """An engine's host in the page as the provider sees it (web/engines/engine-host.js).

    Every method raises `EngineBridgeError` when the JS call fails.
    Arguments and answers are plain strings (JSON text where structured).
    """

    async def report(self) -> str:
        """The device report the spec's declaration names (`page["report"]`), as JSON text."""
        ...

    def is_loaded(self, key: str) -> bool:
        """Whether the model of `key` is loaded (False when the module cannot tell)."""
        ...

    async def load(self, key: str, fields: str, connection_id: str, label: str) -> str:
        """Load the model of `key` with the worker's load `fields` (a JSON
        object); `connection_id` and `label` name it in progress reports.
        JSON text `{"ok": true, ...}` or `{"ok": false, "kind"}`."""
        ...

    def start_chat(self, key: str, body: str, delay_ms: int) -> str:
        """Start a streamed chat with the JSON `body`; returns the stream id."""
        ...

    async def next_chunks(self, stream_id: str) -> str:
        """The next batch of the stream: JSON text `{"chunks": [...],
        "done": bool, "error": null | {"kind": text}}` (web/engines/streams.js)."""
        ...

    def abort(self, stream_id: str) -> None:
        """Stop the stream and forget it."""
        ...


#: Opens an engine's host in the page by the spec's declaration (`EngineSpec.page`).
BridgeOpener = Callable[[Mapping[str, Any]], Awaitable[EngineBridge]]


class EngineSpec(Protocol):
    """What makes one engine itself: data and pure functions (module rules).

    `device` is the spec's own record of what the page reported
    (`read_device`), or None while nothing was reported yet.
    """

    #: The `Connection.kind` (the registry `providers.engine_specs` makes it a
    #: kind of the connections form, `kinds.FormKind`).
    kind: str
    #: The kind's row of the connections form (`kinds.KindInfo`'s fields but
    #: `kind`, plain data): `label`, `summary`, `model_url`, `model_hint`,
    #: `needs`, `needs_how`. `kinds.py` builds the engine rows from it.
    form: Mapping[str, Any]
    #: The route of every connection of the engine, in words (`kinds.route_for`;
    #: NAP-LLM, Privacy): the engine runs in this browser, so one hop.
    route: str
    #: The declaration the page's engine host works from (plain JSON data;
    #: web/engines/engine-host.js lists the fields): `kind`, `worker` (the
    #: worker's URL relative to the shell's folder, dist/), `workers` (`shared` or
    #: `per-model`), `oneModel`, `report` (`environment`, `webgpu` or
    #: `adapter`), `urlFields`, `room`, `progressVerb`, `adapter`; and for the
    #: build, the storage panel and the service worker (`engine_specs.page_declarations`):
    #: `caches` (Cache Storage name -> the words the storage panel shows),
    #: `lazy` (folders of dist/ the service worker keeps once fetched, not precached).
    page: Mapping[str, Any]
    #: What the build makes of the engine (plain JSON data, checked by
    #: `engine_specs.build_declarations`; `{}`: nothing, a worker of web/
    #: only): `bundles` (`[{entry, output}]`: esbuild entries of
    #: web/vendor-entry/ and their bundles in dist/), `packages` (the npm
    #: packages of its library, whose versions build-info.json records),
    #: `vendor` (`[{from, to}]`: files of node_modules/ copied into dist/),
    #: `models` (`[{source, dest, files}]`: a built-in model's folder of
    #: models/, checked against its SHA256SUMS, and where it goes in dist/),
    #: `catalog` (`{bundle, exports, file, make}`: a JSON file made from the
    #: library's exports by a function of the spec's module) and `test`
    #: (`{replace, add}`: the test build's hooks of tests/hooks/).
    build: Mapping[str, Any]
    #: Read the report when the shell starts (for the built-in connections).
    report_at_start: bool
    #: Read the report before the first chat, if not read yet.
    report_before_chat: bool
    #: The failure kind when the load call itself fails.
    load_error: str
    #: User hints by failure kind (`ENGINE_HINTS` with the engine's wording).
    hints: Mapping[str, str]

    def read_device(self, report: object) -> Any:
        """The device record from the parsed report (None or malformed: "unknown")."""
        ...

    def built_in(self, device: Any) -> list[Connection]:
        """The engine's built-in connections on this device."""
        ...

    def capabilities(self, model: str, settings: Mapping[str, Any], device: Any) -> Capabilities:
        """A user-chosen model's capabilities; `ValueError` for a model it cannot name."""
        ...

    def unavailable_reason(self, model: str, device: Any) -> str | None:
        """Why `model` cannot run on this device (a sentence), or None."""
        ...

    def settings_for(self, model: str, settings: Mapping[str, Any]) -> dict[str, Any]:
        """A user connection's settings as stored: what the form sent, with
        whatever the spec resolves from the model once (so the page reads the
        result, never a copy of the rule). `ValueError` for a model it cannot name."""
        ...

    def blocker(self, model: str, device: Any) -> str | None:
        """The failure kind that stops `model` before any download, or None."""
        ...

    def load_call(self, connection: Connection, device: Any) -> tuple[str, dict[str, Any]]:
        """The model key and the fields of the worker's `load` message (JSON data).

        Raises `ValueError` when the connection names no usable model.
        """
        ...

    def chat_body(self, request: LmspRequest) -> dict[str, Any]:
        """The streamed OpenAI chat body the engine takes (LMSP 6.1)."""
        ...

    def chunk_mapping(self, request: LmspRequest, body: Mapping[str, Any]) -> ChatStreamToLmsp:
        """A fresh `chat_stream.ChatStreamToLmsp` for one chat's chunks (`body` was sent)."""
        ...


class SpecDefaults:
    """The `EngineSpec` settings most engines share; a spec overrides what differs."""

    build: Mapping[str, Any] = MappingProxyType({})
    report_at_start = False
    report_before_chat = True
    load_error = "load"
    hints: Mapping[str, str] = ENGINE_HINTS

    def settings_for(self, model: str, settings: Mapping[str, Any]) -> dict[str, Any]:
        """The form's settings unchanged (`EngineSpec.settings_for`)."""
        return dict(settings)


def builtin_connection(
    spec: EngineSpec,
    ids: tuple[str, str, str],
    capabilities: Capabilities,
    settings: Mapping[str, Any],
    unavailable_reason: str | None = None,
) -> Connection:
    """A built-in connection of `spec`'s engine: `ids` is (id, name, model).

    Marked `builtin` in its settings; its route is the spec's (`EngineSpec.route`);
    available unless `unavailable_reason`.
    """
    connection_id, name, model = ids
    return Connection(
        id=connection_id,
        name=name,
        kind=spec.kind,
        model=model,
        route=spec.route,
        capabilities=capabilities,
        settings={**settings, "builtin": True},
        available=unavailable_reason is None,
        unavailable_reason=unavailable_reason,
    )


class Engine(Protocol):
    """An engine as its connection kind uses it (`connection_kinds.EngineKind`)."""

    kind: str
    #: Delivery delay between chunks (module rules); 0 in the product.
    delay_ms: int

    async def default_connections(self) -> list[Connection]:
        """The engine's built-in connections (unavailable ones say why)."""
        ...

    def capabilities_for(self, model: str, settings: Mapping[str, Any]) -> Capabilities:
        """A user-chosen model's capabilities; `ValueError` when it names none."""
        ...

    def unavailable_reason(self, model: str) -> str | None:
        """Why `model` cannot run on this device, or None."""
        ...

    def settings_for(self, model: str, settings: Mapping[str, Any]) -> dict[str, Any]:
        """A user connection's settings as stored (`EngineSpec.settings_for`)."""
        ...

    def provider_for(self, connection: Connection) -> Provider:
        """The provider for one of the engine's connections."""
        ...


# --------------------------------------------------------------------------
# The one engine and the one provider


class SpecEngine:
    """The `Engine` for one spec, reaching its page-side host through `open_bridge`.

    Holds what the page reported about the device (`device`, read once).
    """

    def __init__(self, spec: EngineSpec, open_bridge: BridgeOpener) -> None:
        self.spec = spec
        self.kind = spec.kind
        self.delay_ms = 0
        self._open_bridge = open_bridge
        #: The spec's device record; None until the page reported.
        self.device: Any = None
        self._reported = False

    async def bridge(self) -> EngineBridge:
        """The engine's host in the page; `EngineBridgeError` when it cannot be opened."""
        return await self._open_bridge(self.spec.page)

    async def read_report(self, bridge: EngineBridge) -> Any:
        """Read the device report once; an unreadable one reads as "unknown"."""
        if not self._reported:
            try:
                report = read_json(await bridge.report())
            except (EngineBridgeError, ValueError):
                log.warning("%s: the device report could not be read", self.kind)
                report = None
            self.device = self.spec.read_device(report)
            self._reported = True
        return self.device

    async def default_connections(self) -> list[Connection]:
        """The spec's built-in connections (after the device report, if it wants one)."""
        if self.spec.report_at_start:
            try:
                bridge = await self.bridge()
            except EngineBridgeError:
                log.warning("%s: the engine host could not be opened", self.kind)
                return []
            await self.read_report(bridge)
        return self.spec.built_in(self.device)

    def capabilities_for(self, model: str, settings: Mapping[str, Any]) -> Capabilities:
        """A user-chosen model's capabilities (`EngineSpec.capabilities`)."""
        return self.spec.capabilities(model, settings, self.device)

    def unavailable_reason(self, model: str) -> str | None:
        """Why `model` cannot run here (`EngineSpec.unavailable_reason`)."""
        return self.spec.unavailable_reason(model, self.device)

    def settings_for(self, model: str, settings: Mapping[str, Any]) -> dict[str, Any]:
        """A user connection's settings as stored (`EngineSpec.settings_for`)."""
        return self.spec.settings_for(model, settings)

    def provider_for(self, connection: Connection) -> Provider:
        """An `EngineProvider` for `connection`."""
        return EngineProvider(self, connection)

    def failure(self, kind: object) -> ProviderFailure:
        """`engine_failure` with this engine's hints."""
        return engine_failure(kind, self.kind, self.spec.hints)

    async def ensure_model(self, bridge: EngineBridge, connection: Connection) -> str:
        """Load the connection's model (once); returns its key. Raises `ProviderFailure`."""
        spec = self.spec
        try:
            key, fields = spec.load_call(connection, self.device)
        except ValueError as exc:
            raise self.failure("load") from exc
        if bridge.is_loaded(key):
            return key  # no promise to await: this is on every request's path
        try:
            answer = await bridge.load(key, json.dumps(fields), connection.id, connection.name)
            result = read_json(answer)
        except (EngineBridgeError, ValueError) as exc:
            raise self.failure(spec.load_error) from exc
        if not isinstance(result, dict) or result.get("ok") is not True:
            raise self.failure(result.get("kind") if isinstance(result, dict) else None)
        return key


class EngineProvider:
    """`Provider` for one connection of an in-browser engine (module rules)."""

    def __init__(self, engine: SpecEngine, connection: Connection) -> None:
        self._engine = engine
        self._connection = connection

    def respond(self, request: LmspRequest) -> AsyncIterator[LmspEvent]:
        """Stream one chat completion as LMSP events (6.3). Raises `ProviderFailure`."""
        return self._respond(request)

    async def _respond(self, request: LmspRequest) -> AsyncIterator[LmspEvent]:
        engine, spec, connection = self._engine, self._engine.spec, self._connection
        try:
            bridge = await engine.bridge()
        except EngineBridgeError as exc:
            raise engine.failure("unknown") from exc
        if spec.report_before_chat:
            await engine.read_report(bridge)
        blocker = spec.blocker(connection.model, engine.device)
        if blocker is not None:
            raise engine.failure(blocker)
        key = await engine.ensure_model(bridge, connection)
        body = spec.chat_body(request)
        state = spec.chunk_mapping(request, body)
        try:
            stream_id = bridge.start_chat(key, json.dumps(body), engine.delay_ms)
        except EngineBridgeError as exc:
            raise engine.failure("inference") from exc
        # Closed with this generator, so a cancelled chat aborts its JS stream at once.
        events = read_stream(bridge, stream_id, state, engine.kind, spec.hints)
        async with aclosing(events):
            async for event in events:
                yield event


async def read_stream(
    bridge: EngineBridge,
    stream_id: str,
    state: ChatStreamToLmsp,
    engine: str,
    hints: Mapping[str, str] = ENGINE_HINTS,
) -> AsyncGenerator[LmspEvent, None]:
    """LMSP events of the stream `stream_id`, read batch by batch.

    Aborts the stream unless it was read to its end (cancellation, a
    failure). Raises `ProviderFailure` for an engine error (with `hints`)
    or a malformed batch.
    """
    finished = False
    try:
        while True:
            try:
                batch = read_stream_payload(await bridge.next_chunks(stream_id))
            except (ValueError, EngineBridgeError) as exc:
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
                    raise engine_failure(error.get("kind"), engine, hints)
                break
        finished = True
        for event in state.finish():
            yield event
    finally:
        if not finished:
            try:
                bridge.abort(stream_id)
            except EngineBridgeError:
                log.warning("%s: the stream could not be aborted", engine)
