"""The napplet trust boundary against hostile napplets (items of the frame boundary).

Each test is an attack a napplet author could try, against the real shell
(the product dist/; a scripted connection added through the connections form
stands in for a model, its entry counts what reached it) in offline Chromium, with
a hostile server on 127.0.0.1 that records every hit and a UDP listener on
127.0.0.1 that records every datagram. A test fails if its attack works again:
- a napplet navigating its frame to a page of its own never loads it (the
  shell page's `frame-src 'none'`); a document without the prelude in the
  frame (about:blank, with code injected) gets no endpoint: nothing it posts reaches the
  runtime, nothing comes back; either way the endpoint is closed, the
  standing grant revoked and the tab says why; a napplet reloading itself
  still gets a new endpoint, whichever of its document start and the
  frame's load the shell sees first;
- WebRTC sends no UDP packet, from the napplet or from any frame it nests;
- a napplet flooding the shell with 8 MB messages is stopped, the shell's
  JS heap stays bounded and another napplet keeps working;
- forged document starts and a self-reload loop cost bounded work and leave
  no endpoint behind;
- a napplet opened by a link shows its origin everywhere it is named, has a
  sanitised name and starts without LLM access.

The browser-level boundary (CSP, sandbox) is in test_isolation.py; the
deployer's CSP in test_trust_csp.py.
"""

# ruff: noqa: E501  (the JavaScript embedded below keeps its natural line length)

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from recording_host import RecordingHost, recording_host
from shellpage import POLL_MS, Napplet, ShellPage, boot_shell, code, generate

pytestmark = pytest.mark.browser

FULL = "Scripted"
#: The script of the shared page: every allowed generation is answered "ok".
DEFAULT_SCRIPT = {"turns": [{"text": "ok"}], "repeat": True}
LEFT_SANDBOX = "This napplet left its sandboxed page; its model access was closed."


# --------------------------------------------------------------------------- listeners


@pytest.fixture(scope="module")
def hostile() -> Iterator[RecordingHost]:
    with recording_host() as host:
        yield host


@dataclass
class Udp:
    """A UDP socket on 127.0.0.1 recording every datagram's size."""

    port: int
    datagrams: list[int] = field(default_factory=list)


@pytest.fixture
def udp() -> Iterator[Udp]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(0.2)
    state = Udp(sock.getsockname()[1])
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            try:
                data, _ = sock.recvfrom(65535)
            except TimeoutError:
                continue
            except OSError:
                return
            state.datagrams.append(len(data))

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    yield state
    stop.set()
    thread.join(2)
    sock.close()


# --------------------------------------------------------------------------- the shell


@pytest.fixture(scope="module")
def booted(shell_context: Any, product_url: str, test_pages_dir: Path) -> ShellPage:
    return boot_product(shell_context.new_page(), product_url, test_pages_dir)


def boot_product(page: Any, product_url: str, test_pages_dir: Path, query: str = "") -> ShellPage:
    """The product shell on `page` with the scripted connection `FULL` added."""
    return boot_shell(page, product_url, test_pages_dir, query, {FULL: DEFAULT_SCRIPT})


@pytest.fixture
def shell(booted: ShellPage, request_log: Any) -> Iterator[ShellPage]:
    booted.scripted(FULL, DEFAULT_SCRIPT)  # a test may have given it a script of its own
    yield booted
    booted.reset()
    booted.page.evaluate(
        "() => document.querySelectorAll('#notice-list .notice').forEach((n) => n.remove())"
    )


def tab_text(napplet: Napplet) -> str:
    text: str = napplet.page.locator(f"#{napplet.key}-panel").inner_text()
    return text


def wait_stopped(napplet: Napplet, text: str) -> None:
    napplet.page.locator(f"#{napplet.key}-panel .frame-stopped", has_text=text).wait_for()
    assert napplet.page.locator(f"{napplet.iframe_selector}").count() == 0


def endpoint_options(shell: ShellPage) -> int:
    """Endpoints listed in the inspector's filter (without "All endpoints")."""
    count: int = shell.page.locator("#inspector-endpoint option").count()
    return count - 1


# --------------------------------------------------------------------------- 1. navigation


