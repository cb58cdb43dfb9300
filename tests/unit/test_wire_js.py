"""web/js/wire.js on values with shared references, as structured clone delivers them.

`toWireJson` runs on the shell's only thread for every message a napplet
posts. Structured clone keeps shared references, so a message of a few
hundred bytes can be a graph whose JSON text is exponential; the walk must
cost time in proportion to what was cloned, not to that text (see
docs/security.md, "Memory and work per napplet"). node runs the module as it
is; every value is passed through `structuredClone` first, as postMessage
would.
"""

from __future__ import annotations

import json
from pathlib import Path

from nodejs import needs_node, run_module

MODULE = Path(__file__).resolve().parents[2] / "web" / "js" / "wire.js"

pytestmark = needs_node

HOSTILE = """
import { toWireJson } from %s;
const shapes = [];
let d = "s"; for (let i = 0; i < 60; i++) d = [d, d];
shapes.push(d);
let o = 0; for (let i = 0; i < 60; i++) o = { a: o, b: o };
shapes.push(o);
const numbers = Array.from({ length: 1000 }, (_, i) => i);
shapes.push(Array(8400).fill(numbers));
const wide = {}; for (let i = 0; i < 1000; i++) wide["k" + i] = 0;
shapes.push(Array(2500).fill(wide));
const longNumbers = Array(1000).fill(-1.2345678901234567e-300);
shapes.push(Array(8000).fill(longNumbers));
const received = [];
for (let round = 0; round < 2; round++) {
  for (const shape of shapes) {
    received.push(structuredClone({ type: "llm.generate", id: "g", request: shape }));
  }
}
const t = performance.now();
const wires = received.map((data) => toWireJson(data));
const ms = performance.now() - t;
process.stdout.write(JSON.stringify({ ms, out: wires.map((w) => JSON.parse(w)) }));
"""


def test_a_message_sharing_references_costs_its_clone_not_its_json_text() -> None:
    # Each of these took 0.7 to 1.3 s (walked value by value up to the 8 MiB
    # budget); a frame's flood budget let a napplet post eight of them per
    # 10 s window, holding the shell's thread for as long.
    got = run_module(HOSTILE % json.dumps(MODULE.as_uri()))
    assert got["out"] == [{"tooLarge": True, "type": "llm.generate", "id": "g"}] * 10
    assert got["ms"] < 1000, got["ms"]


SHARED = """
import { toWireJson } from %s;
const cases = {};
const str = { type: "string" };
const schema = { type: "object", properties: { a: str, b: str, c: { type: "array", items: str } } };
const message = { role: "user", content: [{ type: "text", text: "hi" }] };
cases.shared = { type: "llm.generate", id: "g", request: { messages: [message, message],
  tools: [{ name: "t", parameters: schema }, { name: "u", parameters: schema }] } };
// A shared object met first near the top and again deep down: too deep there.
const leaf = { x: { y: {} } }; let deep = leaf; for (let i = 0; i < 125; i++) deep = { a: deep };
let chain = leaf; for (let i = 0; i < 3; i++) chain = { a: chain };
cases.deepAgain = { type: "llm.generate", id: "g", first: chain, then: deep };
const fits = { x: leaf };
let under = fits; for (let i = 0; i < 100; i++) under = { a: under };
cases.notTooDeep = { type: "llm.generate", id: "g", first: fits, then: under };
const cyc = { type: "llm.generate", id: "g", a: {} }; cyc.a.back = cyc; cyc.b = cyc.a;
cases.cycle = cyc;
// Many references to one string: counted each time.
cases.sharedString = { type: "llm.generate", id: "g", r: Array(9).fill("x".repeat(1024 * 1024)) };
const out = {};
for (const [name, value] of Object.entries(cases)) {
  const cloned = structuredClone(value);
  const json = name === "cycle" ? null : JSON.stringify(cloned);
  out[name] = { wire: JSON.parse(toWireJson(cloned)), json };
}
process.stdout.write(JSON.stringify(out));
"""


def test_shared_references_keep_their_verdicts() -> None:
    got = run_module(SHARED % json.dumps(MODULE.as_uri()))
    assert got["shared"]["wire"] == {"json": got["shared"]["json"]}
    assert got["notTooDeep"]["wire"] == {"json": got["notTooDeep"]["json"]}
    assert got["deepAgain"]["wire"] == {"tooLarge": True, "type": "llm.generate", "id": "g"}
    assert got["cycle"]["wire"] == {"unclonable": True, "type": "llm.generate", "id": "g"}
    assert got["sharedString"]["wire"] == {"tooLarge": True, "type": "llm.generate", "id": "g"}


