"""Resumable model downloads (web/engines/download.js) against a local host that misbehaves.

The host (tests/browser/flaky_host.py) serves the test build on 127.0.0.1
and answers model paths by a plan the test sets: cut the body midway,
refuse for a while, serve ranges or not, change the file between attempts.
The module is driven from a blank page of that origin; the last test loads
a model whose download is cut through the shell's own wasm engine.
"""

from __future__ import annotations

import hashlib
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flaky_host import FlakyHost, HostedFile

from napllm.devtools.engines import engine_host_js

STEP_TIMEOUT_MS = 90_000
BOOT_TIMEOUT_MS = 120_000
POLL_MS = 50
LIMIT = 8 * 1024 * 1024  # the test build's MAX_GGUF_MODEL_BYTES (tests/hooks/engine-limits.js)
SIZE = 3_000_000
BLANK = "/_dl/blank.html"
MODEL_PATH = "/_dl/model.gguf"
HELLO_ANSWER = "Hello! How can I help you today?"

#: Download `url` with download.js; report the bytes' digest and the progress seen.
DOWNLOAD = """async ([url, opts]) => {
  const d = await import('/engines/download.js');
  const events = [];
  const hex = (b) => [...new Uint8Array(b)].map((x) => x.toString(16).padStart(2, '0')).join('');
  try {
    const blob = await d.downloadModelFile(url, { ...opts, onProgress: (e) => events.push(e) });
    const bytes = await blob.arrayBuffer();
    const digest = await crypto.subtle.digest('SHA-256', bytes);
    return { ok: true, size: bytes.byteLength, sha: hex(digest),
      restarted: [...new Set(events.map((e) => e.restarted).filter(Boolean))],
      resumedFrom: Math.max(0, ...events.map((e) => e.resumedFrom)),
      shared: events.some((e) => e.shared),
      text: events.length ? d.describeProgress(events[events.length - 1]) : '' };
  } catch (e) {
    return { ok: false, name: e.name, message: String(e.message) };
  }
}"""
UNFINISHED = "async () => (await import('/engines/download.js')).unfinishedDownloads()"
PARTS = "() => caches.open('napllm-download-parts').then((c) => c.keys()).then((k) => k.length)"


def model_bytes(seed: int, size: int = SIZE) -> bytes:
    return b"GGUF" + random.Random(seed).randbytes(size - 4)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def host(test_dist_dir: Path) -> Iterator[FlakyHost]:
    server = FlakyHost(test_dist_dir)
    server.files[BLANK] = HostedFile(
        body=b"<!doctype html><title>downloads</title>", content_type="text/html"
    )
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def blank(browser: Any, host: FlakyHost) -> Iterator[Any]:
    context = browser.new_context()
    context.set_default_timeout(STEP_TIMEOUT_MS)
    try:
        page = context.new_page()
        page.goto(host.url + BLANK.lstrip("/"))
        yield page
    finally:
        context.close()


def download(page: Any, host: FlakyHost, **opts: Any) -> dict[str, Any]:
    options = {"limit": LIMIT, "gguf": True, **opts}
    result: dict[str, Any] = page.evaluate(DOWNLOAD, [host.url + MODEL_PATH.lstrip("/"), options])
    return result


def test_a_cut_download_continues_from_the_bytes_received(blank: Any, host: FlakyHost) -> None:
    body = model_bytes(1)
    host.files[MODEL_PATH] = HostedFile(body=body, cuts=1, cut_at=1_000_000)
    result = download(blank, host, store="napllm-models")
    assert result["ok"], result
    assert result["sha"] == sha(body) and result["size"] == SIZE
    first, second = host.requests(MODEL_PATH)
    assert first["range"] is None and first["sent"] == 1_000_000
    # The second request asks only for the rest, for the same version.
    start = int(second["range"].removeprefix("bytes=").removesuffix("-"))
    assert 0 < start <= 1_000_000
    assert second["if_range"] == '"v1"' and second["status"] == 206
    assert second["sent"] == SIZE - start
    assert result["resumedFrom"] == start and result["restarted"] == []
    assert "resumed at" in result["text"]
    # The whole file is in the store; no part is left.
    assert blank.evaluate(PARTS) == 0
    stored = blank.evaluate(
        "(u) => caches.open('napllm-models').then((c) => c.match(u)).then((r) => r.arrayBuffer())"
        ".then((b) => b.byteLength)",
        host.url + MODEL_PATH.lstrip("/"),
    )
    assert stored == SIZE
    # The next download is the stored copy: no request.
    again = download(blank, host, store="napllm-models")
    assert again["sha"] == sha(body) and len(host.requests(MODEL_PATH)) == 2


