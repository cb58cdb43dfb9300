"""The NAP-LLM conformance case tables, shared by the core and browser suites.

tests/unit/test_conformance_core.py (the shell under CPython) and
tests/browser/test_conformance.py (the same shell in Pyodide behind the
real page) parametrize over these tables under the same test names, so
both suites run every case; tests/unit/test_conformance_tables.py checks
that they do. Each table maps a case name (the test id) to its data.

Shapes
- Request tables (`MALFORMED_REQUESTS`, `UNSUPPORTED_INPUTS`,
  `INVALID_TOOLS`): fields merged into a valid `llm.generate` request.
- `MALFORMED_ENVELOPES`: an envelope without its `id` (the test adds one).
- `UNMET_REQUIREMENTS`: `llm.select` requirements a text-only connection
  cannot meet. `UNLISTED_MODES`: `toolChoice` values outside a connection
  offering "auto" and "none".
- `INVALID_HISTORIES`: whole message lists, sent with `tools=[WEATHER_TOOL]`.
- Provider tables (`PROVIDER_FAILURES`, `MISSING_COMPLETION`, ...): LMSP
  event scripts (or steps) for `napllm.providers.fixture.FixtureProvider`,
  with the expected outcome where it differs per case.

Every value is plain data (or a fixture step); nothing here runs a shell.
"""

from __future__ import annotations

import base64
from typing import Any

from fixtures import WEATHER_TOOL, user
from napllm.errors import ErrorCode
from napllm.lmsp import LmspEvent
from napllm.providers.fixture import (
    Crash,
    Fail,
    Stall,
    call_events,
    completed,
    incomplete,
    text_events,
    text_script,
    tool_call_script,
)

# -- shared messages and parts -------------------------------------------------

#: A 24-byte PNG (standard base64, no padding needed).
PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(16)).decode()
#: 25 bytes, so the standard encoding ends in "==" padding.
PADDED_PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(17)).decode()
assert PADDED_PNG.endswith("==")

CREATED = LmspEvent(
    event="response.created", data={"response_id": "resp_fixture", "status": "in_progress"}
)
CALL: dict[str, Any] = {
    "type": "toolCall",
    "toolCallId": "call_1",
    "name": "get_weather",
    "arguments": {"city": "B"},
}
CALL_2: dict[str, Any] = {**CALL, "toolCallId": "call_2", "arguments": {"city": "P"}}
FORCED: dict[str, Any] = {"type": "tool", "name": "get_weather"}
OTHER_TOOL: dict[str, Any] = {"name": "get_time", "parameters": {"type": "object"}}


def assistant(*parts: dict[str, Any]) -> dict[str, Any]:
    """An assistant message with `parts`."""
    return {"role": "assistant", "content": list(parts)}


def result_msg(call_id: str, text: str = "18 C", **extra: Any) -> dict[str, Any]:
    """A toolResult message answering `call_id` of get_weather with `text`."""
    return {
        "role": "toolResult",
        "toolCallId": call_id,
        "toolName": "get_weather",
        "content": [{"type": "text", "text": text}],
        **extra,
    }


def image_message(data: str, mime: str = "image/png") -> dict[str, Any]:
    """A user message with one image part."""
    return {"role": "user", "content": [{"type": "image", "mimeType": mime, "data": data}]}


#: A finished tool round followed by a new user turn (LLM-C21).
HISTORY = [user("weather?"), assistant(CALL), result_msg("call_1"), user("thanks, summarize")]
#: Replayed thinking in an earlier assistant turn (LLM-C17).
THINKING_HISTORY = [
    user("2+2?"),
    assistant(
        {"type": "thinking", "text": "PRIVATE-CHAIN add two and two"}, {"type": "text", "text": "4"}
    ),
    user("and 3+3?"),
]
#: A tool result carrying an image (LLM-C22, LLM-C23).
IMAGE_RESULT = [
    user("screenshot?"),
    assistant(CALL),
    {
        **result_msg("call_1"),
        "content": [
            {"type": "text", "text": "here"},
            {"type": "image", "mimeType": "image/png", "data": PNG},
        ],
    },
]
#: A tool whose JSON Schema uses keywords that are not NAP-LLM fields (LLM-C20).
SCHEMA_KEYWORDS_TOOL: dict[str, Any] = {
    "name": "search",
    "parameters": {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "properties": {"q": {"type": ["string", "null"], "default": None}},
        "$defs": {"x": {"type": "integer"}},
    },
}

# -- LLM-C02: malformed record, base64, enum or explicit null -> invalid-request

