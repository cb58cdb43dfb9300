"""Accessibility of the shell (the real shell, test build).

- axe-core (the npm devDependency, injected by the test, never part of
  dist/) finds no "serious" or "critical" violation in the start view, an
  open napplet tab, the chooser, the consent dialog, the connection form,
  the Storage section and the envelope inspector. A failure names each rule
  id with the CSS targets of its nodes.
- Keyboard alone: a napplet's select → consent → answer is completed with
  Tab / Shift+Tab / Enter only. The dialogs' anti-clickjacking guards stay:
  Allow and the candidates are disabled for the arming delay, and Enter on
  the consent dialog's initial focus (Deny) denies; the path that allows is
  Tab to Allow after it is armed, then Enter (or Space).
- Focus returns to the element that had it after each dialog (chooser,
  consent, the connection form, the Storage section's delete) closes.
- The dialogs name their purpose to assistive technology: role dialog,
  modal, a name from their heading and a description; status and progress
  are live regions.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from shellpage import POLL_MS, Napplet, ShellPage, generate, install_napplets

from napllm.providers.fixture import text_script

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
AXE = ROOT / "node_modules" / "axe-core" / "axe.min.js"
#: The impact levels that fail a test.
FAILING_IMPACTS = ("serious", "critical")
FULL = "Fixture (all capabilities)"


@pytest.fixture(scope="module")
def context(browser: Any) -> Iterator[Any]:
    ctx = browser.new_context(viewport={"width": 1280, "height": 900})
    yield ctx
    ctx.close()


@pytest.fixture(scope="module")
def booted(context: Any, dist_url: str, test_pages_dir: Path) -> ShellPage:
    shell = ShellPage(context.new_page(), dist_url, install_napplets(test_pages_dir, dist_url))
    shell.boot()
    return shell


@pytest.fixture
def shell(booted: ShellPage, request_log: Any) -> Iterator[ShellPage]:
    yield booted
    booted.reset()


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


def active(page: Any) -> str:
    """A short description of the focused element: ``tag#id.class`` or its text."""
    text: str = page.evaluate(
        """() => { const e = document.activeElement;
          if (!e) return 'none';
          return e.tagName.toLowerCase() + (e.id ? '#' + e.id : '')
            + (e.className && typeof e.className === 'string' ? '.' + e.className.split(' ').join('.') : '');
        }"""
    )
    return text


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
    shell.queue("fx-full", text_script("ok"))
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
