"""The scripted connection in the product shell (dist/, no test hooks): the
connections form offers the kind with its script field, reports a bad
script with its position, and saves a good one (route and kind shown); its
entry counts the requests it received (none before consent) and the ones
stopped before their end."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shellpage import (
    boot_shell,
    connection_entry,
    generate,
    wait_deltas,
)

LABEL = "Scripted responses — for napplet development"


def boot(page: Any, dist_url: str) -> None:
    page.goto(f"{dist_url}index.html")
    page.wait_for_function(
        "() => ['ready', 'failed'].includes(document.body.dataset.boot)", timeout=120_000
    )
    assert page.evaluate("document.body.dataset.boot") == "ready"


def test_form_adds_a_scripted_connection(page: Any, dist_url: str, request_log: Any) -> None:
    boot(page, dist_url)
    page.click("#connection-add")
    page.fill("#connection-name", "Dev script")
    page.select_option("#connection-kind", "scripted")
    assert page.locator("#connection-kind option[value=scripted]").text_content() == LABEL
    assert page.locator("#connection-script").is_visible()
    assert page.locator("#connection-base-url").is_hidden()
    assert page.locator("#connection-secret").is_hidden()

    page.fill("#connection-script", '[\n  {"text": "a", "delay": 5}\n]')
    page.click("#connection-save")
    error = page.locator("#connection-form-error")
    error.filter(has_text="turns[0].delay").wait_for()
    assert "Extra inputs are not permitted" in (error.text_content() or "")

    page.fill("#connection-script", '[{"text": "a"}\n{"text": "b"}]')
    page.click("#connection-save")
    error.filter(has_text="line 2, column 1").wait_for()

    script = '[{"text": ["Hel", "lo"]}, {"stall": true}]'
    page.fill("#connection-script", script)
    page.click("#connection-save")
    entry = page.locator("#connection-list li.connection", has_text="Dev script")
    entry.wait_for()
    assert entry.locator(".kind").text_content() == LABEL
    assert "scripted responses" in (entry.locator(".route").text_content() or "")
    entry.locator("button.edit").click()
    assert page.locator("#connection-script").input_value() == script


def test_entry_counts_requests_only_after_consent(
    page: Any, product_url: str, test_pages_dir: Path, request_log: Any
) -> None:
    script = [{"text": "one"}, {"text": "two", "stall": True}]
    shell = boot_shell(page, product_url, test_pages_dir, "", {"Counted": script})
    progress = connection_entry(page, "Counted").locator(".script-progress")
    assert progress.text_content() == "Requests received: 0 (next turn 1)"
    napplet = shell.open_napplet()
    napplet.set_llm(True)
    handle = napplet.select("Counted")
    denied = napplet.run(generate("g1", handle), allow=False)
    assert denied["error"]["code"] == "user-cancelled"
    assert shell.script_requests("Counted") == 0
    answered = napplet.run(generate("g2", handle))
    assert answered["result"]["content"] == [{"type": "text", "text": "one"}]
    assert shell.script_requests("Counted") == 1
    assert progress.text_content() == "Requests received: 1 (next turn 2 of 2)"
    # A generation the napplet cancels is counted as stopped before the end.
    napplet.post(generate("g3", handle))
    shell.allow()
    wait_deltas(napplet, "g3")
    napplet.post({"type": "llm.cancel", "id": "c3", "requestId": "g3"})
    assert napplet.wait_for("g3")["error"]["code"] == "cancelled"
    progress.filter(has_text="1 stopped").wait_for()
    assert (
        progress.text_content() == "Requests received: 2, 1 stopped before the end (no turn left)"
    )
    assert shell.script_stopped("Counted") == 1
    # An edit is a new revision: the script and its count start again.
    shell.scripted("Counted", [{"text": "again"}])
    assert shell.script_requests("Counted") == 0
    shell.remove_connection("Counted")
    assert connection_entry(page, "Counted").count() == 0
