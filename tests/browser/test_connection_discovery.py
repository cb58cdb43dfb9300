"""Finding local model servers from the connections form, and what the consent dialog shows.

Real servers on 127.0.0.1: napllm-lmsp on TinyChat (started as in
test_lmsp_browser.py, CORS allowing the shell's origin) and small
OpenAI-compatible servers made here: one that allows the shell's origin, and
two that send no CORS headers (one of them with ``Cross-Origin-Resource-Policy:
cross-origin``, so the cross-origin isolated shell can reach it opaquely and
knows it refuses the page). The test build's ``probe=`` query points "Look
for running servers" at these ports instead of the usual ones.

Checked: the LMSP service asks for its token, then lists its model, and
picking it fills the form; the saved connection's route ends in the engine the
service names; a CORS refusal is explained with that server's own fix; the
consent dialog's route and model words for lmsp, openai (direct and behind a
proxy), wasm and scripted connections.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from shellpage import ShellPage, boot_shell, code, generate, user
from test_lmsp_browser import origin, start_service, stop

from napllm.kinds import model_display_name

pytestmark = [pytest.mark.browser, pytest.mark.service]

FAKE_MODEL = "Llama-3.2-1B-Instruct-Q4_K_M"


class FakeServer:
    """An OpenAI-compatible model listing on 127.0.0.1 (a thread; `GET /v1/models` only).

    `allow_origin`: the origin it answers CORS for (None: no CORS headers);
    `corp`: whether it sends `Cross-Origin-Resource-Policy: cross-origin`.
    """

    def __init__(self, allow_origin: str | None, corp: bool = False) -> None:
        self.requests: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                return

            def do_GET(self) -> None:
                outer.requests.append(self.path)
                body = json.dumps(
                    {"object": "list", "data": [{"id": FAKE_MODEL, "object": "model"}]}
                ).encode()
                self.send_response(200 if self.path == "/v1/models" else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                if allow_origin is not None:
                    self.send_header("Access-Control-Allow-Origin", allow_origin)
                if corp:
                    self.send_header("Cross-Origin-Resource-Policy", "cross-origin")
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory, dist_url: str) -> Iterator[Any]:
    handle = start_service(tmp_path_factory.mktemp("lmsp-discovery"), dist_url)
    yield handle
    stop(handle)


@pytest.fixture(scope="module")
def servers(dist_url: str) -> Iterator[dict[str, FakeServer]]:
    made = {
        "llamacpp": FakeServer(origin(dist_url)),
        "ollama": FakeServer(None),
        "lmstudio": FakeServer(None, corp=True),
    }
    yield made
    for server in made.values():
        server.close()


@pytest.fixture(scope="module")
def booted(
    shell_context: Any,
    dist_url: str,
    test_pages_dir: Path,
    service: Any,
    servers: dict[str, FakeServer],
) -> ShellPage:
    lmsp_port = urlsplit(service.base_url).port
    probe = ",".join([f"lmsp@{lmsp_port}"] + [f"{name}@{s.port}" for name, s in servers.items()])
    return boot_shell(shell_context.new_page(), dist_url, test_pages_dir, f"?test=1&probe={probe}")


def look(shell: ShellPage) -> Any:
    """Press "Look for running servers" and wait for the answer; returns the results."""
    page = shell.page
    page.click("#connection-discover")
    results = page.locator("#connection-discovery-results")
    results.locator(".discovery-summary").wait_for()
    return results


def server_entry(results: Any, server: str) -> Any:
    return results.locator(f".found-server[data-server='{server}']")


def save(shell: ShellPage, name: str) -> Any:
    page = shell.page
    page.click("#connection-save")
    page.locator("#connection-form").wait_for(state="hidden", timeout=30_000)
    item = page.locator("#connection-list li.connection", has_text=name)
    item.wait_for()
    return item


def ensure_lmsp(shell: ShellPage, service: Any) -> str:
    """The LMSP connection the first test adds, added here too when that test did not run."""
    name = f"{service.model_id} (napllm-lmsp)"
    page = shell.page
    if page.locator("#connection-list li.connection", has_text=name).count() == 0:
        page.click("#connection-add")
        page.select_option("#connection-kind", "lmsp")
        page.fill("#connection-name", name)
        page.fill("#connection-base-url", service.base_url)
        page.fill("#connection-model", service.model_id)
        page.fill("#connection-secret", service.token)
        save(shell, name)
    return name


def in_words(model: str) -> str:
    """What the consent dialog's Model line reads: the name in words, then the id."""
    name = model_display_name(model)
    return model if name == model else f"{name} (id {model})"