#: The page a napplet navigates its frame to: no prelude, no CSP. It posts with the
#: stolen handle (and a forged document start), then reports what came back.
ESCAPE_PAGE = """<!doctype html><meta charset="utf-8"><title>other</title><script>
const handle = decodeURIComponent(location.hash.slice(1));
const got = [];
addEventListener('message', (e) => { if (e.source === parent) got.push(e.data && e.data.type); });
const report = (what) => fetch('/hit/' + what + '?' + encodeURIComponent(JSON.stringify(got)));
report('ran');
const channel = new MessageChannel();
channel.port1.onmessage = (e) => got.push('port:' + (e.data && e.data.type));
parent.postMessage({type: 'napllm.documentStart', secret: '0'.repeat(32)}, '*',
                   [channel.port2, new MessageChannel().port2]);
parent.postMessage({type: 'napllm.documentStart'}, '*');
for (const id of ['g-escape', 'g-escape-2']) {
  const envelope = {type: 'llm.generate', id, request: {handle,
    messages: [{role: 'user', content: [{type: 'text', text: 'exfiltrate'}]}]}};
  parent.postMessage(envelope, '*');
  channel.port1.postMessage(envelope);
  postMessage(envelope, '*');
}
setTimeout(() => report('after'), 1500);
</script>"""


def test_navigating_away_gets_no_endpoint_and_closes_access(
    shell: ShellPage, hostile: RecordingHost
) -> None:
    other = hostile.page("/other.html", ESCAPE_PAGE)
    shell.scripted(FULL, [{"text": ["granted"]}])
    app = shell.open_napplet()
    handle = app.select(FULL)
    app.post(generate("g1", handle))
    shell.remember()  # "Allow this napplet on this connection until I close the page"
    assert app.wait_for("g1")["result"]["content"][0]["text"] == "granted"
    assert shell.page.locator("#grant-list button.revoke").count() == 1
    submissions = shell.script_requests(FULL)
    app.evaluate("(url) => { location.href = url; }", f"{other}#{quote(handle)}")
    wait_stopped(app, LEFT_SANDBOX)
    # the shell page's frame-src keeps the frame from loading the page at all:
    # the navigation (a request whose URL could carry data) never left
    assert hostile.hits_for("/other.html") == [] and hostile.hits_for("/hit/") == []
    assert shell.script_requests(FULL) == submissions
    assert shell.open_dialogs() == 0
    # the standing grant of this napplet is gone; the user is told
    shell.page.wait_for_function("() => !document.querySelector('#grant-list button.revoke')")
    assert any(LEFT_SANDBOX in text for text in shell.notices())
    # the frame is gone: the napplet can be reloaded to start over
    assert "Reload" in tab_text(app)


#: What runs in a document without the prelude: posts the stolen handle every
#: way it can (raw, on a port of its own, with a forged start, to itself) and
#: returns what came back.
FOREIGN_ATTEMPTS = """async (handle) => {
  const got = [];
  addEventListener('message', (e) => { if (e.source === parent) got.push(e.data && e.data.type); });
  const channel = new MessageChannel();
  channel.port1.onmessage = (e) => got.push('port:' + (e.data && e.data.type));
  parent.postMessage({type: 'napllm.documentStart', secret: '0'.repeat(32)}, '*',
                     [channel.port2, new MessageChannel().port2]);
  parent.postMessage({type: 'napllm.documentStart'}, '*');
  for (const id of ['g-escape', 'g-escape-2']) {
    const envelope = {type: 'llm.generate', id, request: {handle,
      messages: [{role: 'user', content: [{type: 'text', text: 'exfiltrate'}]}]}};
    parent.postMessage(envelope, '*');
    channel.port1.postMessage(envelope);
    postMessage(envelope, '*');
  }
  await new Promise((resolve) => setTimeout(resolve, 600));
  return {got, prelude: 'napplet' in window};
}"""


def test_a_document_without_the_prelude_reaches_nothing(shell: ShellPage) -> None:
    # about:blank replaces the napplet's document inside the sandbox; the code
    # is injected into it, as if that document carried it
    app = shell.open_napplet()
    handle = app.select(FULL)
    submissions = shell.script_requests(FULL)
    app.evaluate("() => { location.href = 'about:blank'; }")
    frame = app.frame
    frame.wait_for_function("() => location.href === 'about:blank'", polling=POLL_MS)
    outcome = frame.evaluate(FOREIGN_ATTEMPTS, handle)
    assert outcome == {"got": [], "prelude": False}, outcome
    assert shell.script_requests(FULL) == submissions and shell.open_dialogs() == 0
    wait_stopped(app, LEFT_SANDBOX)


