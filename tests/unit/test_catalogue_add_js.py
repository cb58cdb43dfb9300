"""One click from a catalogue entry (web/catalogue/add.js), run in node.

Node gets an in-memory Cache Storage and `localStorage`, and a model host
whose answers each test scripts: what is kept in the engine's store after
a failure, and which sizes are refused before any download.
"""

# ruff: noqa: E501  (the JavaScript embedded below keeps its natural line length)

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from nodejs import needs_node, run_module
from test_download_js import FAKE_CACHES

ROOT = Path(__file__).resolve().parents[2]
ADD = (ROOT / "web" / "catalogue" / "add.js").as_uri()

PRELUDE = """
globalThis.self = globalThis;
globalThis.location = new URL("http://127.0.0.1:8000/");
const kept = new Map();
globalThis.localStorage = {
  getItem: (k) => (kept.has(k) ? kept.get(k) : null),
  setItem: (k, v) => kept.set(k, String(v)),
  removeItem: (k) => kept.delete(k),
};
let free = 1e12;
Object.defineProperty(globalThis, "navigator", { value: { storage: { estimate: async () => ({ usage: 0, quota: free }) } }, configurable: true });
const SIZE = 1000;
const file = (seed) => {
  const bytes = new Uint8Array(SIZE);
  for (let i = 0; i < SIZE; i += 1) bytes[i] = (seed * 31 + i) & 255;
  bytes.set([0x47, 0x47, 0x55, 0x46]);
  return bytes;
};
const URLS = ["http://127.0.0.1:9/a.gguf", "http://127.0.0.1:9/b.gguf"];
// What the host serves per URL (a GET), and the size its HEAD names.
const served = new Map(URLS.map((url, i) => [url, file(i + 1)]));
const named = new Map(URLS.map((url) => [url, SIZE]));
const gets = [];
const modes = [];
globalThis.fetch = async (url, init = {}) => {
  url = String(url);
  if ((init.method || "GET") === "HEAD") {
    // The size request of add.js; the storage check's own HEAD learns nothing.
    if (init.cache !== "no-store") throw new TypeError("no answer");
    return new Response(null, { status: 200, headers: { "content-length": String(named.get(url)) } });
  }
  gets.push(url);
  modes.push(init.cache);
  const body = served.get(url);
  return new Response(body, { status: 200, headers: { "content-length": String(body.length), "content-type": "application/octet-stream" } });
};
const add = await import(__ADD__);
const catalogue = { engines: { wasm: { files: "listed", store: "napllm-models", gguf: true, ceiling: "MAX_GGUF_MODEL_BYTES" } } };
const entry = (sizes = [SIZE, SIZE]) => ({
  id: "e", name: "E", engine: "wasm", model: "m", settings: {},
  files: URLS.map((url, i) => ({ url, bytes: sizes[i] })),
});
const runtime = { addConnection: async () => JSON.stringify({ id: "u-1" }) };
const storedUrls = async () => (await (await caches.open("napllm-models")).keys()).map((r) => r.url).sort();
const attempts = () => JSON.parse(localStorage.getItem(add.ATTEMPTS_KEY) ?? "{}");
"""


def run(body: str) -> Any:
    return run_module(FAKE_CACHES + PRELUDE.replace("__ADD__", json.dumps(ADD)) + body)


@needs_node
def test_every_size_is_checked_against_the_ceiling_before_any_download() -> None:
    result = run(
        """
const big = 5 * 1024 ** 3;
named.set(URLS[1], big);
const answer = await add.addFromCatalogue(entry([SIZE, big]), catalogue, runtime);
console.log(JSON.stringify({ ok: answer.ok, text: answer.text, gets, stored: await storedUrls() }));
"""
    )
    assert not result["ok"] and "larger than this shell accepts" in result["text"]
    assert result["gets"] == []
    assert result["stored"] == []


@needs_node
def test_no_room_for_the_second_file_takes_back_the_first() -> None:
    result = run(
        """
free = 2 * SIZE - 1;
const answer = await add.addFromCatalogue(entry(), catalogue, runtime);
console.log(JSON.stringify({ ok: answer.ok, text: answer.text, stored: await storedUrls(), attempts: attempts() }));
"""
    )
    assert not result["ok"]
    assert result["stored"] == []
    assert result["attempts"] == {}


@needs_node
def test_a_file_the_page_refused_is_not_kept_in_the_store() -> None:
    # The service worker keeps any self-consistent answer in the engine's
    # store; the page refusing it (no GGUF) must not leave it there, while
    # the first file, which passed every check, stays to resume.
    result = run(
        """
const zeroed = new Uint8Array(SIZE);
served.set(URLS[1], zeroed);
const store = await caches.open("napllm-models");
const realFetch = globalThis.fetch;
globalThis.fetch = async (url, init = {}) => {
  const response = await realFetch(url, init);
  if ((init.method || "GET") === "GET" && String(url) === URLS[1]) await store.put(URLS[1], new Response(zeroed));
  return response;
};
const first = await add.addFromCatalogue(entry(), catalogue, runtime);
const afterFirst = { ok: first.ok, stored: await storedUrls(), attempts: attempts() };
// The host serves the right file again: the next click downloads it anew.
served.set(URLS[1], file(2));
globalThis.fetch = realFetch;
gets.length = 0;
const second = await add.addFromCatalogue(entry(), catalogue, runtime);
console.log(JSON.stringify({ afterFirst, second: second.ok, gets, modes, stored: await storedUrls(), attempts: attempts() }));
"""
    )
    assert not result["afterFirst"]["ok"]
    assert result["afterFirst"]["stored"] == ["http://127.0.0.1:9/a.gguf"]
    assert result["afterFirst"]["attempts"] == {
        "e": ["http://127.0.0.1:9/a.gguf", "http://127.0.0.1:9/b.gguf"]
    }
    assert result["second"]
    assert result["gets"] == ["http://127.0.0.1:9/b.gguf"]
    # Past the HTTP cache, which may still hold the refused answer.
    assert set(result["modes"]) == {"reload"}
    assert result["stored"] == ["http://127.0.0.1:9/a.gguf", "http://127.0.0.1:9/b.gguf"]
    assert result["attempts"] == {}
