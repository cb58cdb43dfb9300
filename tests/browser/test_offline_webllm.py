"""TinyChat on WebLLM works offline once it has been used.

Its files (dist/models/tinychat-webllm/) are not precached; the service
worker keeps them once fetched (the parameter shard verified like model
weights) and WebLLM keeps them in its own caches. Chromium runs with
``--enable-unsafe-webgpu`` (SwiftShader) and a persistent profile against the
product dist/ on a server the test stops; the shell page calls
web/engines/webllm-engine.js directly, the way the Python port does.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_offline import Server

from conftest import RETURNING_VISITOR_SCRIPT, WEBGPU_ARGS
from napllm.devtools.engines import engine_host_js

pytestmark = [pytest.mark.browser, pytest.mark.webgpu]

BOOT_TIMEOUT_MS = 180_000
STEP_TIMEOUT_MS = 150_000
MODEL = "TinyChat-q0f32-MLC"

LOAD = """async (model) => {
  const api = await @HOST@;
  return JSON.parse(await api.ensureModel(model, "{}", "offline-test", "TinyChat"));
}""".replace("@HOST@", engine_host_js("webllm"))
#: A greedy answer to "Hello!": {text, error}.
HELLO = """async (model) => {
  const api = await @HOST@;
  const body = {messages: [{role: "user", content: "Hello!"}], temperature: 0, max_tokens: 16,
    stream: true};
  const id = api.startChat(model, JSON.stringify(body));
  let text = "";
  for (;;) {
    const batch = JSON.parse(await api.nextChunks(id));
    for (const chunk of batch.chunks) {
      for (const choice of chunk.choices) text += choice.delta.content || "";
    }
    if (batch.done) return {text, error: batch.error};
  }
}""".replace("@HOST@", engine_host_js("webllm"))


@pytest.fixture
def webgpu_persistent(
    browser_type: Any, browser_type_launch_args: dict[str, Any], tmp_path: Path
) -> Iterator[Any]:
    """A WebGPU Chromium context with a profile folder of its own (kept across reloads)."""
    context = browser_type.launch_persistent_context(
        str(tmp_path / "profile"),
        executable_path=browser_type_launch_args["executable_path"],
        args=[*browser_type_launch_args["args"], *WEBGPU_ARGS],
    )
    context.add_init_script(RETURNING_VISITOR_SCRIPT)
    context.set_default_timeout(STEP_TIMEOUT_MS)
    try:
        yield context
    finally:
        context.close()


def test_webllm_tinychat_loads_and_answers_offline_after_one_use(
    webgpu_persistent: Any, dist_dir: Path
) -> None:
    server = Server(dist_dir)
    try:
        page = webgpu_persistent.new_page()
        page.goto(server.url + "index.html")
        page.wait_for_function(
            "() => document.body.dataset.offline === 'ready'"
            " && !!navigator.serviceWorker.controller",
            timeout=BOOT_TIMEOUT_MS,
        )
        assert page.evaluate(LOAD, MODEL) == {"ok": True}
        answer = page.evaluate(HELLO, MODEL)
        assert answer == {"text": "Hello! How can I help you today?", "error": None}
    finally:
        server.stop()
    webgpu_persistent.set_offline(True)

    failed: list[str] = []
    webgpu_persistent.on("requestfailed", lambda r: failed.append(f"{r.url}: {r.failure}"))
    page.reload()
    page.wait_for_function(
        "() => ['ready', 'failed'].includes(document.body.dataset.boot)", timeout=BOOT_TIMEOUT_MS
    )
    assert page.evaluate(LOAD, MODEL) == {"ok": True}
    assert page.evaluate(HELLO, MODEL) == answer
    assert not failed, f"requests failed offline: {failed}"
