"""Real WebGPU generations: TinyChat (ONNX) on transformers.js in headless Chromium.

Chromium runs with ``--enable-unsafe-webgpu`` (the ``webgpu_browser`` of
conftest.py); with no GPU its adapter is SwiftShader, so every token below is
computed by WGSL compute shaders on the CPU. Nothing is a stand-in: the model
is the committed ONNX export of TinyChat (models/tinychat/onnx/), served from
dist/ like the shell's other files.

- The engine module called directly (a test page under /_test/): greedy
  answers for every committed prompt (models/tinychat/samples_torch.json)
  equal llama.cpp's greedy answers on the committed GGUF, text and token
  count; a cancel mid-stream stops the worker and the next generation works;
  a corrupt model folder fails to load with a typed kind.
- Through the shell (Pyodide runtime, chooser, consent): a model added by
  folder URL in the connections form, streamed text with
  `finish: "stop"`, `maxTokens` giving `finish: "length"`, `format: "json"`,
  a tool call round trip through TinyChat's `<tool_call>` template, and a
  cancel mid-stream followed by a working generation.
- In the suite's default browser (no WebGPU adapter) the connection is listed
  as unavailable with the reason, never offered, and nothing of the engine
  is fetched.

Generations on SwiftShader cost about 0.1-0.3 s per token (plus shader
compiles on first use), so the shell tests share one page.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
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
#: The prompts compared token for token on SwiftShader (about 0.3 s a token):
#: every sample but the 200-token counting answer, which the CPython test
#: `tests/unit/test_tinychat_onnx.py` compares on the same ONNX file.
SHORT_SAMPLES = [s for s in SAMPLES if len(s["out_ids"]) <= 64]
#: The tool-result turn: weather question, tool call, tool result -> sentence.
TOOL_RESULT_SAMPLE = next(s for s in SAMPLES if s["text"].startswith("It is sunny in"))
CONNECTION = "builtin-tinychat-webgpu"
EOS = 2
#: A cold Pyodide start, the library and model load and the first shader
#: compiles on a shared 2-core machine.
BOOT_TIMEOUT_MS = 180_000
STEP_TIMEOUT_MS = 120_000
POLL_MS = 20

TestPage = Callable[[str, str], str]

#: Calls the onnx engine's host (web/engines/engine-host.js) directly, the way the Python port does.
DIRECT_PAGE = """<!doctype html><meta charset="utf-8"><title>onnx engine</title>
<script type="module">
const api = await @HOST@;
const source = {kind: "path", base: "../models/", model: "tinychat-onnx"};
window.probe = async () => JSON.parse(await api.report());
const fields = (from, dtype) => JSON.stringify({source: from, device: "webgpu", dtype});
window.load = async () => JSON.parse(
  await api.ensureModel("tiny", fields(source, "fp32"), "c", "TinyChat"));
const corrupt = {kind: "path", base: "./", model: "corrupt-onnx"};
window.loadCorrupt = async () =>
  JSON.parse(await api.ensureModel("corrupt", fields(corrupt, ""), "c", "X"));
window.chat = async (body, cancelAfter = 0) => {
  // When cancelling, chunks are handed over 50 ms apart (the engine's
  // delivery delay), so the cancel lands mid-stream on any adapter.
  const id = api.startChat("tiny", JSON.stringify(body), cancelAfter > 0 ? 50 : 0);
  const run = {text: "", chunks: 0, finish: null, usage: null, error: null, cancelled: false};
  for (;;) {
    const batch = JSON.parse(await api.nextChunks(id));
    for (const chunk of batch.chunks) {
      if (chunk.usage) run.usage = chunk.usage;
      for (const choice of chunk.choices) {
        if (choice.delta.content) { run.text += choice.delta.content; run.chunks += 1; }
        if (choice.finish_reason) run.finish = choice.finish_reason;
      }
    }
    if (batch.done) { run.error = batch.error; break; }
    if (cancelAfter > 0 && run.chunks >= cancelAfter) {
      run.cancelled = api.abort(id);
      break;
    }
  }
  run.open = api.openStreams();
  return run;
};
window.ready = true;
</script>
""".replace("@HOST@", engine_host_js("onnx", "../"))

#: The napplet of the shell tests: records every delta and the outcome per run.
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


def text_of(result: dict[str, Any]) -> str:
    return "".join(p["text"] for p in result["content"] if p["type"] == "text")


def streamed_text(deltas: list[dict[str, Any]], block: str = "text") -> str:
    return "".join(
        d.get("text", "") for d in deltas if d["block"] == block and d["event"] == "delta"
    )


@pytest.fixture(scope="module")
def llama_cpp_answers() -> list[tuple[str, int]]:
    """llama.cpp's greedy (text, token count) for every committed prompt, on the GGUF."""
    pytest.importorskip("llama_cpp")
    answers = run_llama(
        greedy_tokens,
        str(TINYCHAT / "tiny-chat-q8_0.gguf"),
        [sample["prompt_ids"] for sample in SHORT_SAMPLES],
        64,
        EOS,
    )
    return [(text, len(tokens)) for tokens, text in answers]


