"""A model server on 127.0.0.1 refused by the browser's local network permission.

When the shell is served from a public address (a GitHub Pages site) and the
model server listens on the user's machine, Chromium's Local Network Access
refuses the request until the user allows it for the site. Chromium is
launched with ``--ip-address-space-overrides=127.0.0.1:<shell port>=public``
so the locally served shell counts as public; an OpenAI-compatible fake
server on 127.0.0.1 stands for the user's model server. The napplet gets
``provider-error`` (no browser or server text); the shell tells the user what
to allow, not "check that it is running"; the refused request never reaches
the server.
"""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from shellpage import ShellPage, boot_shell, code, generate

from conftest import returning_visitors
from napllm.providers.base import LOCAL_NETWORK_HINT
from napllm.providers.openai_compat import UNREACHABLE_HINT

pytestmark = pytest.mark.browser

CONNECTION = "Model server on this machine"


class FakeServer(http.server.ThreadingHTTPServer):
    """An OpenAI-compatible server answering one short chat stream; records every hit."""

    hits: list[str]


class Handler(http.server.BaseHTTPRequestHandler):
    server: FakeServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _cors(self) -> None:
        self.send_header("Access-Control-Allow-Origin", "*")
        self.send_header("Access-Control-Allow-Headers", "*")
        self.send_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS")
        self.send_header("Access-Control-Allow-Private-Network", "true")

    def do_OPTIONS(self) -> None:
        self.server.hits.append(f"OPTIONS {self.path}")
        self.send_response(204)
        self._cors()
        self.end_headers()

    def do_POST(self) -> None:
        self.server.hits.append(f"POST {self.path}")
        length = int(self.headers.get("content-length", "0"))
        self.rfile.read(length)
        chunks = [
            {"choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": None}]},
            {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
        ]
        body = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
        data = body.encode()
        self.send_response(200)
        self._cors()
        self.send_header("content-type", "text/event-stream")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture(scope="module")
def model_server() -> Iterator[FakeServer]:
    server = FakeServer(("127.0.0.1", 0), Handler)
    server.hits = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def public_browser(
    browser_type: Any, browser_type_launch_args: dict[str, Any], dist_url: str
) -> Iterator[Any]:
    """Chromium for which the shell's own address is in the public address space."""
    port = urlsplit(dist_url).port
    override = f"--ip-address-space-overrides=127.0.0.1:{port}=public"
    args = [*browser_type_launch_args["args"], override]
    browser = browser_type.launch(**{**browser_type_launch_args, "args": args})
    yield returning_visitors(browser)
    browser.close()


@pytest.fixture(scope="module")
def context(public_browser: Any) -> Iterator[Any]:
    ctx = public_browser.new_context()
    yield ctx
    ctx.close()


def add_openai_connection(shell: ShellPage, base_url: str) -> None:
    page = shell.page
    page.click("#connection-add")
    form = page.locator("#connection-form")
    form.wait_for(state="visible")
    page.locator("#connection-name").press_sequentially(CONNECTION)
    page.select_option("#connection-kind", "openai")
    page.locator("#connection-base-url").press_sequentially(base_url)
    page.locator("#connection-model").press_sequentially("local-model")
    page.click("#connection-save")
    form.wait_for(state="hidden")


def test_local_network_refusal_tells_the_user_what_to_allow(
    context: Any,
    dist_url: str,
    test_pages_dir: Path,
    model_server: FakeServer,
    request_log: Any,
) -> None:
    shell = boot_shell(context.new_page(), dist_url, test_pages_dir)
    known = shell.page.evaluate(
        """async () => {
          for (const name of ['loopback-network', 'local-network', 'local-network-access']) {
            try { await navigator.permissions.query({name}); return true; } catch (e) {}
          }
          return false;
        }"""
    )
    if not known:
        pytest.skip("this Chromium has no Local Network Access permission")
    host, port = model_server.server_address[:2]
    add_openai_connection(shell, f"http://{host}:{port}")
    app = shell.open_napplet()
    handle = app.select(CONNECTION)
    app.post(generate("g1", handle))
    shell.allow()
    result = app.wait_for("g1")
    assert code(result) == "provider-error"
    assert "browser" not in json.dumps(result).lower()
    notice = shell.page.locator("#notice-list .notice.error", has_text="local network")
    notice.last.wait_for(state="visible")
    shown = shell.page.locator("#notice-list").inner_text()
    assert LOCAL_NETWORK_HINT.split(".")[0] in shown
    assert UNREACHABLE_HINT not in shown
    assert model_server.hits == []  # the browser refused before any byte left
