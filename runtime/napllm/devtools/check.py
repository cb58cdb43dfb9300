"""`napllm-check`: run a napplet in the real shell, headless, and report misuse.

Usage (docs/napplets.md, "Checking a napplet in CI")::

    napllm-check my-napplet.html --script turns.json --steps steps.json \
        [--dist dist] [--out napllm-check-out] [--chromium /usr/bin/chromium]

What it does
1. Validates the script (`providers.scripted.parse_script`) and the steps
   (`parse_steps`) first; a bad file is exit status 2 with a positioned
   message.
2. Serves the built shell (`--dist`, default `./dist`) and the napplet's
   one file (at `/_napplet/<name>`; nothing else of its folder) on
   127.0.0.1, only to requests whose `Host` is that address, with the
   headers of `build.py serve`, and starts Chromium (`--chromium`, default
   `$NAPLLM_CHROMIUM` or Debian's `/usr/bin/chromium`) through Playwright
   with the offline flags of the browser tests: every name but 127.0.0.1
   is unresolvable and every request elsewhere is aborted and reported.
3. Drives the shell as a person does, with no test hooks: waits for the
   runtime, opens the envelope inspector, adds a "Scripted responses"
   connection with the script through the connections form, opens the
   napplet by URL (dev mode, like `?napplet=<url>`), turns its tab's "LLM
   access" on when it is off, then performs the steps. Dialog buttons are
   clicked only once enabled (dialogs may arm after a short delay).
4. Observes from outside the napplet's realm (`_Observer`): the DevTools
   protocol reports the napplet frames' console errors, uncaught errors,
   unhandled rejections and CSP violations, including those from before
   the first script ran (a session replays them when it attaches); the
   envelopes come from the shell's inspector through a binding that exists
   only in an isolated world of the shell page. The inspector announces
   every entry, numbered, before its own bounds drop or forget any
   (web/js/inspector.js, "Announcing entries"), so what it still lists or
   has drawn does not matter; a number that never arrives is the
   `inspector-gap` finding, and the check's own bound
   (`MAX_RECORDED_ENVELOPES`, `MAX_RECORDED_CHARS`) reached is the
   `envelope-limit` finding. Nothing a napplet can replace, call, outrun
   or flood takes part in the report.
5. Writes `report.json` (ASCII JSON), `junit.xml` and `screenshot.png`
   into `--out`, each through a temporary file and a rename, after
   removing an earlier run's; every text printed or written is escaped
   (`printable`: no control characters, no lone surrogates). A report is
   always written: a napplet whose frame never loads, a browser that fails
   and a check that overruns `--max-seconds` are findings. Exit status 0
   when there is no finding, 1 when there is one (`analysis` lists the
   kinds), 2 when the check could not run (the report says why).

Steps (a JSON list; each step one object, one action key)
- `{"click": "<css selector in the napplet>"}`
- `{"fill": "<selector>", "text": "..."}` (types into an input/textarea)
- `{"press": "Enter", "selector"?: "<selector>"}`
- `{"waitForText": "...", "selector"?: "body", "timeoutMs"?: 15000}`
- `{"chooser": "allow" | "cancel", "connection"?: "<name>"}`: answer the
  model chooser (allow picks the scripted connection unless named)
- `{"consent": "allow" | "deny" | "cancel", "remember"?: false}`
- `{"wait": <milliseconds>}`, `{"reload": true}` (the tab's Reload button)

CPython only: this module imports Playwright and is never imported by the
runtime in the page.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import sys
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import unquote, urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..jsontext import JsonTextError, read_json
from ..providers.scripted import ScriptError, parse_script
from .analysis import CATEGORIES, Envelope, Finding, analyse_envelopes, analyse_frame_events
from .headless import CHROMIUM, CHROMIUM_ARGS, DistRequestHandler, DistServer

CONNECTION_NAME = "napllm-check script"
NAPPLET_PREFIX = "/_napplet/"
BOOT_TIMEOUT_MS = 180_000
#: Added to a timed call's own timeout before `HangGuard` gives up on it (seconds).
STALL_MARGIN_S = 20.0

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

#: Runs in the shell page's isolated world `SHELL_WORLD`, before the shell's
#: own scripts: answers the inspector's "napllm-inspector-listen" event so
#: that it announces every entry ("napllm-inspector-entry", web/js/inspector.js)
#: before its own bounds apply, and reports each one through the binding as
#: `["entry", serial, endpoint, direction, text]`. It stops at the check's
#: bound and reports `["limit", serial]` once instead; `["listening"]` says
#: the inspector asked. Events are shared between worlds; the napplets'
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
})();
""".replace("@MAX_ENVELOPES@", str(MAX_RECORDED_ENVELOPES)).replace(
    "@MAX_CHARS@", str(MAX_RECORDED_CHARS)
)


