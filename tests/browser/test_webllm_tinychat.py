"""Real WebLLM generations: TinyChat compiled for WebLLM, on Chromium's software adapter.

Chromium runs with ``--enable-unsafe-webgpu`` (the ``webgpu_browser`` of
conftest.py); with no GPU its adapter is SwiftShader. Nothing is a
stand-in: the shell (test mode, so ``engineDelayMs`` can slow the delivery
of chunks) boots Pyodide, the user picks the built-in "TinyChat (WebGPU,
WebLLM)" connection, and @mlc-ai/web-llm 0.2.86, unmodified, loads the
committed model (models/tinychat/webllm/: weights, config, tokenizer and
the WebGPU model library) from dist/ and runs it.

- The connection is listed with its route and capabilities (JSON yes, tools
  no); a tool request is answered `unsupported` before any consent.
- Streamed deltas, `finish: "stop"` and `"length"`, usage.
- Greedy answers for the committed prompts (one user message each) equal
  llama.cpp's greedy answers on the GGUF: text and token count (WebLLM
  counts the stop token too).
- `format: "json"`: WebLLM's grammar with the runtime's schema.
- Cancel mid-stream, then the next generation on the same engine.
- A model swap between two WebLLM connections, and a load failure (a model
  whose config does not match its record's integrity) mapped to a safe
  `provider-error`. The two extra records are added to the build-time
  catalogue by the test's network route (the service worker is blocked for
  that); they point at the same shipped files.

Load is about 13 s (WebLLM compiles its 84 shader modules), decoding about
4 tokens/s, so every test shares one page, prompts are short, and the long
counting answer is only started (to be cancelled).
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import pytest
from shellpage import linked_napplet_frame

from fixtures import user
from llama_isolated import greedy_tokens, run_llama
from napllm.devtools.engines import engine_host_js

pytestmark = [pytest.mark.browser, pytest.mark.webgpu]

ROOT = Path(__file__).resolve().parents[2]
TINYCHAT = ROOT / "models" / "tinychat"
SAMPLES = json.loads((TINYCHAT / "samples_torch.json").read_text())
#: Prompts with one user message and a short answer (the tool-result turn
#: needs a `tool` message, which a connection without tools cannot carry;
#: the counting answer is 200 tokens).
GREEDY_SAMPLES = [s for s in SAMPLES if len(s["messages"]) == 1 and len(s["out_ids"]) <= 64]
COUNT_SAMPLE = next(s for s in SAMPLES if len(s["out_ids"]) > 64)
CONNECTION = "builtin-tinychat-webllm"
NAME = "TinyChat (WebGPU, WebLLM)"
MODEL_ID = "TinyChat-q0f32-MLC"
SWAP_ID = "TinyChat-copy-q0f32-MLC"
POISONED_ID = "TinyChat-poisoned-q0f32-MLC"
EOS = 2
BOOT_TIMEOUT_MS = 180_000
STEP_TIMEOUT_MS = 150_000
POLL_MS = 20

DRIVER_NAPPLET = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Driver</title></head>
<body><h1>Driver napplet</h1>
<script>
window.runs = {};
window.selectModel = (requirements) => {
  window.selected = null;
  napplet.llm.select(requirements).then(
    (model) => { window.selected = {model}; },
    (error) => { window.selected = {error: {code: error.code, message: error.message}}; });
};
window.start = (name, request) => {
  const run = {deltas: [], result: null, error: null};
  window.runs[name] = run;
  const handle = napplet.llm.generate(
    {handle: window.selected.model.handle, ...request},
    {onDelta: (delta) => run.deltas.push(delta)});
  run.handle = handle;
  handle.then(
    (result) => { run.result = result; },
    (error) => { run.error = {code: error.code, message: error.message}; });
};
window.view = (name) => {
  const run = window.runs[name];
  return {deltas: run.deltas, result: run.result, error: run.error};
};
</script></body></html>
"""

