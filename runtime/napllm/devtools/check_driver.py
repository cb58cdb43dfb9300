"""`napllm-check`'s driver: the shell page driven as a person drives it.

`_Driver` boots the shell, adds the scripted connection, opens the napplet
and performs the steps (`check_steps`); `_python_started` waits for a
Python napplet's scripts before the first step. `check.run_check` uses
them (its module docstring describes the whole check).

CPython only: this module drives Playwright objects it is handed and is
never imported by the runtime in the page.
"""

from __future__ import annotations

import re
import time
from typing import Any

from .analysis import Finding
from .check_observe import Run
from .check_report import printable
from .check_steps import (
    ChooserStep,
    ClickStep,
    ConsentStep,
    FillStep,
    PressStep,
    ReloadStep,
    Step,
    WaitForTextStep,
    WaitStep,
)

CONNECTION_NAME = "napllm-check script"
BOOT_TIMEOUT_MS = 180_000
#: How long a Python napplet may take to start (Pyodide boot and its scripts), ms.
PYTHON_BOOT_MS = 120_000
#: The `data-napplet-python` states of a Python napplet whose scripts all ran.
PYTHON_DONE = ("ready", "error")


class CheckSetupError(Exception):
    """The check could not run (bad input file, no shell, boot failure)."""


class _Driver:
    """Drives the shell page like a person (see the module docstring)."""

    def __init__(self, page: Any, run: Run, base: str, timeout_ms: int) -> None:
        self.page = page
        self.run = run
        self.base = base
        self.timeout_ms = timeout_ms
        self.tab_key = ""
        #: The napplet is a Python napplet (set once its frame showed `data-napplet-python`).
        self.python = False
        self.python_boot_ms = PYTHON_BOOT_MS

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

    def python_state(self) -> str | None:
        """The napplet's `data-napplet-python` state (web/js/python-loader.js), None for JavaScript.

        Read through a locator (Playwright's utility world): no napplet
        script is called.
        """
        root = self.frame.locator("html[data-napplet-python]")
        if root.count() == 0:
            return None
        return root.first.get_attribute("data-napplet-python", timeout=self.timeout_ms) or ""

    def wait_for_python(self, timeout_ms: int) -> str:
        """Wait until every `<script type="py">` of the napplet ran (`ready` or `error`).

        Returns the state then; raises Playwright's `TimeoutError` after
        `timeout_ms` (the caller reads the state reached).
        """
        done = ", ".join(f"html[data-napplet-python={state}]" for state in PYTHON_DONE)
        self.frame.locator(done).first.wait_for(state="attached", timeout=timeout_ms)
        return self.python_state() or ""

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
            frames = f"#{self.tab_key}-panel iframe.napplet-frame"
            old = self.page.query_selector(frames)
            self.page.locator(f"#{self.tab_key}-panel .reload").first.click(timeout=timeout)
            if self.python:  # the fresh frame boots Python again before the next step
                self.page.wait_for_function(
                    "([sel, old]) => { const f = document.querySelector(sel);"
                    " return !!f && f !== old && f.srcdoc.length > 0; }",
                    arg=[frames, old],
                    timeout=timeout,
                )
                self.frame.locator("html[data-napplet-python]").wait_for(
                    state="attached", timeout=timeout
                )
                self.wait_for_python(self.python_boot_ms)


def _python_started(driver: _Driver, python_boot_ms: int, run: Run) -> bool:
    """Wait for a Python napplet's scripts (docs/design.md, "Python napplets"); False if never.

    A JavaScript napplet returns at once. A Python napplet still `running`
    its scripts at the bound (a top-level loop) counts as started: its
    steps are performed (a `reload` step waits for the fresh frame's
    scripts too, up to the same bound; past it, that step failed). One
    still `loading`/`booting` adds the
    `napplet-unresponsive` finding and returns False.
    """
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    state = driver.python_state()
    driver.python = state is not None
    if state is None or state in PYTHON_DONE:
        return True
    try:
        driver.wait_for_python(python_boot_ms)
        return True
    except PlaywrightTimeout:
        state = driver.python_state()
    if state == "running" or state in PYTHON_DONE:
        return True
    run.findings.append(
        Finding(
            "napplet-unresponsive",
            f"The napplet's Python did not start within {python_boot_ms} ms "
            f"(still {printable(str(state))!r}).",
            {"python": state},
        )
    )
    return False
