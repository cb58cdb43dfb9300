"""A page object for the real napllm shell (web/ + napllm in Pyodide) in Chromium.

`ShellPage` boots the shell and drives it the way a person does: the
napplet URL form, the chooser and consent dialogs (clicks, Esc), the
profile switcher and the connections panel. `Napplet` wraps one open tab
whose frame runs ``napplets/probe.html``: the test posts envelopes from
inside the sandboxed frame and reads back what the shell delivered to it.

Models: a test that only needs deterministic answers boots the product
dist/ (``product_url``, `ShellPage.boot` with ``query=""``) and adds a
*scripted connection* through the connections form
(`scripted_connection`: every turn it will play, the same JSON a napplet
developer pastes, docs/napplets.md). Its entry counts the requests it
received (`ShellPage.script_requests`), which proves that nothing reached
it before consent. Only what no real feature can do uses the test build's
hooks (``index.html?test=1`` of dist-test/: the fixture connections
``fx-*`` and ``window.napllmTest``; see tests/hooks/): raw or hostile
LMSP event sequences, the LMSP request a provider received, the
generation deadline.

Rules
- Only DOM ids and classes of web/ that are part of its markup contract are
  used: ``#napplet-url``, ``#napplet-url-open``, ``.tab``/``tab-N-panel``,
  ``iframe.napplet-frame``, ``.reload``/``.close``/``.llm-toggle`` in a
  tab's toolbar, ``dialog.chooser-dialog`` / ``dialog.consent-dialog`` with
  ``.candidate`` (``data-candidate-id``, ``.candidate-name``) and
  ``.allow`` / ``.deny`` / ``.remember``, ``#account-*``, ``#connection-*``
  and ``#notice-list``.
- Every wait is bounded (`TIMEOUT_MS`); nothing sleeps except the short
  `QUIET_MS` used to observe that *nothing more* arrives.
- `check_generation` asserts the delta and terminal rules of NAP-LLM (Delta;
  Wire Protocol) on what one frame received, the same rules the core suite
  checks on its recording transport.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote

import envelope_rules
from fixtures import user
from napllm.lmsp import LmspEvent
from napllm.providers.fixture import Crash, Fail, Stall, Step

Page = Any
Frame = Any

HERE = Path(__file__).resolve().parent
NAPPLETS = HERE / "napplets"
#: Folder under the test pages (served as ``/_test/``) that holds ``napplets/``.
NAPPLET_DIR = "napplets"

TIMEOUT_MS = 15_000
#: How long a Python napplet may take to boot Pyodide and run its scripts.
PYTHON_TIMEOUT_MS = 90_000
#: How long "nothing more arrives" is observed after a terminal result.
QUIET_MS = 250
#: Polling interval of waits inside frames. The default (requestAnimationFrame)
#: never fires in the frame of a hidden tab.
POLL_MS = 20


def steps_json(script: list[Step | dict[str, Any]]) -> str:
    """A fixture script as the JSON text `napllmTest.queue` takes (see `steps_from_json`)."""
    out: list[dict[str, Any]] = []
    for step in script:
        if isinstance(step, LmspEvent):
            out.append({"event": step.event, "data": step.data})
        elif isinstance(step, Stall):
            out.append({"stall": step.seconds})
        elif isinstance(step, Fail):
            spec: dict[str, Any] = {"detail": step.detail, "code": step.code.value}
            if step.user_hint is not None:
                spec["userHint"] = step.user_hint
            out.append({"fail": spec})
        elif isinstance(step, Crash):
            out.append({"crash": step.message})
        else:
            out.append(step)
    return json.dumps(out)


def install_napplets(test_pages_dir: Path, dist_url: str) -> str:
    """Copy ``napplets/`` into the served test pages; returns its base URL (ends in ``/``)."""
    target = test_pages_dir / NAPPLET_DIR
    shutil.copytree(NAPPLETS, target, dirs_exist_ok=True)
    return f"{dist_url}_test/{NAPPLET_DIR}/"


# --------------------------------------------------------------------------- checks


terminal = envelope_rules.terminal
code = envelope_rules.code


def deltas_of(envelopes: list[Any], rid: str) -> list[dict[str, Any]]:
    """The `llm.delta` envelopes of generation `rid`, in arrival order."""
    return [
        e
        for e in envelopes
        if isinstance(e, dict) and e.get("type") == "llm.delta" and e.get("requestId") == rid
    ]


check_generation = envelope_rules.check_generation


# --------------------------------------------------------------------------- napplets


def generate(rid: str, handle: str, *messages: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """An `llm.generate` envelope (default message: one user text)."""
    request = {"handle": handle, "messages": list(messages) or [user("Hello!")], **fields}
    return {"type": "llm.generate", "id": rid, "request": request}


@dataclass
class Napplet:
    """One open tab: its key (``tab-N``), its probe frame and its shell."""

    shell: ShellPage
    key: str
    url: str

    @property
    def page(self) -> Page:
        return self.shell.page

    @property
    def iframe_selector(self) -> str:
        return f"#{self.key}-panel iframe.napplet-frame"

    @property
    def frame(self) -> Frame:
        """The Playwright frame of the tab's current iframe (a new one after a reload)."""
        handle = self.page.wait_for_selector(self.iframe_selector, state="attached")
        frame = handle.content_frame()
        assert frame is not None
        return frame

    def wait_ready(self) -> Frame:
        """Wait until the probe script runs in the tab's current frame."""
        self.page.wait_for_function(
            "(sel) => { const f = document.querySelector(sel); return f && f.srcdoc.length > 0; }",
            arg=self.iframe_selector,
        )
        frame = self.frame
        frame.wait_for_function("() => typeof window.probe === 'object'", polling=POLL_MS)
        return frame

    # -- sending -------------------------------------------------------------------

    def post(self, envelope: Any) -> None:
        """Post `envelope` raw from inside the frame, as the NIP-5D web projection
        does (``window.parent.postMessage``), or to the frame's own window after
        ``probe.useTransport("self")`` (the prelude forwards it over its port)."""
        self.frame.evaluate("(e) => window.probe.post(e)", envelope)

    def post_js(self, expression: str) -> None:
        """Post the value of a JS expression (for values JSON cannot carry: Map, undefined)."""
        self.frame.evaluate(f"() => window.probe.post({expression})")

    def evaluate(self, script: str, arg: Any = None) -> Any:
        """Evaluate in the frame."""
        return self.frame.evaluate(script, arg)

    # -- receiving -----------------------------------------------------------------

    def envelopes(self) -> list[Any]:
        """Everything the shell delivered to this frame, in order."""
        found: list[Any] = self.frame.evaluate("() => window.probe.envelopes()")
        return found

    def wait_for(
        self, rid: str, kind: str = "llm.generate.result", timeout_ms: int = TIMEOUT_MS
    ) -> dict[str, Any]:
        """Wait for the `kind` envelope of id `rid`; returns it (exactly one so far)."""
        self.frame.wait_for_function(
            "([id, type]) => window.probe.envelopes().some("
            "(e) => e && e.type === type && e.id === id)",
            arg=[rid, kind],
            timeout=timeout_ms,
            polling=POLL_MS,
        )
        return terminal(self.envelopes(), rid, kind)

    def quiet(self) -> list[Any]:
        """Everything received, read after `QUIET_MS` of letting late messages arrive."""
        self.page.wait_for_timeout(QUIET_MS)
        return self.envelopes()

    def call(self, method: str, *args: Any) -> int:
        """Start ``window.napplet.llm[method](...args)``; returns its index."""
        index: int = self.frame.evaluate(
            "([m, a]) => window.probe.call(m, ...a)", [method, list(args)]
        )
        return index

    def call_generate(self, request: dict[str, Any]) -> int:
        """Start ``window.napplet.llm.generate(request)`` with delta collection."""
        index: int = self.frame.evaluate("(r) => window.probe.generate(r)", request)
        return index

    def outcome(self, index: int, timeout_ms: int = TIMEOUT_MS) -> dict[str, Any]:
        """Wait for call `index` to settle; `{"state": "ok"|"error", ...}`."""
        self.frame.wait_for_function(
            "(i) => window.probe.calls[i].state !== 'pending'",
            arg=index,
            timeout=timeout_ms,
            polling=POLL_MS,
        )
        record: dict[str, Any] = self.frame.evaluate("(i) => window.probe.calls[i]", index)
        return record

    # -- flows ---------------------------------------------------------------------

    def select(
        self, connection: str, rid: str = "s1", requirements: dict[str, Any] | None = None
    ) -> str:
        """`llm.select` answered by clicking `connection` in the chooser; returns the handle."""
        envelope: dict[str, Any] = {"type": "llm.select", "id": rid}
        if requirements is not None:
            envelope["requirements"] = requirements
        self.post(envelope)
        self.shell.choose(connection)
        result = self.wait_for(rid, "llm.select.result")
        assert "model" in result, result
        handle: str = result["model"]["handle"]
        return handle

    def run(self, envelope: dict[str, Any], *, allow: bool | None = True) -> dict[str, Any]:
        """Send a generate; answer the consent dialog (unless `allow` is None); return
        the checked terminal result."""
        self.post(envelope)
        if allow is True:
            self.shell.allow()
        elif allow is False:
            self.shell.deny()
        self.wait_for(envelope["id"])
        return check_generation(self.quiet(), envelope["id"])

    # -- the tab -------------------------------------------------------------------

    def toolbar(self, cls: str) -> Any:
        return self.page.locator(f"#{self.key}-panel .tab-toolbar .{cls}")

    def press(self, locator: Any) -> None:
        """Click `locator`; while a modal dialog makes the page inert (a person could not
        click it then), the click event is dispatched to it instead."""
        if self.shell.open_dialogs() > 0:
            locator.dispatch_event("click")
        else:
            locator.click()

    def show(self) -> None:
        """Select the tab."""
        self.press(self.page.locator(f"#{self.key}-tab"))

    def reload(self) -> Frame:
        """The tab's Reload button: a fresh frame (a new endpoint)."""
        old = self.frame.frame_element()  # before the click: the element goes away
        self.show()
        self.press(self.toolbar("reload"))
        self.page.wait_for_function(
            "([sel, old]) => { const f = document.querySelector(sel);"
            " return f && f !== old && f.srcdoc.length > 0; }",
            arg=[self.iframe_selector, old],
        )
        return self.wait_ready()

    def set_llm(self, on: bool) -> Frame:
        """Flip the tab's "LLM access" switch (a fresh frame either way)."""
        self.show()
        toggle = self.toolbar("llm-toggle")
        if toggle.is_checked() != on:
            old = self.frame.frame_element()
            self.press(toggle)
            self.page.wait_for_function(
                "([sel, old]) => { const f = document.querySelector(sel);"
                " return f && f !== old && f.srcdoc.length > 0; }",
                arg=[self.iframe_selector, old],
            )
        return self.wait_ready()

    def close(self) -> None:
        """The tab's Close button."""
        if self.page.locator(f"#{self.key}-tab").count() == 0:
            return
        self.show()
        self.press(self.toolbar("close"))
        self.page.locator(f"#{self.key}-tab").wait_for(state="detached")


