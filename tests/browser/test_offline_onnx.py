"""The onnx engine works offline once it has been used.

The transformers.js bundle, onnxruntime's wasm and the bundled TinyChat ONNX
model are not precached (a first visit should not download 30 MB for an
engine it may never use); the service worker keeps them once fetched, in
the build's own cache. Chromium runs with a persistent profile against the
product dist/ on a server the test stops; the shell page calls
the onnx engine host (web/engines/engine-host.js) directly, on the wasm device, the way the
Python port does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_offline import Server, persistent  # noqa: F401 (persistent is a fixture)

from napllm.devtools.engines import engine_host_js

pytestmark = pytest.mark.browser

BOOT_TIMEOUT_MS = 120_000

#: Loads TinyChat (ONNX) on the wasm device through the shell's own engine
#: module; resolves with the engine's answer.
LOAD = """async () => {
  const api = await @HOST@;
  const source = {kind: "path", base: "./models/", model: "tinychat-onnx"};
  const fields = JSON.stringify({source, device: "wasm", dtype: "fp32"});
  return JSON.parse(await api.ensureModel("tiny", fields, "c", "TinyChat"));
}""".replace("@HOST@", engine_host_js("onnx"))
#: A greedy answer to "Hello!" from the loaded model: {text, error}.
HELLO = """async () => {
  const api = await @HOST@;
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
}""".replace("@HOST@", engine_host_js("onnx"))
LOADED = {"ok": True, "device": "wasm", "contextSize": 512}


def test_the_onnx_engine_loads_and_answers_offline_after_one_use(
    persistent: Any,  # noqa: F811 (the fixture imported from test_offline)
    dist_dir: Path,
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
