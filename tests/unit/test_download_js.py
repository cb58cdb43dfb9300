"""The downloader's checks and texts (web/engines/download.js, the engines' offline modules), run in node.

The first tests run without Cache Storage (a download is then one whole
answer, checked as it arrives); the later ones give node an in-memory
Cache Storage (`FAKE_CACHES`) and a scripted model host (`HOSTED`), so the
resume, restart and retry rules run here against hosts that behave as real
servers, CDNs and proxies do (tests/browser/test_downloads.py runs them
against a real local host). The shard list of a split GGUF URL is what
"Download for offline use" fetches, so a hostile URL must not make it list
thousands of files.
"""

# ruff: noqa: E501  (the JavaScript embedded below keeps its natural line length)

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from nodejs import needs_node, run_module

ROOT = Path(__file__).resolve().parents[2]
DOWNLOAD = (ROOT / "web" / "engines" / "download.js").as_uri()
OFFLINE_GGUF = (ROOT / "web" / "engines" / "offline-gguf.js").as_uri()
OFFLINE_ONNX = (ROOT / "web" / "engines" / "offline-onnx.js").as_uri()

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
    const blob = await d.downloadModelFile("http://127.0.0.1:9/m.gguf", { limit: 1000, gguf: true, fetchFn, retryMs: 1, ...opts });
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
    # A body that ends before its length is a cut: tried again, then given up on.
    assert result["short"]["name"] == "DownloadRestarted"
    assert "broke off" in result["short"]["message"]
    assert result["long"]["message"] == "longer than the host announced"
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
        f"{PRELUDE}\nconst o = await import({json.dumps(OFFLINE_GGUF)});\n"
        """
console.log(JSON.stringify({
  one: o.ggufShards("https://h.example/m/model.gguf"),
  split: o.ggufShards("https://h.example/m/model-00002-of-00003.gguf"),
  huge: o.ggufShards("https://h.example/m/model-00001-of-99999.gguf"),
  zero: o.ggufShards("https://h.example/m/model-00001-of-00000.gguf"),
  scheme: o.ggufShards("javascript:alert(1)//x.gguf"),
  relative: o.ggufShards("models/tinychat/tiny-chat-q8_0.gguf"),
  files: o.modelFiles({ kind: "wasm", settings: { url: "https://h.example/a.gguf" } }),
  other: o.modelFiles({ kind: "wasm", settings: {} }),
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
def test_the_onnx_files_are_read_where_the_runtime_resolved_them() -> None:
    # The source rule lives once, in Python (engine_onnx.onnx_settings): the
    # page reads `settings.source` and never derives one from the model id.
    result = run_module(
        f"{PRELUDE}\nglobalThis.document = {{ baseURI: 'http://127.0.0.1:8000/' }};\n"
        f"const o = await import({json.dumps(OFFLINE_ONNX)});\n"
        """
