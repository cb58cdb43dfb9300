"""Accessibility of the shell (the real shell, test build).

- axe-core (the npm devDependency, injected by the test, never part of
  dist/) finds no "serious" or "critical" violation in the start view (also
  at 360 px), an open napplet tab, the chooser, the consent dialog, the
  connection form, the Storage section and the envelope inspector, in the
  light and the dark colour scheme. A failure names each rule id with the
  CSS targets of its nodes.
- Keyboard alone: the Chat napplet is opened, a model chosen, a request
  denied and then allowed, and the answer read with Tab / Shift+Tab / Enter
  only. The dialogs' anti-clickjacking guards stay: Allow and the
  candidates are disabled for the arming delay, and Enter on the consent
  dialog's initial focus (Deny) denies; the path that allows is Tab to
  Allow after it is armed, then Enter (or Space).
- Focus returns to the element that had it after the chooser, the consent
  dialog and the connection form close, and is never dropped to <body> when
  the control that had it goes away (a saved or removed connection, a
  deleted stored model, a dismissed notice, a removed profile, the last
  tab closed).
- The dialogs name their purpose to assistive technology: role dialog,
  modal, a name from their heading and a description; status and progress
  are live regions (the engine progress one region updated in place).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect
from shellpage import POLL_MS, Napplet, ShellPage, generate

from napllm.providers.fixture import text_script

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
AXE = ROOT / "node_modules" / "axe-core" / "axe.min.js"
#: The impact levels that fail a test.
FAILING_IMPACTS = ("serious", "critical")
FULL = "Fixture (all capabilities)"


@pytest.fixture(scope="module")
def shell_context(browser: Any) -> Iterator[Any]:
    """The shared shell page's context, with a desktop viewport."""
    ctx = browser.new_context(viewport={"width": 1280, "height": 900})
    yield ctx
    ctx.close()


def axe_violations(page: Any, include: str | None = None) -> list[dict[str, Any]]:
    """axe-core's violations of the page (or of the `include` selector's subtree).

    Napplet frames are not entered (``iframes: false``): their documents are
    the napplets' own, sandboxed, and axe is not injected into them.
    """
    if not AXE.is_file():
        pytest.fail("axe-core is missing: run `npm ci` (it is a devDependency)")
    if not page.evaluate("() => typeof window.axe === 'object'"):
        page.add_script_tag(path=str(AXE))
    found: list[dict[str, Any]] = page.evaluate(
        """async (include) => {
          const result = await window.axe.run(include ? {include: [include]} : document,
            {iframes: false, resultTypes: ['violations']});
          return result.violations.map((v) => ({
            id: v.id, impact: v.impact, help: v.help,
            targets: v.nodes.map((n) => n.target.join(' ')),
          }));
        }""",
        include,
    )
    return found


def assert_no_serious_violations(page: Any, where: str, include: str | None = None) -> None:
    """Fail with each serious/critical rule id and its targets."""
    bad = [v for v in axe_violations(page, include) if v["impact"] in FAILING_IMPACTS]
    report = "; ".join(f"{v['id']} ({v['impact']}: {v['help']}) at {v['targets']}" for v in bad)
    assert not bad, f"axe in {where}: {report}"


def wait_armed(dialog: Any) -> None:
    dialog.page.wait_for_function(
        "(d) => d.dataset.armed === 'true'", arg=dialog.element_handle(), polling=POLL_MS
    )


# --------------------------------------------------------------------------- axe

#: Every view is checked in the light and the dark colour scheme (contrast differs).
SCHEMES = ("light", "dark")


@pytest.fixture(params=SCHEMES)
def scheme(request: pytest.FixtureRequest, shell: ShellPage) -> Iterator[str]:
    shell.page.emulate_media(color_scheme=request.param)
    yield str(request.param)
    shell.page.emulate_media(color_scheme="light")


def test_axe_start_view(shell: ShellPage, scheme: str) -> None:
    assert shell.page.locator("#napplet-tabs .tab").count() == 0
    assert_no_serious_violations(shell.page, f"the start view ({scheme})")


