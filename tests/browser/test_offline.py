"""The shell as an offline web app: service worker, precache, update banner, Storage.

Each test runs Chromium with a persistent profile
(``launch_persistent_context``), like an installed browser, against its own
127.0.0.1 server so the server can be stopped. The offline test visits once,
waits until the service worker controls the page (so the precache is
complete), cuts the network *and* stops the server, reloads, and then uses
the shell: it boots, lists the example napplets, and the Chat napplet gets
TinyChat's exact answer through the real chooser and consent clicks.
"""

from __future__ import annotations

import json
import re
import shutil
import struct
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import RETURNING_VISITOR_SCRIPT
from napllm.devtools.headless import make_server
from napllm.providers.engine_wasm import TINYCHAT_PATH

pytestmark = pytest.mark.browser

BOOT_TIMEOUT_MS = 120_000
STEP_TIMEOUT_MS = 60_000
POLL_MS = 20
TINYCHAT = "builtin-tinychat"
HELLO_ANSWER = "Hello! How can I help you today?"
EXAMPLES = {"chat", "json", "prompt", "tools"}
#: Fetch a URL in the page; resolves with the body's length in bytes.
FETCH_SIZE = "(u) => fetch(u).then((r) => r.arrayBuffer()).then((b) => b.byteLength)"


class Server:
    """The shell's dist/ server on a free 127.0.0.1 port, stoppable by the test."""

    def __init__(self, directory: Path) -> None:
        self.httpd = make_server(directory, quiet=True)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()
        self.running = True

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/"

    def stop(self) -> None:
        if self.running:
            self.running = False
            self.httpd.shutdown()
            self.httpd.server_close()


@pytest.fixture
def persistent(
    browser_type: Any, browser_type_launch_args: dict[str, Any], tmp_path: Path
) -> Iterator[Any]:
    """A Chromium context with a profile folder of its own (kept across reloads)."""
    context = browser_type.launch_persistent_context(
        str(tmp_path / "profile"),
        executable_path=browser_type_launch_args["executable_path"],
        args=browser_type_launch_args["args"],
    )
    context.add_init_script(RETURNING_VISITOR_SCRIPT)  # no Chat napplet opening by itself
    context.set_default_timeout(STEP_TIMEOUT_MS)
    try:
        yield context
    finally:
        context.close()


def wait_boot(page: Any) -> None:
    page.wait_for_function(
        "() => ['ready', 'failed'].includes(document.body.dataset.boot)", timeout=BOOT_TIMEOUT_MS
    )
    assert page.evaluate("document.body.dataset.boot") == "ready", page.evaluate(
        "document.querySelector('#boot-error-message').textContent"
    )


def wait_offline_ready(page: Any) -> None:
    """Wait until a service worker controls the page: install (the precache) is done."""
    page.wait_for_function(
        "() => document.body.dataset.offline === 'ready' && !!navigator.serviceWorker.controller",
        timeout=BOOT_TIMEOUT_MS,
    )


def napplet_names(page: Any) -> set[str]:
    page.wait_for_function(
        "() => [...document.querySelectorAll('#napplet-select option')].some((o) => o.value)"
    )
    names: list[str] = page.eval_on_selector_all(
        "#napplet-select option", "(options) => options.map((o) => o.value)"
    )
    return {n for n in names if n}


def chat_hello(page: Any) -> str:
    """Open the Chat example, choose TinyChat, send "Hello!", allow; return the answer."""
    page.select_option("#napplet-select", "chat")
    page.click("#napplet-open")
    page.wait_for_function(
        "() => { const f = document.querySelector('iframe.napplet-frame');"
        " return f && f.srcdoc.length > 0; }"
    )
    frame = page.query_selector("iframe.napplet-frame").content_frame()
    frame.wait_for_load_state("load")
    frame.click("#choose")
    page.click(f".chooser-dialog button.candidate[data-candidate-id='{TINYCHAT}']")
    frame.wait_for_function(
        "() => document.querySelector('#model').textContent.includes('TinyChat')",
        polling=POLL_MS,
    )
    frame.fill("#prompt", "Hello!")
    frame.click("#send")
    page.click(".consent-dialog button.allow")
    frame.wait_for_function(
        "() => document.querySelectorAll('#history li').length === 2",
        polling=POLL_MS,
        timeout=STEP_TIMEOUT_MS,
    )
    return frame.text_content("#history li.assistant") or ""


