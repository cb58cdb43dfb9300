"""dist/ as a static site under a sub-path (``/some/prefix/``), with and without COOP/COEP.

Two servers stand in for static hosts such as GitHub Pages: build.py's own
handler (cross-origin isolation headers) and a plain
``http.server.SimpleHTTPRequestHandler`` that sends no special header at all
(only correct MIME types, as every static host does). In both, dist/ sits at
``/some/prefix/`` behind a symbolic link, exactly as copied files would. The
shell must boot, list the example napplets, answer through TinyChat, keep
every request under the prefix, and register its service worker with the
prefix as scope. Without COOP/COEP the page is not cross-origin isolated
(wllama then runs on one thread); everything else is the same.
"""

from __future__ import annotations

import functools
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from test_offline import EXAMPLES, HELLO_ANSWER, chat_hello, napplet_names, wait_boot

from napllm.devtools.headless import MIME_TYPES, make_server

pytestmark = pytest.mark.browser

PREFIX = "/some/prefix/"


class PlainHandler(http.server.SimpleHTTPRequestHandler):
    """A static file server with correct MIME types and no other header."""

    extensions_map = {  # noqa: RUF012 (typeshed declares it an instance attribute)
        **http.server.SimpleHTTPRequestHandler.extensions_map,
        **MIME_TYPES,
    }

    def log_message(self, format: str, *args: Any) -> None:
        pass


def serve_under_prefix(dist_dir: Path, root: Path, isolated: bool) -> Any:
    """A server whose ``/some/prefix/`` is dist/ (a symlink in an otherwise empty root)."""
    target = root / PREFIX.strip("/")
    target.parent.mkdir(parents=True)
    target.symlink_to(dist_dir.resolve(), target_is_directory=True)
    if isolated:
        return make_server(root, quiet=True)
    handler = functools.partial(PlainHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    return server


@pytest.fixture(params=["coop-coep", "plain"])
def site(
    request: pytest.FixtureRequest, dist_dir: Path, tmp_path: Path
) -> Iterator[tuple[str, bool]]:
    """The shell's URL under the prefix, and whether the server sends COOP/COEP."""
    server = serve_under_prefix(dist_dir, tmp_path / "root", request.param == "coop-coep")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}{PREFIX}"
        yield url, request.param == "coop-coep"
    finally:
        server.shutdown()
        server.server_close()


def test_dist_works_under_a_sub_path(page: Any, site: tuple[str, bool], request_log: Any) -> None:
    url, coop_coep = site
    page.set_default_timeout(60_000)
    page.goto(url)  # the folder itself: the server answers with index.html
    wait_boot(page)
    assert napplet_names(page) >= EXAMPLES
    assert HELLO_ANSWER in chat_hello(page)

    # Every request of the page stayed under the prefix (the browser's own
    # favicon probe at the origin's root is not the page's).
    paths = [urlsplit(u).path for u in request_log.requests if u.startswith("http")]
    outside = [p for p in paths if not p.startswith(PREFIX) and p != "/favicon.ico"]
    assert not outside, f"requests outside {PREFIX}: {outside}"
    errors = request_log.errors(ignore=lambda u: urlsplit(u).path == "/favicon.ico")
    assert not [e for e in errors if "ERR_ABORTED" not in e], errors

    # The service worker's scope is the prefix, and it takes control.
    page.wait_for_function("() => !!navigator.serviceWorker.controller", timeout=120_000)
    scope = page.evaluate("() => navigator.serviceWorker.getRegistration().then((r) => r.scope)")
    assert scope == url
    script = page.evaluate("() => navigator.serviceWorker.controller.scriptURL")
    assert script == url + "sw.js"

    # COOP/COEP decide cross-origin isolation (wllama threads), nothing else.
    assert page.evaluate("() => self.crossOriginIsolated") is coop_coep
