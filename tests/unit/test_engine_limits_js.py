"""Byte ceilings of model downloads (web/engines/bounded.js, limits.js), run in node.

A model host may answer without a length, with a false one, or compressed
so that a few bytes decode to any amount: every engine path bounds the
bytes it accepts by the ceiling of the file's kind and, for a body known to
be uncompressed, by its declared length. The service worker keeps a copy of
the ceilings (it cannot import a module): both must say the same.
"""

# ruff: noqa: E501  (the JavaScript embedded below keeps its natural line length)

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from nodejs import needs_node, run_module

ROOT = Path(__file__).resolve().parents[2]
ENGINES = ROOT / "web" / "engines"


def run_node(body: str) -> Any:
    """Run an ES module body (with `bounded` imported); its JSON output."""
    script = f"import * as bounded from {json.dumps((ENGINES / 'bounded.js').as_uri())};\n{body}\n"
    return run_module(script)


HELPERS = """
const encoder = new TextEncoder();
/** A host's answer: `chunks` chunks of `size` bytes (endless when chunks is Infinity). */
function answer(chunks, size, headers = {}) {
  let sent = 0;
  const state = { pulled: 0, cancelled: false };
  const body = new ReadableStream({
    pull(controller) {
      if (sent >= chunks) { controller.close(); return; }
      sent += 1;
      state.pulled += size;
      controller.enqueue(new Uint8Array(size));
    },
    cancel() { state.cancelled = true; },
  });
  return { response: new Response(body, { status: 200, headers }), state };
}
async function read(response) {
  try {
    const bytes = await response.arrayBuffer();
    return { ok: true, bytes: bytes.byteLength };
  } catch (error) {
    return { ok: false, name: error.name };
  }
}
"""


@needs_node
def test_an_endless_body_without_length_is_cut_at_the_ceiling() -> None:
    out = run_node(
        HELPERS
        + """
let refused = 0;
const { response, state } = answer(Infinity, 1024);
const result = await read(bounded.limitResponse(response, 10_000, () => { refused += 1; }));
await new Promise((r) => setTimeout(r, 10));
console.log(JSON.stringify({ result, refused, pulled: state.pulled, cancelled: state.cancelled }));
"""
    )
    assert out["result"] == {"ok": False, "name": "DownloadTooLarge"}
    assert out["refused"] == 1
    # The download stopped right after the ceiling (a few chunks of read-ahead at most).
    assert out["cancelled"] is True
    assert out["pulled"] <= 10_000 + 4 * 1024


@needs_node
def test_an_uncompressed_body_longer_than_declared_is_refused() -> None:
    out = run_node(
        HELPERS
        + """
const { response } = answer(20, 100, { "content-length": "1000" });
console.log(JSON.stringify(await read(bounded.limitResponse(response, 1_000_000))));
"""
    )
    assert out == {"ok": False, "name": "DownloadTooLarge"}


@needs_node
def test_a_declared_length_above_the_ceiling_fails_before_reading() -> None:
    out = run_node(
        HELPERS
        + """
let refused = 0;
const { response, state } = answer(Infinity, 1024, { "content-length": "5000000000" });
let name = null;
try { bounded.limitResponse(response, 4_000_000_000, () => { refused += 1; }); } catch (error) { name = error.name; }
await new Promise((r) => setTimeout(r, 10));
console.log(JSON.stringify({ name, refused, cancelled: state.cancelled, pulled: state.pulled }));
"""
    )
    assert out["name"] == "DownloadTooLarge" and out["refused"] == 1
    assert out["cancelled"] is True and out["pulled"] <= 1024


