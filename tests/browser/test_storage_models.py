"""Model downloads are cached only once verified; a failed load is forgotten.

The shell runs from a copy of dist/ on a server of the test's own, whose
answer for one GGUF URL the test switches: first an HTML fallback page
(``200 text/html``, as a single-page-app host answers an unknown path),
then the real model. A wasm connection to that URL is added through the
connections form and used by the Chat example through the real chooser and
consent clicks.
"""

from __future__ import annotations

import functools
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from napllm.devtools.headless import DistRequestHandler, DistServer

BOOT_TIMEOUT_MS = 120_000
STEP_TIMEOUT_MS = 90_000
POLL_MS = 50
HELLO_ANSWER = "Hello! How can I help you today?"
FALLBACK_PAGE = b"<!doctype html><title>napllm</title>\n\n"
MODEL = Path("models") / "tinychat" / "tiny-chat-q8_0.gguf"
#: The URLs in the service worker's model cache.
CACHED_URLS = (
    "() => caches.open('napllm-models').then((c) => c.keys()).then((k) => k.map((r) => r.url))"
)
#: wllama's own (OPFS) cache: [name, size, original URL] of every file in it.
WLLAMA_FILES = """async () => {
  const { CacheManager } = await import('./vendor/wllama/wllama.js');
  const files = await new CacheManager().list();
  return files.map((f) => [f.name, f.size, f.metadata.originalURL]);
}"""
#: Put `text` into wllama's cache as the file of URL `url`, the way an
#: older build's wllama download left a fallback page there.
WLLAMA_SEED = """async ([url, text]) => {
  const { CacheManager } = await import('./vendor/wllama/wllama.js');
  const cache = new CacheManager();
  const name = await cache.getNameFromURL(url);
  const body = new Blob([text]);
  await cache.write(name, body.stream(), {
    originalURL: url, originalSize: body.size, etag: '' });
  return (await cache.list()).length;
}"""