def test_axe_start_view_on_a_phone(shell: ShellPage, scheme: str) -> None:
    shell.page.set_viewport_size({"width": 360, "height": 740})
    try:
        assert_no_serious_violations(shell.page, f"the start view at 360 px ({scheme})")
    finally:
        shell.page.set_viewport_size({"width": 1280, "height": 900})


def test_axe_open_napplet_tab(shell: ShellPage, scheme: str) -> None:
    shell.open_napplet()
    assert_no_serious_violations(shell.page, f"an open napplet tab ({scheme})")


def test_axe_chooser(shell: ShellPage, scheme: str) -> None:
    napplet = shell.open_napplet()
    napplet.post({"type": "llm.select", "id": "s1"})
    wait_armed(shell.chooser())
    assert_no_serious_violations(shell.page, f"the chooser ({scheme})")
    shell.escape("chooser")


def test_axe_consent_dialog(shell: ShellPage, scheme: str) -> None:
    napplet = shell.open_napplet()
    handle = napplet.select(FULL)
    napplet.post(generate("g1", handle))
    wait_armed(shell.consent())
    assert_no_serious_violations(shell.page, f"the consent dialog ({scheme})")
    shell.deny()


def test_axe_connection_form(shell: ShellPage, scheme: str) -> None:
    shell.page.click("#connection-add")
    shell.page.locator("#connection-form").wait_for(state="visible")
    assert_no_serious_violations(shell.page, f"the connection form ({scheme})")
    shell.page.select_option("#connection-kind", "openai")
    assert_no_serious_violations(shell.page, f"the connection form, OpenAI kind ({scheme})")
    shell.page.click("#connection-cancel")


def test_axe_storage_section(shell: ShellPage, scheme: str) -> None:
    shell.page.locator("#storage").wait_for(state="visible")
    shell.page.locator("#storage-total[data-usage]").wait_for(state="attached")
    assert_no_serious_violations(shell.page, f"the Storage section ({scheme})", "#storage")


def test_axe_envelope_inspector(shell: ShellPage, scheme: str) -> None:
    napplet = shell.open_napplet()
    napplet.post({"type": "llm.describe", "id": "d1"})
    summary = shell.page.locator("details.inspector-wrap > summary")
    summary.click()
    shell.page.locator("#inspector-list li").first.wait_for()
    assert_no_serious_violations(shell.page, f"the envelope inspector ({scheme})")
    summary.click()


# --------------------------------------------------------------------------- keyboard

#: The most Tab presses a walk to one control may take (the whole shell is fewer).
MAX_TABS = 80


def focus_in(page: Any, frame: Any | None = None) -> str:
    """The focused element as ``#id`` or ``tag.class``; inside `frame` when the
    shell's focus is on that frame's <iframe>."""
    describe = """() => { const e = document.activeElement;
      if (!e || e === document.body) return 'body';
      if (e.id) return '#' + e.id;
      const name = typeof e.className === 'string' ? e.className.split(' ')[0] : '';
      const cls = name ? '.' + name : '';
      return e.tagName.toLowerCase() + cls; }"""
    outer: str = page.evaluate(describe)
    if frame is not None and outer.startswith("iframe"):
        inner: str = frame.evaluate(describe)
        return f"{outer} > {inner}"
    return outer


def tab_to(page: Any, target: str, frame: Any | None = None, key: str = "Tab") -> None:
    """Press `key` (Tab or Shift+Tab) until the focus is on `target` (see `focus_in`)."""
    seen = []
    for _ in range(MAX_TABS):
        here = focus_in(page, frame)
        if here == target:
            return
        seen.append(here)
        page.keyboard.press(key)
    raise AssertionError(f"{target} is not reachable with {key}; the focus went {seen}")


def candidate_focused(page: Any) -> str:
    name: str = page.evaluate(
        "() => document.activeElement.querySelector('.candidate-name')?.textContent ?? ''"
    )
    return name