@needs_node
def test_a_compressed_body_may_decode_past_its_wire_length_up_to_the_ceiling() -> None:
    out = run_node(
        HELPERS
        + """
const small = answer(20, 100, { "content-length": "300", "content-encoding": "gzip" });
const bomb = answer(Infinity, 4096, { "content-length": "300", "content-encoding": "gzip" });
console.log(JSON.stringify([
  await read(bounded.limitResponse(small.response, 10_000)),
  await read(bounded.limitResponse(bomb.response, 10_000)),
]))
"""
    )
    assert out == [{"ok": True, "bytes": 2000}, {"ok": False, "name": "DownloadTooLarge"}]


@needs_node
def test_bodies_within_their_bounds_arrive_whole_with_status_and_headers() -> None:
    out = run_node(
        HELPERS
        + """
const exact = answer(10, 100, { "content-length": "1000", "content-type": "application/octet-stream" });
const limited = bounded.limitResponse(exact.response, 1000);
const unknown = answer(10, 100);
console.log(JSON.stringify({
  status: limited.status,
  type: limited.headers.get("content-type"),
  exact: await read(limited),
  unknown: await read(bounded.limitResponse(unknown.response, 1000)),
}));
"""
    )
    assert out == {
        "status": 200,
        "type": "application/octet-stream",
        "exact": {"ok": True, "bytes": 1000},
        "unknown": {"ok": True, "bytes": 1000},
    }


@needs_node
def test_limited_fetch_bounds_each_file_by_its_kind() -> None:
    out = run_node(
        HELPERS
        + """
let refused = 0;
const served = (url) => answer(Infinity, 1 << 20).response;
const limited = bounded.limitedFetch(async (url) => served(url), (url) => (url.endsWith(".json") ? 3 << 20 : 5 << 20), () => { refused += 1; });
console.log(JSON.stringify({
  json: await read(await limited("https://host.test/m/config.json")),
  weights: await read(await limited(new Request("https://host.test/m/onnx/model.onnx"))),
  refused,
  kinds: [
    bounded.onnxLimit("https://host.test/m/onnx/model.onnx"),
    bounded.onnxLimit("https://host.test/m/onnx/model.onnx_data"),
    bounded.onnxLimit("https://host.test/m/tokenizer.json"),
  ],
}));
"""
    )
    assert out["json"] == out["weights"] == {"ok": False, "name": "DownloadTooLarge"}
    assert out["refused"] == 2
    gib, mib = 1024**3, 1024**2
    assert out["kinds"] == [8 * gib, 8 * gib, 256 * mib]


def ceilings(text: str, pattern: str) -> dict[str, int]:
    units = {"MiB": 1024**2, "GiB": 1024**3}
    return {name: int(n) * units[u] for name, n, u in re.findall(pattern, text)}


def test_the_service_worker_and_the_test_build_name_the_same_ceilings() -> None:
    """The service worker takes each weights file's ceiling from its engine's
    declaration (`weights`, written into sw-build.js): the same numbers as
    web/engines/limits.js."""
    from napllm.providers.engine_specs import page_declarations

    product = ceilings(
        (ENGINES / "limits.js").read_text(), r"export const (\w+) = (\d+) \* (MiB|GiB);"
    )
    declared = {
        rule.get("suffix", rule.get("pattern")): rule["limit"]
        for d in page_declarations()
        for rule in d.get("weights", ())
    }
    hook = ceilings(
        (ROOT / "tests" / "hooks" / "engine-limits.js").read_text(),
        r"export const (\w+) = (\d+) \* (MiB|GiB);",
    )
    assert set(product) == {
        "MAX_GGUF_MODEL_BYTES",
        "MAX_ONNX_WEIGHTS_BYTES",
        "MAX_ONNX_OTHER_BYTES",
        "MAX_WEBLLM_FILE_BYTES",
    }
    assert declared == {
        ".gguf": product["MAX_GGUF_MODEL_BYTES"],
        ".onnx": product["MAX_ONNX_WEIGHTS_BYTES"],
        ".onnx_data": product["MAX_ONNX_WEIGHTS_BYTES"],
        "/params_shard_\\d+\\.bin$": product["MAX_WEBLLM_FILE_BYTES"],
    }
    assert "MiB" not in (ROOT / "web" / "sw-napllm.js").read_text()
    assert set(hook) == set(product)
    assert all(hook[k] < product[k] for k in product)