def _reload_keeps_working(shell: ShellPage, prefix: str = "post-at-start:") -> None:
    """A napplet reloading itself gets a new endpoint; its grant stays; nothing stops it.

    The new document posts an envelope while it is parsed (`prefix`: to the
    parent, the projection's transport, or "post-at-start-self:" to itself)."""
    shell.scripted(FULL, [{"text": ["one"]}, {"text": ["two"]}])
    app = shell.open_napplet()
    handle = app.select(FULL)
    app.post(generate("g1", handle))
    shell.remember()
    app.wait_for("g1")
    # the new document posts while it is still loading (before the frame's load event)
    early = json.dumps({"type": "llm.describe", "id": "early", "handle": handle})
    app.evaluate(
        f"() => {{ window.name = {json.dumps(prefix)} + {json.dumps(early)}; location.reload(); }}"
    )
    app.frame.wait_for_function(
        "() => window.probe && window.probe.envelopes().length === 1", polling=POLL_MS
    )
    assert code(app.envelopes()[0]) == "selection-expired"
    fresh = app.select(FULL, rid="s2")
    assert fresh != handle
    # the grant is the napplet's (same bytes): no dialog for the new endpoint
    app.post(generate("g2", fresh))
    assert app.wait_for("g2")["result"]["content"][0]["text"] == "two"
    # well past the grace period the shell gives a load to be reported
    shell.page.wait_for_timeout(2500)
    assert app.page.locator(f"#{app.key}-panel .frame-stopped").count() == 0
    app.post({"type": "llm.describe", "id": "d3", "handle": fresh})
    assert "model" in app.wait_for("d3", "llm.describe.result")


def test_reload_with_document_start_before_load(shell: ShellPage) -> None:
    # the probe holds its load event back after posting: the start comes first
    _reload_keeps_working(shell)


def test_reload_with_an_early_post_to_its_own_window(shell: ShellPage) -> None:
    # the alias: posted to the document's own window, forwarded by its prelude
    _reload_keeps_working(shell, "post-at-start-self:")


#: Held document starts: each reaches the shell only after the frame's next load
#: event (plus 300 ms), so the shell sees load first, start second. Whatever a
#: frame posts after a held start is held behind it, in order (the browser
#: delivers one window's messages to another in the order they were sent).
HOLD_STARTS = """(() => {
  const held = [];
  const add = EventTarget.prototype.addEventListener;
  EventTarget.prototype.addEventListener = function (type, listener, options) {
    if (this === window && type === 'message' && typeof listener === 'function') {
      const wrapped = (event) => {
        const d = event.data;
        const start = d && d.type === 'napllm.documentStart';
        if (!event.__released && (start || held.some((h) => h.event.source === event.source))) {
          held.push({event, listener});
          return;
        }
        listener.call(this, event);
      };
      return add.call(this, type, wrapped, options);
    }
    return add.call(this, type, listener, options);
  };
  window.__heldStarts = 0;
  add.call(document, 'load', (event) => {
    if (!(event.target instanceof HTMLIFrameElement)) return;
    setTimeout(() => {
      for (const {event: e, listener} of held.splice(0)) {
        const copy = new MessageEvent('message', {data: e.data, source: e.source, ports: [...e.ports]});
        copy.__released = true;
        window.__heldStarts += 1;
        listener.call(window, copy);
      }
    }, 300);
  }, true);
})();"""


def test_reload_with_document_start_after_load(
    browser: Any, product_url: str, test_pages_dir: Path
) -> None:
    context = browser.new_context()
    try:
        page = context.new_page()
        page.add_init_script(HOLD_STARTS)
        shell = boot_product(page, product_url, test_pages_dir)
        _reload_keeps_working(shell)
        # the reordering really happened (first document and reloads)
        assert page.evaluate("window.__heldStarts") >= 2
    finally:
        context.close()


