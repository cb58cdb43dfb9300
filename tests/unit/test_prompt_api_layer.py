"""The Prompt API layer's own logic (web/prompt-api/, through index.js), run in node.

Its pure parts (the regular-expression bound, schema compilation, answer
checking, the error names) and a session's bookkeeping against a recording
binding that answers like `window.napplet.llm` (the browser tests drive the
real shell: tests/browser/test_prompt_api.py).
"""

# ruff: noqa: E501  (the JavaScript embedded below keeps its natural line length)

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from nodejs import needs_node, run_module

ROOT = Path(__file__).resolve().parents[2]
LAYER = ROOT / "web" / "prompt-api" / "index.js"

pytestmark = needs_node

#: A binding that records each generate request and answers from `turns`.
BINDING = (
    f"const layer = await import({json.dumps(LAYER.as_uri())});\n"
    + """
const makeWindow = (turns, model = {}) => {
  const requests = [];
  const cancels = [];
  const llm = {
    select: async (requirements) => ({ handle: "h1", name: "n", model: "m", route: "r", images: false, json: true, tools: true, toolChoiceModes: ["auto"], ...model, requirements }),
    generate(request, options) {
      requests.push(structuredClone(request));
      const turn = turns.length > 0 ? turns.shift() : { text: "(none)" };
      const done = (async () => {
        await null;
        if (turn.delayMs) await new Promise((resolve) => setTimeout(resolve, turn.delayMs));
        for (const text of turn.chunks || []) options && options.onDelta && options.onDelta({ block: "text", event: "delta", text });
        if (turn.error) throw Object.assign(new Error("failed"), { code: turn.error });
        if (turn.calls) return { finish: "toolUse", content: turn.calls.map((c, i) => ({ type: "toolCall", toolCallId: "c" + i, name: c.name, arguments: c.arguments })) };
        return { finish: turn.finish || "stop", content: [{ type: "text", text: turn.text }], usage: turn.usage };
      })();
      done.catch(() => {});
      return { then: (a, b) => done.then(a, b), cancel: async () => { cancels.push(1); return true; } };
    },
    cancel: async () => true,
  };
  const win = { napplet: { llm } };
  return { win, requests, cancels };
};
const outcome = async (promise) => {
  try {
    return { ok: await promise };
  } catch (err) {
    return { name: err.name, message: err.message };
  }
};
"""
)


def run(body: str) -> Any:
    return run_module(BINDING + body, timeout=120)


def test_regex_bound_refuses_the_exponential_shapes() -> None:
    cases = {
        "^[a-z]+$": True,
        "\\d{3}-\\d{4}": True,
        "(ab)*": True,
        "((a)b)+": True,
        "^(?:[a-z0-9-]{0,61}[a-z0-9])?$": True,
        "(a+)?b": True,
        "[(+]+": True,
        "(a+)+$": False,
        "(a|b)*": False,
        "(\\w+\\s?)*": False,
        "((a)+b){2,}": False,
        "(x)\\1": False,
        "(?<n>a)\\k<n>": False,
        "a" * 1001: False,
        "(unclosed": False,
    }
    result = run(
        f"const cases = {json.dumps(cases)};\n"
        "console.log(JSON.stringify(Object.fromEntries(Object.keys(cases).map((p) => [p, layer.regexIsBounded(p)]))));"
    )
    assert result == cases


def test_schemas_and_answers() -> None:
    result = run(
        """
const tries = {};
const attempt = (name, fn) => { try { fn(); tries[name] = "ok"; } catch (e) { tries[name] = e.name + ": " + e.message; } };
const rating = layer.compileSchema({ type: "object", required: ["rating"], properties: { rating: { type: "number", maximum: 5 } } }, "rc");
attempt("good", () => layer.checkAnswer('{"rating": 4}', rating));
attempt("over", () => layer.checkAnswer('{"rating": 9}', rating));
attempt("missing", () => layer.checkAnswer('{}', rating));
attempt("notJson", () => layer.checkAnswer('rating: 4', rating));
attempt("huge", () => layer.checkAnswer(" ".repeat(layer.MAX_ANSWER_CHARS + 1), rating));
attempt("bigSchema", () => layer.compileSchema({ description: "x".repeat(70000) }, "rc"));
attempt("slowPattern", () => layer.compileSchema({ properties: { a: { pattern: "(a+)+$" } } }, "rc"));
attempt("slowName", () => layer.compileSchema({ patternProperties: { "(a|aa)*": {} } }, "rc"));
let deep = {};
for (let i = 0; i < 100; i += 1) deep = { items: deep };
attempt("deep", () => layer.compileSchema(deep, "rc"));
attempt("array", () => layer.compileSchema([], "rc"));
attempt("badRegex", () => layer.compileSchema({ pattern: "[" }, "rc"));
console.log(JSON.stringify(tries));
"""
    )
    assert result["good"] == "ok"
    assert result["over"].startswith("SyntaxError: ") and "#/rating" in result["over"]
    assert result["missing"].startswith("SyntaxError: ")
    assert result["notJson"].startswith("SyntaxError: ")
    assert result["huge"].startswith("SyntaxError: ")
    assert result["bigSchema"].startswith("NotSupportedError: ")
    assert result["slowPattern"].startswith("NotSupportedError: ")
    assert result["slowName"].startswith("NotSupportedError: ")
    assert result["deep"].startswith("NotSupportedError: ")
    assert result["array"].startswith("TypeError: ")
    assert result["badRegex"].startswith("NotSupportedError: ")  # "[" is refused before compiling


