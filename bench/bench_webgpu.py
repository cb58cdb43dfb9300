"""Benchmark: TinyChat on WebGPU (transformers.js on ONNX, and WebLLM) through the
shell vs each engine called directly, next to wllama (llama.cpp, WebAssembly) on
the same prompts.

One command builds dist/ when it is stale, serves it on 127.0.0.1 with
COOP/COEP, and drives Debian's Chromium with ``--enable-unsafe-webgpu``
(offline flags as in the browser tests). Without a GPU the adapter is
SwiftShader: WGSL compute shaders run on the CPU, so the absolute figures
are those of a software adapter, for the record; the target is the ratio.

Paths, all greedy (temperature 0) on the same prompts:
- onnx-shell: a napplet calls ``napplet.llm.generate`` on the built-in
  "TinyChat (WebGPU, transformers.js)" connection (postMessage envelopes ->
  the Python runtime in Pyodide -> web/engines/engine-host.js -> its
  worker -> NAP-LLM deltas back to the frame); consent is granted once with
  "remember", so no dialog is timed;
- onnx-direct: the page calls the engine host (engine-host.js) itself (its own worker
  with its own copy of the model; the same chat body the runtime sends),
  reading chunks as the runtime does;
- webllm-shell: the same napplet on the built-in "TinyChat (WebGPU, WebLLM)"
  connection (-> web/engines/engine-host.js -> WebLLM's worker);
- webllm-direct: the page calls the engine host itself with the chat body
  the runtime sends (the same engine: one WebLLM model is loaded at a time),
  reading chunks as the runtime does;
- wllama-direct: dist/vendor/wllama/wllama.js with the shipped GGUF (one
  thread), for comparison.

Every prompt runs once per path before timing (ONNX Runtime's WebGPU
kernels are compiled per input shape on first use). Timed requests alternate
path by path. Printed per path: median and p90 time to the first text (ms;
transformers.js streams whole words), tokens/s (output tokens over the
summed request time), tokens/s after the first text, the shell/direct
ratios of both WebGPU engines and WebLLM against transformers.js.

Usage: python bench/bench_webgpu.py [--quick] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any
from urllib.parse import quote

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "runtime"), str(ROOT / "tools")]  # napllm; the build's steps
from buildsys.dist import build, dist_is_stale  # noqa: E402
from buildsys.paths import DIST  # noqa: E402

from napllm.devtools.engines import engine_host_js  # noqa: E402
from napllm.devtools.headless import launch_options, make_server  # noqa: E402

PROMPTS = [
    "Hello!",
    "Who are you?",
    "What is the capital of France?",
    "Return a JSON object with name Alice and age 30.",
    "Goodbye!",
]
CONNECTIONS = {"onnx": "builtin-tinychat-webgpu", "webllm": "builtin-tinychat-webllm"}
WEBLLM_MODEL = "TinyChat-q0f32-MLC"

NAPPLET = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Bench</title></head>
<body><h1>Bench napplet</h1>
<script>
window.selected = {};
window.selectModel = (key) => napplet.llm.select({}).then((m) => { window.selected[key] = m; });
window.runShell = async (prompts, key) => {
  const out = [];
  for (const prompt of prompts) {
    const messages = [{role: 'user', content: [{type: 'text', text: prompt}]}];
    let first = null;
    const t0 = performance.now();
    const result = await napplet.llm.generate(
      {handle: window.selected[key].handle, messages, temperature: 0},
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

ONNX_DIRECT = """
async (prompts) => {
  const api = await @ONNX@;
  const fields = JSON.stringify({source: {kind: 'path', base: 'models/', model: 'tinychat-onnx'},
    device: 'webgpu', dtype: 'fp32'});
  const loaded = JSON.parse(await api.ensureModel('bench', fields, 'bench', 'TinyChat'));
  if (!loaded.ok) throw new Error('the ONNX model did not load: ' + loaded.kind);
  const out = [];
  for (const prompt of prompts) {
    const body = {model: 'tinychat-onnx', messages: [{role: 'user', content: prompt}],
      stream: true, stream_options: {include_usage: true}, temperature: 0};
    let first = null, tokens = 0, text = '';
    const t0 = performance.now();
    const id = api.startChat('bench', JSON.stringify(body));
    for (;;) {
      const batch = JSON.parse(await api.nextChunks(id));
      for (const chunk of batch.chunks) {
        const delta = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
        if (delta && delta.content) {
          if (first === null) first = performance.now();
          text += delta.content;
        }
        if (chunk.usage) tokens = chunk.usage.completion_tokens;
      }
      if (batch.done) break;
    }
    out.push({first: first - t0, total: performance.now() - t0, tokens, text});
  }
  return out;
}
""".replace("@ONNX@", engine_host_js("onnx"))

WEBLLM_DIRECT = """
async (prompts) => {
  const api = await @WEBLLM@;
  const loaded = JSON.parse(await api.ensureModel('@MODEL@', '{}', 'bench', 'TinyChat'));
  if (!loaded.ok) throw new Error('the WebLLM model did not load: ' + loaded.kind);
  const out = [];
  for (const prompt of prompts) {
    const body = {messages: [{role: 'user', content: prompt}], stream: true,
      stream_options: {include_usage: true}, temperature: 0};
    let first = null, tokens = 0, text = '';
    const t0 = performance.now();
    const id = api.startChat('@MODEL@', JSON.stringify(body));
    for (;;) {
      const batch = JSON.parse(await api.nextChunks(id));
      for (const chunk of batch.chunks) {
        const delta = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
        if (delta && delta.content) {
          if (first === null) first = performance.now();
          text += delta.content;
        }
        if (chunk.usage) tokens = chunk.usage.completion_tokens;
      }
      if (batch.done) break;
    }
    out.push({first: first - t0, total: performance.now() - t0, tokens, text});
  }
  return out;
}
""".replace("@MODEL@", WEBLLM_MODEL).replace("@WEBLLM@", engine_host_js("webllm"))

WLLAMA_DIRECT = """
async (prompts) => {
  if (!window.__wllama) {
    const { Wllama, wasmPaths } = await import('./vendor/wllama/wllama.js');
    const quiet = { debug() {}, log() {}, warn() {}, error() {} };
    const w = new Wllama(wasmPaths, { logger: quiet, suppressNativeLog: true });
    await w.loadModelFromUrl(new URL('models/tinychat/tiny-chat-q8_0.gguf', location.href).href,
      { n_ctx: 512, n_threads: 1, n_gpu_layers: 0, useCache: false });
    window.__wllama = w;
  }
  const w = window.__wllama;
  const out = [];
  for (const prompt of prompts) {
    const body = { model: 'tinychat-q8_0', messages: [{ role: 'user', content: prompt }],
      stream: true, stream_options: { include_usage: true }, temperature: 0, top_k: 1 };
    let first = null, tokens = 0, text = '';
    const t0 = performance.now();
    for await (const chunk of await w.createChatCompletion(body)) {
      const delta = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
      if (delta && delta.content) {
        if (first === null) first = performance.now();
        text += delta.content;
      }
      if (chunk.usage) tokens = chunk.usage.completion_tokens;
    }
    out.push({ first: first - t0, total: performance.now() - t0, tokens, text });
  }
  return out;
}
"""

ADAPTER = """
async () => {
  if (!navigator.gpu) return null;
  const a = await navigator.gpu.requestAdapter();
  if (!a) return null;
  const i = a.info || {};
  return {vendor: i.vendor, architecture: i.architecture, description: i.description,
          fallback: i.isFallbackAdapter === true};
}
"""


def summary(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Median/p90 first text (ms), tokens, tokens/s, tokens/s after the first text."""
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
        "decode_tps": after_first / decode_seconds if decode_seconds > 0 else 0.0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds over the prompts")
    parser.add_argument(
        "--quick", action="store_true", help="one round of one prompt: checks that it works"
    )
    args = parser.parse_args()
    rounds = 1 if args.quick else args.rounds
    # Each request on the software adapter takes seconds; a quick run only proves the paths work.
    prompts = PROMPTS[:1] if args.quick else PROMPTS

    from playwright.sync_api import sync_playwright

    if dist_is_stale():
        build()
    rows: dict[str, list[dict[str, Any]]] = {
        "onnx-direct": [],
        "onnx-shell": [],
        "webllm-direct": [],
        "webllm-shell": [],
        "wllama": [],
    }
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "bench.html").write_text(NAPPLET, encoding="utf-8")
        server = make_server(DIST, quiet=True, overlays={"/_bench/": Path(tmp)})
        threading.Thread(target=server.serve_forever, daemon=True).start()
        base = f"http://127.0.0.1:{server.server_address[1]}/"
        try:
            with sync_playwright() as pw:
                browser = pw.chromium.launch(**launch_options(webgpu=True))
                page = browser.new_page()
                page.set_default_timeout(300_000)
                napplet = quote(f"{base}_bench/bench.html", safe="")
                page.goto(f"{base}index.html?napplet={napplet}")
                page.wait_for_function("document.body.dataset.boot === 'ready'")
                adapter = page.evaluate(ADAPTER)
                if not adapter:
                    raise SystemExit("no WebGPU adapter in this Chromium")
                # a link opens the napplet with LLM access off: turn it on
                page.wait_for_function(
                    "() => { const f = document.querySelector('iframe.napplet-frame');"
                    " return f && f.srcdoc.length > 0; }"
                )
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
                for key, connection in CONNECTIONS.items():
                    frame.evaluate("(k) => { window.selectModel(k); }", key)
                    page.click(
                        f".chooser-dialog button.candidate[data-candidate-id='{connection}']"
                    )
                    frame.wait_for_function("(k) => window.selected[k]", arg=key, polling=20)
                # Warm-up of every prompt on every path, with a standing grant
                # per connection so no consent dialog is timed.
                for key in CONNECTIONS:
                    frame.evaluate(
                        "([p, k]) => { window.warm = window.runShell(p, k); }", [prompts, key]
                    )
                    page.check(".consent-dialog input.remember")
                    page.click(".consent-dialog button.allow")
                    frame.evaluate("() => window.warm")
                page.evaluate(ONNX_DIRECT, prompts)
                page.evaluate(WEBLLM_DIRECT, prompts)
                page.evaluate(WLLAMA_DIRECT, prompts)
                shell = "([p, k]) => window.runShell(p, k)"
                for _ in range(rounds):
                    for prompt in prompts:
                        rows["onnx-direct"] += page.evaluate(ONNX_DIRECT, [prompt])
                        rows["onnx-shell"] += frame.evaluate(shell, [[prompt], "onnx"])
                        rows["webllm-direct"] += page.evaluate(WEBLLM_DIRECT, [prompt])
                        rows["webllm-shell"] += frame.evaluate(shell, [[prompt], "webllm"])
                        rows["wllama"] += page.evaluate(WLLAMA_DIRECT, [prompt])
                browser.close()
        finally:
            server.shutdown()
            server.server_close()

    stats = {name: summary(r) for name, r in rows.items()}
    differ = sum(
        1 for answers in zip(*rows.values(), strict=True) if len({a["text"] for a in answers}) != 1
    )
    fallback = " (fallback adapter)" if adapter.get("fallback") else ""
    print(
        f"TinyChat, greedy; WebGPU adapter: {adapter.get('vendor')} "
        f"{adapter.get('architecture') or adapter.get('description') or ''}{fallback}; "
        f"{rounds} round(s) x {len(prompts)} prompts per path, after a warm-up"
    )
    header = (
        f"{'path':<14} {'runs':>5} {'first text median':>18} {'p90':>10} "
        f"{'tokens':>7} {'tokens/s':>9} {'after 1st':>10}"
    )
    print(header)
    print("-" * len(header))
    for name, s in stats.items():
        print(
            f"{name:<14} {s['runs']:>5} {s['first_median']:>15.1f} ms {s['first_p90']:>7.1f} ms "
            f"{s['tokens']:>7} {s['tps']:>9.1f} {s['decode_tps']:>10.1f}"
        )
    print("-" * len(header))
    for engine in ("onnx", "webllm"):
        shell, direct = stats[f"{engine}-shell"], stats[f"{engine}-direct"]
        print(
            f"{engine} shell/direct tokens/s: {shell['tps'] / direct['tps']:.3f}   "
            f"after the first text: {shell['decode_tps'] / direct['decode_tps']:.3f}   "
            "added to first text (median): "
            f"{shell['first_median'] - direct['first_median']:+.1f} ms"
        )
    onnx, webllm = stats["onnx-direct"], stats["webllm-direct"]
    print(
        f"webllm/onnx direct tokens/s: {webllm['tps'] / onnx['tps']:.2f}x   "
        f"first text (median): {webllm['first_median']:.1f} ms vs {onnx['first_median']:.1f} ms"
    )
    print(f"wllama/onnx-direct tokens/s: {stats['wllama']['tps'] / onnx['tps']:.1f}x")
    print(f"answers that differ between the paths: {differ} of {len(rows['wllama'])}")


if __name__ == "__main__":
    main()
