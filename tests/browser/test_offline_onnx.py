"""The onnx engine works offline once it has been used.

The transformers.js bundle, onnxruntime's wasm and the bundled TinyChat ONNX
model are not precached (a first visit should not download 30 MB for an
engine it may never use); the service worker keeps them once fetched, in
the build's own cache. Chromium runs with a persistent profile against the
product dist/ on a server the test stops; the shell page calls
web/engines/transformers-engine.js directly, on the wasm device, the way the
Python port does.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.browser

BOOT_TIMEOUT_MS = 120_000
STEP_TIMEOUT_MS = 120_000

#: Loads TinyChat (ONNX) on the wasm device through the shell's own engine
#: module; resolves with the engine's answer.
LOAD = """async () => {
  const api = await import("./engines/transformers-engine.js");
  const source = JSON.stringify({kind: "path", base: "./models/", model: "tinychat-onnx"});
  return JSON.parse(await api.ensureModel("tiny", source, "wasm", "fp32", "c", "TinyChat"));
}"""
#: A greedy answer to "Hello!" from the loaded model: {text, error}.
HELLO = """async () => {
  const api = await import("./engines/transformers-engine.js");
  const body = {messages: [{role: "user", content: "Hello!"}], temperature: 0, max_tokens: 16};
  const id = api.startChat("tiny", JSON.stringify(body));
  let text = "";
  for (;;) {
    const batch = JSON.parse(await api.nextChunks(id));
    for (const chunk of batch.chunks) {
      for (const choice of chunk.choices) text += choice.delta.content || "";
    }
    if (batch.done) return {text, error: batch.error};
  }
}"""
LOADED = {"ok": True, "device": "wasm", "contextSize": 512}


class Server:
    """build.py's server for dist/, stoppable by the test."""

    def __init__(self, directory: Path) -> None:
        build_module = sys.modules["napllm_build"]  # loaded by tests/browser/conftest.py
        self.httpd = build_module.make_server(directory, quiet=True)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
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
    context.set_default_timeout(STEP_TIMEOUT_MS)
    try:
        yield context
    finally:
        context.close()


def test_the_onnx_engine_loads_and_answers_offline_after_one_use(
    persistent: Any, dist_dir: Path
) -> None:
    server = Server(dist_dir)
    try:
        page = persistent.new_page()
        page.goto(server.url + "index.html")
        page.wait_for_function(
            "() => document.body.dataset.offline === 'ready'"
            " && !!navigator.serviceWorker.controller",
            timeout=BOOT_TIMEOUT_MS,
        )
        assert page.evaluate(LOAD) == LOADED
        answer = page.evaluate(HELLO)
        assert answer["error"] is None and answer["text"]
    finally:
        server.stop()
    persistent.set_offline(True)

    failed: list[str] = []
    persistent.on("requestfailed", lambda r: failed.append(f"{r.url}: {r.failure}"))
    page.reload()
    page.wait_for_function(
        "() => ['ready', 'failed'].includes(document.body.dataset.boot)", timeout=BOOT_TIMEOUT_MS
    )
    assert page.evaluate(LOAD) == LOADED
    assert page.evaluate(HELLO) == answer
    assert not failed, f"requests failed offline: {failed}"