#: Added to every document of a fresh context, before any of its scripts: in a
#: napplet frame's about:blank document whose window name carries a stolen
#: handle ("escape:<how>:<handle>"), it posts that handle to the parent the
#: projection's way (generate, select, describe) from its very first moment
#: and then every 20 ms for a second, and nests a frame (nothing removes it:
#: this document has no prelude) that posts to its grandparent, the shell,
#: and to `top`. It records what comes back from the parent and whether the
#: nested frame ran; then it stays ("stay"), or goes back into the napplet's
#: own history entry ("back"), or reloads itself ("reload").
ESCAPE_INIT = """(() => {
  if (location.href !== 'about:blank' || window.parent === window) return;
  const match = /^escape:(\\w+):(.*)$/.exec(window.name);
  if (!match) return;
  const [, how, handle] = match;
  window.name = '';
  window.got = []; window.nested = 0; window.done = false;
  addEventListener('message', (e) => {
    if (e.source === parent) got.push(e.data && e.data.type);
    else if (e.data === 'nested-ran') nested += 1;
  });
  const ask = [{role: 'user', content: [{type: 'text', text: 'exfiltrate'}]}];
  let n = 0;
  const burst = () => {
    for (let k = 0; k < 5; k++, n++) {
      parent.postMessage({type: 'llm.generate', id: 'escape-g' + n, request: {handle, messages: ask}}, '*');
      parent.postMessage({type: 'llm.select', id: 'escape-s' + n}, '*');
      parent.postMessage({type: 'llm.describe', id: 'escape-d' + n, handle}, '*');
    }
  };
  burst();
  const timer = setInterval(burst, 20);
  const nest = () => {
    const inner = 'parent.postMessage("nested-ran", "*");'
      + 'const ask = [{role: "user", content: [{type: "text", text: "nested"}]}];'
      + 'for (let i = 0; i < 5; i++) {'
      + ' parent.parent.postMessage({type: "llm.generate", id: "escape-n" + i, request: {handle: ' + JSON.stringify(handle) + ', messages: ask}}, "*");'
      + ' top.postMessage({type: "llm.select", id: "escape-t" + i}, "*"); }';
    const frame = document.createElement('iframe');
    frame.srcdoc = '<scr' + 'ipt>' + inner + '</scr' + 'ipt>';
    (document.body || document.documentElement).appendChild(frame);
  };
  if (document.documentElement) nest(); else addEventListener('DOMContentLoaded', nest);
  setTimeout(() => {
    clearInterval(timer);
    window.done = true;
    setTimeout(() => {
      if (how === 'back') history.back();
      else if (how === 'reload') { window.name = 'escape:stay:' + handle; location.reload(); }
    }, 400);
  }, 1000);
})();"""


@pytest.fixture(scope="module")
def escape_shell(browser: Any, product_url: str, test_pages_dir: Path) -> Iterator[ShellPage]:
    """A shell whose context adds ESCAPE_INIT to every document."""
    ctx = browser.new_context()
    try:
        page = ctx.new_page()
        page.add_init_script(ESCAPE_INIT)
        yield boot_product(page, product_url, test_pages_dir)
    finally:
        ctx.close()


def inspector_text(shell: ShellPage) -> str:
    """Everything the envelope inspector lists now (opened if it is closed)."""
    page = shell.page
    page.evaluate("() => { document.querySelector('details.inspector-wrap').open = true; }")
    page.wait_for_function(
        "() => { const n = parseInt(document.querySelector('#inspector-count').textContent, 10) || 0;"
        " return document.querySelectorAll('#inspector-list > li').length === n; }"
    )
    text: str = page.evaluate(
        "() => [...document.querySelectorAll('#inspector-list pre')].map((p) => p.textContent).join('\\n')"
    )
    return text


@pytest.mark.parametrize("how", ["stay", "back", "reload"])
def test_a_replaced_document_posting_to_the_parent_reaches_nothing(
    escape_shell: ShellPage, request_log: Any, how: str
) -> None:
    # The projection's transport names the frame, not the document: the
    # document that replaced the napplet's posts with the napplet's standing
    # grant from its first moment, and none of it may act or be answered.
    shell = escape_shell
    shell.scripted(FULL, [{"text": ["granted"]}])
    app = shell.open_napplet()
    handle = app.select(FULL)
    app.post(generate("g1", handle))
    shell.remember()
    assert app.wait_for("g1")["result"]["content"][0]["text"] == "granted"
    submissions = shell.script_requests(FULL)
    app.evaluate(
        "([how, handle]) => { window.name = 'escape:' + how + ':' + handle; location.href = 'about:blank'; }",
        [how, handle],
    )
    frame = app.frame
    frame.wait_for_function(
        "() => location.href === 'about:blank' && window.done === true", polling=POLL_MS
    )
    outcome = frame.evaluate("() => ({got, nested, prelude: 'napplet' in window})")
    # nothing came back; the nested frame did run (and posted to the shell)
    assert outcome == {"got": [], "nested": 1, "prelude": False}, outcome
    if how == "back":
        # the napplet's own entry again: a fresh document with the prelude, a new endpoint
        app.wait_ready()
    else:
        wait_stopped(app, LEFT_SANDBOX)
        shell.page.wait_for_function("() => !document.querySelector('#grant-list button.revoke')")
    shell.page.wait_for_timeout(500)
    assert shell.script_requests(FULL) == submissions
    assert shell.open_dialogs() == 0
    assert "escape-" not in inspector_text(shell)
    if how == "back":
        # the old handle is gone with the old endpoint; the new one works
        app.post({"type": "llm.describe", "id": "d-after", "handle": handle})
        assert code(app.wait_for("d-after", "llm.describe.result")) == "selection-expired"
        assert app.select(FULL, rid="s-after")
    shell.reset()