MALFORMED_REQUESTS: dict[str, dict[str, Any]] = {
    "unknown request field": {"stream": True},
    "explicit null temperature": {"temperature": None},
    "explicit null format": {"format": None},
    "enum format": {"format": "xml"},
    "wrong type maxTokens": {"maxTokens": "128"},
    "float maxTokens": {"maxTokens": 1.5},
    "bool temperature": {"temperature": True},
    "role enum": {"messages": [{"role": "robot", "content": [{"type": "text", "text": "x"}]}]},
    "unknown part type": {"messages": [{"role": "user", "content": [{"type": "audio"}]}]},
    "unknown part field": {
        "messages": [{"role": "user", "content": [{"type": "text", "text": "x", "lang": "en"}]}]
    },
    "null part text": {"messages": [{"role": "user", "content": [{"type": "text", "text": None}]}]},
    "empty messages": {"messages": []},
    "empty content": {"messages": [{"role": "user", "content": []}]},
    "base64 unpadded": {"messages": [image_message(PADDED_PNG.rstrip("="))]},
    "base64 whitespace": {"messages": [image_message(PNG[:8] + "\n" + PNG[8:])]},
    "base64 data uri": {"messages": [image_message("data:image/png;base64," + PNG)]},
    "base64 urlsafe": {"messages": [image_message("_-__")]},
    "image mime enum": {"messages": [image_message(PNG, "image/gif")]},
    "image mime mismatch": {"messages": [image_message(PNG, "image/jpeg")]},
}

MALFORMED_ENVELOPES: dict[str, dict[str, Any]] = {
    "generate null request": {"type": "llm.generate", "request": None},
    "generate text request": {"type": "llm.generate", "request": "text"},
    "generate null handle": {"type": "llm.generate", "request": {"handle": None, "messages": []}},
    "generate unknown field": {"type": "llm.generate", "request": {}, "extra": 1},
    "select null requirements": {"type": "llm.select", "requirements": None},
    "select wrong type": {"type": "llm.select", "requirements": {"images": "yes"}},
    "select empty model": {"type": "llm.select", "requirements": {"model": ""}},
    "select unknown requirement": {"type": "llm.select", "requirements": {"vision": True}},
    "describe null handle": {"type": "llm.describe", "handle": None},
    "cancel number requestId": {"type": "llm.cancel", "requestId": 7},
}

# -- LLM-C03: unsupported images/JSON/tools/exact model or provider input -----

UNMET_REQUIREMENTS: dict[str, dict[str, Any]] = {
    "images": {"images": True},
    "json": {"json": True},
    "tools": {"tools": True},
    "other model": {"model": "other-model"},
}

#: Sent to a text-only connection whose temperature range is at most 0..2.
UNSUPPORTED_INPUTS: dict[str, dict[str, Any]] = {
    "image": {"messages": [image_message(PNG)]},
    "json": {"format": "json"},
    "tools": {"tools": [WEATHER_TOOL]},
    "tool history": {
        "messages": [user("weather?"), assistant(CALL), result_msg("call_1"), user("thanks")]
    },
    "temperature": {"temperature": 7.5},
}

# -- LLM-C08: the selected connection changes while consent is pending -------

CONNECTION_CHANGES = ("edit", "remove")

# -- LLM-C10: missing finish marker, invalid JSON-object output ---------------

MISSING_COMPLETION: dict[str, list[Any]] = {
    "ended": [CREATED, *text_events("no marker")],
    "ended-after-wait": [CREATED, *text_events("no marker"), Stall(0.001)],
    "item-never-completed": [
        CREATED,
        LmspEvent(
            event="response.output_item.added",
            data={
                "output_index": 0,
                "item": {"id": "m", "type": "message", "role": "assistant", "content": []},
            },
        ),
        completed(),
    ],
}

#: Complete answers to a `format: "json"` request that are not one JSON object.
JSON_NOT_OBJECT: dict[str, str] = {
    "array": "[1, 2]",
    "string": '"scalar"',
    "number": "42",
    "not json": "not json",
    "trailing text": '{"a": 1} trailing',
}

# -- LLM-C11: provider failure containing input or credentials ----------------

SECRET_KEY = "sk-live-4f9a8b7c6d5e4f3a2b1c"
CREDENTIAL = "cred-3e1f-very-private-token"
OTHER_PROMPT = "the other napplet's confidential diary"