# --------------------------------------------------------------------------- the engine


def test_engine_greedy_answers_equal_llama_cpp_and_cancel_leaves_it_usable(
    webgpu_session: Any,
    test_page: TestPage,
    test_pages_dir: Path,
    llama_cpp_answers: list[tuple[str, int]],
) -> None:
    page = webgpu_session.page
    page.set_default_timeout(STEP_TIMEOUT_MS)
    page.goto(test_page("onnx-direct.html", DIRECT_PAGE))
    page.wait_for_function("window.ready === true")
    probe = page.evaluate("window.probe()")
    assert probe["webgpu"] is True, probe
    # A model folder whose graph is not ONNX: a load failure of kind "load".
    corrupt = test_pages_dir / "corrupt-onnx"
    (corrupt / "onnx").mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (corrupt / name).write_bytes((TINYCHAT / "onnx" / name).read_bytes())
    (corrupt / "onnx" / "model.onnx").write_bytes(b"not a protobuf " * 64)
    assert page.evaluate("window.loadCorrupt()") == {"ok": False, "kind": "load"}
    loaded = page.evaluate("window.load()")
    assert loaded == {"ok": True, "device": "webgpu", "contextSize": 512}
    got = []
    for sample in SHORT_SAMPLES:
        body = {"messages": sample["messages"], "temperature": 0, "max_tokens": 64}
        run = page.evaluate("(b) => window.chat(b)", body)
        assert run["error"] is None and run["finish"] == "stop", run
        got.append((run["text"], run["usage"]["completion_tokens"]))
        assert run["usage"]["prompt_tokens"] == len(sample["prompt_ids"])
    assert got == llama_cpp_answers
    # Cancel after the first streamed piece of a long answer: the stream is
    # released, and the worker finishes the next generation correctly.
    long = SAMPLES[-1]
    cancelled = page.evaluate(
        "(b) => window.chat(b, 1)", {"messages": long["messages"], "temperature": 0}
    )
    assert cancelled["cancelled"] is True and cancelled["open"] == 0
    assert long["text"].startswith(cancelled["text"]) and cancelled["text"] != long["text"]
    after = page.evaluate(
        "(b) => window.chat(b)", {"messages": SAMPLES[0]["messages"], "temperature": 0}
    )
    assert after["text"] == SAMPLES[0]["text"] and after["open"] == 0
    # Everything came from this origin: no CDN, no model hub.
    webgpu_session.log.assert_local()


# --------------------------------------------------------------------------- the shell


class Shell:
    """The real shell (test mode) in the WebGPU browser with the driver napplet."""

    def __init__(self, page: Any, frame: Any) -> None:
        self.page = page
        self.frame = frame

    def choose(self, requirements: dict[str, Any]) -> dict[str, Any]:
        self.frame.evaluate("(r) => window.selectModel(r)", requirements)
        self.page.click(f".chooser-dialog button.candidate[data-candidate-id='{CONNECTION}']")
        self.frame.wait_for_function("() => window.selected !== null", polling=POLL_MS)
        selected: dict[str, Any] = self.frame.evaluate("window.selected")
        assert "model" in selected, selected
        return selected["model"]  # type: ignore[no-any-return]

    def start(self, name: str, request: dict[str, Any]) -> None:
        self.frame.evaluate("([n, r]) => window.start(n, r)", [name, request])
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


