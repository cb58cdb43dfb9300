"""The envelope inspector's memory bound (web/js/inspector.js), run in node.

The page's inspector keeps what napplets send; whatever they send, what it
holds stays within `MAX_STORED_CHARS` plus a small amount per entry, with
the panel collapsed (labels and shown text derived lazily) or open.
"""

# ruff: noqa: E501  (the JavaScript embedded below keeps its natural line length)

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from nodejs import needs_node, run_module

ROOT = Path(__file__).resolve().parents[2]
INSPECTOR = ROOT / "web" / "js" / "inspector.js"

pytestmark = needs_node

# A stand-in for the few DOM pieces the inspector touches (the panel collapsed).
FAKE_DOM = """
globalThis.Option = class { constructor(text, value) { this.text = text; this.value = value; } };
const element = () => ({ value: "", textContent: "", addEventListener() {}, replaceChildren() {}, add() {} });
const found = {};
const root = { querySelector: (s) => (found[s] ??= element()), closest: () => ({ open: false, addEventListener() {} }) };
"""


def run_node(body: str) -> Any:
    script = (
        f"{FAKE_DOM}\nconst inspector = await import({json.dumps(INSPECTOR.as_uri())});\n{body}\n"
    )
    return run_module(script, timeout=120)


HELD = """
const held = (ins) => ins.entries.reduce((sum, e) => sum + e.json.length + e.text.length + e.label.length + (e.runtimeJson ? e.runtimeJson.length : 0), 0);
"""


@pytest.mark.parametrize(
    "envelope",
    [
        # A huge `type`: the label is the envelope's type.
        "JSON.stringify({ json: JSON.stringify({ type: 'x'.repeat(200000), id: '1' }) })",
        # The same in a marker of a message that could not be cloned.
        "JSON.stringify({ unclonable: true, type: 'y'.repeat(200000), id: '1' })",
        "JSON.stringify({ tooLarge: true, type: 'z'.repeat(200000), id: '1' })",
    ],
)
def test_labels_count_against_the_bound(envelope: str) -> None:
    """500 entries whose label alone would be 200 Ki each stay within the bound."""
    out = run_node(
        HELD
        + f"""
const ins = new inspector.Inspector(root, (id) => id);
const wire = {envelope};
for (let i = 0; i < 500; i += 1) ins.record("ep-1", "in", wire);
console.log(JSON.stringify({{ held: held(ins), bound: inspector.MAX_STORED_CHARS, entries: ins.entries.length, label: ins.entries[0].label.length }}));
"""
    )
    assert out["entries"] > 0
    assert out["label"] <= 200
    assert out["held"] <= out["bound"] + 200 * out["entries"]


def held_bytes(size: int, direction: str, type_name: str) -> Any:
    """JS heap (bytes, after a full GC) once 100 envelopes of `size` characters were recorded."""
    script = (
        f"{FAKE_DOM}\n"
        f"const inspector = await import({json.dumps(INSPECTOR.as_uri())});\n"
        f"""
const ins = new inspector.Inspector(root, (id) => id);
globalThis.gc();
const before = process.memoryUsage().heapUsed;
for (let i = 0; i < 100; i += 1) {{
  const envelope = JSON.stringify({{ type: {json.dumps(type_name)}, id: String(i), pad: String(i).repeat({size}) }});
  ins.record("ep-1", {json.dumps(direction)}, {json.dumps(direction)} === "in" ? JSON.stringify({{ json: envelope }}) : envelope);
}}
for (const entry of ins.entries) entry.label;
globalThis.gc();
console.log(JSON.stringify({{ grown: process.memoryUsage().heapUsed - before, entries: ins.entries.length }}));
"""
    )
    return run_module(script, node_options=("--expose-gc",), timeout=120)


@pytest.mark.parametrize(("size", "limit"), [(250_000, 12_000_000), (1_000_000, 32_000_000)])
@pytest.mark.parametrize("direction", ["in", "out"])
def test_no_entry_keeps_the_uncut_text_alive(size: int, limit: int, direction: str) -> None:
    """A kept text cut from a long one must not hold the long one (a V8 slice does).

    100 envelopes of 250 K characters (parsed for display) or 1 M (not
    parsed): what stays is bounded by MAX_STORED_CHARS (2 Mi code units, at
    most 4 MB, and the objects around them), not the ~63 uncut texts the
    bound keeps entries for (16 MB, 63 MB and more).
    """
    out = held_bytes(size, direction, "llm.generate.with.a.long.type.name")
    assert out["entries"] > 0
    assert out["grown"] < limit


def test_a_shown_entry_is_never_indented_far_beyond_its_text() -> None:
    """Arrays nested 128 deep (the wire's limit) would indent 14 Ki into ~900 Ki."""
    out = run_node(
        """
let value = Array(7000).fill(0);
for (let i = 0; i < 126; i += 1) value = [value];
const deep = JSON.stringify(value);
const plain = JSON.stringify({ type: "llm.generate", id: "1", request: { messages: [{ role: "user", content: "hi" }] } });
console.log(JSON.stringify({ deep: deep.length, shown: inspector.pretty(deep).length, plain: inspector.pretty(plain) }));
"""
    )
    assert out["shown"] <= 4 * out["deep"] + 1024
    assert "\n" in out["plain"]  # ordinary envelopes are still pretty-printed


