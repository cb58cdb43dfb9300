"""A napplet author's own server on 127.0.0.1 for the browser tests: it serves
the pages a test gives it and records every request that reaches it, so a
test can show that nothing a napplet tried got out (and, as a positive
control, that the shell page's own request does arrive).

`recording_host()` is a context manager yielding a `RecordingHost`; the
test modules wrap it in their own module-scoped fixtures.
"""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit


@dataclass
class RecordingHost:
    """What the server serves (`pages`, by path) and every request it saw
    (`hits`, as ``"METHOD /path?query"``); `url` ends with ``/``."""

    pages: dict[str, str] = field(default_factory=dict)
    hits: list[str] = field(default_factory=list)
    url: str = ""

    def page(self, path: str, html: str) -> str:
        """Serve `html` at `path`; returns its URL."""
        self.pages[path] = html
        return self.url + path.lstrip("/")

    def hits_for(self, prefix: str) -> list[str]:
        """The requests whose path starts with `prefix`, any method."""
        return [h for h in self.hits if h.split(" ", 1)[1].startswith(prefix)]


@contextmanager
def recording_host() -> Iterator[RecordingHost]:
    """Start a `RecordingHost` on a free port of 127.0.0.1; stopped on exit."""
    state = RecordingHost()

    class Handler(http.server.BaseHTTPRequestHandler):
        def answer(self) -> None:
            state.hits.append(f"{self.command} {self.path}")
            body = state.pages.get(unquote(urlsplit(self.path).path))
            self.send_response(200 if body is not None else 404)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            # Everything a page needs to load in the shell's frame (the shell is
            # cross-origin isolated) and to be fetched by it.
            self.send_header("Access-Control-Allow-Origin", "*")
            self.send_header("Cross-Origin-Resource-Policy", "cross-origin")
            self.send_header("Cross-Origin-Embedder-Policy", "require-corp")
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write((body or "").encode())

        do_GET = do_POST = answer

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.url = f"http://127.0.0.1:{server.server_address[1]}/"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