class CheckSetupError(Exception):
    """The check could not run (bad input file, no shell, boot failure)."""


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


# --------------------------------------------------------------------------- steps


class _Step(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


Selector = Annotated[str, Field(min_length=1, max_length=500)]


class ClickStep(_Step):
    click: Selector


class FillStep(_Step):
    fill: Selector
    text: str


class PressStep(_Step):
    press: Annotated[str, Field(min_length=1, max_length=50)]
    selector: Selector | None = None


class WaitForTextStep(_Step):
    waitForText: Annotated[str, Field(min_length=1)]
    selector: Selector = "body"
    timeoutMs: Annotated[int, Field(ge=1, le=600_000)] | None = None


class ChooserStep(_Step):
    chooser: Literal["allow", "cancel"]
    connection: str | None = None


class ConsentStep(_Step):
    consent: Literal["allow", "deny", "cancel"]
    remember: bool = False


class WaitStep(_Step):
    wait: Annotated[int, Field(ge=0, le=600_000)]


class ReloadStep(_Step):
    reload: Literal[True]


Step = (
    ClickStep
    | FillStep
    | PressStep
    | WaitForTextStep
    | ChooserStep
    | ConsentStep
    | WaitStep
    | ReloadStep
)
_STEP_MODELS: dict[str, type[_Step]] = {
    "click": ClickStep,
    "fill": FillStep,
    "press": PressStep,
    "waitForText": WaitForTextStep,
    "chooser": ChooserStep,
    "consent": ConsentStep,
    "wait": WaitStep,
    "reload": ReloadStep,
}


class StepsError(ValueError):
    """A steps file that cannot be used; the message says where and why."""


def _read(text: str, what: str) -> Any:
    try:
        return read_json(text)
    except JsonTextError as exc:
        position = ""
        try:
            json.loads(text)
        except json.JSONDecodeError as err:
            position = f" at line {err.lineno}, column {err.colno}"
        raise StepsError(f"{what}: {str(exc).rstrip('.')}{position}") from None


def parse_steps(text: str) -> list[Step]:
    """A steps file's JSON text as steps; raises `StepsError` (positioned)."""
    value = _read(text, "steps")
    if not isinstance(value, list):
        raise StepsError("steps: a JSON list of steps")
    steps: list[Step] = []
    for index, raw in enumerate(value):
        if not isinstance(raw, dict):
            raise StepsError(f"steps[{index}]: a step must be a JSON object")
        actions = [key for key in _STEP_MODELS if key in raw]
        if len(actions) != 1:
            raise StepsError(
                f"steps[{index}]: a step needs exactly one of {', '.join(_STEP_MODELS)}"
            )
        try:
            step = _STEP_MODELS[actions[0]].model_validate(raw)
        except ValidationError as exc:
            error = exc.errors(include_input=False, include_url=False)[0]
            loc = ".".join(str(p) for p in error["loc"] if not str(p).startswith(("str", "int")))
            raise StepsError(f"steps[{index}].{loc}: {error['msg']}") from None
        steps.append(step)  # type: ignore[arg-type]
    return steps


def describe_step(step: Step) -> str:
    """A one-line description of a step for reports."""
    return json.dumps(step.model_dump(exclude_none=True), ensure_ascii=False)


# --------------------------------------------------------------------------- server


class _Handler(DistRequestHandler):
    """dist/ at `/`, the napplet's one file at `/_napplet/<name>`; the shell's headers.

    The headers and MIME types are the shell server's (`headless`). On top:
    only requests whose `Host` is the server's own `127.0.0.1:<port>` are
    answered (421 otherwise: a page elsewhere that rebinds a name to
    127.0.0.1 reads nothing), under `/_napplet/` only the napplet's own file
    exists (its folder's other files are never served), and no folder is
    listed.
    """

    napplet_file: Path

    def _host_ok(self) -> bool:
        address = self.server.server_address
        port = address[1] if isinstance(address, tuple) else None
        return self.headers.get("Host", "") == f"127.0.0.1:{port}"

    def send_head(self) -> Any:
        if not self._host_ok():
            self.send_error(421, "Misdirected Request")
            return None
        return super().send_head()

    def translate_path(self, path: str) -> str:
        clean = unquote(urlsplit(path).path)
        if clean.startswith(NAPPLET_PREFIX):
            if clean[len(NAPPLET_PREFIX) :] == self.napplet_file.name:
                return str(self.napplet_file)
            return str(Path(self.directory) / "__absent__")
        return super().translate_path(path)

    def list_directory(self, path: Any) -> Any:
        self.send_error(404, "Not Found")
        return None


def serve(dist: Path, napplet_file: Path) -> DistServer:
    """Start the server on a free 127.0.0.1 port (a daemon thread); returns it."""
    handler = type("Handler", (_Handler,), {"quiet": True, "napplet_file": napplet_file})
    server = DistServer(("127.0.0.1", 0), functools.partial(handler, directory=str(dist)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


# --------------------------------------------------------------------------- observing

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


def exception_event(params: dict[str, Any]) -> dict[str, Any]:
    """The frame event for a `Runtime.exceptionThrown` (uncaught error or unhandled rejection).

    An `LlmError` becomes `unhandled-llm-error` with `code` "unknown" and
    `objectId` (the error object, whose own `code` property `_Observer`
    reads later without running napplet code); anything else `page-error`.
    """
    details = params.get("exceptionDetails")
    details = details if isinstance(details, dict) else {}
    exception = details.get("exception")
    exception = exception if isinstance(exception, dict) else {}
    text = _remote_text(exception) if exception else str(details.get("text", "error"))
    first_line = text.split("\n", 1)[0]
    in_promise = "(in promise)" in str(details.get("text", ""))
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
            self.run.frame_events.append(event)
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
            self.run.frame_events.append(event)

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
            self.run.frame_events.append(event)

    def _frame_log(self, params: dict[str, Any]) -> None:
        event = log_event(params)
        if event is not None:
            self.run.frame_events.append(event)

    def _record(self, event: dict[str, Any], session: Any) -> None:
        self.run.frame_events.append(event)
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
        (`inspector-gap`) or the check's bound reached (`envelope-limit`)."""
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


class _Driver:
    """Drives the shell page like a person (see the module docstring)."""

    def __init__(self, page: Any, run: Run, base: str, timeout_ms: int) -> None:
        self.page = page
        self.run = run
        self.base = base
        self.timeout_ms = timeout_ms
        self.tab_key = ""

    @property
    def frame(self) -> Any:
        return self.page.frame_locator(f"#{self.tab_key}-panel iframe.napplet-frame")

    def boot(self) -> None:
        self.page.goto(f"{self.base}index.html")
        self.page.wait_for_function(
            "() => ['ready', 'failed'].includes(document.body.dataset.boot)",
            timeout=BOOT_TIMEOUT_MS,
        )
        if self.page.evaluate("document.body.dataset.boot") != "ready":
            message = self.page.locator("#boot-error-message").text_content() or ""
            raise CheckSetupError(f"the shell did not start: {message}")
        summary = self.page.locator("details.inspector-wrap > summary")
        if not self.page.evaluate("document.querySelector('details.inspector-wrap').open"):
            summary.click()

    def add_connection(self, script_text: str) -> None:
        page = self.page
        page.locator("#connection-add").click()
        page.locator("#connection-name").fill(CONNECTION_NAME)
        page.locator("#connection-kind").select_option("scripted")
        page.locator("#connection-script").fill(script_text)
        page.locator("#connection-save").click()
        entry = page.locator("#connection-list li.connection h3", has_text=CONNECTION_NAME)
        error = page.locator("#connection-form-error")
        deadline = time.monotonic() + self.timeout_ms / 1000
        while time.monotonic() < deadline:
            if entry.count() > 0:
                return
            text = (error.text_content() or "").strip()
            if text:
                raise CheckSetupError(f"the shell refused the scripted connection: {text}")
            page.wait_for_timeout(50)
        raise CheckSetupError("the scripted connection did not appear in the connections list")

    def open_napplet(self, url: str) -> None:
        page = self.page
        before = page.locator("#napplet-tabs .tab").count()
        page.locator("#napplet-url").fill(url)
        page.locator("#napplet-url-open").click()
        page.wait_for_function(
            "(n) => document.querySelectorAll('#napplet-tabs .tab').length > n", arg=before
        )
        tab_id = page.locator("#napplet-tabs .tab").last.get_attribute("id") or ""
        self.tab_key = tab_id.removesuffix("-tab")
        frames = f"#{self.tab_key}-panel iframe.napplet-frame"
        loaded = (
            "([sel, old]) => { const f = document.querySelector(sel);"
            " return !!f && f !== old && f.srcdoc.length > 0; }"
        )
        # A napplet opened by URL starts with LLM access off. Turning it on
        # builds a fresh frame once the document has arrived, so the steps
        # must wait for that frame: a click on the first one would be lost.
        page.wait_for_function(loaded, arg=[frames, None])
        toggle = page.locator(f"#{self.tab_key}-panel .llm-toggle")
        if toggle.count() > 0 and not toggle.is_checked():
            old = page.query_selector(frames)
            toggle.check()
            page.wait_for_function(loaded, arg=[frames, old])
        handle = page.query_selector(frames)
        frame = handle.content_frame() if handle is not None else None
        if frame is not None:
            frame.wait_for_load_state("load", timeout=self.timeout_ms)

    def _dialog(self, kind: str, timeout: int) -> Any:
        dialog = self.page.locator(f"dialog.{kind}-dialog[open]").first
        dialog.wait_for(state="visible", timeout=timeout)
        # A dialog may keep its buttons disabled for a moment after it appears.
        self.page.wait_for_function(
            "(sel) => { const d = document.querySelector(sel);"
            " return !d || !d.classList.contains('arming'); }",
            arg=f"dialog.{kind}-dialog[open]",
            timeout=timeout,
        )
        return dialog

    def perform(self, step: Step) -> None:
        timeout = self.timeout_ms
        if isinstance(step, ClickStep):
            self.frame.locator(step.click).first.click(timeout=timeout)
        elif isinstance(step, FillStep):
            self.frame.locator(step.fill).first.fill(step.text, timeout=timeout)
        elif isinstance(step, PressStep):
            target = self.frame.locator(step.selector or "body").first
            target.press(step.press, timeout=timeout)
        elif isinstance(step, WaitForTextStep):
            wait = step.timeoutMs or timeout
            self.frame.locator(step.selector, has_text=step.waitForText).first.wait_for(
                state="attached", timeout=wait
            )
        elif isinstance(step, ChooserStep):
            dialog = self._dialog("chooser", timeout)
            if step.chooser == "cancel":
                dialog.get_by_role("button", name="Cancel").click(timeout=timeout)
            else:
                name = step.connection or CONNECTION_NAME
                exact = re.compile("^" + re.escape(name) + "$")
                label = self.page.locator(".candidate-name", has_text=exact)
                dialog.locator(".candidate", has=label).first.click(timeout=timeout)
            dialog.wait_for(state="detached", timeout=timeout)
        elif isinstance(step, ConsentStep):
            dialog = self._dialog("consent", timeout)
            if step.consent == "cancel":
                self.page.keyboard.press("Escape")
            else:
                if step.consent == "allow" and step.remember:
                    dialog.locator("input.remember").check(timeout=timeout)
                dialog.locator(f"button.{step.consent}").click(timeout=timeout)
            dialog.wait_for(state="detached", timeout=timeout)
        elif isinstance(step, WaitStep):
            self.page.wait_for_timeout(step.wait)
        elif isinstance(step, ReloadStep):
            self.page.locator(f"#{self.tab_key}-panel .reload").first.click(timeout=timeout)


def run_check(
    napplet: Path,
    script_text: str,
    steps: Sequence[Step],
    *,
    dist: Path,
    out: Path,
    chromium: str,
    guard: HangGuard,
    timeout_ms: int = 15_000,
    settle_ms: int = 500,
    run: Run | None = None,
) -> Run:
    """Run the check (see the module docstring); returns what it recorded.

    `run`: where to record (the caller keeps it to report a run cut short).
    `guard` bounds every call the napplet can block: opening it, each
    step, attaching to its frame and collecting at the end each get
    `timeout_ms` plus a margin. Whatever the napplet does after it is
    opened (never finishing its load, hanging its frame, crashing it) is
    recorded as a finding, not raised. Raises `CheckSetupError` when the
    shell or the browser cannot be used.
    """
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import sync_playwright

    if not (dist / "index.html").is_file():
        raise CheckSetupError(f"no built shell at {dist} (run python3 build.py, or pass --dist)")
    if not Path(chromium).exists():
        raise CheckSetupError(f"Chromium not found at {chromium} (pass --chromium)")
    out.mkdir(parents=True, exist_ok=True)
    run = run if run is not None else Run(napplet=str(napplet))
    server = serve(dist.resolve(), napplet.resolve())
    base = f"http://127.0.0.1:{server.server_address[1]}/"
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, args=list(CHROMIUM_ARGS))
            context = browser.new_context(service_workers="block")

            def keep_local(route: Any) -> None:
                url = route.request.url
                if url.startswith(base) or url.startswith(("data:", "blob:", "about:")):
                    route.continue_()
                else:
                    run.outside_requests.append(url)
                    route.abort()

            context.route("**/*", keep_local)
            page = context.new_page()
            bound_s = timeout_ms / 1000
            # Playwright's own timeouts end most waits; this margin only
            # catches the calls that have none.
            # A step makes up to four timed waits (a dialog: appear, arm, click, close).
            step_bound_s = 4 * bound_s + STALL_MARGIN_S
            observer = _Observer(context, page, run, guard, bound_s + STALL_MARGIN_S)
            driver = _Driver(page, run, base, timeout_ms)
            try:
                driver.boot()
                driver.add_connection(script_text)
            except PlaywrightError as exc:
                raise CheckSetupError(
                    f"the shell could not be driven: {_first_line(exc)}"
                ) from None
            if not run.listening:
                raise CheckSetupError(
                    "the shell's envelope inspector does not announce its envelopes "
                    "(a dist/ built from an older napllm?)"
                )
            try:
                with guard.within(step_bound_s + 30, "opening the napplet"):
                    driver.open_napplet(f"{base}{NAPPLET_PREFIX.strip('/')}/{napplet.name}")
            except PlaywrightError as exc:
                run.findings.append(
                    Finding(
                        "napplet-unresponsive",
                        "The napplet's frame did not finish loading within "
                        f"{timeout_ms} ms (a script that never yields?): {_first_line(exc)}",
                        {},
                    )
                )
                steps = []
            for index, step in enumerate(steps):
                record: dict[str, Any] = {"index": index, "step": describe_step(step)}
                try:
                    own_ms = step.wait if isinstance(step, WaitStep) else 0
                    if isinstance(step, WaitForTextStep):
                        own_ms = step.timeoutMs or 0
                    with guard.within(own_ms / 1000 + step_bound_s, f"performing step {index}"):
                        driver.perform(step)
                    record["ok"] = True
                except PlaywrightError as exc:
                    record["ok"] = False
                    first = _first_line(exc)
                    record["error"] = first
                    run.findings.append(
                        Finding(
                            "step-failed",
                            f"Step {index} {describe_step(step)} failed: {first}",
                            {"index": index},
                        )
                    )
                    run.steps.append(record)
                    break
                run.steps.append(record)
            try:
                page.wait_for_timeout(settle_ms)
                # A round trip to the page after a frame: the binding's reports
                # of envelopes announced so far are delivered before its answer.
                with guard.within(bound_s + STALL_MARGIN_S, "waiting for the shell to draw"):
                    page.evaluate(
                        "() => new Promise((r) => requestAnimationFrame(() => setTimeout(r, 50)))"
                    )
                for frame in page.frames:
                    observer.attach(frame)
                observer.resolve_codes()
                shot = out / "screenshot.png"
                page.screenshot(path=str(shot), full_page=True, timeout=timeout_ms)
                run.screenshot = str(shot)
            except PlaywrightError:
                pass  # a napplet that hangs its frame can stop the screenshot; findings stand
            with guard.within(bound_s + STALL_MARGIN_S, "closing the browser"):
                context.close()
                browser.close()
    finally:
        server.shutdown()
        server.server_close()
    return run


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


# --------------------------------------------------------------------------- reports

#: Characters never written raw to a terminal, a CI log or a report: C0 and
#: C1 controls (ESC, CR, BEL, newlines), DEL, line and paragraph separators,
#: bidirectional overrides and lone UTF-16 surrogates.
_UNPRINTABLE = re.compile(
    "[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ufeff\ud800-\udfff]"
)
REPORT_FILES = ("report.json", "junit.xml", "screenshot.png")


def printable(text: str) -> str:
    """`text` with every character of `_UNPRINTABLE` written as `\\xNN` / `\\uNNNN`.

    The result is one line that a terminal, a CI log (which reads lines
    starting with `::` as commands) and XML 1.0 all take as plain text.
    """

    def escape(match: re.Match[str]) -> str:
        code = ord(match.group())
        return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"

    return _UNPRINTABLE.sub(escape, text)


def _printable_json(value: Any) -> Any:
    """`value` with `printable` applied to every string (keys included)."""
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, list):
        return [_printable_json(v) for v in value]
    if isinstance(value, dict):
        return {printable(str(k)): _printable_json(v) for k, v in value.items()}
    return value


def report_json(run: Run, findings: list[Finding], error: str | None = None) -> dict[str, Any]:
    """The JSON report: verdict, findings, steps, envelopes, shell console errors.

    `error`: why the check could not run (then `ok` is false). Envelopes are
    kept as recorded (JSON escapes them); every other text is `printable`.
    """
    report: dict[str, Any] = {
        "napplet": printable(run.napplet),
        "ok": not findings and error is None,
        "findings": _printable_json([f.to_json() for f in findings]),
        "steps": _printable_json(run.steps),
        "envelopes": [
            {
                "endpoint": printable(e.endpoint),
                "direction": printable(e.direction),
                "envelope": e.value,
            }
            for e in list(run.envelopes)
        ],
        "shellConsoleErrors": _printable_json(list(run.shell_console)),
        "screenshot": run.screenshot,
    }
    if error is not None:
        report["error"] = printable(error)
    return report


def junit_xml(run: Run, findings: list[Finding]) -> str:
    """JUnit XML: one test case per category (steps, protocol, errors, console, network).

    Every text is `printable`, so the document is well-formed XML 1.0.
    """
    categories = ("steps", "protocol", "errors", "console", "network")
    suite = ET.Element(
        "testsuite",
        name="napllm-check",
        tests=str(len(categories)),
        failures=str(len({CATEGORIES.get(f.kind, "other") for f in findings})),
    )
    for category in categories:
        case = ET.SubElement(
            suite,
            "testcase",
            classname=printable(f"napllm-check.{Path(run.napplet).name}"),
            name=category,
        )
        mine = [f for f in findings if CATEGORIES.get(f.kind, "other") == category]
        if mine:
            failure = ET.SubElement(
                case, "failure", message=f"{len(mine)} finding(s)", type=printable(mine[0].kind)
            )
            failure.text = "\n".join(f"[{printable(f.kind)}] {printable(f.message)}" for f in mine)
    return ET.tostring(suite, encoding="unicode", xml_declaration=True)


def summary_lines(findings: list[Finding], napplet_name: str, out: Path) -> list[str]:
    """What the command prints: one escaped line per finding, then the verdict line."""
    lines = [f"[{printable(f.kind)}] {printable(f.message)}" for f in findings]
    verdict = "no findings" if not findings else f"{len(findings)} finding(s)"
    lines.append(
        f"napllm-check: {printable(napplet_name)}: {verdict}; report in {printable(str(out))}"
    )
    return lines


def _write_atomic(path: Path, text: str) -> None:
    """Write `text` (UTF-8) to `path` through a temporary file and a rename."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        temporary.write_text(text, encoding="utf-8")
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def clear_reports(out: Path) -> None:
    """Remove the report files an earlier run left in `out`."""
    for name in REPORT_FILES:
        (out / name).unlink(missing_ok=True)


def write_reports(out: Path, run: Run, findings: list[Finding], error: str | None = None) -> None:
    """Write `report.json` (ASCII JSON) and `junit.xml` into `out`, each atomically."""
    out.mkdir(parents=True, exist_ok=True)
    report = report_json(run, findings, error)
    _write_atomic(out / "report.json", json.dumps(report, indent=2, ensure_ascii=True))
    if error is not None:
        findings = [Finding("check-aborted", error)]
    _write_atomic(out / "junit.xml", junit_xml(run, findings))


# --------------------------------------------------------------------------- command


def main(argv: Sequence[str] | None = None) -> int:
    """The `napllm-check` command; returns the exit status (0, 1 or 2)."""
    parser = argparse.ArgumentParser(
        prog="napllm-check",
        description="Run a napplet in the napllm shell with a scripted model and report misuse.",
    )
    parser.add_argument("napplet", type=Path, help="the napplet's HTML file")
    parser.add_argument("--script", type=Path, required=True, help="the scripted turns (JSON)")
    parser.add_argument("--steps", type=Path, help="the steps to perform (JSON list)")
    parser.add_argument("--dist", type=Path, default=Path(os.environ.get("NAPLLM_DIST", "dist")))
    parser.add_argument("--out", type=Path, default=Path("napllm-check-out"))
    parser.add_argument("--chromium", default=CHROMIUM)
    parser.add_argument("--timeout-ms", type=int, default=15_000, help="per step")
    parser.add_argument("--settle-ms", type=int, default=500, help="wait after the last step")
    parser.add_argument(
        "--max-seconds",
        type=float,
        default=900.0,
        help="the whole check's limit; past it the report says so (exit 1)",
    )
    args = parser.parse_args(argv)
    for stream in (sys.stdout, sys.stderr):  # never fail on a character the terminal lacks
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="backslashreplace")
    out: Path = args.out
    run = Run(napplet=str(args.napplet))
    written = threading.Lock()

    def finish(findings: list[Finding], error: str | None) -> int:
        with written:
            write_reports(out, run, findings, error)
            if error is not None:
                print(f"napllm-check: {printable(error)}", file=sys.stderr)
                return 2
            print("\n".join(summary_lines(findings, args.napplet.name, out)), flush=True)
            return 1 if findings else 0

    def hung(what: str, seconds: float) -> None:
        run.findings.append(
            Finding(
                "napplet-unresponsive",
                f"The napplet's frame stopped answering while napllm-check was {what} "
                f"(nothing within {seconds:g} s; a script that never yields?); this report "
                "holds what was recorded until then.",
            )
        )
        finish(run.conclude(), None)
        os._exit(1)  # the blocked call cannot be interrupted; its driver ends with this process

    def overran() -> None:
        run.findings.append(
            Finding(
                "check-aborted",
                f"The check did not end within {args.max_seconds:g} s (a napplet that hangs "
                "its frame or the browser?); this report holds what was recorded until then.",
            )
        )
        finish(run.conclude(), None)
        os._exit(1)  # Playwright's call may never return; its driver ends with this process

    try:
        out.mkdir(parents=True, exist_ok=True)
        clear_reports(out)
    except OSError as exc:
        print(f"napllm-check: {printable(str(exc))}", file=sys.stderr)
        return 2
    watchdog = threading.Timer(args.max_seconds, overran)
    watchdog.daemon = True
    try:
        if not args.napplet.is_file():
            raise CheckSetupError(f"no napplet file at {args.napplet}")
        script_text = args.script.read_text(encoding="utf-8")
        try:
            parse_script(script_text)
        except ScriptError as exc:
            raise CheckSetupError(f"{args.script}: {exc}") from None
        steps: list[Step] = []
        if args.steps is not None:
            try:
                steps = parse_steps(args.steps.read_text(encoding="utf-8"))
            except StepsError as exc:
                raise CheckSetupError(f"{args.steps}: {exc}") from None
        watchdog.start()
        run_check(
            args.napplet.resolve(),
            script_text,
            steps,
            dist=args.dist,
            out=out,
            chromium=args.chromium,
            timeout_ms=args.timeout_ms,
            settle_ms=args.settle_ms,
            run=run,
            guard=HangGuard(hung),
        )
    except (CheckSetupError, OSError, UnicodeDecodeError) as exc:
        watchdog.cancel()
        return finish([], str(exc))
    except Exception as exc:  # the browser or its driver failed under the napplet
        watchdog.cancel()
        run.findings.append(
            Finding(
                "check-aborted", f"The check ended early: {type(exc).__name__}: {_first_line(exc)}"
            )
        )
        return finish(run.conclude(), None)
    watchdog.cancel()
    return finish(run.conclude(), None)


if __name__ == "__main__":
    raise SystemExit(main())
