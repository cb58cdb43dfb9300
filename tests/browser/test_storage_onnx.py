"""ONNX model files are cached only once checked; a failed load is forgotten.

The onnx engine (its host, web/engines/engine-host.js) is called directly from
a test page, the way the Python port calls it, on the wasm device (no GPU
needed). The model is the committed TinyChat ONNX export, served by a model
host of the test's own on another 127.0.0.1 port (so transformers.js keeps
its files in its Cache Storage), whose answers the test switches: a
download cut off midway, then a fallback page (``200 text/html``) that the
HTTP cache may keep for an hour, then the real files. The last test does
the same for a GGUF file and the wasm engine.

Downloads are bounded: a host that streams a model without a length, or
sends a compressed body that decodes past what it declared on the wire, is
cut off at the ceiling of the file's kind (the test build's small ceilings,
tests/hooks/engine-limits.js) and the load fails as a download failure.
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import http.server
import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from napllm.devtools.engines import engine_host_js

pytestmark = [pytest.mark.browser]

ROOT = Path(__file__).resolve().parents[2]
ONNX = ROOT / "models" / "tinychat" / "onnx"
FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "onnx/model.onnx",
)
FALLBACK_PAGE = b"<!doctype html><title>models</title>\n\n"
MiB = 1024 * 1024
#: The test build's ceilings (tests/hooks/engine-limits.js).
TEST_GGUF_CEILING = 8 * MiB
TEST_ONNX_WEIGHTS_CEILING = 16 * MiB
#: What an endless answer sends at most (the test's own safety stop).
ENDLESS_CAP = 256 * MiB
STEP_TIMEOUT_MS = 120_000

ENGINE_PAGE = """<!doctype html><meta charset="utf-8"><title>onnx engine</title>
<script type="module">
const api = await @HOST@;
const fields = (base) => ({source: {kind: "path", base, model: "tinychat-onnx"}, device: "wasm"});
window.load = async (base) => JSON.parse(await api.ensureModel(
  "tiny", JSON.stringify({...fields(base), dtype: "fp32"}), "c", "T"));
