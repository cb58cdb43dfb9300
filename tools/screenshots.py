#!/usr/bin/env python3
"""Screenshots of the shell's start view at three widths, light and dark.

Usage::

    python3 tools/screenshots.py                      # compare with the baselines
    python3 tools/screenshots.py --update-baselines   # rewrite baselines + README images

The screenshots are taken from ``dist/``, the product build (built first when
it is missing or stale), served on 127.0.0.1 with the same headers as
``python3 build.py serve``, in Debian's Chromium with the browser tests'
offline flags. The page is the start view of a returning visitor (the first
visit's Chat napplet does not open), after the runtime has started and the
shell is stored for offline use.

Rules
- `VIEWS` x `SCHEMES` give the names ``<view>-<scheme>``; baselines are
  ``tests/browser/baselines/<name>.png``. ``--update-baselines`` also writes
  every screenshot of the README into ``docs/screenshots/``: the phone view
  (``phone-<scheme>.png``) and the walk-through of `capture_readme`
  (``consent.png``, ``chat-answer.png``, TinyChat answering in the browser)
  and the model manager of `capture_manager` (``storage-manager.png``), the
  model catalogue of `capture_catalogue` (``catalogue.png``) and
  the Python napplet of `capture_python` (``python-extract.png``).
- What varies between runs is frozen or masked: the storage estimate's text
  is replaced by a fixed one and masked, progress bars and the inspector's
  count are masked, motion is reduced and animations are finished, the caret
  is hidden.
- `compare` allows a small share of differing pixels (`TOLERANCE`, with a
  per-pixel threshold `PIXEL_THRESHOLD`) and otherwise fails with a message
  that names `UPDATE_COMMAND`. Any intended change of the pages needs the
  baselines regenerated with that command.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

from PIL import Image, ImageChops

ROOT = Path(__file__).resolve().parents[1]
BASELINES = ROOT / "tests" / "browser" / "baselines"
README_SHOTS = ROOT / "docs" / "screenshots"
UPDATE_COMMAND = "python3 tools/screenshots.py --update-baselines"

#: (name, viewport width, viewport height) in CSS pixels; full-page shots.
VIEWS = (("phone", 360, 760), ("tablet", 768, 1024), ("desktop", 1440, 900))
SCHEMES = ("light", "dark")
#: Views shown in the README.
README_VIEWS = ("phone",)
#: Elements whose content varies between runs (painted over in the shots).
MASKED = ("#storage-total", "progress", ".engine-progress", "#inspector-count")
#: A pixel differs when one of its channels differs by more than this (0..255).
PIXEL_THRESHOLD = 48
#: The share of differing pixels a comparison allows.
TOLERANCE = 0.005
#: Marks the first visit as done (web/js/gallery.js), so the start view stays empty.
RETURNING_VISITOR_SCRIPT = (
    "try { if (window.top === window) localStorage.setItem('napllm.firstVisit', 'done'); }"
    " catch (e) {}"
)
BOOT_TIMEOUT_MS = 120_000


def shot_names() -> list[str]:
    """Every screenshot name, ``<view>-<scheme>``, in capture order."""
    return [f"{view}-{scheme}" for view, _w, _h in VIEWS for scheme in SCHEMES]


def capture(context: Any, base_url: str) -> dict[str, bytes]:
    """Screenshots (PNG bytes by name) of the start view served at ``base_url``
    (ends in ``/``), taken in a page of the Playwright ``context``."""
    context.add_init_script(RETURNING_VISITOR_SCRIPT)
    page = context.new_page()
    try:
        _, width, height = VIEWS[0]
        page.set_viewport_size({"width": width, "height": height})
        page.emulate_media(color_scheme=SCHEMES[0], reduced_motion="reduce")
        page.goto(f"{base_url}index.html")
        page.wait_for_function(
            "() => document.body.dataset.boot === 'ready'"
            " && document.querySelectorAll('#napplet-gallery .napplet-card').length > 0"
            " && ['ready', 'failed', 'unsupported'].includes(document.body.dataset.offline)"
            " && [...document.querySelectorAll('#napplet-gallery img')].every((i) => i.complete)",
            timeout=BOOT_TIMEOUT_MS,
        )
        page.evaluate("document.fonts.ready.then(() => true)")
        shots: dict[str, bytes] = {}
        for view, width, height in VIEWS:
            page.set_viewport_size({"width": width, "height": height})
            for scheme in SCHEMES:
                page.emulate_media(color_scheme=scheme, reduced_motion="reduce")
                # Freeze the storage estimate (it changes as the browser stores files).
                page.evaluate(
                    "() => { const t = document.querySelector('#storage-total');"
                    " if (t) t.textContent = 'This site stores some data.'; }"
                )
                page.evaluate("new Promise((r) => requestAnimationFrame(() => r(true)))")
                shots[f"{view}-{scheme}"] = page.screenshot(
                    full_page=True,
                    animations="disabled",
                    caret="hide",
                    mask=[page.locator(selector) for selector in MASKED],
                    mask_color="#808080",
                )
        return shots
    finally:
        page.close()


def _readme_page(context: Any, base_url: str, also_ready: str) -> Any:
    """A returning visitor's shell at 1280x900, light, booted and `also_ready` (a JS condition)."""
    context.add_init_script(RETURNING_VISITOR_SCRIPT)
    page = context.new_page()
    page.set_viewport_size({"width": 1280, "height": 900})
    page.emulate_media(color_scheme="light", reduced_motion="reduce")
    page.goto(f"{base_url}index.html")
    page.wait_for_function(
        f"() => document.body.dataset.boot === 'ready' && ({also_ready})",
        timeout=BOOT_TIMEOUT_MS,
    )
    return page