console.log(JSON.stringify(await Promise.all([
  o.readPlaces({ model: "x", settings: { source: { kind: "path", base: "./models/", model: "tinychat-onnx" } } }),
  o.readPlaces({ model: "owner/name", settings: { source: { kind: "hub", model: "owner/name" } } }),
  o.readPlaces({ model: "owner/name", settings: {} }),
  o.readPlaces({ model: "https://h.example/m/tiny/", settings: {} }),
  o.readPlaces({ model: "x", settings: { source: { kind: "hub" } } }),
  o.offlinePlan({ model: "owner/name", settings: {} }),
])));
"""
    )
    nothing = {"urls": [], "folders": []}
    assert result == [
        {"urls": [], "folders": ["http://127.0.0.1:8000/models/tinychat-onnx/"]},
        {"urls": [], "folders": [], "paths": ["/owner/name/"]},
        nothing,
        nothing,
        nothing,
        None,
    ]


# ---------------------------------------------------------------- hosts that misbehave

#: An in-memory Cache Storage (enough of it for download-store.js), so parts survive a cut.
FAKE_CACHES = """
class FakeCache {
  constructor() { this.entries = new Map(); }
  key(request) { return typeof request === "string" ? request : request.url; }
  async match(request) {
    const entry = this.entries.get(this.key(request));
    return entry ? new Response(entry.body.slice(), { status: entry.status, headers: entry.headers }) : undefined;
  }
  async put(request, response) {
    const body = new Uint8Array(await response.arrayBuffer());
    const headers = [...response.headers].filter(([name]) => name !== "content-length");
    headers.push(["content-length", String(body.byteLength)]);
    this.entries.set(this.key(request), { body, status: response.status, headers });
  }
  async delete(request) { return this.entries.delete(this.key(request)); }
  async keys() { return [...this.entries.keys()].map((url) => new Request(url)); }
}
const stores = new Map();
globalThis.caches = {
  async open(name) { if (!stores.has(name)) stores.set(name, new FakeCache()); return stores.get(name); },
  async keys() { return [...stores.keys()]; },
};
"""

#: A scripted host: `hosted(answer)` gives `{fetchFn, log}`; `answer(n, request)`
#: (n counts from 1) says what the n-th request gets: `{status, headers, body,
#: cutAt?, stall?, stallHeaders?, down?}`. `full(bytes, headers)` is a whole 200.
HOSTED = """
const SIZE = 600_000;
const file = (seed, size = SIZE) => {
  const bytes = new Uint8Array(size);
  let x = seed;
  for (let i = 0; i < size; i += 1) { x = (x * 1103515245 + 12345) >>> 0; bytes[i] = x >>> 24; }
  bytes.set([0x47, 0x47, 0x55, 0x46]);
  return bytes;
};
const full = (bytes, headers = {}) => ({ status: 200, body: bytes, headers: { "content-length": String(bytes.length), ...headers } });
const rest = (bytes, from, headers = {}) => ({
  status: 206, body: bytes.slice(from),
  headers: { "content-range": `bytes ${from}-${bytes.length - 1}/${bytes.length}`, "content-length": String(bytes.length - from), ...headers },
});
function hosted(answer) {
  const log = [];
  const fetchFn = async (url, init = {}) => {
    const headers = new Headers(init.headers || {});
    const request = { range: headers.get("range"), ifRange: headers.get("if-range"), cache: init.cache };
    log.push(request);
    const a = answer(log.length, request);
    if (a.down) throw new TypeError("fetch failed");
    if (a.stallHeaders) return new Promise(() => {});
    const body = a.body || new Uint8Array(0);
    let sent = false;
    const stream = new ReadableStream({
      pull(c) {
        // The bytes before the cut are delivered; the next read fails, or never answers (a stall).
        if (!sent) {
          sent = true;
          const end = a.cutAt ?? body.length;
          if (end > 0) c.enqueue(body.slice(0, end));
          if (a.cutAt === undefined) c.close();
          return undefined;
        }
        if (a.stall) return new Promise(() => {});
        c.error(new TypeError("network error"));
        return undefined;
      },
    });
    return new Response([204, 304].includes(a.status) ? null : stream, { status: a.status, headers: a.headers || {} });
  };
  return { fetchFn, log };
}
const hex = async (blob) => [...new Uint8Array(await crypto.subtle.digest("SHA-256", await blob.arrayBuffer()))]
  .map((b) => b.toString(16).padStart(2, "0")).join("");