BINARY = """
import { measureWire } from %s;
import { FloodMeter } from %s;
const MiB = 1024 * 1024;
const envelope = (request) => ({ type: "llm.generate", id: "g", request });
const shared = new ArrayBuffer(8 * MiB);
const cases = {
  small: envelope({ handle: "h" }),
  buffer: envelope(new ArrayBuffer(32 * MiB)),
  // a one-byte view carries its whole buffer
  view: envelope(new Uint8Array(new ArrayBuffer(32 * MiB), 0, 1)),
  dataView: envelope(new DataView(new ArrayBuffer(16 * MiB))),
  // one buffer under two views is cloned (and counted) once
  twoViews: envelope([new Uint8Array(shared), new Float64Array(shared)]),
  blob: envelope(new Blob([new Uint8Array(4 * MiB)])),
  // what follows a value JSON cannot carry, and what a Map or Set holds, still counts
  afterUndefined: envelope([undefined, "x".repeat(4 * MiB)]),
  map: envelope(new Map([["k", "x".repeat(4 * MiB)]])),
  set: envelope(new Set([new ArrayBuffer(4 * MiB)])),
};
const out = {};
for (const [name, value] of Object.entries(cases)) {
  const { wire, cost } = measureWire(structuredClone(value));
  out[name] = { wire: JSON.parse(wire), cost, wireLength: wire.length };
}
// 200 envelopes of 32 MiB each, metered as a frame's messages are
const meter = new FloodMeter();
out.stoppedAt = null;
for (let i = 0; i < 200; i++) {
  const { cost } = measureWire(structuredClone(envelope(new ArrayBuffer(32 * MiB))));
  if (!meter.spend(cost, 0)) { out.stoppedAt = i; break; }
}
process.stdout.write(JSON.stringify(out));
"""


def test_binary_payloads_cost_their_bytes() -> None:
    binding = MODULE.parent / "frame-binding.js"
    got = run_module(BINARY % (json.dumps(MODULE.as_uri()), json.dumps(binding.as_uri())))
    mib = 1024 * 1024
    marker = {"unclonable": True, "type": "llm.generate", "id": "g"}
    too_large = {"tooLarge": True, "type": "llm.generate", "id": "g"}
    assert got["small"]["cost"] == got["small"]["wireLength"]
    for name, least in (
        ("buffer", 32 * mib),
        ("view", 32 * mib),
        ("dataView", 16 * mib),
        ("twoViews", 8 * mib),
        ("blob", 4 * mib),
        ("afterUndefined", 4 * mib),
        ("map", 4 * mib),
        ("set", 4 * mib),
    ):
        assert got[name]["cost"] >= least, name
        # what is forwarded is still a small marker (the runtime answers
        # invalid-request, or quota-exceeded past the wire bound)
        assert got[name]["wire"] in (marker, too_large), name
    assert got["twoViews"]["cost"] < 16 * mib
    # the flood bound (64 Mi units per window) stops the frame at its third
    assert got["stoppedAt"] == 2


REFUSALS = """
import { refusalWithoutLlm, toWireJson } from %s;
const wire = (value) => toWireJson(structuredClone(value));
const out = {
  select: refusalWithoutLlm(wire({ type: "llm.select", id: "s1" })),
  generate: refusalWithoutLlm(wire({ type: "llm.generate", id: "g1", request: { any: "thing" } })),
  marker: refusalWithoutLlm(wire({ type: "llm.describe", id: "d1", handle: new Map() })),
  tooLarge: refusalWithoutLlm(wire({ type: "llm.cancel", id: "c1",
    requestId: "x".repeat(9 * 1024 * 1024) })),
  unknown: refusalWithoutLlm(wire({ type: "llm.other", id: "u1" })),
  result: refusalWithoutLlm(wire({ type: "llm.select.result", id: "r1" })),
  noId: refusalWithoutLlm(wire({ type: "llm.select" })),
  longId: refusalWithoutLlm(wire({ type: "llm.select", id: "i".repeat(257) })),
  loneSurrogate: refusalWithoutLlm(wire({ type: "llm.select", id: "\\ud800" })),
  notAnObject: refusalWithoutLlm(wire(["llm.select"])),
};
process.stdout.write(JSON.stringify(out));
"""


def test_without_llm_each_request_gets_unsupported_and_nothing_else_an_answer() -> None:
    got = run_module(REFUSALS % json.dumps(MODULE.as_uri()))
    error = {"code": "unsupported", "message": "The llm domain is not available to this napplet."}
    assert got["select"] == {"type": "llm.select.result", "id": "s1", "error": error}
    assert got["generate"] == {"type": "llm.generate.result", "id": "g1", "error": error}
    assert got["marker"] == {"type": "llm.describe.result", "id": "d1", "error": error}
    assert got["tooLarge"] == {"type": "llm.cancel.result", "id": "c1", "error": error}
    for name in ("unknown", "result", "noId", "longId", "loneSurrogate", "notAnObject"):
        assert got[name] is None, name


