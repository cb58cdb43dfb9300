"""Benchmark: a Python napplet's ready time in the shell against a bare Pyodide boot.

Prints, for this machine, in one headless Chromium (medians over ``--runs``):

- bare Pyodide: a plain page of the same origin that loads Pyodide from
  dist/, then what the script imports (``loadPackagesFromImports``: napllm
  and its dependencies, pydantic and pydantic_core among them; not
  micropip, which the script does not import), as a napplet's loader does,
  and runs the same script; cold (a fresh browser context) and warm (the
  page again in that context, the HTTP cache filled);
- Python napplet: the same script in a napplet (``<meta
  name="napplet-python">``) opened in the shell through its URL form; cold
  (the first Python napplet of a freshly booted shell, which fetches and
  hashes the files) and warm (a later one: the files come from the shell's
  memory);
- the ratio warm napplet / warm bare (the goal is <= 1.2);
- memory per frame: the size of the napplet's WebAssembly memory (Pyodide's
  heap) and the JS heap in use as the frame sees it
  (``performance.memory.usedJSHeapSize``: Chromium runs a sandboxed frame
  in a process of its own, so this is mostly the frame's).

The shell is measured once its service worker has precached dist/ (its
first visit downloads everything from the same server).

A warm bare page runs Pyodide's wasm from V8's compiled-code cache (kept
with the HTTP cache entry of ``pyodide.asm.wasm``); a napplet's frame
compiles it from bytes handed over a port, which that cache never serves,
so it runs baseline code until V8 tiers it up, like a cold page. Hence
the second ratio.

"Ready" is the page's or the frame's ``performance.now()`` when the script
has run: from its own navigation start, so both include everything that
loading it took. Uses the shell's server and Debian's Chromium; builds dist/
first when it is stale; the pages are served from a temporary folder under
``/_bench/``. Usage: ``python bench/bench_python_napplet.py [--runs 3] [--quick]``
(``--quick``: one run of each).
"""

# ruff: noqa: E501  (the embedded JavaScript and the printed table keep their natural line length)

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from playwright.sync_api import sync_playwright

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "runtime"), str(ROOT / "tools")]  # napllm; the build's steps
from buildsys.dist import build, dist_is_stale  # noqa: E402
from buildsys.paths import DIST  # noqa: E402

from napllm.devtools.headless import launch_options, make_server  # noqa: E402

BENCH_DIR = "_bench"
TIMEOUT_MS = 180_000
#: Marks the first visit done, so the shell does not open the Chat napplet by itself.
RETURNING = "try { if (window.top === window) localStorage.setItem('napllm.firstVisit', 'done'); } catch (e) {}"

#: The script both pages run; it writes the result where the benchmark reads it.
SCRIPT = """
import js, napllm, pydantic, pyodide_js
js.document.body.dataset.ready = str(js.performance.now())
js.document.body.dataset.wasm = str(pyodide_js._module.HEAP8.length)
"""

BARE_PAGE = """<!doctype html><meta charset="utf-8"><title>bare</title><body>
<script type="module">
import { loadPyodide } from '../pyodide/pyodide.mjs';
const script = %r;
const py = await loadPyodide({ indexURL: new URL('../pyodide/', location.href).href });
await py.loadPackagesFromImports(script);
await py.runPythonAsync(script);
</script>"""

NAPPLET_PAGE = """<!doctype html><html><head><meta charset="utf-8"><title>bench</title>
<meta name="napplet-python" content=""></head><body>
<script type="py">%s</script>
</body></html>"""


def median(values: list[float]) -> str:
    """Median with the range, e.g. ``2900 (2600-3500)``."""
    return f"{statistics.median(values):.0f} ({min(values):.0f}-{max(values):.0f})"


def bare_runs(browser: Any, url: str) -> tuple[float, float]:
    """Ready ms of the bare page: cold (a fresh context), then warm (reloaded)."""
    context = browser.new_context()
    page = context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    found = []
    for _ in range(2):
        page.goto(url)
        page.wait_for_function("() => document.body && document.body.dataset.ready")
        found.append(float(page.evaluate("document.body.dataset.ready")))
    context.close()
    return found[0], found[1]