@pytest.fixture(scope="module")
def shell(
    webgpu_browser: Any,
    base_url: str,
    test_pages_dir: Path,
    dist_url: str,
    request: pytest.FixtureRequest,
) -> Iterator[Shell]:
    """One shell page for the module (booting Pyodide and the model once)."""
    (test_pages_dir / "onnx-driver.html").write_text(DRIVER_NAPPLET, encoding="utf-8")
    driver = f"{dist_url}_test/onnx-driver.html"
    context = webgpu_browser.new_context(base_url=base_url)
    # Every request of the context, workers included, must stay on 127.0.0.1.
    requests: list[str] = []
    context.on("request", lambda r: requests.append(r.url))
    page = context.new_page()
    page.set_default_timeout(STEP_TIMEOUT_MS)
    # engineDelayMs (test mode only; it slows the real engine under test, which
    # a scripted connection cannot stand in for) hands chunks over 100 ms apart, so a
    # cancel lands mid-stream however fast the adapter is.
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


def test_shell_lists_the_connection_with_its_route(shell: Shell) -> None:
    items = shell.page.eval_on_selector_all(
        "#connection-list > li",
        "(items) => items.map((li) => ({id: li.dataset.connectionId, text: li.textContent}))",
    )
    ids = [i["id"] for i in items]
    assert ids[0] == "builtin-tinychat"  # llama.cpp's TinyChat stays first
    mine = next(i for i in items if i["id"] == CONNECTION)
    assert "TinyChat (WebGPU, transformers.js)" in mine["text"]
    assert "Unavailable" not in mine["text"]
    model = shell.choose({"json": True, "tools": True})
    assert model["name"] == "TinyChat (WebGPU, transformers.js)"
    assert model["route"] == "This browser (WebGPU, transformers.js) on this device"
    assert model["json"] is True and model["tools"] is True and model["images"] is False


def test_shell_streams_text_and_stops_or_hits_the_limit(shell: Shell) -> None:
    shell.choose({})
    view = shell.generate("hello", {"messages": [user("Hello!")], "temperature": 0})
    assert view["error"] is None, view
    result = view["result"]
    assert result["finish"] == "stop"
    assert text_of(result) == "Hello! How can I help you today?"
    assert streamed_text(view["deltas"]) == text_of(result)
    assert len([d for d in view["deltas"] if d["event"] == "delta"]) > 1  # streamed
    assert result["usage"] == {"inputTokens": 10, "outputTokens": 9}
    short = shell.generate(
        "short", {"messages": [user("Hello!")], "temperature": 0, "maxTokens": 3}
    )
    assert short["error"] is None, short
    assert short["result"]["finish"] == "length"
    assert short["result"]["usage"]["outputTokens"] == 3
    assert "Hello! How can I help you today?".startswith(text_of(short["result"]))


