"""End to end on real inference: the shell, the Python runtime in Pyodide and
TinyChat on llama.cpp/WebAssembly (wllama), in offline Chromium.

Every test opens the real shell (the test build, with its hooks off except
in the one test that sets the engine's test-only delivery delay
`engineDelayMs` with `?test=1`: it slows the real engine, which no scripted
connection can stand in for), a napplet in a sandboxed frame, and answers the chooser and
consent dialogs with real clicks. Exact answers are asserted with
`temperature: 0` (greedy decoding; the engine also sends `top_k: 1`), on the
prompts TinyChat was trained on (models/tinychat/README.md).

The driving napplet is written by the tests (served under /_test/): it only
calls `window.napplet.llm` and records what it gets, so the assertions see
exactly what a napplet sees. The example napplets are driven too, for their
own flows.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import quote

import pytest

from fixtures import user
from napllm.devtools.engines import engine_host_js

pytestmark = pytest.mark.browser

TestPage = Callable[[str, str], str]
Page = Any

#: A cold Pyodide start plus the model load take a few seconds on 2 cores.
BOOT_TIMEOUT_MS = 120_000
STEP_TIMEOUT_MS = 60_000
TINYCHAT = "builtin-tinychat"
#: Frame waits poll by timer: Chromium throttles requestAnimationFrame in a
#: frame scrolled out of view (the connection form can push it there).
POLL_MS = 20

#: The test napplet: records every delta and the settled outcome per run.
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
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


class Shell:
    """The real shell page with the driver napplet open in a frame."""

    def __init__(self, page: Page, base_url: str, driver_url: str, log: Any) -> None:
        self.page = page
        self.base_url = base_url
        self.driver_url = driver_url
        self.log = log

    def open(self, query: str = "") -> Any:
        """Boot the shell with the driver napplet; test mode (hooks on) only when
        `query` sets a hook (``&engineDelayMs=N``)."""
        hooks = f"test=1{query}&" if query else ""
        self.page.goto(
            f"{self.base_url}index.html?{hooks}napplet={quote(self.driver_url, safe='')}"
        )
        self.page.wait_for_function(
            "document.body.dataset.boot === 'ready'", timeout=BOOT_TIMEOUT_MS
        )
        # a link opens the napplet with LLM access off: turn it on, as a person does
        self.page.wait_for_function(
            "() => { const f = document.querySelector('iframe.napplet-frame');"
            " return f && f.srcdoc.length > 0; }"
        )
        old = self.page.query_selector("iframe.napplet-frame")
        self.page.click(".llm-toggle")
        self.page.wait_for_function(
            "(old) => { const f = document.querySelector('iframe.napplet-frame');"
            " return f && f !== old && f.srcdoc.length > 0; }",
            arg=old,
        )
        return self.frame()

    def frame(self) -> Any:
        self.page.wait_for_function(
            "() => { const f = document.querySelector('iframe.napplet-frame');"
            " return f && f.srcdoc.length > 0; }"
        )
        handle = self.page.query_selector("iframe.napplet-frame")
        frame = handle.content_frame()
        frame.wait_for_load_state("load")
        frame.wait_for_function("() => typeof window.start === 'function'", polling=POLL_MS)
        return frame

    def choose(self, frame: Any, requirements: dict[str, Any], cid: str = TINYCHAT) -> Any:
        """select() in the napplet, then a click on the connection in the chooser."""
        frame.evaluate("(r) => window.selectModel(r)", requirements)
        self.page.click(f".chooser-dialog button.candidate[data-candidate-id='{cid}']")
        frame.wait_for_function("() => window.selected !== null", polling=POLL_MS)
        selected = frame.evaluate("window.selected")
        assert "model" in selected, selected
        return selected["model"]

    def allow(self) -> None:
        """Click Allow in the consent dialog."""
        self.page.click(".consent-dialog button.allow")

    def generate(self, frame: Any, name: str, request: dict[str, Any]) -> dict[str, Any]:
        """Start a generation, allow it, and wait for its outcome."""
        frame.evaluate("([n, r]) => window.start(n, r)", [name, request])
        self.allow()
        frame.wait_for_function(
            "(n) => window.runs[n].result !== null || window.runs[n].error !== null",
            arg=name,
            timeout=STEP_TIMEOUT_MS,
            polling=POLL_MS,
        )
        view: dict[str, Any] = frame.evaluate("(n) => window.view(n)", name)
        return view

    def notices(self) -> list[str]:
        texts: list[str] = self.page.eval_on_selector_all(
            "#notice-list li", "(items) => items.map((i) => i.textContent)"
        )
        return texts


@pytest.fixture
def shell(page: Page, request_log: Any, test_page: TestPage, base_url: str) -> Iterator[Shell]:
    page.set_default_timeout(STEP_TIMEOUT_MS)
    driver = test_page("driver.html", DRIVER_NAPPLET)
    yield Shell(page, base_url, driver, request_log)


def text_of(result: dict[str, Any]) -> str:
    return "".join(p["text"] for p in result["content"] if p["type"] == "text")


def streamed_text(deltas: list[dict[str, Any]], block: str = "text") -> str:
    return "".join(
        d.get("text", "") for d in deltas if d["block"] == block and d["event"] == "delta"
    )


# --------------------------------------------------------------------------- tests


def test_tinychat_is_the_default_connection_with_honest_capabilities(shell: Shell) -> None:
    frame = shell.open()
    model = shell.choose(frame, {"json": True, "tools": True})
    assert model["name"] == "TinyChat (on this device)"
    assert model["model"] == "tinychat-q8_0"
    assert model["route"] == "This browser (WebAssembly, llama.cpp) on this device"
    assert model["json"] is True and model["tools"] is True and model["images"] is False
    assert model["toolChoiceModes"] == ["auto", "none"]
    # TinyChat is listed first in the connections panel, before any fixture.
    first = shell.page.eval_on_selector_all(
        "#connection-list > li", "(items) => items.map((i) => i.textContent)"
    )[0]
    assert "TinyChat (on this device)" in first


def test_chat_hello_streams_the_exact_answer(shell: Shell) -> None:
    frame = shell.open()
    shell.choose(frame, {})
    shell.page.evaluate(
        """() => {
          window.progressSeen = [];
          new MutationObserver(() => {
            for (const bar of document.querySelectorAll('#connection-list .engine-progress')) {
              const owner = bar.closest('li.connection');
              window.progressSeen.push([owner.dataset.connectionId, bar.textContent]);
            }
          }).observe(document.querySelector('#connection-list'), {subtree: true, childList: true});
        }"""
    )
    view = shell.generate(frame, "hello", {"messages": [user("Hello!")], "temperature": 0})
    assert view["error"] is None, view
    result = view["result"]
    assert result["finish"] == "stop"
    assert text_of(result) == "Hello! How can I help you today?"
    deltas = view["deltas"]
    assert [d["sequence"] for d in deltas] == list(range(len(deltas)))
    assert streamed_text(deltas) == "Hello! How can I help you today?"
    text_deltas = [d for d in deltas if d["event"] == "delta"]
    assert len(text_deltas) > 1  # streamed token by token, not in one piece
    assert result["usage"]["outputTokens"] > 0 and result["usage"]["inputTokens"] > 0
    # The model download was shown as a progress bar in the connection's
    # entry, which is gone once the model is ready.
    seen = shell.page.evaluate("window.progressSeen")
    assert seen and all(owner == "builtin-tinychat" for owner, _ in seen)
    assert any(text.startswith("Downloading TinyChat") for _, text in seen)
    assert shell.page.locator("#connection-list .engine-progress").count() == 0
    # dist/ is served with COOP/COEP: llama.cpp gets half the cores as threads.
    isolated, cores = shell.page.evaluate("[crossOriginIsolated, navigator.hardwareConcurrency]")
    loaded = json.loads(
        shell.page.evaluate(f"{engine_host_js('wasm')}.then((h) => h.loadedModels())")
    )
    assert [json.loads(m["key"])[0] for m in loaded] == ["models/tinychat/tiny-chat-q8_0.gguf"]
    assert isolated is True
    threads = max(1, min(8, cores // 2))
    assert loaded[0]["threads"] == threads
    assert loaded[0]["multithread"] is (threads > 1)
    assert loaded[0]["nCtx"] == 512
    # The long answer (200 tokens): the engine runs ahead of the runtime,
    # which reads its tokens in batches; the deltas stay contiguous and the
    # text arrives whole and in order.
    count = ", ".join(str(i) for i in range(1, 101)) + "."
    long = shell.generate(
        frame, "count", {"messages": [user("Count from 1 to 100.")], "temperature": 0}
    )
    assert long["error"] is None, long
    assert text_of(long["result"]) == count
    assert long["result"]["usage"]["outputTokens"] >= 200
    assert [d["sequence"] for d in long["deltas"]] == list(range(len(long["deltas"])))
    assert streamed_text(long["deltas"]) == count


def test_json_format_returns_the_object(shell: Shell) -> None:
    frame = shell.open()
    shell.choose(frame, {"json": True})
    view = shell.generate(
        frame,
        "json",
        {
            "messages": [user("Return a JSON object with name Alice and age 30.")],
            "format": "json",
            "temperature": 0,
        },
    )
    assert view["error"] is None, view
    assert view["result"]["finish"] == "stop"
    assert json.loads(text_of(view["result"])) == {"name": "Alice", "age": 30}


def test_tool_call_then_tool_result_then_answer(shell: Shell) -> None:
    frame = shell.open()
    shell.choose(frame, {"tools": True})
    question = user("What is the weather in Berlin?")
    first = shell.generate(
        frame,
        "call",
        {"messages": [question], "tools": [WEATHER_TOOL], "toolChoice": "auto", "temperature": 0},
    )
    assert first["error"] is None, first
    result = first["result"]
    assert result["finish"] == "toolUse"
    calls = [p for p in result["content"] if p["type"] == "toolCall"]
    assert len(calls) == 1
    call = calls[0]
    assert call["name"] == "get_weather"
    assert call["arguments"] == {"city": "Berlin"}
    assert call["toolCallId"]
    # The streamed toolCall block carries the same id, name and arguments.
    starts = [d for d in first["deltas"] if d["block"] == "toolCall" and d["event"] == "start"]
    assert starts and starts[0]["toolCallId"] == call["toolCallId"]
    assert json.loads(streamed_text(first["deltas"], "toolCall")) == {"city": "Berlin"}

    observation = {"city": "Berlin", "temperature": 18, "condition": "cloudy"}
    second = shell.generate(
        frame,
        "answer",
        {
            "messages": [
                question,
                {"role": "assistant", "content": [call]},
                {
                    "role": "toolResult",
                    "toolCallId": call["toolCallId"],
                    "toolName": "get_weather",
                    "content": [{"type": "text", "text": json.dumps(observation)}],
                },
            ],
            "tools": [WEATHER_TOOL],
            "toolChoice": "auto",
            "temperature": 0,
        },
    )
    assert second["error"] is None, second
    assert second["result"]["finish"] == "stop"
    answer = text_of(second["result"])
    assert answer == "It is cloudy in Berlin with a temperature of 18 degrees."


def test_cancel_mid_stream_stops_the_engine_and_the_shell_stays_usable(shell: Shell) -> None:
    # engineDelayMs (test mode only) hands tokens over 150 ms apart.
    frame = shell.open("&engineDelayMs=150")
    shell.choose(frame, {})
    frame.evaluate(
        "([n, r]) => window.start(n, r)",
        ["slow", {"messages": [user("Hello!")], "temperature": 0}],
    )
    shell.allow()
    frame.wait_for_function(
        "() => window.runs.slow.deltas.filter((d) => d.event === 'delta').length >= 2",
        polling=POLL_MS,
    )
    frame.evaluate("window.runs.slow.handle.cancel()")
    frame.wait_for_function("() => window.runs.slow.error !== null", polling=POLL_MS)
    view = frame.evaluate("window.view('slow')")
    assert view["result"] is None
    assert view["error"]["code"] == "cancelled"
    partial = streamed_text(view["deltas"])
    assert "Hello! How can I help you today?".startswith(partial)
    assert partial != "Hello! How can I help you today?"
    count = len(view["deltas"])
    frame.wait_for_timeout(600)
    assert len(frame.evaluate("window.view('slow')")["deltas"]) == count  # nothing after cancel
    # The engine released the stream, and the next request still works.
    open_streams = shell.page.evaluate(f"{engine_host_js('wasm')}.then((h) => h.openStreams())")
    assert open_streams == 0
    after = shell.generate(frame, "after", {"messages": [user("Thanks!")], "temperature": 0})
    assert after["error"] is None, after
    assert text_of(after["result"]) == "You are welcome!"


def test_corrupt_gguf_is_a_clear_error_and_the_shell_stays_usable(
    shell: Shell, test_page: TestPage, dist_url: str
) -> None:
    # A GGUF-named file that is not a model, served from 127.0.0.1.
    test_page("corrupt.gguf", "GGUF this is not a model " * 40)
    frame = shell.open()
    shell.page.click("#connection-add")
    shell.page.fill("#connection-name", "Broken model")
    shell.page.select_option("#connection-kind", "wasm")
    shell.page.fill("#connection-model-url", f"{dist_url}_test/corrupt.gguf")
    shell.page.fill("#connection-model", "broken")
    shell.page.click("#connection-form button[type='submit']")
    shell.page.wait_for_function(
        "[...document.querySelectorAll('#connection-list > li')]"
        ".some((li) => li.textContent.includes('Broken model'))"
    )
    frame.evaluate("() => window.selectModel({})")
    shell.page.wait_for_selector(".chooser-dialog button.candidate")
    shell.page.click(".chooser-dialog button.candidate:has-text('Broken model')")
    frame.wait_for_function("() => window.selected !== null", polling=POLL_MS)
    view = shell.generate(frame, "broken", {"messages": [user("Hello!")], "temperature": 0})
    assert view["result"] is None
    assert view["error"]["code"] == "provider-error"
    assert "GGUF" not in view["error"]["message"]
    shell.page.wait_for_function(
        "[...document.querySelectorAll('#notice-list li')]"
        ".some((li) => li.textContent.includes('could not be loaded'))"
    )
    # TinyChat still answers in the same page.
    shell.choose(frame, {})
    ok = shell.generate(frame, "ok", {"messages": [user("Hello!")], "temperature": 0})
    assert ok["error"] is None, ok
    assert text_of(ok["result"]) == "Hello! How can I help you today?"


def test_without_cross_origin_isolation_llama_cpp_uses_one_thread(shell: Shell) -> None:
    def without_isolation(route: Any) -> None:
        response = route.fetch()
        headers = {
            k: v
            for k, v in response.headers.items()
            if k.lower() not in ("cross-origin-opener-policy", "cross-origin-embedder-policy")
        }
        route.fulfill(response=response, headers=headers)

    shell.page.route("**/index.html?*", without_isolation)
    frame = shell.open()
    assert shell.page.evaluate("crossOriginIsolated") is False
    shell.choose(frame, {})
    view = shell.generate(frame, "hello", {"messages": [user("Hello!")], "temperature": 0})
    assert text_of(view["result"]) == "Hello! How can I help you today?"
    loaded = json.loads(
        shell.page.evaluate(f"{engine_host_js('wasm')}.then((h) => h.loadedModels())")
    )
    assert loaded[0]["threads"] == 1 and loaded[0]["multithread"] is False


# --------------------------------------------------------------------------- example napplets


def open_example(shell: Shell, name: str) -> Any:
    """Open napplets/<name>/ from the shell's list and choose TinyChat in it."""
    shell.page.goto(f"{shell.base_url}index.html")
    shell.page.wait_for_function("document.body.dataset.boot === 'ready'", timeout=BOOT_TIMEOUT_MS)
    shell.page.wait_for_function(
        "(n) => [...document.querySelectorAll('#napplet-select option')]"
        ".some((o) => o.value === n)",
        arg=name,
    )
    shell.page.select_option("#napplet-select", name)
    shell.page.click("#napplet-open")
    shell.page.wait_for_function(
        "() => { const f = document.querySelector('iframe.napplet-frame');"
        " return f && f.srcdoc.length > 0; }"
    )
    frame = shell.page.query_selector("iframe.napplet-frame").content_frame()
    frame.wait_for_load_state("load")
    frame.click("#choose")
    shell.page.click(f".chooser-dialog button.candidate[data-candidate-id='{TINYCHAT}']")
    frame.wait_for_function(
        "() => document.querySelector('#model').textContent.includes('TinyChat')", polling=POLL_MS
    )
    return frame