@needs_node
def test_the_service_worker_reads_each_weights_rule_from_the_build() -> None:
    """A file is a model of a kind only by a declared rule: its ceiling and magic."""
    out = run_service_worker(
        """
const sw = self.napllmSw;
console.log(JSON.stringify({
  gguf: sw.modelRule("https://h.example/m/Model.GGUF"),
  shard: sw.modelRule("https://h.example/m/params_shard_3.bin"),
  other: sw.modelRule("https://h.example/m/readme.txt"),
  kept: [sw.inModelCache("https://h.example/a.gguf"), sw.inModelCache("https://h.example/a.onnx")],
}));
""",
        build={
            "weights": [
                {"suffix": ".gguf", "limit": 7, "magic": "GGUF", "modelCache": True},
                {"pattern": "/params_shard_\\d+\\.bin$", "limit": 9},
                {"suffix": ".onnx", "limit": 0},
                {"pattern": "(", "limit": 5},
            ]
        },
    )
    assert out["gguf"] == {"magic": [0x47, 0x47, 0x55, 0x46], "limit": 7}
    assert out["shard"] == {"magic": [], "limit": 9}
    # No rule (a malformed one is left out): nothing passes.
    assert out["other"] == {"magic": [], "limit": 0}
    assert out["kept"] == [True, False]


def run_service_worker(body: str, build: dict[str, Any] | None = None) -> Any:
    """Run `body` after loading web/sw-napllm.js with stand-ins for the worker's globals.

    `build`: what sw-build.js would set (`self.NAPLLM_BUILD`)."""
    script = (
        f"globalThis.NAPLLM_BUILD = {json.dumps(build or {})};\n"
        """
globalThis.self = globalThis;
self.registration = { scope: "https://shell.test/" };
self.location = { origin: "https://shell.test" };
self.addEventListener = () => {};
globalThis.caches = { open: async () => ({ match: async () => undefined }), keys: async () => [] };
globalThis.clients = { matchAll: async () => [] };
""" + (ROOT / "web" / "sw-napllm.js").read_text() + "\n" + HELPERS + body
    )
    return run_module(script)


@needs_node
def test_the_service_worker_keeps_no_model_past_its_ceiling() -> None:
    out = run_service_worker(
        """
const gguf = (chunks, size, headers = {}) => {
  const { response, state } = answer(chunks, size, { "content-type": "application/octet-stream", ...headers });
  return { response, state };
};
const magic = (response) => new Response(
  new Blob([new Uint8Array([0x47, 0x47, 0x55, 0x46])]).stream().pipeThrough(new TransformStream({
    async flush(controller) {
      const reader = response.body.getReader();
      for (;;) { const { done, value } = await reader.read(); if (done) break; controller.enqueue(value); }
    },
  })),
  { status: 200, headers: response.headers },
);
const endless = gguf(Infinity, 4096);
const fits = gguf(4, 1000, { "content-length": "4004" });
const declared = gguf(4, 1000, { "content-length": "1000000" });
const verify = self.napllmSw.verifiedModel;
const GGUF = [0x47, 0x47, 0x55, 0x46];
const cut = verify(magic(endless.response), { magic: GGUF, limit: 50_000 });
const whole = verify(magic(fits.response), { magic: GGUF, limit: 50_000 });
const why = async (response) => {
  try { await response.arrayBuffer(); return "whole"; } catch (error) { return error.message; }
};
console.log(JSON.stringify({
  endless: await why(cut),
  fits: await read(whole),
  declaredOver: verify(declared.response, { magic: [], limit: 50_000 }) === null,
}));
"""
    )
    assert out["endless"] == "larger than the ceiling of its kind"
    assert out["fits"] == {"ok": True, "bytes": 4004}
    assert out["declaredOver"] is True
