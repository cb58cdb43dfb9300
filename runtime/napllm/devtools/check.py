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
   access" on when it is off, waits for a Python napplet to start (its
   `<html data-napplet-python>` reaching `ready` or `error`: Pyodide booted
   and every `<script type="py">` ran; at most `--python-boot-ms`), then
   performs the steps. Dialog buttons are clicked only once enabled
   (dialogs may arm after a short delay).
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
import os
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from ..providers.scripted import ScriptError, parse_script
from .analysis import Finding
from .check_driver import (
    PYTHON_BOOT_MS,
    CheckSetupError,
    _Driver,
    _python_started,
)
from .check_observe import (
    HangGuard,
    Run,
    _Observer,
)
from .check_report import (
    clear_reports,
    printable,
    summary_lines,
    write_reports,
)
from .check_steps import (
    ReloadStep,
    Step,
    StepsError,
    WaitForTextStep,
    WaitStep,
    describe_step,
    parse_steps,
)
from .headless import CHROMIUM, CHROMIUM_ARGS, DistRequestHandler, DistServer

NAPPLET_PREFIX = "/_napplet/"
#: Added to a timed call's own timeout before `HangGuard` gives up on it (seconds).
STALL_MARGIN_S = 20.0


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
    python_boot_ms: int = PYTHON_BOOT_MS,
    run: Run | None = None,
) -> Run:
    """Run the check (see the module docstring); returns what it recorded.

    `run`: where to record (the caller keeps it to report a run cut short).
    `guard` bounds every call the napplet can block: opening it, each
    step, attaching to its frame and collecting at the end each get
    `timeout_ms` plus a margin. Whatever the napplet does after it is
    opened (never finishing its load, hanging its frame, crashing it) is
    recorded as a finding, not raised. A Python napplet
    (`data-napplet-python` on its root) is given `python_boot_ms` to boot
    Pyodide and run its scripts before the first step; one still loading
    or booting then is `napplet-unresponsive` and no step is performed.
    Raises `CheckSetupError` when the shell or the browser cannot be used.
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
            driver.python_boot_ms = python_boot_ms
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
            opened = True
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
                opened = False
            if opened:
                try:
                    with guard.within(
                        python_boot_ms / 1000 + step_bound_s, "waiting for its Python to start"
                    ):
                        if not _python_started(driver, python_boot_ms, run):
                            steps = []
                except PlaywrightError as exc:
                    run.findings.append(
                        Finding(
                            "napplet-unresponsive",
                            f"The napplet's frame did not answer: {_first_line(exc)}",
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
                    if isinstance(step, ReloadStep) and driver.python:
                        own_ms = python_boot_ms
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
        "--python-boot-ms",
        type=int,
        default=PYTHON_BOOT_MS,
        help="how long a Python napplet may take to start before the first step",
    )
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
            python_boot_ms=args.python_boot_ms,
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