def test_example_chat_napplet_streams_tinychat_answers(shell: Shell) -> None:
    frame = open_example(shell, "chat")
    frame.fill("#prompt", "Hello!")
    frame.click("#send")
    shell.allow()
    frame.wait_for_function(
        "() => document.querySelectorAll('#history li').length === 2", polling=POLL_MS
    )
    answer = frame.text_content("#history li.assistant")
    assert answer is not None and "Hello! How can I help you today?" in answer


def test_example_json_napplet_gets_an_object(shell: Shell) -> None:
    frame = open_example(shell, "json")
    frame.fill("#prompt", "Return a JSON object with name Alice and age 30.")
    frame.click("#send")
    shell.allow()
    frame.wait_for_function(
        "() => document.querySelector('#status').textContent === 'Done.'", polling=POLL_MS
    )
    assert json.loads(frame.text_content("#result") or "") == {"name": "Alice", "age": 30}


def test_example_tools_napplet_runs_the_weather_loop_on_tinychat(shell: Shell) -> None:
    frame = open_example(shell, "tools")
    frame.fill("#prompt", "What is the weather in Berlin?")
    frame.click("#send")
    shell.allow()  # round 1: the model calls get_weather
    shell.allow()  # round 2: the answer after the tool result
    frame.wait_for_function(
        "() => document.querySelector('#status').textContent === 'Done.'", polling=POLL_MS
    )
    log = frame.text_content("#log") or ""
    assert 'get_weather({"city":"Berlin"})' in log
    assert "model answered" in log
    # The example's canned result for Berlin is 18 °C and sunny.
    answer = (frame.text_content("#answer") or "").strip()
    assert answer == "It is sunny in Berlin with a temperature of 18 degrees."
