"""The one-time warning about tokens on a shared github.io origin.

Tokens are kept in the origin's IndexedDB; a GitHub Pages *project* page
(``https://user.github.io/project/``) shares its origin with every other
project of that user. The host check is a pure function
(``isSharedOriginPath`` in web/js/connections.js), tested here on many URLs
in the page; the warning itself is tested twice: through
``warnSharedOrigin`` with the URL as its input, and end to end with the
product dist/ served as ``https://alice.github.io/napllm/`` by Playwright's
request routing (nothing leaves the browser; no such host is reached).
"""

from __future__ import annotations

import mimetypes
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from napllm.devtools.headless import MIME_TYPES, SHELL_HEADERS

pytestmark = pytest.mark.browser

BOOT_TIMEOUT_MS = 90_000
SITE = "https://alice.github.io/napllm/"

HOSTS = [
    ("https://alice.github.io/napllm/", True),
    ("https://alice.github.io/napllm/index.html?x=1", True),
    ("https://Alice.GitHub.io/a/b/", True),
    ("https://alice.github.io./napllm/", True),
    ("https://alice.github.io/", False),
    ("https://alice.github.io/index.html", False),
    ("https://github.io/napllm/", False),
    ("https://alice.github.io.example.org/napllm/", False),
    ("https://example.org/napllm/", False),
    ("http://127.0.0.1:8000/napllm/", False),
    ("not a url", False),
]


def load(page: Any, url: str) -> None:
    page.goto(url)
    page.wait_for_function(
        "() => ['ready', 'failed'].includes(document.body.dataset.boot)", timeout=BOOT_TIMEOUT_MS
    )
    assert page.evaluate("document.body.dataset.boot") == "ready"


def test_host_check_is_a_pure_function(page: Any, request_log: Any, product_url: str) -> None:
    page.goto(f"{product_url}index.html")
    answers = page.evaluate(
        "(hosts) => import('./js/connections.js').then((m) =>"
        " hosts.map(([href]) => m.isSharedOriginPath(href)))",
        HOSTS,
    )
    assert answers == [expected for _, expected in HOSTS]


def test_warning_shows_once_when_the_check_says_shared_and_a_token_is_saved(
    page: Any, request_log: Any, product_url: str
) -> None:
    page.goto(f"{product_url}index.html")
    result = page.evaluate(
        """async () => {
          const m = await import('./js/connections.js');
          const store = new Map();
          const storage = {
            getItem: (k) => store.get(k) ?? null, setItem: (k, v) => store.set(k, v)};
          const shown = [];
          const notify = (level, text) => shown.push([level, text]);
          const token = JSON.stringify([{id: 'u-1', hasCredential: true}]);
          const none = JSON.stringify([{id: 'u-1', hasCredential: false}]);
          const calls = [
            m.warnSharedOrigin(token, 'https://example.org/napllm/', storage, notify),
            m.warnSharedOrigin(none, 'https://alice.github.io/napllm/', storage, notify),
            m.warnSharedOrigin(token, 'https://alice.github.io/napllm/', storage, notify),
            m.warnSharedOrigin(token, 'https://alice.github.io/napllm/', storage, notify),
          ];
          return {calls, shown, stored: store.get(m.SHARED_ORIGIN_KEY)};
        }"""
    )
    assert result["calls"] == [False, False, True, False]
    assert len(result["shown"]) == 1
    level, text = result["shown"][0]
    assert level == "warning"
    assert "IndexedDB" in text and "dedicated origin" in text
    assert result["stored"] == "1"


def _serve_dist_as_github_pages(context: Any, dist_dir: Path) -> None:
    root = dist_dir.resolve()

    def handle(route: Any) -> None:
        path = urlsplit(route.request.url).path
        if not path.startswith("/napllm/"):
            route.fulfill(status=404, body="")
            return
        rel = path.removeprefix("/napllm/") or "index.html"
        target = (root / rel).resolve()
        if root not in target.parents or not target.is_file():
            route.fulfill(status=404, body="")
            return
        mime = MIME_TYPES.get(target.suffix) or mimetypes.guess_type(target.name)[0]
        route.fulfill(
            status=200,
            body=target.read_bytes(),
            headers={"Content-Type": mime or "application/octet-stream", **dict(SHELL_HEADERS)},
        )

    context.route("https://alice.github.io/**", handle)


def test_product_on_a_github_project_page_warns_once_when_a_token_is_saved(
    browser: Any, dist_dir: Path
) -> None:
    context = browser.new_context(service_workers="block")
    try:
        _serve_dist_as_github_pages(context, dist_dir)
        page = context.new_page()
        page.set_default_timeout(30_000)
        load(page, SITE)
        notices = page.locator("#notice-list .notice", has_text="shared github.io site")
        assert notices.count() == 0  # no token yet
        page.click("#connection-add")
        page.fill("#connection-name", "Hosted")
        page.select_option("#connection-kind", "openai")
        page.fill("#connection-base-url", "https://api.example.org/v1")
        page.fill("#connection-model", "some-model")
        page.fill("#connection-secret", "sk-test-token")
        page.click("#connection-save")
        notices.first.wait_for()
        assert notices.count() == 1
        assert "dedicated origin" in notices.first.inner_text()
        # Shown once: not again after a reload with the token still saved.
        load(page, SITE)
        page.locator("#connection-list > li", has_text="Hosted").wait_for()
        page.wait_for_timeout(500)
        assert notices.count() == 0
    finally:
        context.close()
