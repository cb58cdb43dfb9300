"""The host page (web/) against a test double of the Python runtime.

The double replaces only what Python would provide: ``pyodide/pyodide.mjs``
is answered (by ``page.route``) with a module whose ``runPythonAsync`` calls
``napllmHost.attachRuntime`` with a recording runtime API defined here by
``page.add_init_script``. Everything else is the real page from dist/, in
offline Chromium. The double lives in this file only, never in web/.

Checked: frames (sandbox, CSP, prelude presence, sender binding, endpoint
lifecycle, queueing before attach), the wireJson conversion, the prelude's
correlation rules, the chooser and consent dialogs (keyboard, focus, queue,
text-only insertion), the inspector, the connections panel, profiles,
storage, the boot error panel and the example napplets' flows.
"""

# ruff: noqa: E501  (the JavaScript embedded below keeps its natural line length)

from __future__ import annotations

import hashlib
import http.server
import json
import threading
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import quote

import pytest

from napllm.kinds import catalogue

pytestmark = pytest.mark.browser

TestPage = Callable[[str, str], str]
Page = Any

TIMEOUT_MS = 20_000

#: pyodide.mjs stand-in: "boots" and attaches the double (unless held).
FAKE_PYODIDE = """
export async function loadPyodide() {
  const fake = window.__fake;
  return {
    async loadPackage() {},
    async runPythonAsync() {
      if (fake.bootError) throw new Error(fake.bootError);
      fake.booted = true;
      if (!fake.hold) fake.attach();
    },
  };
}
"""

#: The recording runtime API (the Python side of the bridge) and helpers.
FAKE_RUNTIME = """
(() => {
  const params = new URLSearchParams(location.search);
  const fake = {
    hold: params.get('hold') === '1',
    bootError: params.get('bootError'),
    booted: false,
    attached: false,
    calls: [],
    received: [],
    endpoints: {},
    closed: [],
    nextId: 0,
    // Optional scripted answers: (endpointId, envelope) => void.
    responder: null,
    // Lists the runtime pushes right after attaching (as the real one does).
    pushOnAttach: null,
    attach() {
      fake.attached = true;
      // The runtime's own kind table (napllm.kinds.catalogue), as the real runtime publishes it.
      window.napllmHost.connectionKinds(__KINDS__);
      window.napllmHost.attachRuntime(fake.api);
      if (fake.pushOnAttach) {
        window.napllmHost.connectionsChanged(fake.pushOnAttach.connections);
        window.napllmHost.grantsChanged(fake.pushOnAttach.grants);
      }
    },
    log(...entry) { fake.calls.push(entry); },
    envelopes(endpointId) {
      return fake.received
        .filter(([id]) => endpointId === undefined || id === endpointId)
        .map(([, wire]) => JSON.parse(wire));
    },
    live() {
      return Object.keys(fake.endpoints).filter((id) => !fake.closed.includes(id));
    },
    post(endpointId, envelope) {
      window.napllmHost.postAll(JSON.stringify([[endpointId, envelope]]));
    },
  };
  fake.api = {
    openEndpoint(identity) {
      const id = 'ep' + (fake.nextId += 1);
      fake.endpoints[id] = JSON.parse(identity);
      fake.log('openEndpoint', id, identity);
      return id;
    },
    closeEndpoint(id) { fake.closed.push(id); fake.log('closeEndpoint', id); },
    receive(id, wire) {
      fake.received.push([id, wire]);
      if (fake.responder) {
        const outer = JSON.parse(wire);
        if (typeof outer.json === 'string') fake.responder(id, JSON.parse(outer.json));
      }
    },
    switchAccount(name) { fake.log('switchAccount', name); },
    addConnection(json) { fake.log('addConnection', json); return Promise.resolve('{}'); },
    editConnection(id, json) { fake.log('editConnection', id, json); return Promise.resolve('{}'); },
    removeConnection(id) { fake.log('removeConnection', id); return Promise.resolve(); },
    listConnections() { return JSON.stringify([{id: 'stale', name: 'Stale list', kind: 'lmsp', model: 'm', route: 'r'}]); },
    revokeGrant(key) { fake.log('revokeGrant', key); },
    listGrants() { return JSON.stringify([{key: 'stale', napplet: {name: 'old', shortHash: '0'}, connectionId: 'stale', connectionName: '', account: 'Default'}]); },
  };
  window.__fake = fake;
})();
""".replace("__KINDS__", json.dumps(json.dumps(catalogue())))

#: A napplet for frame tests: reports what it sees through window globals.
PROBE_NAPPLET = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Probe</title></head>
<body><h1 id="title">Probe napplet</h1>
<script>
window.report = {
  hasNapplet: 'napplet' in window,
  hasLlm: !!(window.napplet && window.napplet.llm),
  frozen: Object.isFrozen(window.napplet),
  compat: document.compatMode,
};
</script></body></html>
"""


@pytest.fixture(scope="session")
def browser_context_args(browser_context_args: dict[str, Any]) -> dict[str, Any]:
    """No service worker: it would answer pyodide.mjs before the double's route."""
    return {**browser_context_args, "service_workers": "block"}


@pytest.fixture
def shell(page: Page, request_log: Any, test_page: TestPage, base_url: str) -> Iterator[Any]:
    """Open the host page with the runtime double; ``shell.goto(query)``."""
    page.set_default_timeout(TIMEOUT_MS)
    page.route(
        "**/pyodide/pyodide.mjs",
        lambda route: route.fulfill(status=200, content_type="text/javascript", body=FAKE_PYODIDE),
    )
    page.add_init_script(FAKE_RUNTIME)

    class Shell:
        def __init__(self) -> None:
            self.page = page
            self.log = request_log
            self.probe_url = test_page("probe.html", PROBE_NAPPLET)

        def goto(self, query: str = "", *, wait_attached: bool = True) -> None:
            page.goto(f"{base_url}index.html{query}")
            if wait_attached:
                page.wait_for_function("window.__fake && window.__fake.attached")

        def napplet_page(self, name: str, html: str) -> str:
            return test_page(name, html)

        def open_url(self, url: str) -> None:
            page.fill("#napplet-url", url)
            page.click("#napplet-url-open")

        def frame(self, index: int = -1) -> Any:
            """The Playwright Frame of the napplet iframe (last opened by default)."""
            handles = page.query_selector_all("iframe.napplet-frame")
            frame = handles[index].content_frame()
            assert frame is not None
            return frame

        def wait_frame_ready(self, index: int = -1) -> Any:
            page.wait_for_function(
                "(i) => { const f = [...document.querySelectorAll('iframe.napplet-frame')].at(i);"
                " return f && f.srcdoc.length > 0; }",
                arg=index,
            )
            frame = self.frame(index)
            frame.wait_for_function(
                "() => location.href === 'about:srcdoc' && document.readyState === 'complete'"
            )
            return frame

        def fake(self, expression: str) -> Any:
            return page.evaluate(
                f"(() => {{ const fake = window.__fake; return {expression}; }})()"
            )

        def calls(self, name: str) -> list[list[Any]]:
            calls: list[list[Any]] = self.fake("fake.calls")
            return [c for c in calls if c[0] == name]

        def envelopes(self, endpoint: str | None = None) -> list[dict[str, Any]]:
            if endpoint is None:
                result: list[dict[str, Any]] = self.fake("fake.envelopes()")
            else:
                result = page.evaluate("(id) => window.__fake.envelopes(id)", endpoint)
            return result

    yield Shell()


def _turn_llm_on(shell: Any) -> Any:
    """A link opens a napplet with LLM access off: the person turns it on (a fresh frame)."""
    old = shell.page.query_selector("iframe.napplet-frame")
    shell.page.check(".llm-toggle")
    shell.page.wait_for_function(
        "(old) => { const f = document.querySelector('iframe.napplet-frame');"
        " return f && f !== old && f.srcdoc.length > 0; }",
        arg=old,
    )
    return shell.wait_frame_ready()


def _open_probe(shell: Any, query: str = "") -> Any:
    shell.goto(f"?napplet={quote(shell.probe_url, safe='')}{query}")
    shell.wait_frame_ready()
    return _turn_llm_on(shell)


# --------------------------------------------------------------------------- frames


