"""A local model host for download tests: cuts answers, serves ranges or not, changes files.

``FlakyHost(folder)`` serves ``folder`` (a copy of the test build, say) with
the shell server's handler on 127.0.0.1 and answers the paths in ``host.files``
itself, each by its ``HostedFile`` plan:

- ``cuts``: how many of the next answers break off after ``cut_at`` bytes
  of body (the declared length promised all of it), stall for
  ``CUT_PAUSE_S`` and shut the socket.
- ``refuse``: how many of the answers after the cut ones are ``503``.
- ``ranges``: ``Range: bytes=N-`` is honoured (``206`` with
  ``Content-Range``) when ``If-Range`` is absent or names the current
  validator; otherwise (or with ``ranges`` off) the answer is the whole
  ``200``.
- ``delay``: seconds between 32 KiB pieces of body.
- ``partial_etag``: a broken host that answers every ``Range`` with
  ``206`` whatever ``If-Range`` says, carrying this ETag (``""`` for
  none) instead of the current one.
- ``changes``: every answer is of a new version of the file (other bytes,
  the next ETag), as a host whose file changes between attempts.
- ``cut_step``: bytes added to ``cut_at`` after each cut.
- ``stalls``: how many of the next answers send their headers and
  ``cut_at`` bytes of body, then nothing until ``recover()`` (or the
  host stops); the connection stays open meanwhile.

``FlakyHost(folder, cors=True)`` answers every origin (a model host of
its own: CORS headers on every answer, preflights allowed).

Every answer is recorded in ``host.log`` (path, Range, If-Range, status,
body bytes sent). The server stops by itself after ``LIFETIME_S`` seconds
at the latest, and at ``stop()``.
"""

from __future__ import annotations

import contextlib
import functools
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from napllm.devtools.headless import DistRequestHandler, DistServer

#: The host never outlives a test by more than this.
LIFETIME_S = 600
PIECE = 32 * 1024
CUT_PAUSE_S = 0.5


@dataclass
class HostedFile:
    """What one path answers (see the module docstring)."""

    body: bytes
    etag: str | None = '"v1"'
    last_modified: str | None = None
    ranges: bool = True
    cut_at: int = 0
    cuts: int = 0
    refuse: int = 0
    delay: float = 0.0
    content_type: str = "application/octet-stream"
    partial_etag: str | None = None
    changes: bool = False
    cut_step: int = 0
    stalls: int = 0
    version: int = 1
    lock: threading.Lock = field(default_factory=threading.Lock)


