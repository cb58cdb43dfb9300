"""The example napplets against the real runtime (the product shell, dist/).

Each napplet is opened from the shell's own napplet list, driven through its
documented element ids, and every chooser and consent dialog is answered by
a click, as a person would. Scripted connections, added through the
connections form, stand in for a model, so the flows are exact: what the
napplet sends must pass the runtime's real validation (conversation rules,
tool results; the envelope inspector shows what it sent) and what it shows
must be what the runtime delivered.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from shellpage import POLL_MS, ShellPage, boot_shell

pytestmark = pytest.mark.browser

Frame = Any

FULL = "Scripted (all capabilities)"
JSON_ONLY = "Scripted (JSON only)"
TEXT_ONLY = "Scripted (text only)"


def capabilities(images: bool, json_output: bool, tools: bool) -> dict[str, Any]:
    """A one-turn script object declaring these capabilities (docs/napplets.md)."""
    return {
        "turns": [{"text": "unused"}],
        "capabilities": {"images": images, "json": json_output, "tools": tools},
    }


@pytest.fixture(scope="module")
def booted(shell_context: Any, product_url: str, test_pages_dir: Path) -> ShellPage:
    scripts = {
        FULL: capabilities(True, True, True),
        JSON_ONLY: capabilities(False, True, False),
        TEXT_ONLY: capabilities(False, False, False),
    }
    return boot_shell(shell_context.new_page(), product_url, test_pages_dir, "", scripts)


@pytest.fixture
def shell(booted: ShellPage, request_log: Any) -> Iterator[ShellPage]:
    """The shared shell page, reset after the test; requests stay on 127.0.0.1."""
    yield booted
    # Close every tab (a click event, since an open modal dialog makes the page inert).
    while booted.page.locator("#napplet-tabs .tab").count() > 0:
        booted.page.locator("#napplet-tabs .tab").first.dispatch_event("click")
        booted.page.locator(".tabpanel:not([hidden]) .tab-toolbar .close").dispatch_event("click")
    booted.reset()


def open_example(shell: ShellPage, name: str) -> Frame:
    """Open example `name` from the shell's napplet list; its frame once it runs."""
    page = shell.page
    page.wait_for_function(
        "(n) => [...document.querySelectorAll('#napplet-select option')]"
        ".some((o) => o.value === n)",
        arg=name,
    )
    page.select_option("#napplet-select", name)
    page.click("#napplet-open")
    page.wait_for_function(
        "() => { const f = document.querySelector('.tabpanel:not([hidden]) iframe.napplet-frame');"
        " return f && f.srcdoc.length > 0; }"
    )
    handle = page.wait_for_selector(".tabpanel:not([hidden]) iframe.napplet-frame")
    frame = handle.content_frame()
    assert frame is not None
    wait_text(frame, "#status", "Choose a model to start.")
    return frame


def wait_text(frame: Frame, selector: str, text: str) -> None:
    """Wait until `selector`'s text is exactly `text`."""
    frame.wait_for_function(
        "([s, t]) => document.querySelector(s).textContent === t",
        arg=[selector, text],
        polling=POLL_MS,
    )


def choose(shell: ShellPage, frame: Frame, connection: str) -> None:
    """The napplet's Choose button, then `connection` in the shell's chooser."""
    frame.click("#choose")
    shell.choose(connection)
    frame.wait_for_function(
        "(n) => document.querySelector('#model').textContent.startsWith(n)",
        arg=connection,
        polling=POLL_MS,
    )


def test_chat_streams_keeps_history_and_stops(shell: ShellPage) -> None:
    turns = [{"text": ["Hello", " from", " the script."]}, {"text": "Again."}, {"stall": True}]
    shell.scripted(FULL, turns)
    frame = open_example(shell, "chat")
    choose(shell, frame, FULL)
    frame.fill("#prompt", "Hi")
    frame.click("#send")
    consent = shell.consent()
    assert "chat (#" in consent.inner_text()
    assert "1 message, 2 characters" in consent.inner_text()
    shell.allow()
    wait_text(frame, "#status", "Done.")
    assert frame.locator("#history li.assistant").inner_text().endswith("Hello from the script.")
    # The whole conversation goes with the next request; the runtime accepts it.
    frame.fill("#prompt", "Once more")
    frame.press("#prompt", "Control+Enter")
    shell.allow()
    frame.wait_for_function(
        "() => document.querySelectorAll('#history li').length === 4", polling=POLL_MS
    )
    wait_text(frame, "#status", "Done.")
    request = shell.generate_requests()[-1]["request"]
    assert [m["role"] for m in request["messages"]] == ["user", "assistant", "user"]
    # Stop cancels a generation the connection never finishes (a stall turn).
    frame.fill("#prompt", "Take your time")
    frame.click("#send")
    shell.allow()
    frame.wait_for_function("() => !document.querySelector('#stop').disabled", polling=POLL_MS)
    frame.click("#stop")
    frame.wait_for_function(
        "() => document.querySelector('#status').textContent.startsWith('Stopped')",
        polling=POLL_MS,
    )
    assert frame.input_value("#prompt") == "Take your time"
    assert frame.locator("#history li").count() == 4
    assert shell.script_requests(FULL) == 3


def test_chat_declined_consent_keeps_the_message(shell: ShellPage) -> None:
    frame = open_example(shell, "chat")
    choose(shell, frame, FULL)
    before = shell.script_requests(FULL)
    frame.fill("#prompt", "Secret")
    frame.click("#send")
    shell.deny()
    wait_text(frame, "#status", "You declined to send this message.")
    assert frame.input_value("#prompt") == "Secret"
    assert shell.script_requests(FULL) == before


def test_json_example_shows_the_parsed_object(shell: ShellPage) -> None:
    script = capabilities(False, True, False) | {
        "turns": [{"json": {"title": "Dune", "year": 1965}}]
    }
    shell.scripted(JSON_ONLY, script)
    frame = open_example(shell, "json")
    frame.click("#choose")
    offered = shell.candidates()
    assert JSON_ONLY in offered and TEXT_ONLY not in offered
    shell.choose(JSON_ONLY)
    frame.wait_for_function(
        "(n) => document.querySelector('#model').textContent.startsWith(n)",
        arg=JSON_ONLY,
        polling=POLL_MS,
    )
    frame.click("#send")
    assert "a JSON object" in shell.consent().inner_text()
    shell.allow()
    wait_text(frame, "#status", "Done.")
    assert json.loads(frame.inner_text("#result")) == {"title": "Dune", "year": 1965}


def test_tools_example_runs_the_weather_loop(shell: ShellPage) -> None:
    calls = [
        {"name": "get_weather", "arguments": {"city": "Berlin"}, "id": "call_1"},
        {"name": "get_weather", "arguments": {"city": "Atlantis"}, "id": "call_2"},
    ]
    shell.scripted(FULL, [{"toolCalls": calls}, {"text": "It is 18°C and clear in Berlin."}])
    frame = open_example(shell, "tools")
    choose(shell, frame, FULL)
    frame.click("#send")
    consent = shell.consent()
    assert "get_weather" in consent.inner_text()
    assert "Tool results" in consent.inner_text()
    shell.remember()  # the second round is covered by the standing permission
    wait_text(frame, "#status", "Done.")
    assert frame.inner_text("#answer") == "It is 18°C and clear in Berlin."
    request = shell.generate_requests()[-1]["request"]
    results = [m for m in request["messages"] if m["role"] == "toolResult"]
    assert [m["toolCallId"] for m in results] == ["call_1", "call_2"]
    log = frame.inner_text("#log")
    assert "get_weather" in log and "No weather data for Atlantis" in log