def test_a_javascript_url_does_not_replace_the_napplet(shell: ShellPage) -> None:
    # Chromium does not run a javascript: URL in the napplet frame: the napplet
    # cannot make a document of its own without the prelude that way
    app = shell.open_napplet()
    handle = app.select(FULL)
    app.evaluate(
        """(handle) => { location.href = 'javascript:' + JSON.stringify('<script>parent.postMessage('
             + JSON.stringify({type: 'llm.describe', id: 'escape-js', handle}) + ', "*")</' + 'script>'); }""",
        handle,
    )
    shell.page.wait_for_timeout(1000)
    assert app.evaluate("() => typeof window.probe === 'object' && 'llm' in window.napplet")
    assert [e for e in app.envelopes() if e.get("id") == "escape-js"] == []
    app.post({"type": "llm.describe", "id": "d1", "handle": handle})
    assert "model" in app.wait_for("d1", "llm.describe.result")


def test_a_raw_flood_of_small_envelopes_is_stopped(shell: ShellPage) -> None:
    app = shell.open_napplet()
    handle = app.select(FULL)
    other = shell.open_napplet()
    other_handle = other.select(FULL, rid="s-other")
    # 12,000 envelopes to the parent in one task: past the count the shell meters
    other.evaluate(
        """(handle) => { for (let i = 0; i < 12000; i++)
             parent.postMessage({type: 'llm.describe', id: 'f' + i, handle}, '*'); }""",
        other_handle,
    )
    wait_stopped(other, "sent too many messages")
    app.post({"type": "llm.describe", "id": "d1", "handle": handle})
    assert "model" in app.wait_for("d1", "llm.describe.result")


# --------------------------------------------------------------------------- 4. churn


def test_forged_starts_and_a_reload_loop_are_bounded(
    shell: ShellPage, hostile: RecordingHost
) -> None:
    app = shell.open_napplet()
    handle = app.select(FULL)
    # 4,000 forged starts (wrong secret, fresh ports; no secret at all)
    app.evaluate(
        """() => { for (let i = 0; i < 2000; i++) {
             parent.postMessage({type: 'napllm.documentStart', secret: String(i).padStart(32, '0')},
                                '*', [new MessageChannel().port2, new MessageChannel().port2]);
             parent.postMessage({type: 'napllm.documentStart'}, '*'); } }"""
    )
    app.post({"type": "llm.describe", "id": "d1", "handle": handle})
    # the endpoint is the same one: its handle still works
    assert "model" in app.wait_for("d1", "llm.describe.result")
    assert endpoint_options(shell) == 1
    # a napplet reloading itself in a loop is stopped; closed endpoints leave no trace
    loop = hostile.page(
        "/loop/index.html",
        """<!doctype html><meta charset="utf-8"><title>loop</title><script>
        const n = Number(window.name || 0);
        window.name = String(n + 1);
        postMessage({type: 'llm.describe', id: 'd' + n, handle: 'none'}, '*');
        setTimeout(() => location.reload(), 30);
        </script>""",
    )
    before = shell.page.locator("#napplet-tabs .tab").count()
    shell.page.fill("#napplet-url", loop)
    shell.page.click("#napplet-url-open")
    shell.page.wait_for_function(
        "(n) => document.querySelectorAll('#napplet-tabs .tab').length > n", arg=before
    )
    key = (shell.page.locator("#napplet-tabs .tab").last.get_attribute("id") or "").removesuffix(
        "-tab"
    )
    looping = Napplet(shell, key, loop)
    shell.open.append(looping)
    wait_stopped(looping, "reloaded itself too often")
    assert endpoint_options(shell) <= 1
    # the other napplet is unaffected
    app.post({"type": "llm.describe", "id": "d2", "handle": handle})
    assert "model" in app.wait_for("d2", "llm.describe.result")


# --------------------------------------------------------------------------- 3. flood


FLOOD = """<!doctype html><meta charset="utf-8"><title>flood</title><body><script>
window.sent = 0;
const pad = 'x'.repeat(8 * 1000 * 1000);
(async () => {
  for (let i = 0; i < 500; i++) {
    parent.postMessage({type: 'x.flood', id: 'r' + i, pad}, '*');  // raw, to the shell
    postMessage({type: 'x.flood', id: 'f' + i, pad}, '*');  // forwarded by the prelude
    window.sent = i + 1;
    if (i % 4 === 3) await new Promise((resolve) => setTimeout(resolve, 0));
  }
})();
</script>"""


