"""Connection kinds (napllm.kinds): the catalogue the page renders and every route's words.

Each kind's route is checked word for word, since the consent dialog shows
exactly this text (NAP-LLM, Privacy: intermediaries and the destination).
"""

from __future__ import annotations

import pytest

from napllm.connection_records import Connection
from napllm.connections import ConnectionSpec, capabilities_for_spec
from napllm.kinds import (
    KINDS,
    KindInfo,
    catalogue,
    engine_words,
    host_of,
    model_display_name,
    model_id_shown,
)
from napllm.providers.connection_kinds import route_for
from napllm.shell import Disclosure, NappletIdentity

ROUTES = [
    (
        "lmsp",
        {"baseUrl": "http://127.0.0.1:11435"},
        "This browser → LMSP service at 127.0.0.1:11435",
    ),
    (
        "lmsp",
        {"baseUrl": "http://127.0.0.1:11435/lmsp/v1", "serviceEngine": "llama.cpp"},
        "This browser → LMSP service at 127.0.0.1:11435 → llama.cpp",
    ),
    (
        "openai",
        {"baseUrl": "http://localhost:11434/v1"},
        "This browser → OpenAI-compatible server at localhost:11434",
    ),
    (
        "openai",
        {"baseUrl": "http://127.0.0.1:4000/v1", "forwardsTo": "https://api.example.com/v1"},
        "This browser → proxy at 127.0.0.1:4000 → OpenAI-compatible server at api.example.com",
    ),
    (
        "openai",
        {"baseUrl": "https://gateway.example.net", "forwardsTo": "llm.example.org:8443"},
        "This browser → proxy at gateway.example.net"
        " → OpenAI-compatible server at llm.example.org:8443",
    ),
    (
        "wasm",
        {"url": "https://example.org/m.gguf"},
        "This browser (WebAssembly, llama.cpp) on this device",
    ),
    ("webllm", {}, "This browser (WebGPU, WebLLM) on this device"),
    ("onnx", {}, "This browser (WebGPU, transformers.js) on this device"),
    (
        "scripted",
        {"script": "[]"},
        "This page (scripted responses: no model, nothing leaves the page)",
    ),
]


@pytest.mark.parametrize(("kind", "settings", "route"), ROUTES)
def test_route_for_names_every_hop_in_words(
    kind: str, settings: dict[str, str], route: str
) -> None:
    assert route_for(kind, settings) == route
    assert "->" not in route


def test_every_product_kind_has_a_route_and_unknown_kinds_have_none() -> None:
    for info in KINDS:
        assert route_for(info.kind, {"baseUrl": "http://127.0.0.1:1"}).startswith("This ")
    for kind in ("fixture", "", "lmsp2"):
        with pytest.raises(ValueError, match="unknown"):
            route_for(kind, {})


def test_routes_never_carry_credentials_paths_or_queries() -> None:
    route = route_for("openai", {"baseUrl": "http://user:sk-live-pw@127.0.0.1:11434/v1?key=q#f"})
    assert route == "This browser → OpenAI-compatible server at 127.0.0.1:11434"
    proxy = route_for(
        "openai",
        {"baseUrl": "http://127.0.0.1:1/v1", "forwardsTo": "https://u:pw@up.example/x?k=1"},
    )
    assert proxy.endswith("OpenAI-compatible server at up.example")
    assert "pw" not in proxy and "k=1" not in proxy
    assert host_of("http://[::1]:8080/v1") == "[::1]:8080"
    assert host_of("not a url") == "an unknown address"


@pytest.mark.parametrize(
    "engine",
    ["llama.cpp → evil.example", "<img src=x>", "x" * 41, "", "  ", 7, None, ["llama.cpp"], "a\nb"],
)
def test_a_service_cannot_write_its_own_hops(engine: object) -> None:
    route = route_for("lmsp", {"baseUrl": "http://127.0.0.1:11435", "serviceEngine": engine})
    assert route == "This browser → LMSP service at 127.0.0.1:11435"
    assert engine_words(engine) is None


def test_catalogue_is_what_the_form_needs_and_fixtures_are_test_only() -> None:
    kinds = {k["kind"]: k for k in catalogue()}
    assert list(kinds) == ["lmsp", "openai", "wasm", "webllm", "onnx", "scripted"]
    assert kinds["lmsp"]["baseUrl"] and kinds["lmsp"]["secretLabel"] == "Access token"
    assert kinds["lmsp"]["discover"] and not kinds["lmsp"]["declareCapabilities"]
    openai = kinds["openai"]
    assert openai["secretLabel"] == "API key" and openai["declareCapabilities"]
    assert openai["askCharges"] and openai["forwardsTo"] and openai["discover"]
    assert kinds["wasm"]["modelUrl"] and not kinds["wasm"]["discover"]
    assert kinds["scripted"]["script"]
    assert kinds["webllm"]["needs"] == kinds["onnx"]["needs"] == "Needs a GPU with WebGPU"
    assert "chrome://flags/#enable-unsafe-webgpu" in kinds["webllm"]["needsHow"]
    assert all(k["needs"] is None for n, k in kinds.items() if n not in ("webllm", "onnx"))
    assert "fixture" not in kinds
    extra = KindInfo(kind="fixture", label="Test fixture", summary="s", test_only=True)
    assert catalogue((extra,))[-1] == {
        **catalogue((extra,))[-1],
        "kind": "fixture",
        "testOnly": True,
    }


