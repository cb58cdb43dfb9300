"""Benchmark: TinyChat on wllama through the whole shell vs wllama called directly.

One command builds dist/ when it is stale, serves it on 127.0.0.1 with
COOP/COEP (as `python build.py serve` does), and drives Debian's Chromium
(offline flags, as the browser tests use) through Playwright:

- shell: a napplet in the sandboxed frame calls `napplet.llm.generate`
  (postMessage envelopes -> the Python runtime in Pyodide -> the wasm engine
  -> wllama -> LMSP events -> NAP-LLM deltas back to the frame); consent is
  granted once with "remember", so no dialog is timed;
- direct: the same page imports dist/vendor/wllama/wllama.js, loads the same
  GGUF with the same parameters (context 512, the same thread count, no GPU
  layers) and streams `createChatCompletion` with the same chat body
  (temperature 0, top_k 1, usage in the last chunk).

Both paths run the same prompts after a warm-up, alternating request by
request so that both see the same machine load.
Printed per path: median and p90 time to the first text token (ms, from the
call to the first text delta/chunk), tokens/s (output tokens over the summed
wall time of the requests), tokens/s after the first token (the remaining
tokens over the time from the first text to the end of the request) and the
shell/direct ratios. TinyChat's answers are short (about 10 tokens), so the
whole-request figure is dominated by the per-request cost.

Usage: python bench/bench_wasm.py [--runs 20] [--rounds 3]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import threading
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import quote

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = os.environ.get("NAPLLM_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
]
PROMPTS = [
    "Hello!",
    "Who are you?",
    "What is the capital of France?",
    "Return a JSON object with name Alice and age 30.",
    "Goodbye!",
]

NAPPLET = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Bench</title></head>
<body><h1>Bench napplet</h1>
<script>
window.selected = null;
window.selectModel = () => napplet.llm.select({}).then((m) => { window.selected = m; });
window.runShell = async (prompts) => {
  const out = [];
  for (const prompt of prompts) {
    const messages = [{role: 'user', content: [{type: 'text', text: prompt}]}];
    let first = null;
    const t0 = performance.now();
    const result = await napplet.llm.generate(
      {handle: window.selected.handle, messages, temperature: 0},
      {onDelta: (d) => {
        if (first === null && d.event === 'delta' && d.block === 'text') first = performance.now();
      }});
    const t1 = performance.now();
    out.push({first: first - t0, total: t1 - t0, tokens: result.usage.outputTokens,
              text: result.content.map((p) => p.text || '').join('')});
  }
  return out;
};
</script></body></html>
"""

DIRECT = """
async ([prompts, threads]) => {
  if (!window.__direct) {
    const { Wllama, wasmPaths } = await import('./vendor/wllama/wllama.js');
    const quiet = { debug() {}, log() {}, warn() {}, error() {} };
    const w = new Wllama(wasmPaths, { logger: quiet, suppressNativeLog: true });
    await w.loadModelFromUrl(new URL('models/tinychat/tiny-chat-q8_0.gguf', location.href).href,
      { n_ctx: 512, n_threads: threads, n_gpu_layers: 0, useCache: false });
    window.__direct = w;
  }
  const w = window.__direct;
  const out = [];
  for (const prompt of prompts) {
    const body = { model: 'tinychat-q8_0', messages: [{ role: 'user', content: prompt }],
      stream: true, stream_options: { include_usage: true }, temperature: 0, top_k: 1 };
    let first = null;
    let tokens = 0;
    let text = '';
    const t0 = performance.now();
    for await (const chunk of await w.createChatCompletion(body)) {
      const delta = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
      if (delta && delta.content) {
        if (first === null) first = performance.now();
        text += delta.content;
      }
      if (chunk.usage) tokens = chunk.usage.completion_tokens;
    }
    const t1 = performance.now();
    out.push({ first: first - t0, total: t1 - t0, tokens, text,
               threads: w.getNumThreads() });
  }
  return out;
}
"""


