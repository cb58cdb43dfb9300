"""One class per connection kind (providers/connection_kinds.py), under CPython.

Checked: every kind of the form has a class with the same methods; a kind
the table lacks gets no provider, no route and cannot be added; each class
adds its connection with its capabilities and the route its own `route`
words; the scripted provider is kept per revision.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from napllm.connections import ConnectionSpec
from napllm.errors import ProviderFailure
from napllm.kinds import KINDS
from napllm.providers.connection_kinds import (
    EngineKind,
    KindTable,
    LmspKind,
    product_kinds,
    route_for,
)
from napllm.providers.engine_onnx import ONNX
from napllm.providers.engine_wasm import WASM
from napllm.providers.engine_webllm import WEBLLM
from napllm.providers.http_httpx import HttpxPort
from napllm.providers.scripted import ScriptError
from napllm.records import Capabilities, Connection

SCRIPT = '{"capabilities": {"tools": true}, "turns": [{"text": "hi"}]}'


async def no_bridge(declaration: Any) -> Any:
    raise AssertionError("no engine host in this test")


def table(handler: Any = None) -> KindTable:
    async def refuse(request: httpx.Request) -> httpx.Response:
        return httpx.Response(404)

    client = httpx.AsyncClient(transport=httpx.MockTransport(handler or refuse))
    kinds = product_kinds(HttpxPort(client))
    for spec in (WASM, WEBLLM, ONNX):
        kinds.register(EngineKind(spec, no_bridge))
    return kinds


def test_every_kind_of_the_form_has_one_class_with_the_same_methods() -> None:
    kinds = table()
    assert sorted(k.info.kind for k in kinds) == sorted(k.kind for k in KINDS)
    for kind in kinds:
        for method in ("add", "provider", "default_connections", "route", "stored"):
            assert callable(getattr(kind, method)), (kind.info.kind, method)


async def test_a_kind_the_table_lacks_has_no_provider_no_route_and_cannot_be_added() -> None:
    kinds = KindTable()
    stray = Connection(id="c1", name="x", kind="lmsp", model="m", route="r")
    with pytest.raises(ProviderFailure):
        kinds.provider(stray)
    with pytest.raises(ValueError):
        kinds.route("lmsp", {})
    with pytest.raises(ValueError):
        kinds.kind("lmsp")
    with pytest.raises(ValueError):
        route_for("no-such-kind", {})


async def test_a_scripted_connection_takes_its_scripts_capabilities_and_fixed_route() -> None:
    kinds = table()
    spec = ConnectionSpec(name="S", kind="scripted", model="m", settings={"script": SCRIPT})
    connection = await kinds.kind("scripted").add(spec, "c1")
    assert connection.capabilities.tools and connection.settings["userDefined"] is True
    assert connection.route == route_for("scripted", {}) == kinds.route("scripted", {})
    provider = kinds.provider(connection)
    assert kinds.provider(connection) is provider  # one per revision
    edited = connection.model_copy(update={"revision": connection.revision + 1})
    assert kinds.provider(edited) is not provider
    bad = ConnectionSpec(name="S", kind="scripted", model="m", settings={"script": "{"})
    with pytest.raises(ScriptError):
        await kinds.kind("scripted").add(bad, "c2")


async def test_an_lmsp_connection_takes_capabilities_and_engine_from_the_listing() -> None:
    async def listing(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/lmsp/v1/models"
        entry = {"id": "tiny", "object": "model", "engine": "llama.cpp", "capabilities": {}}
        return httpx.Response(200, json={"object": "list", "data": [entry]})

    kinds = table(listing)
    base = {"baseUrl": "http://127.0.0.1:11435"}
    spec = ConnectionSpec(name="L", kind="lmsp", model="tiny", settings=base)
    connection = await kinds.kind("lmsp").add(spec, "c1")
    assert connection.route == "This browser → LMSP service at 127.0.0.1:11435 → llama.cpp"
    assert connection.route == LmspKind.route(connection.settings)
    missing = ConnectionSpec(name="L", kind="lmsp", model="other", settings=base)
    with pytest.raises(ProviderFailure):
        await kinds.kind("lmsp").add(missing, "c2")


async def test_an_engine_connection_is_added_with_its_rows_route() -> None:
    kinds = table()
    spec = ConnectionSpec(
        name="W", kind="wasm", model="m", settings={"url": "https://example.com/m.gguf"}
    )
    connection = await kinds.kind("wasm").add(spec, "c1")
    assert connection.route == "This browser (WebAssembly, llama.cpp) on this device"


def stored_record(kind: str, settings: dict[str, Any], model: str = "m") -> Connection:
    """A connection as storage hands it back: any settings, any route."""
    return Connection(
        id="c9", name="x", kind=kind, model=model, route="forged route",
        settings={"userDefined": True, **settings},
    )  # fmt: skip


@pytest.mark.parametrize(
    ("kind", "settings"),
    [
        ("lmsp", {}),  # no baseUrl: the provider read settings["baseUrl"] (KeyError)
        ("openai", {}),
        ("lmsp", {"baseUrl": 7}),
        ("openai", {"baseUrl": "ftp://host"}),
        ("scripted", {}),  # no script
        ("scripted", {"script": ["not", "text"]}),
    ],
)
def test_a_stored_record_its_form_would_refuse_is_unreadable(
    kind: str, settings: dict[str, Any]
) -> None:
    kinds = table()
    with pytest.raises(ValueError):
        kinds.kind(kind).stored(stored_record(kind, settings))


def test_a_stored_record_gets_its_route_and_derived_settings_again() -> None:
    kinds = table()
    base = {"baseUrl": "http://127.0.0.1:11435", "serviceEngine": "llama.cpp"}
    lmsp = kinds.kind("lmsp").stored(stored_record("lmsp", base))
    assert lmsp.route == "This browser → LMSP service at 127.0.0.1:11435 → llama.cpp"
    # An engine's settings are the spec's again: a stored ONNX source is not trusted.
    forged = {"source": "https://elsewhere.example/onnx/"}
    onnx = kinds.kind("onnx").stored(stored_record("onnx", forged, model="org/model"))
    assert onnx.settings["source"] != forged["source"]
    assert onnx.settings == ONNX.settings_for("org/model", {"userDefined": True})
    assert onnx.route == route_for("onnx", {})


def test_a_stored_server_record_without_its_url_fails_as_a_provider_not_a_crash() -> None:
    kinds = table()
    for kind in ("lmsp", "openai"):
        with pytest.raises(ProviderFailure):
            kinds.provider(stored_record(kind, {}))


def test_a_stored_claim_of_capabilities_is_derived_again() -> None:
    # Before, an engine or script record kept whatever capabilities storage
    # held: a GGUF connection could claim image input, a script tools.
    kinds = table()
    claimed = {"images": True, "tools": True, "toolChoiceModes": ["auto"]}
    wasm = stored_record("wasm", {"url": "https://example.com/m.gguf"})
    wasm = wasm.model_copy(update={"capabilities": wasm.capabilities.model_copy(update=claimed)})
    derived = kinds.kind("wasm").stored(wasm).capabilities
    assert derived == WASM.capabilities("m", {"url": "https://example.com/m.gguf"}, None)
    assert not derived.images
    plain = '{"capabilities": {"images": false, "tools": false}, "turns": [{"text": "hi"}]}'
    script = stored_record("scripted", {"script": plain})
    script = script.model_copy(
        update={"capabilities": script.capabilities.model_copy(update=claimed)}
    )
    caps = kinds.kind("scripted").stored(script).capabilities
    assert not caps.tools and not caps.images
    assert (
        kinds.kind("scripted")
        .stored(stored_record("scripted", {"script": SCRIPT}))
        .capabilities.tools
    )


@pytest.mark.parametrize(
    ("kind", "settings", "model"),
    [
        ("wasm", {"url": "ftp://example.com/m.gguf"}, "m"),  # the form refuses the URL
        ("wasm", {}, "m"),
        ("webllm", {}, "No-Such-Model-q4f16_1-MLC"),  # not in this device's list
        ("webllm", {}, "Llama-3.2-1B-Instruct-q4f16_1-MLC"),  # no device report yet
    ],
)
def test_a_stored_engine_model_its_engine_cannot_read_is_listed_unavailable(
    kind: str, settings: dict[str, Any], model: str
) -> None:
    # Listed (the user can see, edit or remove it), claiming nothing, never offered.
    read = table().kind(kind).stored(stored_record(kind, settings, model=model))
    assert read.available is False and read.unavailable_reason
    assert read.capabilities == Capabilities()


def test_a_stored_script_that_does_not_parse_is_unreadable() -> None:
    with pytest.raises(ValueError):
        table().kind("scripted").stored(stored_record("scripted", {"script": "{not json"}))