window.ready = true;
</script>
""".replace("@HOST@", engine_host_js("onnx", "../"))

#: Every cached request under `prefix`, in every Cache Storage cache of the
#: origin (the library's and napllm's): [cache name, URL, body size].
CACHED_UNDER = """async (prefix) => {
  const found = [];
  for (const name of await caches.keys()) {
    const cache = await caches.open(name);
    for (const request of await cache.keys()) {
      if (!request.url.startsWith(prefix)) continue;
      const body = await (await cache.match(request)).arrayBuffer();
      found.push([name, request.url, body.byteLength]);
    }
  }
  return found.sort();
}"""
#: Names at the top of the origin's private file system (OPFS).
OPFS_NAMES = """async () => {
  const names = [];
  for await (const name of (await navigator.storage.getDirectory()).keys()) names.push(name);
  return names;
}"""


class ModelHost:
    """A CORS model host over `folder`; the test switches what some paths answer.

    `fallback`: paths answered ``200 text/html`` with a fallback page that
    the HTTP cache may keep for an hour; `cut`: paths whose body stops
    halfway (the declared length is the whole file's); `endless`: paths
    answered with the file and then zeros without end and without a length
    (until the client goes or `ENDLESS_CAP`; `sent` counts the bytes);
    `bomb`: paths answered gzip-compressed with their compressed length, the
    file followed by zeros up to `ENDLESS_CAP` once decoded.
    """

    def __init__(self, folder: Path) -> None:
        self.fallback: set[str] = set()
        self.cut: set[str] = set()
        self.endless: set[str] = set()
        self.bomb: set[str] = set()
        self.sent: dict[str, int] = {}
        self.ended = threading.Event()  # an endless answer stopped (client gone or cap)
        self.requests: list[str] = []
        host = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def end_headers(self) -> None:
                self.send_header("Access-Control-Allow-Origin", "*")
                self.send_header("Cross-Origin-Resource-Policy", "cross-origin")
                super().end_headers()

            def do_GET(self) -> None:
                host.requests.append(self.path)
                if self.path in host.fallback:
                    self.send_response(200)
                    self.send_header("Content-Type", "text/html")
                    self.send_header("Content-Length", str(len(FALLBACK_PAGE)))
                    self.send_header("Cache-Control", "max-age=3600")
                    self.end_headers()
                    self.wfile.write(FALLBACK_PAGE)
                    return
                if self.path in host.endless:
                    data = Path(self.translate_path(self.path)).read_bytes()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/octet-stream")
                    self.send_header("Connection", "close")
                    self.end_headers()
                    self.close_connection = True
                    sent = 0
                    chunk = bytes(256 * 1024)
                    try:
                        self.wfile.write(data)
                        sent = len(data)
                        while sent < ENDLESS_CAP:
                            self.wfile.write(chunk)
                            sent += len(chunk)
                            host.sent[self.path] = sent
                    except OSError:
                        pass  # the client stopped reading and closed
                    host.sent[self.path] = sent
                    host.ended.set()
                    return
                if self.path in host.bomb:
                    data = Path(self.translate_path(self.path)).read_bytes()
                    packed = gzip.compress(data + bytes(ENDLESS_CAP - len(data)), 1)
                    self.send_response(200)
                    self.send_header("Content-Type", "application/octet-stream")
                    self.send_header("Content-Encoding", "gzip")
                    self.send_header("Content-Length", str(len(packed)))
                    self.end_headers()
                    with contextlib.suppress(OSError):  # the client may stop reading
                        self.wfile.write(packed)
                    return
                if self.path in host.cut:
                    data = Path(self.translate_path(self.path)).read_bytes()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/octet-stream")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data[: len(data) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                super().do_GET()

        self.httpd = http.server.ThreadingHTTPServer(
            ("127.0.0.1", 0), functools.partial(Handler, directory=str(folder))
        )
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/"

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def model_host(tmp_path: Path) -> Iterator[ModelHost]:
    folder = tmp_path / "host" / "tinychat-onnx"
    for name in FILES:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ONNX / name, folder / name)
    host = ModelHost(tmp_path / "host")
    try:
        yield host
    finally:
        host.stop()


def test_bad_onnx_downloads_are_never_cached_and_the_fixed_host_loads(
    browser: Any, test_page: Callable[[str, str], str], model_host: ModelHost
) -> None:
    prefix = model_host.url + "tinychat-onnx/"
    context = browser.new_context()
    context.set_default_timeout(STEP_TIMEOUT_MS)
    try:
        page = context.new_page()
        page.goto(test_page("onnx-storage.html", ENGINE_PAGE))
        page.wait_for_function("window.ready === true")

        # 1. The weights are cut off midway: the load fails, and the files
        # that did arrive whole before it are not kept either.
        model_host.cut.add("/tinychat-onnx/onnx/model.onnx")
        assert page.evaluate("(b) => window.load(b)", model_host.url) == {
            "ok": False,
            "kind": "download",
        }
        assert page.evaluate(CACHED_UNDER, prefix) == []

        # 2. The host answers its fallback page for the config (kept by the
        # HTTP cache for an hour): no cache keeps it as the config.
        model_host.cut.clear()
        model_host.fallback.add("/tinychat-onnx/config.json")
        result = page.evaluate("(b) => window.load(b)", model_host.url)
        assert result["ok"] is False
        assert page.evaluate(CACHED_UNDER, prefix) == []
        assert "/tinychat-onnx/config.json" in model_host.requests

        # 3. The host is fixed: the next load asks it again (past the HTTP
        # cache), loads, and keeps exactly the real files.
        model_host.fallback.clear()
        model_host.requests.clear()
        assert page.evaluate("(b) => window.load(b)", model_host.url) == {
            "ok": True,
            "device": "wasm",
            "contextSize": 512,
        }
        assert "/tinychat-onnx/config.json" in model_host.requests
        cached = page.evaluate(CACHED_UNDER, prefix)
        assert all(name == "transformers-cache" for name, _, _ in cached)
        sizes = {url[len(prefix) :]: size for _, url, size in cached}
        assert "onnx/model.onnx" in sizes and "config.json" in sizes
        for name, size in sizes.items():
            assert size == (ONNX / name).stat().st_size, name
        # The engine keeps nothing in the private file system.
        assert page.evaluate(OPFS_NAMES) == []
    finally:
        context.close()


WASM_PAGE = """<!doctype html><meta charset="utf-8"><title>wasm engine</title>
<script type="module">
const api = await @HOST@;
const params = {n_ctx: 512, n_threads: 1, n_gpu_layers: 0};
window.load = async (url) =>
  JSON.parse(await api.ensureModel("m", JSON.stringify({url, params}), "c", "M"));
window.ready = true;
</script>
""".replace("@HOST@", engine_host_js("wasm", "../"))
#: wllama's own (OPFS) cache: the original URL of every file in it.
WLLAMA_FILES = """async () => {
  const { CacheManager } = await import('../vendor/wllama/wllama.js');
  return (await new CacheManager().list()).map((f) => f.metadata.originalURL);
}"""


def test_a_gguf_fallback_page_kept_by_the_http_cache_is_not_loaded_again(
    browser: Any, test_page: Callable[[str, str], str], model_host: ModelHost, tmp_path: Path
) -> None:
    # The wasm engine, no service worker: only the HTTP cache could keep the
    # host's fallback page (it says it may, for an hour).
    shutil.copyfile(
        ROOT / "models" / "tinychat" / "tiny-chat-q8_0.gguf", tmp_path / "host" / "m.gguf"
    )
    context = browser.new_context()
    context.set_default_timeout(STEP_TIMEOUT_MS)
    try:
        page = context.new_page()
        page.goto(test_page("wasm-storage.html", WASM_PAGE))
        page.wait_for_function("window.ready === true")
        model_host.fallback.add("/m.gguf")
        assert page.evaluate("(u) => window.load(u)", model_host.url + "m.gguf") == {
            "ok": False,
            "kind": "download",
        }
        assert page.evaluate(CACHED_UNDER, model_host.url) == []
        assert page.evaluate(WLLAMA_FILES) == []

        model_host.fallback.clear()
        model_host.requests.clear()
        loaded = page.evaluate("(u) => window.load(u)", model_host.url + "m.gguf")
        assert loaded["ok"] is True and loaded["nVocab"] > 0
        assert model_host.requests == ["/m.gguf"]
        assert page.evaluate(WLLAMA_FILES) == []
    finally:
        context.close()


def test_a_gguf_host_streaming_without_end_is_cut_off_at_the_ceiling(
    browser: Any, test_page: Callable[[str, str], str], model_host: ModelHost, tmp_path: Path
) -> None:
    # The model's bytes come first, so every check but the size passes.
    shutil.copyfile(
        ROOT / "models" / "tinychat" / "tiny-chat-q8_0.gguf", tmp_path / "host" / "m.gguf"
    )
    model_host.endless.add("/m.gguf")
    context = browser.new_context()
    context.set_default_timeout(STEP_TIMEOUT_MS)
    try:
        page = context.new_page()
        page.goto(test_page("wasm-limits.html", WASM_PAGE))
        page.wait_for_function("window.ready === true")
        assert page.evaluate("(u) => window.load(u)", model_host.url + "m.gguf") == {
            "ok": False,
            "kind": "download",
        }
        # The download was cancelled soon after the ceiling, not read to the end.
        assert model_host.ended.wait(60)
        assert TEST_GGUF_CEILING < model_host.sent["/m.gguf"] < ENDLESS_CAP // 4
        assert page.evaluate(CACHED_UNDER, model_host.url) == []
        assert page.evaluate(WLLAMA_FILES) == []
    finally:
        context.close()


def test_onnx_weights_decoding_past_their_declared_length_are_refused(
    browser: Any, test_page: Callable[[str, str], str], model_host: ModelHost
) -> None:
    prefix = model_host.url + "tinychat-onnx/"
    # A few hundred KiB on the wire, as declared; far more once decoded.
    model_host.bomb.add("/tinychat-onnx/onnx/model.onnx")
    context = browser.new_context()
    context.set_default_timeout(STEP_TIMEOUT_MS)
    try:
        page = context.new_page()
        page.goto(test_page("onnx-limits.html", ENGINE_PAGE))
        page.wait_for_function("window.ready === true")
        assert page.evaluate("(b) => window.load(b)", model_host.url) == {
            "ok": False,
            "kind": "download",
        }
        assert page.evaluate(CACHED_UNDER, prefix) == []
        # The host is fixed: the next load gets the real weights.
        model_host.bomb.clear()
        assert page.evaluate("(b) => window.load(b)", model_host.url)["ok"] is True
    finally:
        context.close()