def test_a_download_resumes_after_a_reload(blank: Any, host: FlakyHost) -> None:
    body = model_bytes(2)
    host.files[MODEL_PATH] = HostedFile(body=body, cuts=1, cut_at=1_200_000, refuse=100)
    failed = download(blank, host)
    assert not failed["ok"] and failed["name"] == "DownloadInterrupted"
    assert failed["message"] == "status 503 at every try (5 tries)"
    [left] = blank.evaluate(UNFINISHED)
    assert left["url"] == host.url + MODEL_PATH.lstrip("/")
    assert 0 < left["received"] <= 1_200_000 and left["total"] == SIZE
    blank.reload()
    # The network is gone at the next try: the bytes stay for the one after.
    # (The module is loaded first: this page has no service worker.)
    blank.evaluate("() => import('/engines/download.js').then(() => true)")
    blank.context.set_offline(True)
    assert not download(blank, host)["ok"]
    assert blank.evaluate(UNFINISHED) == [left]
    blank.context.set_offline(False)
    host.files[MODEL_PATH].refuse = 0
    result = download(blank, host)
    assert result["ok"] and result["sha"] == sha(body)
    last = host.requests(MODEL_PATH)[-1]
    assert last["range"] == f"bytes={left['received']}-" and last["status"] == 206
    assert last["sent"] == SIZE - left["received"]
    assert blank.evaluate(UNFINISHED) == []


def test_a_host_without_ranges_restarts_and_says_so(blank: Any, host: FlakyHost) -> None:
    body = model_bytes(3)
    host.files[MODEL_PATH] = HostedFile(body=body, ranges=False, cuts=1, cut_at=1_000_000)
    result = download(blank, host)
    assert result["ok"] and result["sha"] == sha(body)
    _, second = host.requests(MODEL_PATH)
    assert second["range"] is not None and second["status"] == 200 and second["sent"] == SIZE
    assert result["restarted"] == ["no-ranges"]
    assert "cannot resume" in result["text"]
    assert blank.evaluate(PARTS) == 0


def test_a_changed_file_restarts_from_zero(blank: Any, host: FlakyHost) -> None:
    host.files[MODEL_PATH] = HostedFile(body=model_bytes(4), cuts=1, cut_at=1_000_000, refuse=100)
    assert not download(blank, host)["ok"]
    assert blank.evaluate(UNFINISHED)[0]["received"] > 0
    # A new version of the file, with its own validator.
    new = model_bytes(5, SIZE + 1000)
    plan = host.files[MODEL_PATH]
    plan.body, plan.etag, plan.refuse = new, '"v2"', 0
    result = download(blank, host)
    assert result["ok"] and result["sha"] == sha(new) and result["size"] == SIZE + 1000
    last = host.requests(MODEL_PATH)[-1]
    assert last["if_range"] == '"v1"' and last["status"] == 200
    assert result["restarted"] == ["changed"] and "file changed" in result["text"]


