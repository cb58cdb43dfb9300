"""Browser isolation of napplet frames around the real shell (NIP-5D web projection;
NAP-LLM, Shell Behavior and Security Considerations).

Checked in Chromium with napllm running in Pyodide (the product dist/, a
scripted connection added through the connections form stands in for a
model; its entry's counts show what reached it):
- the napplet CSP blocks ``fetch``, XHR, WebSocket, Workers and remote images
  (no request is made, a violation is reported inside the frame);
- the frame's sandbox is exactly ``allow-scripts``: opaque origin, no access
  to the shell's document or storage;
- one frame cannot act as another: reused ids, foreign handles
  (``selection-expired``), foreign cancels (``cancelled: false``), no
  cross-delivery, and a frame posting fake results into another is ignored;
- domain absence: no ``window.napplet.llm`` and no reply;
- a reload is a new endpoint: old handles expire, pending work is cancelled;
- messages from anything but a frame the shell created are dropped silently;
- values JSON cannot carry (explicit ``null`` in a record, ``undefined``,
  ``Map``, ``Date``, ``NaN``) become ``invalid-request``;
- no request leaves 127.0.0.1, in every test (``request_log``) and over one
  whole boot + generation in a fresh browser context.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from shellpage import (
    POLL_MS,
    ShellPage,
    boot_shell,
    check_generation,
    code,
    connection_entry,
    deltas_of,
    generate,
    install_napplets,
    napplet_query,
    user,
    wait_deltas,
)

pytestmark = pytest.mark.browser

FULL = "Scripted"


@pytest.fixture(scope="module")
def booted(shell_context: Any, product_url: str, test_pages_dir: Path) -> ShellPage:
    script = {"turns": [{"text": "ok"}], "repeat": True}
    return boot_shell(shell_context.new_page(), product_url, test_pages_dir, "", {FULL: script})


def inspector_entries(shell: ShellPage) -> int:
    """How many records the envelope inspector holds."""
    count: int = shell.page.locator("#inspector-list > li").count()
    return count


# --------------------------------------------------------------------------- CSP and sandbox


BLOCKED_PROBES = {
    "fetch": """async (url) => {
        try { await fetch(url); return 'loaded'; } catch (e) { return 'blocked:' + e.name; }
    }""",
    "xhr": """(url) => new Promise((resolve) => {
        const xhr = new XMLHttpRequest();
        try {
            xhr.open('GET', url);
            xhr.onload = () => resolve('loaded');
            xhr.onerror = () => resolve('blocked:error');
            xhr.send();
        } catch (e) { resolve('blocked:' + e.name); }
    })""",
    "websocket": """(url) => new Promise((resolve) => {
        const ws_url = url.replace(/^http/, 'ws');
        try {
            const ws = new WebSocket(ws_url);
            ws.onopen = () => resolve('loaded');
            ws.onerror = () => resolve('blocked:error');
        } catch (e) { resolve('blocked:' + e.name); }
    })""",
    "worker": """(url) => new Promise((resolve) => {
        try {
            const blob = new Blob(['postMessage("up")'], {type: 'text/javascript'});
            const worker = new Worker(URL.createObjectURL(blob));
            worker.onmessage = () => resolve('loaded');
            worker.onerror = () => resolve('blocked:error');
        } catch (e) { resolve('blocked:' + e.name); }
    })""",
    "image": """(url) => new Promise((resolve) => {
        const img = new Image();
        img.onload = () => resolve('loaded');
        img.onerror = () => resolve('blocked:error');
        img.src = url;
    })""",
}


@pytest.mark.parametrize("kind", sorted(BLOCKED_PROBES))
def test_csp_blocks_network_and_workers(shell: ShellPage, request_log: Any, kind: str) -> None:
    app = shell.open_napplet()
    target = f"{shell.dist_url}index.html?csp-probe={kind}"
    outcome = app.evaluate(BLOCKED_PROBES[kind], target)
    assert outcome.startswith("blocked"), outcome
    violations = app.evaluate("() => window.probe.violations")
    expected = {"worker": "worker-src", "image": "img-src"}.get(kind, "connect-src")
    assert expected in {v["directive"] for v in violations}, violations
    # the request never reached the network: at most an attempt Chromium failed
    # itself with a CSP block, and no response
    attempts = [u for u in request_log.requests if "csp-probe" in u]
    assert not [u for u in attempts if u in request_log.statuses]
    failures = [why for u, why in request_log.failed if "csp-probe" in u]
    assert len(failures) == len(attempts)
    assert all("csp" in why.lower() for why in failures), failures


def test_frame_sandbox_is_exactly_allow_scripts(shell: ShellPage) -> None:
    app = shell.open_napplet()
    attrs = shell.page.evaluate(
        "(sel) => { const f = document.querySelector(sel);"
        " return {sandbox: f.getAttribute('sandbox'), tokens: [...f.sandbox],"
        " allow: f.getAttribute('allow'), src: f.getAttribute('src')}; }",
        app.iframe_selector,
    )
    assert attrs == {
        "sandbox": "allow-scripts",
        "tokens": ["allow-scripts"],
        "allow": None,
        "src": None,
    }
    seen = app.evaluate(
        """() => {
            const attempt = (fn) => {
                try { fn(); return 'allowed'; } catch (e) { return e.name; }
            };
            return {
                origin: window.origin,
                cookie: attempt(() => document.cookie),
                storage: attempt(() => window.localStorage),
                parentDocument: attempt(() => window.parent.document.title),
                parentHost: attempt(() => window.parent.napllmHost.postAll),
                nostr: 'nostr' in window,
                csp: document.querySelector('meta[http-equiv="Content-Security-Policy"]') !== null,
            };
        }"""
    )
    assert seen == {
        "origin": "null",
        "cookie": "SecurityError",
        "storage": "SecurityError",
        "parentDocument": "SecurityError",
        "parentHost": "SecurityError",
        "nostr": False,
        "csp": True,
    }


# --------------------------------------------------------------------------- endpoints


def test_one_frame_cannot_act_as_another(shell: ShellPage) -> None:
    shell.scripted(
        FULL, [{"text": "alpha text", "stall": True}, {"text": "beta text", "stall": True}]
    )
    alpha = shell.open_napplet()
    beta = shell.open_napplet()
    handle_a = alpha.select(FULL, rid="s1")
    handle_b = beta.select(FULL, rid="s1")  # the same request id in both frames
    assert handle_a != handle_b
    # both frames run a generation with the same id at the same time
    alpha.post(generate("g1", handle_a, user("alpha prompt")))
    shell.allow()
    wait_deltas(alpha, "g1")
    beta.post(generate("g1", handle_b, user("beta prompt")))
    shell.allow()
    wait_deltas(beta, "g1")
    # beta uses alpha's handle: expired, like any unknown handle
    beta.post({"type": "llm.describe", "id": "d1", "handle": handle_a})
    assert code(beta.wait_for("d1", "llm.describe.result")) == "selection-expired"
    beta.post(generate("g2", handle_a))
    assert code(beta.wait_for("g2")) == "selection-expired"
    # beta's cancel of "g1" cancels beta's own g1 only
    beta.post({"type": "llm.cancel", "id": "c1", "requestId": "g1"})
    assert beta.wait_for("c1", "llm.cancel.result")["cancelled"] is True
    assert code(beta.wait_for("g1")) == "cancelled"
    assert not [e for e in alpha.quiet() if e.get("type") == "llm.generate.result"]
    # beta's cancel of an id only alpha has active is false
    alpha.post({"type": "llm.cancel", "id": "c1", "requestId": "g2"})
    assert alpha.wait_for("c1", "llm.cancel.result")["cancelled"] is False
    alpha.post({"type": "llm.cancel", "id": "c2", "requestId": "g1"})
    assert alpha.wait_for("c2", "llm.cancel.result")["cancelled"] is True
    seen_a, seen_b = alpha.quiet(), beta.envelopes()
    check_generation(seen_a, "g1")
    check_generation(seen_b, "g1")
    assert "beta" not in json.dumps(seen_a) and "alpha" not in json.dumps(seen_b)
    assert all(d["requestId"] == "g1" for d in deltas_of(seen_a, "g1"))
    assert shell.script_requests(FULL) == 2


def test_a_frame_cannot_inject_results_into_another(shell: ShellPage) -> None:
    victim = shell.open_napplet()
    forger = shell.open_napplet()
    selecting = victim.call("select")
    shell.chooser()
    pending = victim.evaluate("() => window.probe.envelopes().length")
    # the forger finds the victim's window and posts a fake result for every
    # id the victim could be waiting on
    forged = forger.evaluate(
        """() => {
            let sent = 0;
            for (let i = 0; i < window.parent.frames.length; i += 1) {
                const other = window.parent.frames[i];
                if (other === window) continue;
                other.postMessage({type: 'llm.select.result', id: 'select-0',
                    model: {handle: 'forged', name: 'Forged', model: 'forged', route: 'x',
                            images: false, json: false, tools: false, toolChoiceModes: []}}, '*');
                sent += 1;
            }
            return sent;
        }"""
    )
    assert forged >= 1
    received = victim.evaluate("() => window.probe.received")
    assert any(not m["fromParent"] for m in received)
    assert victim.evaluate("(i) => window.probe.calls[i].state", selecting) == "pending"
    shell.choose(FULL)
    outcome = victim.outcome(selecting)
    assert outcome["state"] == "ok" and outcome["value"]["model"] == "scripted"
    assert victim.evaluate("() => window.probe.envelopes().length") == pending + 1


def test_domain_absence_has_no_binding_and_answers_unsupported(shell: ShellPage) -> None:
    app = shell.open_napplet()
    app.set_llm(False)
    assert app.evaluate("() => [Object.isFrozen(window.napplet), Object.keys(window.napplet)]") == [
        True,
        [],
    ]
    entries = inspector_entries(shell)
    app.post({"type": "llm.select", "id": "s1"})
    app.post(generate("g1", "h-guess"))
    # each request gets the answer a missing domain gets (and nothing reaches the runtime)
    assert code(app.wait_for("s1", "llm.select.result")) == "unsupported"
    assert code(app.wait_for("g1")) == "unsupported"
    assert len(app.quiet()) == 2 and shell.open_dialogs() == 0
    assert inspector_entries(shell) == entries
    # switched back on, the fresh frame has the domain again
    app.set_llm(True)
    assert app.evaluate("() => Object.keys(window.napplet)") == ["llm"]
    assert app.select(FULL)


def test_reload_is_a_new_endpoint(shell: ShellPage) -> None:
    shell.scripted(FULL, {"turns": [{"text": "early", "stall": True}, {"text": "later"}]})
    app = shell.open_napplet()
    handle = app.select(FULL)
    app.post(generate("g1", handle))
    shell.allow()
    wait_deltas(app, "g1")
    app.reload()
    # the stalled stream was closed; nothing of it reaches the new document
    connection_entry(shell.page, FULL).locator(".script-progress[data-stopped='1']").wait_for()
    app.post({"type": "llm.describe", "id": "d1", "handle": handle})
    assert code(app.wait_for("d1", "llm.describe.result")) == "selection-expired"
    app.post(generate("g1", handle))
    assert code(app.wait_for("g1")) == "selection-expired"
    assert [e["type"] for e in app.quiet()] == ["llm.describe.result", "llm.generate.result"]
    # pending consent is cancelled by a reload too: the dialog goes, nothing is submitted
    fresh = app.select(FULL, rid="s2")
    before = shell.script_requests(FULL)
    app.post(generate("g2", fresh))
    dialog = shell.consent()
    app.reload()
    dialog.wait_for(state="detached")
    assert shell.script_requests(FULL) == before and app.quiet() == []


def test_first_message_of_a_reloaded_document_belongs_to_the_new_endpoint(
    shell: ShellPage,
) -> None:
    # The new document posts before its load event: it must already be a new
    # endpoint, so the old document's handle is foreign to it.
    app = shell.open_napplet()
    handle = app.select(FULL)
    early = json.dumps({"type": "llm.describe", "id": "early", "handle": handle})
    app.evaluate(
        f"() => {{ window.name = 'post-at-start:' + {json.dumps(early)}; location.reload(); }}"
    )
    app.frame.wait_for_function(
        "() => window.probe && window.probe.envelopes().length === 1", polling=POLL_MS
    )
    (result,) = app.envelopes()
    assert result["type"] == "llm.describe.result" and result["id"] == "early"
    assert code(result) == "selection-expired"


def test_napplet_navigating_itself_is_a_new_endpoint(shell: ShellPage) -> None:
    app = shell.open_napplet()
    handle = app.select(FULL)
    assert len(app.envelopes()) == 1
    app.evaluate("() => { location.reload(); }")
    # the new document starts with an empty record
    app.frame.wait_for_function(
        "() => window.probe && window.probe.envelopes().length === 0", polling=POLL_MS
    )
    app.post({"type": "llm.describe", "id": "d1", "handle": handle})
    assert code(app.wait_for("d1", "llm.describe.result")) == "selection-expired"
    # the new document is an endpoint of its own: it can select again
    assert app.select(FULL, rid="s2") != handle


def test_messages_from_other_sources_are_dropped(shell: ShellPage) -> None:
    app = shell.open_napplet()
    entries = inspector_entries(shell)
    # the shell window itself
    shell.page.evaluate("() => window.postMessage({type: 'llm.select', id: 'own'}, '*')")
    # a same-origin about:blank frame the shell did not create
    shell.page.evaluate(
        """() => {
            const f = document.createElement('iframe');
            f.id = 'intruder-blank';
            document.body.append(f);
            f.contentWindow.eval(
                "parent.postMessage({type: 'llm.select', id: 'blank'}, '*')");
        }"""
    )
    # a sandboxed srcdoc frame the shell did not create, listening for replies
    shell.page.evaluate(
        """() => {
            const f = document.createElement('iframe');
            f.id = 'intruder-srcdoc';
            f.setAttribute('sandbox', 'allow-scripts');
            f.srcdoc = '<script>window.got = [];'
                + 'addEventListener("message", (e) => window.got.push(e.data));'
                + 'parent.postMessage({type: "llm.select", id: "srcdoc"}, "*");'
                + 'parent.postMessage({type: "llm.generate", id: "g", request: {}}, "*");'
                + '</' + 'script>';
            document.body.append(f);
        }"""
    )
    shell.page.wait_for_timeout(400)
    assert shell.open_dialogs() == 0
    assert inspector_entries(shell) == entries
    got = (
        shell.page.locator("#intruder-srcdoc")
        .element_handle()
        .content_frame()
        .evaluate("() => window.got")
    )
    assert got == []
    # the real napplet is unaffected
    assert app.select(FULL)
    shell.page.evaluate(
        "() => { for (const id of ['intruder-blank', 'intruder-srcdoc'])"
        " document.getElementById(id).remove(); }"
    )


UNCLONABLE_VALUES = {
    "undefined": "undefined",
    "Map": "new Map([['a', 1]])",
    "Date": "new Date(0)",
    "NaN": "NaN",
    "BigInt": "10n",
}


def test_values_json_cannot_carry_are_invalid_requests(shell: ShellPage) -> None:
    app = shell.open_napplet()
    handle = app.select(FULL)
    before = shell.script_requests(FULL)
    message = "{role: 'user', content: [{type: 'text', text: 'hi'}]}"
    ids = []
    # explicit null inside a record reaches the runtime as null, not as omission
    app.post_js(
        f"{{type: 'llm.generate', id: 'null', request: {{handle: {json.dumps(handle)},"
        f" messages: [{message}], temperature: null}}}}"
    )
    ids.append("null")
    for name, value in UNCLONABLE_VALUES.items():
        app.post_js(
            f"{{type: 'llm.generate', id: {json.dumps(name)}, request: {{handle:"
            f" {json.dumps(handle)}, messages: [{message}], temperature: {value}}}}}"
        )
        ids.append(name)
    app.post_js("{type: 'llm.select', id: 'sel-map', requirements: new Map()}")
    for rid in ids:
        assert code(app.wait_for(rid)) == "invalid-request", rid
    assert code(app.wait_for("sel-map", "llm.select.result")) == "invalid-request"
    assert shell.open_dialogs() == 0 and shell.script_requests(FULL) == before


# --------------------------------------------------------------------------- network


def test_boot_and_generation_stay_on_loopback(
    browser: Any, product_url: str, test_pages_dir: Path, request_log: Any
) -> None:
    context = browser.new_context()
    log = type(request_log)("fresh boot")  # the harness's BrowserLog, for a fresh context
    log.attach(context)
    try:
        napplets = install_napplets(test_pages_dir, product_url)
        shell = ShellPage(context.new_page(), product_url, napplets)
        # the development query opens the napplet at start
        shell.boot(napplet_query(shell.probe_url))
        app = shell.adopt(shell.probe_url)
        shell.scripted(FULL, [{"text": ["Hello", " there"]}])
        # a link opens the napplet with LLM access off; the person turns it on
        assert app.evaluate("() => Object.keys(window.napplet)") == []
        app.set_llm(True)
        handle = app.select(FULL)
        result = app.run(generate("g1", handle))
        assert result["result"]["content"] == [{"type": "text", "text": "Hello there"}]
    finally:
        context.close()
    assert log.requests, "no request was recorded"
    assert any("/pyodide/" in u for u in log.requests)
    assert any(u.endswith("/napplets/probe.html") for u in log.requests)
    outside = [
        u
        for u in log.requests
        if not (urlsplit(u).hostname == "127.0.0.1" or urlsplit(u).scheme in ("data", "blob"))
    ]
    assert outside == [], outside
    assert log.errors(ignore=lambda u: u.endswith("/napplets/index.json")) == []
