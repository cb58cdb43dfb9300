"""The shell's side of Python napplets (web/js/python-files.js) and the loader's
inline text (web/js/python-loader.js), run in node.

- A start is accepted only with the frame's Python secret, once per bound
  document.
- Only the manifest's files are handed over, each with the manifest's sha256
  (a file whose bytes differ is refused and not kept), each name once per
  channel, and a channel is closed after `MAX_REQUESTS` requests.
- The loader's inline text cannot be ended early by a package name.
"""

# ruff: noqa: E501  (the JavaScript embedded below keeps its natural line length)

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

from nodejs import needs_node, run_module

ROOT = Path(__file__).resolve().parents[2]
WEB_JS = ROOT / "web" / "js"

pytestmark = needs_node

GOOD = b"the wasm bytes"
#: napplet-page.js imports the generated Prompt API bundle; python-files.js
#: needs only its sha256Hex, given here (same contract: hex sha256 of a buffer).
NAPPLET_PAGE_STUB = """
export async function sha256Hex(bytes) {
  const digest = new Uint8Array(await crypto.subtle.digest("SHA-256", bytes));
  return Array.from(digest, (b) => b.toString(16).padStart(2, "0")).join("");
}
"""


def run_node(tmp_path: Path, body: str) -> Any:
    for name in ("python-files.js", "python-loader.js"):
        shutil.copy(WEB_JS / name, tmp_path / name)
    (tmp_path / "napplet-page.js").write_text(NAPPLET_PAGE_STUB, encoding="utf-8")
    manifest = {
        "files": {
            "pyodide.asm.wasm": hashlib.sha256(GOOD).hexdigest(),
            "tampered.whl": hashlib.sha256(b"what the build pinned").hexdigest(),
        },
        "lock": {"info": {}, "packages": {"napllm": {"file_name": "napllm.whl"}}},
    }
    script = f"""
const manifest = {json.dumps(manifest)};
const fetched = [];
globalThis.fetch = async (url) => {{
  const path = new URL(url).pathname;
  fetched.push(path);
  if (path.endsWith("napplet-files.json")) return new Response(JSON.stringify(manifest));
  if (path.endsWith("pyodide.asm.wasm")) return new Response({json.dumps(GOOD.decode())});
  if (path.endsWith("tampered.whl")) return new Response("something else");
  return new Response("", {{ status: 404 }});
}};
const files = await import({json.dumps((tmp_path / "python-files.js").as_uri())});
const loader = await import({json.dumps((tmp_path / "python-loader.js").as_uri())});
// A port stand-in: what the shell posts, whether it closed, and a way to ask.
const channel = () => {{
  const port = {{ sent: [], closed: false, postMessage(m) {{ this.sent.push(m); }}, close() {{ this.closed = true; }} }};
  port.ask = async (name) => {{ if (port.onmessage) await port.onmessage({{ data: {{ name }} }}); }};  // a closed port answers nothing
  return port;
}};
const settle = () => new Promise((r) => setTimeout(r, 10));
{body}
"""
    return run_module(script, timeout=60)


def test_a_start_needs_the_frames_secret_a_bound_document_and_happens_once(tmp_path: Path) -> None:
    got = run_node(
        tmp_path,
        """
const shell = new files.PythonFiles("http://shell.test/index.html");
const start = (frame, secret) => {
  const port = channel();
  shell.start(frame, { data: { type: files.PYTHON_START, secret }, ports: [port] });
  return port.onmessage !== undefined;
};
const doc = () => ({ live: true, pythonPort: null });
const frame = { pythonSecret: "s3cret", doc: doc() };
console.log(JSON.stringify({
  wrongSecret: start(frame, "guess"),
  notPython: start({ pythonSecret: null, doc: doc() }, null),
  noDocument: start({ pythonSecret: "s3cret", doc: null }, "s3cret"),
  closedDocument: start({ pythonSecret: "s3cret", doc: { live: false, pythonPort: null } }, "s3cret"),
  first: start(frame, "s3cret"),
  second: start(frame, "s3cret"),
}));
""",
    )
    assert got == {
        "wrongSecret": False,
        "notPython": False,
        "noDocument": False,
        "closedDocument": False,
        "first": True,
        "second": False,
    }


def test_only_manifest_files_with_their_sha256_are_handed_over_once_per_channel(
    tmp_path: Path,
) -> None:
    got = run_node(
        tmp_path,
        """
const shell = new files.PythonFiles("http://shell.test/index.html");
const port = channel();
shell.serve(port);
for (const name of ["pyodide.asm.wasm", "pyodide.asm.wasm", "tampered.whl", "../index.html", loader.PYTHON_LOCK]) await port.ask(name);
await port.onmessage({ data: "not a request" });
const other = channel();
shell.serve(other);
await other.ask("pyodide.asm.wasm");
await other.ask("tampered.whl");
const text = (m) => m.bytes ? new TextDecoder().decode(m.bytes) : null;
const flood = channel();
shell.serve(flood);
for (let i = 0; i < files.MAX_REQUESTS + 5; i += 1) await flood.ask(`junk-${i}`);
console.log(JSON.stringify({
  answers: port.sent.map((m) => [m.name, text(m), m.error || null]),
  other: other.sent.map((m) => [m.name, text(m), m.error || null]),
  fetched,
  flood: { answered: flood.sent.length, closed: flood.closed },
}));
""",
    )
    assert got["answers"] == [
        ["pyodide.asm.wasm", GOOD.decode(), None],
        ["tampered.whl", None, "its sha256 differs from the build's"],
        ["../index.html", None, "not a file the shell hands to napplets"],
        [
            "pyodide-lock.json",
            json.dumps(
                {"info": {}, "packages": {"napllm": {"file_name": "napllm.whl"}}},
                separators=(",", ":"),
            ),
            None,
        ],
    ]
    # Another frame gets the kept copy; the refused file is fetched again, never kept.
    assert got["other"][0] == ["pyodide.asm.wasm", GOOD.decode(), None]
    assert got["other"][1][2] == "its sha256 differs from the build's"
    assert got["fetched"].count("/pyodide/pyodide.asm.wasm") == 1
    assert got["fetched"].count("/pyodide/tampered.whl") == 2
    assert got["fetched"].count("/pyodide/napplet-files.json") == 1
    assert got["flood"] == {"answered": 64, "closed": True}


def test_the_loaders_inline_text_cannot_be_ended_by_a_package_name(tmp_path: Path) -> None:
    got = run_node(
        tmp_path,
        """
const names = ["</script><script>alert(1)</script>", "<!--", "tabulate"];
const text = loader.pythonLoaderSource("ab12", names);
const args = JSON.parse(text.slice(text.lastIndexOf(".apply(null, ") + 13, -2));
console.log(JSON.stringify({ endTag: /<\\/script/i.test(text), comment: text.includes("<!--"), args }));
""",
    )
    assert got["endTag"] is False and got["comment"] is False
    assert got["args"][0] == "ab12"
    assert got["args"][1] == ["</script><script>alert(1)</script>", "<!--", "tabulate"]