def test_frame_is_sandboxed_with_csp_first_and_prelude(shell: Any) -> None:
    frame = _open_probe(shell)
    attrs = shell.page.evaluate(
        "() => { const f = document.querySelector('iframe.napplet-frame');"
        " return {sandbox: f.getAttribute('sandbox'), allow: f.getAttribute('allow'),"
        " src: f.getAttribute('src'), srcdoc: f.srcdoc}; }"
    )
    assert attrs["sandbox"] == "allow-scripts"
    assert attrs["allow"] is None
    assert attrs["src"] is None
    srcdoc: str = attrs["srcdoc"]
    assert srcdoc.startswith('<!doctype html><meta http-equiv="Content-Security-Policy" content="')
    assert "default-src 'none'" in srcdoc.split(">", 2)[1]
    assert "connect-src 'none'" in srcdoc.split(">", 2)[1]
    # Prelude script first, then the napplet's own bytes unchanged.
    assert srcdoc.index("<script>(function installNappletPrelude") < srcdoc.index("Probe napplet")
    assert srcdoc.endswith(PROBE_NAPPLET)
    report = frame.evaluate("window.report")
    assert report == {"hasNapplet": True, "hasLlm": True, "frozen": True, "compat": "CSS1Compat"}
    # The identity handed to the runtime is name + sha256 of the exact bytes.
    (call,) = shell.calls("openEndpoint")
    identity = json.loads(call[2])
    assert identity == {
        "name": "probe.html",
        "sha256": hashlib.sha256(PROBE_NAPPLET.encode()).hexdigest(),
        "domains": ["llm"],
        "origin": shell.probe_url.split("/_test/")[0],
    }
    assert frame.evaluate("origin") == "null"


def test_csp_blocks_network_from_the_napplet(shell: Any) -> None:
    frame = _open_probe(shell)
    outcome = frame.evaluate(
        """async () => {
          const violations = [];
          document.addEventListener('securitypolicyviolation', (e) => violations.push(e.violatedDirective));
          let fetchResult;
          try { await fetch(location.ancestorOrigins[0] + '/index.html'); fetchResult = 'fetched'; }
          catch (e) { fetchResult = e.name; }
          const workerResult = await new Promise((resolve) => {
            try {
              const w = new Worker('data:text/javascript,postMessage(1)');
              w.onmessage = () => resolve('ran');
              w.onerror = () => resolve('blocked');
            } catch (e) { resolve(e.name); }
          });
          const img = new Image();
          const imgResult = await new Promise((resolve) => {
            img.onload = () => resolve('loaded'); img.onerror = () => resolve('blocked');
            img.src = location.ancestorOrigins[0] + '/favicon.ico';
          });
          await new Promise((r) => setTimeout(r, 50));
          return {fetchResult, workerResult, imgResult, violations};
        }"""
    )
    assert outcome["fetchResult"] == "TypeError"
    assert outcome["workerResult"] == "blocked"
    assert outcome["imgResult"] == "blocked"
    assert {"connect-src", "worker-src", "img-src"} <= set(outcome["violations"])
    # Nothing but the shell's own files was requested.
    assert not any("favicon.ico" in u for u in shell.log.requests)


def test_llm_toggle_reloads_without_the_domain_and_closes_the_endpoint(shell: Any) -> None:
    _open_probe(shell)
    (first,) = shell.calls("openEndpoint")
    shell.page.uncheck(".llm-toggle")
    shell.page.wait_for_function("window.__fake.closed.length === 1")
    frame = shell.wait_frame_ready()
    report = frame.evaluate("window.report")
    assert report["hasNapplet"] is True
    assert report["hasLlm"] is False
    assert report["frozen"] is True
    assert frame.evaluate("Object.keys(window.napplet).length") == 0
    descriptor = frame.evaluate(
        "(() => { const d = Object.getOwnPropertyDescriptor(window, 'napplet');"
        " return {writable: d.writable, configurable: d.configurable}; })()"
    )
    assert descriptor == {"writable": False, "configurable": False}
    assert shell.fake("fake.closed") == [first[1]]
    # No endpoint without the domain: a raw message reaches nothing.
    frame.evaluate("postMessage({type: 'llm.select', id: 'x'}, '*')")
    shell.page.wait_for_timeout(200)
    assert shell.envelopes() == []
    assert len(shell.calls("openEndpoint")) == 1
    # Back on: a fresh endpoint and the prelude again.
    shell.page.check(".llm-toggle")
    shell.page.wait_for_function("window.__fake.live().length === 1")
    frame = shell.wait_frame_ready()
    assert frame.evaluate("window.report.hasLlm") is True


def test_prelude_cannot_be_replaced_by_the_napplet(shell: Any) -> None:
    frame = _open_probe(shell)
    result = frame.evaluate(
        """() => {
          const before = window.napplet.llm;
          try { window.napplet = {}; } catch (e) {}
          try { window.napplet.llm = {}; } catch (e) {}
          try { delete window.napplet; } catch (e) {}
          try { window.napplet.llm.select = () => 1; } catch (e) {}
          return {same: window.napplet.llm === before,
                  selectIsOriginal: window.napplet.llm.select.toString().includes('llm.select')};
        }"""
    )
    assert result == {"same": True, "selectIsOriginal": True}


def test_messages_from_other_sources_are_dropped(shell: Any) -> None:
    frame = _open_probe(shell)
    # The shell's own window, and a frame the shell did not create.
    shell.page.evaluate("window.postMessage({type: 'llm.select', id: 'own'}, '*')")
    shell.page.evaluate(
        """() => new Promise((resolve) => {
          const f = document.createElement('iframe');
          f.setAttribute('sandbox', 'allow-scripts');
          f.srcdoc = "<script>parent.postMessage({type: 'llm.select', id: 'foreign'}, '*')<\\/script>";
          f.addEventListener('load', () => setTimeout(resolve, 100));
          document.body.append(f);
        })"""
    )
    frame.evaluate("postMessage({type: 'llm.select', id: 'mine'}, '*')")
    shell.page.wait_for_function("window.__fake.received.length >= 1")
    shell.page.wait_for_timeout(150)
    ids = [json.loads(e["json"])["id"] for e in shell.envelopes()]
    assert ids == ["mine"]


CONVERSIONS: list[tuple[str, dict[str, Any]]] = [
    (
        "({type: 'llm.select', id: 'n1', requirements: null})",
        {"json": {"type": "llm.select", "id": "n1", "requirements": None}},
    ),
    (
        "({type: 'llm.generate', id: 'ok', request: {a: [1, 'x', true, null, {b: 2.5}]}})",
        {
            "json": {
                "type": "llm.generate",
                "id": "ok",
                "request": {"a": [1, "x", True, None, {"b": 2.5}]},
            }
        },
    ),
    (
        "({type: 'llm.select', id: 'm1', requirements: new Map([['a', 1]])})",
        {"unclonable": True, "type": "llm.select", "id": "m1"},
    ),
    (
        "({type: 'llm.select', id: 'u1', requirements: undefined})",
        {"unclonable": True, "type": "llm.select", "id": "u1"},
    ),
    (
        "({type: 'llm.describe', id: 'd1', handle: new Date(0)})",
        {"unclonable": True, "type": "llm.describe", "id": "d1"},
    ),
    (
        "({type: 'llm.describe', id: 'r1', handle: /x/})",
        {"unclonable": True, "type": "llm.describe", "id": "r1"},
    ),
    (
        "({type: 'llm.describe', id: 's1', handle: new Set([1])})",
        {"unclonable": True, "type": "llm.describe", "id": "s1"},
    ),
    (
        "({type: 'llm.generate', id: 't1', request: new Uint8Array(4)})",
        {"unclonable": True, "type": "llm.generate", "id": "t1"},
    ),
    (
        "({type: 'llm.generate', id: 'ab', request: new ArrayBuffer(4)})",
        {"unclonable": True, "type": "llm.generate", "id": "ab"},
    ),
    (
        "({type: 'llm.generate', id: 'bl', request: new Blob(['x'])})",
        {"unclonable": True, "type": "llm.generate", "id": "bl"},
    ),
    (
        "({type: 'llm.generate', id: 'bi', request: 10n})",
        {"unclonable": True, "type": "llm.generate", "id": "bi"},
    ),
    (
        "({type: 'llm.generate', id: 'nan', request: {t: NaN}})",
        {"unclonable": True, "type": "llm.generate", "id": "nan"},
    ),
    (
        "({type: 'llm.generate', id: 'inf', request: {t: -Infinity}})",
        {"unclonable": True, "type": "llm.generate", "id": "inf"},
    ),
    (
        "({type: 'llm.generate', id: 'sp', request: [1, , 3]})",
        {"unclonable": True, "type": "llm.generate", "id": "sp"},
    ),
    (
        "(() => { const o = {type: 'llm.generate', id: 'cy'}; o.request = o; return o; })()",
        {"unclonable": True, "type": "llm.generate", "id": "cy"},
    ),
    (
        "({type: 'llm.generate', id: 'er', request: new Error('x')})",
        {"unclonable": True, "type": "llm.generate", "id": "er"},
    ),
    (
        "({type: 'llm.generate', id: 'bo', request: new Boolean(true)})",
        {"unclonable": True, "type": "llm.generate", "id": "bo"},
    ),
    ("new Map([['type', 'llm.select']])", {"unclonable": True, "type": None, "id": None}),
    ("({type: 7, id: {}, x: undefined})", {"unclonable": True, "type": None, "id": None}),
    ("[1, 2]", {"json": [1, 2]}),
    ("({type: 'llm.select', id: '\\ud800'})", {"json": {"type": "llm.select", "id": "\ud800"}}),
]