def test_a_206_without_the_stored_validator_is_another_file(blank: Any, host: FlakyHost) -> None:
    # A broken host answers the rest with 206 whatever If-Range said: the
    # 206 must repeat the stored ETag, else its bytes are of another file.
    for seed, partial_etag in ((11, ""), (13, '"v2"')):
        host.files[MODEL_PATH] = HostedFile(
            body=model_bytes(seed), cuts=1, cut_at=1_000_000, refuse=100
        )
        assert not download(blank, host)["ok"]
        assert blank.evaluate(UNFINISHED)[0]["received"] > 0
        new = model_bytes(seed + 1)
        plan = host.files[MODEL_PATH]
        plan.body, plan.etag, plan.refuse, plan.partial_etag = new, '"v2"', 0, partial_etag
        result = download(blank, host)
        assert result["ok"] and result["sha"] == sha(new), (partial_etag, result)
        answers = host.requests(MODEL_PATH)[-2:]
        assert [a["status"] for a in answers] == [206, 200]
        assert answers[1]["range"] is None and answers[1]["sent"] == SIZE
        assert result["restarted"] == ["changed"]
        host.log.clear()


def test_a_weak_etag_is_no_validator_for_if_range(blank: Any, host: FlakyHost) -> None:
    # RFC 9110 13.1.5: no weak ETag in If-Range, and no date when the file
    # has an ETag: such a file is not resumed but started again from zero.
    when = "Tue, 01 Dec 2026 10:00:00 GMT"
    body = model_bytes(15)
    host.files[MODEL_PATH] = HostedFile(
        body=body, etag='W/"v1"', last_modified=when, cuts=1, cut_at=600_000
    )
    result = download(blank, host)
    assert result["ok"] and result["sha"] == sha(body), result
    _, second = host.requests(MODEL_PATH)
    assert second["range"] is None and second["if_range"] is None and second["status"] == 200
    assert result["restarted"] == ["cut"] and blank.evaluate(PARTS) == 0


def test_a_file_that_changes_at_every_try_gives_up_and_says_why(
    blank: Any, host: FlakyHost
) -> None:
    # Each try gets further than the last, but of another version of the
    # file: a restart from zero is no progress, so the tries run out.
    host.files[MODEL_PATH] = HostedFile(
        body=model_bytes(16), changes=True, cuts=100, cut_at=400_000, cut_step=400_000
    )
    result = download(blank, host)
    assert not result["ok"] and result["name"] == "DownloadRestarted", result
    assert "changed on the server at every try" in result["message"]
    assert len(host.requests(MODEL_PATH)) == 5  # the first try and 4 retries


def test_last_modified_is_the_validator_without_an_etag(blank: Any, host: FlakyHost) -> None:
    body = model_bytes(6)
    when = "Tue, 01 Dec 2026 10:00:00 GMT"
    host.files[MODEL_PATH] = HostedFile(
        body=body, etag=None, last_modified=when, cuts=1, cut_at=600_000
    )
    result = download(blank, host)
    assert result["ok"] and result["sha"] == sha(body)
    assert host.requests(MODEL_PATH)[-1]["if_range"] == when
    assert host.requests(MODEL_PATH)[-1]["status"] == 206


def test_a_file_without_a_validator_starts_again_after_a_cut(blank: Any, host: FlakyHost) -> None:
    # Nothing says the next answer is the same file: no bytes are kept, and
    # the next try asks for all of it.
    body = model_bytes(7)
    host.files[MODEL_PATH] = HostedFile(body=body, etag=None, cuts=1, cut_at=600_000)
    result = download(blank, host)
    assert result["ok"] and result["sha"] == sha(body), result
    assert [r["range"] for r in host.requests(MODEL_PATH)] == [None, None]
    assert result["restarted"] == ["cut"] and blank.evaluate(PARTS) == 0


def test_checks_hold_over_the_joined_bytes(blank: Any, host: FlakyHost) -> None:
    # The magic is checked across the cut: "GG" then "XX..." is no GGUF file.
    host.files[MODEL_PATH] = HostedFile(body=b"GGXX" + bytes(500_000), cuts=1, cut_at=2)
    result = download(blank, host)
    assert not result["ok"] and result["name"] == "NotAModel"
    assert blank.evaluate(PARTS) == 0
    # A text answer is refused, whole or as the rest of a file.
    host.files[MODEL_PATH] = HostedFile(body=model_bytes(8), cuts=1, cut_at=500_000)
    host.files[MODEL_PATH].content_type = "application/octet-stream"
    plan = host.files[MODEL_PATH]
    plan.refuse = 100
    assert not download(blank, host)["ok"]
    plan.refuse, plan.content_type = 0, "text/html"
    result = download(blank, host)
    assert not result["ok"] and result["name"] == "NotAModel"
    assert blank.evaluate(PARTS) == 0
    # A declared length above the ceiling fails before the body is read.
    host.files[MODEL_PATH] = HostedFile(body=model_bytes(9))
    result = download(blank, host, limit=SIZE - 1)
    assert not result["ok"] and result["name"] == "DownloadTooLarge"
    assert blank.evaluate(PARTS) == 0