const URL_ = "http://127.0.0.1:9/m.gguf";
async function fetchModel(host, opts = {}) {
  const events = [];
  try {
    const blob = await d.downloadModelFile(URL_, {
      limit: 4_000_000, gguf: true, fetchFn: host.fetchFn, retryMs: 1, headersMs: 100, idleMs: 100,
      onProgress: (e) => events.push(e), ...opts,
    });
    return { ok: true, size: blob.size, sha: await hex(blob), requests: [...host.log],
      restarted: [...new Set(events.map((e) => e.restarted).filter(Boolean))],
      retrying: events.filter((e) => e.retrying).map((e) => e.retrying),
      texts: events.map((e) => d.describeProgress(e)) };
  } catch (error) {
    return { ok: false, name: error.name, message: error.message, requests: [...host.log],
      retrying: events.filter((e) => e.retrying).map((e) => e.retrying) };
  }
}
const partsLeft = async () => (await (await caches.open("napllm-download-parts")).keys()).length;
"""


def hosts(body: str) -> Any:
    """Run `body` with node given Cache Storage and the scripted host."""
    return run(FAKE_CACHES + HOSTED + body)


@needs_node
def test_a_200_carrying_a_slice_is_never_stored_as_the_whole_file() -> None:
    # Some servers and proxies answer `Range: bytes=N-` with 200 and the
    # slice, naming it in Content-Range: the first answer announced SIZE.
    result = hosts(
        """
const v1 = file(1);
const slice = (n, r) => ({ status: 200, body: v1.slice(300_000),
  headers: { etag: '"v1"', "content-range": `bytes 300000-${SIZE - 1}/${SIZE}`, "content-length": String(SIZE - 300_000) } });
const resumed = hosted((n, r) => n === 1 ? { ...full(v1, { etag: '"v1"' }), cutAt: 300_000 } : r.range ? slice(n, r) : full(v1, { etag: '"v1"' }));
// A host that answers every request so: the tries run out, nothing is stored.
const always = hosted(() => slice());
console.log(JSON.stringify({ resumed: await fetchModel(resumed), whole: await hex(new Blob([v1])),
  always: await fetchModel(always, { store: "napllm-models" }),
  stored: (await (await caches.open("napllm-models")).keys()).length, parts: await partsLeft() }));
"""
    )
    resumed = result["resumed"]
    assert resumed["ok"] and resumed["size"] == 600_000 and resumed["sha"] == result["whole"]
    # The slice was refused and the whole file asked for again, from zero.
    assert [r["range"] for r in resumed["requests"]] == [None, "bytes=300000-", None]
    assert resumed["restarted"] == ["slice"]
    assert any("part of the file as the whole file: started again" in t for t in resumed["texts"])
    always = result["always"]
    assert not always["ok"] and always["name"] == "DownloadRestarted", always
    assert "part of the file as the whole file at every try (5 tries)" in always["message"]
    assert len(always["requests"]) == 5
    assert result["stored"] == 0 and result["parts"] == 0


@needs_node
def test_a_206_whose_lengths_disagree_is_not_joined() -> None:
    result = hosts(
        """
const v1 = file(2);
const first = { ...full(v1, { etag: '"v1"' }), cutAt: 300_000 };
// Content-Length says less than Content-Range: a fresh request for the whole file.
const short = hosted((n, r) => n === 1 ? first : r.range
  ? { ...rest(v1, 300_000, { etag: '"v1"' }), headers: { ...rest(v1, 300_000, { etag: '"v1"' }).headers, "content-length": "1000" }, body: v1.slice(300_000, 301_000) }
  : full(v1, { etag: '"v1"' }));
const a = await fetchModel(short);
// A body that runs past its range: refused, nothing kept.
const long = hosted((n, r) => n === 1 ? first : r.range
  ? { status: 206, body: new Uint8Array([...v1.slice(300_000), 1, 2, 3]), headers: { etag: '"v1"', "content-range": `bytes 300000-${SIZE - 1}/${SIZE}` } }
  : full(v1, { etag: '"v1"' }));
