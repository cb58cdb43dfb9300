"""The shell's side of a Python napplet's private file channel
(web/js/python-files.js), run in node against the built module.

The port is no secret from the napplet's own code (it reaches it through
the loader's fetch shim, or a getter on `MessageEvent.prototype`), so the
channel must stay cheap for the shell whatever is posted on it: only names
of the manifest are served, a name is never kept or echoed beyond
`MAX_NAME_CHARS`, and every message counts toward `MAX_REQUESTS`.
"""

# ruff: noqa: E501  (the JavaScript embedded below keeps its natural line length)

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from nodejs import needs_node, run_module

ROOT = Path(__file__).resolve().parents[2]
MODULE = ROOT / "dist" / "js" / "python-files.js"

pytestmark = needs_node

SETUP = """
const files = new m.PythonFiles("https://shell.example/index.html");
const fetched = [];
files.loadManifest = async () => ({ files: { "pyodide.mjs": "0" }, lock: { packages: {} } });
files.fetchVerified = async (name) => { fetched.push(name); return new ArrayBuffer(4); };
const channel = () => {
  const port = { sent: [], closed: false, postMessage(message) { this.sent.push(message); }, close() { this.closed = true; } };
  files.serve(port);
  port.send = async (data) => { if (port.onmessage) await port.onmessage({ data }); };
  return port;
};
"""


def run_node(body: str) -> Any:
    if not MODULE.is_file():
        pytest.skip("dist/ is not built (python3 build.py build)")
    script = f"const m = await import({json.dumps(MODULE.as_uri())});\n{SETUP}\n{body}\n"
    return run_module(script, timeout=120)


def test_the_channel_serves_only_manifest_names_whatever_the_path_tricks() -> None:
    got = run_node(
        """
const port = channel();
const tricks = ["../index.html", "%2e%2e/index.html", "..%2findex.html", "__proto__", "constructor", "hasOwnProperty",
  "pyodide.mjs/../sw.js", "./pyodide.mjs", "PYODIDE.MJS", "pyodide.mjs\\u0000", "https://evil.example/pyodide.mjs", ""];
for (const name of tricks) await port.send({ name });
await port.send({ name: "pyodide.mjs" });
console.log(JSON.stringify({
  answers: port.sent.map((m) => [m.name, m.bytes ? "bytes" : "error"]), fetched, closed: port.closed,
}));
"""
    )
    assert got["fetched"] == ["pyodide.mjs"]
    assert got["answers"][-1] == ["pyodide.mjs", "bytes"]
    assert all(kind == "error" for _, kind in got["answers"][:-1])
    assert got["closed"] is False


def test_a_huge_name_is_neither_kept_nor_echoed_and_every_message_counts() -> None:
    """Before: a napplet's `fetch(base + "a".repeat(2 ** 28))` made the shell keep
    the name (64 of them per document) and post it back; the same name posted
    again and again was never counted, so the channel was an unmetered flood."""
    got = run_node(
        """
const huge = channel();
await huge.send({ name: "a".repeat(1 << 20) });
await huge.send({ name: "pyodide.mjs" });
const repeated = channel();
for (let i = 0; i < m.MAX_REQUESTS + 1; i += 1) await repeated.send({ name: "pyodide.mjs" });
const junk = channel();
for (let i = 0; i < m.MAX_REQUESTS + 1; i += 1) await junk.send(i % 2 ? null : { name: 7 });
console.log(JSON.stringify({
  longest: Math.max(0, ...huge.sent.map((msg) => String(msg.name).length)),
  huge: huge.sent.map((msg) => String(msg.name).slice(0, 20)),
  repeated: { answers: repeated.sent.length, closed: repeated.closed },
  junk: { answers: junk.sent.length, closed: junk.closed },
}));
"""
    )
    assert got["longest"] <= 128
    assert got["huge"] == ["pyodide.mjs"]
    assert got["repeated"] == {"answers": 1, "closed": True}
    assert got["junk"] == {"answers": 0, "closed": True}