class ShellPage:
    """The booted shell page; see the module docstring."""

    def __init__(self, page: Page, dist_url: str, napplets_url: str) -> None:
        self.page = page
        self.dist_url = dist_url
        self.napplets_url = napplets_url
        self.open: list[Napplet] = []
        self.test_mode = False
        page.set_default_timeout(TIMEOUT_MS)

    @property
    def probe_url(self) -> str:
        return self.napplets_url + "probe.html"

    def boot(self, query: str = "?test=1") -> None:
        """Load the shell and wait until the runtime is attached (with the hooks when
        `query` has ``test=1`` and the page is the test build)."""
        self.open = []
        self.test_mode = "1" in parse_qs(query.removeprefix("?")).get("test", [])
        self.page.goto(f"{self.dist_url}index.html{query}")
        self.page.wait_for_function(
            "() => ['ready', 'failed'].includes(document.body.dataset.boot)",
            timeout=60_000,
        )
        assert self.page.evaluate("document.body.dataset.boot") == "ready", self.page.evaluate(
            "document.querySelector('#boot-error-message').textContent"
        )
        if self.test_mode:
            self.page.wait_for_function("() => typeof window.napllmTest === 'object'")

    # -- napplets ------------------------------------------------------------------

    def open_napplet(self, url: str | None = None) -> Napplet:
        """Open a napplet through the URL form; waits until its probe runs."""
        url = url or self.probe_url
        before = self.page.locator("#napplet-tabs .tab").count()
        self.page.fill("#napplet-url", url)
        self.page.click("#napplet-url-open")
        return self.adopt(url, before)

    def open_python(self, url: str, timeout_ms: int = PYTHON_TIMEOUT_MS) -> Napplet:
        """Open a Python napplet (``<meta name="napplet-python">``) through the URL form
        and wait until its loader is done: ``<html data-napplet-python>`` is
        ``ready`` or ``error`` (web/js/python-loader.js). Read the frame (`Napplet.frame`)
        for what its scripts did."""
        before = self.page.locator("#napplet-tabs .tab").count()
        self.page.fill("#napplet-url", url)
        self.page.click("#napplet-url-open")
        self.page.wait_for_function(
            "(n) => document.querySelectorAll('#napplet-tabs .tab').length > n", arg=before
        )
        tab_id: str = self.page.locator("#napplet-tabs .tab").last.get_attribute("id") or ""
        napplet = Napplet(self, tab_id.removesuffix("-tab"), url)
        self.open.append(napplet)
        napplet.frame.wait_for_function(
            "() => ['ready', 'error'].includes(document.documentElement.dataset.nappletPython)",
            timeout=timeout_ms,
            polling=100,
        )
        return napplet

    def adopt(self, url: str, before: int = 0) -> Napplet:
        """The napplet of the newest tab once there are more than `before` tabs (a tab
        opened by the ``?napplet=<url>`` query, for instance)."""
        self.page.wait_for_function(
            "(n) => document.querySelectorAll('#napplet-tabs .tab').length > n", arg=before
        )
        tab_id: str = self.page.locator("#napplet-tabs .tab").last.get_attribute("id") or ""
        napplet = Napplet(self, tab_id.removesuffix("-tab"), url)
        napplet.wait_ready()
        self.open.append(napplet)
        return napplet

    def close_all(self) -> None:
        """Close every tab the tests opened (their endpoints close, work is cancelled)."""
        for napplet in self.open:
            napplet.close()
        self.open = []

    # -- dialogs -------------------------------------------------------------------

    def chooser(self) -> Any:
        """The open chooser dialog (waits for it)."""
        dialog = self.page.locator("dialog.chooser-dialog[open]")
        dialog.wait_for(state="visible")
        return dialog

    def candidates(self) -> list[str]:
        """The connection names the open chooser offers."""
        names: list[str] = self.chooser().locator(".candidate .candidate-name").all_inner_texts()
        return names

    def choose(self, name: str) -> None:
        """Click the candidate named `name` in the chooser."""
        dialog = self.chooser()
        exact = re.compile("^" + re.escape(name) + "$")
        name_span = self.page.locator(".candidate-name", has_text=exact)
        dialog.locator(".candidate", has=name_span).click()
        dialog.wait_for(state="detached")

    def cancel_chooser(self) -> None:
        """The chooser's Cancel button."""
        dialog = self.chooser()
        dialog.get_by_role("button", name="Cancel").click()
        dialog.wait_for(state="detached")

    def consent(self) -> Any:
        """The open consent dialog (waits for it)."""
        dialog = self.page.locator("dialog.consent-dialog[open]")
        dialog.wait_for(state="visible")
        return dialog

    def allow(self, remember: bool = False) -> None:
        """Click Allow (optionally ticking "remember" first)."""
        dialog = self.consent()
        if remember:
            dialog.locator("input.remember").check()
        dialog.locator("button.allow").click()
        dialog.wait_for(state="detached")

    def remember(self) -> None:
        """Allow with the standing-permission box ticked."""
        self.allow(remember=True)

    def deny(self) -> None:
        """Click Deny."""
        dialog = self.consent()
        dialog.locator("button.deny").click()
        dialog.wait_for(state="detached")

    def escape(self, kind: str) -> None:
        """Press Esc in the open `kind` ("chooser"/"consent") dialog."""
        dialog = self.chooser() if kind == "chooser" else self.consent()
        self.page.keyboard.press("Escape")
        dialog.wait_for(state="detached")

    def open_dialogs(self) -> int:
        """How many chooser/consent dialogs are in the page."""
        count: int = self.page.locator("#dialog-host dialog").count()
        return count

    # -- profiles ------------------------------------------------------------------

    def add_profile(self, name: str) -> None:
        """Create profile `name` with the "New profile" form (it becomes current)."""
        self.page.click("#account-add")
        self.page.fill("#account-new-name", name)
        self.page.locator("#account-add-form button[type=submit]").click()
        self.page.wait_for_function(
            "(n) => document.querySelector('#account-select').value === n", arg=name
        )

    def switch_account(self, name: str) -> None:
        """Switch to existing profile `name` with the profile switcher.

        While a modal dialog is open the page is inert for a person; the
        selection is then made programmatically (same `change` event).
        """
        if self.open_dialogs() > 0:
            self.page.select_option("#account-select", name, force=True)
        else:
            self.page.select_option("#account-select", name)
        self.page.wait_for_function(
            "(n) => document.querySelector('#account-select').value === n", arg=name
        )

    # -- scripted connections (real features) -------------------------------------

    def scripted(self, name: str, script: Script) -> None:
        """Add (or edit, when it exists) the scripted connection `name` with `script`."""
        scripted_connection(self.page, name, script)

    def remove_connection(self, name: str) -> None:
        """Remove the user connection `name` with its entry's Remove button."""
        remove_connection(self.page, name)

    def script_requests(self, name: str) -> int:
        """The requests scripted connection `name` received (its entry's count)."""
        return script_requests(self.page, name)

    def script_stopped(self, name: str) -> int:
        """Streams of scripted connection `name` closed before their end (its entry)."""
        return script_stopped(self.page, name)

    def generate_requests(self) -> list[dict[str, Any]]:
        """The ``llm.generate`` envelopes napplets sent, as the envelope inspector
        lists them (oldest first; the inspector is opened if it is closed)."""
        return inspected_generate_requests(self.page)

    # -- test hooks ----------------------------------------------------------------

    def queue(self, connection_id: str, script: list[Any]) -> None:
        """Script the next submission to fixture `connection_id`."""
        self.page.evaluate(
            "([c, s]) => window.napllmTest.queue(c, s)", [connection_id, steps_json(script)]
        )

    def stats(self, connection_id: str) -> dict[str, Any]:
        """`napllmTest.stats`: submissions, closedEarly and the LMSP requests."""
        text = self.page.evaluate("(c) => window.napllmTest.stats(c)", connection_id)
        stats: dict[str, Any] = json.loads(text)
        return stats

    def submissions(self, connection_id: str) -> int:
        """Provider submissions so far to fixture `connection_id`."""
        return int(self.stats(connection_id)["submissions"])

    def set_deadline(self, seconds: float) -> None:
        """The runtime's generation deadline (consent wait included)."""
        self.page.evaluate("(s) => window.napllmTest.setDeadline(s)", seconds)

    def rename_connection(self, connection_id: str, name: str) -> None:
        """Edit a fixture connection (a new revision: its handles expire)."""
        self.page.evaluate(
            "([c, n]) => window.napllmTest.editConnection(c, n)", [connection_id, name]
        )

    def notices(self) -> list[str]:
        """The texts of the notices shown in the shell UI."""
        texts: list[str] = self.page.locator("#notice-list .notice").all_inner_texts()
        return texts

    def reset(self) -> None:
        """Return the shared page to a clean state between tests."""
        self.close_all()
        for _ in range(8):
            if self.open_dialogs() == 0:
                break
            self.page.keyboard.press("Escape")
            self.page.wait_for_timeout(50)
        assert self.open_dialogs() == 0, "a dialog outlived its napplet"
        if self.test_mode:
            self.set_deadline(300.0)
        if self.page.locator("#account-select").input_value() != "Default":
            self.switch_account("Default")
        for button in self.page.locator("#grant-list button.revoke").all():
            button.click()
        self.page.wait_for_function("() => !document.querySelector('#grant-list button.revoke')")