MEDIA = """
// Stand-ins for the serializable platform objects node lacks; the module
// looks them up when a message arrives, as the page's realm has them.
const stub = (name, fields) => {
  globalThis[name] = { [name]: class {
    constructor(...values) { fields.forEach((field, i) => { this[field] = values[i]; }); }
  } }[name];
};
stub("ImageBitmap", ["width", "height"]);
stub("VideoFrame", ["codedWidth", "codedHeight"]);
stub("AudioData", ["numberOfFrames", "numberOfChannels"]);
globalThis.FileList = class FileList {
  constructor(files) { files.forEach((f, i) => { this[i] = f; }); this.length = files.length; }
};
const { measureWire } = await import(%s);
const { FloodMeter } = await import(%s);
const MiB = 1024 * 1024;
const envelope = (request) => ({ type: "llm.generate", id: "g", request });
const big = new Blob([new Uint8Array(MiB)]);
const cases = {
  bitmap: envelope(new ImageBitmap(4096, 4096)),
  video: envelope([new VideoFrame(4096, 2048)]),
  audio: envelope({ a: new AudioData(MiB, 8) }),
  files: envelope(new FileList([new Blob(Array(64).fill(big))])),
  // a closed frame reads as empty; nothing it says makes the walk throw
  closed: envelope(new VideoFrame(NaN, -1)),
};
const out = {};
for (const [name, value] of Object.entries(cases)) out[name] = measureWire(value).cost;
// 4000 one-GiB bitmaps, metered as a frame's messages are:
// the frame stops at the first after the budget
const meter = new FloodMeter();
out.stoppedAt = null;
for (let i = 0; i < 4000; i++) {
  const { cost } = measureWire(envelope(new ImageBitmap(16384, 16384)));
  if (!meter.spend(cost, 0)) { out.stoppedAt = i; break; }
}
process.stdout.write(JSON.stringify(out));
"""


def test_pixels_and_samples_cost_their_bytes() -> None:
    # An ImageBitmap is copied whole by structured clone (16384 x 16384 is
    # 1 GiB); counted as an opaque object, thousands fit in one window.
    binding = MODULE.parent / "frame-binding.js"
    got = run_module(MEDIA % (json.dumps(MODULE.as_uri()), json.dumps(binding.as_uri())))
    mib = 1024 * 1024
    assert got["bitmap"] >= 64 * mib
    assert got["video"] >= 32 * mib
    assert got["audio"] >= 32 * mib
    assert got["files"] >= 64 * mib
    assert got["closed"] < 1024
    assert got["stoppedAt"] == 1


RESIZABLE = """
const { measureWire } = await import(%s);
const GiB = 1024 * 1024 * 1024;
const envelope = (request) => ({ type: "llm.generate", id: "g", request });
// What the shell receives: structured clone keeps a buffer resizable, and
// the receiving realm reserves its maximum (node cannot clone one, so the
// received value is built here).
const empty = new ArrayBuffer(0, { maxByteLength: 2 * GiB });
const out = {
  empty: measureWire(envelope(empty)).cost,
  view: measureWire(envelope(new Uint8Array(new ArrayBuffer(16, { maxByteLength: GiB })))).cost,
  plain: measureWire(envelope(new ArrayBuffer(16))).cost,
};
process.stdout.write(JSON.stringify(out));
"""


def test_a_resizable_buffer_costs_its_maximum_length() -> None:
    # In Chromium 400 clones of an empty buffer with an 8 GiB maximum made
    # every later WebAssembly.Memory allocation of the page fail; each was
    # metered at its length, 0.
    got = run_module(RESIZABLE % json.dumps(MODULE.as_uri()))
    gib = 1024 * 1024 * 1024
    assert got["empty"] >= 2 * gib
    assert got["view"] >= gib
    assert got["plain"] < 1024


LARGE_MAPS = """
const { measureWire } = await import(%s);
const envelope = (request) => ({ type: "llm.generate", id: "g", request });
// A Map or Set of a hundred million entries, as a received one would be,
// without node building it: its size is what the walk may read; the
// entries it lists (a million at most here) are counted.
const listed = { map: 0, set: 0 };
class BigMap extends Map {
  get size() { return 1e8; }
  *[Symbol.iterator]() { while (listed.map < 1e6) { listed.map += 1; yield [listed.map, 0]; } }
}
class BigSet extends Set {
  get size() { return 1e8; }
  *[Symbol.iterator]() { while (listed.set < 1e6) { listed.set += 1; yield listed.set; } }
  *values() { yield* this[Symbol.iterator](); }
}
const map = measureWire(envelope(new BigMap()));
const set = measureWire(envelope(new BigSet()));
process.stdout.write(JSON.stringify({ map, set, listed }));
"""


def test_a_map_or_set_over_the_wire_bound_is_refused_before_its_entries_are_listed() -> None:
    # Listing the entries first made an array twice the Map's size in the
    # shell before the bound was checked.
    got = run_module(LARGE_MAPS % json.dumps(MODULE.as_uri()))
    assert got["listed"] == {"map": 0, "set": 0}
    for name in ("map", "set"):
        assert json.loads(got[name]["wire"]).get("tooLarge") is True
        assert got[name]["cost"] >= 10**8