def shift_tab_to_candidate(page: Any, name: str) -> None:
    """Press Shift+Tab in the open chooser until the candidate `name` has the focus."""
    for _ in range(MAX_TABS):
        if candidate_focused(page) == name:
            return
        page.keyboard.press("Shift+Tab")
    assert candidate_focused(page) == name


def test_keyboard_alone_selects_consents_and_gets_the_answer(
    shell: ShellPage, dist_url: str
) -> None:
    """The Chat napplet, opened, used and answered with Tab/Shift+Tab/Enter only."""
    page = shell.page
    page.evaluate("() => document.activeElement?.blur()")
    tab_to(page, "#napplet-url")
    page.keyboard.type(f"{dist_url}napplets/chat/index.html")
    page.keyboard.press("Enter")
    tab = page.locator("#napplet-tabs .tab").last
    tab.wait_for()
    napplet = Napplet(shell, (tab.get_attribute("id") or "").removesuffix("-tab"), "chat")
    shell.open.append(napplet)
    page.wait_for_function(
        "(sel) => document.querySelector(sel)?.srcdoc.length > 0", arg=napplet.iframe_selector
    )
    frame = napplet.frame
    frame.wait_for_function(
        "() => document.querySelector('#choose') && !document.querySelector('#choose').disabled",
        polling=POLL_MS,
    )

    # Select: the chooser opens with the focus on Cancel; the candidates are
    # not reachable until they are armed, then Shift+Tab reaches them.
    tab_to(page, "iframe.napplet-frame > #choose", frame)
    page.keyboard.press("Enter")
    chooser = shell.chooser()
    assert focus_in(page) == f"#{chooser.get_by_role('button', name='Cancel').get_attribute('id')}"
    wait_armed(chooser)
    shift_tab_to_candidate(page, FULL)
    page.keyboard.press("Enter")
    chooser.wait_for(state="detached")
    frame.wait_for_function(
        "() => document.querySelector('#model').textContent.includes('Fixture')"
    )
    # The focus came back to the napplet, which puts it on its message box.
    assert focus_in(page, frame) == "iframe.napplet-frame > #prompt"

    # Enter on the consent dialog's first focus (Deny) denies ...
    submitted = shell.submissions("fx-full")
    tab_to(page, "iframe.napplet-frame > #prompt", frame)
    page.keyboard.type("Hello by keyboard")
    tab_to(page, "iframe.napplet-frame > #send", frame)
    page.keyboard.press("Enter")
    consent = shell.consent()
    assert focus_in(page).endswith("-deny")
    page.keyboard.press("Enter")
    consent.wait_for(state="detached")
    frame.wait_for_function(
        "() => document.querySelector('#status').textContent.includes('declined')", polling=POLL_MS
    )
    assert shell.submissions("fx-full") == submitted

    # ... and the keyboard path that allows: once armed, Tab to Allow, then Enter.
    shell.queue("fx-full", text_script("Hello, keyboard user!"))
    tab_to(page, "iframe.napplet-frame > #send", frame)
    page.keyboard.press("Enter")
    consent = shell.consent()
    allow_id = consent.locator("button.allow").get_attribute("id")
    # Before it is armed Allow is disabled: Tab from Deny skips it.
    page.keyboard.press("Tab")
    if not consent.get_attribute("data-armed"):
        assert focus_in(page) != f"#{allow_id}"
    wait_armed(consent)
    tab_to(page, f"#{allow_id}")
    page.keyboard.press("Enter")
    consent.wait_for(state="detached")
    frame.wait_for_function(
        "() => document.querySelector('#status').textContent === 'Done.'", polling=POLL_MS
    )
    answer = frame.locator("#history li.assistant").last.text_content() or ""
    assert answer.endswith("Hello, keyboard user!")
    assert focus_in(page, frame) == "iframe.napplet-frame > #prompt"
    assert shell.submissions("fx-full") == submitted + 1