def test_messages_are_converted_to_wire_json(shell: Any) -> None:
    frame = _open_probe(shell)
    for expression, _ in CONVERSIONS:
        frame.evaluate(f"postMessage({expression}, '*')")
    shell.page.wait_for_function(f"window.__fake.received.length === {len(CONVERSIONS)}")
    wires = [json.loads(w) for w in shell.fake("fake.received.map(([, w]) => w)")]
    got = []
    for wire in wires:
        if "json" in wire:
            assert isinstance(wire["json"], str)  # JSON text inside, parsed by the runtime
            got.append({"json": json.loads(wire["json"])})
        else:
            got.append(wire)
    for (expression, expected), actual in zip(CONVERSIONS, got, strict=True):
        assert actual == expected, expression


def test_oversized_and_too_deep_messages_are_marked_too_large(shell: Any) -> None:
    frame = _open_probe(shell)
    frame.evaluate(
        "postMessage({type: 'llm.generate', id: 'big', request: 'x'.repeat(8 * 1024 * 1024 + 1)}, '*')"
    )
    frame.evaluate(
        "(() => { let v = {}; const root = v; for (let i = 0; i < 200; i++) { v.a = {}; v = v.a; }"
        " postMessage({type: 'llm.generate', id: 'deep', request: root}, '*'); })()"
    )
    # Escapes count: 5 MiB of control characters become 30 MiB of JSON text.
    frame.evaluate(
        "postMessage({type: 'llm.generate', id: 'esc', request: '\\u0001'.repeat(5 * 1024 * 1024)}, '*')"
    )
    frame.evaluate(
        "postMessage({type: 'llm.generate', id: 'fits', request: 'y'.repeat(1024 * 1024)}, '*')"
    )
    shell.page.wait_for_function("window.__fake.received.length === 4")
    wires = [json.loads(w) for w in shell.fake("fake.received.map(([, w]) => w)")]
    assert wires[0] == {"tooLarge": True, "type": "llm.generate", "id": "big"}
    assert wires[1] == {"tooLarge": True, "type": "llm.generate", "id": "deep"}
    assert wires[2] == {"tooLarge": True, "type": "llm.generate", "id": "esc"}
    assert json.loads(wires[3]["json"])["id"] == "fits"


def test_messages_before_attach_are_queued_in_order(shell: Any) -> None:
    shell.goto(f"?hold=1&napplet={quote(shell.probe_url, safe='')}", wait_attached=False)
    shell.wait_frame_ready()
    frame = _turn_llm_on(shell)
    assert shell.page.is_visible("#boot")
    frame.evaluate(
        "for (let i = 0; i < 5; i++) postMessage({type: 'llm.select', id: 'q' + i}, '*')"
    )
    shell.page.wait_for_timeout(150)
    assert shell.fake("fake.received.length") == 0
    assert shell.calls("openEndpoint") == []
    shell.page.evaluate("window.__fake.attach()")
    shell.page.wait_for_function("window.__fake.received.length === 5")
    assert [json.loads(e["json"])["id"] for e in shell.envelopes()] == [f"q{i}" for i in range(5)]
    assert shell.page.is_hidden("#boot")
    (call,) = shell.calls("openEndpoint")
    assert {r[0] for r in shell.fake("fake.received")} == {call[1]}


def test_reload_self_navigation_and_close_change_endpoints(shell: Any) -> None:
    _open_probe(shell)
    shell.page.click("button.reload")
    shell.page.wait_for_function("window.__fake.nextId === 2 && window.__fake.closed.length === 1")
    frame = shell.wait_frame_ready()
    assert shell.fake("fake.closed") == ["ep1"]
    assert shell.fake("fake.live()") == ["ep2"]
    # The napplet reloads its own document: a new document is a new endpoint.
    frame.evaluate("location.reload()")
    shell.page.wait_for_function("window.__fake.nextId === 3")
    assert shell.fake("fake.closed") == ["ep1", "ep2"]
    frame = shell.frame()
    frame.wait_for_function("() => window.report && window.report.hasLlm")
    frame.evaluate("postMessage({type: 'llm.select', id: 'after'}, '*')")
    shell.page.wait_for_function("window.__fake.received.length === 1")
    assert shell.fake("fake.received[0][0]") == "ep3"
    # Closing the tab closes its endpoint; later posts to it are dropped.
    shell.page.click("button.close")
    shell.page.wait_for_function("window.__fake.closed.length === 3")
    assert shell.fake("fake.live()") == []
    assert shell.page.query_selector_all("iframe.napplet-frame") == []
    assert shell.page.is_visible("#napplet-empty")
    shell.page.evaluate("window.__fake.post('ep3', {type: 'llm.select.result', id: 'after'})")


def test_two_tabs_of_one_napplet_are_separate_endpoints(shell: Any) -> None:
    _open_probe(shell)
    shell.open_url(shell.probe_url)
    shell.page.wait_for_function("window.__fake.live().length === 2")
    frames = [shell.wait_frame_ready(0), shell.wait_frame_ready(1)]
    tabs = shell.page.query_selector_all("[role=tab]")
    assert len(tabs) == 2
    assert tabs[1].get_attribute("aria-selected") == "true"
    # Arrow keys move between tabs.
    tabs[1].focus()
    shell.page.keyboard.press("ArrowLeft")
    assert tabs[0].get_attribute("aria-selected") == "true"
    assert shell.page.evaluate("document.activeElement.id") == tabs[0].get_attribute("id")
    frames[0].evaluate("postMessage({type: 'llm.select', id: 'a'}, '*')")
    frames[1].evaluate("postMessage({type: 'llm.select', id: 'b'}, '*')")
    shell.page.wait_for_function("window.__fake.received.length === 2")
    by_endpoint = {
        r[0]: json.loads(json.loads(r[1])["json"])["id"] for r in shell.fake("fake.received")
    }
    assert by_endpoint == {"ep1": "a", "ep2": "b"}
    # Replies go only to the addressed frame.
    for frame in frames:
        frame.evaluate(
            "window.got = []; addEventListener('message', (e) => window.got.push(e.data.id))"
        )
    shell.page.evaluate("window.__fake.post('ep2', {type: 'x.y', id: 'for-b'})")
    frames[1].wait_for_function("() => window.got.length === 1")
    shell.page.wait_for_timeout(100)
    assert frames[0].evaluate("window.got") == []
    assert frames[1].evaluate("window.got") == ["for-b"]


def test_only_http_napplet_urls_open(shell: Any) -> None:
    shell.goto("?napplet=" + quote("javascript:alert(1)", safe=""))
    notice = shell.page.wait_for_selector("#notice-list .notice.error")
    assert "http or https" in notice.text_content()
    assert shell.page.query_selector_all("iframe.napplet-frame") == []
    shell.page.fill("#napplet-url", "data:text/html,hi")
    shell.page.click("#napplet-url-open")
    assert shell.page.query_selector_all("iframe.napplet-frame") == []


class EndlessNappletHost:
    """A CORS host on 127.0.0.1 whose napplet document never ends (no length).

    It stops at `cap` bytes at most; `sent` counts what it wrote, `ended`
    is set once it stopped (the client closed, or the cap).
    """

    def __init__(self, cap: int) -> None:
        self.sent = 0
        self.ended = threading.Event()
        host = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Access-Control-Allow-Origin", "*")
                self.send_header("Connection", "close")
                self.end_headers()
                self.close_connection = True
                chunk = b"<!-- napplet -->" * 16384
                try:
                    self.wfile.write(b"<!doctype html><title>endless</title>")
                    while host.sent < cap:
                        self.wfile.write(chunk)
                        host.sent += len(chunk)
                except OSError:
                    pass  # the shell stopped reading and closed
                host.ended.set()

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/napplet.html"

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def test_a_napplet_host_that_never_stops_sending_is_cut_off(shell: Any) -> None:
    """The napplet download stops at 8 MiB; it is not read to its end first."""
    cap = 512 * 1024 * 1024
    host = EndlessNappletHost(cap)
    try:
        shell.goto()
        shell.open_url(host.url)
        notice = shell.page.wait_for_selector("#notice-list .notice.error")
        assert "is larger than 8 MiB" in notice.text_content()
        assert shell.page.query_selector_all("iframe.napplet-frame") == []
        assert host.ended.wait(60)
        assert 8 * 1024 * 1024 < host.sent < cap // 8
    finally:
        host.stop()


