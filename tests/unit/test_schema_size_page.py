"""A large tool schema never holds the page's one thread for long.

The page (Pyodide, one thread shared by the runtime, the shell's UI and
every napplet's requests) checks each tool's `parameters` against the
2020-12 metaschema with jschon before consent. Nothing bounds that work but
the envelope's size (8 Mi characters): a schema of a thousand plain
properties, about 44 Ki characters, already takes seconds, and the time
grows with the schema. Such a schema must be refused (`invalid-request`)
or checked quickly.
"""

from __future__ import annotations

import contextlib
import json
import time

import pytest

from napllm.records import Tool

pytest.importorskip("jschon")

WIDE = {
    "type": "object",
    "properties": {f"p{i}": {"type": "string", "minLength": 1} for i in range(1000)},
}


def test_a_wide_tool_schema_is_refused_or_checked_quickly(page_validator: None) -> None:
    assert len(json.dumps(WIDE)) < 64 * 1024
    started = time.monotonic()
    with contextlib.suppress(ValueError):  # refused is fine
        Tool(name="t", parameters=WIDE)
    assert time.monotonic() - started < 2.0


def test_the_bound_counts_every_tool_of_a_request_before_any_check(page_validator: None) -> None:
    from napllm.records import GenerationRequest
    from napllm.schema import MAX_SCHEMA_SUBSCHEMAS

    def tool(name: str, props: int) -> dict[str, object]:
        properties = {f"p{i}": {"type": "string"} for i in range(props)}
        return {"name": name, "parameters": {"type": "object", "properties": properties}}

    message = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    half = MAX_SCHEMA_SUBSCHEMAS // 2 - 1  # each tool: its root plus `half` properties
    ok = GenerationRequest(handle="h", messages=message, tools=[tool("a", half), tool("b", half)])
    assert len(ok.active_tools) == 2
    started = time.monotonic()
    with pytest.raises(ValueError, match="subschemas together"):
        GenerationRequest(
            handle="h", messages=message, tools=[tool(f"t{i}", half) for i in range(40)]
        )
    assert time.monotonic() - started < 1.0


def test_a_schema_checked_once_is_not_checked_again(page_validator: None) -> None:
    schema = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(60)}}
    Tool(name="t", parameters=schema)
    started = time.monotonic()
    for _ in range(20):
        Tool(name="t", parameters=dict(schema))
    assert time.monotonic() - started < 0.5