def test_two_tabs_share_one_download(browser: Any, host: FlakyHost) -> None:
    body = model_bytes(10)
    host.files[MODEL_PATH] = HostedFile(body=body, delay=0.02)
    context = browser.new_context()
    context.set_default_timeout(STEP_TIMEOUT_MS)
    try:
        first, second = context.new_page(), context.new_page()
        for page in (first, second):
            page.goto(host.url + BLANK.lstrip("/"))
        url = host.url + MODEL_PATH.lstrip("/")
        start = "([url, opts]) => { window.result = (" + DOWNLOAD + ")([url, opts]); return true; }"
        opts = {"limit": LIMIT, "gguf": True, "store": "napllm-models"}
        first.evaluate(start, [url, opts])
        # The first tab's request is under way before the second tab starts.
        deadline = time.monotonic() + 30
        while not host.requests(MODEL_PATH) and time.monotonic() < deadline:
            time.sleep(0.05)
        second.evaluate(start, [url, opts])
        one = first.evaluate("() => window.result")
        two = second.evaluate("() => window.result")
        assert one["ok"] and two["ok"] and one["sha"] == two["sha"] == sha(body)
        # One request for the file; the second tab showed the first one's progress.
        assert len(host.requests(MODEL_PATH)) == 1
        assert two["shared"] and not one["shared"]
    finally:
        context.close()


#: Start loading the wasm model at `url` through the engine host (as the
#: runtime's ensureModel does); the answer lands in `window.loaded`.
START_LOAD = """(url) => {
  window.loaded = undefined;
  const fields = JSON.stringify({url, params: {n_ctx: 256, n_threads: 1, n_gpu_layers: 0}});
  @HOST@.then((api) => api.ensureModel(JSON.stringify([url]), fields, "stall", "Stalling host"))
    .then((text) => { window.loaded = JSON.parse(text); },
      (error) => { window.loaded = {ok: false, threw: String(error)}; });
  return true;
}""".replace("@HOST@", engine_host_js("wasm", "../"))


def test_a_stalled_host_blocks_no_tab_and_no_later_try(
    browser: Any, host: FlakyHost, test_dist_dir: Path
) -> None:
    # Headers and 1 KiB, then nothing: each tab's load ends with a download
    # failure (the test build's bounds are short), the Web Lock passes on,
    # and once the host recovers the same model loads in both tabs.
    model = (test_dist_dir / "models" / "tinychat" / "tiny-chat-q8_0.gguf").read_bytes()
    path = "/_dl/stall-tinychat.gguf"
    url = host.url + path.lstrip("/")
    host.files[path] = HostedFile(body=model, stalls=1000, cut_at=1024)
    context = browser.new_context()
    context.set_default_timeout(STEP_TIMEOUT_MS)
    try:
        first, second = context.new_page(), context.new_page()
        for page in (first, second):
            page.goto(host.url + BLANK.lstrip("/"))
        first.evaluate(START_LOAD, url)
        deadline = time.monotonic() + 30
        while not host.requests(path) and time.monotonic() < deadline:
            time.sleep(0.05)
        second.evaluate(START_LOAD, url)
        for page in (first, second):
            page.wait_for_function("() => window.loaded !== undefined", polling=POLL_MS)
            assert page.evaluate("() => window.loaded") == {"ok": False, "kind": "download"}
        # Bounded: five tries per tab at most.
        stalled = len(host.requests(path))
        assert 2 <= stalled <= 10
        host.recover()
        for page in (first, second):
            page.evaluate(START_LOAD, url)
            page.wait_for_function("() => window.loaded !== undefined", polling=POLL_MS)
            loaded = page.evaluate("() => window.loaded")
            assert loaded["ok"] is True, loaded
        # The later tries asked the host again.
        assert len(host.requests(path)) > stalled
    finally:
        context.close()