def test_shell_boots_and_chats_with_tinychat_offline_after_one_visit(
    persistent: Any, dist_dir: Path
) -> None:
    server = Server(dist_dir)
    try:
        page = persistent.new_page()
        page.goto(server.url + "index.html")
        wait_boot(page)
        wait_offline_ready(page)
        # The manifest makes the shell installable.
        assert page.evaluate(
            "() => document.querySelector('link[rel=manifest]').getAttribute('href')"
        ) == ("./manifest.webmanifest")
    finally:
        server.stop()
    persistent.set_offline(True)

    responses: list[Any] = []
    persistent.on("response", lambda r: responses.append(r))
    failed: list[str] = []
    # A HEAD answered by the service worker (headers only) reads as "aborted".
    persistent.on(
        "requestfailed",
        lambda r: None if r.method == "HEAD" else failed.append(f"{r.url}: {r.failure}"),
    )
    page.reload()
    wait_boot(page)
    assert napplet_names(page) >= EXAMPLES
    assert HELLO_ANSWER in chat_hello(page)

    # Everything after the reload came from the service worker.
    page_responses = [r for r in responses if r.url.startswith(server.url)]
    assert page_responses, "no responses were recorded"
    not_from_sw = [r.url for r in page_responses if not r.from_service_worker]
    assert not not_from_sw, f"served without the service worker: {not_from_sw}"
    assert not failed, f"requests failed offline: {failed}"

    # The Storage section lists the built-in model with its size.
    page.wait_for_selector("#storage-models li.storage-model")
    item = page.locator("#storage-models li.storage-model", has_text="tiny-chat-q8_0.gguf")
    assert item.count() == 1
    size = (dist_dir / "models" / "tinychat" / "tiny-chat-q8_0.gguf").stat().st_size
    assert item.get_attribute("data-bytes") == str(size)
    assert "1.2 MB" in (item.text_content() or "")
    assert item.locator("button.delete").count() == 0  # part of the app
    page.wait_for_function(
        "() => Number(document.querySelector('#storage-total').dataset.usage) > 0"
    )


def test_new_version_waits_for_the_users_reload(
    persistent: Any, dist_dir: Path, tmp_path: Path
) -> None:
    site = tmp_path / "site"
    shutil.copytree(dist_dir, site)
    server = Server(site)
    try:
        page = persistent.new_page()
        page.goto(server.url + "index.html")
        wait_boot(page)
        wait_offline_ready(page)
        assert page.locator("#pwa-update").count() == 0
        first = page.evaluate("() => navigator.serviceWorker.controller.scriptURL")
        assert first == server.url + "sw.js"

        # A new build: one precached file and therefore sw.js change.
        (site / "prelude.js").write_text((site / "prelude.js").read_text() + "\n// v2\n")
        sw = site / "sw.js"
        text, changed = re.subn(
            r'(url:"prelude\.js",revision:")[0-9a-f]+"', r'\g<1>0123456789abcdef"', sw.read_text()
        )
        assert changed == 1, "the precache manifest has no revision for prelude.js"
        sw.write_text(text)
        page.evaluate("() => navigator.serviceWorker.getRegistration().then((r) => r.update())")
        page.wait_for_selector("#pwa-update", timeout=BOOT_TIMEOUT_MS)
        assert "A new version is available" in (page.text_content("#pwa-update") or "")
        # Until the user agrees, the new worker waits and the old one keeps control.
        page.wait_for_timeout(500)
        state = page.evaluate(
            "() => navigator.serviceWorker.getRegistration().then((r) =>"
            " ({waiting: !!r.waiting, active: !!r.active}))"
        )
        assert state == {"waiting": True, "active": True}

        page.evaluate("() => { window.beforeUpdate = true; }")
        page.click("#pwa-update-reload")
        page.wait_for_function("() => window.beforeUpdate === undefined", timeout=STEP_TIMEOUT_MS)
        wait_boot(page)
        page.wait_for_function(
            "() => navigator.serviceWorker.getRegistration().then((r) => !r.waiting)"
        )
        assert page.locator("#pwa-update").count() == 0
        prelude = page.evaluate("() => fetch('./prelude.js').then((r) => r.text())")
        assert prelude.endswith("// v2\n")
    finally:
        server.stop()