def test_space_ticks_remember_and_allows_once_armed(shell: ShellPage) -> None:
    napplet = shell.open_napplet()
    handle = napplet.select(FULL)
    shell.queue("fx-full", text_script("ok"))
    napplet.post(generate("g1", handle))
    consent = shell.consent()
    wait_armed(consent)
    remember_id = consent.locator("input.remember").get_attribute("id")
    tab_to(shell.page, f"#{remember_id}", key="Shift+Tab")
    shell.page.keyboard.press("Space")
    assert consent.locator("input.remember").is_checked()
    tab_to(shell.page, f"#{consent.locator('button.allow').get_attribute('id')}")
    shell.page.keyboard.press("Space")
    consent.wait_for(state="detached")
    napplet.wait_for("g1")
    assert shell.page.locator("#grant-list button.revoke").count() == 1


# --------------------------------------------------------------------------- focus


def test_focus_returns_after_the_chooser_and_the_consent_dialog(shell: ShellPage) -> None:
    page = shell.page
    napplet = shell.open_napplet()
    page.focus("#napplet-url")
    napplet.post({"type": "llm.select", "id": "s1"})
    shell.escape("chooser")
    assert focus_in(page) == "#napplet-url"

    page.focus("#connection-add")
    napplet.post({"type": "llm.select", "id": "s2"})
    chooser = shell.chooser()
    wait_armed(chooser)
    shift_tab_to_candidate(page, FULL)
    page.keyboard.press("Enter")
    chooser.wait_for(state="detached")
    handle = napplet.wait_for("s2", "llm.select.result")["model"]["handle"]
    assert focus_in(page) == "#connection-add"

    page.focus("#napplet-url")
    napplet.post(generate("g1", handle))
    shell.escape("consent")
    assert focus_in(page) == "#napplet-url"

    shell.queue("fx-full", text_script("ok"))
    page.focus("#account-select")
    napplet.post(generate("g2", handle))
    consent = shell.consent()
    wait_armed(consent)
    page.keyboard.press("Tab")
    page.keyboard.press("Enter")
    consent.wait_for(state="detached")
    assert focus_in(page) == "#account-select"
    napplet.wait_for("g2")


def add_scripted_connection(page: Any, name: str) -> None:
    """Fill and save the connection form by keyboard (it is open, focus on the kind:
    the guided form asks for the kind first)."""
    assert focus_in(page) == "#connection-kind"
    page.select_option("#connection-kind", "scripted")
    page.focus("#connection-name")
    page.keyboard.type(name)
    page.focus("#connection-script")
    page.keyboard.type('[{"text": "hi"}]')
    tab_to(page, "#connection-save")
    page.keyboard.press("Enter")
    page.locator("#connection-list li.connection", has_text=name).wait_for()
    page.locator("#connection-form").wait_for(state="hidden")


def test_focus_returns_after_the_connection_form(shell: ShellPage) -> None:
    page = shell.page
    tab_to(page, "#connection-add")
    page.keyboard.press("Enter")
    assert focus_in(page) == "#connection-kind"
    page.keyboard.press("Escape")
    page.locator("#connection-form").wait_for(state="hidden")
    assert focus_in(page) == "#connection-add"

    page.keyboard.press("Enter")
    add_scripted_connection(page, "Keyboard A")
    assert focus_in(page) == "#connection-add"
    page.keyboard.press("Enter")
    add_scripted_connection(page, "Keyboard B")

    entry_a = page.locator("#connection-list li.connection", has_text="Keyboard A")
    edit_a = entry_a.locator("button.edit")
    edit_a.focus()
    page.keyboard.press("Enter")
    # Editing: the kind is fixed, so the form starts at the name.
    assert focus_in(page) == "#connection-name"
    page.keyboard.press("Escape")
    assert page.evaluate(
        "() => document.activeElement.closest('li.connection')?.textContent ?? ''"
    ).startswith("Keyboard A")
    assert focus_in(page) == "button.edit"

    # Save an edit: the entry is rebuilt, and its new Edit button has the focus.
    page.keyboard.press("Enter")
    page.keyboard.press("End")
    page.keyboard.type(" renamed")
    tab_to(page, "#connection-save")
    page.keyboard.press("Enter")
    page.locator("#connection-list li.connection", has_text="Keyboard A renamed").wait_for()
    page.locator("#connection-form").wait_for(state="hidden")
    page.wait_for_function("() => document.activeElement.classList.contains('edit')")
    assert "Keyboard A renamed" in page.evaluate(
        "() => document.activeElement.closest('li').textContent"
    )

    # Remove (confirmed by keyboard): the focus moves to the next entry, not <body>.
    tab_to(page, "button.remove")
    entry = page.evaluate("() => document.activeElement.closest('li').dataset.connectionId")
    page.keyboard.press("Enter")
    tab_to(page, "button.danger", key="Shift+Tab")
    page.keyboard.press("Enter")
    page.wait_for_function(
        "(id) => !document.querySelector(`li.connection[data-connection-id='${id}']`)", arg=entry
    )
    page.wait_for_function("() => document.activeElement !== document.body")
    assert focus_in(page) in ("button.edit", "#connection-add")
    for name in ("Keyboard A renamed", "Keyboard B"):
        remaining = page.locator("#connection-list li.connection", has_text=name)
        if remaining.count():
            remaining.locator("button.remove").click()
            remaining.locator("button.confirm-remove").click()
            remaining.wait_for(state="detached")