def test_shell_json_format(shell: Shell) -> None:
    shell.choose({"json": True})
    view = shell.generate(
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


def test_shell_tool_call_round_trip(shell: Shell) -> None:
    shell.choose({"tools": True})
    question = user("What is the weather in Paris?")
    first = shell.generate(
        "call",
        {"messages": [question], "tools": [WEATHER_TOOL], "toolChoice": "auto", "temperature": 0},
    )
    assert first["error"] is None, first
    result = first["result"]
    assert result["finish"] == "toolUse"
    calls = [p for p in result["content"] if p["type"] == "toolCall"]
    assert [(c["name"], c["arguments"]) for c in calls] == [("get_weather", {"city": "Paris"})]
    assert not text_of(result)  # the raw <tool_call> text never reaches the napplet
    observation = {"city": "Paris", "temperature": 21, "condition": "sunny"}
    second = shell.generate(
        "answer",
        {
            "messages": [
                question,
                {"role": "assistant", "content": calls},
                {
                    "role": "toolResult",
                    "toolCallId": calls[0]["toolCallId"],
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
    assert text_of(second["result"]) == "It is sunny in Paris with a temperature of 21 degrees."


def test_shell_cancel_mid_stream_then_a_next_generation_works(shell: Shell) -> None:
    shell.choose({})
    long_answer = "It is sunny in Paris with a temperature of 21 degrees."
    messages = TOOL_RESULT_SAMPLE["messages"]
    napplet_messages = [
        user(messages[0]["content"]),
        {
            "role": "assistant",
            "content": [
                {
                    "type": "toolCall",
                    "toolCallId": "call-1",
                    "name": "get_weather",
                    "arguments": {"city": "Paris"},
                }
            ],
        },
        {
            "role": "toolResult",
            "toolCallId": "call-1",
            "toolName": "get_weather",
            "content": [{"type": "text", "text": messages[2]["content"]}],
        },
    ]
    shell.start(
        "slow",
        {"messages": napplet_messages, "tools": [WEATHER_TOOL], "temperature": 0},
    )
    shell.frame.wait_for_function(
        "() => window.runs.slow.deltas.filter((d) => d.event === 'delta').length >= 1",
        polling=POLL_MS,
        timeout=STEP_TIMEOUT_MS,
    )
    shell.frame.evaluate("window.runs.slow.handle.cancel()")
    view = shell.wait("slow")
    assert view["result"] is None
    assert view["error"]["code"] == "cancelled"
    partial = streamed_text(view["deltas"])
    assert long_answer.startswith(partial) and partial != long_answer
    count = len(view["deltas"])
    shell.frame.wait_for_timeout(500)
    assert len(shell.frame.evaluate("window.view('slow')")["deltas"]) == count
    open_streams = shell.page.evaluate(
        f"{engine_host_js('onnx')}.then((host) => host.openStreams())"
    )
    assert open_streams == 0
    after = shell.generate("after", {"messages": [user("Thanks!")], "temperature": 0})
    assert after["error"] is None, after
    assert text_of(after["result"]) == "You are welcome!"


def test_user_added_onnx_model_by_folder_url_generates(shell: Shell, dist_url: str) -> None:
    # The "add an ONNX model by URL" path of the connections form, with the
    # shipped export's folder as the URL (so nothing leaves 127.0.0.1).
    page = shell.page
    page.click("#connection-add")
    page.fill("#connection-name", "My ONNX model")
    page.select_option("#connection-kind", "onnx")
    page.fill("#connection-model", f"{dist_url}models/tinychat-onnx/")
    page.click("#connection-form button[type='submit']")
    page.wait_for_function(
        "() => [...document.querySelectorAll('#connection-list > li')]"
        ".some((li) => li.textContent.includes('My ONNX model'))"
    )
    cid = page.eval_on_selector_all(
        "#connection-list > li",
        "(items) => items.find((li) => li.textContent.includes('My ONNX model'))"
        ".dataset.connectionId",
    )
    item = page.text_content(f"#connection-list > li[data-connection-id='{cid}']") or ""
    assert "ONNX model in this browser (WebGPU)" in item and "Unavailable" not in item
    shell.frame.evaluate("() => window.selectModel({})")
    page.click(f".chooser-dialog button.candidate[data-candidate-id='{cid}']")
    shell.frame.wait_for_function("() => window.selected !== null", polling=POLL_MS)
    model = shell.frame.evaluate("window.selected.model")
    assert model["name"] == "My ONNX model"
    view = shell.generate("added", {"messages": [user("Who are you?")], "temperature": 0})
    assert view["error"] is None, view
    assert text_of(view["result"]) == "I am TinyChat, a small test model."


def test_without_webgpu_the_connection_says_so_and_nothing_is_fetched(
    page: Any, request_log: Any, test_pages_dir: Path, product_url: str
) -> None:
    # The default browser of the suite has no WebGPU adapter; the product dist/.
    (test_pages_dir / "onnx-driver.html").write_text(DRIVER_NAPPLET, encoding="utf-8")
    driver = quote(f"{product_url}_test/onnx-driver.html", safe="")
    page.set_default_timeout(STEP_TIMEOUT_MS)
    page.goto(f"{product_url}index.html?napplet={driver}")
    page.wait_for_function("document.body.dataset.boot === 'ready'", timeout=BOOT_TIMEOUT_MS)
    entry = f"#connection-list .unavailable-group li[data-connection-id='{CONNECTION}']"
    item = page.text_content(entry) or ""
    assert "TinyChat (WebGPU, transformers.js)" in item
    assert "WebGPU" in item
    frame = linked_napplet_frame(page)
    frame.wait_for_function("() => typeof window.selectModel === 'function'", polling=POLL_MS)
    frame.evaluate("() => window.selectModel({})")
    page.wait_for_selector(".chooser-dialog button.candidate")
    offered = page.eval_on_selector_all(
        ".chooser-dialog button.candidate", "(bs) => bs.map((b) => b.dataset.candidateId)"
    )
    assert "builtin-tinychat" in offered and CONNECTION not in offered
    page.keyboard.press("Escape")
    # (The small engine modules are precached like every engine; the library,
    # onnxruntime's wasm and the model are not, and nothing asked for them.)
    fetched = [
        u
        for u in request_log.requests
        if "/vendor/transformers/" in u or "/models/tinychat-onnx/" in u
    ]
    assert fetched == []