def open_napplet(page: Any, url: str) -> dict[str, float]:
    """Open the napplet through the shell's URL form; its ready ms and wasm bytes."""
    before = page.locator("iframe.napplet-frame").count()
    page.fill("#napplet-url", url)
    page.click("#napplet-url-open")
    page.wait_for_function(
        "(n) => document.querySelectorAll('iframe.napplet-frame').length > n", arg=before
    )
    frame = page.locator("iframe.napplet-frame").last.element_handle().content_frame()
    frame.wait_for_function(
        "() => ['ready', 'error'].includes(document.documentElement.dataset.nappletPython)",
        timeout=TIMEOUT_MS,
        polling=50,
    )
    if frame.evaluate("document.documentElement.dataset.nappletPython") != "ready":
        raise SystemExit(
            "the benchmark napplet failed: " + frame.evaluate("document.body.innerText")
        )
    marks = frame.evaluate(
        "() => Object.fromEntries(performance.getEntriesByType('mark')"
        ".filter((m) => m.name.startsWith('napplet-python:')).map((m) => [m.name.slice(15), m.startTime]))"
    )
    return {
        **{f"mark:{name}": float(value) for name, value in marks.items()},
        "ready": float(frame.evaluate("document.body.dataset.ready")),
        "wasm": float(frame.evaluate("document.body.dataset.wasm")),
        "heap": float(
            frame.evaluate("performance.memory ? performance.memory.usedJSHeapSize : NaN")
        ),
    }


def napplet_runs(browser: Any, shell_url: str, napplet_url: str, runs: int) -> dict[str, Any]:
    """A freshly booted shell: one cold napplet, then `runs` warm ones (each tab closed after)."""
    context = browser.new_context()
    context.add_init_script(RETURNING)
    page = context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    page.goto(shell_url)
    page.wait_for_function("() => ['ready', 'failed'].includes(document.body.dataset.boot)")
    # The first visit's precache downloads all of dist/ from the same server:
    # measured after it, so both pages compete with nothing.
    page.wait_for_function(
        "() => document.body.dataset.offline === 'ready' && !!navigator.serviceWorker.controller"
    )
    cold = open_napplet(page, napplet_url)
    warm = []
    for _ in range(runs):
        page.locator(".tab-toolbar .close").last.click()
        warm.append(open_napplet(page, napplet_url))
    context.close()
    return {"cold": cold, "warm": warm}


def main() -> None:
    """Command line entry point (see the module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument(
        "--quick", action="store_true", help="one run of each, to check the benchmark works"
    )
    a = ap.parse_args()
    if a.quick:
        a.runs = 1
    if dist_is_stale():
        build()
    pages = Path(tempfile.mkdtemp(prefix="napllm-bench-"))
    (pages / "bare.html").write_text(BARE_PAGE % SCRIPT, encoding="utf-8")
    (pages / "napplet.html").write_text(NAPPLET_PAGE % SCRIPT, encoding="utf-8")
    server = make_server(DIST, quiet=True, overlays={f"/{BENCH_DIR}/": pages})
    threading.Thread(target=server.serve_forever, daemon=True).start()
    origin = f"http://127.0.0.1:{server.server_address[1]}/"
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(**launch_options())
            bare = [bare_runs(browser, f"{origin}{BENCH_DIR}/bare.html") for _ in range(a.runs)]
            shells = [
                napplet_runs(
                    browser, origin + "index.html", f"{origin}{BENCH_DIR}/napplet.html", a.runs
                )
                for _ in range(a.runs)
            ]
            browser.close()
    finally:
        server.shutdown()
        server.server_close()
        shutil.rmtree(pages)
    bare_cold = [c for c, _ in bare]
    bare_warm = [w for _, w in bare]
    napplet_cold = [s["cold"]["ready"] for s in shells]
    napplet_warm = [w["ready"] for s in shells for w in s["warm"]]
    wasm = [s["cold"]["wasm"] for s in shells]
    heap = [s["cold"]["heap"] for s in shells]
    ratio = statistics.median(napplet_warm) / statistics.median(bare_warm)
    ratio_cold = statistics.median(napplet_warm) / statistics.median(bare_cold)
    print(
        f"Ready: Pyodide + what 'import napllm, pydantic' needs, ms from navigation start ({a.runs} runs):"
    )
    print(f"  {'':16}{'bare Pyodide page':>22}{'Python napplet':>22}")
    print(f"  {'cold':16}{median(bare_cold):>22}{median(napplet_cold):>22}")
    print(f"  {'warm':16}{median(bare_warm):>22}{median(napplet_warm):>22}")
    print(f"  warm napplet / warm bare = {ratio:.2f} (goal <= 1.2)")
    print(f"  warm napplet / cold bare = {ratio_cold:.2f} (both compile Pyodide's wasm afresh)")
    print("  napplet steps, warm (ms from the frame's navigation start):")
    for step in ("loading", "booting", "running"):
        print(f"    {step:14}{median([w['mark:' + step] for s in shells for w in s['warm']])}")
    print("Memory per Python napplet frame:")
    print(f"  WebAssembly memory (Pyodide heap)  {statistics.median(wasm) / 1e6:.1f} MB")
    print(f"  JS heap in use, the frame's realm  {statistics.median(heap) / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
