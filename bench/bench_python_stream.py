"""Benchmark: the shell's streaming rate to a Python napplet against a JavaScript one.

Prints, for this machine, in one headless Chromium and one booted shell (the
test build, whose fixture connection answers from a queued script with no
model behind it, so the shell and the napplet are all that is measured):

- for a JavaScript napplet (``window.napplet.llm.generate`` with
  ``onDelta``) and a Python napplet (``async for text in llm.stream(...)``
  of ``napllm.napplet``), one generation of ``--deltas`` one-character text
  deltas each, ``--runs`` times, alternating: the time from the request to
  the terminal result as the napplet itself measures it
  (``performance.now()`` in its frame), the provider deltas per second that
  makes, and whether the text received equals the text sent;
- the ratio Python / JavaScript of the median rates (the goal is >= 0.98:
  a Python napplet costs the shell nothing more per token).

Both napplets run the same request through the same connection with a
standing permission (one consent, given before the timed runs). The shell
coalesces deltas (docs/design.md), so a napplet sees fewer envelopes than
the provider sent deltas; both count the same provider deltas.

Usage: ``python bench/bench_python_stream.py [--deltas 20000] [--runs 3] [--quick]``
(``--quick``: 2,000 deltas, one run each, to check that it works). Builds
the test build (dist-test/) when needed; serves it on 127.0.0.1 with the
shell's server and drives Debian's Chromium; nothing leaves the machine.
The exit status is 1 when text was lost or a generation failed.
"""

# ruff: noqa: E501  (the embedded pages and the printed table keep their natural line length)

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from playwright.sync_api import sync_playwright

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "runtime"), str(ROOT / "tools"), str(ROOT / "tests" / "browser"), str(ROOT / "tests")]
from buildsys.dist import build, build_test_dist, dist_is_stale  # noqa: E402

from napllm.devtools.headless import launch_options  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
from bench_shell import Server  # noqa: E402  (the shell's server with overlays)

TEST = "_test"
TIMEOUT_MS = 180_000
FIXTURE = "Fixture (all capabilities)"
CONNECTION = "fx-full"

#: The JavaScript napplet: one generate per `run()`, timed in its frame.
JS_PAGE = """<!doctype html><title>JS stream</title>
<script>
let model = null;
window.bench = { result: null };
window.probe = {};  // what the shell page's test driver waits for
window.pickModel = async () => { model = await window.napplet.llm.select({}); window.bench.selected = true; };
window.run = async () => {
  window.bench.result = null;
  const parts = [];
  const started = performance.now();
  const result = await window.napplet.llm.generate(
    { handle: model.handle, messages: [{ role: "user", content: [{ type: "text", text: "Hi" }] }] },
    { onDelta: (d) => { if (d.event === "delta" && typeof d.text === "string") parts.push(d.text); } },
  );
  window.bench.result = JSON.stringify({ ms: performance.now() - started, text: parts.join(""), finish: result.finish });
};
</script>"""

#: The Python napplet: the same request through `napllm.napplet`'s stream.
PY_PAGE = """<!doctype html><meta name="napplet-python" content=""><title>Python stream</title>
<script>window.bench = { result: null };</script>
<script type="py">
import asyncio
import json

import js
from pyodide.ffi import create_proxy

from napllm.napplet import llm


async def pick_model():
    await llm.select()
    js.window.bench.selected = True


async def run():
    js.window.bench.result = None
    parts = []
    started = js.performance.now()
    stream = llm.stream("Hi")
    async for text in stream:
        parts.append(text)
    js.window.bench.result = json.dumps({"ms": js.performance.now() - started, "text": "".join(parts), "finish": "stop"})


_keep = [create_proxy(lambda: asyncio.ensure_future(pick_model())), create_proxy(lambda: asyncio.ensure_future(run()))]
js.window.pickModel, js.window.run = _keep
</script>"""


def open_napplet(shell: Any, url: str, python: bool) -> Any:
    """Open one benchmark napplet, pick the fixture connection, give a standing permission."""
    napplet = shell.open_python(url) if python else shell.open_napplet(url)
    frame = napplet.frame
    if python:
        state = frame.evaluate("document.documentElement.dataset.nappletPython")
        if state != "ready":
            raise SystemExit(f"the Python napplet did not start: {frame.locator('.napplet-python-error').all_inner_texts()}")
    frame.evaluate("() => { window.pickModel(); }")
    shell.choose(FIXTURE)
    frame.wait_for_function("() => window.bench.selected === true", timeout=TIMEOUT_MS)
    return napplet