def test_entries_dropped_by_the_bound_are_not_kept_for_joins() -> None:
    """20 endpoints x 64 envelopes of 15 K: what stays is the bound, not every endpoint's last 64."""
    script = (
        f"{FAKE_DOM}\n"
        f"const inspector = await import({json.dumps(INSPECTOR.as_uri())});\n"
        """
const ins = new inspector.Inspector(root, (id) => id);
globalThis.gc();
const before = process.memoryUsage().heapUsed;
for (let ep = 0; ep < 20; ep += 1) {
  for (let i = 0; i < 64; i += 1) {
    const envelope = JSON.stringify({ type: "llm.delta", requestId: "g", sequence: i, text: `${ep}-${i}-`.padEnd(15000, "x") });
    ins.record(`ep-${ep}`, i % 2 ? "out" : "in", i % 2 ? envelope : JSON.stringify({ json: envelope }));
  }
}
globalThis.gc();
console.log(JSON.stringify({ grown: process.memoryUsage().heapUsed - before, entries: ins.entries.length }));
"""
    )
    out = run_module(script, node_options=("--expose-gc",), timeout=120)
    assert out["entries"] > 0
    assert out["grown"] < 10_000_000


# The panel's document as an EventTarget (node has EventTarget and CustomEvent).
ANNOUNCING_ROOT = """
const doc = new EventTarget();
const announced = [];
const listen = (d) => {
  d.addEventListener(inspector.LISTEN_EVENT, (event) => event.preventDefault());
  d.addEventListener(inspector.ENTRY_EVENT, (event) => announced.push(event.detail));
};
const rootIn = (d) => ({ ...root, ownerDocument: d });
"""


def test_every_entry_is_announced_before_the_bounds_drop_or_forget_it() -> None:
    """A listener gets every entry, numbered without a gap, whatever the panel keeps.

    600 entries are more than the 500 kept, a closed endpoint's entries are
    forgotten (and its late envelopes are not listed), yet each one is
    announced once, uncut, in order (what napllm-check relies on).
    """
    out = run_node(
        ANNOUNCING_ROOT
        + """
listen(doc);
const ins = new inspector.Inspector(rootIn(doc), (id) => id);
const dup = JSON.stringify({ json: JSON.stringify({ type: "llm.describe", id: "dup", handle: "h" }) });
ins.record("ep-1", "in", dup);
ins.record("ep-1", "in", dup);
for (let i = 0; i < 600; i += 1) ins.record("ep-1", "in", JSON.stringify({ json: JSON.stringify({ type: "llm.describe", id: `f-${i}`, handle: "h" }) }));
const long = "x".repeat(inspector.MAX_ENTRY_CHARS * 3);
ins.record("ep-2", "out", long);
ins.forgetEndpoint("ep-2");
ins.record("ep-2", "in", "late");
ins.recordFromRuntime("ep-1", "note", "a note");
console.log(JSON.stringify({
  kept: ins.entries.length,
  serials: announced.map((d) => d.serial),
  first: announced[0], second: announced[1],
  longLength: announced[602].text.length,
  late: announced[603], note: announced[604],
}));
"""
    )
    assert out["kept"] == 500
    assert out["serials"] == list(range(1, 606))
    assert out["first"]["text"] == out["second"]["text"]  # identical envelopes both announced
    assert out["first"]["endpoint"] == "ep-1" and out["first"]["direction"] == "in"
    assert out["longLength"] == 16 * 1024 * 3  # the text as recorded, not the cut one
    assert out["late"] == {"serial": 604, "endpoint": "ep-2", "direction": "in", "text": "late"}
    assert out["note"]["direction"] == "note"


def test_nothing_is_announced_without_a_listener() -> None:
    """No listener (the shell in normal use): no entry event is made or dispatched."""
    out = run_node(
        ANNOUNCING_ROOT
        + """
let made = 0;
const Original = globalThis.CustomEvent;
globalThis.CustomEvent = class extends Original { constructor(...a) { super(...a); made += 1; } };
doc.addEventListener(inspector.ENTRY_EVENT, (event) => announced.push(event.detail));
const ins = new inspector.Inspector(rootIn(doc), (id) => id);
const madeAtStart = made;
for (let i = 0; i < 100; i += 1) ins.record("ep-1", "out", `{"type":"llm.delta","n":${i}}`);
console.log(JSON.stringify({ announcing: ins.announcing, madeAtStart, made, announced: announced.length }));
"""
    )
    # The one event made is the inspector's question (nobody answered it).
    assert out == {"announcing": False, "madeAtStart": 1, "made": 1, "announced": 0}
