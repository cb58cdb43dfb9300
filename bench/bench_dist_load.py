"""Benchmark: how fast dist/ boots in headless Chromium, served from 127.0.0.1.

Prints, for this machine (medians over ``--runs`` fresh browser contexts, so
nothing is cached between runs):

- Pyodide: ms from navigation start to ``loadPyodide`` resolved, to
  ``loadPackage('napllm')`` done (all wheels by name from the merged lock), and
  to ``import napllm, pydantic, jschon`` done; bytes transferred;
- wllama with the TinyChat model from dist/: ms to load the model (fetch +
  wasm start + llama.cpp load), ms for the greedy ``Hello!`` chat answer, and
  tokens/s for a 128-token raw completion with EOS ignored (1 thread).

Uses the shell's server (COOP/COEP) and Debian's Chromium; builds dist/ first
when it is missing; the benchmark pages are served from a temporary folder
under ``/_bench/``, never written into dist/. Usage:
``python bench/bench_dist_load.py [--runs 5] [--quick]`` (``--quick``: one run).
"""

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

PYODIDE_PAGE = """<!doctype html><meta charset="utf-8"><title>bench</title>
<script type="module">
import { loadPyodide } from '../pyodide/pyodide.mjs';
window.bench = async () => {
  const py = await loadPyodide({ indexURL: new URL('../pyodide/', location.href).href });
  const ready = performance.now();
  await py.loadPackage('napllm', { messageCallback: () => {} });
  const loaded = performance.now();
  await py.runPythonAsync('import napllm, napllm.lmsp, pydantic, jschon');
  return { ready, loaded, imported: performance.now() };
};
</script>"""

WLLAMA_PAGE = """<!doctype html><meta charset="utf-8"><title>bench</title>
<script type="module">
import { Wllama, wasmPaths } from '../vendor/wllama/wllama.js';
window.bench = async () => {
  const w = new Wllama(wasmPaths, { suppressNativeLog: true });
  const t0 = performance.now();
  await w.loadModelFromUrl(new URL('../models/tinychat/tiny-chat-q8_0.gguf', location.href).href,
    { n_threads: 1, n_ctx: 512, n_gpu_layers: 0, seed: 0, useCache: false });
  const t1 = performance.now();
  const chat = await w.createChatCompletion({
    messages: [{ role: 'user', content: 'Hello!' }], temperature: 0, top_k: 1, max_tokens: 32 });
  const t2 = performance.now();
  const raw = await w.createCompletion({
    prompt: '<|im_start|>user\\nHello!<|im_end|>\\n<|im_start|>assistant\\n',
    max_tokens: 128, temperature: 0, top_k: 1, ignore_eos: true });
  const t3 = performance.now();
  await w.exit();
  return { load: t1 - t0, chat: t2 - t1, text: chat.choices[0].message.content,
           rawTokens: raw.usage.completion_tokens, rawMs: t3 - t2 };
};
</script>"""


def median(values: list[float]) -> str:
    """Median with the range, e.g. ``2900 (2600-3500)``."""
    return f"{statistics.median(values):.0f} ({min(values):.0f}-{max(values):.0f})"


def run_page(browser: Any, url: str) -> tuple[dict[str, Any], int]:
    """Open ``url`` in a fresh context, run ``window.bench()``; return result and bytes."""
    context = browser.new_context()
    page = context.new_page()
    page.set_default_timeout(120_000)
    sizes: list[int] = []

    def on_finished(request: Any) -> None:
        s = request.sizes()
        sizes.append(s["responseBodySize"] + s["responseHeadersSize"])

    page.on("requestfinished", on_finished)
    page.goto(url)
    page.wait_for_function("typeof window.bench === 'function'")
    result: dict[str, Any] = page.evaluate("window.bench()")
    context.close()
    return result, sum(sizes)


def main() -> None:
    """Command line entry point (see the module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="one run, to check the benchmark works")
    a = ap.parse_args()
    if a.quick:
        a.runs = 1
    if dist_is_stale():
        build()
    pages = Path(tempfile.mkdtemp(prefix="napllm-bench-"))
    (pages / "pyodide.html").write_text(PYODIDE_PAGE)
    (pages / "wllama.html").write_text(WLLAMA_PAGE)
    server = make_server(DIST, quiet=True, overlays={f"/{BENCH_DIR}/": pages})
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}/{BENCH_DIR}/"
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(**launch_options())
            py_runs = [run_page(browser, base + "pyodide.html") for _ in range(a.runs)]
            ll_runs = [run_page(browser, base + "wllama.html") for _ in range(a.runs)]
            browser.close()
    finally:
        server.shutdown()
        server.server_close()
        shutil.rmtree(pages)
    print(f"Pyodide + napllm from dist/, {a.runs} cold runs, ms from navigation start:")
    print(f"  Pyodide ready        {median([r['ready'] for r, _ in py_runs])}")
    print(f"  napllm loaded        {median([r['loaded'] for r, _ in py_runs])}")
    print(f"  napllm imported      {median([r['imported'] for r, _ in py_runs])}")
    print(f"  bytes transferred    {statistics.median([n for _, n in py_runs]) / 1e6:.2f} MB")
    print(f"wllama + TinyChat q8_0 from dist/, 1 thread, {a.runs} cold runs:")
    print(f"  model load ms        {median([r['load'] for r, _ in ll_runs])}")
    print(f"  'Hello!' answer ms   {median([r['chat'] for r, _ in ll_runs])}")
    rates = [r["rawTokens"] / (r["rawMs"] / 1000) for r, _ in ll_runs]
    print(f"  raw completion tok/s {median(rates)} ({ll_runs[0][0]['rawTokens']} tokens)")
    print(f"  answer text          {ll_runs[0][0]['text']!r}")


if __name__ == "__main__":
    main()
