"""`napllm-check`: run a napplet in the real shell, headless, and report misuse.

Usage (docs/napplets.md, "Checking a napplet in CI")::

    napllm-check my-napplet.html --script turns.json --steps steps.json \
        [--dist dist] [--out napllm-check-out] [--chromium /usr/bin/chromium]

What it does
1. Validates the script (`providers.scripted.parse_script`) and the steps
   (`parse_steps`) first; a bad file is exit status 2 with a positioned
   message.
2. Serves the built shell (`--dist`, default `./dist`) and the napplet's
   folder (under `/_napplet/`) on 127.0.0.1 with the headers of
   `build.py serve`, and starts Chromium (`--chromium`, default
   `$NAPLLM_CHROMIUM` or Debian's `/usr/bin/chromium`) through Playwright
   with the offline flags of the browser tests: every name but 127.0.0.1
   is unresolvable and every request elsewhere is aborted and reported.
3. Drives the shell as a person does, with no test hooks: waits for the
   runtime, opens the envelope inspector, adds a "Scripted responses"
   connection with the script through the connections form, opens the
   napplet by URL (dev mode, like `?napplet=<url>`), turns its tab's "LLM
   access" on when it is off, then performs the steps. Dialog buttons are
   clicked only once enabled (dialogs may arm after a short delay).
4. Records every envelope the inspector lists, and in the napplet frame
   (an init script): unhandled rejections, uncaught errors,
   `console.error` calls and `securitypolicyviolation` events.
5. Writes `report.json`, `junit.xml` and `screenshot.png` into `--out`
   and exits 0 when there is no finding, 1 when there is one
   (`analysis` lists the kinds), 2 when the check could not run.

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
import json
import os
import re
import sys
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..jsontext import JsonTextError, read_json
from ..providers.scripted import ScriptError, parse_script
from .analysis import CATEGORIES, Envelope, Finding, analyse_envelopes, analyse_frame_events
from .headless import CHROMIUM, CHROMIUM_ARGS, DistServer, make_server

CONNECTION_NAME = "napllm-check script"
NAPPLET_PREFIX = "/_napplet/"
BOOT_TIMEOUT_MS = 180_000

#: Runs in every frame before its own scripts; reports from napplet frames only.
FRAME_SCRIPT = r"""
(() => {
  if (window === window.top) return;
  const report = (kind, data) => {
    try { window.__napllmCheckFrame(kind, data); } catch (e) { /* binding not ready */ }
  };
  const text = (value) => {
    try { return value instanceof Error ? `${value.name}: ${value.message}` : String(value); }
    catch (e) { return "(unprintable)"; }
  };
  window.addEventListener("unhandledrejection", (event) => {
    const reason = event.reason;
    if (reason && reason.name === "LlmError") {
      report("unhandled-llm-error", { code: String(reason.code), message: String(reason.message) });
    } else {
      report("page-error", { message: "unhandled rejection: " + text(reason) });
    }
  });
  window.addEventListener("error", (event) => {
    report("page-error", { message: text(event.error ?? event.message) });
  });
  document.addEventListener("securitypolicyviolation", (event) => {
    const directive = String(event.violatedDirective);
    report("csp", { blockedURI: String(event.blockedURI), directive });
  });
  const original = console.error;
  console.error = function (...args) {
    report("console-error", { message: args.map(text).join(" ").slice(0, 2000) });
    return original.apply(this, args);
  };
})();
"""

#: Runs in the shell page: reports each inspector entry once, as it is rendered.
SHELL_SCRIPT = r"""
(() => {
  if (window !== window.top) return;
  const seen = new WeakSet();
  const keys = new Set();
  const take = (item) => {
    if (!(item instanceof Element) || !item.matches("li.inspector-entry") || seen.has(item)) return;
    seen.add(item);
    const time = item.querySelector("time")?.dateTime ?? "";
    const body = item.querySelector("pre")?.textContent ?? "";
    const key = [time, item.dataset.direction, item.dataset.endpoint, body].join("\u0000");
    if (keys.has(key)) return;
    keys.add(key);
    window.__napllmCheckEnvelope(item.dataset.endpoint ?? "", item.dataset.direction ?? "", body);
  };
  const start = () => {
    const list = document.querySelector("#inspector-list");
    if (!list) return;
    new MutationObserver((records) => {
      for (const record of records) for (const node of record.addedNodes) take(node);
    }).observe(list, { childList: true });
    for (const node of list.children) take(node);
  };
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
"""


class CheckSetupError(Exception):
    """The check could not run (bad input file, no shell, boot failure)."""


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


def serve(dist: Path, napplet_dir: Path) -> DistServer:
    """Serve dist/ at `/` and the napplet's folder at `NAPPLET_PREFIX`, with
    `build.py serve`'s headers (`headless.make_server`), on a free 127.0.0.1
    port in a daemon thread; returns the running server."""
    server = make_server(dist, quiet=True, overlays={NAPPLET_PREFIX: napplet_dir})
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


# --------------------------------------------------------------------------- the run


@dataclass
class Run:
    """Everything one check recorded."""

    napplet: str
    envelopes: list[Envelope] = field(default_factory=list)
    frame_events: list[dict[str, Any]] = field(default_factory=list)
    outside_requests: list[str] = field(default_factory=list)
    shell_console: list[str] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    screenshot: str | None = None

    def conclude(self) -> list[Finding]:
        """Every finding: failed steps, protocol, frame events, requests that left."""
        found = list(self.findings)
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
            frame.wait_for_load_state("load")

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
    timeout_ms: int = 15_000,
    settle_ms: int = 500,
) -> Run:
    """Run the check (see the module docstring); returns what it recorded.

    Raises `CheckSetupError` when the shell or the browser cannot be used.
    """
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import sync_playwright

    if not (dist / "index.html").is_file():
        raise CheckSetupError(f"no built shell at {dist} (run python3 build.py, or pass --dist)")
    if not Path(chromium).exists():
        raise CheckSetupError(f"Chromium not found at {chromium} (pass --chromium)")
    out.mkdir(parents=True, exist_ok=True)
    run = Run(napplet=str(napplet))
    server = serve(dist.resolve(), napplet.parent.resolve())
    base = f"http://127.0.0.1:{server.server_address[1]}/"
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, args=list(CHROMIUM_ARGS))
            context = browser.new_context(service_workers="block")
            context.expose_binding(
                "__napllmCheckFrame",
                lambda _source, kind, data: run.frame_events.append(
                    {"kind": str(kind), "data": data if isinstance(data, dict) else {}}
                ),
            )
            context.expose_binding("__napllmCheckEnvelope", _envelope_recorder(run))
            context.add_init_script(FRAME_SCRIPT)
            context.add_init_script(SHELL_SCRIPT)

            def guard(route: Any) -> None:
                url = route.request.url
                if url.startswith(base) or url.startswith(("data:", "blob:", "about:")):
                    route.continue_()
                else:
                    run.outside_requests.append(url)
                    route.abort()

            context.route("**/*", guard)
            page = context.new_page()
            page.on(
                "console",
                lambda m: (
                    run.shell_console.append(f"{m.type}: {m.text}") if m.type == "error" else None
                ),
            )
            driver = _Driver(page, run, base, timeout_ms)
            driver.boot()
            driver.add_connection(script_text)
            driver.open_napplet(f"{base}{NAPPLET_PREFIX.strip('/')}/{napplet.name}")
            for index, step in enumerate(steps):
                record: dict[str, Any] = {"index": index, "step": describe_step(step)}
                try:
                    driver.perform(step)
                    record["ok"] = True
                except PlaywrightError as exc:
                    record["ok"] = False
                    first = str(exc).strip().splitlines()[0] if str(exc).strip() else "failed"
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
            page.wait_for_timeout(settle_ms)
            # Let the inspector render what arrived last (it renders per frame).
            page.evaluate(
                "() => new Promise((r) => requestAnimationFrame(() => setTimeout(r, 50)))"
            )
            shot = out / "screenshot.png"
            page.screenshot(path=str(shot), full_page=True)
            run.screenshot = str(shot)
            context.close()
            browser.close()
    finally:
        server.shutdown()
        server.server_close()
    return run


def _envelope_recorder(run: Run) -> Any:
    def record(_source: Any, endpoint: Any, direction: Any, body: Any) -> None:
        text = str(body)
        try:
            value = json.loads(text)
        except ValueError:
            value = None
        run.envelopes.append(Envelope(str(endpoint), str(direction), value, text))

    return record


# --------------------------------------------------------------------------- reports


def report_json(run: Run, findings: list[Finding]) -> dict[str, Any]:
    """The JSON report: verdict, findings, steps, envelopes, shell console errors."""
    return {
        "napplet": run.napplet,
        "ok": not findings,
        "findings": [f.to_json() for f in findings],
        "steps": run.steps,
        "envelopes": [
            {"endpoint": e.endpoint, "direction": e.direction, "envelope": e.value}
            for e in run.envelopes
        ],
        "shellConsoleErrors": run.shell_console,
        "screenshot": run.screenshot,
    }


def junit_xml(run: Run, findings: list[Finding]) -> str:
    """JUnit XML: one test case per category (steps, protocol, errors, console, network)."""
    categories = ("steps", "protocol", "errors", "console", "network")
    suite = ET.Element(
        "testsuite",
        name="napllm-check",
        tests=str(len(categories)),
        failures=str(len({CATEGORIES.get(f.kind, "other") for f in findings})),
    )
    for category in categories:
        case = ET.SubElement(
            suite, "testcase", classname=f"napllm-check.{Path(run.napplet).name}", name=category
        )
        mine = [f for f in findings if CATEGORIES.get(f.kind, "other") == category]
        if mine:
            failure = ET.SubElement(
                case, "failure", message=f"{len(mine)} finding(s)", type=mine[0].kind
            )
            failure.text = "\n".join(f"[{f.kind}] {f.message}" for f in mine)
    return ET.tostring(suite, encoding="unicode", xml_declaration=True)


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
    args = parser.parse_args(argv)
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
        run = run_check(
            args.napplet.resolve(),
            script_text,
            steps,
            dist=args.dist,
            out=args.out,
            chromium=args.chromium,
            timeout_ms=args.timeout_ms,
            settle_ms=args.settle_ms,
        )
    except (CheckSetupError, OSError) as exc:
        print(f"napllm-check: {exc}", file=sys.stderr)
        return 2
    findings = run.conclude()
    (args.out / "report.json").write_text(
        json.dumps(report_json(run, findings), indent=2, ensure_ascii=False), encoding="utf-8"
    )
    (args.out / "junit.xml").write_text(junit_xml(run, findings), encoding="utf-8")
    for finding in findings:
        print(f"[{finding.kind}] {finding.message}")
    verdict = "no findings" if not findings else f"{len(findings)} finding(s)"
    print(f"napllm-check: {args.napplet.name}: {verdict}; report in {args.out}")
    return 1 if findings else 0


if __name__ == "__main__":
    raise SystemExit(main())
