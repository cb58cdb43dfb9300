"""Napplets written for the NIP-5D web projection, against the real shell.

The projection's transport is `window.parent.postMessage(envelope, "*")` out
and `message` events whose `source` is `window.parent` in. Checked here in
Chromium with the product dist/ (a scripted connection stands in for a
model):
- `napplets/nip5d.html`, a napplet with no napllm-specific code (it never
  reads `window.napplet`), runs its own tests: select (posted while its
  document is still being parsed, before its endpoint is open), describe,
  generate with deltas, cancel; every reply it acts on comes from
  `window.parent`, and the inspector lists its envelopes;
- the projection's transport and napllm's own-window alias get the same
  answers, and the round trip each costs is printed (the parent transport
  waits for one extra ping on the frame's control port; bench/bench_shell.py
  part f measures it);
- replies carry what a `postMessage` from the shell would: the napplet
  accepts only messages whose `source` is its parent and whose `origin` is
  the shell's (the web platform's advice), and gets every reply;
- LLM access off: every request envelope, on either transport, gets its
  result with `unsupported` (the same answer for every request, as a
  missing `window.napplet.llm`), nothing else gets anything.

The hostile variants (a navigated document posting to the parent, nested
frames posting to their grandparent, floods on the raw channel) are in
test_trust_frames.py; the 23 conformance cases run over this transport in
test_conformance.py (the probe napplet posts to `window.parent`).
"""

# ruff: noqa: E501  (the JavaScript embedded below keeps its natural line length)

from __future__ import annotations

import json
import statistics
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from shellpage import POLL_MS, Napplet, ShellPage, boot_shell

pytestmark = pytest.mark.browser

FULL = "Scripted"
SCRIPT = {
    "turns": [
        {"text": ["Hel", "lo, ", "napplet", "!"], "delayMs": 20},
        {"text": "Stalling…", "stall": True},
    ],
    "repeat": True,
}


@pytest.fixture(scope="module")
def booted(shell_context: Any, product_url: str, test_pages_dir: Path) -> ShellPage:
    return boot_shell(shell_context.new_page(), product_url, test_pages_dir, "", {FULL: SCRIPT})


@pytest.fixture
def shell(booted: ShellPage, request_log: Any) -> Iterator[ShellPage]:
    booted.scripted(FULL, SCRIPT)
    yield booted
    booted.reset()


def open_by_url(shell: ShellPage, url: str) -> Napplet:
    """Open `url` through the URL form without waiting for the probe (the napplet has none)."""
    before = shell.page.locator("#napplet-tabs .tab").count()
    shell.page.fill("#napplet-url", url)
    shell.page.click("#napplet-url-open")
    shell.page.wait_for_function(
        "(n) => document.querySelectorAll('#napplet-tabs .tab').length > n", arg=before
    )
    key = (shell.page.locator("#napplet-tabs .tab").last.get_attribute("id") or "").removesuffix(
        "-tab"
    )
    napplet = Napplet(shell, key, url)
    shell.open.append(napplet)
    return napplet


def inspector_text(shell: ShellPage) -> str:
    """Everything the envelope inspector lists now (opened if it is closed), one row a line."""
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


def test_a_raw_wire_napplet_passes_its_own_tests(shell: ShellPage, test_pages_dir: Path) -> None:
    # The napplet checks `event.origin` against the shell's origin, written into its page.
    parts = urlsplit(shell.napplets_url)
    napplet = test_pages_dir / "napplets" / "nip5d-origin.html"
    source = (test_pages_dir / "napplets" / "nip5d.html").read_text(encoding="utf-8")
    napplet.write_text(
        source.replace("@SHELL_ORIGIN@", f"{parts.scheme}://{parts.netloc}"), encoding="utf-8"
    )
    app = open_by_url(shell, shell.napplets_url + napplet.name)
    # its select was posted while the document was parsed: the chooser opens
    shell.choose(FULL)
    shell.allow(remember=True)  # the second generation needs no dialog
    frame = app.frame
    frame.wait_for_function(
        "() => document.querySelector('#report').dataset.state !== 'running'", polling=POLL_MS
    )
    report = json.loads(frame.evaluate("() => document.querySelector('#report').textContent"))
    state = frame.evaluate("() => document.querySelector('#report').dataset.state")
    assert state == "passed", report
    assert report["failures"] == [] and report["foreign"] == 0, report
    assert "llm.generate.result generate-1" in report["log"], report
    # the same rules as for window.napplet.llm: the inspector saw them, no dialog is left
    seen = inspector_text(shell)
    for rid in ("select-1", "describe-1", "generate-1", "cancel-1"):
        assert rid in seen, rid
    assert shell.open_dialogs() == 0