const b = await fetchModel(long);
console.log(JSON.stringify({ a, b, whole: await hex(new Blob([v1])), parts: await partsLeft() }));
"""
    )
    a, b = result["a"], result["b"]
    assert a["ok"] and a["sha"] == result["whole"]
    assert [r["range"] for r in a["requests"]] == [None, "bytes=300000-", None]
    assert a["restarted"] == ["inconsistent"]
    assert (
        not b["ok"]
        and b["name"] == "NotAModel"
        and b["message"] == "longer than the host announced"
    )
    assert len(b["requests"]) == 2 and result["parts"] == 0


@needs_node
def test_a_cut_without_a_strong_validator_starts_again_from_zero() -> None:
    # Weak ETag, none at all, a compressed body: nothing says the next
    # answer is the same file, so the next try asks for all of it.
    result = hosts(
        """
const v1 = file(3);
const out = {};
for (const [name, headers] of Object.entries({
  weak: { etag: 'W/"v1"' }, none: {}, gzip: { etag: '"v1"', "content-encoding": "gzip" },
})) {
  const host = hosted((n) => n === 1 ? { ...full(v1, headers), cutAt: 200_000 } : full(v1, headers));
  out[name] = await fetchModel(host);
}
// A host whose file changes between tries, without any validator: the
// stored file is the host's current one, never a join of two versions.
const v2 = file(4, SIZE + 500);
const changing = hosted((n) => n === 1 ? { ...full(v1), cutAt: 200_000 } : full(v2));
out.changed = await fetchModel(changing);
out.v1 = await hex(new Blob([v1]));
out.v2 = await hex(new Blob([v2]));
out.parts = await partsLeft();
console.log(JSON.stringify(out));
"""
    )
    for name in ("weak", "none", "gzip"):
        got = result[name]
        assert got["ok"] and got["sha"] == result["v1"], (name, got)
        assert [r["range"] for r in got["requests"]] == [None, None]
        assert got["restarted"] == ["cut"]
        assert any("cannot resume it: started again" in t for t in got["texts"])
    assert result["changed"]["ok"] and result["changed"]["sha"] == result["v2"]
    assert result["changed"]["size"] == 600_500
    assert result["parts"] == 0


@needs_node
def test_a_compressed_body_is_whole_whatever_its_wire_length_says() -> None:
    # Content-Length of a gzip answer counts wire bytes: it is no bound on the file.
    result = hosts(
        """
const v1 = file(5);
const out = {};
for (const length of [SIZE, 1000, SIZE + 10]) {
  const host = hosted(() => ({ status: 200, body: v1, headers: { "content-encoding": "gzip", "content-length": String(length) } }));
  out[length] = await fetchModel(host);
}
out.whole = await hex(new Blob([v1]));
console.log(JSON.stringify(out));
"""
    )
    for length in ("600000", "1000", "600010"):
        assert result[length]["ok"] and result[length]["sha"] == result["whole"], result[length]
        assert len(result[length]["requests"]) == 1


@needs_node
def test_host_errors_are_tried_again_with_backoff_and_retry_after() -> None:
    result = hosts(
        """
const v1 = file(6);
const out = {};
out.unavailable = await fetchModel(hosted((n) => n === 1 ? { status: 503 } : full(v1, { etag: '"v1"' })));
out.busy = await fetchModel(hosted((n) => n === 1 ? { status: 429, headers: { "retry-after": "1" } } : full(v1)));
out.timeout = await fetchModel(hosted((n) => n < 3 ? { status: 408 } : full(v1)));
out.down = await fetchModel(hosted((n) => n === 1 ? { down: true } : full(v1)));
// A host that asks to wait longer than the bound: given up on at once, saying so.
out.later = await fetchModel(hosted(() => ({ status: 503, headers: { "retry-after": "3600" } })));
// Always failing: the tries are bounded, and the error says why.
out.always = await fetchModel(hosted(() => ({ status: 502 })));
// Not curable by a fresh request: no retry.
out.gone = await fetchModel(hosted(() => ({ status: 404 })));
out.whole = await hex(new Blob([v1]));
console.log(JSON.stringify(out));
"""
    )
    for name, count in (("unavailable", 2), ("busy", 2), ("timeout", 3), ("down", 2)):
        got = result[name]
        assert got["ok"] and got["sha"] == result["whole"], (name, got)
        assert len(got["requests"]) == count
        # Every retry after the first request goes past the HTTP cache.
        assert [r["cache"] for r in got["requests"]][1:] == ["reload"] * (count - 1)
    assert result["busy"]["retrying"][0] == {"why": "status 429", "inSeconds": 1, "tries": 1}
    later = result["later"]
    assert not later["ok"] and later["name"] == "DownloadInterrupted"
    assert "asks to wait 3600 s" in later["message"] and len(later["requests"]) == 1
    always = result["always"]
    assert always["name"] == "DownloadInterrupted" and len(always["requests"]) == 5
    assert always["message"] == "status 502 at every try (5 tries)"
    assert result["gone"]["message"] == "status 404" and len(result["gone"]["requests"]) == 1


@needs_node
def test_a_stalled_host_ends_the_download_and_a_later_try_resumes() -> None:
    result = hosts(
        """
