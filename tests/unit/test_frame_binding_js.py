"""The page's frame binding as state and tables (web/js/frame-binding.js), run in node.

A frame's documents and loads move only as their tables allow: a late
answer is refused by the table, not caught by a counter; envelopes posted
to the shell's window wait for a ping sent after they arrived; a load that
nobody reports ends as `unreported`.
"""

# ruff: noqa: E501  (the JavaScript embedded below keeps its natural line length)

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from nodejs import needs_node, run_module

ROOT = Path(__file__).resolve().parents[2]
BINDING = ROOT / "web" / "js" / "frame-binding.js"

pytestmark = needs_node

# MessagePort stand-ins that record what the binding posts and whether it closed them.
PORTS = """
const port = () => ({ sent: [], closed: false, postMessage(m) { this.sent.push(m); }, close() { this.closed = true; } });
const frame = () => new b.FrameBinding({ tab: {}, iframe: { contentWindow: {} }, llm: true, secret: "s" });
"""


def run_node(body: str) -> Any:
    script = f"const b = await import({json.dumps(BINDING.as_uri())});\n{PORTS}\n{body}\n"
    return run_module(script, timeout=120)


def test_a_replaced_document_refuses_its_late_endpoint_and_closes_its_ports() -> None:
    got = run_node(
        """
const f = frame();
const first = f.start(port(), port(), 0).doc;
const opening = first.move("open");
const second = f.start(port(), port(), 1);
console.log(JSON.stringify({
  opening, frame: f.state, previousIsFirst: second.previous === first,
  first: first.state, closedBy: first.closedBy, portsClosed: first.port.closed && first.control.closed,
  late: first.opened("ep-1"), endpoint: first.endpointId, current: f.doc.state,
}));
"""
    )
    assert got == {
        "opening": True,
        "frame": "bound",
        "previousIsFirst": True,
        "first": "closed",
        "closedBy": "replaced",
        "portsClosed": True,
        "late": None,
        "endpoint": None,
        "current": "bound",
    }


def test_posted_envelopes_wait_for_a_ping_sent_after_them() -> None:
    got = run_node(
        """
const f = frame();
const doc = f.start(port(), port(), 0).doc;
const released = [];
doc.hold("a");             // ping 1 sent
doc.hold("b");             // ping 1 in flight: waits for ping 2
doc.pong(1, (w) => released.push(w));
const afterFirst = [...released];
doc.pong(2, (w) => released.push(w));
console.log(JSON.stringify({ afterFirst, released, pings: doc.control.sent }));
"""
    )
    assert got == {"afterFirst": ["a"], "released": ["a", "b"], "pings": [{"ping": 1}, {"ping": 2}]}


def test_an_unreported_load_ends_unreported_and_a_stopped_frame_stays_stopped() -> None:
    got = run_node(
        """
const f = frame();
const first = f.loadEvent();
const missing = f.graceOver(first).next;          // no document ever started
const doc = f.start(port(), port(), 0).doc;
f.report(doc);
const reported = f.graceOver(first).next;         // the report settled it
const second = f.loadEvent();
const asked = f.graceOver(second);                // the bound document is asked
const answered = f.answerDue(second, asked.doc, asked.ping);
const state = f.loads.get(second);
const stopped = f.move("navigatedAway");
console.log(JSON.stringify({
  missing, reported, ask: asked.next, answered, state, stopped, frame: f.state,
  doc: doc.state, again: f.move("documentStart"), table: b.transition(b.LOAD_TRANSITIONS, "reported", "graceOver"),
}));
"""
    )
    assert got == {
        "missing": "preludeMissing",
        "reported": "settled",
        "ask": "ask",
        "answered": False,
        "state": "unreported",
        "stopped": True,
        "frame": "stopped",
        "doc": "closed",
        "again": False,
        "table": None,
    }