#: Posts `count` describes one after another on `transport` and returns each round trip in ms.
ROUND_TRIPS = """async ([handle, count, transport]) => {
  probe.useTransport(transport);
  const times = [];
  for (let i = 0; i < count; i++) {
    const id = 'rt-' + transport + '-' + i;
    const start = performance.now();
    const done = new Promise((resolve) => {
      const on = (e) => {
        if (e.source === window.parent && e.data && e.data.id === id) {
          removeEventListener('message', on);
          resolve();
        }
      };
      addEventListener('message', on);
    });
    probe.post({type: 'llm.describe', id, handle});
    await done;
    times.push(performance.now() - start);
  }
  probe.useTransport('parent');
  return times;
}"""


def test_both_transports_get_the_same_answers_and_the_round_trip_is_measured(
    shell: ShellPage,
) -> None:
    app = shell.open_napplet()
    handle = app.select(FULL)
    for transport in ("parent", "self"):
        app.evaluate("(t) => probe.useTransport(t)", transport)
        app.post({"type": "llm.describe", "id": f"d-{transport}", "handle": handle})
        app.post({"type": "llm.describe", "id": f"x-{transport}", "handle": "stale"})
    answers = {}
    for transport in ("parent", "self"):
        good = app.wait_for(f"d-{transport}", "llm.describe.result")
        bad = app.wait_for(f"x-{transport}", "llm.describe.result")
        answers[transport] = (good["model"], bad["error"])
    app.evaluate("() => probe.useTransport('parent')")
    assert answers["parent"] == answers["self"]
    count = 40
    parent = app.evaluate(ROUND_TRIPS, [handle, count, "parent"])
    own = app.evaluate(ROUND_TRIPS, [handle, count, "self"])
    figures = {
        name: {"median_ms": round(statistics.median(t), 2), "max_ms": round(max(t), 2)}
        for name, t in (("parent", parent), ("self", own))
    }
    print("describe round trip (ms):", json.dumps(figures))
    # every round trip completed on both; the figures are printed, not asserted
    # (bench/bench_shell.py part f measures them)
    assert len(parent) == len(own) == count


def test_without_llm_access_every_request_gets_unsupported(shell: ShellPage) -> None:
    app = shell.open_napplet()
    app.set_llm(False)
    # the API path: the domain is missing
    assert app.evaluate("() => Object.keys(window.napplet)") == []
    requests = {
        "llm.select": {},
        "llm.describe": {"handle": "h"},
        "llm.generate": {"request": {"handle": "h", "messages": []}},
        "llm.cancel": {"requestId": "g"},
    }
    ids = []
    for transport in ("parent", "self"):
        app.evaluate("(t) => probe.useTransport(t)", transport)
        for kind, fields in requests.items():
            ids.append((f"{kind}-{transport}", kind))
            app.post({"type": kind, "id": ids[-1][0], **fields})
        # no answer: an unknown type, a request without an id, a result
        app.post({"type": "llm.unknown", "id": f"u-{transport}"})
        app.post({"type": "llm.select"})
        app.post({"type": "llm.select.result", "id": f"r-{transport}"})
    app.evaluate("() => probe.useTransport('parent')")
    unsupported = {
        "code": "unsupported",
        "message": "The llm domain is not available to this napplet.",
    }
    for rid, kind in ids:
        assert app.wait_for(rid, kind + ".result") == {
            "type": kind + ".result",
            "id": rid,
            "error": unsupported,
        }
    assert sorted(e["id"] for e in app.quiet()) == sorted(rid for rid, _ in ids)
    assert shell.open_dialogs() == 0
    assert "llm.select-parent" not in inspector_text(shell)