def capture_readme(context: Any, base_url: str) -> dict[str, bytes]:
    """The README's walk-through at 1280x900 (PNG bytes by name): ``consent`` (the
    Chat napplet asks to send "Hello!" to TinyChat) and ``chat-answer`` (after
    *Allow*). Not baselines: the answer is the model's."""
    page = _readme_page(
        context,
        base_url,
        "document.querySelector('#napplet-gallery [data-napplet=chat] .card-open')",
    )
    try:
        page.click("#napplet-gallery [data-napplet=chat] .card-open")
        handle = page.wait_for_selector("iframe.napplet-frame")
        frame = handle.content_frame() if handle else None
        assert frame is not None, "the Chat napplet did not open"
        frame.wait_for_selector("#choose:not([disabled])")
        frame.click("#choose")
        page.wait_for_selector("dialog.chooser-dialog[open][data-armed=true]")
        page.locator("dialog.chooser-dialog[open] .candidate").filter(
            has_text="TinyChat (on this device)"
        ).first.click()
        frame.wait_for_selector("#send:not([disabled])")
        frame.fill("#prompt", "Hello!")
        frame.click("#send")
        page.wait_for_selector("dialog.consent-dialog[open][data-armed=true]")
        shots = {"consent": page.screenshot(animations="disabled", caret="hide")}
        page.click("dialog.consent-dialog[open] .allow")
        frame.wait_for_function(
            "() => document.querySelectorAll('#history > *').length >= 2"
            " && !document.querySelector('#send').disabled",
            timeout=BOOT_TIMEOUT_MS,
        )
        shots["chat-answer"] = page.screenshot(animations="disabled", caret="hide")
        return shots
    finally:
        page.close()