FAKE_MODELS = """async (names) => {
  const cache = await caches.open('napllm-models');
  for (const name of names) {
    await cache.put(new Request(new URL(`/_test/models/${name}`, location.href).href),
      new Response(new Uint8Array(1024), {headers: {'content-length': '1024'}}));
  }
  document.dispatchEvent(new Event('visibilitychange'));
}"""


def test_storage_delete_keeps_the_focus_in_the_section(shell: ShellPage) -> None:
    page = shell.page
    page.evaluate(FAKE_MODELS, ["a11y-one.gguf", "a11y-two.gguf"])
    deletes = page.locator("#storage-models button.delete")
    page.wait_for_function(
        "() => document.querySelectorAll('#storage-models button.delete').length >= 2"
    )
    count = deletes.count()
    deletes.first.focus()
    page.keyboard.press("Enter")
    page.wait_for_function(
        "(n) => document.querySelectorAll('#storage-models button.delete').length === n",
        arg=count - 1,
    )
    page.wait_for_function("() => document.activeElement.classList.contains('delete')")
    while deletes.count() > 0:
        left = deletes.count()
        page.keyboard.press("Enter")
        page.wait_for_function(
            "(n) => document.querySelectorAll('#storage-models button.delete').length === n",
            arg=left - 1,
        )
    page.wait_for_function("() => document.activeElement !== document.body")
    assert focus_in(page) in ("#storage-heading", "#storage-persist")


def test_closing_the_last_tab_keeps_the_focus_in_the_napplet_area(shell: ShellPage) -> None:
    napplet = shell.open_napplet()
    napplet.toolbar("close").focus()
    shell.page.keyboard.press("Enter")
    shell.page.locator(f"#{napplet.key}-tab").wait_for(state="detached")
    shell.open.remove(napplet)
    assert focus_in(shell.page) == "#napplet-area"
    assert shell.page.locator("#napplet-tabs").is_hidden()


def test_dismissing_a_notice_or_removing_a_profile_keeps_the_focus(shell: ShellPage) -> None:
    page = shell.page
    page.evaluate(
        "() => document.querySelectorAll('#notice-list .dismiss').forEach((b) => b.click())"
    )
    for _ in range(2):
        page.fill("#napplet-url", "ftp://example.invalid/napplet.html")
        page.press("#napplet-url", "Enter")
    dismiss = page.locator("#notice-list .dismiss")
    expect(dismiss).to_have_count(2)
    expect(page.get_by_role("button", name="Dismiss notice")).to_have_count(2)
    dismiss.first.focus()
    page.keyboard.press("Enter")
    expect(dismiss).to_have_count(1)
    assert focus_in(page) == "button.dismiss"
    page.keyboard.press("Space")
    expect(dismiss).to_have_count(0)
    assert focus_in(page) == "#napplet-area"

    shell.add_profile("Keyboard profile")
    tab_to(page, "#account-remove")
    page.keyboard.press("Enter")
    page.wait_for_function("() => document.querySelector('#account-select').value === 'Default'")
    assert focus_in(page) == "#account-select"