def test_the_form_kinds_are_the_catalogue_kinds() -> None:
    form = {"name": "S", "model": "m", "settings": {"baseUrl": "http://h:1", "script": "[]"}}
    for info in KINDS:
        assert ConnectionSpec.model_validate({**form, "kind": info.kind}).kind == info.kind
    for other in ("fixture", "WASM", "nope", ""):
        with pytest.raises(ValueError):
            ConnectionSpec.model_validate({**form, "kind": other})
    spec = ConnectionSpec.model_validate(
        {
            "name": "S",
            "kind": "openai",
            "model": "m",
            "settings": {"baseUrl": "http://h:1"},
            "capabilities": {"json": True, "tools": True},
        }
    )
    caps = capabilities_for_spec(spec)
    assert (
        caps.tools
        and caps.json_output
        and caps.tool_choice_modes == ("auto", "none", "required", "tool")
    )


@pytest.mark.parametrize(
    ("model", "name"),
    [
        ("Llama-3.2-1B-Instruct-q4f16_1-MLC", "Llama 3.2 1B Instruct"),
        ("SmolLM2-360M-Instruct-Q4_K_M.gguf", "SmolLM2 360M Instruct"),
        ("onnx-community/Qwen2.5-0.5B-Instruct", "Qwen2.5 0.5B Instruct"),
        ("tinychat-q8_0", "tinychat"),
        ("llama3.2:1b", "llama3.2:1b"),
        ("q8", "q8"),
    ],
)
def test_model_display_names(model: str, name: str) -> None:
    assert model_display_name(model) == name


@pytest.mark.parametrize(("kind", "settings", "route"), ROUTES)
def test_the_consent_dialog_input_names_route_model_and_id(
    kind: str, settings: dict[str, str], route: str
) -> None:
    connection = Connection(
        id="c1",
        name="Mine",
        kind=kind,  # type: ignore[arg-type]
        model="Llama-3.2-1B-Instruct-q4f16_1-MLC",
        route=route_for(kind, settings),
        settings=settings,
    )
    disclosure = Disclosure(
        "ep", NappletIdentity("chat", "ab" * 32), connection, 1, 5, 0, [], [], "text", None
    )
    shown = disclosure.to_json()
    assert shown["route"] == route
    assert shown["modelName"] == "Llama 3.2 1B Instruct"
    assert shown["model"] == "Llama-3.2-1B-Instruct-q4f16_1-MLC"


@pytest.mark.parametrize(
    "address",
    [
        "http://a → b.example/v1",
        "http://evil\u202eexample.com:80/v1",
        "http://a b<img src=x>:8/",
        "http://exa\u200bmple.com/",
        "http://h%20x/",
    ],
)
def test_a_stored_address_cannot_write_hops_into_the_route(address: str) -> None:
    """Hosts of `baseUrl` and `forwardsTo` are shown only when they are host names or IPs."""
    assert host_of(address) == "an unknown address"
    direct = route_for("openai", {"baseUrl": address})
    assert direct == "This browser → OpenAI-compatible server at an unknown address"
    lmsp = route_for("lmsp", {"baseUrl": address})
    assert lmsp == "This browser → LMSP service at an unknown address"
    upstream = address.split("://", 1)[1]
    proxy = route_for("openai", {"baseUrl": "http://127.0.0.1:4000/v1", "forwardsTo": upstream})
    assert proxy == (
        "This browser → proxy at 127.0.0.1:4000 → OpenAI-compatible server at an unknown address"
    )


def test_international_hosts_are_shown_in_their_ascii_form() -> None:
    """A look-alike Unicode host is shown as the browser resolves it (punycode)."""
    assert host_of("https://bücher.example/v1") == "xn--bcher-kva.example"
    assert host_of("http://Localhost:11434") == "localhost:11434"
    assert host_of("http://[::1]:8080/v1") == "[::1]:8080"


UNSHOWABLE_IDS = [
    "gpt\u202e4o",  # right-to-left override
    "llama\u2066x\u2069",  # isolates
    "tiny\u200b",  # zero-width space
    "a\u2028b",  # line separator
    "c1\x85",  # C1 control
    "bom\ufeff",
    "tag\U000e0041",  # tag character
    "",
    "x" * 201,
    7,
]


@pytest.mark.parametrize("model", UNSHOWABLE_IDS)
def test_listed_model_ids_with_invisible_or_reordering_characters_are_not_shown(
    model: object,
) -> None:
    """A server's model id reaches dialogs only when every character is visible text."""
    assert not model_id_shown(model)


def test_plain_model_ids_are_shown() -> None:
    for model in ("llama3.2:1b", "Qwen/Qwen2.5-0.5B-Instruct", "<b>as text</b>", "modèle ü"):
        assert model_id_shown(model)


def test_the_kinds_are_named_once_and_the_table_has_a_row_for_each() -> None:
    from napllm.kinds import FORM_KINDS, FormKind
    from napllm.providers.engine_specs import ENGINE_SPECS

    assert tuple(k.kind for k in KINDS) == FORM_KINDS
    # The engines' rows are their specs' data, in the registry's order.
    engine_rows = [k for k in KINDS if k.kind in {s.kind for s in ENGINE_SPECS}]
    assert [k.kind for k in engine_rows] == [s.kind for s in ENGINE_SPECS]
    for row, spec in zip(engine_rows, ENGINE_SPECS, strict=True):
        assert row == KindInfo(kind=spec.kind, route_words=spec.route, **spec.form)
        assert route_for(spec.kind, {}) == spec.route
    # The form's spec takes its kinds from that one place.
    assert ConnectionSpec.model_fields["kind"].metadata == list(FormKind.__metadata__)
    # A record holds a plain name; a stored kind the table lacks has no route.
    with pytest.raises(ValueError):
        Connection(id="c", name="n", kind="<b>", model="m", route="r")
    with pytest.raises(ValueError):
        route_for("gone-engine", {})
