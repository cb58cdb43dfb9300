"""Napplets written in Python use `napllm.napplet` in the real shell: real clicks
on the chooser and the consent dialog, a scripted connection answering.

The module boots the product shell once (no test hooks) with one scripted
connection per test, added through the connections form. The probe napplet
(tests/browser/napplets/python-api.html) runs one use of the API per step;
the gallery's Python napplet (napplets/extract) is opened from its card.
Pyodide boots once per napplet frame, so each test opens one napplet.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from shellpage import Napplet, ShellPage, boot_shell, connection_entry, linked_napplet_frame

pytestmark = pytest.mark.browser

#: Pyodide boots in the frame from the shell's files: allow for a cold start.
PYTHON_READY_MS = 120_000
STEP_MS = 30_000
POLL_MS = 50

API = "Python API script"
API_SCRIPT: list[dict[str, Any]] = [
    {"text": ["Hel", "lo"]},  # generate
    {"stall": True, "text": ["Once ", "upon "], "delayMs": 100},  # stream, cancel()
    {"stall": True, "text": ["Long ", "ago "], "delayMs": 100},  # stream, break
    {"json": {"name": "Alice", "age": 30}},  # response_model: valid
    {"json": {"name": "Alice", "age": "thirty"}},  # response_model: invalid
    {"toolCalls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]},  # tools
    {"text": "Sunny in Paris."},
    {"toolCalls": [{"name": "get_weather", "arguments": {"city": "Rome"}}]},  # round limit
    {"toolCalls": [{"name": "get_weather", "arguments": {"city": "Oslo"}}]},
]
EXTRACT = "Extract script"
ROWS = [{"name": "Alice", "age": 30, "city": "Paris"}, {"name": "Bob", "age": 41, "city": None}]


@pytest.fixture(scope="module")
def booted(shell_context: Any, product_url: str, test_pages_dir: Path) -> ShellPage:
    """The product shell with the two scripted connections of this module."""
    return boot_shell(
        shell_context.new_page(),
        product_url,
        test_pages_dir,
        query="",
        scripts={API: API_SCRIPT, EXTRACT: [{"json": {"rows": ROWS}}]},
    )


@pytest.fixture
def shell(booted: ShellPage, request_log: Any) -> Iterator[ShellPage]:
    yield booted
    booted.reset()


def python_ready(frame: Any) -> None:
    """Wait until every `<script type="py">` of the frame ran; fail on a Python error."""
    frame.wait_for_function(
        "() => ['ready', 'error'].includes(document.documentElement.dataset.nappletPython)",
        timeout=PYTHON_READY_MS,
        polling=100,
    )
    errors = frame.locator(".napplet-python-error").all_inner_texts()
    assert frame.evaluate("document.documentElement.dataset.nappletPython") == "ready", errors


def open_probe(shell: ShellPage) -> Any:
    """Open the probe through the URL form with LLM access on; its frame once Python ran."""
    page = shell.page
    before = page.locator("#napplet-tabs .tab").count()
    url = shell.napplets_url + "python-api.html"
    page.fill("#napplet-url", url)
    page.click("#napplet-url-open")
    frame = linked_napplet_frame(page, before)
    key = (page.locator("#napplet-tabs .tab").last.get_attribute("id") or "").removesuffix("-tab")
    shell.open.append(Napplet(shell, key, url))
    python_ready(frame)
    return frame


def start(frame: Any, step: str) -> None:
    frame.evaluate("(n) => window.pyStart(n)", step)


def outcome(frame: Any, step: str) -> Any:
    """The step's outcome: `{"ok": value}` or `{"error": class, "code": code}`."""
    frame.wait_for_function(
        "(n) => typeof window.pyOutcome(n) === 'string'", arg=step, timeout=STEP_MS, polling=POLL_MS
    )
    return json.loads(frame.evaluate("(n) => window.pyOutcome(n)", step))


def test_a_python_napplet_selects_generates_streams_validates_and_runs_tools(
    shell: ShellPage,
) -> None:
    frame = open_probe(shell)
    start(frame, "select")
    shell.choose(API)
    assert outcome(frame, "select")["ok"]["available"] is True

    start(frame, "generate")
    shell.remember()  # consent once, with a standing grant for the rest
    assert outcome(frame, "generate") == {"ok": {"text": "Hello", "finish": "stop"}}
    assert shell.script_requests(API) == 1

    start(frame, "stream")
    streamed = outcome(frame, "stream")["ok"]
    assert streamed["cancelled"] is True and len(streamed["seen"]) == 1
    assert streamed["seen"][0].startswith("Once")
    # the napplet's cancel reached the connection: one stream stopped before its end
    connection_entry(shell.page, API).locator('.script-progress[data-stopped="1"]').wait_for()
    start(frame, "leave")
    assert outcome(frame, "leave") == {"ok": {"seen": 1}}
    connection_entry(shell.page, API).locator('.script-progress[data-stopped="2"]').wait_for()

    start(frame, "valid")
    assert outcome(frame, "valid") == {"ok": {"type": "Person", "name": "Alice", "age": 30}}
    start(frame, "invalid")
    assert outcome(frame, "invalid") == {"error": "OutputValidationError", "code": "invalid-output"}

    start(frame, "tools")
    assert outcome(frame, "tools") == {"ok": {"answer": "Sunny in Paris.", "calls": ["Paris"]}}
    start(frame, "limit")
    assert outcome(frame, "limit") == {
        "error": "ToolRoundsExceededError",
        "code": "tool-rounds-exceeded",
    }
    assert shell.script_requests(API) == 9

    requests = shell.generate_requests()
    assert len(requests) == 9
    assert [r["request"].get("format") for r in requests[3:5]] == ["json", "json"]
    round_two = requests[6]["request"]
    assert [m["role"] for m in round_two["messages"]] == ["user", "assistant", "toolResult"]
    assert round_two["messages"][2]["content"][0]["text"] == "18 C and clear in Paris"
    assert round_two["tools"][0]["parameters"]["required"] == ["city"]
    # the round limit: the Rome call ran, the Oslo turn ran nothing
    assert [m["role"] for m in requests[8]["request"]["messages"]][-1] == "toolResult"
    assert frame.locator(".napplet-python-error").count() == 0


def test_the_gallery_s_python_napplet_extracts_rows_into_a_table(shell: ShellPage) -> None:
    page = shell.page
    page.click("#napplet-gallery [data-napplet=extract] .card-open")
    frame = linked_napplet_frame(page, 0)
    key = (page.locator("#napplet-tabs .tab").last.get_attribute("id") or "").removesuffix("-tab")
    shell.open.append(Napplet(shell, key, "napplets/extract/index.html"))
    python_ready(frame)
    assert page.locator("#napplet-tabs .tab").first.text_content() == "Extract to table"
    frame.fill("#columns", "name, age: int, city")
    frame.fill("#text", "Alice (30) lives in Paris. Bob is 41.")
    frame.click("#extract")
    shell.choose(EXTRACT)
    shell.allow()
    frame.wait_for_function(
        "() => document.querySelectorAll('#table tbody tr').length === 2", timeout=STEP_MS
    )
    cells = frame.eval_on_selector_all(
        "#table tbody tr", "(rows) => rows.map((r) => [...r.cells].map((c) => c.textContent))"
    )
    assert cells == [["Alice", "30", "Paris"], ["Bob", "41", ""]]
    headers = frame.eval_on_selector_all("#table thead th", "(hs) => hs.map((h) => h.textContent)")
    assert headers == ["name", "age", "city"]
    assert frame.is_disabled("#stop")
    assert shell.script_requests(EXTRACT) == 1
