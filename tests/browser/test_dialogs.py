"""Hostile napplets against the chooser and consent dialogs (the product shell, dist/).

The model is a scripted connection added through the connections form; its
entry's request count shows that nothing reached it while requests were
refused.

Lock-out: a napplet keeps 16 `llm.generate` requests in flight and re-sends
each one as soon as it is answered. The user escapes with one click ("Close
this napplet" or "Refuse its requests until the page is reloaded"), and
denials in a row pause the napplet's requests (answered `user-cancelled`
without a dialog) for a period shown in its tab's toolbar.

Accidental Allow: Allow, "remember" and the chooser's candidates ignore a
click whose pointer-down began before the dialog was shown, a click with
`detail >= 2` and any click in the first `ARM_DELAY_MS` after the dialog
appears (they are disabled then, and enabled with a visible cue); a
deliberate later click works; Enter answers Deny.

Every click here is a real mouse event (Playwright's mouse), as a person's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from shellpage import POLL_MS, Napplet, ShellPage, boot_shell, generate

from envelope_rules import code

pytestmark = pytest.mark.browser

FULL = "Scripted (all capabilities)"
#: Every allowed generation is answered "ok".
SCRIPT = {"turns": [{"text": "ok"}], "repeat": True}
#: A bit longer than the shell's ARM_DELAY_MS (500 ms): everything is armed by then.
ARMED_MS = 700

#: Keeps `n` generate requests in flight: each is re-sent as soon as its result
#: arrives (allowed, denied, refused: whatever it is).
LOOP = """
([handle, n]) => {
  window.loop = {sent: 0, results: []};
  const send = (slot) => {
    window.loop.sent += 1;
    window.postMessage({type: 'llm.generate', id: `loop-${slot}-${window.loop.sent}`,
      request: {handle, messages: [{role: 'user', content: [{type: 'text', text: 'hi'}]}]}}, '*');
  };
  window.addEventListener('message', (event) => {
    const e = event.data;
    if (e && e.type === 'llm.generate.result' && String(e.id).startsWith('loop-')) {
      window.loop.results.push(e.error ? e.error.code : 'ok');
      send(e.id.split('-')[1]);
    }
  });
  for (let slot = 0; slot < n; slot += 1) send(slot);
}
"""


@pytest.fixture(scope="module")
def booted(shell_context: Any, product_url: str, test_pages_dir: Path) -> ShellPage:
    return boot_shell(shell_context.new_page(), product_url, test_pages_dir, "", {FULL: SCRIPT})


def start_loop(napplet: Napplet, handle: str, n: int = 16) -> None:
    napplet.evaluate(LOOP, [handle, n])


def loop_results(napplet: Napplet) -> list[str]:
    results: list[str] = napplet.evaluate("() => window.loop.results")
    return results


def no_dialog_for(shell: ShellPage, ms: int = 1000) -> None:
    """Assert that no chooser/consent dialog exists now and for `ms`."""
    for _ in range(ms // 100):
        assert shell.open_dialogs() == 0
        shell.page.wait_for_timeout(100)
    assert shell.open_dialogs() == 0


def wait_armed(dialog: Any) -> None:
    dialog.page.wait_for_function(
        "(d) => d.dataset.armed === 'true'", arg=dialog.element_handle(), polling=POLL_MS
    )


def second_click(page: Any, x: float, y: float) -> None:
    """The second click of a double-click (event.detail == 2) at (x, y)."""
    page.mouse.move(x, y)
    page.mouse.down(click_count=2)
    page.mouse.up(click_count=2)


def deny_open(shell: ShellPage) -> None:
    """Click Deny in the open consent dialog; wait until that one (not the next) is gone."""
    token = shell.consent().get_attribute("data-token")
    shell.page.locator(f"dialog[data-token='{token}'] button.deny").click()
    shell.page.locator(f"dialog[data-token='{token}']").wait_for(state="detached")


def center(locator: Any) -> tuple[float, float]:
    box = locator.bounding_box()
    assert box is not None
    return box["x"] + box["width"] / 2, box["y"] + box["height"] / 2


# --------------------------------------------------------------------------- lock-out


def test_close_this_napplet_ends_a_consent_loop_with_one_click(shell: ShellPage) -> None:
    submitted = shell.script_requests(FULL)
    napplet = shell.open_napplet()
    handle = napplet.select(FULL)
    start_loop(napplet, handle)
    dialog = shell.consent()
    close = dialog.locator("button.close-napplet")
    assert close.is_enabled()
    close.click()
    shell.page.locator(f"#{napplet.key}-tab").wait_for(state="detached")
    shell.open.remove(napplet)
    # The 15 queued dialogs vanished with it; none comes back.
    no_dialog_for(shell)
    assert shell.script_requests(FULL) == submitted


def test_close_this_napplet_from_the_chooser(shell: ShellPage) -> None:
    napplet = shell.open_napplet()
    for i in range(4):
        napplet.post({"type": "llm.select", "id": f"s{i}"})
    shell.chooser().locator("button.close-napplet").click()
    shell.page.locator(f"#{napplet.key}-tab").wait_for(state="detached")
    shell.open.remove(napplet)
    no_dialog_for(shell)


def test_refuse_until_reload_answers_user_cancelled_without_dialogs(shell: ShellPage) -> None:
    submitted = shell.script_requests(FULL)
    napplet = shell.open_napplet()
    handle = napplet.select(FULL)
    start_loop(napplet, handle)
    shell.consent().locator("button.block-napplet").click()
    no_dialog_for(shell)
    badge = napplet.toolbar("request-refusal")
    assert "until the page is reloaded" in badge.inner_text()
    # The napplet keeps re-sending; every answer is user-cancelled, no dialog.
    napplet.frame.wait_for_function("() => window.loop.results.length >= 32", polling=POLL_MS)
    assert set(loop_results(napplet)) == {"user-cancelled"}
    assert shell.open_dialogs() == 0
    assert shell.script_requests(FULL) == submitted
    # A reload of the napplet's document stays refused (the refusal is per tab).
    napplet.reload()
    napplet.post(generate("after-reload", handle))
    assert code(napplet.wait_for("after-reload")) in ("user-cancelled", "selection-expired")
    assert shell.open_dialogs() == 0
    # The user can lift it from the tab.
    napplet.press(badge.locator("button.ask-again"))
    assert badge.count() == 0
    handle = napplet.select(FULL, rid="s2")
    napplet.post(generate("asked", handle))
    shell.allow()
    assert code(napplet.wait_for("asked")) is None


def test_denials_in_a_row_pause_the_napplet_for_a_shown_period(shell: ShellPage) -> None:
    submitted = shell.script_requests(FULL)
    napplet = shell.open_napplet()
    handle = napplet.select(FULL)
    start_loop(napplet, handle)
    before = shell.page.evaluate("Date.now()")
    for _ in range(3):
        deny_open(shell)
    no_dialog_for(shell)
    badge = napplet.toolbar("request-refusal")
    until = int(badge.get_attribute("data-until") or "0")
    assert before + 25_000 < until < before + 40_000
    assert "Requests refused without asking until" in badge.inner_text()
    assert any("refused without asking" in n for n in shell.notices())
    napplet.frame.wait_for_function("() => window.loop.results.length >= 32", polling=POLL_MS)
    assert set(loop_results(napplet)) == {"user-cancelled"}
    assert shell.script_requests(FULL) == submitted
    # Lifted: the dialogs come back, and Close still ends it with one click.
    napplet.press(badge.locator("button.ask-again"))
    shell.consent().locator("button.close-napplet").click()
    shell.open.remove(napplet)
    no_dialog_for(shell)


def test_other_napplets_are_still_asked_while_one_is_refused(shell: ShellPage) -> None:
    hostile = shell.open_napplet()
    start_loop(hostile, hostile.select(FULL))
    shell.consent().locator("button.block-napplet").click()
    other = shell.open_napplet()
    handle = other.select(FULL)
    other.post(generate("g1", handle))
    shell.allow()
    assert code(other.wait_for("g1")) is None


# --------------------------------------------------------------------------- accidental Allow


def test_allow_is_disabled_at_first_then_armed_and_an_early_click_does_nothing(
    shell: ShellPage,
) -> None:
    napplet = shell.open_napplet()
    handle = napplet.select(FULL)
    napplet.post(generate("g1", handle))
    dialog = shell.consent()
    allow = dialog.locator("button.allow")
    remember = dialog.locator("input.remember")
    # Clicked at once (a person would hit it by accident): nothing happens.
    assert allow.is_disabled() and remember.is_disabled()
    assert "arming" in (allow.get_attribute("class") or "")
    x, y = center(allow)
    shell.page.mouse.click(x, y)
    rx, ry = center(remember)
    shell.page.mouse.click(rx, ry)
    wait_armed(dialog)
    assert shell.open_dialogs() == 1
    assert allow.is_enabled() and not remember.is_checked()
    assert "arming" not in (allow.get_attribute("class") or "")
    # Deliberate clicks later work: the label ticks the box, Allow allows.
    dialog.locator(".remember-row label").click()
    assert remember.is_checked()
    shell.page.mouse.click(x, y)
    dialog.wait_for(state="detached")
    assert code(napplet.wait_for("g1")) is None
    assert shell.page.locator("#grant-list button.revoke").count() == 1


def test_a_press_that_began_before_the_dialog_does_not_allow(shell: ShellPage) -> None:
    napplet = shell.open_napplet()
    handle = napplet.select(FULL)
    # Learn where Allow appears, and allow once deliberately.
    napplet.post(generate("g1", handle))
    dialog = shell.consent()
    x, y = center(dialog.locator("button.allow"))
    wait_armed(dialog)
    shell.page.mouse.click(x, y)
    assert code(napplet.wait_for("g1")) is None
    # The pointer is pressed where Allow will be, then the napplet asks.
    shell.page.mouse.move(x, y)
    shell.page.mouse.down()
    napplet.post(generate("g2", handle))
    dialog = shell.consent()
    wait_armed(dialog)
    shell.page.mouse.up()
    shell.page.wait_for_timeout(300)
    assert shell.open_dialogs() == 1
    assert napplet.evaluate("() => window.probe.envelopes().some((e) => e.id === 'g2')") is False
    shell.deny()
    assert code(napplet.wait_for("g2")) == "user-cancelled"


def test_a_double_click_never_allows_or_chooses(shell: ShellPage) -> None:
    napplet = shell.open_napplet()
    napplet.post({"type": "llm.select", "id": "s1"})
    chooser = shell.chooser()
    candidate = chooser.locator(".candidate").first
    assert candidate.is_disabled()
    wait_armed(chooser)
    cx, cy = center(candidate)
    second_click(shell.page, cx, cy)
    shell.page.wait_for_timeout(300)
    assert shell.open_dialogs() == 1
    shell.choose(FULL)
    handle = napplet.wait_for("s1", "llm.select.result")["model"]["handle"]

    napplet.post(generate("g1", handle))
    dialog = shell.consent()
    wait_armed(dialog)
    x, y = center(dialog.locator("button.allow"))
    second_click(shell.page, x, y)
    rx, ry = center(dialog.locator("input.remember"))
    second_click(shell.page, rx, ry)
    shell.page.wait_for_timeout(300)
    assert shell.open_dialogs() == 1
    assert not dialog.locator("input.remember").is_checked()
    shell.page.mouse.click(x, y)
    assert code(napplet.wait_for("g1")) is None


def test_enter_denies_and_never_allows(shell: ShellPage) -> None:
    submitted = shell.script_requests(FULL)
    napplet = shell.open_napplet()
    handle = napplet.select(FULL)
    napplet.post(generate("g1", handle))
    dialog = shell.consent()
    wait_armed(dialog)
    assert shell.page.evaluate("document.activeElement.textContent") == "Deny"
    shell.page.keyboard.press("Enter")
    dialog.wait_for(state="detached")
    assert code(napplet.wait_for("g1")) == "user-cancelled"
    napplet.post({"type": "llm.select", "id": "s2"})
    chooser = shell.chooser()
    wait_armed(chooser)
    assert shell.page.evaluate("document.activeElement.textContent") == "Cancel"
    shell.page.keyboard.press("Enter")
    chooser.wait_for(state="detached")
    assert code(napplet.wait_for("s2", "llm.select.result")) == "user-cancelled"
    assert shell.script_requests(FULL) == submitted
