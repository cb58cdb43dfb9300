"""The one table of `<tool_call>` block bodies, shared by every user of `napllm.toolcall_text`.

`WELL_FORMED`: `(id, body, name, arguments)` with the compact arguments text
the parser returns; `MALFORMED`: `(id, body, reason)` with the fixed reason
of the `MalformedToolCall`. The parser's own tests
(tests/unit/test_toolcall_text.py), the browser engines' chat mapping
(tests/unit/test_openai_chat.py) and the LMSP service's output assembly
(tests/service/test_lmsp_service_units.py) all parametrize over these, so
the two users cannot drift apart again. Every body names `get_weather` or an
unknown tool; the offered tools are `TOOL_NAMES`.
"""

from __future__ import annotations

TOOL_NAMES = ("get_weather",)

WELL_FORMED: list[tuple[str, str, str, str]] = [
    (
        "object-arguments",
        '{"name": "get_weather", "arguments": {"city": "Berlin"}}',
        "get_weather",
        '{"city":"Berlin"}',
    ),
    (
        "string-arguments",
        '{"name": "get_weather", "arguments": "{\\"city\\": \\"Oslo\\"}"}',
        "get_weather",
        '{"city":"Oslo"}',
    ),
    (
        "parameters-key",
        '{"name": "get_weather", "parameters": {"city": "Rome"}}',
        "get_weather",
        '{"city":"Rome"}',
    ),
    ("no-arguments", '{"name": "get_weather"}', "get_weather", "{}"),
    (
        "surrounding-space",
        '\n  {"name": "get_weather", "arguments": {"x": 1.5}}  \n',
        "get_weather",
        '{"x":1.5}',
    ),
    (
        "non-ascii-kept",
        '{"name": "get_weather", "arguments": {"city": "Zürich"}}',
        "get_weather",
        '{"city":"Zürich"}',
    ),
]

MALFORMED: list[tuple[str, str, str]] = [
    ("not-json", "{not json}", "tool call is not JSON"),
    ("empty", "", "tool call is not JSON"),
    ("array", '["get_weather"]', "tool call is not an object"),
    ("no-name", '{"arguments": {}}', "tool call has no name"),
    ("name-not-text", '{"name": 3, "arguments": {}}', "tool call has no name"),
    ("empty-name", '{"name": "", "arguments": {}}', "tool call has no name"),
    (
        "both-keys",
        '{"name": "get_weather", "arguments": {}, "parameters": {}}',
        "tool call has both arguments and parameters",
    ),
    (
        "array-arguments",
        '{"name": "get_weather", "arguments": [1]}',
        "tool call arguments are not an object",
    ),
    (
        "null-arguments",
        '{"name": "get_weather", "arguments": null}',
        "tool call arguments are not an object",
    ),
    (
        "string-arguments-not-json",
        '{"name": "get_weather", "arguments": "{oops"}',
        "tool call arguments are not JSON",
    ),
    (
        "string-arguments-not-object",
        '{"name": "get_weather", "arguments": "[1]"}',
        "tool call arguments are not an object",
    ),
    # the strict reader (jsontext.read_json)
    ("nan", '{"name":"get_weather","arguments":{"x":NaN}}', "tool call is not JSON"),
    ("huge-number", '{"name":"get_weather","arguments":{"x":1e400}}', "tool call is not JSON"),
    (
        "duplicate-key",
        '{"name":"get_weather","name":"get_weather","arguments":{}}',
        "tool call is not JSON",
    ),
    (
        "infinity-in-string-arguments",
        '{"name":"get_weather","arguments":"{\\"x\\":Infinity}"}',
        "tool call arguments are not JSON",
    ),
    (
        "too-deep",
        '{"name":"get_weather","arguments":{"d":' + "[" * 60 + "1" + "]" * 60 + "}}",
        "tool call is not JSON",
    ),
    (
        "lone-surrogate",
        '{"name":"get_weather","arguments":{"s":"\\udc00"}}',
        "tool call is not JSON",
    ),
    ("trailing-data", '{"name": "get_weather"} {}', "tool call is not JSON"),
]

#: Well-formed, but names a tool that is not offered: malformed only where
#: the parser is given the offered names (the service); the runtime's
#: translation rejects it later (NAP-LLM, Tool).
UNKNOWN_TOOL = ('{"name": "launch", "arguments": {}}', "tool call names an unknown tool")


def block(body: str) -> str:
    """The body wrapped in a Hermes block, as a model writes it."""
    return f"<tool_call>\n{body}\n</tool_call>"
