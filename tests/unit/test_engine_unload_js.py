"""A chat never outlives its model (web/engines/engine-host.js, worker-bridge.js), run in node.

Every way a model goes away under an open chat ends that chat with a
result: loading a second model of a one-model engine (WebLLM) unloads the
first while another napplet's chat on it streams; unloading a model of a
shared worker (wllama) or of its own worker (onnx) while it generates; the
adapter's worker failing. The engine here is a stand-in adapter (a
MessagePort that streams one chunk per chat and never ends it) or a
stand-in worker port; nothing of a real engine is needed.
"""

# ruff: noqa: E501  (the JavaScript embedded below keeps its natural line length)

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from nodejs import needs_node, run_module

ROOT = Path(__file__).resolve().parents[2]
ENGINES = ROOT / "web" / "engines"

pytestmark = needs_node

#: An engine adapter (engine-host.js module rules) whose chats stream one chunk and never end.
ADAPTER = """
export async function report() { return "{}"; }
export async function connect(key, fields, onProgress, onFailure) {
  const channel = new MessageChannel();
  const engine = channel.port2;
  globalThis.posted = globalThis.posted || [];
  engine.onmessage = ({ data }) => {
    globalThis.posted.push({ key, op: data.op });
    if (data.op === "chat") {
      engine.postMessage({ op: "chunks", id: data.id, chunks: [JSON.stringify({ choices: [{ index: 0, delta: { content: key }, finish_reason: null }] })] });
    }
  };
  (globalThis.failures = globalThis.failures || {})[key] = onFailure;
  return { target: channel.port1, close: async () => { engine.close(); } };
}
export function failureKind() { return "unknown"; }
export function classify() { return "inference"; }
export async function forget() { return 0; }
"""


def run_node(tmp_path: Path, body: str) -> Any:
    """Run `body` with `engineHost`, `bridges`, `streams` and `read(id)` (one batch, or
    "waiting" when none comes within a second) in scope; its JSON output."""
    adapter = tmp_path / "adapter.mjs"
    adapter.write_text(ADAPTER, encoding="utf-8")
    script = f"""
import * as engineHost from {json.dumps((ENGINES / "engine-host.js").as_uri())};
import * as bridges from {json.dumps((ENGINES / "worker-bridge.js").as_uri())};
import * as streams from {json.dumps((ENGINES / "streams.js").as_uri())};
const ADAPTER = {json.dumps(adapter.as_uri())};
const read = async (id) => {{
  let timer;
  const late = new Promise((resolve) => {{ timer = setTimeout(() => resolve("waiting"), 1000); }});
  const got = await Promise.race([engineHost.nextChunks(id), late]);
  clearTimeout(timer);
  return got === "waiting" ? got : JSON.parse(got);
}};
const out = {{}};
{body}
process.stdout.write(JSON.stringify(out));
process.exit(0);
"""
    return run_module(script)


def test_loading_a_second_model_ends_the_chat_on_the_first(tmp_path: Path) -> None:
    out = run_node(
        tmp_path,
        """
const host = engineHost.hostFor(JSON.stringify({ kind: "one-model", oneModel: true, report: "adapter", adapter: ADAPTER }));
out.loadA = JSON.parse(await host.ensureModel("A", "{}", "c-a", "A"));
const id = host.startChat("A", "{}");
out.first = await read(id);
// another napplet's request loads model B: A is unloaded under the chat
out.loadB = JSON.parse(await host.ensureModel("B", "{}", "c-b", "B"));
out.after = await read(id);
out.loaded = JSON.parse(host.loadedModels()).map((m) => m.key);
out.open = host.openStreams();
""",
    )
    assert out["loadA"]["ok"] is True and out["loadB"]["ok"] is True
    assert out["first"]["done"] is False and len(out["first"]["chunks"]) == 1
    # the chat on A ends, with the kind the runtime maps to a typed error
    assert out["after"] == {"chunks": [], "done": True, "error": {"kind": "unloaded"}}
    assert out["loaded"] == ["B"] and out["open"] == 0


def test_an_adapter_worker_that_fails_ends_its_chats(tmp_path: Path) -> None:
    out = run_node(
        tmp_path,
        """
const host = engineHost.hostFor(JSON.stringify({ kind: "failing", oneModel: true, report: "adapter", adapter: ADAPTER }));
await host.ensureModel("A", "{}", "c-a", "A");
const id = host.startChat("A", "{}");
await read(id);
globalThis.failures.A();
out.after = await read(id);
out.loaded = host.isLoaded("A");
""",
    )
    assert out["after"] == {"chunks": [], "done": True, "error": {"kind": "inference"}}
    assert out["loaded"] is False


def test_unloading_a_model_of_a_worker_ends_its_chats_and_only_them(tmp_path: Path) -> None:
    """A shared worker (wllama: `unload`) and a model's own worker (onnx: `terminate`)."""
    out = run_node(
        tmp_path,
        """
const channel = new MessageChannel();
const posted = [];
channel.port2.onmessage = ({ data }) => posted.push(data.op + (data.key ? " " + data.key : ""));
const bridge = new bridges.WorkerBridge(channel.port1);
const onA = streams.open("wasm");
const onB = streams.open("wasm");
bridge.chat(onA, {}, { key: "A" });
bridge.chat(onB, {}, { key: "B" });
bridge.unload("A");
out.a = await read(onA.id);
out.bOpen = bridge.openChats;
bridge.terminate("unloaded");
out.b = await read(onB.id);
await new Promise((resolve) => setTimeout(resolve, 50));
out.posted = posted;
""",
    )
    assert out["a"] == {"chunks": [], "done": True, "error": {"kind": "unloaded"}}
    assert out["bOpen"] == 1
    assert out["b"] == {"chunks": [], "done": True, "error": {"kind": "unloaded"}}
    # the worker is told to stop the chat before the model goes
    assert out["posted"] == ["chat A", "chat B", "cancel", "unload A"]


def test_a_model_entry_moves_only_as_its_table_allows(tmp_path: Path) -> None:
    """engine-host.js `MODEL_TRANSITIONS`: unloaded while loading, then loaded afresh."""
    out = run_node(
        tmp_path,
        """
out.table = engineHost.MODEL_TRANSITIONS;
const host = engineHost.hostFor(JSON.stringify({ kind: "table", report: "adapter", adapter: ADAPTER }));
// unloaded while its load is in flight: the load finishes, then the model is closed
const loading = host.ensureModel("A", "{}", "c-a", "A");
out.loadingLoaded = host.isLoaded("A");
const unloading = host.unloadModel("A");
out.loadA = JSON.parse(await loading);
await unloading;
out.afterUnload = [host.isLoaded("A"), JSON.parse(host.loadedModels()).map((m) => m.key)];
try { host.startChat("A", "{}"); out.chat = "started"; } catch { out.chat = "refused"; }
// a new ensureModel of the key makes a new entry
out.again = JSON.parse(await host.ensureModel("A", "{}", "c-a", "A"));
out.loaded = JSON.parse(host.loadedModels()).map((m) => m.key);
""",
    )
    assert out["table"]["gone"] == {}
    assert set(out["table"]["loaded"]) == {"unloaded", "workerDied"}
    assert out["loadingLoaded"] is False
    assert out["loadA"]["ok"] is True
    assert out["afterUnload"] == [False, []]
    assert out["chat"] == "refused"
    assert out["again"]["ok"] is True and out["loaded"] == ["A"]
