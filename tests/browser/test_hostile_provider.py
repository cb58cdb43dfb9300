"""Hostile provider output in the real shell (napllm in Pyodide, web/ in Chromium).

Pyodide runs what CPython runs, but fails differently: pydantic's serializer
stops at 49 levels there, a 10,000-level `json.loads` overflows the
WebAssembly stack (a fatal error for the whole page), and strings cross into
JavaScript as UTF-16. Each hostile output below is scripted into the fixture
provider; the napplet must get exactly one terminal result with the right
code, nothing it receives may hold a lone surrogate, and the shell must keep
serving afterwards. The shared JSON Schema vectors run through jschon here.
docs/security.md ("Provider output") points to these tests.

This module stays on the test build (``fx-full`` and ``napllmTest.queue``):
the hostile outputs are malformed LMSP event sequences, and the product's
scripted connection only plays well-formed turns, by design.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from shellpage import (
    Napplet,
    ShellPage,
    check_generation,
    generate,
)

from napllm.errors import SAFE_MESSAGES, ErrorCode
from napllm.lmsp import LmspEvent
from napllm.providers.fixture import call_events, completed, text_script

pytestmark = pytest.mark.browser

FULL = "Fixture (all capabilities)"
RID = "resp_fixture"
CREATED = LmspEvent(event="response.created", data={"response_id": RID, "status": "in_progress"})
WEATHER_TOOL = {
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
VECTORS = json.loads(
    (Path(__file__).resolve().parents[1] / "unit" / "schema_vectors.json").read_text()
)


def ev(name: str, **data: Any) -> LmspEvent:
    return LmspEvent(event=name, data={"response_id": RID, **data})


def message(deltas: list[str], final: str) -> list[LmspEvent]:
    item = {"id": "msg_0", "type": "message", "role": "assistant"}
    return [
        ev("response.output_item.added", output_index=0, item={**item, "content": []}),
        *[ev("response.output_text.delta", item_id="msg_0", delta=d) for d in deltas],
        ev(
            "response.output_item.done",
            output_index=0,
            item={**item, "content": [{"type": "output_text", "text": final}]},
        ),
    ]


def nested(depth: int) -> str:
    """Arguments nested `depth` levels (the object counts as one)."""
    return '{"d":' + "[" * (depth - 1) + "1" + "]" * (depth - 1) + "}"


#: (name, script, request fields, expected error code or the expected content)
CASES: list[tuple[str, list[Any], dict[str, Any], Any]] = [
    (
        "arguments nested 50 deep (pydantic's limit in Pyodide)",
        [CREATED, *call_events("get_weather", nested(50)), completed()],
        {"tools": [WEATHER_TOOL]},
        ErrorCode.PROVIDER_ERROR,
    ),
    (
        "arguments nested 10,000 deep (the WebAssembly stack)",
        [CREATED, *call_events("get_weather", nested(10_000)), completed()],
        {"tools": [WEATHER_TOOL]},
        ErrorCode.PROVIDER_ERROR,
    ),
    (
        "NaN in arguments",
        [CREATED, *call_events("get_weather", '{"x":NaN}'), completed()],
        {"tools": [WEATHER_TOOL]},
        ErrorCode.PROVIDER_ERROR,
    ),
    (
        "1e400 in arguments",
        [CREATED, *call_events("get_weather", '{"x":1e400}'), completed()],
        {"tools": [WEATHER_TOOL]},
        ErrorCode.PROVIDER_ERROR,
    ),
    (
        "lone surrogate in arguments",
        [CREATED, *call_events("get_weather", '{"city":"\ud83d"}'), completed()],
        {"tools": [WEATHER_TOOL]},
        ErrorCode.PROVIDER_ERROR,
    ),
    (
        "format json answer nested 10,000 deep",
        text_script(nested(10_000)),
        {"format": "json"},
        ErrorCode.PROVIDER_ERROR,
    ),
    (
        "surrogate pair split across deltas",
        [CREATED, *message(["Hi \ud83d", "\ude00"], "Hi \ud83d\ude00"), completed()],
        {},
        [{"type": "text", "text": "Hi \U0001f600"}],
    ),
    (
        "lone surrogates never completed",
        [CREATED, *message(["a\ud83d", "b\ude00"], "a\ud83db\ude00"), completed()],
        {},
        [{"type": "text", "text": "a\ufffdb\ufffd"}],
    ),
    (
        "arguments nested 40 deep (the accepted limit)",
        [CREATED, *call_events("get_weather", nested(40), call_id="call_1"), completed()],
        {"tools": [WEATHER_TOOL]},
        [
            {
                "type": "toolCall",
                "toolCallId": "call_1",
                "name": "get_weather",
                "arguments": json.loads(nested(40)),
            }
        ],
    ),
]


def ready(shell: ShellPage) -> tuple[Napplet, str]:
    app = shell.open_napplet()
    handle = app.select(FULL)
    return app, handle


#: Counts the strings (keys included) the frame received that are not
#: well-formed UTF-16, checked in the frame itself: a lone surrogate could
#: be replaced on its way back to the test.
ILL_FORMED = """() => {
  let bad = 0;
  const walk = (v) => {
    if (typeof v === 'string') { if (!v.isWellFormed()) bad += 1; }
    else if (Array.isArray(v)) { v.forEach(walk); }
    else if (v && typeof v === 'object') {
      for (const [k, x] of Object.entries(v)) { if (!k.isWellFormed()) bad += 1; walk(x); }
    }
  };
  walk(window.probe.envelopes());
  return bad;
}"""


def test_each_hostile_output_gets_one_terminal_result_and_the_shell_keeps_serving(
    shell: ShellPage,
) -> None:
    app, handle = ready(shell)
    for index, (_name, script, fields, _expected) in enumerate(CASES):
        shell.queue("fx-full", script)
        app.post(generate(f"g{index}", handle, **fields))
        if index == 0:
            shell.remember()
        app.wait_for(f"g{index}")
    envelopes = app.quiet()
    assert app.evaluate(ILL_FORMED) == 0
    for index, (name, _script, _fields, expected) in enumerate(CASES):
        result = check_generation(envelopes, f"g{index}")  # exactly one, deltas in order
        if isinstance(expected, ErrorCode):
            message_ = SAFE_MESSAGES[expected]
            assert result.get("error") == {"code": expected.value, "message": message_}, name
        else:
            assert result["result"]["content"] == expected, name
    # a late cancel of a settled request answers false; the shell still serves
    app.post({"type": "llm.cancel", "id": "c0", "requestId": "g0"})
    assert app.wait_for("c0", "llm.cancel.result")["cancelled"] is False
    shell.queue("fx-full", text_script("still here"))
    after = app.run(generate("after", handle), allow=None)
    assert after["result"]["content"] == [{"type": "text", "text": "still here"}]
    other, other_handle = ready(shell)
    shell.queue("fx-full", text_script("and here"))
    # the same napplet (same bytes): the standing grant covers its new tab
    assert other.run(generate("g", other_handle), allow=None)["result"]["finish"] == "stop"


def test_shared_schema_vectors_under_jschon(shell: ShellPage) -> None:
    """The `$schema` dialect rule and the other vectors decide `invalid-request` in Pyodide
    exactly as under CPython (tests/unit/test_schema_port.py)."""
    app, handle = ready(shell)
    cases = [c for c in VECTORS["schemas"] if c["schema"].get("type") == "object"]
    allowed = False
    for index, case in enumerate(cases):
        tool = {"name": "t", "parameters": case["schema"]}
        if case["valid"]:
            shell.queue("fx-full", text_script("ok"))
        app.post(generate(f"v{index}", handle, tools=[tool], toolChoice="none"))
        if case["valid"] and not allowed:
            shell.remember()
            allowed = True
        result = app.wait_for(f"v{index}")
        if case["valid"]:
            assert "result" in result, case["name"]
        else:
            assert result["error"]["code"] == "invalid-request", case["name"]