def test_error_names() -> None:
    codes = [
        "user-cancelled",
        "cancelled",
        "timeout",
        "quota-exceeded",
        "unsupported",
        "selection-expired",
        "invalid-request",
        "provider-error",
        "invalid-response",
        "something-new",
    ]
    result = run(
        f"const codes = {json.dumps(codes)};\n"
        "console.log(JSON.stringify(codes.map((code) => { const e = layer.toDomException({ code, message: 'm' }); return [e instanceof DOMException, e.name, e.message]; })));"
    )
    assert [name for _, name, _ in result] == [
        "NotAllowedError",
        "AbortError",
        "TimeoutError",
        "QuotaExceededError",
        "NotSupportedError",
        "InvalidStateError",
        "DataError",
        "OperationError",
        "OperationError",
        "UnknownError",
    ]
    assert all(is_dom for is_dom, _, _ in result)
    assert result[0][2] == "m (NAP-LLM: user-cancelled)"


def test_session_history_usage_and_bounds() -> None:
    result = run(
        """
const { win, requests } = makeWindow([
  { text: "one", usage: { inputTokens: 10, outputTokens: 2 } },
  { text: "two" },
]);
const LanguageModel = layer.installPromptApi(win, "");
const session = await LanguageModel.create({ initialPrompts: [{ role: "system", content: "sys" }] });
const before = session.contextUsage;
const first = await session.prompt("hello");
const afterFirst = session.contextUsage;
await session.append("12345678");
const afterAppend = session.contextUsage;
const copy = await session.clone();
const second = await copy.prompt("again");
const lateSystem = await outcome(session.prompt([{ role: "system", content: "late" }]));
const regexp = await outcome(session.prompt("x", { responseConstraint: /a/ }));
const omitAlone = await outcome(session.prompt("x", { omitResponseConstraintInput: true }));
const audio = await outcome(session.prompt([{ role: "user", content: [{ type: "audio", value: new ArrayBuffer(4) }] }]));
const image = await outcome(session.prompt([{ role: "user", content: [{ type: "image", value: new Uint8Array([0x89, 0x50, 0x4e, 0x47, 13, 10, 26, 10]) }] }]));
const measured = await session.measureContextUsage("12345678");
session.destroy();
const destroyed = await outcome(session.prompt("after"));
console.log(JSON.stringify({
  before, first, afterFirst, afterAppend, second, lateSystem, regexp, omitAlone, audio, image, measured, destroyed,
  requests: requests.map((r) => r.messages.map((m) => m.role + ":" + m.content.map((p) => p.text).join(""))),
  original: requests.length,
  window: session.contextWindow,
  globals: [typeof win.LanguageModel, win.NappletLanguageModel === win.LanguageModel],
}));
"""
    )
    assert result["first"] == "one" and result["second"] == "two"
    assert result["before"] == 1  # "sys": 3 code units, estimated
    assert result["afterFirst"] == 12  # reported by the connection
    assert result["afterAppend"] == 14  # plus 8 code units estimated
    assert result["requests"] == [
        ["system:sys", "user:hello"],
        ["system:sys", "user:hello", "assistant:one", "user:12345678", "user:again"],
    ]
    assert result["lateSystem"]["name"] == "TypeError"
    assert result["regexp"]["name"] == "NotSupportedError"
    assert result["omitAlone"]["name"] == "TypeError"
    assert result["audio"]["name"] == "NotSupportedError"
    assert result["image"]["name"] == "NotSupportedError"  # the connection takes no images
    assert result["measured"] == 2
    assert result["destroyed"]["name"] == "InvalidStateError"
    assert result["original"] == 2  # nothing refused reached the binding
    assert result["window"] is None  # Infinity (JSON.stringify writes null)
    assert result["globals"] == ["function", True]


