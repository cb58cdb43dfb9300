"""The example napplets against the real runtime (napllm in Pyodide, ``?test=1``).

Each napplet is opened from the shell's own napplet list, driven through its
documented element ids, and every chooser and consent dialog is answered by
a click, as a person would. The scripted fixture connections (``fx-*``)
stand in for a model, so the flows are exact: what the napplet sends must
pass the runtime's real validation (conversation rules, tool results) and
what it shows must be what the runtime delivered.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from shellpage import POLL_MS, ShellPage, install_napplets

from napllm.providers.fixture import Stall, text_script, tool_call_script

pytestmark = pytest.mark.browser

Frame = Any

FULL = "Fixture (all capabilities)"
JSON_ONLY = "Fixture (JSON only)"


@pytest.fixture(scope="module")
def context(browser: Any) -> Iterator[Any]:
    """One browser context for the module (the shell is booted once)."""
    ctx = browser.new_context()
    yield ctx
    ctx.close()


@pytest.fixture(scope="module")
def booted(context: Any, dist_url: str, test_pages_dir: Path) -> ShellPage:
    shell = ShellPage(context.new_page(), dist_url, install_napplets(test_pages_dir, dist_url))
    shell.boot()
    return shell


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
    frame = open_example(shell, "chat")
    choose(shell, frame, FULL)
    shell.queue("fx-full", text_script(["Hello", " from", " the fixture."]))
    frame.fill("#prompt", "Hi")
    frame.click("#send")
    consent = shell.consent()
    assert "chat (#" in consent.inner_text()
    assert "1 message, 2 characters" in consent.inner_text()
    shell.allow()
    wait_text(frame, "#status", "Done.")
    assert frame.locator("#history li.assistant").inner_text().endswith("Hello from the fixture.")
    # The whole conversation goes with the next request; the runtime accepts it.
    shell.queue("fx-full", text_script("Again."))
    frame.fill("#prompt", "Once more")
    frame.press("#prompt", "Control+Enter")
    shell.allow()
    frame.wait_for_function(
        "() => document.querySelectorAll('#history li').length === 4", polling=POLL_MS
    )
    request = shell.stats("fx-full")["requests"][-1]
    roles = [item.get("role") for item in request["input"] if item["type"] == "message"]
    assert roles == ["user", "assistant", "user"]
    # Stop cancels a generation the provider never finishes.
    shell.queue("fx-full", [Stall(None)])
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


def test_chat_declined_consent_keeps_the_message(shell: ShellPage) -> None:
    frame = open_example(shell, "chat")
    choose(shell, frame, FULL)
    before = shell.submissions("fx-full")
    frame.fill("#prompt", "Secret")
    frame.click("#send")
    shell.deny()
    wait_text(frame, "#status", "You declined to send this message.")
    assert frame.input_value("#prompt") == "Secret"
    assert shell.submissions("fx-full") == before


def test_json_example_shows_the_parsed_object(shell: ShellPage) -> None:
    frame = open_example(shell, "json")
    frame.click("#choose")
    offered = shell.candidates()
    assert JSON_ONLY in offered and "Fixture (text only)" not in offered
    shell.choose(JSON_ONLY)
    frame.wait_for_function(
        "(n) => document.querySelector('#model').textContent.startsWith(n)",
        arg=JSON_ONLY,
        polling=POLL_MS,
    )
    shell.queue("fx-json", text_script('{"title": "Dune", "year": 1965}'))
    frame.click("#send")
    assert "a JSON object" in shell.consent().inner_text()
    shell.allow()
    wait_text(frame, "#status", "Done.")
    assert json.loads(frame.inner_text("#result")) == {"title": "Dune", "year": 1965}


def test_tools_example_runs_the_weather_loop(shell: ShellPage) -> None:
    frame = open_example(shell, "tools")
    choose(shell, frame, FULL)
    calls = [
        ("get_weather", {"city": "Berlin"}, "call_1"),
        ("get_weather", {"city": "Atlantis"}, "call_2"),
    ]
    shell.queue("fx-full", tool_call_script(calls))
    shell.queue("fx-full", text_script("It is 18°C and clear in Berlin."))
    frame.click("#send")
    consent = shell.consent()
    assert "get_weather" in consent.inner_text()
    assert "Tool results" in consent.inner_text()
    shell.remember()  # the second round is covered by the standing permission
    wait_text(frame, "#status", "Done.")
    assert frame.inner_text("#answer") == "It is 18°C and clear in Berlin."
    request = shell.stats("fx-full")["requests"][-1]
    outputs = [i for i in request["input"] if i["type"] == "function_call_output"]
    assert [o["call_id"] for o in outputs] == ["call_1", "call_2"]
    log = frame.inner_text("#log")
    assert "get_weather" in log and "No weather data for Atlantis" in log