def test_the_wasm_engine_resumes_a_cut_model_download(
    browser: Any, host: FlakyHost, test_dist_dir: Path
) -> None:
    model = (test_dist_dir / "models" / "tinychat" / "tiny-chat-q8_0.gguf").read_bytes()
    path = "/_dl/cut-tinychat.gguf"
    host.files[path] = HostedFile(body=model, cuts=1, cut_at=len(model) // 2)
    context = browser.new_context()
    context.set_default_timeout(STEP_TIMEOUT_MS)
    try:
        page = context.new_page()
        page.goto(host.url + "index.html")
        page.wait_for_function(
            "() => document.body.dataset.boot === 'ready'"
            " && document.body.dataset.offline === 'ready'"
            " && !!navigator.serviceWorker.controller",
            timeout=BOOT_TIMEOUT_MS,
        )
        page.click("#connection-add")
        page.fill("#connection-name", "Cut host")
        page.select_option("#connection-kind", "wasm")
        page.fill("#connection-model-url", host.url + path.lstrip("/"))
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
        page.click(".chooser-dialog button.candidate:has-text('Cut host')")
        frame.wait_for_function(
            "() => document.querySelector('#model').textContent.includes('Cut host')",
            polling=POLL_MS,
        )
        frame.fill("#prompt", "Hello!")
        frame.click("#send")
        page.click(".consent-dialog button.allow")
        frame.wait_for_function(
            "() => document.querySelectorAll('#history li').length === 2"
            " || document.querySelector('#status').classList.contains('error')",
            polling=POLL_MS,
        )
        assert frame.text_content("#status") == "Done."
        assert HELLO_ANSWER in (frame.text_content("#history li.assistant") or "")
        gets = host.requests(path)
        assert len(gets) == 2 and gets[0]["sent"] == len(model) // 2
        assert gets[1]["status"] == 206 and gets[1]["range"].startswith("bytes=")
        # The rest only: the model crossed the network about once.
        assert gets[0]["sent"] + gets[1]["sent"] <= len(model) + 64 * 1024
        assert page.evaluate(PARTS) == 0
    finally:
        context.close()


def boot_shell(context: Any, host: FlakyHost) -> Any:
    """The shell of the host's origin, booted and controlled by its service worker."""
    page = context.new_page()
    page.goto(host.url + "index.html")
    page.wait_for_function(
        "() => document.body.dataset.boot === 'ready' && document.body.dataset.offline === 'ready'"
        " && !!navigator.serviceWorker.controller",
        timeout=BOOT_TIMEOUT_MS,
    )
    return page


def add_wasm_connection(page: Any, name: str, url: str) -> None:
    page.click("#connection-add")
    page.fill("#connection-name", name)
    page.select_option("#connection-kind", "wasm")
    page.fill("#connection-model-url", url)
    page.fill("#connection-model", "tiny-chat")
    page.click("#connection-save")
    page.wait_for_selector("#connection-form", state="hidden")


def chat_hello(page: Any, name: str) -> Any:
    """Ask the Chat example "Hello!" through connection `name`; returns its frame once answered."""
    page.select_option("#napplet-select", "chat")
    page.click("#napplet-open")
    page.wait_for_function(
        "() => { const f = document.querySelector('iframe.napplet-frame');"
        " return f && f.srcdoc.length > 0; }"
    )
    frame = page.query_selector("iframe.napplet-frame").content_frame()
    frame.wait_for_load_state("load")
    frame.click("#choose")
    page.click(f".chooser-dialog button.candidate:has-text('{name}')")
    frame.wait_for_function(
        "(n) => document.querySelector('#model').textContent.includes(n)", arg=name, polling=POLL_MS
    )
    frame.fill("#prompt", "Hello!")
    frame.click("#send")
    page.click(".consent-dialog button.allow")
    frame.wait_for_function(
        "() => document.querySelectorAll('#history li').length === 2"
        " || document.querySelector('#status').classList.contains('error')",
        polling=POLL_MS,
    )
    return frame


def test_download_for_offline_use_then_chat_with_the_network_off(
    browser: Any, host: FlakyHost, test_dist_dir: Path
) -> None:
    model = (test_dist_dir / "models" / "tinychat" / "tiny-chat-q8_0.gguf").read_bytes()
    path = "/_dl/offline-tinychat.gguf"
    url = host.url + path.lstrip("/")
    # Cut once, then refused while the first try retries: the try fails
    # with part of the file kept.
    # (download.js retries 4 times after a cut that made progress.)
    host.files[path] = HostedFile(body=model, cuts=1, cut_at=len(model) // 3, refuse=4)
    context = browser.new_context()
    context.set_default_timeout(STEP_TIMEOUT_MS)
    try:
        page = boot_shell(context, host)
        add_wasm_connection(page, "Later model", url)
        entry = page.locator("li.connection", has_text="Later model")
        entry.locator("button.offline").click()
        page.locator(
            "#notice-list .notice.error", has_text="could not be downloaded for offline use"
        ).wait_for()
        # The Storage panel lists the partial download.
        partial = page.locator(
            "#storage-models li.storage-partial", has_text="offline-tinychat.gguf"
        )
        partial.wait_for()
        assert "partly downloaded" in (partial.text_content() or "")
        received = int(partial.get_attribute("data-bytes") or 0)
        assert 0 < received <= len(model) // 3

        # The next try continues where it stopped.
        entry.locator("button.offline").click()
        entry.locator(".offline-control[data-stored='true']").wait_for()
        last = host.requests(path)[-1]
        assert last["status"] == 206 and last["range"] == f"bytes={received}-"
        assert page.evaluate(
            "(u) => caches.open('napllm-models').then((c) => c.match(u))"
            ".then((r) => r.arrayBuffer()).then((b) => b.byteLength)",
            url,
        ) == len(model)
        # The manager: the file, its size, who uses it, when it was last used.
        row = page.locator("#storage-models li.storage-model", has_text="offline-tinychat.gguf")
        row.wait_for()
        partial.wait_for(state="detached")
        assert row.get_attribute("data-bytes") == str(len(model))
        assert "Used by Later model" in (row.locator(".storage-users").text_content() or "")
        assert "Last used" in (row.locator(".storage-used").text_content() or "")

        context.set_offline(True)
        frame = chat_hello(page, "Later model")
        assert frame.text_content("#status") == "Done."
        assert HELLO_ANSWER in (frame.text_content("#history li.assistant") or "")
        context.set_offline(False)

        # Removing the connection offers to delete its file, which frees the space.
        usage = "() => navigator.storage.estimate().then((e) => e.usage)"
        before = page.evaluate(usage)
        entry.locator("button.remove").click()
        offer = entry.locator("input.remove-files")
        offer.wait_for()
        assert offer.is_checked()
        assert "1.2 MB" in (entry.locator("label.remove-files-label").text_content() or "")
        entry.locator("button.confirm-remove").click()
        row.wait_for(state="detached")
        assert (
            page.evaluate(
                "(u) => caches.open('napllm-models').then((c) => c.match(u)).then((r) => !!r)", url
            )
            is False
        )
        page.wait_for_function(
            f"() => navigator.storage.estimate().then((e) => e.usage <= {before - len(model) // 2})"
        )
    finally:
        context.close()


def test_a_wasm_load_that_failed_on_a_cut_resumes_at_the_next_try(
    browser: Any, host: FlakyHost, test_dist_dir: Path
) -> None:
    model = (test_dist_dir / "models" / "tinychat" / "tiny-chat-q8_0.gguf").read_bytes()
    path = "/_dl/retry-tinychat.gguf"
    # Cut, then refused until download.js's retries are spent: the load fails.
    host.files[path] = HostedFile(body=model, cuts=1, cut_at=len(model) // 2, refuse=4)
    context = browser.new_context()
    context.set_default_timeout(STEP_TIMEOUT_MS)
    try:
        page = boot_shell(context, host)
        add_wasm_connection(page, "Retry host", host.url + path.lstrip("/"))
        frame = chat_hello(page, "Retry host")
        assert "error" in (frame.get_attribute("#status", "class") or "")
        received = host.requests(path)[0]["sent"]
        # The user tries again (the engine's retry after a failed load is `fresh`).
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
        last = host.requests(path)[-1]
        assert last["status"] == 206 and last["range"] == f"bytes={received}-"
        assert page.evaluate(PARTS) == 0
    finally:
        context.close()


def add_connection(page: Any, name: str, kind: str, model: str) -> None:
    page.click("#connection-add")
    page.select_option("#connection-kind", kind)
    page.fill("#connection-name", name)
    page.fill("#connection-model", model)
    page.click("#connection-save")
    page.wait_for_selector("#connection-form", state="hidden")


def download_entry_for_offline_use(page: Any, name: str) -> None:
    """Click the entry's "Download for offline use" (inside the folded group
    of connections this device cannot run) and wait until it says stored."""
    page.eval_on_selector_all(
        "li.unavailable-group > details", "ds => ds.forEach((d) => { d.open = true; })"
    )
    entry = page.locator("li.connection", has_text=name)
    entry.locator("button.offline").click()
    entry.locator(".offline-control[data-stored='true']").wait_for(state="attached")


def remove_connection(page: Any, name: str) -> None:
    """Remove the connection entry `name`, accepting whatever the question offers."""
    page.eval_on_selector_all(
        "li.unavailable-group > details", "ds => ds.forEach((d) => { d.open = true; })"
    )
    entry = page.locator("li.connection", has_text=name)
    entry.locator("button.remove").click()
    # (the answer waits for the offer, if any, which is checked by default)
    entry.locator("button.confirm-remove").click()
    entry.wait_for(state="detached")


#: Loads an ONNX model folder (`base` + tinychat-onnx) on the wasm device
#: through the shell's engine host, then answers "Hello!" greedily (fp32:
#: the dtype WebGPU would pick for it; wasm's default is q8).
ONNX_HELLO = """async (base) => {
  const api = await @HOST@;
  const source = {kind: "path", base, model: "tinychat-onnx"};
  const fields = {source, device: "wasm", dtype: "fp32"};
  const loaded = JSON.parse(await api.ensureModel("later", JSON.stringify(fields), "c", "Later"));
  if (!loaded.ok) return {loaded};
  const body = {messages: [{role: "user", content: "Hello!"}], temperature: 0, max_tokens: 16};
  const id = api.startChat("later", JSON.stringify(body));
  let text = "";
  for (;;) {
    const batch = JSON.parse(await api.nextChunks(id));
    for (const chunk of batch.chunks) {
      for (const choice of chunk.choices) text += choice.delta.content || "";
    }
    if (batch.done) return {loaded, text, error: batch.error};
  }
}""".replace("@HOST@", engine_host_js("onnx"))
#: Whether WebLLM itself finds TinyChat's weights in its cache, and the
#: keys of its config and model library caches.
WEBLLM_CACHED = """async (id) => {
  const lib = await import("./vendor/web-llm/web-llm.js");
  const catalog = await (await fetch("./vendor/web-llm/catalog.json")).json();
  const found = catalog.bundled.find((r) => r.model_id === id);
  const record = {...found, model: new URL(found.model, location.href).href,
    model_lib: new URL(found.model_lib, location.href).href};
  const keys = async (name) => (await (await caches.open(name)).keys()).map((r) => r.url);
  return {cached: await lib.hasModelInCache(id, {model_list: [record]}),
    config: await keys("webllm/config"), wasm: await keys("webllm/wasm"), lib: record.model_lib,
    folder: record.model};
}"""


def test_download_for_offline_use_of_onnx_and_webllm_connections(
    browser: Any, host: FlakyHost, test_dist_dir: Path
) -> None:
    # The ONNX model folder on a host of its own, as a user adds it; WebLLM's
    # TinyChat by its id. This browser has no WebGPU: nothing is loaded.
    models = FlakyHost(test_dist_dir, cors=True)
    onnx_base = models.url + "models/"
    context = browser.new_context()
    context.set_default_timeout(STEP_TIMEOUT_MS)
    try:
        page = boot_shell(context, host)
        add_connection(page, "Later ONNX", "onnx", onnx_base + "tinychat-onnx")
        add_connection(page, "Later WebLLM", "webllm", "TinyChat-q0f32-MLC")
        download_entry_for_offline_use(page, "Later ONNX")
        # What transformers.js listed for it, kept where the library looks.
        kept = page.evaluate(
            "() => caches.open('transformers-cache').then((c) => c.keys())"
            ".then((k) => k.map((r) => r.url).sort())"
        )
        assert kept == [
            onnx_base + "tinychat-onnx/" + name
            for name in (
                "config.json",
                "generation_config.json",
                "onnx/model.onnx",
                "tokenizer.json",
                "tokenizer_config.json",
            )
        ]
        download_entry_for_offline_use(page, "Later WebLLM")
        webllm = page.evaluate(WEBLLM_CACHED, "TinyChat-q0f32-MLC")
        assert webllm["cached"] is True, webllm
        assert webllm["config"] == [webllm["folder"] + "mlc-chat-config.json"]
        assert webllm["wasm"] == [webllm["lib"]]

        # The manager: each model's files in an engine's cache as one entry,
        # with their size and the connection that uses them.
        rows = page.locator("#storage-models li.storage-model")
        onnx_row = rows.filter(has_text="tinychat-onnx (transformers.js)")
        webllm_row = rows.filter(has_text="tinychat-webllm (WebLLM)")
        webllm_row.wait_for()
        assert "Used by Later ONNX" in (onnx_row.locator(".storage-users").text_content() or "")
        # (the built-in TinyChat WebLLM connection reads the same model's files)
        webllm_users = webllm_row.locator(".storage-users").text_content() or ""
        assert webllm_users.startswith("Used by") and "Later WebLLM" in webllm_users
        assert int(onnx_row.get_attribute("data-bytes") or 0) > 1_000_000

        # The network off: the ONNX engine loads from the caches and answers.
        context.set_offline(True)
        models.stop()
        answer = page.evaluate(ONNX_HELLO, onnx_base)
        assert answer["loaded"]["ok"] is True, answer
        assert answer["error"] is None and answer["text"] == HELLO_ANSWER

        # Another connection of each model, never downloaded, reads the same
        # files: removing the one that downloaded them keeps them (the offer
        # to delete them, checked by default, counted only downloads).
        add_connection(page, "Twin ONNX", "onnx", onnx_base + "tinychat-onnx")
        add_connection(page, "Twin WebLLM", "webllm", "TinyChat-q0f32-MLC")
        onnx_row.locator(".storage-users", has_text="Twin ONNX").wait_for()
        webllm_row.locator(".storage-users", has_text="Twin WebLLM").wait_for()
        for name in ("Later ONNX", "Later WebLLM"):
            remove_connection(page, name)
        assert page.evaluate(WEBLLM_CACHED, "TinyChat-q0f32-MLC")["cached"] is True
        onnx_kept = "() => caches.open('transformers-cache').then((c) => c.keys())"
        assert len(page.evaluate(onnx_kept)) == 5
        assert "Twin WebLLM" in (webllm_row.locator(".storage-users").text_content() or "")

        # Delete frees every file of the entry.
        webllm_row.locator("button.delete").click()
        webllm_row.wait_for(state="detached")
        assert (
            page.evaluate(
                "() => caches.open('webllm/model').then((c) => c.keys()).then((k) => k.length)"
            )
            == 0
        )
    finally:
        context.close()
        models.stop()