# --------------------------------------------------------------------------- connections form

#: A script: its JSON text, or a list of turns / a script object (docs/napplets.md).
Script = str | list[Any] | dict[str, Any]
SCRIPTED_KIND = "scripted"


def connection_entry(page: Page, name: str) -> Any:
    """The connections panel's entry whose heading is exactly `name`."""
    exact = re.compile("^" + re.escape(name) + "$")
    heading = page.locator("h3", has_text=exact)  # inside the entry (`has` is relative)
    return page.locator("#connection-list li.connection", has=heading)


def scripted_connection(page: Page, name: str, script: Script) -> None:
    """Add the scripted connection `name` through the connections form, or edit
    it (a new revision: the script starts again at turn 1, its handles expire)
    when an entry of that name exists.

    The one place that drives the add/edit form (``#connection-add``, the
    entry's ``button.edit``, ``#connection-name``, ``#connection-kind``,
    ``#connection-script``, ``#connection-save``, ``#connection-form-error``).
    Waits until the form closes; fails with the form's error text if the
    shell refused the script.
    """
    text = script if isinstance(script, str) else json.dumps(script)
    entry = connection_entry(page, name)
    if entry.count() > 0:
        entry.locator("button.edit").click()
    else:
        page.click("#connection-add")
        page.fill("#connection-name", name)
        page.select_option("#connection-kind", SCRIPTED_KIND)
    page.fill("#connection-script", text)
    page.click("#connection-save")
    page.wait_for_function(
        "() => document.querySelector('#connection-form').hidden"
        " || document.querySelector('#connection-form-error').textContent.trim() !== ''"
    )
    error = (page.locator("#connection-form-error").text_content() or "").strip()
    assert page.locator("#connection-form").is_hidden(), f"the shell refused the script: {error}"
    connection_entry(page, name).wait_for()