def test_napplet_index_lists_the_examples(shell: Any) -> None:
    shell.goto()
    shell.page.wait_for_function("document.querySelectorAll('#napplet-select option').length >= 3")
    options = shell.page.eval_on_selector_all(
        "#napplet-select option", "(os) => os.map((o) => [o.value, o.dataset.url])"
    )
    names = {name for name, _ in options}
    assert {"chat", "json", "tools"} <= names
    for name, url in options:
        assert url.endswith(f"/napplets/{name}/index.html")
    shell.page.select_option("#napplet-select", "json")
    shell.page.click("#napplet-open")
    shell.page.wait_for_function("window.__fake.live().length === 1")
    identity = json.loads(shell.calls("openEndpoint")[0][2])
    assert identity["name"] == "json"


# --------------------------------------------------------------------------- prelude


MODEL = {
    "handle": "h1",
    "name": "Test connection",
    "model": "m",
    "route": "This page (test)",
    "images": False,
    "json": True,
    "tools": False,
    "toolChoiceModes": [],
}


def test_prelude_select_describe_and_errors(shell: Any) -> None:
    frame = _open_probe(shell)
    frame.evaluate(
        "window.out = {}; void napplet.llm.select({json: true}).then((m) => window.out.model = m,"
        " (e) => window.out.err = e)"
    )
    shell.page.wait_for_function("window.__fake.received.length === 1")
    (envelope,) = [json.loads(e["json"]) for e in shell.envelopes()]
    assert envelope["type"] == "llm.select"
    assert envelope["requirements"] == {"json": True}
    assert envelope["id"].startswith("select-") and len(envelope["id"]) == len("select-") + 32
    # Wrong type with the right id, another id, and a result from the frame itself: ignored.
    shell.page.evaluate(
        "(id) => { window.__fake.post('ep1', {type: 'llm.describe.result', id, model: {}});"
        " window.__fake.post('ep1', {type: 'llm.select.result', id: 'other', model: {}}); }",
        envelope["id"],
    )
    frame.evaluate(
        "(id) => window.postMessage({type: 'llm.select.result', id, model: {handle: 'forged'}}, '*')",
        envelope["id"],
    )
    frame.wait_for_timeout(100)
    assert frame.evaluate("window.out") == {}
    shell.page.evaluate(
        "([id, model]) => window.__fake.post('ep1', {type: 'llm.select.result', id, model})",
        [envelope["id"], MODEL],
    )
    frame.wait_for_function("() => window.out.model !== undefined")
    assert frame.evaluate("window.out.model") == MODEL
    # A duplicate result for a settled id is ignored.
    shell.page.evaluate(
        "(id) => window.__fake.post('ep1', {type: 'llm.select.result', id, error: {code: 'x', message: 'y'}})",
        envelope["id"],
    )
    # select() without requirements omits the field; describe() carries the handle.
    frame.evaluate(
        "napplet.llm.select(); void napplet.llm.describe('h1').catch((e) => window.out.describeErr ="
        " {code: e.code, message: e.message, isError: e instanceof Error,"
        " isLlmError: e instanceof napplet.llm.LlmError, name: e.name})"
    )
    shell.page.wait_for_function("window.__fake.received.length === 3")
    select2, describe = [json.loads(e["json"]) for e in shell.envelopes()[1:]]
    assert "requirements" not in select2
    assert describe["type"] == "llm.describe" and describe["handle"] == "h1"
    shell.page.evaluate(
        "(id) => window.__fake.post('ep1', {type: 'llm.describe.result', id,"
        " error: {code: 'selection-expired', message: 'Select again.'}})",
        describe["id"],
    )
    frame.wait_for_function("() => window.out.describeErr !== undefined")
    assert frame.evaluate("window.out.describeErr") == {
        "code": "selection-expired",
        "message": "Select again.",
        "isError": True,
        "isLlmError": True,
        "name": "LlmError",
    }
    assert frame.evaluate("window.out.model.handle") == "h1"
    # A request structured clone cannot carry rejects without posting.
    code = frame.evaluate("napplet.llm.select({f() {}}).then(() => 'ok', (e) => e.code)")
    assert code == "invalid-request"


def test_prelude_generate_streams_and_settles_once(shell: Any) -> None:
    frame = _open_probe(shell)
    frame.evaluate(
        """() => {
          window.out = {deltas: [], iterated: [], settled: null};
          const h = napplet.llm.generate({handle: 'h1', messages: []}, {onDelta: (d) => window.out.deltas.push(d.sequence)});
          window.h = h;
          window.out.id = h.id;
          (async () => { for await (const d of h.deltas) window.out.iterated.push(d.sequence); window.out.iterDone = true; })();
          (async () => { window.out.settled = await h; })();
          h.result.then((r) => window.out.viaResult = r.finish);
        }"""
    )
    shell.page.wait_for_function("window.__fake.received.length === 1")
    gen = json.loads(shell.envelopes()[0]["json"])
    assert gen["type"] == "llm.generate"
    assert gen["request"] == {"handle": "h1", "messages": []}
    rid = gen["id"]
    assert rid == frame.evaluate("window.out.id")
    shell.page.evaluate(
        """(rid) => {
          const post = (e) => window.__fake.post('ep1', e);
          post({type: 'llm.delta', requestId: rid, sequence: 0, event: 'start', block: 'text', blockIndex: 0});
          post({type: 'llm.delta', requestId: 'other', sequence: 0, event: 'start', block: 'text', blockIndex: 0});
          post({type: 'llm.delta', requestId: rid, sequence: 1, event: 'delta', block: 'text', blockIndex: 0, text: 'Hi'});
          post({type: 'llm.delta', requestId: rid, sequence: 2, event: 'end', block: 'text', blockIndex: 0});
          post({type: 'llm.generate.result', id: rid, result: {content: [{type: 'text', text: 'Hi'}], finish: 'stop'}});
          post({type: 'llm.delta', requestId: rid, sequence: 3, event: 'start', block: 'text', blockIndex: 1});
          post({type: 'llm.generate.result', id: rid, error: {code: 'cancelled', message: 'late'}});
        }""",
        rid,
    )
    frame.wait_for_function("() => window.out.settled !== null && window.out.iterDone")
    out = frame.evaluate("window.out")
    assert out["deltas"] == [0, 1, 2]
    assert out["iterated"] == [0, 1, 2]
    assert out["settled"] == {"content": [{"type": "text", "text": "Hi"}], "finish": "stop"}
    assert out["viaResult"] == "stop"


def test_prelude_cancel_and_error_paths(shell: Any) -> None:
    frame = _open_probe(shell)
    frame.evaluate(
        """() => {
          window.out = {};
          const h = napplet.llm.generate({handle: 'h1', messages: []});
          window.h = h;
          h.catch((e) => window.out.err = {code: e.code, message: e.message});
          (async () => { try { for await (const d of h.deltas) {} window.out.iter = 'done'; }
                         catch (e) { window.out.iter = e.code; } })();
          h.cancel().then((c) => window.out.cancelled = c);
          napplet.llm.cancel('nope').then((c) => window.out.unknown = c);
        }"""
    )
    shell.page.wait_for_function("window.__fake.received.length === 3")
    gen, cancel, cancel2 = [json.loads(e["json"]) for e in shell.envelopes()]
    assert cancel["type"] == "llm.cancel" and cancel["requestId"] == gen["id"]
    assert cancel["id"] != gen["id"]
    assert cancel2["requestId"] == "nope"
    shell.page.evaluate(
        """([g, c, c2]) => {
          const post = (e) => window.__fake.post('ep1', e);
          post({type: 'llm.generate.result', id: g, error: {code: 'cancelled', message: 'Generation cancelled.'}});
          post({type: 'llm.cancel.result', id: c, cancelled: true});
          post({type: 'llm.cancel.result', id: c2, cancelled: false});
        }""",
        [gen["id"], cancel["id"], cancel2["id"]],
    )
    frame.wait_for_function(
        "() => window.out.unknown !== undefined && window.out.iter !== undefined"
    )
    assert frame.evaluate("window.out") == {
        "err": {"code": "cancelled", "message": "Generation cancelled."},
        "iter": "cancelled",
        "cancelled": True,
        "unknown": False,
    }


