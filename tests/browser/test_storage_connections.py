"""Saved connections across tabs and builds (IndexedDB, web/js/storage.js).

Two pages of one browser context are two tabs of one profile: they share
the origin's IndexedDB and BroadcastChannel. Connections are added through
the real connections form of the real shell (no test hooks), and the
stored records are read back raw from IndexedDB.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from shellpage import remove_connection, scripted_connection

BOOT_TIMEOUT_MS = 120_000
STEP_TIMEOUT_MS = 60_000

#: Every stored record: {key: {text, created}}.
RAW_RECORDS = """() => new Promise((resolve, reject) => {
  const open = indexedDB.open("napllm", 1);
  open.onerror = () => reject(new Error("open failed"));
  open.onsuccess = () => {
    const db = open.result;
    const tx = db.transaction("connections", "readonly");
    const store = tx.objectStore("connections");
    const out = {};
    const cursor = store.openCursor();
    cursor.onsuccess = () => {
      const at = cursor.result;
      if (!at) { db.close(); resolve(out); return; }
      out[String(at.key)] = at.value;
      at.continue();
    };
  };
})"""

#: Put one raw record: (key, value).
PUT_RECORD = """([key, value]) => new Promise((resolve, reject) => {
  const open = indexedDB.open("napllm", 1);
  open.onupgradeneeded = () => open.result.createObjectStore("connections");
  open.onerror = () => reject(new Error("open failed"));
  open.onsuccess = () => {
    const db = open.result;
    const tx = db.transaction("connections", "readwrite");
    tx.objectStore("connections").put(value, key);
    tx.oncomplete = () => { db.close(); resolve(true); };
    tx.onerror = () => reject(new Error("put failed"));
  };
})"""


@pytest.fixture
def tabs(browser: Any, product_url: str) -> Iterator[list[Any]]:
    """Two pages of one fresh browser context: two tabs of one profile."""
    context = browser.new_context()
    context.set_default_timeout(STEP_TIMEOUT_MS)
    pages = [context.new_page(), context.new_page()]
    for page in pages:
        page.goto(product_url + "index.html")
    for page in pages:
        wait_boot(page)
    try:
        yield pages
    finally:
        context.close()


def wait_boot(page: Any) -> None:
    page.wait_for_function(
        "() => ['ready', 'failed'].includes(document.body.dataset.boot)", timeout=BOOT_TIMEOUT_MS
    )
    assert page.evaluate("document.body.dataset.boot") == "ready"


def fill_form(page: Any, name: str) -> None:
    """Open the Add form and fill in an OpenAI-compatible connection."""
    page.click("#connection-add")
    page.fill("#connection-name", name)
    page.select_option("#connection-kind", "openai")
    page.fill("#connection-base-url", "http://127.0.0.1:9/v1")
    page.fill("#connection-model", f"model-of-{name}")


def add_connection(page: Any, name: str) -> None:
    fill_form(page, name)
    page.click("#connection-save")
    page.wait_for_function(
        "() => document.querySelector('#connection-form').hidden"
        " || document.querySelector('#connection-form-error').textContent"
    )
    assert page.text_content("#connection-form-error") == ""


def listed(page: Any) -> set[str]:
    names: list[str] = page.eval_on_selector_all(
        "#connection-list li.connection h3", "(nodes) => nodes.map((n) => n.textContent)"
    )
    return set(names)


def wait_listed(page: Any, names: set[str]) -> None:
    page.wait_for_function(
        "(want) => want.every((n) => [...document.querySelectorAll("
        "'#connection-list li.connection h3')].some((h) => h.textContent === n))",
        arg=sorted(names),
    )


def stored_names(page: Any) -> set[str]:
    records: dict[str, Any] = page.evaluate(RAW_RECORDS)
    return {json.loads(value["text"])["name"] for key, value in records.items() if key != "list"}


@pytest.mark.parametrize("first", [0, 1])
def test_two_tabs_saving_one_after_the_other_keep_both(tabs: list[Any], first: int) -> None:
    a, b = tabs[first], tabs[1 - first]
    add_connection(a, "From A")
    # B was open before A saved and was not reloaded: it learns of A's connection.
    wait_listed(b, {"From A"})
    add_connection(b, "From B")
    wait_listed(a, {"From A", "From B"})
    assert {"From A", "From B"} <= listed(b)
    assert stored_names(a) == {"From A", "From B"}
    for page in tabs:
        page.reload()
        wait_boot(page)
        wait_listed(page, {"From A", "From B"})


def test_two_tabs_saving_at_once_keep_both(tabs: list[Any]) -> None:
    a, b = tabs
    fill_form(a, "Same time A")
    fill_form(b, "Same time B")
    # Both saves start before either has finished.
    a.evaluate("document.querySelector('#connection-save').click()")
    b.evaluate("document.querySelector('#connection-save').click()")
    for page in tabs:
        wait_listed(page, {"Same time A", "Same time B"})
    assert stored_names(a) == {"Same time A", "Same time B"}
    a.reload()
    wait_boot(a)
    wait_listed(a, {"Same time A", "Same time B"})


def test_removing_in_one_tab_removes_it_in_the_other(tabs: list[Any]) -> None:
    a, b = tabs
    add_connection(a, "Short-lived")
    wait_listed(b, {"Short-lived"})
    a.click("#connection-list li.connection:has(h3:text-is('Short-lived')) button.remove")
    a.click("button.confirm-remove")
    for page in tabs:
        page.wait_for_function(
            "() => ![...document.querySelectorAll('#connection-list li.connection h3')]"
            ".some((h) => h.textContent === 'Short-lived')"
        )
    assert stored_names(b) == set()


def test_an_entry_this_build_cannot_read_is_kept_byte_for_byte(
    browser: Any, product_url: str
) -> None:
    context = browser.new_context()
    context.set_default_timeout(STEP_TIMEOUT_MS)
    try:
        page = context.new_page()
        page.goto(product_url + "index.html")
        wait_boot(page)
        # A connection saved by a newer build: a field this build does not know.
        newer = {
            "id": "u-newer000001",
            "name": "From a newer build",
            "kind": "openai",
            "model": "m",
            "route": "OpenAI-compatible 127.0.0.1:9",
            "settings": {"baseUrl": "http://127.0.0.1:9/v1", "userDefined": True},
            "credential": "secret-of-newer",
            "revision": 3,
            "reasoningBudget": {"tokens": 512},
        }
        text = json.dumps(newer, separators=(", ", ": "))  # not how this build writes JSON
        value = {"text": text, "created": 1}
        page.evaluate(PUT_RECORD, ["connection/u-newer000001", value])
        page.reload()
        wait_boot(page)
        notice = page.locator("#connections-unreadable")
        notice.wait_for(state="visible")
        assert (notice.text_content() or "").startswith(
            "1 saved connection could not be read by this version"
        )
        assert "From a newer build" not in listed(page)

        add_connection(page, "Made here")
        wait_listed(page, {"Made here"})
        records = page.evaluate(RAW_RECORDS)
        assert records["connection/u-newer000001"] == value
        assert len(records) == 2
        # The secret of the unread entry never reaches the page's UI.
        assert "secret-of-newer" not in (page.text_content("body") or "")

        # A build that reads it sees it unchanged: the saved text is intact JSON.
        assert json.loads(records["connection/u-newer000001"]["text"]) == newer
    finally:
        context.close()


def test_a_list_saved_by_an_earlier_build_is_split_into_records(
    browser: Any, product_url: str
) -> None:
    context = browser.new_context()
    context.set_default_timeout(STEP_TIMEOUT_MS)
    try:
        page = context.new_page()
        page.goto(product_url + "index.html")
        wait_boot(page)
        old = [
            {
                "id": "u-0123456789ab",
                "name": "Old list entry",
                "kind": "lmsp",
                "model": "m",
                "route": "LMSP 127.0.0.1:9",
                "settings": {"baseUrl": "http://127.0.0.1:9", "userDefined": True},
                "credential": None,
                "revision": 0,
            }
        ]
        page.evaluate(RAW_RECORDS)  # the database exists
        page.evaluate(PUT_RECORD, ["list", json.dumps(old)])
        page.reload()
        wait_boot(page)
        wait_listed(page, {"Old list entry"})
        records = page.evaluate(RAW_RECORDS)
        assert set(records) == {"connection/u-0123456789ab"}
        assert json.loads(records["connection/u-0123456789ab"]["text"]) == old[0]
        assert page.locator("#connections-unreadable").is_hidden()
    finally:
        context.close()


def test_removing_a_connection_in_one_tab_cancels_its_generation_in_another(
    browser: Any, product_url: str
) -> None:
    context = browser.new_context()
    context.set_default_timeout(STEP_TIMEOUT_MS)
    try:
        a = context.new_page()
        a.goto(product_url + "index.html")
        b = context.new_page()
        b.goto(product_url + "index.html")
        wait_boot(a)
        wait_boot(b)
        # A scripted connection whose answer never ends: tab B's answer is still
        # streaming when tab A removes the connection.
        scripted_connection(a, "Doomed", [{"text": ["Thinking"], "stall": True}])
        wait_listed(b, {"Doomed"})

        b.select_option("#napplet-select", "chat")
        b.click("#napplet-open")
        b.wait_for_function(
            "() => { const f = document.querySelector('iframe.napplet-frame');"
            " return f && f.srcdoc.length > 0; }"
        )
        frame = b.query_selector("iframe.napplet-frame").content_frame()
        frame.wait_for_load_state("load")
        frame.click("#choose")
        b.click(".chooser-dialog button.candidate:has-text('Doomed')")
        frame.wait_for_function(
            "() => document.querySelector('#model').textContent.includes('Doomed')"
        )
        frame.fill("#prompt", "Hello!")
        frame.click("#send")
        b.click(".consent-dialog button.allow")
        frame.wait_for_function(
            "() => document.querySelector('#status').textContent === 'Answering…'"
        )

        remove_connection(a, "Doomed")
        frame.wait_for_function(
            "() => document.querySelector('#status').textContent.startsWith('Stopped.')"
        )
        # The answer was not kept, and the connection is gone from tab B's list.
        assert frame.locator("#history li.assistant").count() == 0
        assert "Doomed" not in listed(b)
    finally:
        context.close()


def chooser_names(page: Any) -> list[str]:
    names: list[str] = page.eval_on_selector_all(
        ".chooser-dialog[open] button.candidate .candidate-name",
        "(nodes) => nodes.map((n) => n.textContent)",
    )
    return names


def wait_chooser(page: Any, present: set[str], absent: set[str]) -> None:
    page.wait_for_function(
        "([present, absent]) => { const names = [...document.querySelectorAll("
        "'.chooser-dialog[open] button.candidate .candidate-name')].map((n) => n.textContent);"
        " return present.every((n) => names.includes(n))"
        " && !absent.some((n) => names.includes(n)); }",
        arg=[sorted(present), sorted(absent)],
    )


def test_an_open_chooser_follows_connection_changes_in_another_tab(tabs: list[Any]) -> None:
    a, b = tabs
    add_connection(a, "Alpha")
    wait_listed(b, {"Alpha"})
    b.select_option("#napplet-select", "chat")
    b.click("#napplet-open")
    b.wait_for_function(
        "() => { const f = document.querySelector('iframe.napplet-frame');"
        " return f && f.srcdoc.length > 0; }"
    )
    frame = b.query_selector("iframe.napplet-frame").content_frame()
    frame.wait_for_load_state("load")
    frame.click("#choose")
    wait_chooser(b, {"Alpha"}, set())

    # Added in tab A: it joins B's open chooser.
    add_connection(a, "Beta")
    wait_chooser(b, {"Alpha", "Beta"}, set())
    # Removed in tab A: it leaves B's open chooser.
    a.click("#connection-list li.connection:has(h3:text-is('Alpha')) button.remove")
    a.click("button.confirm-remove")
    wait_chooser(b, {"Beta"}, {"Alpha"})
    assert chooser_names(b).count("Beta") == 1

    # A candidate that joined while the chooser was open can be picked.
    b.click(".chooser-dialog button.candidate:has-text('Beta')")
    frame.wait_for_function("() => document.querySelector('#model').textContent.includes('Beta')")