#: Failure step -> the log line the runtime keeps for the developer: a typed
#: provider rejection is logged as "provider failure", anything else the
#: provider raises as "provider or runtime failure" (a crash). The napplet
#: gets `provider-error` with the fixed safe message in every case.
PROVIDER_FAILURES: dict[str, tuple[Any, str]] = {
    "fail-detail": (
        Fail(detail=f"401 body: invalid key {SECRET_KEY} for {CREDENTIAL}: {OTHER_PROMPT}"),
        "provider failure",
    ),
    "fail-hint": (
        Fail(detail=SECRET_KEY, user_hint=f"Your key {SECRET_KEY} was rejected"),
        "provider failure",
    ),
    "crash": (
        Crash(f"Traceback ... Authorization: Bearer {CREDENTIAL} {SECRET_KEY} {OTHER_PROMPT}"),
        "provider or runtime failure",
    ),
    "response-failed": (
        LmspEvent(
            event="response.failed",
            data={
                "response_id": "resp_fixture",
                "status": "failed",
                "error": {
                    "type": "about:blank",
                    "title": f"bad key {SECRET_KEY}",
                    "status": 500,
                    "detail": f"{CREDENTIAL} {OTHER_PROMPT}",
                },
            },
        ),
        "provider failure",
    ),
    "error-event": (
        LmspEvent(event="error", data={"message": f"{SECRET_KEY} {OTHER_PROMPT}"}),
        "provider failure",
    ),
}
PROVIDER_FAILURE_CODE = ErrorCode.PROVIDER_ERROR

# -- LLM-C13: toolChoice forcing a named tool; the provider ignores it --------

IGNORED_FORCED: dict[str, list[Any]] = {
    "plain-text": text_script("I'd rather just chat."),
    "other-tool": tool_call_script([("get_time", {}, "call_9")]),
    "forced-plus-other": tool_call_script(
        [("get_weather", {"city": "B"}, "c1"), ("get_time", {}, "c2")]
    ),
}

#: toolChoice mode -> a provider answer that violates it.
VIOLATED_MODES: dict[str, list[Any]] = {
    "required": text_script("no call"),
    "none": tool_call_script([("get_weather", {"city": "B"}, "c1")]),
}

# -- LLM-C14: the provider returns no tool call id ----------------------------

#: Whether the fixture streams the call's arguments in fragments.
ARGUMENT_DELIVERY: dict[str, bool] = {"streamed": True, "whole": False}

# -- LLM-C15: completed calls under different stop labels; truncated turn ----

#: Provider stop label on a completed tool-call turn (None: no label).
STOP_LABELS: dict[str, str | None] = {
    "no label": None,
    "stop": "stop",
    "end_turn": "end_turn",
    "tool_calls": "tool_calls",
    "tool_use": "tool_use",
}

#: LMSP incomplete reason -> the NAP-LLM finish of a truncated parallel turn.
TRUNCATED_TURNS: dict[str, str] = {"max_output_tokens": "length", "content_filter": "refusal"}


def truncated_parallel_turn(reason: str) -> list[Any]:
    """Text, one complete call and one call cut off mid-arguments, then `reason`."""
    return [
        CREATED,
        *text_events("Checking both.", output_index=0),
        *call_events("get_weather", {"city": "B"}, call_id="c1", output_index=1),
        *call_events("get_weather", '{"city": "P"}', call_id="c2", output_index=2)[:1],
        LmspEvent(
            event="response.function_call_arguments.delta",
            data={"item_id": "fc_2", "output_index": 2, "delta": '{"city": "P'},
        ),
        incomplete(reason),
    ]


# -- LLM-C16: malformed / non-object arguments; unknown tool name -------------

#: (tool name, complete argument text) of a call the runtime must refuse.
INVALID_CALLS: dict[str, tuple[str, str]] = {
    "truncated": ("get_weather", '{"city": "B"'),
    "single-quotes": ("get_weather", "{'city': 'B'}"),
    "array": ("get_weather", '["B"]'),
    "string": ("get_weather", '"B"'),
    "trailing": ("get_weather", '{"city": "B"}} extra'),
    "unknown-name": ("launch_missiles", '{"city": "B"}'),
}

# -- LLM-C18: interleaved tool-call blocks ---------------------------------------


def interleaved_calls(pause: float = 0.0) -> list[Any]:
    """Two calls whose argument fragments alternate on the wire, then both complete.

    `pause` (seconds) adds a `Stall` after each fragment, so that a runtime
    that coalesces deltas over time (the page's) still streams them apart.
    """
    a = call_events("get_weather", '{"city": "Berlin"}', call_id="ca", output_index=0)
    b = call_events("get_weather", '{"city": "Paris"}', call_id="cb", output_index=1)

    def frag(index: int, text: str) -> list[Any]:
        event = LmspEvent(
            event="response.function_call_arguments.delta",
            data={"item_id": f"fc_{index}", "output_index": index, "delta": text},
        )
        return [event, Stall(pause)] if pause else [event]

    return [
        CREATED,
        a[0],
        *frag(0, '{"ci'),
        b[0],
        *frag(1, '{"city": '),
        *frag(0, 'ty": "Ber'),
        *frag(1, '"Paris"}'),
        *frag(0, 'lin"}'),
        b[-1],
        a[-1],
        completed(),
    ]