def capture_manager(context: Any, base_url: str) -> dict[str, bytes]:
    """The README's model manager at 1280x900 (PNG bytes as ``storage-manager``):
    a GGUF connection added by URL (a copy of TinyChat served under
    `README_MODEL`), its model stored with *Download for offline use* (not
    loaded), then the side panel: the connection and the Storage section
    with the file, its size, the connection that uses it and when it was
    last used. Not a baseline: the date varies."""
    page = _readme_page(context, base_url, "document.body.dataset.offline === 'ready'")
    try:
        page.click("#connection-add")
        page.fill("#connection-name", "TinyChat, stored for later")
        page.select_option("#connection-kind", "wasm")
        page.fill("#connection-model-url", f"{base_url}{README_MODEL}")
        page.click("#connection-save")
        page.wait_for_selector("#connection-form", state="hidden")
        entry = page.locator("li.connection", has_text="TinyChat, stored for later")
        entry.locator("button.offline").click()
        entry.locator(".offline-control[data-stored='true']").wait_for(timeout=BOOT_TIMEOUT_MS)
        page.locator("#storage-models li.storage-model .storage-users").first.wait_for()
        entry.scroll_into_view_if_needed()
        side = page.locator("aside.side")
        return {"storage-manager": side.screenshot(animations="disabled", caret="hide")}
    finally:
        page.close()


def capture_catalogue(context: Any, base_url: str) -> dict[str, bytes]:
    """The README's model catalogue at 1280x900 (PNG bytes as ``catalogue``):
    *Browse models* opened, the list narrowed to SmolLM2, the suggestion for
    this browser and the first entry's details. Not a baseline: the verdicts
    follow the machine's memory and GPU."""
    page = _readme_page(context, base_url, "true")
    try:
        page.click("#catalogue-open")
        page.wait_for_selector("#catalogue-list li.catalogue-entry")
        page.fill("#catalogue-filter-text", "SmolLM2")
        page.locator("#catalogue-list li.catalogue-entry .catalogue-toggle").first.click()
        section = page.locator("#catalogue")
        section.scroll_into_view_if_needed()
        return {"catalogue": section.screenshot(animations="disabled", caret="hide")}
    finally:
        page.close()


#: The scripted answer of the README's Python napplet shot (`capture_python`).
PYTHON_SCRIPT = (
    '[{"json": {"rows": [{"name": "Alice", "age": 30, "city": "Paris"},'
    ' {"name": "Bob", "age": 41, "city": null}]}, "delayMs": 40}]'
)


def capture_python(context: Any, base_url: str) -> dict[str, bytes]:
    """The README's Python napplet at 1280x900 (PNG bytes as ``python-extract``):
    the gallery's *Extract to table* (written in Python) after a scripted
    connection's answer became its table. Not a baseline: it waits on Pyodide."""
    page = _readme_page(
        context,
        base_url,
        "document.querySelector('#napplet-gallery [data-napplet=extract] .card-open')",
    )
    try:
        page.click("#connection-add")
        page.fill("#connection-name", "Scripted answers")
        page.select_option("#connection-kind", "scripted")
        page.fill("#connection-script", PYTHON_SCRIPT)
        page.click("#connection-save")
        page.wait_for_selector("#connection-form", state="hidden")
        page.click("#napplet-gallery [data-napplet=extract] .card-open")
        handle = page.wait_for_selector("iframe.napplet-frame")
        frame = handle.content_frame() if handle else None
        assert frame is not None, "the Extract to table napplet did not open"
        frame.wait_for_selector("#extract:not([disabled])", timeout=BOOT_TIMEOUT_MS)
        frame.click("#extract")
        page.wait_for_selector("dialog.chooser-dialog[open][data-armed=true]")
        page.locator("dialog.chooser-dialog[open] .candidate").filter(
            has_text="Scripted answers"
        ).first.click()
        page.wait_for_selector("dialog.consent-dialog[open][data-armed=true]")
        page.click("dialog.consent-dialog[open] .allow")
        frame.wait_for_function("() => document.querySelectorAll('#table tbody tr').length === 2")
        page.evaluate("() => { document.activeElement?.blur(); window.scrollTo(0, 0); }")
        return {"python-extract": page.screenshot(animations="disabled", caret="hide")}
    finally:
        page.close()