def test_overflow_and_tool_rounds_are_bounded() -> None:
    result = run(
        """
const forever = Array.from({ length: 20 }, () => ({ calls: [{ name: "t", arguments: {} }] }));
const { win, requests } = makeWindow(forever);
const LanguageModel = layer.installPromptApi(win, "NappletLanguageModel");
let executed = 0;
const tools = [{ name: "t", inputSchema: { type: "object", properties: {} }, execute: () => { executed += 1; return { ok: true }; } }];
const session = await LanguageModel.create({ tools });
const loop = await outcome(session.prompt("go"));
const rounds = requests.length;
const toolResult = requests[1].messages[2];
const plain = await LanguageModel.create({ initialPrompts: [{ role: "system", content: "s" }] });
let overflows = 0;
plain.oncontextoverflow = () => { overflows += 1; };
for (let i = 0; i < 300; i += 1) await plain.append(String(i));
const tooBig = await outcome(plain.append("x".repeat(layer.MAX_HISTORY_CHARS + 1)));
const noExecute = await outcome(LanguageModel.create({ tools: [{ name: "u", inputSchema: { type: "object" } }] }));
const badName = await outcome(LanguageModel.create({ tools: [{ name: "no spaces", execute() {} }] }));
console.log(JSON.stringify({ loop, rounds, executed, toolResult, overflows, tooBig, noExecute, badName, globals: [typeof win.LanguageModel, typeof win.NappletLanguageModel] }));
"""
    )
    assert result["loop"]["name"] == "OperationError"
    assert result["rounds"] == 8 and result["executed"] == 8
    assert result["toolResult"] == {
        "role": "toolResult",
        "toolCallId": "c0",
        "toolName": "t",
        "content": [{"type": "text", "text": '{"ok":true}'}],
    }
    assert result["overflows"] == 300 + 1 - 256
    assert result["tooBig"]["name"] == "QuotaExceededError"
    assert result["noExecute"]["name"] == "NotSupportedError"
    assert result["badName"]["name"] == "TypeError"
    assert result["globals"] == ["undefined", "function"]


def test_abort_cancels_the_generation_and_keeps_nothing() -> None:
    result = run(
        """
const { win, requests, cancels } = makeWindow([{ text: "late", delayMs: 50 }, { text: "next" }]);
const LanguageModel = layer.installPromptApi(win, "");
const session = await LanguageModel.create();
const controller = new AbortController();
const pending = outcome(session.prompt("first", { signal: controller.signal }));
while (requests.length === 0) await new Promise((resolve) => setTimeout(resolve, 1));
controller.abort();
const aborted = await pending;
const next = await session.prompt("second");
console.log(JSON.stringify({ aborted, next, cancels: cancels.length, last: requests[1].messages.map((m) => m.content[0].text) }));
"""
    )
    assert result["aborted"]["name"] == "AbortError"
    assert result["next"] == "next"
    assert result["cancels"] == 1  # the running generation was cancelled
    assert result["last"] == ["second"]  # the aborted turn was not kept


def test_create_options_and_abort_reasons() -> None:
    result = run(
        """
const { win } = makeWindow([]);
const LanguageModel = layer.installPromptApi(win, "");
const plain = await outcome(LanguageModel.create(null).then((s) => typeof s.prompt));
const reason = new Error("my reason");
const controller = new AbortController();
controller.abort(reason);
const early = await LanguageModel.create({ signal: controller.signal }).catch((e) => e === reason);
const progress = [];
await LanguageModel.create({ monitor(m) { m.addEventListener("downloadprogress", (e) => progress.push(e.loaded)); } });
const audio = await LanguageModel.availability({ expectedInputs: [{ type: "audio" }] });
const images = await outcome(LanguageModel.create({ expectedInputs: [{ type: "image" }] }).then(() => "created"));
const none = await layer.installPromptApi({ napplet: {} }, "").availability();
console.log(JSON.stringify({ plain, early, progress, audio, images, none }));
"""
    )
    assert result["plain"] == {"ok": "function"}
    assert result["early"] is True  # rejected with the signal's own reason
    assert result["progress"] == [0, 1]
    assert result["audio"] == "unavailable"
    assert result["images"] == {"ok": "created"}
    assert result["none"] == "unavailable"


@needs_node
def test_the_opt_in_content_cannot_end_the_layers_inline_script() -> None:
    """The napplet's `<meta content>` reaches the frame's script only as a known token."""
    frames = (ROOT / "dist" / "js" / "frames.js").as_uri()
    if not (ROOT / "dist" / "js" / "prompt-api-source.js").is_file():
        pytest.skip("dist/ is not built (python3 build.py build)")
    got = run_module(
        f"""
        import {{ promptApiScript }} from {json.dumps(frames)};
        const hostile = promptApiScript("</script><script>alert(1)</script>");
        const known = promptApiScript("NappletLanguageModel");
        console.log(JSON.stringify({{
          hostile: hostile.includes("</script") || hostile.includes("alert"),
          tail: known.slice(known.lastIndexOf("installPromptApi")),
        }}));
        """
    )
    assert got["hostile"] is False
    assert got["tail"].startswith('installPromptApi(window, "NappletLanguageModel")')