# -- LLM-C19: an unlisted tool-choice mode -----------------------------------

UNLISTED_MODES: dict[str, Any] = {"required": "required", "named": FORCED}

# -- LLM-C20: invalid tool definitions and choices ----------------------------

INVALID_TOOLS: dict[str, dict[str, Any]] = {
    "duplicate names": {"tools": [WEATHER_TOOL, WEATHER_TOOL]},
    "invalid name": {"tools": [{**WEATHER_TOOL, "name": "get weather"}]},
    "long name": {"tools": [{**WEATHER_TOOL, "name": "x" * 65}]},
    "empty name": {"tools": [{**WEATHER_TOOL, "name": ""}]},
    "choice without tools": {"toolChoice": "auto"},
    "choice with empty tools": {"tools": [], "toolChoice": "required"},
    "unknown forced name": {"tools": [WEATHER_TOOL], "toolChoice": {"type": "tool", "name": "x"}},
    "non-object schema": {"tools": [{**WEATHER_TOOL, "parameters": {"type": "array"}}]},
    "schema without type": {"tools": [{**WEATHER_TOOL, "parameters": {"properties": {}}}]},
    "malformed schema": {
        "tools": [{**WEATHER_TOOL, "parameters": {"type": "object", "properties": 3}}]
    },
    "unknown choice mode": {"tools": [WEATHER_TOOL], "toolChoice": "any"},
    "zero maxTokens": {"maxTokens": 0},
    "negative maxTokens": {"maxTokens": -5},
}

# -- LLM-C21: misplaced/duplicate/orphaned results ---------------------------

INVALID_HISTORIES: dict[str, list[dict[str, Any]]] = {
    "orphaned": [user("q"), result_msg("call_1")],
    "orphaned unknown id": [user("q"), assistant(CALL), result_msg("call_9"), result_msg("call_1")],
    "misplaced after user": [user("q"), assistant(CALL), user("wait"), result_msg("call_1")],
    "duplicate": [user("q"), assistant(CALL), result_msg("call_1"), result_msg("call_1")],
    "name mismatch": [
        user("q"),
        assistant(CALL),
        {**result_msg("call_1"), "toolName": "get_time"},
    ],
    "earlier turn": [
        user("q"),
        assistant(CALL),
        result_msg("call_1"),
        assistant({"type": "text", "text": "done"}),
        result_msg("call_1"),
    ],
    "duplicate call ids": [
        user("q"),
        assistant(CALL),
        result_msg("call_1"),
        assistant(CALL),
        result_msg("call_1"),
    ],
    "call outside assistant": [{"role": "user", "content": [CALL]}],
    "image-free toolResult with toolCall": [
        user("q"),
        assistant(CALL),
        {**result_msg("call_1"), "content": [CALL]},
    ],
    "isError on user": [{**user("q"), "isError": False}],
    "unanswered last turn": [user("q"), assistant(CALL)],
}

# -- LLM-C12: a parallel turn whose results are incomplete --------------------

_PARALLEL = [user("weather in B and P?"), assistant(CALL, CALL_2), result_msg("call_2")]
MISSING_PARALLEL_RESULTS: dict[str, list[dict[str, Any]]] = {
    "last turn": _PARALLEL,
    "earlier turn": [*_PARALLEL, user("and now?")],
}

#: Every table both suites parametrize over: name -> table.
TABLES: dict[str, Any] = {
    "MALFORMED_REQUESTS": MALFORMED_REQUESTS,
    "MALFORMED_ENVELOPES": MALFORMED_ENVELOPES,
    "UNMET_REQUIREMENTS": UNMET_REQUIREMENTS,
    "UNSUPPORTED_INPUTS": UNSUPPORTED_INPUTS,
    "CONNECTION_CHANGES": CONNECTION_CHANGES,
    "MISSING_COMPLETION": MISSING_COMPLETION,
    "JSON_NOT_OBJECT": JSON_NOT_OBJECT,
    "PROVIDER_FAILURES": PROVIDER_FAILURES,
    "MISSING_PARALLEL_RESULTS": MISSING_PARALLEL_RESULTS,
    "IGNORED_FORCED": IGNORED_FORCED,
    "VIOLATED_MODES": VIOLATED_MODES,
    "ARGUMENT_DELIVERY": ARGUMENT_DELIVERY,
    "STOP_LABELS": STOP_LABELS,
    "TRUNCATED_TURNS": TRUNCATED_TURNS,
    "INVALID_CALLS": INVALID_CALLS,
    "UNLISTED_MODES": UNLISTED_MODES,
    "INVALID_TOOLS": INVALID_TOOLS,
    "INVALID_HISTORIES": INVALID_HISTORIES,
}