class SwitchableServer:
    """dist/'s handler over `site`; `html_paths` are answered as text/html."""

    def __init__(self, site: Path) -> None:
        self.html_paths: set[str] = set()
        self.cut_paths: set[str] = set()
        paths = self.html_paths
        cut = self.cut_paths

        def copyfile(handler: Any, source: Any, outputfile: Any) -> None:
            if handler.path in cut:
                # Half the body, then the connection drops (Content-Length promised all).
                data = source.read()
                outputfile.write(data[: len(data) // 2])
                handler.close_connection = True
                return
            DistRequestHandler.copyfile(handler, source, outputfile)

        def guess_type(handler: Any, path: str) -> str:
            if any(str(path).endswith(p) for p in paths):
                return "text/html"
            return str(DistRequestHandler.guess_type(handler, path))

        handler = type(
            "Handler",
            (DistRequestHandler,),
            {"quiet": True, "overlays": {}, "guess_type": guess_type, "copyfile": copyfile},
        )
        self.httpd = DistServer(("127.0.0.1", 0), functools.partial(handler, directory=str(site)))
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/"

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def site(dist_dir: Path, tmp_path: Path) -> Iterator[tuple[Path, SwitchableServer]]:
    folder = tmp_path / "site"
    shutil.copytree(dist_dir, folder)
    (folder / "user").mkdir()
    server = SwitchableServer(folder)
    try:
        yield folder, server
    finally:
        server.stop()


def boot_controlled(context: Any, url: str) -> Any:
    """The shell booted and controlled by its service worker (the precache is in)."""
    page = context.new_page()
    page.goto(url + "index.html")
    page.wait_for_function(
        "() => document.body.dataset.boot === 'ready' && document.body.dataset.offline === 'ready'"
        " && !!navigator.serviceWorker.controller",
        timeout=BOOT_TIMEOUT_MS,
    )
    return page


def test_a_fallback_page_is_never_cached_as_the_model_and_the_fixed_url_loads(
    browser: Any, site: tuple[Path, SwitchableServer]
) -> None:
    folder, server = site
    model = folder / "user" / "flaky.gguf"
    model.write_bytes(FALLBACK_PAGE)
    server.html_paths.add("/user/flaky.gguf")
    context = browser.new_context()
    context.set_default_timeout(STEP_TIMEOUT_MS)
    try:
        page = boot_controlled(context, server.url)
        page.click("#connection-add")
        page.fill("#connection-name", "Flaky host")
        page.select_option("#connection-kind", "wasm")
        page.fill("#connection-model-url", server.url + "user/flaky.gguf")
        page.fill("#connection-model", "tiny-chat")
        page.click("#connection-save")
        page.wait_for_selector("#connection-form", state="hidden")

        page.select_option("#napplet-select", "chat")
        page.click("#napplet-open")
        page.wait_for_function(
            "() => { const f = document.querySelector('iframe.napplet-frame');"
            " return f && f.srcdoc.length > 0; }"
        )
        frame = page.query_selector("iframe.napplet-frame").content_frame()
        frame.wait_for_load_state("load")
        frame.click("#choose")
        page.click(".chooser-dialog button.candidate:has-text('Flaky host')")
        frame.wait_for_function(
            "() => document.querySelector('#model').textContent.includes('Flaky host')",
            polling=POLL_MS,
        )
        frame.fill("#prompt", "Hello!")
        frame.click("#send")
        page.click(".consent-dialog button.allow")
        frame.wait_for_function(
            "() => document.querySelector('#status').classList.contains('error')", polling=POLL_MS
        )
        # The fallback page was not kept as the model, anywhere.
        assert page.evaluate(CACHED_URLS) == []
        page.evaluate("() => document.dispatchEvent(new Event('visibilitychange'))")
        page.wait_for_timeout(300)
        assert page.locator("#storage-models li", has_text="flaky.gguf").count() == 0

        assert page.evaluate(WLLAMA_FILES) == []

        # An older build's wllama kept the fallback page in its own cache,
        # whole by its metadata (its download never checked the file).
        url = server.url + "user/flaky.gguf"
        assert page.evaluate(WLLAMA_SEED, [url, FALLBACK_PAGE.decode()]) == 1
        # The host is fixed: the next try downloads again and loads.
        shutil.copyfile(folder / MODEL, model)
        server.html_paths.clear()
        assert frame.input_value("#prompt") == "Hello!"
        frame.evaluate("() => document.querySelector('#status').classList.remove('error')")
        frame.click("#send")
        page.click(".consent-dialog button.allow")
        frame.wait_for_function(
            "() => document.querySelectorAll('#history li').length === 2"
            " || document.querySelector('#status').classList.contains('error')",
            polling=POLL_MS,
        )
        assert frame.text_content("#status") == "Done."
        assert HELLO_ANSWER in (frame.text_content("#history li.assistant") or "")
        # The verified model is now in the model cache, whole.
        page.wait_for_function(
            "(u) => caches.open('napllm-models').then((c) => c.match(u))"
            ".then((r) => r ? r.arrayBuffer() : null)"
            f".then((b) => (b ? b.byteLength : 0) === {model.stat().st_size})",
            arg=server.url + "user/flaky.gguf",
        )
        # ...and only there: wllama's cache lost the bad copy and got no other.
        assert page.evaluate(WLLAMA_FILES) == []
    finally:
        context.close()


def test_only_whole_gguf_files_enter_the_model_cache(
    browser: Any, site: tuple[Path, SwitchableServer]
) -> None:
    folder, server = site
    # Served as a model type, but the bytes are no GGUF file.
    (folder / "user" / "not-gguf.gguf").write_bytes(FALLBACK_PAGE * 10)
    # Served as text/html, though the bytes are a GGUF file.
    (folder / "user" / "as-html.gguf").write_bytes(b"GGUF" + bytes(500))
    server.html_paths.add("/user/as-html.gguf")
    (folder / "user" / "good.gguf").write_bytes(b"GGUF" + bytes(2996))
    # A download cut off midway.
    (folder / "user" / "cut.gguf").write_bytes(b"GGUF" + bytes(200_000))
    server.cut_paths.add("/user/cut.gguf")
    context = browser.new_context()
    context.set_default_timeout(STEP_TIMEOUT_MS)
    try:
        page = boot_controlled(context, server.url)
        fetch_size = "(u) => fetch(u).then((r) => r.arrayBuffer()).then((b) => b.byteLength)"
        for name in ("not-gguf.gguf", "as-html.gguf", "good.gguf"):
            page.evaluate(fetch_size, "./user/" + name)
        cut_off = "(u) => fetch(u).then((r) => r.arrayBuffer()).then(() => 'whole', () => 'failed')"
        assert page.evaluate(cut_off, "./user/cut.gguf") == "failed"
        page.wait_for_function(
            "() => caches.open('napllm-models').then((c) => c.keys()).then((k) => k.length > 0)"
        )
        page.wait_for_timeout(300)
        assert page.evaluate(CACHED_URLS) == [server.url + "user/good.gguf"]
        # Once the host serves the whole file, the next try downloads and keeps it.
        server.cut_paths.clear()
        assert page.evaluate(fetch_size, "./user/cut.gguf") == 200_004
        page.wait_for_function(
            "(n) => caches.open('napllm-models').then((c) => c.keys()).then((k) => k.length === n)",
            arg=2,
        )
    finally:
        context.close()


def test_a_model_too_large_for_the_quota_is_refused_before_the_download(
    browser: Any, site: tuple[Path, SwitchableServer]
) -> None:
    folder, server = site
    shutil.copyfile(folder / MODEL, folder / "user" / "big.gguf")
    size = (folder / MODEL).stat().st_size
    context = browser.new_context()
    context.set_default_timeout(STEP_TIMEOUT_MS)
    downloads: list[str] = []
    context.on(
        "request",
        lambda r: downloads.append(r.method) if r.url.endswith("/user/big.gguf") else None,
    )
    try:
        page = boot_controlled(context, server.url)
        # The Storage panel says whether the browser keeps the data.
        persisted = page.evaluate("() => navigator.storage.persisted()")
        panel = page.locator("#storage-persistent")
        panel.wait_for()
        page.wait_for_function(
            "(p) => document.querySelector('#storage-persistent').dataset.persistent === String(p)",
            arg=persisted,
        )
        expected = "Storage is persistent" if persisted else "Storage is not persistent"
        assert (panel.text_content() or "").startswith(expected)

        # The browser reports less room than the model needs (half its size).
        page.evaluate(
            "(room) => { const real = navigator.storage.estimate.bind(navigator.storage);"
            " navigator.storage.estimate = () => real().then((e) =>"
            " ({ usage: e.usage, quota: e.usage + room })); }",
            size // 2,
        )
        page.click("#connection-add")
        page.fill("#connection-name", "Big model")
        page.select_option("#connection-kind", "wasm")
        page.fill("#connection-model-url", server.url + "user/big.gguf")
        page.click("#connection-save")
        page.wait_for_selector("#connection-form", state="hidden")
        page.select_option("#napplet-select", "chat")
        page.click("#napplet-open")
        page.wait_for_function(
            "() => { const f = document.querySelector('iframe.napplet-frame');"
            " return f && f.srcdoc.length > 0; }"
        )
        frame = page.query_selector("iframe.napplet-frame").content_frame()
        frame.wait_for_load_state("load")
        frame.click("#choose")
        page.click(".chooser-dialog button.candidate:has-text('Big model')")
        frame.wait_for_function(
            "() => document.querySelector('#model').textContent.includes('Big model')",
            polling=POLL_MS,
        )
        frame.fill("#prompt", "Hello!")
        frame.click("#send")
        page.click(".consent-dialog button.allow")
        frame.wait_for_function(
            "() => document.querySelector('#status').classList.contains('error')", polling=POLL_MS
        )
        notice = page.locator("#notice-list .notice.error", has_text="Not enough storage")
        notice.wait_for()
        text = notice.text_content() or ""
        assert "Big model" in text and "it needs 1.2 MB" in text and "left for napllm" in text
        # Only the size was asked for: nothing was downloaded.
        assert "GET" not in downloads
        assert page.evaluate(CACHED_URLS) == []
    finally:
        context.close()