def test_user_models_are_cached_listed_with_their_size_and_deletable(
    persistent: Any, dist_dir: Path, tmp_path: Path
) -> None:
    site = tmp_path / "site"
    shutil.copytree(dist_dir, site)
    (site / "user").mkdir()
    (site / "user" / "model-b.gguf").write_bytes(b"GGUF" + bytes(2996))
    server = Server(site)
    try:
        page = persistent.new_page()
        page.goto(server.url + "index.html")
        wait_offline_ready(page)
        # The built-in model is answered by the precache, whatever the query:
        # nothing is stored twice.
        fetched = page.evaluate(
            "() => fetch('./models/tinychat/tiny-chat-q8_0.gguf?copy=1')"
            ".then((r) => r.arrayBuffer()).then((b) => b.byteLength)"
        )
        assert fetched == (site / "models" / "tinychat" / "tiny-chat-q8_0.gguf").stat().st_size
        assert cached_urls(page) == []

        # A model the user adds by URL goes into the model cache (runtime caching) ...
        fetched = page.evaluate(FETCH_SIZE, "./user/model-b.gguf")
        assert fetched == 3000
        page.wait_for_function(
            "() => caches.open('napllm-models').then((c) => c.keys()).then((k) => k.length === 1)"
        )
        assert cached_urls(page) == [server.url + "user/model-b.gguf"]
        # ... and is then served without the server.
        server.stop()
        again = page.evaluate(FETCH_SIZE, "./user/model-b.gguf")
        assert again == 3000

        page.evaluate("() => document.dispatchEvent(new Event('visibilitychange'))")
        row = page.locator("#storage-models li.storage-model", has_text="model-b.gguf")
        row.wait_for()
        assert "3.0 kB" in (row.text_content() or "")
        assert row.get_attribute("data-bytes") == "3000"
        row.locator("button.delete").click()
        row.wait_for(state="detached")
        assert cached_urls(page) == []
        assert page.locator("#storage-models li.storage-model", has_text="tiny-chat").count() == 1
    finally:
        server.stop()


def cached_urls(page: Any) -> list[str]:
    """The URLs in the user model cache."""
    urls: list[str] = page.evaluate(
        "() => caches.open('napllm-models').then((c) => c.keys()).then((k) => k.map((r) => r.url))"
    )
    return urls


def test_precache_manifest_is_relative_and_covers_the_offline_shell(dist_dir: Path) -> None:
    """sw.js lists (Workbox-generated) every file the offline shell needs, by relative URL."""
    sw = (dist_dir / "sw.js").read_text()
    urls = re.findall(r'url:"([^"]+)"', sw)
    assert urls, "no precache manifest in sw.js"
    assert len(urls) == len(set(urls))
    for url in urls:
        assert not url.startswith("/") and "://" not in url and ".." not in url, url
        assert (dist_dir / url).is_file(), f"precached but missing: {url}"
    wheels = {p.name for p in (dist_dir / "pyodide").glob("*.whl")}
    assert {f"pyodide/{w}" for w in wheels} <= set(urls)
    needed = {
        "index.html",
        "shell.js",
        "js/pwa.js",
        "manifest.webmanifest",
        "napplets/index.json",
        "pyodide/pyodide.mjs",
        "pyodide/pyodide.asm.mjs",
        "pyodide/pyodide.asm.wasm",
        "pyodide/python_stdlib.zip",
        "pyodide/pyodide-lock.json",
        "engines/engine-host.js",
        "engines/wllama-worker.js",
        "vendor/wllama/wllama.js",
        "vendor/wllama/wllama.wasm",
        "vendor/workbox-window/workbox-window.prod.mjs",
        TINYCHAT_PATH,
    }
    assert needed <= set(urls), needed - set(urls)
    for entry in json.loads((dist_dir / "napplets" / "index.json").read_text()):
        assert entry["path"] in urls
    # The worker waits for the user: no skipWaiting at install, only on request.
    assert "SKIP_WAITING" in sw


def test_manifest_icons_are_pngs_of_their_stated_size(dist_dir: Path) -> None:
    manifest = json.loads((dist_dir / "manifest.webmanifest").read_text())
    assert manifest["start_url"] == "./" and manifest["scope"] == "./"
    sizes = set()
    for icon in manifest["icons"]:
        data = (dist_dir / icon["src"]).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
        width, height = struct.unpack(">II", data[16:24])
        assert icon["sizes"] == f"{width}x{height}" and icon["type"] == "image/png"
        sizes.add(width)
    assert {192, 512} <= sizes


