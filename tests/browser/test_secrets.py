"""Secrets given to a connection never show up anywhere but the request to its provider.

A canary string goes through the connections form twice: as user info in a
base URL (``http://user:CANARY@127.0.0.1:PORT/v1``), which the form refuses
with a message pointing to the token field, and as the API key of an
OpenAI-compatible connection whose server (127.0.0.1) rejects it and echoes
it back in its error body. The canary must reach the server in the
``Authorization`` header and nowhere else: not in the page (form errors,
notices, the connection list, the inspector, the dialogs), not in what the
napplet receives, not in a console line or page error.
"""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from shellpage import ShellPage, boot_shell, generate

pytestmark = pytest.mark.browser

CANARY = "CANARYs3cr3t-7f1d"
URL_CANARY = "URLCANARY-93ab"


class EchoingServer(http.server.BaseHTTPRequestHandler):
    """An OpenAI-compatible server that rejects every key and echoes it back."""

    seen: list[str]

    def _cors(self) -> None:
        self.send_header("Access-Control-Allow-Origin", "*")
        self.send_header("Access-Control-Allow-Headers", "authorization, content-type")
        self.send_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS")
        self.send_header("Cross-Origin-Resource-Policy", "cross-origin")

    def do_OPTIONS(self) -> None:
        self.send_response(204)
        self._cors()
        self.end_headers()

    def _reject(self) -> None:
        auth = self.headers.get("Authorization", "")
        self.seen.append(auth)
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        key = auth.removeprefix("Bearer ")
        error = {"message": f"Invalid API key: {auth} ({self.path})", "code": key, "type": key}
        body = json.dumps({"error": error}).encode()
        self.send_response(401)
        self._cors()
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = _reject
    do_POST = _reject

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def provider() -> Iterator[tuple[str, list[str]]]:
    seen: list[str] = []
    handler = type("Handler", (EchoingServer,), {"seen": seen})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def shell(page: Any, dist_url: str, test_pages_dir: Path) -> ShellPage:
    return boot_shell(page, dist_url, test_pages_dir)


def fill_openai_form(page: Any, name: str, base_url: str, key: str) -> None:
    if page.locator("#connection-form").is_hidden():
        page.click("#connection-add")
    page.fill("#connection-name", name)
    page.select_option("#connection-kind", "openai")
    page.fill("#connection-base-url", base_url)
    page.fill("#connection-model", "some-model")
    page.fill("#connection-secret", key)
    page.click("#connection-save")


def everything_shown(shell: ShellPage) -> str:
    """The page's DOM (dialogs, notices, panels, inspector) and visible text."""
    page = shell.page
    if not page.locator("details.inspector-wrap").evaluate("(d) => d.open"):
        page.click("#inspector-heading")
    page.wait_for_timeout(200)
    return page.content() + "\n" + page.evaluate("document.body.innerText")


def test_userinfo_in_a_base_url_is_refused_and_never_shown(
    shell: ShellPage, request_log: Any, provider: tuple[str, list[str]]
) -> None:
    base, seen = provider
    page = shell.page
    host = base.removeprefix("http://")
    fill_openai_form(page, "Leaky", f"http://user:{URL_CANARY}@{host}/v1", "")
    error = page.locator("#connection-form-error")
    page.wait_for_function("() => document.querySelector('#connection-form-error').textContent")
    assert "user name or password" in error.inner_text()
    assert "Access token / API key field" in error.inner_text()
    assert page.evaluate("document.activeElement.id") == "connection-secret"
    # A query is refused the same way (a key there is a secret too).
    fill_openai_form(page, "Leaky", f"{base}/v1?api_key={URL_CANARY}", "")
    page.wait_for_function(
        "() => document.querySelector('#connection-form-error').textContent.includes('query')"
    )
    assert page.locator("#connection-list li", has_text="Leaky").count() == 0
    assert seen == []
    shown = everything_shown(shell)
    assert URL_CANARY not in shown
    logs = request_log.console + request_log.page_errors + request_log.requests
    assert not [line for line in logs if URL_CANARY in line]


def test_a_rejected_token_appears_nowhere_but_in_the_request(
    shell: ShellPage, request_log: Any, provider: tuple[str, list[str]]
) -> None:
    base, seen = provider
    page = shell.page
    fill_openai_form(page, "Echoing server", f"{base}/v1", CANARY)
    item = page.locator("#connection-list > li", has_text="Echoing server")
    item.wait_for()
    assert "credential saved" in item.inner_text()
    napplet = shell.open_napplet()
    handle = napplet.select("Echoing server")
    napplet.post(generate("g1", handle))
    shell.allow()
    result = napplet.wait_for("g1")
    assert result["error"]["code"] in ("provider-error", "quota-exceeded")
    assert seen and all(auth == f"Bearer {CANARY}" for auth in seen)
    page.wait_for_function("() => document.querySelectorAll('#notice-list .notice').length > 0")
    received = json.dumps(napplet.envelopes())
    assert CANARY not in received
    shown = everything_shown(shell)
    assert CANARY not in shown
    logs = request_log.console + request_log.page_errors
    assert not [line for line in logs if CANARY in line]