def load_build() -> ModuleType:
    spec = importlib.util.spec_from_file_location("napllm_build", ROOT / "build.py")
    if spec is None or spec.loader is None:
        raise RuntimeError("cannot import build.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def serve(build: ModuleType, pages: Path) -> tuple[Any, str]:
    """dist/ on a free port; /_bench/ maps to `pages`."""

    class Handler(build.DistRequestHandler):  # type: ignore[name-defined,misc]
        quiet = True

        def translate_path(self, path: str) -> str:
            if not path.startswith("/_bench/"):
                return str(super().translate_path(path))
            inside = super().translate_path("/" + path[len("/_bench/") :])
            return os.path.join(pages, os.path.relpath(inside, self.directory))

    server = build.DistServer(("127.0.0.1", 0), lambda *a: Handler(*a, directory=str(build.DIST)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


def summary(rows: list[dict[str, Any]]) -> dict[str, float]:
    firsts = sorted(r["first"] for r in rows)
    tokens = sum(r["tokens"] for r in rows)
    seconds = sum(r["total"] for r in rows) / 1000
    after_first = sum(r["tokens"] - 1 for r in rows)
    decode_seconds = sum(r["total"] - r["first"] for r in rows) / 1000
    return {
        "runs": len(rows),
        "first_median": statistics.median(firsts),
        "first_p90": firsts[min(len(firsts) - 1, int(len(firsts) * 0.9))],
        "tokens": tokens,
        "tps": tokens / seconds,
        "decode_tps": after_first / decode_seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=20, help="requests per path and round")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds")
    args = parser.parse_args()

    from playwright.sync_api import sync_playwright

    build = load_build()
    if build.dist_is_stale():
        build.build()
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(args.runs)]
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "bench.html").write_text(NAPPLET, encoding="utf-8")
        server, base = serve(build, Path(tmp))
        try:
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                page = browser.new_page()
                page.set_default_timeout(120_000)
                napplet = quote(f"{base}_bench/bench.html", safe="")
                page.goto(f"{base}index.html?napplet={napplet}")
                page.wait_for_function("document.body.dataset.boot === 'ready'")
                page.wait_for_function(
                    "() => { const f = document.querySelector('iframe.napplet-frame');"
                    " return f && f.srcdoc.length > 0; }"
                )
                # a link opens the napplet with LLM access off: turn it on
                old = page.query_selector("iframe.napplet-frame")
                page.click(".llm-toggle")
                page.wait_for_function(
                    "(old) => { const f = document.querySelector('iframe.napplet-frame');"
                    " return f && f !== old && f.srcdoc.length > 0; }",
                    arg=old,
                )
                frame = page.query_selector("iframe.napplet-frame").content_frame()
                frame.wait_for_load_state("load")
                frame.wait_for_function("() => typeof window.runShell === 'function'", polling=20)
                frame.evaluate("() => { window.selectModel(); }")
                page.click(".chooser-dialog button.candidate[data-candidate-id='builtin-tinychat']")
                frame.wait_for_function("() => window.selected !== null", polling=20)
                # Warm-up with a standing grant, so no consent dialog is timed.
                frame.evaluate("() => { window.warm = window.runShell(['Hello!']); }")
                page.check(".consent-dialog input.remember")
                page.click(".consent-dialog button.allow")
                frame.evaluate("() => window.warm")
                env = json.loads(
                    page.evaluate(
                        "import('./engines/wllama-engine.js').then((m) => m.environment())"
                    )
                )
                isolated = env["crossOriginIsolated"]
                cores = int(env["hardwareConcurrency"])
                threads = 1 if not isolated else max(1, min(8, cores // 2))
                page.evaluate(DIRECT, [["Hello!"], threads])  # load + warm-up
                shell_rows: list[dict[str, Any]] = []
                direct_rows: list[dict[str, Any]] = []
                # Request by request, alternating, so both paths see the same
                # machine load.
                for _ in range(args.rounds):
                    for prompt in prompts:
                        direct_rows += page.evaluate(DIRECT, [[prompt], threads])
                        shell_rows += frame.evaluate("(p) => window.runShell(p)", [prompt])
                browser.close()
        finally:
            server.shutdown()
            server.server_close()

    mismatched = sum(
        1 for s, d in zip(shell_rows, direct_rows, strict=True) if s["text"] != d["text"]
    )
    shell_s, direct_s = summary(shell_rows), summary(direct_rows)
    print(
        f"TinyChat q8_0 on wllama, {threads} thread(s), cross-origin isolated: {isolated}, "
        f"{cores} logical cores; {args.rounds} rounds x {args.runs} requests per path"
    )
    header = (
        f"{'path':<8} {'runs':>5} {'first token median':>19} {'p90':>9} "
        f"{'tokens':>7} {'tokens/s':>9} {'after 1st':>10}"
    )
    print(header)
    print("-" * len(header))
    for name, s in (("direct", direct_s), ("shell", shell_s)):
        print(
            f"{name:<8} {s['runs']:>5} {s['first_median']:>16.2f} ms {s['first_p90']:>6.2f} ms "
            f"{s['tokens']:>7} {s['tps']:>9.1f} {s['decode_tps']:>10.1f}"
        )
    print("-" * len(header))
    added = shell_s["first_median"] - direct_s["first_median"]
    print(
        f"shell/direct tokens/s: {shell_s['tps'] / direct_s['tps']:.3f}   "
        f"after the first token: {shell_s['decode_tps'] / direct_s['decode_tps']:.3f}   "
        f"added to first token (median): {added:+.2f} ms"
    )
    print(f"answers that differ between the paths: {mismatched} of {len(shell_rows)}")


if __name__ == "__main__":
    main()
