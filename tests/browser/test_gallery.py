"""The napplet gallery of the start view and the first visit (web/js/gallery.js).

The gallery is read from the product build's ``napplets/index.json``, which
build.py writes from each napplet's own <title>, description meta and icon
link. Contexts of the ``page`` fixture are returning visitors (see
conftest.py); the first-visit tests use ``first_visit_context``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from conftest import BrowserLog

CARDS = "#napplet-gallery .napplet-card"
FIRST_VISIT_KEY = "napllm.firstVisit"


def wait_gallery(page: Any) -> None:
    """Wait until the gallery is rendered and the start-up step after it has run."""
    page.wait_for_function(f"document.querySelectorAll('{CARDS}').length > 0")
    # The first-visit napplet is opened in a promise callback after the
    # gallery is rendered; a task boundary later that step has run.
    page.evaluate("new Promise((resolve) => setTimeout(resolve, 0))")


def test_gallery_lists_each_napplet_with_its_own_title_description_and_icon(
    page: Any, product_url: str, dist_dir: Path, request_log: BrowserLog
) -> None:
    index = json.loads((dist_dir / "napplets" / "index.json").read_text())
    assert [entry["name"] for entry in index] == ["chat", "extract", "json", "prompt", "tools"]
    page.goto(f"{product_url}index.html")
    wait_gallery(page)
    cards = page.eval_on_selector_all(
        CARDS,
        """(cards) => cards.map((c) => ({
            name: c.dataset.napplet,
            title: c.querySelector('.card-title').textContent,
            description: c.querySelector('.card-description').textContent,
            icon: c.querySelector('img.card-icon').getAttribute('src'),
            open: c.querySelector('button.card-open').textContent,
        }))""",
    )
    assert cards == [
        {
            "name": e["name"],
            "title": e["title"],
            "description": e["description"],
            "icon": e["icon"],
            "open": f"Open {e['title']}",
        }
        for e in index
    ]
    titles = ["Chat", "Extract to table", "JSON object", "Prompt API chat", "Weather agent"]
    assert [c["title"] for c in cards] == titles
    # A returning visitor starts on the gallery: nothing opened by itself.
    assert page.locator("#napplet-tabs .tab").count() == 0
    assert page.is_visible("#napplet-empty")
    # Every icon rendered as an image.
    page.wait_for_function(
        f"[...document.querySelectorAll('{CARDS} img')]"
        ".every((i) => i.complete && i.naturalWidth > 0)"
    )

    page.click(f"{CARDS}[data-napplet=json] .card-open")
    tab = page.locator("#napplet-tabs .tab")
    tab.first.wait_for()
    assert tab.count() == 1
    assert tab.first.text_content() == "JSON object"
    assert tab.first.get_attribute("aria-selected") == "true"
    assert tab.first.get_attribute("data-origin") is None  # listed napplets show no origin
    assert not page.is_visible("#napplet-empty")
    page.locator("iframe.napplet-frame").wait_for()
    page.click("button.close")
    page.wait_for_selector("#napplet-empty", state="visible")
    assert page.locator("#napplet-tabs .tab").count() == 0


def test_first_visit_opens_the_chat_napplet_once(
    first_visit_context: Any, product_url: str
) -> None:
    page = first_visit_context.new_page()
    page.goto(f"{product_url}index.html")
    page.wait_for_selector("#napplet-tabs .tab[data-napplet=chat]")
    wait_gallery(page)
    assert page.locator("#napplet-tabs .tab").count() == 1
    assert page.evaluate(f"localStorage.getItem('{FIRST_VISIT_KEY}')") == "done"
    page.locator("iframe.napplet-frame").wait_for()
    # The next visit starts on the gallery.
    page.reload()
    wait_gallery(page)
    assert page.locator("#napplet-tabs .tab").count() == 0
    assert page.is_visible("#napplet-empty")


def test_a_link_opens_its_napplet_with_its_origin_instead_of_chat(
    first_visit_context: Any, product_url: str
) -> None:
    page = first_visit_context.new_page()
    linked = f"{product_url}napplets/json/index.html"
    page.goto(f"{product_url}index.html?napplet={linked}")
    page.wait_for_selector("#napplet-tabs .tab")
    wait_gallery(page)
    tabs = page.locator("#napplet-tabs .tab")
    assert tabs.count() == 1
    origin = product_url.rstrip("/")
    assert tabs.first.get_attribute("data-origin") == origin
    assert f"({origin})" in (tabs.first.text_content() or "")
    # A link may come from anyone: LLM access starts off.
    page.wait_for_selector(".llm-toggle")
    assert not page.is_checked(".llm-toggle")
    # The Chat napplet did not open, and the first visit is still to come.
    assert page.evaluate(f"localStorage.getItem('{FIRST_VISIT_KEY}')") is None


def test_gallery_renders_hostile_index_entries_as_bounded_text(page: Any, product_url: str) -> None:
    """Even an index.json that build.py did not write cannot inject markup or
    load icons from elsewhere: the page checks each entry again."""
    markup = '<img src=x onerror="window.__pwned = 1"><b>bold</b>'
    png = (
        "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAQAAAC1HAwCAAAAC0lEQVR42mNk"
        "+A8AAQUBAScY42YAAAAASUVORK5CYII="
    )
    path = "napplets/json/index.html"
    entries: list[Any] = [
        {
            "name": "a",
            "title": markup,
            "description": "x " * 200,
            "icon": "javascript:alert(1)",
            "path": path,
        },
        {
            "name": "b",
            "title": "B\u202eB",
            "description": markup,
            "icon": "https://example.com/i.png",
            "path": path,
        },
        {"name": "c", "title": "C", "icon": "napplets/../../etc/x.png", "path": path},
        {"name": "d", "title": "D", "description": "", "icon": png, "path": path},
        {"name": 5, "title": "not listed", "path": path},
        {"name": "e", "title": {"toString": "x"}, "path": 7},
        "text",
    ]
    page.route(
        "**/napplets/index.json",
        lambda route: route.fulfill(
            status=200, content_type="application/json", body=json.dumps(entries)
        ),
    )
    page.goto(f"{product_url}index.html")
    wait_gallery(page)
    cards = page.eval_on_selector_all(
        CARDS,
        """(cards) => cards.map((c) => ({
            name: c.dataset.napplet,
            title: c.querySelector('.card-title').textContent,
            description: c.querySelector('.card-description')?.textContent ?? null,
            img: c.querySelector('img')?.getAttribute('src') ?? null,
            elements: c.querySelector('.card-text').querySelectorAll('*').length,
        }))""",
    )
    assert [c["name"] for c in cards] == ["a", "b", "c", "d"]
    assert cards[0]["title"] == markup  # shown as text, cut to the bound
    assert len(cards[0]["description"]) <= 160 and cards[0]["description"].endswith("…")
    assert cards[1]["title"] == "B B"  # no direction override
    assert cards[1]["description"] == markup
    assert [c["img"] for c in cards] == [None, None, None, png]
    # Only the title and description elements: no markup from the entries.
    assert [c["elements"] for c in cards] == [2, 2, 1, 1]
    assert page.evaluate("window.__pwned") is None
    assert page.locator(f"{CARDS} b").count() == 0
