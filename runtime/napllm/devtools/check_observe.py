"""What `napllm-check` records, observed from outside the napplet's realm.

`_Observer` attaches DevTools sessions to the shell page and the napplet
frames; `SHELL_SCRIPT` runs in an isolated world of the shell page and
reports every envelope the inspector announces; `Run` holds what one check
recorded and concludes it into findings (`analysis`). `HangGuard` bounds
each call a napplet can block.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from .analysis import Envelope, Finding, analyse_envelopes, analyse_frame_events

#: The isolated world the shell observer runs in (a napplet's scripts cannot reach it).
SHELL_WORLD = "napllm-check"
#: The binding the shell observer reports through; it exists only in `SHELL_WORLD`.
ENVELOPE_BINDING = "__napllmCheckEnvelope"
#: Longest text kept from one console message or error (characters).
MAX_EVENT_TEXT = 2000

#: Most envelopes one check records (the check's own bound; reaching it is the
#: `envelope-limit` finding, never a silent drop).
MAX_RECORDED_ENVELOPES = 20_000
#: Most envelope text one check records, in UTF-16 code units over all
#: envelopes (the shell accepts envelopes of up to 8 Mi each).
MAX_RECORDED_CHARS = 64 * 1024 * 1024
#: Most "the shell stopped the napplet" notices one check keeps.
MAX_STOPS_KEPT = 20
#: Frame events (console errors, exceptions, CSP reports) kept per kind: a
#: napplet calling `console.error` in a loop sends DevTools events as fast
#: as they are delivered, and keeping each grew the checker's memory
#: without bound (it could be killed before writing a report).
#: Past the bound they are counted (`event-limit`), and a flood of one kind
#: cannot push another kind out of the report.
MAX_FRAME_EVENTS_PER_KIND = 1000

#: Runs in the shell page's isolated world `SHELL_WORLD`, before the shell's
#: own scripts: answers the inspector's "napllm-inspector-listen" event so
#: that it announces every entry ("napllm-inspector-entry", web/js/inspector.js)
#: before its own bounds apply, and reports each one through the binding as
#: `["entry", serial, endpoint, direction, text]`. It stops at the check's
#: bound and reports `["limit", serial]` once instead; `["listening"]` says
#: the inspector asked; `["stopped", text]` reports each napplet the shell
#: stopped (its `.frame-stopped` alert). Events are shared between worlds; the napplets'
#: cross-origin frames cannot reach the shell's document.
SHELL_SCRIPT = r"""
(() => {
  if (window !== window.top) return;
  const report = globalThis.__napllmCheckEnvelope;
  if (typeof report !== "function") return;
  const MAX_ENVELOPES = @MAX_ENVELOPES@;
  const MAX_CHARS = @MAX_CHARS@;
  let count = 0;
  let chars = 0;
  let full = false;
  document.addEventListener("napllm-inspector-listen", (event) => {
    event.preventDefault();
    report(JSON.stringify(["listening"]));
  });
  document.addEventListener("napllm-inspector-entry", (event) => {
    const d = event.detail;
    if (full) return;
    if (d === null || typeof d !== "object") {
      report(JSON.stringify(["unreadable"])); // recorded as a gap
      return;
    }
    const text = typeof d.text === "string" ? d.text : "";
    count += 1;
    chars += text.length;
    if (count > MAX_ENVELOPES || chars > MAX_CHARS) {
      full = true;
      report(JSON.stringify(["limit", d.serial]));
      return;
    }
    report(JSON.stringify(["entry", d.serial, String(d.endpoint), String(d.direction), text]));
  });
  // The shell stopping a napplet (too many messages or starts, leaving its
  // sandboxed page) shows a `.frame-stopped` alert in place of the frame.
  const seenStops = new WeakSet();
  const stopped = (node) => {
    if (!(node instanceof Element)) return;
    const found = node.matches(".frame-stopped")
      ? [node]
      : [...node.querySelectorAll(".frame-stopped")];
    for (const item of found) {
      if (seenStops.has(item)) continue;
      seenStops.add(item);
      report(JSON.stringify(["stopped", String(item.textContent ?? "").slice(0, 500)]));
    }
  };
  const watch = () => {
    new MutationObserver((records) => {
      for (const record of records) for (const node of record.addedNodes) stopped(node);
    }).observe(document.documentElement, { childList: true, subtree: true });
    stopped(document.documentElement);
  };
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", watch);
  else watch();
})();
""".replace("@MAX_ENVELOPES@", str(MAX_RECORDED_ENVELOPES)).replace(
    "@MAX_CHARS@", str(MAX_RECORDED_CHARS)
)


class HangGuard:
    """Bounds the calls a napplet can block, with a timer that really stops them.

    Playwright's DevTools calls (`CDPSession.send`, `evaluate`, closing a
    context) have no timeout of their own, and a napplet whose script never
    yields blocks every one that needs its frame's thread (`Runtime.enable`
    waits for it forever). A blocked call cannot be interrupted from
    another thread, so when one outlives its bound the guard calls
    `on_hang(what, seconds)`, which must write the report and end the
    process (`main` does; the browser and its driver end with it).
    """

    def __init__(self, on_hang: Callable[[str, float], None]) -> None:
        self.on_hang = on_hang

    @contextmanager
    def within(self, seconds: float, what: str) -> Iterator[None]:
        """Run the `with` body; past `seconds` (wall clock) call `on_hang(what, seconds)`."""
        timer = threading.Timer(seconds, self.on_hang, args=(what, seconds))
        timer.daemon = True
        timer.start()
        try:
            yield
        finally:
            timer.cancel()


_QUOTED = re.compile(r"'([^']*)'")
_DIRECTIVE = re.compile(r'directive:? "([^"]*)"')


def _remote_text(value: Any) -> str:
    """A DevTools `RemoteObject` as text: its value, else its description, else its type."""
    if not isinstance(value, dict):
        return "(unknown)"
    if "value" in value:
        inner = value["value"]
        return inner if isinstance(inner, str) else json.dumps(inner, ensure_ascii=False)
    if isinstance(value.get("unserializableValue"), str):
        return str(value["unserializableValue"])
    if isinstance(value.get("description"), str):
        return str(value["description"])
    return str(value.get("type", "(unknown)"))


def _cut(text: str) -> str:
    return text if len(text) <= MAX_EVENT_TEXT else text[:MAX_EVENT_TEXT] + "…"


def console_event(params: dict[str, Any]) -> dict[str, Any] | None:
    """The frame event for a `Runtime.consoleAPICalled` (error and assert calls), or `None`."""
    if params.get("type") not in ("error", "assert"):
        return None
    args = params.get("args")
    parts = [_remote_text(a) for a in args] if isinstance(args, list) else []
    return {"kind": "console-error", "data": {"message": _cut(" ".join(parts))}}


#: The last line of the traceback of an uncaught `napllm.napplet.LlmError` ("code: message").
_PY_LLM_ERROR = re.compile(
    r"napllm\.napplet\.errors\.[A-Za-z]*Error: (?P<code>[a-z][a-z0-9-]*): (?P<message>.*)"
)


def python_raised(text: str) -> str | None:
    """The exception line (`Class: message`) of a Pyodide `PythonError`'s text, or None.

    `text` is the error's DevTools description: "PythonError: Traceback
    (most recent call last):", the traceback's indented lines, the
    exception's line, then the JavaScript stack (indented "at" lines).
    The exception's line is the last unindented one after the first.
    """
    lines = text.split("\n")
    if not lines[0].startswith("PythonError: Traceback"):
        return None
    raised = [line for line in lines[1:] if line.strip() and not line[0].isspace()]
    return raised[-1].strip() if raised else None


def exception_event(params: dict[str, Any]) -> dict[str, Any]:
    """The frame event for a `Runtime.exceptionThrown` (uncaught error or unhandled rejection).

    An `LlmError` becomes `unhandled-llm-error` with `code` "unknown" and
    `objectId` (the error object, whose own `code` property `_Observer`
    reads later without running napplet code); anything else `page-error`.
    A Pyodide `PythonError` (an uncaught exception of a Python napplet) is
    named by its Python exception's line, not the traceback's first; an
    uncaught `napllm.napplet.LlmError` is `unhandled-llm-error` with the
    code it names, as the same error of a JavaScript napplet would be.
    """
    details = params.get("exceptionDetails")
    details = details if isinstance(details, dict) else {}
    exception = details.get("exception")
    exception = exception if isinstance(exception, dict) else {}
    text = _remote_text(exception) if exception else str(details.get("text", "error"))
    first_line = text.split("\n", 1)[0]
    in_promise = "(in promise)" in str(details.get("text", ""))
    raised = python_raised(text)  # Pyodide's PythonError (its class name is minified)
    if raised is not None:
        llm = _PY_LLM_ERROR.fullmatch(raised)
        if llm is not None:
            return {
                "kind": "unhandled-llm-error",
                "data": {"code": _cut(llm["code"]), "message": _cut(llm["message"])},
            }
        first_line = f"PythonError: {raised}"
    if exception.get("className") == "LlmError":
        message = first_line.removeprefix("LlmError: ").removeprefix("LlmError")
        data: dict[str, Any] = {"code": "unknown", "message": _cut(message)}
        if isinstance(exception.get("objectId"), str):
            data["objectId"] = exception["objectId"]
        return {"kind": "unhandled-llm-error", "data": data}
    prefix = "unhandled rejection: " if in_promise else ""
    return {"kind": "page-error", "data": {"message": _cut(prefix + first_line)}}


def log_event(params: dict[str, Any]) -> dict[str, Any] | None:
    """The frame event for a `Log.entryAdded`: CSP violations (`source: "security"`), or `None`."""
    entry = params.get("entry")
    if not isinstance(entry, dict) or entry.get("source") != "security":
        return None
    text = str(entry.get("text", ""))
    quoted = _QUOTED.search(text)
    directive = _DIRECTIVE.search(text)
    return {
        "kind": "csp",
        "data": {
            "blockedURI": _cut(quoted.group(1)) if quoted else "",
            "directive": _cut(directive.group(1)) if directive else "",
        },
    }


class _Observer:
    """Watches the shell and the napplet frames over the DevTools protocol (module docstring).

    Nothing here runs in a napplet's realm: console calls, exceptions and
    CSP violations come from the browser's own DevTools sessions, which
    replay what happened before they attached, so a napplet can neither
    replace, call nor outrun what records it. Envelopes come from the
    shell's inspector through a binding that exists only in the shell
    page's isolated world `SHELL_WORLD`, and a call is accepted only from
    that world's context in the top frame.
    """

    def __init__(
        self, context: Any, page: Any, run: Run, guard: HangGuard, timeout_s: float
    ) -> None:
        self.context = context
        self.page = page
        self.run = run
        self.guard = guard
        self.timeout_s = timeout_s
        self._contexts: dict[int, tuple[str, str]] = {}  # id -> (frame id, world name)
        self._frames: list[Any] = []  # napplet frames with a session of their own
        self._sessions: list[Any] = []
        self._pending_codes: list[tuple[Any, dict[str, Any]]] = []
        self.main_frame_id = ""
        session = context.new_cdp_session(page)
        self.session = session
        session.on("Runtime.executionContextCreated", self._context_created)
        session.on("Runtime.consoleAPICalled", self._page_console)
        session.on("Runtime.exceptionThrown", self._page_exception)
        session.on("Runtime.bindingCalled", self._binding)
        session.on("Log.entryAdded", self._page_log)
        session.send(
            "Runtime.addBinding", {"name": ENVELOPE_BINDING, "executionContextName": SHELL_WORLD}
        )
        session.send(
            "Page.addScriptToEvaluateOnNewDocument",
            {"source": SHELL_SCRIPT, "worldName": SHELL_WORLD},
        )
        session.send("Page.enable")  # without it the isolated world is never created
        session.send("Runtime.enable")
        session.send("Log.enable")
        tree = session.send("Page.getFrameTree")
        self.main_frame_id = str(tree["frameTree"]["frame"]["id"])
        page.on("frameattached", self.attach)
        page.on("framenavigated", self.attach)

    # -- the shell page's own session (in-process frames included) ----------------

    def _context_created(self, params: dict[str, Any]) -> None:
        ctx = params.get("context", {})
        aux = ctx.get("auxData") or {}
        self._contexts[int(ctx.get("id", -1))] = (
            str(aux.get("frameId", "")),
            str(ctx.get("name", "")),
        )

    def _in_napplet(self, context_id: Any) -> bool:
        frame_id, _ = self._contexts.get(
            int(context_id) if isinstance(context_id, int) else -1, ("", "")
        )
        return bool(frame_id) and frame_id != self.main_frame_id

    def _page_console(self, params: dict[str, Any]) -> None:
        event = console_event(params)
        if event is None:
            return
        if self._in_napplet(params.get("executionContextId")):
            self.run.add_frame_event(event)
        else:
            self.run.shell_console.append("error: " + event["data"]["message"])

    def _page_exception(self, params: dict[str, Any]) -> None:
        details = params.get("exceptionDetails") or {}
        if self._in_napplet(details.get("executionContextId")):
            self._record(exception_event(params), self.session)
        else:
            self.run.shell_console.append(
                "exception: " + exception_event(params)["data"]["message"]
            )

    def _page_log(self, params: dict[str, Any]) -> None:
        entry = params.get("entry") or {}
        url = str(entry.get("url", ""))
        event = log_event(params)
        # Log entries carry no frame id: a napplet document is about:srcdoc.
        if event is not None and url.startswith("about:"):
            self.run.add_frame_event(event)

    def _binding(self, params: dict[str, Any]) -> None:
        if params.get("name") != ENVELOPE_BINDING:
            return
        frame_id, world = self._contexts.get(int(params.get("executionContextId", -1)), ("", ""))
        if frame_id != self.main_frame_id or world != SHELL_WORLD:
            return  # not the shell observer: ignored
        try:
            message = json.loads(str(params.get("payload", "")))
        except (ValueError, TypeError, RecursionError):
            message = None
        self.run.take(message)

    # -- napplet frames in processes of their own ----------------------------------

    def attach(self, frame: Any) -> None:
        """Open a DevTools session on `frame` when it runs in its own process.

        The session replays the console messages, exceptions and log
        entries from before it attached. A frame in the shell's process has
        no session of its own (`new_cdp_session` refuses it): the shell
        page's session reports it.
        """
        if frame == self.page.main_frame or any(f is frame for f in self._frames):
            return
        # A frame whose script never yields never answers Runtime.enable.
        with self.guard.within(self.timeout_s, "attaching DevTools to the napplet's frame"):
            try:
                session = self.context.new_cdp_session(frame)
            except Exception:  # an in-process frame, or one already gone
                return
            self._frames.append(frame)
            self._sessions.append(session)
            session.on("Runtime.consoleAPICalled", self._frame_console)
            session.on(
                "Runtime.exceptionThrown", lambda p: self._record(exception_event(p), session)
            )
            session.on("Log.entryAdded", self._frame_log)
            try:
                session.send("Runtime.enable")
                session.send("Log.enable")
            except Exception:
                return  # the frame went away meanwhile

    def _frame_console(self, params: dict[str, Any]) -> None:
        event = console_event(params)
        if event is not None:
            self.run.add_frame_event(event)

    def _frame_log(self, params: dict[str, Any]) -> None:
        event = log_event(params)
        if event is not None:
            self.run.add_frame_event(event)

    def _record(self, event: dict[str, Any], session: Any) -> None:
        if not self.run.add_frame_event(event):
            return
        if event["kind"] == "unhandled-llm-error" and "objectId" in event["data"]:
            self._pending_codes.append((session, event["data"]))

    def resolve_codes(self) -> None:
        """Read each unhandled `LlmError`'s own `code` (a data property; no getter runs)."""
        for session, data in self._pending_codes:
            object_id = data.pop("objectId", None)
            try:
                with self.guard.within(self.timeout_s, "reading an error's code in the napplet"):
                    answer = session.send(
                        "Runtime.getProperties", {"objectId": object_id, "ownProperties": True}
                    )
            except Exception:
                continue  # the frame is gone: the code stays unknown
            for prop in answer.get("result", []):
                value = prop.get("value")
                named_code = prop.get("name") == "code" and isinstance(value, dict)
                if named_code and isinstance(value.get("value"), str):
                    data["code"] = _cut(value["value"])
        self._pending_codes = []
        for event in self.run.frame_events:
            event["data"].pop("objectId", None)