# --------------------------------------------------------------------------- dialogs

CHOOSER = {
    "revision": 4,
    "napplet": {
        "name": '<img src=x onerror="window.pwned=1">chat',
        "sha256": "ab" * 32,
        "shortHash": "abababababab",
    },
    "requirements": {"json": True},
    "candidates": [
        {
            "id": "c1",
            "name": "Local LMSP",
            "kind": "lmsp",
            "model": "tiny-chat",
            "route": "This browser → LMSP service at 127.0.0.1:11435",
            "charges": False,
            "capabilities": {
                "images": False,
                "json": True,
                "tools": True,
                "toolChoiceModes": ["auto", "none"],
            },
        },
        {
            "id": "c2",
            "name": "Remote",
            "kind": "openai",
            "model": "big",
            "route": "This browser → OpenAI-compatible server at example.test",
            "charges": True,
            "capabilities": {"images": True, "json": True, "tools": False, "toolChoiceModes": []},
        },
    ],
}

DISCLOSURE = {
    "digest": "ef" * 32,
    "napplet": {"name": "tools", "sha256": "cd" * 32, "shortHash": "cdcdcdcdcdcd"},
    "connection": {"id": "c1", "name": "Local LMSP", "kind": "lmsp"},
    "route": "This browser → LMSP service at 127.0.0.1:11435",
    "model": "Llama-3.2-1B-Instruct-q4f16_1-MLC",
    "modelName": "Llama 3.2 1B Instruct",
    "charges": True,
    "disclosed": {
        "messages": 3,
        "characters": 120,
        "images": 0,
        "toolDefinitions": [
            {
                "name": "get_weather",
                "description": "Look up weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            }
        ],
        "toolResults": [
            {
                "toolName": "get_weather",
                "toolCallId": "call_1",
                "characters": 14,
                "images": 0,
                "isError": True,
            }
        ],
        "format": "text",
        "maxTokens": None,
    },
}


def _start_dialog(shell: Any, kind: str, token: str, data: dict[str, Any]) -> None:
    method = "openChooser" if kind == "chooser" else "openConsent"
    shell.page.evaluate(
        f"([t, d]) => {{ window.answers = window.answers || {{}};"
        f" napllmHost.{method}(t, d).then((a) => window.answers[t] = a); }}",
        [token, json.dumps(data)],
    )


def _answer(shell: Any, token: str) -> Any:
    shell.page.wait_for_function("(t) => window.answers && t in window.answers", arg=token)
    return shell.page.evaluate("(t) => window.answers[t]", token)


def _armed(shell: Any) -> None:
    """Wait until the open dialog's granting controls are enabled (web/js/dialogs.js)."""
    shell.page.wait_for_selector("dialog[open][data-armed=true]")


def test_chooser_lists_candidates_and_esc_cancels(shell: Any) -> None:
    shell.goto()
    shell.page.focus("#napplet-url")
    _start_dialog(shell, "chooser", "t1", CHOOSER)
    dialog = shell.page.wait_for_selector("dialog.chooser-dialog[open]")
    title_id = dialog.get_attribute("aria-labelledby")
    desc_id = dialog.get_attribute("aria-describedby")
    assert shell.page.text_content(f"#{title_id}") == "Choose a model"
    description = shell.page.text_content(f"#{desc_id}")
    # The napplet's name is shown as text, never run as markup.
    assert '<img src=x onerror="window.pwned=1">chat (#abababababab)' in description
    assert "JSON output" in description
    assert shell.page.evaluate("window.pwned") is None
    buttons = dialog.query_selector_all("button.candidate")
    assert [b.get_attribute("data-candidate-id") for b in buttons] == ["c1", "c2"]
    assert "may charge" in buttons[1].text_content()
    assert "127.0.0.1:11435" in buttons[0].text_content()
    # Badges say what each connection can do, never what it cannot.
    badges = [
        b.eval_on_selector_all(".badges li", "(l) => l.map((x) => x.textContent)")
        for b in dialog.query_selector_all("ul.candidates > li")
    ]
    assert badges == [
        ["JSON output", "calls tools", "tool choice: auto, none"],
        ["reads images", "JSON output"],
    ]
    assert dialog.query_selector(".badge.off") is None
    # Focus starts on Cancel (Enter never picks a candidate by default).
    assert shell.page.evaluate("document.activeElement.textContent") == "Cancel"
    shell.page.keyboard.press("Escape")
    assert _answer(shell, "t1") is None
    assert shell.page.query_selector("dialog[open]") is None
    assert shell.page.evaluate("document.activeElement.id") == "napplet-url"


def test_chooser_keyboard_choice(shell: Any) -> None:
    shell.goto()
    _start_dialog(shell, "chooser", "t2", CHOOSER)
    shell.page.wait_for_selector("dialog.chooser-dialog[open]")
    _armed(shell)
    shell.page.keyboard.press("Shift+Tab")  # Cancel -> the last candidate
    assert shell.page.evaluate("document.activeElement.dataset.candidateId") == "c2"
    shell.page.keyboard.press("Enter")
    assert json.loads(_answer(shell, "t2")) == {"id": "c2", "revision": 4}


def test_chooser_answers_with_the_revision_of_the_list_it_shows(shell: Any) -> None:
    """A pick names the list it was made on; an update older than the shown list is ignored."""
    shell.goto()
    _start_dialog(shell, "chooser", "t4", CHOOSER)
    shell.page.wait_for_selector("dialog.chooser-dialog[open]")
    only_c1 = {**CHOOSER, "revision": 5, "candidates": CHOOSER["candidates"][:1]}
    shell.page.evaluate("([t, d]) => napllmHost.updateChooser(t, d)", ["t4", json.dumps(only_c1)])
    # A late update (revision 3) never brings back an older list.
    shell.page.evaluate(
        "([t, d]) => napllmHost.updateChooser(t, d)",
        ["t4", json.dumps({**CHOOSER, "revision": 3})],
    )
    ids = "() => [...document.querySelectorAll('dialog[open] button.candidate')].map((b) => b.dataset.candidateId)"
    assert shell.page.evaluate(ids) == ["c1"]
    _armed(shell)
    shell.page.click("dialog[open] button.candidate")
    assert json.loads(_answer(shell, "t4")) == {"id": "c1", "revision": 5}


def test_consent_shows_disclosure_denies_by_default(shell: Any) -> None:
    shell.goto()
    shell.page.focus("#napplet-url")
    _start_dialog(shell, "consent", "k1", DISCLOSURE)
    dialog = shell.page.wait_for_selector("dialog.consent-dialog[open]")
    text = dialog.text_content()
    for expected in (
        "tools (#cdcdcdcdcdcd)",
        "Local LMSP",
        "This browser → LMSP service at 127.0.0.1:11435",
        "Llama 3.2 1B Instruct (id Llama-3.2-1B-Instruct-q4f16_1-MLC)",
        "3 messages, 120 characters",
        "get_weather",
        "call_1",
        "14 characters",
        "reports an error",
        "may charge you",
    ):
        assert expected in text, expected
    assert (
        dialog.query_selector(".model-id code").text_content()
        == "Llama-3.2-1B-Instruct-q4f16_1-MLC"
    )
    assert dialog.query_selector("details pre") is not None
    assert '"city"' in dialog.query_selector("details pre").text_content()
    # Deny is focused, "remember" is off; Esc denies.
    assert shell.page.evaluate("document.activeElement.textContent") == "Deny"
    assert dialog.query_selector("input.remember").is_checked() is False
    label = dialog.query_selector("label[for]").text_content()
    assert label == "Allow this napplet on this connection until I close the page"
    shell.page.keyboard.press("Escape")
    assert json.loads(_answer(shell, "k1")) == {"allow": False, "remember": False}
    assert shell.page.evaluate("document.activeElement.id") == "napplet-url"


def test_consent_allow_with_remember(shell: Any) -> None:
    shell.goto()
    _start_dialog(shell, "consent", "k2", DISCLOSURE)
    shell.page.wait_for_selector("dialog.consent-dialog[open]")
    shell.page.check("dialog[open] input.remember")
    shell.page.click("dialog[open] button.allow")
    assert json.loads(_answer(shell, "k2")) == {
        "allow": True,
        "remember": True,
        "digest": DISCLOSURE["digest"],
    }
    _start_dialog(shell, "consent", "k3", DISCLOSURE)
    shell.page.wait_for_selector("dialog.consent-dialog[open]")
    _armed(shell)
    shell.page.keyboard.press("Tab")  # Deny -> Allow
    shell.page.keyboard.press("Enter")
    assert json.loads(_answer(shell, "k3")) == {
        "allow": True,
        "remember": False,
        "digest": DISCLOSURE["digest"],
    }


def test_dialogs_queue_one_at_a_time_and_close_dialog(shell: Any) -> None:
    shell.goto()
    _start_dialog(shell, "consent", "a", DISCLOSURE)
    _start_dialog(shell, "chooser", "b", CHOOSER)
    _start_dialog(shell, "consent", "c", DISCLOSURE)
    shell.page.wait_for_selector("dialog[data-token=a][open]")
    assert len(shell.page.query_selector_all("dialog")) == 1
    # Dropping a queued one resolves it as deny without showing it.
    shell.page.evaluate("napllmHost.closeDialog('c')")
    assert json.loads(_answer(shell, "c")) == {"allow": False, "remember": False}
    # Closing the open one resolves it and shows the next.
    shell.page.evaluate("napllmHost.closeDialog('a')")
    assert json.loads(_answer(shell, "a")) == {"allow": False, "remember": False}
    shell.page.wait_for_selector("dialog[data-token=b][open]")
    shell.page.evaluate("napllmHost.closeDialog('b')")
    assert _answer(shell, "b") is None
    assert shell.page.query_selector("dialog") is None
    # Unknown tokens are ignored.
    shell.page.evaluate("napllmHost.closeDialog('zzz')")


# --------------------------------------------------------------------------- inspector


def test_inspector_records_filters_and_clears(shell: Any) -> None:
    frame = _open_probe(shell)
    shell.page.click("#inspector-heading")
    frame.evaluate("napplet.llm.select(); void napplet.llm.describe('h9')")
    shell.page.wait_for_function("window.__fake.received.length === 2")
    select_id = json.loads(shell.envelopes()[0]["json"])["id"]
    shell.page.evaluate(
        "([id, model]) => { window.__fake.post('ep1', {type: 'llm.select.result', id, model});"
        " napllmHost.inspect('ep1', 'out', JSON.stringify({type: 'llm.select.result', id, model}));"
        " napllmHost.inspect('ep1', 'note', JSON.stringify({dropped: 'unknown type'})); }",
        [select_id, MODEL],
    )
    shell.page.wait_for_function("document.querySelectorAll('#inspector-list li').length === 4")
    rows = shell.page.eval_on_selector_all(
        "#inspector-list li",
        "(ls) => ls.map((l) => [l.dataset.direction, l.dataset.type, l.dataset.endpoint])",
    )
    # The runtime's own "out" report joined the page's entry instead of doubling it.
    assert rows == [
        ["in", "llm.select", "ep1"],
        ["in", "llm.describe", "ep1"],
        ["out", "llm.select.result", "ep1"],
        ["note", "(dropped)", "ep1"],
    ]
    shell.page.select_option("#inspector-direction", "out")
    shell.page.wait_for_function("document.querySelectorAll('#inspector-list li').length === 1")
    shell.page.select_option("#inspector-direction", "")
    shell.page.wait_for_function("document.querySelectorAll('#inspector-list li').length === 4")
    shell.page.fill("#inspector-text", "h9")
    # (the "out" filter above also left one entry: wait for the text filter's own)
    shell.page.wait_for_function(
        "() => { const ls = document.querySelectorAll('#inspector-list li');"
        " return ls.length === 1 && ls[0].dataset.type === 'llm.describe'; }"
    )
    shell.page.fill("#inspector-text", "")
    shell.page.select_option("#inspector-endpoint", "ep1")
    shell.page.wait_for_function("document.querySelectorAll('#inspector-list li').length === 4")
    shell.page.select_option("#inspector-endpoint", "")
    shell.page.click("#inspector-clear")
    shell.page.wait_for_function("document.querySelectorAll('#inspector-list li').length === 0")


def test_inspector_is_a_bounded_ring_buffer(shell: Any) -> None:
    shell.goto()
    shell.page.click("#inspector-heading")
    shell.page.evaluate(
        "for (let i = 0; i < 620; i++) napllmHost.inspect('ep7', 'out', JSON.stringify({type: 't' + i}))"
    )
    shell.page.wait_for_function("document.querySelectorAll('#inspector-list li').length === 500")
    first = shell.page.get_attribute("#inspector-list li", "data-type")
    assert first == "t120"
    assert shell.page.text_content("#inspector-count") == "500 of 500 envelopes"


# --------------------------------------------------------------------------- connections


CONNECTIONS = [
    {
        "id": "u-1",
        "name": "My server",
        "kind": "openai",
        "model": "llama",
        "route": "This browser → OpenAI-compatible server at 127.0.0.1:8080",
        "capabilities": {
            "images": False,
            "imagesInToolResults": False,
            "json": True,
            "tools": True,
            "toolChoiceModes": ["auto", "none"],
            "temperature": [0, 2],
        },
        "charges": True,
        "settings": {"baseUrl": "http://127.0.0.1:8080/v1", "userDefined": True},
        "hasCredential": True,
        "available": True,
        "unavailableReason": None,
    },
    {
        "id": "builtin",
        "name": "WebGPU model",
        "kind": "webllm",
        "model": "SmolLM2",
        "route": "This browser (WebGPU, WebLLM) on this device",
        "capabilities": {"images": False, "json": False, "tools": False, "toolChoiceModes": []},
        "charges": False,
        "settings": {},
        "hasCredential": False,
        "available": False,
        "unavailableReason": "WebGPU is not available in this browser.",
    },
]


def test_connections_panel_lists_and_edits(shell: Any) -> None:
    shell.goto()
    shell.page.evaluate("(l) => napllmHost.connectionsChanged(l)", json.dumps(CONNECTIONS))
    items = shell.page.query_selector_all("#connection-list li.connection")
    assert len(items) == 2
    first = items[0].text_content()
    for expected in (
        "My server",
        "OpenAI-compatible server",
        "llama",
        "Route: This browser → OpenAI-compatible server at 127.0.0.1:8080",
        "may charge",
        "credential saved",
        "Available",
    ):
        assert expected in first
    assert items[0].eval_on_selector_all(".badges li", "(l) => l.map((x) => x.textContent)") == [
        "JSON output",
        "calls tools",
        "may charge",
        "credential saved",
    ]
    # A connection this device cannot run sits in a quiet, collapsed group that
    # says what it needs and how to get it; it is not listed as an error.
    group = shell.page.query_selector("#connection-list > li.unavailable-group")
    assert group.eval_on_selector("details", "(d) => d.open") is False
    assert group.query_selector("summary").text_content() == "Needs a GPU with WebGPU (1 model)"
    assert "chrome://flags/#enable-unsafe-webgpu" in group.query_selector(".how").text_content()
    assert not shell.page.is_visible("li.connection.quiet")
    second = items[1].text_content()
    assert items[1].get_attribute("class") == "connection quiet"
    assert "WebLLM in this browser (WebGPU)" in second
    assert "WebGPU is not available in this browser." in second and "Unavailable" not in second
    assert (
        shell.page.query_selector("#connection-list .unavailable, #connection-list .badge.off")
        is None
    )
    assert items[1].query_selector("button.edit") is None  # built in
    # Edit: the secret is never filled back; blank keeps it (credential null).
    items[0].query_selector("button.edit").click()
    assert shell.page.input_value("#connection-secret") == ""
    assert shell.page.input_value("#connection-base-url") == "http://127.0.0.1:8080/v1"
    assert shell.page.is_checked("#connection-cap-json")
    assert shell.page.is_disabled("#connection-kind")
    shell.page.fill("#connection-name", "Renamed")
    shell.page.click("#connection-save")
    shell.page.wait_for_function("window.__fake.calls.some((c) => c[0] === 'editConnection')")
    (call,) = shell.calls("editConnection")
    assert call[1] == "u-1"
    assert json.loads(call[2]) == {
        "name": "Renamed",
        "kind": "openai",
        "model": "llama",
        "settings": {"baseUrl": "http://127.0.0.1:8080/v1"},
        "credential": None,
        "capabilities": {"json": True, "tools": True, "images": False},
        "charges": True,
    }
    assert shell.page.is_hidden("#connection-form")


def test_connections_add_forms_per_kind(shell: Any) -> None:
    shell.goto()
    page = shell.page
    page.click("#connection-add")
    # A short guided form: the kind comes first, and its fields only once picked.
    assert page.evaluate("document.activeElement.id") == "connection-kind"
    assert page.is_hidden("#connection-base-url") and page.is_hidden("#connection-model")
    kinds = page.eval_on_selector_all(
        "#connection-kind option", "(o) => o.map((x) => [x.value, x.text])"
    )
    assert kinds == [["", "Choose a kind…"]] + [[k["kind"], k["label"]] for k in catalogue()]
    page.fill("#connection-name", "LMSP")
    page.select_option("#connection-kind", "lmsp")
    assert "napllm-lmsp" in page.text_content("#connection-kind-summary")
    assert page.is_visible("#connection-discover")
    assert page.is_hidden("#connection-forwards-to")
    assert page.is_hidden("#connection-capabilities")
    assert page.is_hidden("#connection-model-url")
    page.fill("#connection-base-url", "http://127.0.0.1:11435")
    page.fill("#connection-model", "tiny-chat")
    page.fill("#connection-secret", "s3cret-token")
    page.click("#connection-save")
    page.wait_for_function("window.__fake.calls.some((c) => c[0] === 'addConnection')")
    assert json.loads(shell.calls("addConnection")[0][1]) == {
        "name": "LMSP",
        "kind": "lmsp",
        "model": "tiny-chat",
        "settings": {"baseUrl": "http://127.0.0.1:11435"},
        "credential": "s3cret-token",
        "capabilities": {},
        "charges": False,
    }
    # The form is reset: the secret is gone from the page.
    assert page.input_value("#connection-secret") == ""
    page.click("#connection-add")
    page.fill("#connection-name", "Wasm")
    page.select_option("#connection-kind", "wasm")
    assert page.is_hidden("#connection-base-url")
    assert page.is_hidden("#connection-secret")
    page.fill("#connection-model-url", "http://127.0.0.1:9/models/tiny-chat-q8_0.gguf")
    page.click("#connection-save")
    page.wait_for_function(
        "window.__fake.calls.filter((c) => c[0] === 'addConnection').length === 2"
    )
    wasm = json.loads(shell.calls("addConnection")[1][1])
    assert wasm["model"] == "tiny-chat-q8_0"
    assert wasm["settings"] == {"url": "http://127.0.0.1:9/models/tiny-chat-q8_0.gguf"}
    assert wasm["credential"] is None
    # Invalid input is refused by the form itself; Esc closes it.
    page.click("#connection-add")
    page.select_option("#connection-kind", "wasm")
    assert page.is_hidden("#connection-discover")
    page.select_option("#connection-kind", "openai")
    page.fill("#connection-name", "Proxied")
    page.fill("#connection-base-url", "http://127.0.0.1:4000/v1")
    page.fill("#connection-forwards-to", "api.example.com")
    page.fill("#connection-model", "gpt")
    page.click("#connection-save")
    page.wait_for_function(
        "window.__fake.calls.filter((c) => c[0] === 'addConnection').length === 3"
    )
    proxied = json.loads(shell.calls("addConnection")[2][1])
    assert proxied["settings"] == {
        "baseUrl": "http://127.0.0.1:4000/v1",
        "forwardsTo": "api.example.com",
    }
    page.click("#connection-add")
    page.select_option("#connection-kind", "openai")
    page.fill("#connection-name", "Bad")
    page.fill("#connection-base-url", "not a url")
    page.fill("#connection-model", "x")
    page.click("#connection-save")
    page.wait_for_timeout(100)
    assert len(shell.calls("addConnection")) == 3
    page.focus("#connection-name")
    page.keyboard.press("Escape")
    assert page.is_hidden("#connection-form")
    # Credentials never reach the console.
    assert not any("s3cret" in line for line in shell.log.console)


def test_connection_remove_grants_and_notices(shell: Any) -> None:
    shell.goto()
    page = shell.page
    page.evaluate("(l) => napllmHost.connectionsChanged(l)", json.dumps(CONNECTIONS))
    page.click("#connection-list li.connection >> nth=0 >> button.remove")
    page.click("button.secondary:has-text('Keep')")
    assert shell.calls("removeConnection") == []
    page.click("#connection-list li.connection >> nth=0 >> button.remove")
    page.click("button.confirm-remove")
    page.wait_for_function("window.__fake.calls.some((c) => c[0] === 'removeConnection')")
    assert shell.calls("removeConnection")[0][1] == "u-1"
    grants = [
        {
            "key": "g1",
            "napplet": {"name": "chat", "shortHash": "0123456789ab"},
            "connectionId": "u-1",
            "connectionName": "My server",
            "account": "Default",
        }
    ]
    page.evaluate("(g) => napllmHost.grantsChanged(g)", json.dumps(grants))
    assert "chat (#0123456789ab) may use My server in profile Default" in page.text_content(
        "#grant-list"
    )
    page.click("#grant-list button.revoke")
    page.wait_for_function("window.__fake.calls.some((c) => c[0] === 'revokeGrant')")
    assert shell.calls("revokeGrant")[0][1] == "g1"
    page.evaluate(
        "napllmHost.notice(JSON.stringify({level: 'warning', text: 'The service rejected the token.', connectionId: 'u-1'}))"
    )
    notice = page.wait_for_selector("#notice-list .notice.warning")
    assert notice.text_content().startswith("Warning My server: The service rejected the token.")
    assert page.get_attribute("#notice-list", "aria-live") == "polite"
    notice.query_selector("button.dismiss").click()
    assert page.query_selector("#notice-list .notice") is None


# --------------------------------------------------------------------------- profiles, storage, boot


def test_profiles_switch_and_persist(shell: Any) -> None:
    shell.goto()
    page = shell.page
    assert page.input_value("#account-select") == "Default"
    assert page.is_disabled("#account-remove")
    page.click("#account-add")
    page.fill("#account-new-name", "Work")
    page.keyboard.press("Enter")
    page.wait_for_function(
        "window.__fake.calls.some((c) => c[0] === 'switchAccount' && c[1] === 'Work')"
    )
    assert page.input_value("#account-select") == "Work"
    # A duplicate name is refused.
    page.click("#account-add")
    page.fill("#account-new-name", "Default")
    page.keyboard.press("Enter")
    assert page.text_content("#account-add-error") == "A profile with this name exists."
    page.keyboard.press("Escape")
    # After a reload the profile is re-applied to the runtime at attach.
    shell.goto()
    assert page.input_value("#account-select") == "Work"
    assert [c[1] for c in shell.calls("switchAccount")] == ["Work"]
    page.select_option("#account-select", "Default")
    assert [c[1] for c in shell.calls("switchAccount")] == ["Work", "Default"]
    page.select_option("#account-select", "Work")
    page.click("#account-remove")
    assert page.eval_on_selector_all(
        "#account-select option", "(os) => os.map((o) => o.value)"
    ) == ["Default"]
    assert [c[1] for c in shell.calls("switchAccount")][-1] == "Default"


def test_connections_storage_round_trip(shell: Any) -> None:
    shell.goto()
    assert shell.page.evaluate("napllmHost.loadConnections()") == "[]"
    shell.page.evaluate('napllmHost.saveConnections(\'[{"id":"u-1"}]\')')
    assert shell.page.evaluate("napllmHost.loadConnections()") == '["{\\"id\\":\\"u-1\\"}"]'
    shell.goto()
    assert shell.page.evaluate("napllmHost.loadConnections()") == '["{\\"id\\":\\"u-1\\"}"]'


def test_boot_progress_and_error_panel(shell: Any) -> None:
    shell.goto("?hold=1", wait_attached=False)
    shell.page.wait_for_function("window.__fake.booted")
    shell.page.evaluate("napllmHost.bootProgress('Loading models', 0.4)")
    assert shell.page.text_content("#boot-label") == "Loading models"
    assert shell.page.evaluate("document.querySelector('#boot-progress').value") == pytest.approx(
        0.4
    )
    assert shell.page.is_disabled("#connection-add")
    shell.page.evaluate("window.__fake.attach()")
    assert shell.page.is_hidden("#boot")
    assert shell.page.is_enabled("#connection-add")
    shell.goto("?bootError=" + quote("napllm could not be imported"), wait_attached=False)
    shell.page.wait_for_selector("#boot-error:not([hidden])")
    assert "napllm could not be imported" in shell.page.text_content("#boot-error-message")
    assert shell.page.evaluate("document.activeElement.id") == "boot-error-retry"


# --------------------------------------------------------------------------- example napplets

#: A scripted runtime for the examples: select answers MODEL_TOOLS; generate
#: streams a canned answer, or drives the weather tool loop, or returns JSON.
RESPONDER = """
(model) => {
  const fake = window.__fake;
  fake.requests = [];
  fake.responder = (ep, env) => {
    const post = (e) => setTimeout(() => fake.post(ep, e), 5);
    if (env.type === 'llm.select') return post({type: 'llm.select.result', id: env.id, model});
    if (env.type === 'llm.cancel') {
      const active = fake.active && fake.active.id === env.requestId;
      if (active) post({type: 'llm.generate.result', id: env.requestId, error: {code: 'cancelled', message: 'Generation cancelled; provider charges may still apply.'}});
      fake.active = null;
      return post({type: 'llm.cancel.result', id: env.id, cancelled: active});
    }
    if (env.type !== 'llm.generate') return;
    fake.requests.push(env.request);
    const req = env.request;
    const last = req.messages[req.messages.length - 1];
    if (req.format === 'json') {
      const text = last.content[0].text.includes('broken') ? '{"title": ' : '{"title": "Dune", "year": 1965}';
      return post({type: 'llm.generate.result', id: env.id, result: {content: [{type: 'text', text}], finish: 'stop'}});
    }
    if (req.tools) {
      if (last.role === 'user') {
        return post({type: 'llm.generate.result', id: env.id, result: {content: [
          {type: 'toolCall', toolCallId: 'call_1', name: 'get_weather', arguments: {city: 'Berlin'}},
          {type: 'toolCall', toolCallId: 'call_2', name: 'get_weather', arguments: {city: 'Atlantis'}}], finish: 'toolUse'}});
      }
      return post({type: 'llm.generate.result', id: env.id, result: {content: [{type: 'text', text: 'It is 18°C and clear in Berlin.'}], finish: 'stop'}});
    }
    if (last.content[0].text === 'hang') {
      fake.active = env;
      return post({type: 'llm.delta', requestId: env.id, sequence: 0, event: 'start', block: 'text', blockIndex: 0});
    }
    const parts = ['Hel', 'lo ', 'there'];
    let seq = 0;
    post({type: 'llm.delta', requestId: env.id, sequence: seq++, event: 'start', block: 'text', blockIndex: 0});
    for (const p of parts) post({type: 'llm.delta', requestId: env.id, sequence: seq++, event: 'delta', block: 'text', blockIndex: 0, text: p});
    post({type: 'llm.delta', requestId: env.id, sequence: seq++, event: 'end', block: 'text', blockIndex: 0});
    post({type: 'llm.generate.result', id: env.id, result: {content: [{type: 'text', text: 'Hello there!'}], finish: 'stop'}});
  };
}
"""

MODEL_TOOLS = {**MODEL, "tools": True, "toolChoiceModes": ["auto", "none"]}


def _open_example(shell: Any, name: str) -> Any:
    shell.goto()
    shell.page.evaluate(RESPONDER, MODEL_TOOLS)
    shell.page.wait_for_function("document.querySelectorAll('#napplet-select option').length >= 3")
    shell.page.select_option("#napplet-select", name)
    shell.page.click("#napplet-open")
    frame = shell.wait_frame_ready()
    frame.wait_for_function("() => document.querySelector('#status').textContent.length > 0")
    return frame


def test_chat_napplet_streams_keeps_history_and_stops(shell: Any) -> None:
    frame = _open_example(shell, "chat")
    frame.click("#choose")
    frame.wait_for_function(
        "() => document.querySelector('#model').textContent.includes('Test connection')"
    )
    frame.fill("#prompt", "Hi")
    frame.click("#send")
    frame.wait_for_function("() => document.querySelector('#status').textContent === 'Done.'")
    assert frame.text_content("#history li.assistant").endswith("Hello there!")
    frame.fill("#prompt", "Again")
    frame.press("#prompt", "Control+Enter")
    frame.wait_for_function("() => document.querySelectorAll('#history li').length === 4")
    second = shell.fake("fake.requests[1].messages")
    assert [m["role"] for m in second] == ["user", "assistant", "user"]
    assert second[1]["content"] == [{"type": "text", "text": "Hello there!"}]
    # Stop cancels a running generation; the conversation is left as it was.
    frame.fill("#prompt", "hang")
    frame.click("#send")
    frame.wait_for_function("() => !document.querySelector('#stop').disabled")
    frame.click("#stop")
    frame.wait_for_function(
        "() => document.querySelector('#status').textContent.startsWith('Stopped')"
    )
    assert frame.input_value("#prompt") == "hang"
    assert len(frame.query_selector_all("#history li")) == 4


def test_json_napplet_shows_object_or_error(shell: Any) -> None:
    frame = _open_example(shell, "json")
    frame.click("#choose")
    frame.wait_for_function(
        "() => document.querySelector('#model').textContent.includes('Test connection')"
    )
    select = shell.envelopes()[0]
    assert json.loads(select["json"])["requirements"] == {"json": True}
    frame.click("#send")
    frame.wait_for_function("() => document.querySelector('#status').textContent === 'Done.'")
    assert json.loads(frame.text_content("#result")) == {"title": "Dune", "year": 1965}
    assert shell.fake("fake.requests[0].format") == "json"
    frame.fill("#prompt", "broken please")
    frame.click("#send")
    frame.wait_for_function(
        "() => document.querySelector('#status').textContent === 'The answer is not valid JSON.'"
    )
    assert frame.text_content("#result") == ""


def test_tools_napplet_runs_the_weather_loop(shell: Any) -> None:
    frame = _open_example(shell, "tools")
    frame.click("#choose")
    frame.wait_for_function(
        "() => document.querySelector('#model').textContent.includes('Test connection')"
    )
    frame.click("#send")
    frame.wait_for_function("() => document.querySelector('#status').textContent === 'Done.'")
    assert frame.text_content("#answer") == "It is 18°C and clear in Berlin."
    second = shell.fake("fake.requests[1]")
    assert second["toolChoice"] == "auto"
    assert second["tools"][0]["parameters"] == {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    }
    roles = [m["role"] for m in second["messages"]]
    assert roles == ["user", "assistant", "toolResult", "toolResult"]
    berlin, atlantis = second["messages"][2], second["messages"][3]
    assert berlin["toolCallId"] == "call_1" and berlin["toolName"] == "get_weather"
    assert json.loads(berlin["content"][0]["text"]) == {
        "city": "Berlin",
        "temperature": 18,
        "condition": "sunny",
    }
    assert "isError" not in berlin
    assert atlantis["toolCallId"] == "call_2" and atlantis["isError"] is True
    log = frame.text_content("#log")
    assert "get_weather" in log and "tool error" in log


@pytest.mark.parametrize("name", ["chat", "json", "tools"])
def test_examples_work_as_pages_without_the_llm_domain(shell: Any, name: str) -> None:
    frame = _open_example(shell, name)
    shell.page.uncheck(".llm-toggle")
    shell.page.wait_for_function("window.__fake.closed.length === 1")
    frame = shell.wait_frame_ready()
    frame.wait_for_function("() => document.querySelector('#status').textContent.length > 0")
    assert "no language-model access" in frame.text_content("#status")
    assert frame.is_disabled("#send")
    assert frame.is_disabled("#choose")


def test_lists_read_at_attach_never_overwrite_newer_pushes(shell: Any) -> None:
    shell.goto("?hold=1", wait_attached=False)
    shell.page.wait_for_function("window.__fake.booted")
    pushed = {
        "connections": json.dumps(CONNECTIONS),
        "grants": json.dumps(
            [
                {
                    "key": "g1",
                    "napplet": {"name": "chat", "shortHash": "0123456789ab"},
                    "connectionId": "u-1",
                    "connectionName": "",
                    "account": "Default",
                }
            ]
        ),
    }
    shell.page.evaluate(
        "(p) => { window.__fake.pushOnAttach = p; window.__fake.attach(); }", pushed
    )
    shell.page.wait_for_timeout(200)
    names = shell.page.eval_on_selector_all(
        "#connection-list h3", "(hs) => hs.map((h) => h.textContent)"
    )
    assert names == ["My server", "WebGPU model"]
    # A grant without a connection name shows the connection id instead.
    assert (
        shell.page.text_content("#grant-list li")
        == "chat (#0123456789ab) may use u-1 in profile Default Revoke"
    )


def test_lists_are_read_at_attach(shell: Any) -> None:
    shell.goto()
    shell.page.wait_for_function("document.querySelectorAll('#connection-list h3').length === 1")
    assert shell.page.text_content("#connection-list h3") == "Stale list"
    assert "may use stale" in shell.page.text_content("#grant-list")
