"""Hostile regular expressions in a napplet's tool schema never run long in the page.

The page (Pyodide, one thread: nothing there could stop a long match)
checks a tool schema against the 2020-12 metaschema with jschon, which
compiles the schema's patterns but matches none of them against outside
text; tool-call arguments from a provider are checked to be a JSON object,
never against the napplet's schema (docs/security.md, "Regular expressions
and schema keywords from outside"). These tests run the page's validator
(jschon) with patterns that backtrack for longer than any test run if
matched (about 2**60 steps) and with arguments that would trigger them.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from harness import generate
from napcheck import ready, run

from napllm.providers.fixture import tool_call_script
from napllm.records import Tool

pytest.importorskip("jschon")

BACKTRACKING = "(?:.|.)*\\x00"
TEXT = "a" * 60

HOSTILE_SCHEMAS: dict[str, dict[str, Any]] = {
    "pattern": {"type": "object", "properties": {"s": {"type": "string", "pattern": BACKTRACKING}}},
    "not pattern": {
        "type": "object",
        "properties": {"s": {"type": "string", "not": {"pattern": BACKTRACKING}}},
    },
    "patternProperties": {"type": "object", "patternProperties": {BACKTRACKING: {}}},
    "propertyNames": {"type": "object", "propertyNames": {"pattern": BACKTRACKING}},
    "format regex": {"type": "object", "properties": {"s": {"type": "string", "format": "regex"}}},
}


@pytest.mark.parametrize("name", sorted(HOSTILE_SCHEMAS))
def test_checking_a_hostile_schema_matches_nothing(page_validator: None, name: str) -> None:
    started = time.monotonic()
    Tool(name="t", parameters=HOSTILE_SCHEMAS[name])
    assert time.monotonic() - started < 2.0


@pytest.mark.parametrize("name", sorted(HOSTILE_SCHEMAS))
async def test_arguments_are_never_matched_against_the_napplets_patterns(
    page_validator: None, name: str
) -> None:
    h, fx, ep, handle = await ready()
    # Arguments that take the backtracking path wherever a pattern could apply.
    arguments = {"s": TEXT, TEXT: 1}
    fx.queue(tool_call_script([("t", arguments, "c1")]))
    tool = {"name": "t", "description": "x", "parameters": HOSTILE_SCHEMAS[name]}
    envelope = generate("g1", handle, tools=[tool], toolChoice={"type": "tool", "name": "t"})
    started = time.monotonic()
    result = await run(h, ep, envelope)
    assert time.monotonic() - started < 2.0
    assert result["result"]["finish"] == "toolUse"
