"""A failed WebLLM load removes the model's files from every WebLLM cache.

WebLLM itself cannot load here (no model library, no model host), so the
test build's engine double (tests/hooks/web-llm.js) fails the load the way
WebLLM does, while the eviction that follows is the shell's own code
(web/engines/webllm-engine.js) on real Cache Storage. The caches are filled
the way WebLLM fills them, for one prebuilt model: a fallback page kept as
its `tensor-cache.json` (which WebLLM's own deletion reads first, and
stops on), a weights shard, its chat config and its model library; plus
files of another model that must stay.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from napllm.devtools.engines import engine_host_js

pytestmark = [pytest.mark.browser]

MODEL = "SmolLM2-360M-Instruct-q4f32_1-MLC"
OTHER = "Qwen2.5-0.5B-Instruct-q4f32_1-MLC"
STEP_TIMEOUT_MS = 60_000

PAGE = """<!doctype html><meta charset="utf-8"><title>webllm eviction</title>
<script type="module">
const engines = await import("../engines/webllm-engine.js");
const host = await @HOST@;
const lib = await import("../vendor/web-llm/web-llm.js");
const record = (id) => lib.prebuiltAppConfig.model_list.find((r) => r.model_id === id);
const folder = (id) => {
  let url = record(id).model;
  if (!url.endsWith("/")) url += "/";
  if (!/.+\\/resolve\\/.+\\//.test(url)) url += "resolve/main/";
  return url;
};
const page = (text, type) => new Response(text, {headers: {"content-type": type}});
const html = "<!doctype html><title>x</title>";
const binary = "application/octet-stream";
/** Fill WebLLM's caches with the files of model `id`; the list of [cache, url]. */
window.seed = async (id) => {
  const files = [
    ["webllm/model", folder(id) + "tensor-cache.json", page(html, "text/html")],
    ["webllm/model", folder(id) + "params_shard_0.bin", page("weights", binary)],
    ["webllm/model", folder(id) + "tokenizer.json", page("{}", "application/json")],
    ["webllm/config", folder(id) + "mlc-chat-config.json", page("{}", "application/json")],
    ["webllm/wasm", record(id).model_lib, page("wasm", "application/wasm")],
  ];
  for (const [name, url, response] of files) await (await caches.open(name)).put(url, response);
  return files.map(([name, url]) => [name, url]);
};
window.cached = async () => {
  const out = [];
  for (const name of await caches.keys()) {
    for (const request of await (await caches.open(name)).keys()) out.push([name, request.url]);
  }
  return out.sort();
};
/** Load `id` with an engine factory that fails like WebLLM with `error`. */
window.failLoad = async (id, error) => {
  engines.setEngineFactoryForTests(async () => { throw error(); });
  try {
    return JSON.parse(await host.ensureModel(id, "{}", "c", "WebLLM model"));
  } finally {
    engines.setEngineFactoryForTests(null);
  }
};
window.ready = true;
</script>
""".replace("@HOST@", engine_host_js("webllm", "../"))

NETWORK_ERROR = "() => new TypeError('Failed to fetch')"
NO_WEBGPU = (
    "() => Object.assign(new Error('This device has no compatible GPU.'),"
    " {name: 'WebGPUNotAvailableError'})"
)


def test_a_failed_webllm_load_evicts_the_model_from_every_webllm_cache(
    browser: Any, test_page: Callable[[str, str], str]
) -> None:
    context = browser.new_context()
    context.set_default_timeout(STEP_TIMEOUT_MS)
    try:
        page = context.new_page()
        page.goto(test_page("webllm-eviction.html", PAGE))
        page.wait_for_function("window.ready === true")
        model_files = page.evaluate("(id) => window.seed(id)", MODEL)
        other_files = page.evaluate("(id) => window.seed(id)", OTHER)
        assert len(model_files) == 5

        # A device without WebGPU: the download was not the problem, nothing goes.
        result = page.evaluate(f"(id) => window.failLoad(id, {NO_WEBGPU})", MODEL)
        assert result == {"ok": False, "kind": "webgpu"}
        assert page.evaluate("window.cached()") == sorted(model_files + other_files)

        # A failed download: every file of that model goes, the other model's stay.
        result = page.evaluate(f"(id) => window.failLoad(id, {NETWORK_ERROR})", MODEL)
        assert result == {"ok": False, "kind": "network"}
        assert page.evaluate("window.cached()") == sorted(other_files)
    finally:
        context.close()