const v1 = file(7);
const out = {};
// Headers and a few bytes, then nothing: every try ends within its bound.
let recovered = false;
const host = hosted((n, r) => {
  const answer = r.range ? rest(v1, Number(r.range.slice(6, -1)), { etag: '"v1"' }) : full(v1, { etag: '"v1"' });
  return recovered ? answer : { ...answer, cutAt: 1024, stall: true };
});
out.stalled = await fetchModel(host);
out.kept = (await d.unfinishedDownloads()).map((u) => u.received);
recovered = true;
out.again = await fetchModel(host);
// No answer at all (no headers): the same bound.
out.silent = await fetchModel(hosted(() => ({ stallHeaders: true })));
out.whole = await hex(new Blob([v1]));
console.log(JSON.stringify(out));
"""
    )
    stalled = result["stalled"]
    assert not stalled["ok"] and stalled["name"] == "DownloadInterrupted", stalled
    assert stalled["message"] == "the host sent nothing for 100 ms at every try (5 tries)"
    assert len(stalled["requests"]) == 5
    # Each try kept its KiB (too little to count as progress); the next call continues.
    assert result["kept"] == [5 * 1024]
    again = result["again"]
    assert again["ok"] and again["sha"] == result["whole"]
    assert again["requests"][-1]["range"] == "bytes=5120-"
    silent = result["silent"]
    assert silent["name"] == "DownloadInterrupted" and len(silent["requests"]) == 5
    assert silent["message"].startswith("the host sent no answer within 100 ms")


@needs_node
def test_the_download_stops_at_the_room_the_storage_check_found() -> None:
    # A HEAD may say 1,000 bytes; the download itself announces more, or sends more.
    result = hosts(
        """
const v1 = file(8);
const out = {};
const announced = hosted(() => full(v1));
out.announced = await fetchModel(announced, { room: 100_000 });
const unannounced = hosted(() => ({ status: 200, body: v1, headers: {} }));
out.unannounced = await fetchModel(unannounced, { room: 100_000 });
out.fits = await fetchModel(hosted(() => full(v1)), { room: SIZE });
// A catalogue's size that the host's file does not have.
out.catalogue = await fetchModel(hosted(() => full(v1)), { size: SIZE - 1 });
console.log(JSON.stringify(out));
"""
    )
    assert result["announced"]["name"] == "DownloadNoRoom"
    assert len(result["announced"]["requests"]) == 1
    assert result["unannounced"]["name"] == "DownloadNoRoom"
    assert result["fits"]["ok"]
    assert result["catalogue"]["name"] == "NotAModel"


@needs_node
def test_the_user_cancels_during_a_retry_wait() -> None:
    result = hosts(
        """
