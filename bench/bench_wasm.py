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
request so that both see the same machine load: the short prompts (answers
of about 10 tokens, where the per-request cost dominates) and the long one,
"Count from 1 to 100." (a 200-token answer, for tokens/s after the first
token).
Printed per path: median and p90 time to the first text token (ms, from the
call to the first text delta/chunk), tokens/s (output tokens over the summed
wall time of the requests), tokens/s after the first token (the remaining
tokens over the time from the first text to the end of the request) and the
shell/direct ratios. Then, in the shell:

- the main thread's longest task (PerformanceObserver `longtask`) while one
  napplet streams the long answer at full engine speed, and the round-trip
  times of a second napplet's `describe` calls meanwhile;
- the main thread's JS heap (after a forced garbage collection, through the
  DevTools protocol) and the wasm memory of the page (Pyodide's) after
  `--generations` / 10 and after `--generations` short generations.

Where a short shell request's time goes: the median of each phase, from
timestamps the benchmark records by wrapping the page's MessagePort and
Worker methods from outside (dist/ has no hook for it): the napplet's call,
the generate envelope reaching the shell, the chat posted to the engine
worker, the worker's first text chunk, the first text delta posted to the
napplet and seen by it, the worker's end, the result posted and the call
resolved.

Finally the targets, side by side. The exit status is 1 when an answer
differs between the two paths (a correctness failure, not a slow run).

Usage: python bench/bench_wasm.py [--runs 20] [--rounds 3] [--long 5]
[--generations 1000] [--quick]
"""

from __future__ import annotations

import argparse
import json
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

LONG_PROMPT = "Count from 1 to 100."
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
    const epoch = performance.timeOrigin;
    out.push({first: first - t0, total: t1 - t0, tokens: result.usage.outputTokens,
              text: result.content.map((p) => p.text || '').join(''),
              at: {call: epoch + t0, firstSeen: epoch + first, done: epoch + t1}});
  }
  return out;
};
// `describe` round trips (ms), one after the other, until `window.stopDescribe`.
window.runDescribe = async () => {
  const times = [];
  window.stopDescribe = false;
  while (!window.stopDescribe) {
    const t0 = performance.now();
    await napplet.llm.describe(window.selected.handle);
    times.push(performance.now() - t0);
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
  return times;
};
</script></body></html>
"""

#: Collects the page's long tasks (> 50 ms on the main thread) from the start.
LONGTASK_PROBE = """
window.__longtasks = [];
try {
  new PerformanceObserver((list) => {
    for (const e of list.getEntries()) window.__longtasks.push(e.duration);
  }).observe({ type: 'longtask', buffered: true });
} catch (e) { /* no longtask support: reported as none */ }
"""
#: Timestamps (ms since the epoch, so the napplet frame's clock compares) of
#: what the shell page sends and receives for one request, recorded by
#: wrapping the page's own MessagePort and Worker methods from outside (the
#: benchmark adds this script; dist/ has no hook): the generate envelope
#: arriving from the napplet, the chat posted to the engine worker, the
#: worker's first text chunk and its end, the first text delta and the result
#: posted to the napplet. Only the top page records; `__phases.take()`
#: returns and clears the events.
PHASE_PROBE = """
(() => {
  if (window !== window.top) return;
  const events = [];
  const now = () => performance.timeOrigin + performance.now();
  window.__phases = { take: () => events.splice(0, events.length) };
  const portPost = MessagePort.prototype.postMessage;
  MessagePort.prototype.postMessage = function (data, ...rest) {
    if (data && typeof data === 'object') {
      if (data.type === 'llm.delta' && data.event === 'delta') events.push(['delta', now()]);
      else if (data.type === 'llm.generate.result') events.push(['result', now()]);
    }
    return portPost.call(this, data, ...rest);
  };
  const wrapSetter = (proto, note) => {
    const d = Object.getOwnPropertyDescriptor(proto, 'onmessage');
    Object.defineProperty(proto, 'onmessage', {
      configurable: true, enumerable: d.enumerable, get() { return d.get.call(this); },
      set(fn) {
        d.set.call(this, typeof fn !== 'function' ? fn
          : function (event) { note(event); return fn.call(this, event); });
      },
    });
  };
  wrapSetter(MessagePort.prototype, (event) => {
    const d = event.data;
    if (d && typeof d === 'object' && d.type === 'llm.generate') events.push(['received', now()]);
  });
  const workerPost = Worker.prototype.postMessage;
  Worker.prototype.postMessage = function (data, ...rest) {
    if (data && typeof data === 'object' && data.op === 'chat'
        && String(data.id).startsWith('wasm-')) events.push(['chat', now()]);
    return workerPost.call(this, data, ...rest);
  };
  wrapSetter(Worker.prototype, (event) => {
    const d = event.data;
    if (!d || typeof d !== 'object' || !String(d.id).startsWith('wasm-')) return;
    if (d.op === 'end') events.push(['end', now()]);
    else if (d.op === 'chunks' && d.chunks.some((c) => c.includes('"content":"') &&
             !c.includes('"content":""'))) events.push(['chunk', now()]);
  });
})();
"""

#: The phases of one shell request: (label, from event, to event).
PHASES = [
    ("napplet call -> shell receives the generate envelope", "call", "received"),
    ("shell receives -> chat posted to the engine worker", "received", "chat"),
    ("chat posted -> worker's first text chunk on the page", "chat", "chunk"),
    ("first text chunk -> first text delta posted to the napplet", "chunk", "delta"),
    ("first text delta posted -> napplet sees it", "delta", "firstSeen"),
    ("worker's end on the page -> result posted to the napplet", "end", "result"),
    ("result posted -> napplet's generate resolves", "result", "done"),
    ("whole request, as the napplet sees it", "call", "done"),
]


def phase_row(row: dict[str, Any], events: list[list[Any]]) -> dict[str, float]:
    """The first time of each event of one request (`row["at"]` plus the page's events)."""
    at: dict[str, float] = dict(row["at"])
    for name, time in events:
        at.setdefault(name, time)
    return at


#: Records every WebAssembly.Memory of the page (Pyodide's), created or exported.
WASM_PROBE = """
(() => {
  const memories = new Set();
  const note = (instance) => {
    try {
      for (const v of Object.values(instance.exports)) {
        if (v instanceof WebAssembly.Memory) memories.add(v);
      }
    } catch (e) { /* not an instance */ }
  };
  const wrap = (fn) => async function (...args) {
    const result = await fn.apply(this, args);
    note(result instanceof WebAssembly.Instance ? result : result.instance);
    return result;
  };
  WebAssembly.instantiate = wrap(WebAssembly.instantiate);
  WebAssembly.instantiateStreaming = wrap(WebAssembly.instantiateStreaming);
  WebAssembly.Memory = new Proxy(WebAssembly.Memory, {
    construct(target, args) { const m = new target(...args); memories.add(m); return m; },
  });
  window.__wasmBytes = () => [...memories].reduce((n, m) => n + m.buffer.byteLength, 0);
})();
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


#: The engine's own worker (dist/engines/wllama-worker.js, which the shell
#: uses) driven directly from the page: the shell's engine without Python,
#: the envelopes or the napplet.
WORKER = """
async ([prompts, threads]) => {
  if (!window.__engine) {
    const worker = new Worker('./engines/wllama-worker.js', { type: 'module' });
    window.__engine = { worker, waiters: new Map() };
    worker.onmessage = ({ data }) => {
      const waiter = window.__engine.waiters.get(data.id || data.key);
      if (waiter) waiter(data);
    };
    const url = new URL('models/tinychat/tiny-chat-q8_0.gguf', location.href).href;
    const info = await new Promise((resolve) => {
      window.__engine.waiters.set('bench', (d) => { if (d.op === 'loaded') resolve(d.info); });
      worker.postMessage({ op: 'load', key: 'bench', url,
        params: { n_ctx: 512, n_threads: threads, n_gpu_layers: 0 } });
    });
    if (!info.ok) throw new Error('load failed');
  }
  const { worker, waiters } = window.__engine;
  const out = [];
  let n = 0;
  for (const prompt of prompts) {
    const body = { model: 'tinychat-q8_0', messages: [{ role: 'user', content: prompt }],
      stream: true, stream_options: { include_usage: true }, temperature: 0, top_k: 1 };
    const id = `b${++n}`;
    let first = null;
    let tokens = 0;
    let text = '';
    const t0 = performance.now();
    await new Promise((resolve) => {
      waiters.set(id, (d) => {
        for (const raw of d.chunks || []) {
          const chunk = JSON.parse(raw);
          const delta = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
          if (delta && delta.content) {
            if (first === null) first = performance.now();
            text += delta.content;
          }
          if (chunk.usage) tokens = chunk.usage.completion_tokens;
        }
        if (d.op === 'end') { waiters.delete(id); resolve(); }
      });
      worker.postMessage({ op: 'chat', id, key: 'bench', body });
    });
    const t1 = performance.now();
    out.push({ first: first - t0, total: t1 - t0, tokens, text });
  }
  return out;
}
"""


PATHS = {"direct": DIRECT, "worker": WORKER, "shell": ""}


def serve(pages: Path) -> tuple[Any, str]:
    """dist/ on a free port; /_bench/ maps to `pages`."""
    server = make_server(DIST, quiet=True, overlays={"/_bench/": pages})
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


def select(page: Any, frame: Any) -> None:
    """Let napplet `frame` select TinyChat through the chooser."""
    frame.wait_for_function("() => typeof window.runShell === 'function'", polling=20)
    frame.evaluate("() => { window.selectModel(); }")
    page.click(".chooser-dialog button.candidate[data-candidate-id='builtin-tinychat']")
    frame.wait_for_function("() => window.selected !== null", polling=20)


def frame_of(page: Any, index: int) -> Any:
    """The content frame of the `index`-th napplet frame, once loaded with LLM access.

    A napplet opened by a link or a URL starts with LLM access off: its
    tab's switch is turned on first (the shell then builds a fresh frame).
    """
    ready = (
        "(n) => { const f = document.querySelectorAll('iframe.napplet-frame')[n];"
        " return f && f.srcdoc.length > 0; }"
    )
    page.wait_for_function(ready, arg=index)
    toggle = page.query_selector_all(".llm-toggle")[index]
    if not toggle.is_checked():
        old = page.query_selector_all("iframe.napplet-frame")[index]
        page.evaluate("(t) => t.click()", toggle)
        page.wait_for_function(
            "([n, old]) => { const f = document.querySelectorAll('iframe.napplet-frame')[n];"
            " return f && f !== old && f.srcdoc.length > 0; }",
            arg=[index, old],
        )
    frame = page.query_selector_all("iframe.napplet-frame")[index].content_frame()
    frame.wait_for_load_state("load")
    return frame


def memory(page: Any, cdp: Any) -> tuple[float, float]:
    """(JS heap used, wasm memory) of the page's main thread in MB, after a GC."""
    cdp.send("HeapProfiler.collectGarbage")
    heap = cdp.send("Runtime.getHeapUsage")["usedSize"]
    wasm = page.evaluate("window.__wasmBytes()")
    return heap / 1e6, wasm / 1e6


def pct(after: float, before: float) -> str:
    return f"{(after - before) / before * 100:+.1f} %" if before else "n/a"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=20, help="short requests per path and round")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds")
    parser.add_argument("--long", type=int, default=5, help="long requests per path and round")
    parser.add_argument(
        "--generations", type=int, default=1000, help="shell generations of the memory check"
    )
    parser.add_argument(
        "--quick", action="store_true", help="a short run that checks the benchmark works"
    )
    args = parser.parse_args()
    if args.quick:
        args.runs, args.rounds, args.long, args.generations = 2, 1, 1, 10

    from playwright.sync_api import sync_playwright

    if dist_is_stale():
        build()
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(args.runs)]
    #: path -> short rows, long rows
    rows: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]]]] = {
        name: ([], []) for name in PATHS
    }
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "bench.html").write_text(NAPPLET, encoding="utf-8")
        server, base = serve(Path(tmp))
        try:
            with sync_playwright() as pw:
                browser = pw.chromium.launch(**launch_options())
                page = browser.new_page()
                page.add_init_script(LONGTASK_PROBE)
                page.add_init_script(WASM_PROBE)
                page.add_init_script(PHASE_PROBE)
                cdp = page.context.new_cdp_session(page)
                page.set_default_timeout(120_000)
                napplet_url = f"{base}_bench/bench.html"
                page.goto(f"{base}index.html?napplet={quote(napplet_url, safe='')}")
                page.wait_for_function("document.body.dataset.boot === 'ready'")
                frame = frame_of(page, 0)
                select(page, frame)
                # Warm-up with a standing grant, so no consent dialog is timed.
                frame.evaluate("() => { window.warm = window.runShell(['Hello!']); }")
                page.check(".consent-dialog input.remember")
                page.click(".consent-dialog button.allow")
                frame.evaluate("() => window.warm")
                env = json.loads(
                    page.evaluate(f"{engine_host_js('wasm')}.then((host) => host.report())")
                )
                isolated = env["crossOriginIsolated"]
                cores = int(env["hardwareConcurrency"])
                threads = 1 if not isolated else max(1, min(8, cores // 2))
                page.evaluate(DIRECT, [["Hello!"], threads])  # load + warm-up
                page.evaluate(WORKER, [["Hello!"], threads])

                phases: list[dict[str, float]] = []

                def run(path: str, prompt: str) -> list[dict[str, Any]]:
                    if path == "shell":
                        page.evaluate("() => window.__phases.take()")
                        result: list[dict[str, Any]] = frame.evaluate(
                            "(p) => window.runShell(p)", [prompt]
                        )
                        if prompt != LONG_PROMPT:
                            events = page.evaluate("() => window.__phases.take()")
                            phases.append(phase_row(result[0], events))
                        return result
                    return list(page.evaluate(PATHS[path], [[prompt], threads]))

                # Request by request, alternating, so every path sees the same
                # machine load.
                for _ in range(args.rounds):
                    for prompt in prompts:
                        for path in PATHS:
                            rows[path][0].extend(run(path, prompt))
                    for _ in range(args.long):
                        for path in PATHS:
                            rows[path][1].extend(run(path, LONG_PROMPT))

                # A second napplet describes while the first streams the long answer.
                page.fill("#napplet-url", napplet_url)
                page.click("#napplet-url-open")
                second = frame_of(page, 1)
                select(page, second)
                page.evaluate("() => { window.__longtasks.length = 0; }")
                second.evaluate("() => { window.describing = window.runDescribe(); }")
                busy = frame.evaluate(
                    "(p) => window.runShell(p)", [LONG_PROMPT] * max(1, args.long)
                )
                second.evaluate("() => { window.stopDescribe = true; }")
                describe_ms = second.evaluate("() => window.describing")
                longtasks = page.evaluate("() => window.__longtasks.slice()")

                # Memory after n/10 and after n generations.
                first_n = max(1, args.generations // 10)
                frame.evaluate("(p) => window.runShell(p)", ["Hello!"] * first_n)
                mem_before = memory(page, cdp)
                rest = args.generations - first_n
                while rest > 0:
                    step = min(rest, 100)
                    frame.evaluate("(p) => window.runShell(p)", ["Hello!"] * step)
                    rest -= step
                mem_after = memory(page, cdp)
                browser.close()
        finally:
            server.shutdown()
            server.server_close()

    shell_short, shell_long = rows["shell"]
    mismatched = 0
    for path in ("direct", "worker"):
        short, long = rows[path]
        pairs = zip(shell_short + shell_long, short + long, strict=True)
        mismatched += sum(1 for s, d in pairs if s["text"] != d["text"])
    long_tokens = sorted({r["tokens"] for r in rows["direct"][1]})
    print(
        f"TinyChat q8_0 on wllama, {threads} thread(s), cross-origin isolated: {isolated}, "
        f"{cores} logical cores; {args.rounds} round(s) x ({args.runs} short + {args.long} "
        f"long) requests per path, alternating; long answer: {long_tokens} tokens"
    )
    print(
        "paths: direct = wllama driven from the page's main thread (its documented use); "
        "worker = the shell's engine worker driven directly (no Python, no napplet); "
        "shell = a napplet's generate through the runtime"
    )
    header = (
        f"{'path':<14} {'runs':>5} {'first token median':>19} {'p90':>9} "
        f"{'tokens':>7} {'tokens/s':>9} {'after 1st':>10}"
    )
    print(header)
    print("-" * len(header))
    stats = {(p, k): summary(rows[p][i]) for p in PATHS for i, k in enumerate(("short", "long"))}
    for kind in ("short", "long"):
        for path in PATHS:
            s = stats[path, kind]
            print(
                f"{path + ' ' + kind:<14} {s['runs']:>5} {s['first_median']:>16.2f} ms "
                f"{s['first_p90']:>6.2f} ms {s['tokens']:>7} {s['tps']:>9.1f} "
                f"{s['decode_tps']:>10.1f}"
            )
    print("-" * len(header))
    for base in ("direct", "worker"):
        print(
            f"shell/{base}: tokens/s short "
            f"{stats['shell', 'short']['tps'] / stats[base, 'short']['tps']:.3f}, "
            f"after the first token (long) "
            f"{stats['shell', 'long']['decode_tps'] / stats[base, 'long']['decode_tps']:.3f}, "
            f"added to the first token (median, short) "
            f"{stats['shell', 'short']['first_median'] - stats[base, 'short']['first_median']:+.2f}"
            " ms"
        )
    # The targets take the lower ratio (the larger latency) of the two bases.
    after_first = min(
        stats["shell", "long"]["decode_tps"] / stats[b, "long"]["decode_tps"]
        for b in ("direct", "worker")
    )
    whole = min(
        stats["shell", "short"]["tps"] / stats[b, "short"]["tps"] for b in ("direct", "worker")
    )
    added = max(
        stats["shell", "short"]["first_median"] - stats[b, "short"]["first_median"]
        for b in ("direct", "worker")
    )
    print(f"\nwhere a short shell request's time goes (median of {len(phases)}, ms)")
    for label, start, stop in PHASES:
        spans = [p[stop] - p[start] for p in phases if start in p and stop in p]
        value = f"{statistics.median(spans):8.2f}" if spans else "     n/a"
        print(f"  {label:<62} {value}")
    longest = max(longtasks, default=0.0)
    describe_max = max(describe_ms, default=float("nan"))
    describe_med = statistics.median(describe_ms) if describe_ms else float("nan")
    heap_pct = (mem_after[0] - mem_before[0]) / mem_before[0] * 100
    wasm_pct = (mem_after[1] - mem_before[1]) / mem_before[1] * 100 if mem_before[1] else 0.0
    print(
        f"\nmain thread while one napplet streams {len(busy)} long answer(s): "
        f"{len(longtasks)} long task(s), longest {longest:.0f} ms; second napplet's describe: "
        f"{len(describe_ms)} calls, median {describe_med:.1f} ms, max {describe_max:.1f} ms"
    )
    print(
        f"memory of the page's main thread after {first_n} and {args.generations} shell "
        f"generations: JS heap {mem_before[0]:.1f} -> {mem_after[0]:.1f} MB "
        f"({pct(mem_after[0], mem_before[0])}), wasm {mem_before[1]:.1f} -> "
        f"{mem_after[1]:.1f} MB ({pct(mem_after[1], mem_before[1])})"
    )
    print("\ntargets (shell vs the slower-to-beat of direct and worker, same page, same run)")
    targets = [
        ("tokens/s after the first token, long answer", f"{after_first:.3f}", ">= 0.98",
         after_first >= 0.98),
        ("whole-request tokens/s, short prompts", f"{whole:.3f}", ">= 0.95", whole >= 0.95),
        ("added first-token latency, median", f"{added:+.2f} ms", "< 5 ms", added < 5),
        ("longest main-thread task while streaming", f"{longest:.0f} ms", "<= 50 ms",
         longest <= 50),
        ("second napplet's describe, max", f"{describe_max:.1f} ms", "<= 20 ms",
         describe_max <= 20),
        (f"JS heap, {args.generations} vs {first_n} generations", f"{heap_pct:+.1f} %",
         "within 10 %", abs(heap_pct) <= 10),
        (f"wasm memory, {args.generations} vs {first_n} generations", f"{wasm_pct:+.1f} %",
         "within 10 %", abs(wasm_pct) <= 10),
    ]  # fmt: skip
    for label, value, goal, met in targets:
        print(f"  {label:<46} {value:>10}   goal {goal:<12} {'met' if met else 'MISSED'}")
    total = 2 * (len(shell_short) + len(shell_long))
    print(f"answers that differ between the paths: {mismatched} of {total}")
    if mismatched:
        sys.exit(1)


if __name__ == "__main__":
    main()