def remove_connection(page: Page, name: str) -> None:
    """Remove user connection `name`: its entry's Remove button, then the confirmation."""
    entry = connection_entry(page, name)
    entry.locator("button.remove").click()
    entry.locator("button.confirm-remove").click()
    entry.wait_for(state="detached")


def script_requests(page: Page, name: str) -> int:
    """The "Requests received" count shown in scripted connection `name`'s entry."""
    count = connection_entry(page, name).locator(".script-progress")
    return int(count.get_attribute("data-requests") or "0")


def script_stopped(page: Page, name: str) -> int:
    """How many streams scripted connection `name` shows as stopped before their end."""
    count = connection_entry(page, name).locator(".script-progress")
    return int(count.get_attribute("data-stopped") or "0")


def inspected_generate_requests(page: Page) -> list[dict[str, Any]]:
    """Every ``llm.generate`` envelope the inspector lists as received ("in"), parsed."""
    page.evaluate("() => { document.querySelector('details.inspector-wrap').open = true; }")
    # Rendered once open: as many rows as the count line says are shown.
    page.wait_for_function(
        "() => { const n = parseInt(document.querySelector('#inspector-count').textContent, 10);"
        " return n > 0 && document.querySelectorAll('#inspector-list > li').length === n; }"
    )
    texts: list[str] = page.eval_on_selector_all(
        "#inspector-list > li.dir-in",
        "(items) => items.map((li) => li.querySelector('pre').textContent)",
    )
    found = []
    for text in texts:
        try:
            value = json.loads(text)
        except ValueError:
            continue
        if isinstance(value, dict) and value.get("type") == "llm.generate":
            found.append(value)
    return found


