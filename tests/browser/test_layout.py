"""The shell on any screen: phone (360 px), tablet (768 px) and desktop (1440 px)
widths, light and dark schemes, reduced motion (web/shell.css, web/js/layout.js).

All tests drive the product build (``product_url``). The screenshot test
compares with the committed baselines of tests/browser/baselines/; after an
intended change of the pages, regenerate them with
``python3 tools/screenshots.py --update-baselines`` (its message says so).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from conftest import ROOT, BrowserLog

WIDTHS = (360, 768, 1440)
BOOT_TIMEOUT_MS = 120_000
NO_HORIZONTAL_SCROLL = "document.scrollingElement.scrollWidth <= innerWidth"


def _screenshots() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "napllm_screenshots", ROOT / "tools" / "screenshots.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


screenshots = _screenshots()


def boot(page: Any, url: str, width: int = 360, height: int = 740) -> None:
    page.set_viewport_size({"width": width, "height": height})
    page.goto(url)
    page.wait_for_function(
        "() => ['ready', 'failed'].includes(document.body.dataset.boot)"
        " && document.querySelectorAll('#napplet-gallery .napplet-card').length > 0",
        timeout=BOOT_TIMEOUT_MS,
    )
    assert page.evaluate("document.body.dataset.boot") == "ready"


def overflow(page: Any) -> list[int]:
    """``[scrollWidth, innerWidth]`` of the page."""
    result: list[int] = page.evaluate("[document.scrollingElement.scrollWidth, innerWidth]")
    return result


def test_no_horizontal_scrolling_and_connections_fold_into_a_panel(
    page: Any, product_url: str, request_log: BrowserLog
) -> None:
    boot(page, f"{product_url}index.html")
    toggle = page.locator("#connections-toggle")
    side = page.locator("#side-panel")
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 900})
        assert page.evaluate(NO_HORIZONTAL_SCROLL), (width, overflow(page))
        if width < 800:
            # Narrow: the column is a panel the toggle opens and closes.
            assert toggle.is_visible() and not side.is_visible(), width
            assert toggle.get_attribute("aria-expanded") == "false"
            toggle.click()
            assert side.is_visible() and toggle.get_attribute("aria-expanded") == "true"
            assert page.is_visible("#connection-list .connection")
            assert page.evaluate(NO_HORIZONTAL_SCROLL), (width, "panel open", overflow(page))
            toggle.click()
            assert not side.is_visible() and toggle.get_attribute("aria-expanded") == "false"
        else:
            assert not toggle.is_visible() and side.is_visible(), width
    # With a napplet open, the envelope inspector unfolded and the panel open.
    page.click("#napplet-gallery [data-napplet=tools] .card-open")
    page.locator("iframe.napplet-frame").wait_for()
    page.click(".inspector-wrap > summary")
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 900})
        if toggle.is_visible() and toggle.get_attribute("aria-expanded") == "false":
            toggle.click()
        assert page.evaluate(NO_HORIZONTAL_SCROLL), (width, "napplet open", overflow(page))
        frame_box = page.locator("iframe.napplet-frame").bounding_box()
        assert frame_box is not None and frame_box["x"] + frame_box["width"] <= width


def test_dialogs_fit_a_phone_screen(page: Any, product_url: str, request_log: BrowserLog) -> None:
    """The chooser and the consent dialog of the Chat napplet at 360x640."""
    boot(page, f"{product_url}index.html", 360, 640)
    page.click("#napplet-gallery [data-napplet=chat] .card-open")
    handle = page.wait_for_selector("iframe.napplet-frame")
    frame = handle.content_frame() if handle else None
    assert frame is not None
    frame.wait_for_selector("#choose:not([disabled])")
    frame.click("#choose")

    def fits(selector: str) -> None:
        dialog = page.locator(selector)
        dialog.wait_for()
        box = dialog.bounding_box()
        assert box is not None
        assert box["x"] >= 0 and box["x"] + box["width"] <= 360, box
        assert box["y"] >= 0 and box["y"] + box["height"] <= 640, box
        # Nothing inside is wider than the dialog; long content scrolls vertically.
        assert dialog.evaluate("(d) => d.scrollWidth <= d.clientWidth"), selector
        assert page.evaluate(NO_HORIZONTAL_SCROLL), overflow(page)

    fits("dialog.chooser-dialog[open][data-armed=true]")
    page.locator("dialog.chooser-dialog[open] .candidate").filter(
        has_text="TinyChat (on this device)"
    ).first.click()
    frame.wait_for_selector("#send:not([disabled])")
    frame.fill("#prompt", "Hello!")
    frame.click("#send")
    fits("dialog.consent-dialog[open][data-armed=true]")
    # The last control of the dialog can be scrolled into view and used.
    deny = page.locator("dialog.consent-dialog[open] .deny")
    deny.scroll_into_view_if_needed()
    deny.click()
    page.wait_for_selector("dialog.consent-dialog[open]", state="detached")


@pytest.mark.parametrize(
    ("scheme", "background", "text"),
    [
        ("light", "rgb(247, 247, 248)", "rgb(27, 27, 31)"),
        ("dark", "rgb(23, 23, 27)", "rgb(236, 236, 241)"),
    ],
)
def test_colour_scheme_follows_the_system(
    page: Any, product_url: str, scheme: str, background: str, text: str
) -> None:
    page.emulate_media(color_scheme=scheme)
    page.goto(f"{product_url}index.html")
    page.wait_for_selector("#napplet-gallery .napplet-card")
    colours = page.evaluate(
        """() => {
            const body = getComputedStyle(document.body);
            const card = getComputedStyle(document.querySelector('.napplet-card'));
            return [body.backgroundColor, body.color, card.color];
        }"""
    )
    assert colours == [background, text, text]


def test_reduced_motion_stops_transitions_and_the_arming_bar(page: Any, product_url: str) -> None:
    page.goto(f"{product_url}index.html")
    page.wait_for_selector("#napplet-gallery .napplet-card")
    css = """(reduce) => {
        const button = document.querySelector('.card-open');
        // A granting button of a dialog while it waits (web/js/dialogs.js, ArmGuard).
        const dialog = document.createElement('dialog');
        const arming = document.createElement('button');
        arming.className = 'arming';
        dialog.append(arming);
        document.body.append(dialog);
        const bar = getComputedStyle(arming, '::after');
        const out = [getComputedStyle(button).transitionDuration, bar.display, bar.animationName];
        dialog.remove();
        return out;
    }"""
    page.emulate_media(reduced_motion="no-preference")
    assert page.evaluate(css) == ["0.15s", "block", "napllm-arm"]
    page.emulate_media(reduced_motion="reduce")
    assert page.evaluate(css)[:2] == ["0s", "none"]


def test_layout_matches_the_baselines(browser: Any, product_url: str) -> None:
    """Start view at 360/768/1440 px, light and dark, against tests/browser/baselines/."""
    context = browser.new_context()
    try:
        shots = screenshots.capture(context, product_url)
    finally:
        context.close()
    assert sorted(shots) == sorted(screenshots.shot_names())
    problems = [
        problem
        for name, png in shots.items()
        if (problem := screenshots.compare(name, png, screenshots.BASELINES / f"{name}.png"))
    ]
    assert not problems, "\n".join(problems)


def test_comparison_failure_names_the_regeneration_command(tmp_path: Path) -> None:
    from PIL import Image

    baseline = tmp_path / "x.png"
    Image.new("RGB", (10, 10), "white").save(baseline)
    black = tmp_path / "black.png"
    Image.new("RGB", (10, 10), "black").save(black)
    same = screenshots.compare("x", baseline.read_bytes(), baseline)
    assert same is None
    differs = screenshots.compare("x", black.read_bytes(), baseline)
    assert differs is not None and "python3 tools/screenshots.py --update-baselines" in differs
    missing = screenshots.compare("x", black.read_bytes(), tmp_path / "none.png")
    assert missing is not None and "--update-baselines" in missing