@pytest.mark.parametrize("transport", ["parent", "self"])
def test_binary_payloads_are_metered_by_their_bytes(shell: ShellPage, transport: str) -> None:
    # Six envelopes carrying 32 MiB ArrayBuffers, posted in one task: each
    # was metered by its small `unclonable` marker, so no number of them
    # stopped the frame; by their bytes the window's budget is spent by two.
    app = shell.open_napplet()
    app.evaluate(
        """(t) => { probe.useTransport(t);
             for (let i = 0; i < 6; i++)
               probe.post({type: 'llm.describe', id: 'b' + i, handle: new ArrayBuffer(32 * 1024 * 1024)}); }""",
        transport,
    )
    wait_stopped(app, "sent too many messages")


def test_a_flooding_napplet_is_stopped_and_memory_stays_bounded(
    shell: ShellPage, hostile: RecordingHost
) -> None:
    app = shell.open_napplet()
    handle = app.select(FULL)
    cdp = shell.page.context.new_cdp_session(shell.page)
    shell.page.evaluate("() => new Promise((r) => setTimeout(r, 50))")
    cdp.send("HeapProfiler.collectGarbage")
    baseline = cdp.send("Runtime.getHeapUsage")["usedSize"]
    flood = hostile.page("/flood/index.html", FLOOD)
    before = shell.page.locator("#napplet-tabs .tab").count()
    shell.page.fill("#napplet-url", flood)
    shell.page.click("#napplet-url-open")
    shell.page.wait_for_function(
        "(n) => document.querySelectorAll('#napplet-tabs .tab').length > n", arg=before
    )
    key = (shell.page.locator("#napplet-tabs .tab").last.get_attribute("id") or "").removesuffix(
        "-tab"
    )
    flooder = Napplet(shell, key, flood)
    shell.open.append(flooder)
    peak = baseline
    deadline = time.monotonic() + 60
    stopped = shell.page.locator(f"#{key}-panel .frame-stopped")
    while stopped.count() == 0 and time.monotonic() < deadline:
        peak = max(peak, cdp.send("Runtime.getHeapUsage")["usedSize"])
        time.sleep(0.05)
    wait_stopped(flooder, "sent too many messages")
    for _ in range(10):
        peak = max(peak, cdp.send("Runtime.getHeapUsage")["usedSize"])
        time.sleep(0.05)
    # 500 x 8 MB is 4 GB of text (8 GB as UTF-16); the shell keeps a bounded share
    assert peak - baseline < 400 * 1024 * 1024, (baseline, peak)
    cdp.send("HeapProfiler.collectGarbage")
    after = cdp.send("Runtime.getHeapUsage")["usedSize"]
    assert after - baseline < 64 * 1024 * 1024, (baseline, after)
    # the inspector kept a bounded amount of text
    kept = shell.page.evaluate(
        "() => [...document.querySelectorAll('#inspector-list pre')]"
        ".reduce((n, p) => n + p.textContent.length, 0)"
    )
    assert kept < 4 * 1024 * 1024
    assert any("sent too many messages" in text for text in shell.notices())
    # the other napplet keeps working
    app.post(generate("g1", handle))
    shell.allow()
    assert app.wait_for("g1")["result"]["content"][0]["text"] == "ok"
    cdp.detach()


# --------------------------------------------------------------------------- 2. WebRTC