const controller = new AbortController();
const host = hosted(() => ({ status: 503 }));
const pending = fetchModel(host, { retryMs: 60_000, signal: controller.signal });
setTimeout(() => controller.abort(new DOMException("cancelled", "AbortError")), 50);
console.log(JSON.stringify(await pending));
"""
    )
    assert result["ok"] is False and result["name"] == "AbortError"
    assert len(result["requests"]) == 1


@needs_node
def test_a_host_that_trickles_just_inside_the_idle_bound_is_a_stall() -> None:
    # One byte at a time, each well inside the idle bound: without a
    # progress floor such a host holds the download (and its lock) for good.
    # This host gives up by itself after 400 bytes (a cut), so a download
    # without the floor ends with the cut's text, not the floor's.
    result = hosts(
        """
const v1 = file(9);
const log = [];
const trickle = async (url, init = {}) => {
  log.push(new Headers(init.headers || {}).get("range"));
  let sent = 0;
  const stream = new ReadableStream({
    async pull(c) {
      await new Promise((resolve) => setTimeout(resolve, 5));
      if (sent === 400) { c.error(new TypeError("network error")); return; }
      c.enqueue(v1.slice(sent, sent + 1));
      sent += 1;
    },
  });
  return new Response(stream, { status: 200, headers: { "content-length": String(v1.length), etag: '"v1"' } });
};
const out = {};
out.trickle = await fetchModel({ fetchFn: trickle, log }, { idleMs: 1000, rateMs: 100, rateBytes: 4096 });
// A host that is slow but above the floor is left alone.
const steady = hosted(() => full(v1, { etag: '"v1"' }));
out.steady = await fetchModel(steady, { idleMs: 1000, rateMs: 100, rateBytes: 4096 });
console.log(JSON.stringify(out));
"""
    )
    trickle = result["trickle"]
    assert not trickle["ok"] and len(trickle["requests"]) == 5, trickle
    # Each try ended at the floor (this host ignores ranges, so it restarts from zero).
    whys = [r["why"] for r in trickle["retrying"]]
    assert whys and all(why == "the host sent less than 4 KiB in 100 ms" for why in whys), whys
    assert result["steady"]["ok"]


@needs_node
def test_an_answer_without_a_length_is_held_to_the_expected_size() -> None:
    # A chunked answer announces no total: the bytes received must still be
    # exactly the size the caller confirmed, never fewer and never more.
    result = hosts(
        """
const v1 = file(8);
const chunked = () => hosted(() => ({ status: 200, body: v1, headers: {} }));
console.log(JSON.stringify({
  exact: await fetchModel(chunked(), { size: SIZE }),
  fewer: await fetchModel(chunked(), { size: SIZE + 1 }),
  more: await fetchModel(chunked(), { size: SIZE - 1 }),
  stored: (await (await caches.open("napllm-models")).keys()).length,
  parts: await partsLeft(),
}));
"""
    )
    assert result["exact"]["ok"]
    assert result["fewer"]["name"] == "NotAModel"
    assert result["more"]["name"] == "NotAModel"
    assert result["parts"] == 0


@needs_node
def test_a_stored_copy_of_another_size_is_not_used() -> None:
    # A file some earlier answer left in the store (the service worker keeps
    # any self-consistent answer) is used only at the size the caller expects.
    result = hosts(
        """
const v1 = file(8);
const store = await caches.open("napllm-models");
await store.put(URL_, new Response(new Uint8Array(SIZE - 10), { status: 200 }));
const host = hosted(() => full(v1));
const got = await fetchModel(host, { size: SIZE, store: "napllm-models" });
const kept = await store.match(URL_);
console.log(JSON.stringify({
  ok: got.ok, size: got.size, requests: got.requests.length, sha: got.sha, want: await hex(new Blob([v1])),
  kept: kept ? (await kept.arrayBuffer()).byteLength : null,
  again: (await fetchModel(hosted(() => full(v1)), { size: SIZE, store: "napllm-models" })).requests.length,
}));
"""
    )
    assert result["ok"] and result["size"] == 600_000 and result["sha"] == result["want"]
    assert result["requests"] == 1
    assert result["kept"] == 600_000
    assert result["again"] == 0