# --------------------------------------------------------------------------- screen readers


def test_dialogs_announce_their_purpose(shell: ShellPage) -> None:
    page = shell.page
    napplet = shell.open_napplet()
    napplet.post({"type": "llm.select", "id": "s1"})
    chooser = shell.chooser()
    dialog = page.get_by_role("dialog", name="Choose a model")
    expect(dialog).to_have_accessible_description(
        re.compile(r"probe\.html .* asks to use a language model")
    )
    assert dialog.evaluate("(d) => d.open && d.matches(':modal')")
    # A candidate is named by its visible text (connection, model, route);
    # its capabilities describe it.
    candidate = chooser.get_by_role(
        "button", name=re.compile(r"^Fixture \(all capabilities\) Model: fixture-full Route: ")
    )
    expect(candidate).to_have_accessible_description(
        re.compile(r"^reads images JSON output calls tools tool choice: ")
    )
    wait_armed(chooser)
    candidate.focus()
    page.keyboard.press("Enter")
    chooser.wait_for(state="detached")
    handle = napplet.wait_for("s1", "llm.select.result")["model"]["handle"]

    napplet.post(generate("g1", handle))
    consent = shell.consent()
    dialog = page.get_by_role("dialog", name="Send this request?")
    expect(dialog).to_have_accessible_description(
        re.compile(r"probe\.html .* wants to send a request")
    )
    assert dialog.evaluate("(d) => d.matches(':modal')")
    snapshot = consent.aria_snapshot()
    for line in (
        'dialog "Send this request?"',
        'button "Deny"',
        'button "Allow"',
        'checkbox "Allow this napplet on this connection until I close the page"',
    ):
        assert line in snapshot, snapshot
    shell.deny()


def test_status_and_progress_are_live_regions(shell: ShellPage) -> None:
    page = shell.page
    live = page.evaluate(
        """() => Object.fromEntries(['#boot', '#notice-list', '#inspector-count',
          '#connection-form-error', '#account-add-error'].map((sel) => {
            const e = document.querySelector(sel);
            return [sel, e ? (e.getAttribute('aria-live') || e.getAttribute('role')) : null];
          }))"""
    )
    assert live == {
        "#boot": "polite",
        "#notice-list": "polite",
        "#inspector-count": "polite",
        "#connection-form-error": "alert",
        "#account-add-error": "alert",
    }
    # The boot progress bar (hidden once booted) is labelled by the boot status text.
    assert (
        page.evaluate("() => document.querySelector('#boot-progress').labels[0].id") == "boot-label"
    )
    napplet = shell.open_napplet()
    status = page.locator(f"#{napplet.key}-panel [role=status]").first
    expect(status).to_be_attached()


def test_engine_progress_is_one_live_region_updated_in_place(shell: ShellPage) -> None:
    page = shell.page
    entry = page.locator("#connection-list li.connection[data-connection-id='builtin-tinychat']")
    page.evaluate(
        "() => napllmHost.engineProgress('builtin-tinychat', 'Downloading TinyChat', 0.25)"
    )
    bar = entry.locator(".engine-progress")
    expect(bar).to_have_attribute("role", "status")
    expect(bar).to_have_text("Downloading TinyChat (25%)")
    expect(bar.get_by_role("progressbar", name="Downloading TinyChat")).to_have_count(1)
    bar.evaluate("(b) => { b.dataset.seen = 'first'; }")
    page.evaluate(
        "() => napllmHost.engineProgress('builtin-tinychat', 'Downloading TinyChat', 0.5)"
    )
    expect(bar).to_have_text("Downloading TinyChat (50%)")
    assert bar.get_attribute("data-seen") == "first"
    page.evaluate("() => napllmHost.engineProgress('builtin-tinychat', 'Downloading TinyChat', 1)")
    expect(bar).to_have_count(0)