#: Every way a napplet could reach an RTCPeerConnection: its own window, a frame it
#: appends, a frame in its markup (inline handler), nested srcdoc frames (with and
#: without a sandbox of their own), document.open, and constructors of other realms.
WEBRTC_ATTEMPTS = """async (port) => {
  const ice = {iceServers: [{urls: 'stun:127.0.0.1:' + port},
                            {urls: 'turn:127.0.0.1:' + port, username: 'exfil', credential: 'x'}]};
  const tryWith = async (reach) => {
    let Ctor;
    try { Ctor = reach(); } catch (e) { return 'unreachable ' + e.name; }
    if (typeof Ctor !== 'function') return 'absent';
    try {
      const pc = new Ctor(ice);
      pc.createDataChannel('x');
      await pc.setLocalDescription(await pc.createOffer());
      return 'created';
    } catch (e) { return 'threw ' + e.name; }
  };
  const out = {};
  out.own = await tryWith(() => window.RTCPeerConnection);
  out.webkit = await tryWith(() => window.webkitRTCPeerConnection);
  const blank = document.createElement('iframe');
  document.body.append(blank);
  out.appended = await tryWith(() => blank.contentWindow.RTCPeerConnection);
  out.framesIndex = await tryWith(() => frames[frames.length - 1].RTCPeerConnection);
  out.grandchild = await tryWith(() => {
    const inner = blank.contentWindow.document.createElement('iframe');
    blank.contentWindow.document.body.append(inner);
    return inner.contentWindow.RTCPeerConnection;
  });
  try { document.open(); out.open = 'opened'; } catch (e) { out.open = 'threw ' + e.name; }
  try { blank.contentWindow.Document.prototype.open.call(document); out.foreignOpen = 'opened'; }
  catch (e) { out.foreignOpen = 'threw ' + e.name; }
  const holder = document.createElement('div');
  holder.innerHTML = '<iframe></iframe>';
  document.body.append(holder);
  out.innerHTML = await tryWith(() => holder.firstChild.contentWindow.RTCPeerConnection);
  const run = 'const ice = ' + JSON.stringify(ice) + ';'
    + 'try { const pc = new RTCPeerConnection(ice); pc.createDataChannel("x");'
    + ' pc.createOffer().then((o) => pc.setLocalDescription(o)); parent.postMessage("rtc:created", "*"); }'
    + ' catch (e) { parent.postMessage("rtc:" + e.name, "*"); }';
  const nested = (sandbox, mount) => new Promise((resolve) => {
    const f = document.createElement('iframe');
    if (sandbox) f.setAttribute('sandbox', 'allow-scripts');
    const onMessage = (e) => { if (typeof e.data === 'string' && e.data.startsWith('rtc:')) {
      removeEventListener('message', onMessage); resolve(e.data); } };
    addEventListener('message', onMessage);
    f.srcdoc = '<script>' + run + '<' + '/script>';
    (mount || ((frame) => document.body.append(frame)))(f);
    setTimeout(() => resolve('did not run'), 1500);
  });
  out.nestedSrcdoc = await nested(false);
  // the prelude's DOM methods cannot be taken away from it
  const saved = [Node.prototype.removeChild, Element.prototype.getElementsByTagName,
                 Object.getOwnPropertyDescriptor(MutationRecord.prototype, 'addedNodes')];
  Node.prototype.removeChild = function () { return arguments[0]; };
  Element.prototype.getElementsByTagName = () => [];
  Object.defineProperty(MutationRecord.prototype, 'addedNodes', {get: () => [], configurable: true});
  Object.defineProperty(Array.prototype, '0', {set() {}, configurable: true});
  out.sabotaged = await nested(true);
  Node.prototype.removeChild = saved[0];
  Element.prototype.getElementsByTagName = saved[1];
  Object.defineProperty(MutationRecord.prototype, 'addedNodes', saved[2]);
  delete Array.prototype[0];
  out.nestedSandboxed = await nested(true);
  out.closedShadow = await nested(true, (frame) => {
    const host = document.createElement('div');
    document.body.append(host);
    host.attachShadow({mode: 'closed'}).append(frame);
  });
  const frameMarkup = '<iframe sandbox="allow-scripts" srcdoc="<script>'
    + run.replaceAll('"', '&quot;') + '<' + '/script>"></iframe>';
  out.declarative = await nested(true, () => {
    const host = document.createElement('div');
    document.body.append(host);
    try {
      host.setHTMLUnsafe('<div><template shadowrootmode="closed">' + frameMarkup + '</template></div>');
    } catch (e) { out.setHTMLUnsafe = 'threw ' + e.name; }
  });
  try { Document.parseHTMLUnsafe('<template shadowrootmode="open"></template>'); out.parse = 'parsed'; }
  catch (e) { out.parse = 'threw ' + e.name; }
  await new Promise((r) => setTimeout(r, 1000));
  return out;
}"""


def test_webrtc_sends_no_udp_from_the_napplet_or_its_frames(shell: ShellPage, udp: Udp) -> None:
    # positive control: the shell page itself (no prelude) does reach the listener
    shell.page.evaluate(
        """(port) => { const pc = new RTCPeerConnection({iceServers: [{urls: 'stun:127.0.0.1:' + port}]});
             pc.createDataChannel('x'); pc.createOffer().then((o) => pc.setLocalDescription(o));
             window.__controlPc = pc; }""",
        udp.port,
    )
    deadline = time.monotonic() + 10
    while not udp.datagrams and time.monotonic() < deadline:
        time.sleep(0.05)
    assert udp.datagrams, "the UDP listener saw nothing even from the shell page"
    shell.page.evaluate("() => { window.__controlPc.close(); delete window.__controlPc; }")
    time.sleep(0.3)
    udp.datagrams.clear()
    app = shell.open_napplet()
    out = app.evaluate(WEBRTC_ATTEMPTS, udp.port)
    time.sleep(1.0)
    assert udp.datagrams == [], json.dumps(out)
    for name in ("own", "webkit", "appended", "framesIndex", "grandchild", "innerHTML"):
        assert out[name] == "absent" or out[name].startswith("unreachable"), (name, out)
    assert out["open"].startswith("threw") and out["foreignOpen"].startswith("threw"), out
    for name in ("nestedSrcdoc", "nestedSandboxed", "sabotaged", "closedShadow", "declarative"):
        assert out[name] == "did not run", (name, out)
    assert out["setHTMLUnsafe"].startswith("threw") and out["parse"].startswith("threw"), out
    # the napplet itself is unharmed
    assert app.select(FULL)


