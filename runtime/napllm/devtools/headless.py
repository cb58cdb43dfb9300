"""Serving dist/ with the shell's headers, and launching Chromium the project's way.

One module for what `build.py serve`, the browser tests, the benchmarks,
tools/screenshots.py and `napllm-check` all need (CPython only, standard
library only, so build.py can use it before anything is installed).

Rules
- dist/ is served with cross-origin isolation (`Cross-Origin-Opener-Policy:
  same-origin`, `Cross-Origin-Embedder-Policy: require-corp`), every
  response `Cross-Origin-Resource-Policy: same-origin` and `Cache-Control:
  no-cache`, and exact MIME types (`MIME_TYPES`: module scripts, wasm, the
  manifest). Extra folders may be served under URL prefixes (`overlays`,
  e.g. `/_test/` for pages that exist only for tests); a request cannot
  climb out of dist/ or out of an overlay folder.
- Chromium is Debian's (`/usr/bin/chromium`, or `$NAPLLM_CHROMIUM`), never a
  downloaded browser, launched headless with `CHROMIUM_ARGS`: background
  services off, and every host name but 127.0.0.1 unresolvable, so nothing
  inside the browser reaches the network. WebGPU needs `WEBGPU_ARGS` on top
  (Chromium's software adapter where there is no GPU).
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import os
import sys
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

#: Debian's Chromium, or the one `$NAPLLM_CHROMIUM` names.
CHROMIUM = os.environ.get("NAPLLM_CHROMIUM", "/usr/bin/chromium")

#: Flags that keep headless Chromium off the network (module rules).
CHROMIUM_ARGS: tuple[str, ...] = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
)
#: Added to `CHROMIUM_ARGS` for WebGPU.
WEBGPU_ARGS: tuple[str, ...] = ("--enable-unsafe-webgpu",)


def launch_options(*, webgpu: bool = False, **extra: Any) -> dict[str, Any]:
    """Keyword arguments for Playwright's `chromium.launch` (module rules).

    `{"executable_path": CHROMIUM, "args": [...CHROMIUM_ARGS (+ WEBGPU_ARGS)]}`
    plus `extra` (for example `headless=True`).
    """
    args = [*CHROMIUM_ARGS, *(WEBGPU_ARGS if webgpu else ())]
    return {"executable_path": CHROMIUM, "args": args, **extra}


#: The headers every response of the shell's server carries (module rules).
SHELL_HEADERS: tuple[tuple[str, str], ...] = (
    ("Cross-Origin-Opener-Policy", "same-origin"),
    ("Cross-Origin-Embedder-Policy", "require-corp"),
    ("Cross-Origin-Resource-Policy", "same-origin"),
    ("Cache-Control", "no-cache"),
)

#: Exact MIME types by file suffix (module scripts and wasm need theirs).
MIME_TYPES = {
    ".wasm": "application/wasm",
    ".js": "text/javascript",
    ".mjs": "text/javascript",
    ".json": "application/json",
    ".webmanifest": "application/manifest+json",
    ".whl": "application/octet-stream",
    ".gguf": "application/octet-stream",
    ".onnx": "application/octet-stream",
    ".zip": "application/zip",
    ".css": "text/css",
    ".html": "text/html",
    ".svg": "image/svg+xml",
}


class DistRequestHandler(http.server.SimpleHTTPRequestHandler):
    """Static file handler for dist/ with `SHELL_HEADERS` and `MIME_TYPES`.

    Set the class attribute `quiet` to silence the access log (errors are
    still printed), and `overlays` to serve extra folders under URL
    prefixes (`{"/_test/": "<a folder>"}`: pages one level below dist/'s
    root without being part of it; a request cannot climb out of an
    overlay folder).
    """

    # typeshed declares extensions_map an instance attribute, hence no ClassVar.
    extensions_map = {  # noqa: RUF012
        **http.server.SimpleHTTPRequestHandler.extensions_map,
        **MIME_TYPES,
    }
    quiet: ClassVar[bool] = False
    overlays: ClassVar[dict[str, str]] = {}

    def translate_path(self, path: str) -> str:
        """dist/ or an overlay folder, never outside either."""
        for prefix, folder in self.overlays.items():
            if path.startswith(prefix):
                # The parent resolves "..", "." and escapes against dist/; the
                # result is then re-rooted in the overlay folder.
                inside = super().translate_path("/" + path[len(prefix) :])
                return os.path.join(folder, os.path.relpath(inside, self.directory))
        return super().translate_path(path)

    def end_headers(self) -> None:
        """Add `SHELL_HEADERS` to every response."""
        for name, value in SHELL_HEADERS:
            self.send_header(name, value)
        super().end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        """The access log, unless `quiet`."""
        if not self.quiet:
            super().log_message(format, *args)

    def log_error(self, format: str, *args: Any) -> None:
        """Errors are always printed."""
        super().log_message(format, *args)


class DistServer(http.server.ThreadingHTTPServer):
    """ThreadingHTTPServer that does not print tracebacks for clients that hang up."""

    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Quiet for a client that hung up; the usual traceback otherwise."""
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


def make_server(
    directory: Path,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    quiet: bool = False,
    overlays: Mapping[str, Path | str] | None = None,
) -> DistServer:
    """Create (not start) a server for `directory`; port 0 picks a free port.

    `overlays` maps URL prefixes such as `"/_test/"` to extra folders (see
    `DistRequestHandler`).
    """
    extra = {prefix: str(folder) for prefix, folder in (overlays or {}).items()}
    handler = type("Handler", (DistRequestHandler,), {"quiet": quiet, "overlays": extra})
    return DistServer((host, port), functools.partial(handler, directory=str(directory)))


@contextlib.contextmanager
def serving(
    directory: Path, *, overlays: Mapping[str, Path | str] | None = None, quiet: bool = True
) -> Iterator[str]:
    """Serve `directory` on a free 127.0.0.1 port in a daemon thread.

    Yields the base URL (`http://127.0.0.1:<port>/`); the server stops on exit.
    """
    server = make_server(directory, quiet=quiet, overlays=overlays)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