def compare(name: str, actual: bytes, baseline: Path) -> str | None:
    """None when ``actual`` (PNG bytes) matches the ``baseline`` file within
    `TOLERANCE`, else a message that says how it differs and names `UPDATE_COMMAND`."""
    if not baseline.is_file():
        return f"{name}: no baseline {baseline.name}; run `{UPDATE_COMMAND}`"
    with Image.open(baseline) as stored, Image.open(io.BytesIO(actual)) as taken:
        want = stored.convert("RGB")
        got = taken.convert("RGB")
    if want.size != got.size:
        return (
            f"{name}: the page is {got.size[0]}x{got.size[1]} px, the baseline "
            f"{want.size[0]}x{want.size[1]} px; if the change is intended, run `{UPDATE_COMMAND}`"
        )
    diff = ImageChops.difference(want, got).convert("L")
    differing = sum(diff.point(lambda v: 255 if v > PIXEL_THRESHOLD else 0).histogram()[255:])
    share = differing / (want.size[0] * want.size[1])
    if share > TOLERANCE:
        return (
            f"{name}: {share:.2%} of the pixels differ from the baseline (tolerance "
            f"{TOLERANCE:.2%}); if the change is intended, run `{UPDATE_COMMAND}`"
        )
    return None


# --------------------------------------------------------------------------- command line


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


#: Where `capture_manager`'s model (a copy of TinyChat under another name) is served.
README_MODEL = "_readme/tinychat-copy-q8_0.gguf"


@contextlib.contextmanager
def _serve_dist(build: ModuleType) -> Iterator[str]:
    with tempfile.TemporaryDirectory() as extra:
        model = build.DIST / "models" / "tinychat" / "tiny-chat-q8_0.gguf"
        if model.is_file():
            shutil.copyfile(model, Path(extra) / Path(README_MODEL).name)
        with _serve_folder(build, {"/" + str(Path(README_MODEL).parent) + "/": Path(extra)}) as url:
            yield url


@contextlib.contextmanager
def _serve_folder(build: ModuleType, overlays: dict[str, Path]) -> Iterator[str]:
    # build.py has put runtime/ on sys.path; the server is the shell's own.
    from napllm.devtools.headless import serving

    with serving(build.DIST, overlays=overlays) as url:
        yield url


def take(readme: bool = False) -> dict[str, bytes]:
    """Build dist/ when stale, serve it and capture every screenshot (with
    ``readme``, also those of `capture_readme`, each in a context of its own)."""
    from playwright.sync_api import sync_playwright

    build = _load("napllm_build", ROOT / "build.py")
    # The project's launch flags (Debian's Chromium, offline); build.py put runtime/ on sys.path.
    from napllm.devtools.headless import launch_options

    if build.dist_is_stale():
        build.build()
    with _serve_dist(build) as base_url, sync_playwright() as playwright:
        browser = playwright.chromium.launch(**launch_options())
        try:
            shots: dict[str, bytes] = {}
            steps = (capture, capture_readme, capture_manager, capture_catalogue, capture_python)
            for step in steps if readme else (capture,):
                context = browser.new_context()
                try:
                    shots.update(step(context, base_url))
                finally:
                    context.close()
            return shots
        finally:
            browser.close()


def main(argv: list[str] | None = None) -> int:
    """Compare with (or, with ``--update-baselines``, rewrite) the baselines; 1 on mismatch."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--update-baselines",
        action="store_true",
        help="write the baselines and the README's screenshots from dist/",
    )
    args = parser.parse_args(argv)
    shots = take(readme=args.update_baselines)
    baselines = {name: png for name, png in shots.items() if name in shot_names()}
    if args.update_baselines:
        BASELINES.mkdir(parents=True, exist_ok=True)
        README_SHOTS.mkdir(parents=True, exist_ok=True)
        for name, png in baselines.items():
            (BASELINES / f"{name}.png").write_bytes(png)
        for name, png in shots.items():
            if name not in baselines or name.split("-")[0] in README_VIEWS:
                (README_SHOTS / f"{name}.png").write_bytes(png)
        print(f"wrote {len(baselines)} baselines and the README's screenshots")
        return 0
    problems = [p for n, png in baselines.items() if (p := compare(n, png, BASELINES / f"{n}.png"))]
    for problem in problems:
        print(problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
