"""Looking for local model servers (napllm.discovery) against httpx mock servers.

Every answer is hostile: only bounded, printable model ids come back; each
failure is explained with that server's own fix.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from napllm.discovery import (
    MAX_LISTING_BYTES,
    MAX_MODELS,
    SERVERS,
    Target,
    default_targets,
    discover,
    plain_origin,
    secret_goes_to,
)
from napllm.providers.base import LOCAL_NETWORK_HINT, LocalNetworkBlocked
from napllm.providers.http_httpx import HttpxPort

ORIGIN = "http://127.0.0.1:8000"


def listing(*ids: Any) -> bytes:
    return json.dumps({"object": "list", "data": [{"id": i} for i in ids]}).encode()


class World:
    """Which addresses answer what; records every request and opaque probe."""

    def __init__(
        self, answers: dict[tuple[str, int], httpx.Response | str], *, isolated: bool = False
    ) -> None:
        self.answers = answers
        self.isolated = isolated
        self.requests: list[httpx.Request] = []
        self.opaque: list[str] = []

    def handler(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        answer = self.answers.get((request.url.host, request.url.port or 80))
        if answer is None or answer == "cors":
            raise httpx.ConnectError("refused")
        if answer == "blocked":
            raise LocalNetworkBlocked("blocked")
        assert isinstance(answer, httpx.Response)
        return answer

    async def reachable(self, url: str, timeout_s: float) -> bool | None:
        if self.isolated:  # a cross-origin isolated page cannot send opaque requests
            return None
        self.opaque.append(url)
        parsed = httpx.URL(url)
        return self.answers.get((parsed.host, parsed.port or 80)) == "cors"

    async def run(self, targets: list[Target] | None = None, **options: Any) -> dict[str, Any]:
        http = HttpxPort(httpx.AsyncClient(transport=httpx.MockTransport(self.handler)))
        found = await discover(
            http, targets or default_targets(), origin=ORIGIN, reachable=self.reachable, **options
        )
        return {f.info.server: f.to_json() for f in found}


def test_default_targets_are_the_usual_ports() -> None:
    assert [(t.server, t.host, t.port, t.fallback_host) for t in default_targets()] == [
        ("ollama", "127.0.0.1", 11434, "localhost"),
        ("llamacpp", "127.0.0.1", 8080, "localhost"),
        ("lmstudio", "127.0.0.1", 1234, "localhost"),
        ("lmsp", "127.0.0.1", 11435, "localhost"),
    ]


async def test_found_servers_list_their_models_and_fill_the_form() -> None:
    world = World(
        {
            ("127.0.0.1", 11434): httpx.Response(
                200, content=listing("llama3.2:1b", "qwen2.5:0.5b")
            ),
            ("localhost", 1234): httpx.Response(200, content=listing("lmstudio-model")),
            ("127.0.0.1", 11435): httpx.Response(200, content=listing("tinychat")),
        }
    )
    found = await world.run()
    assert found["ollama"] == {
        "server": "ollama",
        "label": "Ollama",
        "kind": "openai",
        "address": "127.0.0.1:11434",
        "baseUrl": "http://127.0.0.1:11434/v1",
        "status": "found",
        "models": ["llama3.2:1b", "qwen2.5:0.5b"],
        "fix": "",
    }
    assert found["lmstudio"]["address"] == "localhost:1234"  # tried again on localhost
    assert found["lmsp"]["baseUrl"] == "http://127.0.0.1:11435"
    assert found["lmsp"]["models"] == ["tinychat"]
    assert found["llamacpp"]["status"] == "absent" and found["llamacpp"]["models"] == []
    paths = {(r.url.port, r.url.path) for r in world.requests}
    assert (11435, "/lmsp/v1/models") in paths and (11434, "/v1/models") in paths
    assert all("authorization" not in r.headers for r in world.requests)


async def test_cors_refusals_get_each_servers_exact_fix() -> None:
    world = World({("127.0.0.1", s.port): "cors" for s in SERVERS})
    found = await world.run()
    assert {f["status"] for f in found.values()} == {"cors"}
    assert f"OLLAMA_ORIGINS={ORIGIN} ollama serve" in found["ollama"]["fix"]
    assert "lms server start --cors" in found["lmstudio"]["fix"]
    assert "Enable CORS" in found["lmstudio"]["fix"]
    assert f"--allow-origin {ORIGIN}" in found["lmsp"]["fix"]
    assert "llama-server -m MODEL.gguf --port 8080" in found["llamacpp"]["fix"]
    assert "--cors" not in found["llamacpp"]["fix"]  # llama-server has no such option
    assert len(world.opaque) == 4


async def test_an_isolated_page_says_what_to_change_if_the_server_runs() -> None:
    world = World(
        {
            ("127.0.0.1", 11434): "cors",
            ("127.0.0.1", 11435): httpx.Response(200, content=listing("tinychat")),
        },
        isolated=True,
    )
    found = await world.run()
    assert found["lmsp"]["status"] == "found"
    for server in ("ollama", "llamacpp", "lmstudio"):
        assert found[server]["status"] == "unreadable"
        assert found[server]["address"].startswith("127.0.0.1:")
    assert found["ollama"]["fix"].startswith("If Ollama runs there, it does not accept this page.")
    assert f"OLLAMA_ORIGINS={ORIGIN} ollama serve" in found["ollama"]["fix"]
    assert world.opaque == []


async def test_local_network_refusal_and_keys() -> None:
    world = World(
        {
            ("127.0.0.1", 11434): "blocked",
            ("127.0.0.1", 11435): httpx.Response(401, json={"code": "unauthorized"}),
            ("127.0.0.1", 8080): httpx.Response(200, text="<html>router login</html>"),
        }
    )
    found = await world.run()
    assert found["ollama"]["status"] == "blocked" and found["ollama"]["fix"] == LOCAL_NETWORK_HINT
    assert found["lmsp"]["status"] == "needs-key" and "access token" in found["lmsp"]["fix"]
    assert found["llamacpp"]["status"] == "not-a-model-server"


async def test_a_typed_secret_goes_only_to_servers_of_the_forms_kind() -> None:
    world = World(
        {
            ("127.0.0.1", 11434): httpx.Response(200, content=listing("a")),
            ("127.0.0.1", 11435): httpx.Response(200, content=listing("b")),
        }
    )
    kinds = {s.server: s.kind for s in SERVERS}
    await world.run(secret_for=lambda t: "tok-123" if kinds[t.server] == "lmsp" else None)
    sent = {r.url.port: r.headers.get("authorization") for r in world.requests}
    assert sent[11435] == "Bearer tok-123"
    assert sent[11434] is None and sent[8080] is None


@pytest.mark.parametrize(
    "content",
    [
        b"[1, 2]",
        b'{"data": "x"}',
        b'{"data": [], "data": []}',
        b"NaN",
        b"\xff\xfe",
        b"{" * 10_000,
        b'{"data": [' + b'{"id": "m"},' * (MAX_LISTING_BYTES // 12) + b'{"id": "z"}]}',
    ],
)
async def test_hostile_listings_are_not_model_servers(content: bytes) -> None:
    world = World({("127.0.0.1", 11434): httpx.Response(200, content=content)})
    found = await world.run([Target("ollama", "127.0.0.1", 11434)])
    assert found["ollama"]["status"] == "not-a-model-server"
    assert found["ollama"]["models"] == []


async def test_only_bounded_printable_ids_are_kept() -> None:
    ids = ["ok", "bad\nid", "x" * 201, "", 7, None, "ok", "<b>shown as text</b>"]
    ids += ["gpt\u202e4o", "tiny\u200b", "a\u2028b", "c1\x85", "bom\ufeff"]
    ids += [f"m{i}" for i in range(100)]
    world = World({("127.0.0.1", 11434): httpx.Response(200, content=listing(*ids))})
    found = await world.run([Target("ollama", "127.0.0.1", 11434)])
    models = found["ollama"]["models"]
    assert models[:3] == ["ok", "<b>shown as text</b>", "m0"]
    assert len(models) == MAX_MODELS


def test_only_plain_origins_appear_in_a_fix() -> None:
    assert plain_origin("https://napllm.example:8443") == "https://napllm.example:8443"
    for bad in ("null", "http://a b", "javascript:alert(1)", "http://x/$(rm -rf)", 5):
        assert plain_origin(bad) == "THIS_PAGE_ORIGIN"


async def test_an_address_without_fallback_is_asked_once() -> None:
    world = World({})
    found = await world.run([Target("ollama", "127.0.0.1", 5)])
    assert found["ollama"]["status"] == "absent"
    assert [(r.url.host, r.url.port) for r in world.requests] == [("127.0.0.1", 5)]


@pytest.mark.parametrize(
    ("base_url", "sent_to"),
    [
        ("", {11434, 8080, 1234}),
        ("   ", {11434, 8080, 1234}),
        ("https://api.openai.com/v1", set()),
        ("http://127.0.0.1:8080/v1", {8080}),
        ("http://localhost:1234/v1", set()),
        ("http://127.0.0.1/v1", set()),
        ("not a url", set()),
    ],
)
def test_a_typed_key_for_another_server_never_reaches_a_local_port(
    base_url: str, sent_to: set[int]
) -> None:
    """A key typed for the server in the form's base URL goes to that address only."""
    targets = [Target(s.server, "127.0.0.1", s.port) for s in SERVERS]
    got = {t.port for t in targets if secret_goes_to(t, "openai", base_url)}
    assert got == sent_to
    assert not any(secret_goes_to(t, "lmsp", base_url) and t.port != 11435 for t in targets)
    local = Target("llamacpp", "localhost", 1234)
    assert secret_goes_to(local, "openai", "http://localhost:1234/v1")
