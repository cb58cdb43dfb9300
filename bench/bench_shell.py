"""Benchmarks of the napllm shell: boot, bytes, per-generate overhead, relay rate, concurrency.

Usage: ``python bench/bench_shell.py [--runs 5] [--only a,b,c,d,e] [--quick]``
(``--quick``: one run of each part at a small size, without the service
worker's precache, to check that it works;
the exit status is 1 when text was lost or a generation failed). Builds dist/
when it is missing, serves it on 127.0.0.1 with the shell's server (COOP/COEP)
and drives Debian's Chromium; nothing leaves the machine. Prints one table
per benchmark:

a. time to "shell ready" (the runtime attached, ``body[data-boot=ready]``),
   cold (a fresh profile) and warm (a reload in the same profile), against a
   bare page that loads Pyodide + pydantic and validates one model, in the
   same run, alternating (goal: shell <= 1.3x bare). Like for like: both
   pages run with service workers blocked, so both reload from the HTTP
   cache; one more row shows the shell's reload from its service-worker
   precache (after waiting for it), which the bare page has no equivalent of;
b. bytes of a first visit: until the shell is ready, and until the service
   worker has precached everything for offline use; raw and gzip-6 (goal:
   <= 9 MB compressed for the boot);
c. shell overhead per ``generate`` under CPython: the shell (envelope
   parsing, handles, consent port, translation, delta stream, terminal) with
   a zero-latency fixture provider vs iterating the provider directly;
d. delta relay rate: one generation of many small text deltas from the
   fixture provider to one probe napplet in the real page; the napplet's
   text is compared with what was sent (nothing lost), the rate is provider
   deltas per second end to end (goal >= 5,000/s);
e. 50 concurrent generations spread over 10 napplets (50 deltas each):
   wall time until every napplet has every terminal result;
f. the round trip of ``llm.describe`` on each raw transport, measured in
   the napplet: posted to ``window.parent`` (the NIP-5D web projection's
   transport, held by the shell until the napplet's prelude answers a ping)
   and posted to the napplet's own window (forwarded by the prelude over its
   port). The probe napplet of (d) and (e) posts to ``window.parent``;
g. a large envelope (64 MiB of text; ``--quick``: 16 MiB) on each raw
   transport, side by side: the longest task it holds the shell's main
   thread for (the shell page's long tasks while it is handled) and its
   round trip until the napplet has the answer (``quota-exceeded``: it is
   over the wire bound). A fresh napplet per envelope: one such envelope
   spends a frame's traffic budget for the window
   (docs/security.md, "Memory and work per napplet"). Goal for (f) and (g):
   the standard wire (``window.parent``) within 10 % of the own-window
   channel.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gzip
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from playwright.sync_api import sync_playwright

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [
    str(ROOT / "runtime"),
    str(ROOT / "tests"),
    str(ROOT / "tests" / "unit"),
    str(ROOT / "tests" / "browser"),
    str(ROOT / "tools"),  # the build's steps
]
from buildsys.dist import build, build_test_dist, dist_is_stale  # noqa: E402
from buildsys.paths import DIST  # noqa: E402

from napllm.devtools.headless import DistRequestHandler, DistServer, launch_options  # noqa: E402

BENCH = "_bench"
TEST = "_test"
TIMEOUT_MS = 180_000

#: The bare page of benchmark (a): Pyodide + pydantic, one model validated.
BARE_PAGE = """<!doctype html><meta charset="utf-8"><title>bare</title>
<script type="module">
import { loadPyodide } from '../pyodide/pyodide.mjs';
const py = await loadPyodide({ indexURL: new URL('../pyodide/', location.href).href });
await py.loadPackage('pydantic', { messageCallback: () => {} });
await py.runPythonAsync(`
from pydantic import BaseModel
class M(BaseModel):
    a: int
    b: list[str]
M.model_validate({"a": 1, "b": ["x"]})
`);
document.body.dataset.boot = 'ready';
</script><body></body>"""

#: Records when body[data-boot] becomes "ready" (before any page script runs).
READY_PROBE = """
new MutationObserver((_, obs) => {
  if (document.body && document.body.dataset.boot === 'ready' && !window.__readyAt) {
    window.__readyAt = performance.now();
    obs.disconnect();
  }
}).observe(document, { subtree: true, attributes: true, attributeFilter: ['data-boot'] });
"""


def stats(values: list[float]) -> str:
    """Median with the range, e.g. ``2900 (2600-3500)``."""
    return f"{statistics.median(values):.0f} ({min(values):.0f}-{max(values):.0f})"


class Server:
    """A build folder (dist/ by default) on 127.0.0.1 with overlays; records every file it sends."""

    def __init__(self, overlays: dict[str, Path], directory: Path | None = None) -> None:
        self.sent: list[Path] = []
        sent = self.sent

        def log_request(handler: Any, code: Any = "-", size: Any = "-") -> None:
            if str(code) == "200":
                path = Path(handler.translate_path(handler.path.split("?")[0]))
                if path.is_dir():
                    path = path / "index.html"
                sent.append(path)

        extra = {prefix: str(folder) for prefix, folder in overlays.items()}
        handler = type(
            "Handler",
            (DistRequestHandler,),
            {"quiet": True, "overlays": extra, "log_request": log_request},
        )
        self.httpd = DistServer(
            ("127.0.0.1", 0), functools.partial(handler, directory=str(directory or DIST))
        )
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def ready_ms(page: Any) -> float:
    page.wait_for_function("() => window.__readyAt !== undefined", timeout=TIMEOUT_MS)
    return float(page.evaluate("window.__readyAt"))


def boot_times(
    browser_type: Any, url: str, runs: int, *, service_worker: bool = False
) -> tuple[list[float], list[float]]:
    """Cold (fresh profile) and warm (reload, same profile) ms to ready, `runs` each.

    Without `service_worker` the context blocks service workers, so a reload
    comes from the HTTP cache; with it, the reload waits for the shell's
    offline precache first and then comes from the service worker.
    """
    cold: list[float] = []
    warm: list[float] = []
    for _ in range(runs):
        profile = tempfile.mkdtemp(prefix="napllm-bench-profile-")
        context = browser_type.launch_persistent_context(
            profile,
            service_workers="allow" if service_worker else "block",
            **launch_options(),
        )
        try:
            context.add_init_script(READY_PROBE)
            page = context.new_page()
            page.goto(url)
            cold.append(ready_ms(page))
            if service_worker:  # let the service worker finish precaching
                page.wait_for_function(
                    "() => document.body.dataset.offline === 'ready'", timeout=TIMEOUT_MS
                )
            page.reload()
            warm.append(ready_ms(page))
        finally:
            context.close()
            shutil.rmtree(profile, ignore_errors=True)
    return cold, warm


def bench_boot(browser_type: Any, server: Server, runs: int, *, precache: bool = True) -> None:
    # Alternate the pages so a change in machine load affects them alike.
    shell_cold: list[float] = []
    shell_warm: list[float] = []
    bare_cold: list[float] = []
    bare_warm: list[float] = []
    sw_warm: list[float] = []
    for _ in range(runs):
        cold, warm = boot_times(browser_type, server.url + f"{BENCH}/bare.html", 1)
        bare_cold += cold
        bare_warm += warm
        cold, warm = boot_times(browser_type, server.url + "index.html", 1)
        shell_cold += cold
        shell_warm += warm
        if precache:
            sw_warm += boot_times(browser_type, server.url + "index.html", 1, service_worker=True)[
                1
            ]
    print(f"\n(a) time to ready, ms from navigation start, median (min-max) of {runs}")
    print("    service workers blocked: both pages load from the server, then the HTTP cache")
    print(f"{'page':<34}{'cold':>22}{'warm (reload)':>22}")
    print(f"{'bare Pyodide + pydantic':<34}{stats(bare_cold):>22}{stats(bare_warm):>22}")
    print(f"{'napllm shell (runtime attached)':<34}{stats(shell_cold):>22}{stats(shell_warm):>22}")
    ratio_cold = statistics.median(shell_cold) / statistics.median(bare_cold)
    ratio_warm = statistics.median(shell_warm) / statistics.median(bare_warm)
    print(f"{'shell / bare':<34}{ratio_cold:>21.2f}x{ratio_warm:>21.2f}x   (goal <= 1.3x)")
    if sw_warm:
        print(f"{'shell, reload from its precache':<34}{'':>22}{stats(sw_warm):>22}")


def sizes(paths: list[Path]) -> tuple[int, int]:
    raw = sum(p.stat().st_size for p in paths)
    packed = sum(len(gzip.compress(p.read_bytes(), 6)) for p in paths)
    return raw, packed


def first_visit(browser_type: Any, server: Server, offline: bool) -> list[Path]:
    """Files sent for one first visit: until ready, or (with the service worker)
    until the offline precache is complete."""
    profile = tempfile.mkdtemp(prefix="napllm-bench-profile-")
    context = browser_type.launch_persistent_context(
        profile,
        service_workers="allow" if offline else "block",
        **launch_options(),
    )
    try:
        context.add_init_script(READY_PROBE)
        page = context.new_page()
        server.sent.clear()
        page.goto(server.url + "index.html")
        ready_ms(page)
        if offline:
            page.wait_for_function(
                "() => document.body.dataset.offline === 'ready'", timeout=TIMEOUT_MS
            )
        else:
            page.wait_for_timeout(1000)  # late requests of the boot
        return list(server.sent)
    finally:
        context.close()
        shutil.rmtree(profile, ignore_errors=True)


def bench_bytes(browser_type: Any, server: Server, *, precache: bool = True) -> None:
    boot = first_visit(browser_type, server, offline=False)
    everything = first_visit(browser_type, server, offline=True) if precache else []
    print("\n(b) bytes of a first visit (files sent by the server; gzip level 6)")
    print(f"{'visit':<52}{'files':>7}{'raw MB':>10}{'gzip MB':>10}")
    for label, paths in (
        ("boot only, until the shell is ready (no worker)", boot),
        ("boot + offline precache (service worker)", everything),
    ):
        if not paths:
            continue
        raw, packed = sizes(paths)
        print(f"{label:<52}{len(paths):>7}{raw / 1e6:>10.2f}{packed / 1e6:>10.2f}")
    print("goal: <= 9 MB compressed for the boot")
    print("largest files of the boot:")
    for path in sorted(set(boot), key=lambda p: -p.stat().st_size)[:8]:
        raw, packed = sizes([path])
        rel = path.relative_to(ROOT / "dist") if path.is_relative_to(ROOT / "dist") else path
        print(f"  {rel!s:<50}{'':>7}{raw / 1e6:>10.2f}{packed / 1e6:>10.2f}")


def bench_overhead(count: int) -> None:
    from harness import Harness, generate, user

    from napllm.lmsp import LmspRequest
    from napllm.providers.fixture import FixtureProvider, text_script

    async def through_shell() -> float:
        h = Harness()
        fx = h.connect()
        fx.default = lambda request: text_script(["Hello", "!"])
        ep = h.endpoint()
        handle = await h.select(ep)
        for i in range(50):  # warm-up
            h.send(ep, generate(f"w{i}", handle))
        await h.settle()
        started = time.perf_counter()
        for i in range(count):
            h.send(ep, generate(f"g{i}", handle, [user("Hi")]))
            await h.settle()
        elapsed = time.perf_counter() - started
        assert len(h.results(ep)) == count + 51
        return elapsed / count

    async def direct() -> float:
        provider = FixtureProvider(default=lambda request: text_script(["Hello", "!"]))
        request = LmspRequest.model_validate(
            {
                "model": "fixture-model",
                "input": [
                    {
                        "type": "message",
                        "role": "user",
                        "content": [{"type": "input_text", "text": "Hi"}],
                    }
                ],
            }
        )
        started = time.perf_counter()
        for _ in range(count):
            async for _event in provider.respond(request):
                pass
        return (time.perf_counter() - started) / count

    shell_s = asyncio.run(through_shell())
    direct_s = asyncio.run(direct())
    print(f"\n(c) per-generate cost under CPython, {count} sequential generations (µs each)")
    print(f"{'path':<52}{'µs':>10}")
    print(f"{'provider called directly (LMSP events iterated)':<52}{direct_s * 1e6:>10.0f}")
    print(f"{'through the shell (envelope in -> result out)':<52}{shell_s * 1e6:>10.0f}")
    print(f"{'shell overhead per generate':<52}{(shell_s - direct_s) * 1e6:>10.0f}")


def boot_test_shell(browser: Any, server: Server, pages: Path) -> Any:
    from shellpage import ShellPage, install_napplets

    page = browser.new_context().new_page()
    shell = ShellPage(page, server.url, install_napplets(pages, server.url))
    page.set_default_timeout(TIMEOUT_MS)
    shell.boot()
    page.set_default_timeout(TIMEOUT_MS)
    return shell


def bench_relay(shell: Any, deltas: int) -> bool:
    from shellpage import deltas_of

    from napllm.providers.fixture import completed, text_events

    app = shell.open_napplet()
    handle = app.select("Fixture (all capabilities)")
    # Warm-up, and the standing permission so the timed run has no dialog.
    shell.queue("fx-full", [*text_events(["a", "b"]), completed()])
    app.post({"type": "llm.generate", "id": "warm", "request": _request(handle)})
    shell.remember()
    app.wait_for("warm")
    chunks = [f"{i % 10}" for i in range(deltas)]
    shell.queue("fx-full", [*text_events(chunks), completed()])
    app.evaluate("() => { window.probe.received.length = 0; }")
    started = time.perf_counter()
    app.post({"type": "llm.generate", "id": "relay", "request": _request(handle)})
    app.wait_for("relay", timeout_ms=TIMEOUT_MS)
    elapsed = time.perf_counter() - started
    envelopes = app.envelopes()
    got = deltas_of(envelopes, "relay")
    text = "".join(d.get("text", "") for d in got if d["event"] == "delta")
    intact = text == "".join(chunks)
    app.close()
    print(f"\n(d) delta relay to one napplet, {deltas} provider text deltas of 1 character")
    print(f"{'measure':<48}{'value':>14}")
    print(f"{'wall time, post -> terminal in the napplet (s)':<48}{elapsed:>14.2f}")
    print(f"{'provider deltas relayed per second':<48}{deltas / elapsed:>14.0f}   (goal >= 5,000)")
    print(f"{'llm.delta envelopes received (coalesced)':<48}{len(got):>14}")
    print(f"{'text received == text sent':<48}{'yes' if intact else 'NO':>14}")
    return intact


def _request(handle: str) -> dict[str, Any]:
    return {
        "handle": handle,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
    }


def bench_concurrent(browser: Any, server: Server, pages: Path, napplets: int, total: int) -> bool:
    from shellpage import check_generation

    from napllm.providers.fixture import completed, text_events

    shell = boot_test_shell(browser, server, pages)
    apps = []
    handles = []
    for i in range(napplets):
        app = shell.open_napplet()
        handles.append(app.select("Fixture (all capabilities)", rid=f"s{i}"))
        shell.queue("fx-full", [*text_events(["a"]), completed()])
        app.post({"type": "llm.generate", "id": f"warm{i}", "request": _request(handles[i])})
        if i == 0:
            shell.remember()
        app.wait_for(f"warm{i}")
        apps.append(app)
    for _ in range(total):
        shell.queue("fx-full", [*text_events([f"w{k} " for k in range(50)]), completed()])
    started = time.perf_counter()
    for n in range(total):
        i = n % napplets
        apps[i].post({"type": "llm.generate", "id": f"c{n}", "request": _request(handles[i])})
    for i, app in enumerate(apps):
        ids = [f"c{n}" for n in range(total) if n % napplets == i]
        app.frame.wait_for_function(
            "(ids) => { const done = new Set(window.probe.envelopes()"
            ".filter((e) => e && e.type === 'llm.generate.result').map((e) => e.id));"
            " return ids.every((id) => done.has(id)); }",
            arg=ids,
            timeout=TIMEOUT_MS,
            polling=10,
        )
    elapsed = time.perf_counter() - started
    ok = 0
    for i, app in enumerate(apps):
        envelopes = app.envelopes()
        for n in range(i, total, napplets):
            result = check_generation(envelopes, f"c{n}")
            ok += "result" in result
    shell.page.context.close()
    print(f"\n(e) {total} concurrent generations over {napplets} napplets, 50 deltas each")
    print(f"{'measure':<44}{'value':>12}")
    print(f"{'wall time until every terminal (s)':<44}{elapsed:>12.2f}")
    print(f"{'generations per second':<44}{total / elapsed:>12.1f}")
    print(f"{'completed successfully':<44}{ok:>9}/{total}")
    return ok == total


#: In the probe napplet: `count` describes one after another on `transport`;
#: each round trip in ms (post -> the result's message event).
ROUND_TRIPS = """async ([handle, count, transport]) => {
  probe.useTransport(transport);
  const times = [];
  for (let i = 0; i < count; i++) {
    const id = 'rt-' + transport + '-' + i;
    const start = performance.now();
    await new Promise((resolve) => {
      const on = (e) => {
        if (e.source === window.parent && e.data && e.data.id === id) {
          removeEventListener('message', on);
          resolve();
        }
      };
      addEventListener('message', on);
      probe.post({type: 'llm.describe', id, handle});
    });
    times.push(performance.now() - start);
  }
  probe.useTransport('parent');
  return times;
}"""


def bench_transports(shell: Any, count: int) -> bool:
    app = shell.open_napplet()
    handle = app.select("Fixture (all capabilities)")
    app.evaluate(ROUND_TRIPS, [handle, 10, "parent"])  # warm-up
    rows = []
    for transport, label in (
        ("parent", "window.parent (standard wire)"),
        ("self", "own window (prelude's port)"),
    ):
        times = sorted(app.evaluate(ROUND_TRIPS, [handle, count, transport]))
        rows.append((label, statistics.median(times), times[int(0.9 * (len(times) - 1))]))
    app.close()
    print(f"\n(f) llm.describe round trip in the napplet, {count} in a row per transport")
    print(f"{'transport':<40}{'median ms':>12}{'p90 ms':>10}")
    for label, median, p90 in rows:
        print(f"{label:<40}{median:>12.2f}{p90:>10.2f}")
    ratio = rows[0][1] / max(rows[1][1], 1e-9)
    print(f"{'standard / own window':<40}{ratio:>11.2f}x   (goal <= 1.10x)")
    return len(rows) == 2


#: In the shell page: start collecting the durations of long tasks (ms).
WATCH_TASKS = """() => {
  window.__benchTasks = [];
  window.__benchObserver?.disconnect();
  window.__benchObserver = new PerformanceObserver((list) => {
    for (const entry of list.getEntries()) window.__benchTasks.push(entry.duration);
  });
  window.__benchObserver.observe({ type: "longtask" });
}"""

#: In the probe napplet: post one envelope of `mib` MiB of text on
#: `transport`; the round trip in ms until its result arrives (and its code).
LARGE_ROUND_TRIP = """async ([transport, mib, id]) => {
  probe.useTransport(transport);
  const text = 'x'.repeat(mib * 1024 * 1024);
  const done = new Promise((resolve) => {
    const on = (e) => {
      if (e.source === window.parent && e.data && e.data.id === id) {
        removeEventListener('message', on);
        resolve(e.data.error ? e.data.error.code : 'ok');
      }
    };
    addEventListener('message', on);
  });
  const start = performance.now();
  probe.post({type: 'llm.describe', id, handle: text});
  const code = await done;
  return [performance.now() - start, code];
}"""


def bench_large(shell: Any, mib: int, runs: int) -> bool:
    rows = []
    ok = True
    for transport, label in (
        ("parent", "window.parent (standard wire)"),
        ("self", "own window (prelude's port)"),
    ):
        trips, stalls = [], []
        for run in range(runs):
            app = shell.open_napplet()
            shell.page.evaluate(WATCH_TASKS)
            trip, code = app.evaluate(LARGE_ROUND_TRIP, [transport, mib, f"big-{transport}-{run}"])
            # the long tasks of the answer are reported after it arrived
            shell.page.wait_for_timeout(200)
            tasks = shell.page.evaluate("() => window.__benchTasks")
            ok = ok and code == "quota-exceeded"
            trips.append(trip)
            stalls.append(max(tasks, default=0.0))
            app.close()
        rows.append((label, statistics.median(stalls), max(stalls), statistics.median(trips)))
    print(
        f"\n(g) one envelope of {mib} MiB of text per transport,"
        f" {runs} per transport (a fresh napplet each)"
    )
    print(f"{'transport':<34}{'longest task ms':>17}{'max ms':>9}{'round trip ms':>15}")
    for label, stall, worst, trip in rows:
        print(f"{label:<34}{stall:>17.1f}{worst:>9.1f}{trip:>15.1f}")
    (_, parent_stall, _, parent_trip), (_, own_stall, _, own_trip) = rows
    print(
        f"{'standard / own window':<34}{parent_stall / max(own_stall, 1e-9):>16.2f}x"
        f"{'':>9}{parent_trip / max(own_trip, 1e-9):>14.2f}x   (goal <= 1.10x)"
    )
    return ok


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5, help="boot runs of (a), median")
    ap.add_argument("--only", default="a,b,c,d,e,f,g")
    ap.add_argument("--deltas", type=int, default=20_000)
    ap.add_argument("--quick", action="store_true", help="a short run that checks it works")
    a = ap.parse_args()
    generations, napplets, concurrent, round_trips = 2_000, 10, 50, 200
    large_mib, large_runs = 64, 5
    if a.quick:
        a.runs, a.deltas, generations, napplets, concurrent, round_trips = 1, 2_000, 200, 3, 9, 20
        large_mib, large_runs = 16, 1
    ok = True
    only = set(a.only.split(","))
    if dist_is_stale():
        build()
    if "c" in only:
        bench_overhead(generations)
    pages = Path(tempfile.mkdtemp(prefix="napllm-bench-"))
    (pages / "bare.html").write_text(BARE_PAGE)
    tests = Path(tempfile.mkdtemp(prefix="napllm-bench-test-"))
    server = Server({f"/{BENCH}/": pages, f"/{TEST}/": tests})
    try:
        with sync_playwright() as p:
            if "a" in only:
                bench_boot(p.chromium, server, a.runs, precache=not a.quick)
            if "b" in only:
                bench_bytes(p.chromium, server, precache=not a.quick)
            if only & {"d", "e", "f", "g"}:
                # the relay and concurrency runs drive fixture connections,
                # which only the test build (dist-test/) has
                test_server = Server({f"/{TEST}/": tests}, build_test_dist())
                browser = p.chromium.launch(**launch_options())
                try:
                    if only & {"d", "f", "g"}:
                        # one booted shell for all (a boot is the slow part of a quick run)
                        shell = boot_test_shell(browser, test_server, tests)
                        if "d" in only:
                            ok = bench_relay(shell, a.deltas) and ok
                        if "f" in only:
                            ok = bench_transports(shell, round_trips) and ok
                        if "g" in only:
                            ok = bench_large(shell, large_mib, large_runs) and ok
                        shell.page.context.close()
                    if "e" in only:
                        ok = (
                            bench_concurrent(browser, test_server, tests, napplets, concurrent)
                            and ok
                        )
                finally:
                    browser.close()
                    test_server.close()
    finally:
        server.close()
        shutil.rmtree(pages, ignore_errors=True)
        shutil.rmtree(tests, ignore_errors=True)
    if not ok:
        sys.exit(1)


if __name__ == "__main__":
    main()