def napplet_query(url: str) -> str:
    """The shell's ``?napplet=<url>`` development query."""
    return "?napplet=" + quote(url, safe="")


def wait_deltas(napplet: Napplet, rid: str, count: int = 1) -> None:
    """Wait until at least `count` deltas of `rid` reached `napplet`."""
    napplet.frame.wait_for_function(
        "([id, n]) => window.probe.envelopes().filter("
        "(e) => e && e.type === 'llm.delta' && e.requestId === id).length >= n",
        arg=[rid, count],
        polling=POLL_MS,
    )


def linked_napplet_frame(page: Any, index: int = 0) -> Any:
    """The content frame of the `index`-th napplet frame, with LLM access on.

    A napplet opened by a link (`?napplet=`) or the URL form starts with LLM
    access off: its tab's switch is turned on (the shell then builds a fresh
    frame) before the frame is returned, loaded.
    """
    frames = "iframe.napplet-frame"
    page.wait_for_function(
        "([sel, n]) => { const f = document.querySelectorAll(sel)[n];"
        " return f && f.srcdoc.length > 0; }",
        arg=[frames, index],
    )
    toggle = page.locator(".llm-toggle").nth(index)
    if not toggle.is_checked():
        old = page.query_selector_all(frames)[index]
        toggle.click()
        page.wait_for_function(
            "([sel, n, old]) => { const f = document.querySelectorAll(sel)[n];"
            " return f && f !== old && f.srcdoc.length > 0; }",
            arg=[frames, index, old],
        )
    frame = page.query_selector_all(frames)[index].content_frame()
    frame.wait_for_load_state("load")
    return frame


# --------------------------------------------------------------------------- booting


def boot_shell(
    page: Page,
    dist_url: str,
    test_pages_dir: Path,
    query: str = "?test=1",
    scripts: dict[str, Script] | None = None,
) -> ShellPage:
    """A booted `ShellPage` on `page`: the shell at `dist_url` (the test build,
    or the product with ``query=""``), the test napplets installed under the
    test pages, and one scripted connection per entry of `scripts` (name ->
    script) added through the connections form, in order."""
    shell = ShellPage(page, dist_url, install_napplets(test_pages_dir, dist_url))
    shell.boot(query)
    for name, script in (scripts or {}).items():
        shell.scripted(name, script)
    return shell