def test_a_napplet_with_declarative_shadow_roots_does_not_run(
    shell: ShellPage, hostile: RecordingHost
) -> None:
    # a closed declarative shadow root would hide a nested frame from the prelude
    url = hostile.page(
        "/dsd/index.html",
        '<!doctype html><div><template shadowrootmode="closed">'
        '<iframe sandbox="allow-scripts" srcdoc="<script>new RTCPeerConnection()</script>">'
        "</iframe></template></div>",
    )
    shell.page.fill("#napplet-url", url)
    shell.page.click("#napplet-url-open")
    shell.page.locator("#notice-list .notice", has_text="declarative shadow roots").wait_for()
    assert shell.page.locator("iframe.napplet-frame").count() == 0
    shell.page.locator("#napplet-tabs .tab").last.wait_for()
    key = (shell.page.locator("#napplet-tabs .tab").last.get_attribute("id") or "").removesuffix(
        "-tab"
    )
    shell.open.append(Napplet(shell, key, url))


# --------------------------------------------------------------------------- 7. dev mode


def test_a_link_shows_the_origin_and_starts_without_llm_access(
    browser: Any, product_url: str, test_pages_dir: Path, hostile: RecordingHost
) -> None:
    # a hostile page named like a listed napplet, with look-alike tricks in its path
    hostile.page(
        "/\u202echat (built-in)/index.html", "<!doctype html><title>x</title><p>hostile chat</p>"
    )
    url = hostile.url + quote("\u202echat (built-in)") + "/index.html"
    origin = hostile.url.rstrip("/")
    context = browser.new_context()
    try:
        napplet = "?napplet=" + quote(url, safe="")
        shell = boot_product(context.new_page(), product_url, test_pages_dir, napplet)
        page = shell.page
        page.wait_for_function("() => document.querySelectorAll('#napplet-tabs .tab').length === 1")
        tab = page.locator("#napplet-tabs .tab")
        tab_label = tab.inner_text()
        assert origin in tab_label
        assert "\u202e" not in tab_label and "built-in" not in tab_label.lower()
        assert "chat" in tab_label
        panel = page.locator(".tabpanel").first
        assert origin in panel.locator(".identity").inner_text()
        toggle = panel.locator(".llm-toggle")
        assert not toggle.is_checked()
        page.wait_for_function(
            "() => { const f = document.querySelector('iframe.napplet-frame'); return f && f.srcdoc; }"
        )
        frame = page.locator("iframe.napplet-frame").element_handle().content_frame()
        frame.wait_for_function("() => 'napplet' in window")
        assert frame.evaluate("() => Object.keys(window.napplet)") == []
        # the person turns LLM access on (a real click); dialogs name the origin
        old = frame.frame_element()
        toggle.click()
        page.wait_for_function(
            "(old) => { const f = document.querySelector('iframe.napplet-frame');"
            " return f && f !== old && f.srcdoc; }",
            arg=old,
        )
        frame = page.locator("iframe.napplet-frame").element_handle().content_frame()
        frame.wait_for_function("() => window.napplet && window.napplet.llm")
        frame.evaluate(
            "() => { window.picked = null; napplet.llm.select().then((m) => window.picked = m); }"
        )
        chooser = shell.chooser()
        assert origin in chooser.inner_text()
        shell.choose(FULL)
        frame.wait_for_function("() => window.picked !== null", polling=POLL_MS)
        handle = frame.evaluate("() => window.picked.handle")
        frame.evaluate(
            "(h) => { window.done = null; napplet.llm.generate({handle: h, messages: [{role: 'user',"
            " content: [{type: 'text', text: 'hi'}]}]}).then((r) => window.done = r); }",
            handle,
        )
        consent = shell.consent()
        consent_text = consent.inner_text()
        assert origin in consent_text and "\u202e" not in consent_text
        shell.allow()
        frame.wait_for_function("() => window.done !== null", polling=POLL_MS)
        options = page.evaluate(
            "() => [...document.querySelectorAll('#inspector-endpoint option')].map((o) => o.text)"
        )
        assert any(origin in option for option in options), options
    finally:
        context.close()
