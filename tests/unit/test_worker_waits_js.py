"""Every wait on an engine worker or a model host ends within its bound, run in node.

A worker that stops answering a load (web/engines/worker-bridge.js) must not
leave the engine host's entry pending for good: the load answers `stalled`,
the worker is ended, and the next load starts afresh. The service worker
(web/sw-napllm.js) keeps a model file only when its status, Content-Range,
Content-Length and Content-Encoding together say it is the whole file.
"""

# ruff: noqa: E501  (the JavaScript embedded below keeps its natural line length)

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from nodejs import needs_node, run_module

ROOT = Path(__file__).resolve().parents[2]
BRIDGE = (ROOT / "web" / "engines" / "worker-bridge.js").as_uri()
SERVICE_WORKER = ROOT / "web" / "sw-napllm.js"


@needs_node
def test_a_load_without_a_sign_of_life_ends_stalled_and_the_next_load_is_sent() -> None:
    result = run_module(
        f"globalThis.self = globalThis;\nconst {{ WorkerBridge }} = await import({json.dumps(BRIDGE)});\n"
        """
/** A worker stand-in: records what is posted, answers nothing by itself. */
function target() {
  return { posted: [], terminated: 0, postMessage(m) { this.posted.push(m); }, terminate() { this.terminated += 1; } };
}
const silent = target();
let failures = 0;
const bridge = new WorkerBridge(silent, { loadIdleMs: 50, onFailure: () => { failures += 1; } });
const first = await bridge.load("m", { url: "u" });
// The same key again: a new load is posted (the stalled one was forgotten).
const again = bridge.load("m", { url: "u" });
const posted = silent.posted.filter((m) => m.op === "load").length;
silent.onmessage({ data: { op: "loaded", key: "m", info: { ok: true } } });

// A worker that keeps reporting progress is not ended, however long the load.
const busy = target();
const patient = new WorkerBridge(busy, { loadIdleMs: 60 });
const pending = patient.load("k", {});
for (let i = 0; i < 5; i += 1) {
  await new Promise((r) => setTimeout(r, 30));
  busy.onmessage({ data: { op: "progress", key: "k", fraction: i / 5 } });
}
busy.onmessage({ data: { op: "loaded", key: "k", info: { ok: true, n: 1 } } });
console.log(JSON.stringify({ first, failures, terminated: silent.terminated, posted, again: await again,
  patient: await pending, busyTerminated: busy.terminated }));
"""
    )
    assert result["first"] == {"ok": False, "kind": "stalled"}
    assert result["terminated"] == 1 and result["failures"] == 1
    assert result["posted"] == 2 and result["again"] == {"ok": True}
    assert result["patient"] == {"ok": True, "n": 1} and result["busyTerminated"] == 0


#: sw-napllm.js run in node with the service worker globals it touches.
SW_PRELUDE = """
globalThis.self = globalThis;
self.registration = { scope: "http://127.0.0.1:8000/" };
self.location = new URL("http://127.0.0.1:8000/sw.js");
self.addEventListener = () => {};
globalThis.caches = { open: async () => ({ match: async () => undefined, put: async () => {} }), keys: async () => [] };
globalThis.clients = { matchAll: async () => [] };
"""


@needs_node
def test_the_service_worker_keeps_only_a_whole_file() -> None:
    script = (
        SW_PRELUDE
        + SERVICE_WORKER.read_text()
        + """
const { verifiedModel } = self.napllmSw;
const S = 1000;
const bytes = new Uint8Array(S);
bytes.set([0x47, 0x47, 0x55, 0x46]);
const answer = (status, headers, body = bytes) => new Response(body, { status, headers });
async function kept(response) {
  const copy = verifiedModel(response, { magic: [0x47, 0x47, 0x55, 0x46], limit: 10_000 });
  if (!copy) return "refused";
  try {
    return (await copy.arrayBuffer()).byteLength;
  } catch {
    return "errored";
  }
}
console.log(JSON.stringify({
  whole: await kept(answer(200, { "content-length": String(S) })),
  wholeRange: await kept(answer(206, { "content-range": `bytes 0-${S - 1}/${S}`, "content-length": String(S) })),
  slice200: await kept(answer(200, { "content-range": `bytes 400-${S - 1}/${S}`, "content-length": String(S - 400) }, bytes.slice(400))),
  sliceStart0: await kept(answer(200, { "content-range": `bytes 0-399/${S}`, "content-length": "400" }, bytes.slice(0, 400))),
  disagree: await kept(answer(206, { "content-range": `bytes 0-${S - 1}/${S}`, "content-length": "500" }, bytes.slice(0, 500))),
  malformed: await kept(answer(200, { "content-range": "bytes */1000" })),
  short: await kept(answer(200, { "content-length": String(S + 5) })),
}));
"""
    )
    result: dict[str, Any] = run_module(script)
    assert result["whole"] == 1000 and result["wholeRange"] == 1000
    assert result["slice200"] == "refused" and result["sliceStart0"] == "refused"
    assert result["disagree"] == "refused" and result["malformed"] == "refused"
    assert result["short"] == "errored"


@needs_node
def test_webllm_names_the_download_failures_and_a_stalled_load() -> None:
    engine = (ROOT / "web" / "engines" / "webllm-engine.js").as_uri()
    result = run_module(
        f"globalThis.self = globalThis;\nconst e = await import({json.dumps(engine)});\n"
        """
const kind = (name, message = "") => e.failureKind(Object.assign(new Error(message), { name }));
console.log(JSON.stringify([
  kind("EngineStalled"), kind("DownloadInterrupted"), kind("DownloadRestarted"), kind("DownloadNoRoom"),
  e.failureKind("Error: DownloadInterrupted: the host sent nothing for 30 s at every try (5 tries)"),
]));
"""
    )
    assert result == ["stalled", "download", "download", "storage", "download"]
