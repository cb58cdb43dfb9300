"""The downloader's checks and texts (web/engines/download.js, web/js/offline.js), run in node.

Node has no Cache Storage: a download there is one whole answer, checked as
it arrives (the resuming itself is tested in the browser,
tests/browser/test_downloads.py). The shard list of a split GGUF URL is
what "Download for offline use" fetches, so a hostile URL must not make it
list thousands of files.
"""

# ruff: noqa: E501  (the JavaScript embedded below keeps its natural line length)

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from nodejs import needs_node, run_module

ROOT = Path(__file__).resolve().parents[2]
DOWNLOAD = (ROOT / "web" / "engines" / "download.js").as_uri()
OFFLINE = (ROOT / "web" / "js" / "offline.js").as_uri()

PRELUDE = """
globalThis.self = globalThis;
globalThis.location = new URL("http://127.0.0.1:8000/");
"""


def run(body: str) -> Any:
    return run_module(f"{PRELUDE}\nconst d = await import({json.dumps(DOWNLOAD)});\n{body}\n")


HOST = """
/** A host answering `bytes` with `headers` (status 200). */
const host = (bytes, headers = {}) => async () => new Response(new Uint8Array(bytes), { status: 200, headers });
async function attempt(fetchFn, opts = {}) {
  try {
    const blob = await d.downloadModelFile("http://127.0.0.1:9/m.gguf", { limit: 1000, gguf: true, fetchFn, ...opts });
    return { ok: true, size: blob.size };
  } catch (error) {
    return { ok: false, name: error.name, message: error.message };
  }
}
"""


@needs_node
def test_a_whole_answer_is_checked_as_it_arrives() -> None:
    result = run(
        HOST
        + """
const gguf = [0x47, 0x47, 0x55, 0x46, 1, 2, 3];
console.log(JSON.stringify({
  good: await attempt(host(gguf, { "content-length": "7", "content-type": "application/octet-stream" })),
  html: await attempt(host(gguf, { "content-type": "text/html" })),
  magic: await attempt(host([1, 2, 3, 4, 5], {})),
  short: await attempt(host(gguf, { "content-length": "9" })),
  long: await attempt(host(gguf, { "content-length": "5" })),
  declared: await attempt(host(gguf, { "content-length": "5000" })),
  ceiling: await attempt(host(new Array(2000).fill(0x47), {}), { gguf: false }),
  status: await attempt(async () => new Response("x", { status: 404 })),
  nolimit: await attempt(host(gguf), { limit: 0 }),
}));
"""
    )
    assert result["good"] == {"ok": True, "size": 7}
    assert result["html"]["name"] == "NotAModel"
    assert result["magic"]["message"] == "not a GGUF file"
    assert result["short"]["message"] == "incomplete file"
    assert result["long"]["message"] == "longer than declared"
    assert result["declared"]["name"] == "DownloadTooLarge"
    assert result["ceiling"]["name"] == "DownloadTooLarge"
    assert result["status"]["message"] == "status 404"
    assert result["nolimit"]["name"] == "TypeError"


@needs_node
def test_the_progress_text_says_how_far_how_fast_and_why_it_restarted() -> None:
    result = run(
        """
const base = { received: 1_500_000, total: 3_000_000, bytesPerSecond: 500_000, secondsLeft: 3, resumedFrom: 0, restarted: null, shared: false };
console.log(JSON.stringify([
  d.describeProgress(base),
  d.describeProgress({ ...base, resumedFrom: 1_000_000 }),
  d.describeProgress({ ...base, restarted: "no-ranges" }),
  d.describeProgress({ ...base, restarted: "changed" }),
  d.describeProgress({ ...base, shared: true, bytesPerSecond: 0, secondsLeft: null }),
]));
"""
    )
    assert result[0] == "1.5 MB of 3.0 MB, 500 kB/s, 3 s left"
    assert result[1].endswith("(resumed at 1.0 MB)")
    assert "cannot resume downloads: started again" in result[2]
    assert "file changed on the server: started again" in result[3]
    assert result[4] == "1.5 MB of 3.0 MB (in another tab)"


@needs_node
def test_the_shards_of_a_split_gguf_url_are_listed_within_a_bound() -> None:
    result = run_module(
        f"{PRELUDE}\nconst o = await import({json.dumps(OFFLINE)});\n"
        """
console.log(JSON.stringify({
  one: o.ggufShards("https://h.example/m/model.gguf"),
  split: o.ggufShards("https://h.example/m/model-00002-of-00003.gguf"),
  huge: o.ggufShards("https://h.example/m/model-00001-of-99999.gguf"),
  zero: o.ggufShards("https://h.example/m/model-00001-of-00000.gguf"),
  scheme: o.ggufShards("javascript:alert(1)//x.gguf"),
  relative: o.ggufShards("models/tinychat/tiny-chat-q8_0.gguf"),
  files: o.modelFiles({ kind: "wasm", settings: { url: "https://h.example/a.gguf" } }),
  other: o.modelFiles({ kind: "openai", settings: { url: "https://h.example/a.gguf" } }),
}));
"""
    )
    assert result["one"] == ["https://h.example/m/model.gguf"]
    assert result["split"] == [
        f"https://h.example/m/model-0000{i}-of-00003.gguf" for i in (1, 2, 3)
    ]
    assert result["huge"] == [] and result["zero"] == []
    assert result["scheme"] == [] and result["relative"] == []
    assert result["files"] == [
        {"url": "https://h.example/a.gguf", "gguf": True, "store": "napllm-models"}
    ]
    assert result["other"] == []


@needs_node
def test_the_onnx_source_of_a_connection_follows_the_runtimes_rule() -> None:
    # Download for offline use lists the files where the engine will read them.
    result = run_module(
        f"{PRELUDE}\nconst o = await import({json.dumps(OFFLINE)});\n"
        """
console.log(JSON.stringify([
  o.onnxSource({ model: "x", settings: { source: { kind: "path", base: "./models/", model: "tinychat-onnx" } } }),
  o.onnxSource({ model: "https://h.example/m/tiny/", settings: {} }),
  o.onnxSource({ model: "owner/name", settings: {} }),
  o.onnxSource({ model: "https://h.example/m/tiny?x=1", settings: {} }),
  o.onnxSource({ model: "../../etc", settings: {} }),
  o.onnxSource({ model: "x", settings: { source: { kind: "hub" } } }),
]));
"""
    )
    assert result == [
        {"kind": "path", "base": "./models/", "model": "tinychat-onnx"},
        {"kind": "path", "base": "https://h.example/m/", "model": "tiny"},
        {"kind": "hub", "model": "owner/name"},
        None,
        None,
        None,
    ]