class FlakyHost:
    """The shell server's handler (`napllm.devtools.headless`) over ``folder``,
    plus the planned paths of ``files``."""

    def __init__(self, folder: Path, *, cors: bool = False) -> None:
        self.files: dict[str, HostedFile] = {}
        self.log: list[dict[str, Any]] = []
        host = self

        def do_get(handler: Any) -> None:
            path = handler.path.split("?")[0]
            if path in host.files:
                host.answer(handler, host.files[path], head=False)
            else:
                DistRequestHandler.do_GET(handler)

        def do_head(handler: Any) -> None:
            path = handler.path.split("?")[0]
            if path in host.files:
                host.answer(handler, host.files[path], head=True)
            else:
                DistRequestHandler.do_HEAD(handler)

        def end_headers(handler: Any) -> None:
            if cors:
                handler.send_header("Access-Control-Allow-Origin", "*")
                handler.send_header("Access-Control-Allow-Headers", "*")
                handler.send_header("Access-Control-Expose-Headers", "*")
            DistRequestHandler.end_headers(handler)

        def do_options(handler: Any) -> None:
            handler.send_response(204 if cors else 405)
            handler.send_header("Content-Length", "0")
            handler.end_headers()

        handler = type(
            "Handler",
            (DistRequestHandler,),
            {
                "quiet": True,
                "overlays": {},
                "do_GET": do_get,
                "do_HEAD": do_head,
                "do_OPTIONS": do_options,
                "end_headers": end_headers,
            },
        )
        self.httpd = DistServer(("127.0.0.1", 0), functools.partial(handler, directory=str(folder)))
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        #: Set by ``recover()`` and ``stop()``: stalled answers then end.
        self.released = threading.Event()
        self.timer = threading.Timer(LIFETIME_S, self.stop)
        self.timer.daemon = True
        self.timer.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/"

    def requests(self, path: str, method: str = "GET") -> list[dict[str, Any]]:
        """The recorded answers for ``path``."""
        return [entry for entry in self.log if entry["path"] == path and entry["method"] == method]

    def answer(self, handler: Any, plan: HostedFile, *, head: bool) -> None:
        with plan.lock:
            if plan.changes and not head:
                plan.version += 1
                plan.body = (
                    plan.body[:4] + bytes((b + 1) % 256 for b in plan.body[4:64]) + plan.body[64:]
                )
                plan.etag = f'"v{plan.version}"'
            body = plan.body
            etag, modified = plan.etag, plan.last_modified
            stall = plan.stalls > 0 and not head
            if stall:
                plan.stalls -= 1
            cut = (plan.cuts > 0 or stall) and not head
            cut_at = plan.cut_at
            if cut and not stall:
                plan.cuts -= 1
                plan.cut_at += plan.cut_step
            refuse = plan.refuse > 0 and not cut
            if refuse and not head:
                plan.refuse -= 1
        wanted = handler.headers.get("Range")
        if_range = handler.headers.get("If-Range")
        entry = {
            "path": handler.path.split("?")[0],
            "method": "HEAD" if head else "GET",
            "range": wanted,
            "if_range": if_range,
            "status": 0,
            "sent": 0,
        }
        self.log.append(entry)
        if refuse and not head:
            entry["status"] = 503
            handler.send_response(503)
            handler.send_header("Content-Length", "0")
            handler.end_headers()
            return
        start = 0
        status = 200
        current = {v for v in (etag, modified) if v}
        if plan.ranges and wanted and wanted.startswith("bytes=") and wanted.endswith("-"):
            offset = wanted[len("bytes=") : -1]
            broken = plan.partial_etag is not None
            if offset.isdigit() and (broken or if_range is None or if_range in current):
                start = int(offset)
                status = 206 if start < len(body) else 416
        if status == 206 and plan.partial_etag is not None:
            etag = plan.partial_etag or None
        entry["status"] = status
        handler.send_response(status)
        handler.send_header("Content-Type", plan.content_type)
        if plan.ranges:
            handler.send_header("Accept-Ranges", "bytes")
        if etag:
            handler.send_header("ETag", etag)
        if modified:
            handler.send_header("Last-Modified", modified)
        if status == 416:
            handler.send_header("Content-Range", f"bytes */{len(body)}")
            handler.send_header("Content-Length", "0")
            handler.end_headers()
            return
        if status == 206:
            handler.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
        part = body[start:]
        handler.send_header("Content-Length", str(len(part)))
        handler.end_headers()
        if head:
            return
        limit = cut_at if cut else len(part)
        sent = 0
        try:
            while sent < min(limit, len(part)):
                piece = part[sent : min(limit, sent + PIECE)]
                handler.wfile.write(piece)
                handler.wfile.flush()
                sent += len(piece)
                entry["sent"] = sent
                if plan.delay:
                    time.sleep(plan.delay)
        except OSError:
            return
        if stall:
            # Nothing more until the host recovers; then the connection drops.
            self.released.wait(LIFETIME_S)
            handler.close_connection = True
            with contextlib.suppress(OSError):
                handler.connection.shutdown(socket.SHUT_RDWR)
            return
        if cut:
            # The connection stalls, then drops: Chromium errors a body
            # without handing over bytes it had not delivered yet, so the
            # pause lets the page read what was sent.
            time.sleep(CUT_PAUSE_S)
            handler.close_connection = True
            with contextlib.suppress(OSError):
                handler.connection.shutdown(socket.SHUT_RDWR)

    def recover(self) -> None:
        """End every stalled answer (its connection drops); later answers follow their plans."""
        for plan in self.files.values():
            plan.stalls = 0
        self.released.set()

    def stop(self) -> None:
        self.released.set()
        self.timer.cancel()
        self.httpd.shutdown()
        self.httpd.server_close()