def test_finds_the_lmsp_service_and_fills_the_form(shell: ShellPage, service: Any) -> None:
    page = shell.page
    page.click("#connection-add")
    page.select_option("#connection-kind", "lmsp")
    results = look(shell)
    lmsp = server_entry(results, "lmsp")
    address = f"127.0.0.1:{urlsplit(service.base_url).port}"
    assert lmsp.locator("h4").inner_text() == f"napllm-lmsp at {address}"
    assert lmsp.get_attribute("data-status") == "needs-key"
    assert "access token" in lmsp.inner_text()
    # With the token typed in, the service lists its model; picking it fills the form.
    page.fill("#connection-secret", service.token)
    results = look(shell)
    lmsp = server_entry(results, "lmsp")
    assert lmsp.get_attribute("data-status") == "found"
    lmsp.locator("button.use-model", has_text=service.model_id).click()
    assert page.input_value("#connection-base-url") == f"http://{address}"
    assert page.input_value("#connection-model") == service.model_id
    name = page.input_value("#connection-name")
    assert name == f"{service.model_id} (napllm-lmsp)"
    item = save(shell, name)
    route = item.locator(".route").inner_text()
    assert route == f"Route: This browser → LMSP service at {address} → llama.cpp"


def test_explains_cors_refusals_with_each_servers_fix(
    shell: ShellPage, dist_url: str, servers: dict[str, FakeServer]
) -> None:
    page = shell.page
    page.click("#connection-add")
    page.select_option("#connection-kind", "openai")
    results = look(shell)
    page_origin = origin(dist_url)
    # LM Studio's stand-in answers without CORS: running, but refusing this page.
    studio = server_entry(results, "lmstudio")
    assert studio.get_attribute("data-status") == "cors"
    assert "does not accept requests from this page" in studio.inner_text()
    assert "lms server start --cors" in studio.locator(".fix").inner_text()
    assert studio.locator("button.use-model").count() == 0
    # Ollama's stand-in cannot even be reached opaquely from this cross-origin
    # isolated page: it is listed, collapsed, with the fix if it does run.
    unsure = results.locator("details.unreadable-servers")
    assert unsure.get_attribute("open") is None
    assert f"Ollama (127.0.0.1:{servers['ollama'].port})" in unsure.locator("summary").inner_text()
    fix = unsure.locator("li[data-server='ollama']").text_content() or ""
    assert f"OLLAMA_ORIGINS={page_origin} ollama serve" in fix
    # The model list the server sent never reached the page.
    assert FAKE_MODEL not in (studio.text_content() or "")
    assert "/v1/models" in servers["ollama"].requests
    page.keyboard.press("Escape")


def test_openai_server_found_and_every_kinds_route_in_the_consent_dialog(
    shell: ShellPage, servers: dict[str, FakeServer], service: Any
) -> None:
    page = shell.page
    port = servers["llamacpp"].port
    page.click("#connection-add")
    page.select_option("#connection-kind", "openai")
    found = server_entry(look(shell), "llamacpp")
    assert found.get_attribute("data-status") == "found"
    found.locator("button.use-model", has_text=FAKE_MODEL).click()
    assert page.input_value("#connection-base-url") == f"http://127.0.0.1:{port}/v1"
    page.fill("#connection-name", "Found llama")
    save(shell, "Found llama")
    # The same server behind a proxy the user names.
    page.click("#connection-add")
    page.select_option("#connection-kind", "openai")
    page.fill("#connection-name", "Via gateway")
    page.fill("#connection-base-url", f"http://127.0.0.1:{port}/v1")
    page.fill("#connection-forwards-to", "https://llm.example.org/v1")
    page.fill("#connection-model", FAKE_MODEL)
    save(shell, "Via gateway")
    page.click("#connection-add")
    page.select_option("#connection-kind", "scripted")
    page.fill("#connection-name", "Dev script")
    page.fill("#connection-script", '[{"text": "hi"}]')
    save(shell, "Dev script")
    lmsp = f"127.0.0.1:{urlsplit(service.base_url).port}"
    lmsp_name = ensure_lmsp(shell, service)
    expected = {
        "TinyChat (on this device)": (
            "This browser (WebAssembly, llama.cpp) on this device",
            "tinychat (id tinychat-q8_0)",
        ),
        "Found llama": (
            f"This browser → OpenAI-compatible server at 127.0.0.1:{port}",
            f"Llama 3.2 1B Instruct (id {FAKE_MODEL})",
        ),
        "Via gateway": (
            f"This browser → proxy at 127.0.0.1:{port}"
            " → OpenAI-compatible server at llm.example.org",
            f"Llama 3.2 1B Instruct (id {FAKE_MODEL})",
        ),
        "Dev script": (
            "This page (scripted responses: no model, nothing leaves the page)",
            "scripted",
        ),
        lmsp_name: (
            f"This browser → LMSP service at {lmsp} → llama.cpp",
            in_words(service.model_id),
        ),
    }
    before = len(servers["llamacpp"].requests)
    app = shell.open_napplet()
    for index, (name, (route, model)) in enumerate(expected.items()):
        handle = app.select(name, rid=f"s{index}")
        app.post(generate(f"g{index}", handle, user("Hello!")))
        dialog = shell.consent()
        facts = dict(
            zip(
                dialog.locator(".facts > dt").all_inner_texts(),
                dialog.locator(".facts > dd").all_inner_texts(),
                strict=True,
            )
        )
        assert facts["Route"] == route, name
        assert facts["Model"] == model, name
        assert "->" not in dialog.inner_text()
        shell.deny()
        assert code(app.wait_for(f"g{index}")) == "user-cancelled"
    # Denied: nothing was sent to the OpenAI-compatible server.
    assert servers["llamacpp"].requests[before:] == []