def start(shell: Any, napplet: Any, deltas: int) -> str:
    """Queue one generation of `deltas` one-character deltas and start it in `napplet`."""
    from napllm.providers.fixture import completed, text_events

    chunks = [f"{i % 10}" for i in range(deltas)]
    shell.queue(CONNECTION, [*text_events(chunks), completed()])
    napplet.frame.evaluate("() => { window.run(); }")
    return "".join(chunks)


def finish(napplet: Any, sent: str) -> tuple[float, bool]:
    """Wait for the napplet's result: (ms from request to terminal, text intact)."""
    frame = napplet.frame
    frame.wait_for_function("() => typeof window.bench.result === 'string'", timeout=TIMEOUT_MS, polling=20)
    result = json.loads(frame.evaluate("() => window.bench.result"))
    return float(result["ms"]), result["text"] == sent


def run_once(shell: Any, napplet: Any, deltas: int, first: bool = False) -> tuple[float, bool]:
    """One timed generation of `deltas` deltas in `napplet` alone."""
    sent = start(shell, napplet, deltas)
    if first:
        shell.remember()
    return finish(napplet, sent)


def run_beside(shell: Any, observer: Any, other: Any, deltas: int) -> tuple[float, bool]:
    """The observer's generation while `other` streams one of the same size beside it."""
    sent_other = start(shell, other, deltas)
    sent = start(shell, observer, deltas)
    ms, intact = finish(observer, sent)
    _ms, other_intact = finish(other, sent_other)
    return ms, intact and other_intact


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deltas", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    a = parser.parse_args()
    if a.quick:
        a.deltas, a.runs = 2_000, 1
    if dist_is_stale():
        build()
    from shellpage import ShellPage, install_napplets

    pages = Path(tempfile.mkdtemp(prefix="napllm-bench-stream-"))
    (pages / "js-stream.html").write_text(JS_PAGE, encoding="utf-8")
    (pages / "py-stream.html").write_text(PY_PAGE, encoding="utf-8")
    # another napplet (other bytes, so its own consent), the same code
    (pages / "js-observer.html").write_text(JS_PAGE.replace("JS stream", "JS observer"), encoding="utf-8")
    server = Server({f"/{TEST}/": pages}, build_test_dist())
    ok = True
    rates: dict[str, list[float]] = {"JavaScript": [], "Python": []}
    beside: dict[str, list[float]] = {"JavaScript": [], "Python": []}
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(**launch_options())
            try:
                page = browser.new_context().new_page()
                page.set_default_timeout(TIMEOUT_MS)
                shell = ShellPage(page, server.url, install_napplets(pages, server.url))
                shell.boot()
                napplets = {
                    "JavaScript": open_napplet(shell, f"{server.url}{TEST}/js-stream.html", python=False),
                    "Python": open_napplet(shell, f"{server.url}{TEST}/py-stream.html", python=True),
                    "observer": open_napplet(shell, f"{server.url}{TEST}/js-observer.html", python=False),
                }
                for napplet in napplets.values():  # warm-up, and each one's standing permission
                    napplet.show()
                    _ms, intact = run_once(shell, napplet, 50, first=True)
                    ok = ok and intact
                observer = napplets["observer"]
                for _ in range(a.runs):
                    for name in ("JavaScript", "Python"):
                        ms, intact = run_once(shell, napplets[name], a.deltas)
                        ok = ok and intact
                        rates[name].append(a.deltas / (ms / 1000))
                        ms, intact = run_beside(shell, observer, napplets[name], a.deltas)
                        ok = ok and intact
                        beside[name].append(a.deltas / (ms / 1000))
            finally:
                browser.close()
    finally:
        server.close()
        shutil.rmtree(pages, ignore_errors=True)
    def table(title: str, figures: dict[str, list[float]]) -> float:
        print(f"\n{title}")
        print(f"{'napplet':<22}{'deltas/s':>12}{'runs':>36}")
        for name, values in figures.items():
            shown = ", ".join(f"{v:,.0f}" for v in values)
            print(f"{name:<22}{statistics.median(values):>12,.0f}{shown:>36}")
        ratio = statistics.median(figures["Python"]) / statistics.median(figures["JavaScript"])
        print(f"{'Python / JavaScript':<22}{ratio:>12.2f}")
        return ratio

    size = f"{a.deltas} provider text deltas of 1 character, {a.runs} run(s) each, median"
    table(f"(a) one napplet streaming alone, as it receives them ({size})", rates)
    shell_ratio = table(
        f"(b) the shell's rate to a JavaScript observer napplet while a napplet of each kind streams beside it ({size})",
        beside,
    )
    print(f"{'(b) goal':<22}{'>= 0.98':>12}   {'met' if shell_ratio >= 0.98 else 'NOT met'}")
    print(f"{'text intact':<22}{'yes' if ok else 'NO':>12}")
    if not ok:
        sys.exit(1)


if __name__ == "__main__":
    main()