# --------------------------------------------------------------------------- the run


def _unwrap_wire(text: str) -> Any:
    """An inspector entry's text as the envelope value (None when it is not JSON).

    An "in" entry is the shell's wireJson: `{"json": "<the napplet's data as
    JSON text>"}` is unwrapped; a marker (`unclonable`, `tooLarge`) or an "out"
    envelope is the value itself (web/js/wire.js, `unwrapWire`).
    """
    try:
        value = json.loads(text)
        if isinstance(value, dict) and len(value) == 1 and isinstance(value.get("json"), str):
            return json.loads(value["json"])
        return value
    except (ValueError, RecursionError):
        return None


@dataclass
class Run:
    """Everything one check recorded.

    Envelopes arrive from `SHELL_SCRIPT` numbered by the inspector (`take`);
    `gaps` counts serial numbers that never arrived, `limit_at` is the serial
    at which the check's own bound (`MAX_RECORDED_ENVELOPES`,
    `MAX_RECORDED_CHARS`) stopped recording, `listening` whether the
    inspector announced its entries at all.
    """

    napplet: str
    envelopes: list[Envelope] = field(default_factory=list)
    frame_events: list[dict[str, Any]] = field(default_factory=list)
    outside_requests: list[str] = field(default_factory=list)
    shell_console: list[str] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    screenshot: str | None = None
    listening: bool = False
    last_serial: int = 0
    gaps: list[tuple[int, int]] = field(default_factory=list)
    limit_at: int | None = None
    recorded_chars: int = 0
    stops: list[str] = field(default_factory=list)
    frame_event_counts: dict[str, int] = field(default_factory=dict)

    def add_frame_event(self, event: dict[str, Any]) -> bool:
        """Keep `event` unless `MAX_FRAME_EVENTS_PER_KIND` of its kind are kept
        already (then it is only counted, for `event-limit`); True when kept."""
        kind = str(event.get("kind"))
        count = self.frame_event_counts.get(kind, 0) + 1
        self.frame_event_counts[kind] = count
        if count > MAX_FRAME_EVENTS_PER_KIND:
            return False
        self.frame_events.append(event)
        return True

    def take(self, message: Any) -> None:
        """Record one report of `SHELL_SCRIPT` (a JSON list; anything else is a gap).

        `["entry", serial, endpoint, direction, text]` is recorded when
        `serial` is the next one; a serial that skips some records the
        skipped range in `gaps`; one at or below the last is a gap of its own
        and is not recorded. Nothing is ever skipped for its content (two
        identical envelopes are two envelopes).
        """
        if not isinstance(message, list) or not message or self.limit_at is not None:
            if self.limit_at is None:
                self.gaps.append((self.last_serial + 1, self.last_serial + 1))
            return
        if message[0] == "listening":
            self.listening = True
            return
        if message[0] == "stopped":
            if len(self.stops) < MAX_STOPS_KEPT:
                text = message[1] if len(message) > 1 and isinstance(message[1], str) else ""
                self.stops.append(text[:500])
            return
        serial = message[1] if len(message) > 1 else None
        if not isinstance(serial, int) or isinstance(serial, bool):
            self.gaps.append((self.last_serial + 1, self.last_serial + 1))
            return
        if serial <= self.last_serial:
            self.gaps.append((serial, serial))  # numbered twice or out of order
            return
        if serial != self.last_serial + 1:
            self.gaps.append((self.last_serial + 1, serial - 1))
        self.last_serial = serial
        if message[0] == "limit":
            self.limit_at = serial
            return
        if message[0] != "entry" or len(message) != 5 or not isinstance(message[4], str):
            self.gaps.append((serial, serial))
            return
        _, _, endpoint, direction, text = message
        self.recorded_chars += len(text)
        if (
            len(self.envelopes) >= MAX_RECORDED_ENVELOPES
            or self.recorded_chars > MAX_RECORDED_CHARS
        ):
            self.limit_at = serial
            return
        self.envelopes.append(Envelope(str(endpoint), str(direction), _unwrap_wire(text), text))

    def recording_findings(self) -> list[Finding]:
        """Findings about the recording itself: envelopes that never arrived
        (`inspector-gap`) or the check's bounds reached (`envelope-limit`,
        `event-limit`)."""
        found: list[Finding] = []
        for first, last in self.gaps[:20]:
            found.append(
                Finding(
                    "inspector-gap",
                    f"Envelopes {first} to {last} announced by the inspector were not recorded; "
                    "the check cannot vouch for them.",
                    {"first": first, "last": last},
                )
            )
        for kind, count in self.frame_event_counts.items():
            if count > MAX_FRAME_EVENTS_PER_KIND:
                found.append(
                    Finding(
                        "event-limit",
                        f"The napplet caused {count} {kind} events; the check keeps "
                        f"{MAX_FRAME_EVENTS_PER_KIND} of each kind, the rest were only counted.",
                        {"kind": kind, "count": count},
                    )
                )
        if self.limit_at is not None:
            found.append(
                Finding(
                    "envelope-limit",
                    f"The napplet exchanged more than the check records "
                    f"({MAX_RECORDED_ENVELOPES} envelopes or {MAX_RECORDED_CHARS} characters); "
                    f"envelopes from number {self.limit_at} on were not checked.",
                    {"serial": self.limit_at},
                )
            )
        return found

    def conclude(self) -> list[Finding]:
        """Every finding: failed steps, recording, protocol, frame events, requests that left."""
        found = list(self.findings)
        found += self.recording_findings()
        found += [
            Finding("napplet-stopped", f"The shell stopped the napplet: {text}", {"notice": text})
            for text in self.stops
        ]
        found += analyse_envelopes(self.envelopes)
        found += analyse_frame_events(self.frame_events)
        for url in self.outside_requests:
            found.append(
                Finding(
                    "network-request",
                    f"A request left the page for {url}; napplets have no network.",
                    {"url": url},
                )
            )
        return found