WEATHER_TOOL = {
    "name": "get_weather",
    "description": "Get the current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def text_of(result: dict[str, Any]) -> str:
    return "".join(p["text"] for p in result["content"] if p["type"] == "text")


def streamed_text(deltas: list[dict[str, Any]]) -> str:
    return "".join(
        d.get("text", "") for d in deltas if d["block"] == "text" and d["event"] == "delta"
    )


@pytest.fixture(scope="module")
def llama_cpp_answers() -> list[tuple[str, int]]:
    """llama.cpp's greedy (text, token count) for `GREEDY_SAMPLES`, on the GGUF.

    Without llama-cpp-python, the committed references (which llama.cpp,
    wllama and PyTorch all reproduce, models/tinychat/README.md).
    """
    references = [(s["text"], len(s["out_ids"])) for s in GREEDY_SAMPLES]
    if importlib.util.find_spec("llama_cpp") is None:
        return references
    # In a worker process, like every llama.cpp run of the suite (tests/llama_isolated.py).
    greedy = run_llama(
        greedy_tokens,
        str(TINYCHAT / "tiny-chat-q8_0.gguf"),
        [sample["prompt_ids"] for sample in GREEDY_SAMPLES],
        64,
        EOS,
    )
    answers = [(text, len(tokens)) for tokens, text in greedy]
    assert answers == references
    return answers


class Shell:
    """The real shell (test mode) in the WebGPU browser with the driver napplet."""

    def __init__(self, page: Any, frame: Any) -> None:
        self.page = page
        self.frame = frame

    def choose(self, requirements: dict[str, Any], connection: str = CONNECTION) -> dict[str, Any]:
        self.frame.evaluate("(r) => window.selectModel(r)", requirements)
        self.page.click(f".chooser-dialog button.candidate[data-candidate-id='{connection}']")
        self.frame.wait_for_function("() => window.selected !== null", polling=POLL_MS)
        selected: dict[str, Any] = self.frame.evaluate("window.selected")
        assert "model" in selected, selected
        return selected["model"]  # type: ignore[no-any-return]

    def start(self, name: str, request: dict[str, Any], consent: bool = True) -> None:
        self.frame.evaluate("([n, r]) => window.start(n, r)", [name, request])
        if consent:
            self.page.click(".consent-dialog button.allow")

    def wait(self, name: str) -> dict[str, Any]:
        self.frame.wait_for_function(
            "(n) => window.runs[n].result !== null || window.runs[n].error !== null",
            arg=name,
            timeout=STEP_TIMEOUT_MS,
            polling=POLL_MS,
        )
        view: dict[str, Any] = self.frame.evaluate("(n) => window.view(n)", name)
        return view

    def generate(self, name: str, request: dict[str, Any]) -> dict[str, Any]:
        self.start(name, request)
        return self.wait(name)

    def add_webllm_connection(self, name: str, model: str) -> str:
        """The connections form's "WebLLM model by id"; returns the new connection's id."""
        page = self.page
        page.click("#connection-add")
        page.fill("#connection-name", name)
        page.select_option("#connection-kind", "webllm")
        page.fill("#connection-model", model)
        page.click("#connection-form button[type='submit']")
        page.wait_for_function(
            "(n) => [...document.querySelectorAll('#connection-list li.connection')]"
            ".some((li) => li.textContent.includes(n))",
            arg=name,
        )
        cid: str = page.eval_on_selector_all(
            "#connection-list li.connection",
            "(items, n) => items.find((li) => li.textContent.includes(n)).dataset.connectionId",
            name,
        )
        return cid


def extra_records(route: Any) -> None:
    """catalog.json plus a copy of the TinyChat record and one with a wrong config integrity."""
    response = route.fetch()
    catalog = response.json()
    [tinychat] = [r for r in catalog["bundled"] if r["model_id"] == MODEL_ID]
    copy = {**tinychat, "model_id": SWAP_ID}
    poisoned = {
        **tinychat,
        "model_id": POISONED_ID,
        "integrity": {**tinychat["integrity"], "config": "sha256-" + "A" * 43 + "="},
    }
    catalog["bundled"] = [*catalog["bundled"], copy, poisoned]
    route.fulfill(response=response, body=json.dumps(catalog))


@pytest.fixture(scope="module")
def shell(
    webgpu_browser: Any,
    base_url: str,
    test_pages_dir: Path,
    dist_url: str,
) -> Iterator[Shell]:
    """One shell page for the module (Pyodide and the model load once)."""
    (test_pages_dir / "webllm-driver.html").write_text(DRIVER_NAPPLET, encoding="utf-8")
    driver = f"{dist_url}_test/webllm-driver.html"
    # Service workers blocked, so the route below sees the catalogue request.
    context = webgpu_browser.new_context(base_url=base_url, service_workers="block")
    context.route("**/vendor/web-llm/catalog.json", extra_records)
    requests: list[str] = []
    context.on("request", lambda r: requests.append(r.url))
    page = context.new_page()
    page.set_default_timeout(STEP_TIMEOUT_MS)
    page.goto(f"{base_url}index.html?test=1&engineDelayMs=100&napplet={quote(driver, safe='')}")
    page.wait_for_function("document.body.dataset.boot === 'ready'", timeout=BOOT_TIMEOUT_MS)
    frame = linked_napplet_frame(page)
    frame.wait_for_function("() => typeof window.start === 'function'", polling=POLL_MS)
    try:
        yield Shell(page, frame)
    finally:
        context.close()
    outside = [u for u in requests if urlsplit(u).scheme in ("http", "https", "ws", "wss")]
    outside = [u for u in outside if urlsplit(u).hostname != "127.0.0.1"]
    assert not outside, outside


def test_the_connection_is_listed_with_json_and_without_tools(shell: Shell) -> None:
    items = shell.page.eval_on_selector_all(
        "#connection-list > li",
        "(items) => items.map((li) => ({id: li.dataset.connectionId, text: li.textContent}))",
    )
    assert items[0]["id"] == "builtin-tinychat"  # llama.cpp's TinyChat stays first
    mine = next(i for i in items if i["id"] == CONNECTION)
    assert NAME in mine["text"] and "Unavailable" not in mine["text"]
    model = shell.choose({"json": True})
    assert model["name"] == NAME
    assert model["route"] == "This browser (WebGPU, WebLLM) on this device"
    assert model["json"] is True and model["tools"] is False and model["images"] is False


def test_a_tool_request_is_unsupported_before_consent(shell: Shell) -> None:
    shell.choose({})
    shell.start(
        "tools",
        {"messages": [user("What is the weather in Paris?")], "tools": [WEATHER_TOOL]},
        consent=False,
    )
    view = shell.wait("tools")
    assert view["error"]["code"] == "unsupported", view
    assert shell.page.locator(".consent-dialog[open]").count() == 0


def test_greedy_answers_equal_llama_cpp_and_stream(
    shell: Shell, llama_cpp_answers: list[tuple[str, int]]
) -> None:
    shell.choose({})
    got = []
    for index, sample in enumerate(GREEDY_SAMPLES):
        [message] = sample["messages"]
        view = shell.generate(
            f"greedy{index}",
            {"messages": [user(message["content"])], "temperature": 0, "maxTokens": 64},
        )
        assert view["error"] is None, view
        result = view["result"]
        assert result["finish"] == "stop", result
        assert streamed_text(view["deltas"]) == text_of(result)
        assert result["usage"]["inputTokens"] == len(sample["prompt_ids"])
        got.append((text_of(result), result["usage"]["outputTokens"]))
        if index == 0:
            # token by token: more than one text delta
            assert len([d for d in view["deltas"] if d["event"] == "delta"]) > 1
    # WebLLM's usage counts the stop token it generated (`<|im_end|>`);
    # llama.cpp's count above stops before it.
    assert got == [(text, count + 1) for text, count in llama_cpp_answers]


def test_max_tokens_gives_finish_length(shell: Shell) -> None:
    shell.choose({})
    view = shell.generate("short", {"messages": [user("Hello!")], "temperature": 0, "maxTokens": 3})
    assert view["error"] is None, view
    assert view["result"]["finish"] == "length"
    assert view["result"]["usage"]["outputTokens"] == 3
    assert "Hello! How can I help you today?".startswith(text_of(view["result"]))


def test_json_format_runs_webllm_grammar(shell: Shell) -> None:
    shell.choose({"json": True})
    view = shell.generate(
        "json",
        {
            "messages": [user("Return a JSON object with name Bob and age 42.")],
            "format": "json",
            "temperature": 0,
        },
    )
    assert view["error"] is None, view
    assert view["result"]["finish"] == "stop"
    assert json.loads(text_of(view["result"])) == {"name": "Bob", "age": 42}


def test_cancel_mid_stream_then_the_engine_answers_again(shell: Shell) -> None:
    shell.choose({})
    [message] = COUNT_SAMPLE["messages"]
    shell.start("count", {"messages": [user(message["content"])], "temperature": 0})
    shell.frame.wait_for_function(
        "() => window.runs.count.deltas.filter((d) => d.event === 'delta').length >= 2",
        polling=POLL_MS,
        timeout=STEP_TIMEOUT_MS,
    )
    shell.frame.evaluate("window.runs.count.handle.cancel()")
    view = shell.wait("count")
    assert view["result"] is None and view["error"]["code"] == "cancelled"
    partial = streamed_text(view["deltas"])
    assert COUNT_SAMPLE["text"].startswith(partial) and partial != COUNT_SAMPLE["text"]
    count = len(view["deltas"])
    shell.frame.wait_for_timeout(500)
    assert len(shell.frame.evaluate("window.view('count')")["deltas"]) == count
    after = shell.generate("after", {"messages": [user("Thanks!")], "temperature": 0})
    assert after["error"] is None, after
    assert text_of(after["result"]) == "You are welcome!"
    assert shell.page.evaluate(f"{engine_host_js('webllm')}.then((h) => h.openStreams())") == 0


def test_swap_between_two_webllm_connections(shell: Shell) -> None:
    copy = shell.add_webllm_connection("TinyChat copy", SWAP_ID)
    shell.choose({}, connection=copy)
    view = shell.generate("copy", {"messages": [user("Bye")], "temperature": 0})
    assert view["error"] is None, view
    assert text_of(view["result"]) == "Goodbye! Have a nice day."
    # (Swapping back costs another load of ~13 s and shows nothing new.)


def test_a_model_that_fails_its_integrity_check_is_a_safe_provider_error(shell: Shell) -> None:
    poisoned = shell.add_webllm_connection("Poisoned TinyChat", POISONED_ID)
    shell.choose({}, connection=poisoned)
    view = shell.generate("poisoned", {"messages": [user("Hello!")], "temperature": 0})
    assert view["result"] is None
    error = view["error"]
    assert error["code"] == "provider-error", error
    lowered = error["message"].lower()
    for leak in ("integrity", "sha256", "http", "tinychat", "webllm", "mlc"):
        assert leak not in lowered, error