ENGINE = "engines/engine-host.js"
MARKER_B = "\n// build B\n"
#: The text of the engine file as this page gets it.
ENGINE_TEXT = f"() => fetch('./{ENGINE}').then((r) => r.text())"
PRECACHES = "() => caches.keys().then((k) => k.filter((n) => n.includes('-precache-')))"


def deploy_build_b(site: Path) -> None:
    """Turn the copy of build A in `site` into build B: another engine file, another build id."""
    engine = site / ENGINE
    engine.write_text(engine.read_text() + MARKER_B)
    old_id = json.loads(
        re.search(r"NAPLLM_BUILD = (\{.*\});", (site / "sw-build.js").read_text()).group(1)  # type: ignore[union-attr]
    )["id"]
    new_id = "b" * len(old_id)
    build_js = site / "sw-build.js"
    build_js.write_text(build_js.read_text().replace(old_id, new_id))
    sw = site / "sw.js"
    text, changed = re.subn(
        r'(url:"engines/engine-host\.js",revision:")[0-9a-f]+"',
        r'\g<1>0123456789abcdef"',
        sw.read_text(),
    )
    assert changed == 1, "the precache manifest has no revision for the engine file"
    assert old_id in text
    sw.write_text(text.replace(old_id, new_id))


@pytest.mark.parametrize("server_up", [True, False], ids=["server-up", "server-stopped"])
def test_a_tab_keeps_its_build_when_another_tab_updates(
    persistent: Any, dist_dir: Path, tmp_path: Path, server_up: bool
) -> None:
    site = tmp_path / "site"
    shutil.copytree(dist_dir, site)
    # A worker that reports the engine file's text as it gets it.
    (site / "probe-worker.js").write_text(
        f"fetch('./{ENGINE}').then((r) => r.text()).then((t) => postMessage(t));\n"
    )
    server = Server(site)
    try:
        t1 = persistent.new_page()
        t1.goto(server.url + "index.html")
        wait_boot(t1)
        wait_offline_ready(t1)
        t2 = persistent.new_page()
        t2.goto(server.url + "index.html")
        wait_boot(t2)
        wait_offline_ready(t2)
        build_a = t2.evaluate(ENGINE_TEXT)
        assert not build_a.endswith(MARKER_B)

        deploy_build_b(site)
        t1.evaluate("() => navigator.serviceWorker.getRegistration().then((r) => r.update())")
        t1.wait_for_selector("#pwa-update", timeout=BOOT_TIMEOUT_MS)
        t1.evaluate("() => { window.beforeUpdate = true; }")
        t1.click("#pwa-update-reload")
        t1.wait_for_function("() => window.beforeUpdate === undefined", timeout=STEP_TIMEOUT_MS)
        wait_boot(t1)
        assert t1.evaluate(ENGINE_TEXT).endswith(MARKER_B)
        if not server_up:
            server.stop()

        # T2 did not reload: it is still served build A's files, from A's precache.
        assert t2.evaluate(ENGINE_TEXT) == build_a
        assert t2.evaluate(f"() => import('./{ENGINE}').then((m) => typeof m.hostFor)") == (
            "function"
        )
        assert len(t2.evaluate(PRECACHES)) == 2
        if server_up:
            # So does a worker T2 starts now.
            from_worker = t2.evaluate(
                "() => new Promise((resolve) => { const w = new Worker('./probe-worker.js');"
                " w.onmessage = (e) => resolve(e.data); })"
            )
            assert from_worker == build_a
        # T2 is told, and its own Reload works: it then runs build B.
        t2.wait_for_selector("#pwa-update")
        t2.evaluate("() => { window.beforeUpdate = true; }")
        t2.click("#pwa-update-reload")
        t2.wait_for_function("() => window.beforeUpdate === undefined", timeout=STEP_TIMEOUT_MS)
        wait_boot(t2)
        assert t2.evaluate(ENGINE_TEXT).endswith(MARKER_B)
        assert t2.locator("#pwa-update").count() == 0
        # No tab runs build A any more: its precache is gone.
        t2.wait_for_function(f"() => ({PRECACHES})().then((names) => names.length === 1)")
    finally:
        server.stop()
