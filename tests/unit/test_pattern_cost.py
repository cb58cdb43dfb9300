"""The pattern worst case on every path: the runtime (Python), the Prompt API layer (JS), parity.

A grammar-constrained provider keeps every way a `pattern` can match the
text so far alive at once; a pattern whose ways multiply stalls its other
clients. The syntactic rule refused `(a?){300}` but not the same language
written out (`a?a?a?…`, 300 copies), nor overlapping alternatives; the
automaton's adversarial walk (napllm.pattern_cost,
web/prompt-api/pattern-cost.js) refuses them, and the runtime does so
before a tool schema reaches any provider (`unsupported`).
"""

# ruff: noqa: E501  (the JavaScript embedded below keeps its natural line length)

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from nodejs import needs_node, run_module

from napllm.connection_records import Capabilities
from napllm.errors import ErrorCode, NapError
from napllm.pattern_cost import MAX_LIVE, MAX_WORK, pattern_cost, pattern_is_affordable
from napllm.records import parse_generation_request
from napllm.translate import check_supported

ROOT = Path(__file__).resolve().parents[2]
JS = ROOT / "web" / "prompt-api" / "pattern-cost.js"
LAYER = ROOT / "web" / "prompt-api" / "index.js"

#: pattern -> affordable
VECTORS: dict[str, bool] = {
    "^" + "a?" * 300 + "$": False,
    "^" + "a?" * 500 + "$": False,
    "^(a?){300}$": False,
    "^" + "(a|aa)" * 60 + "$": False,
    "^" + ".*" * 40 + "$": False,
    "^" + "[a-c]?[b-d]?" * 40 + "$": False,
    "^" + "a?" * 12 + "$": True,
    "^[a-z]{0,300}$": True,
    "^[a-z]{3,300}$": True,
    "^\\d{4}-\\d{2}-\\d{2}$": True,
    "^[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\\.[A-Za-z]{2,}$": True,
    "^(?:[a-z0-9-]{0,61}[a-z0-9])?$": True,
    "^(\\w+\\s?)*$": True,
    '^[^"]*$': True,
    "^(?=a)a$": True,
    "^(?<n>ab)c\\k<n>$": False,  # a backreference: not read
    "(a": False,
    "[a": False,
    "a{2}{3}": True,
    "^\\u{1F600}[😀-😂]+$": True,
    "x{,5}": True,
    # Too large to analyse: 3,000 alternatives repeated (9 million edges).
    "(" + "|".join(chr(0x100 + i) for i in range(3000)) + ")*": False,
    "(" + "|".join(chr(0x100 + i) for i in range(40)) + ")*": True,
}


@pytest.mark.parametrize("pattern", VECTORS, ids=[f"v{i}" for i in range(len(VECTORS))])
def test_the_runtime_measures_each_pattern(pattern: str) -> None:
    assert pattern_is_affordable(pattern) is VECTORS[pattern]


def test_written_out_repetition_costs_what_the_repeated_group_costs() -> None:
    written, grouped = pattern_cost("^" + "a?" * 300 + "$"), pattern_cost("^(a?){300}$")
    assert written == grouped
    assert written.live > MAX_LIVE or written.work > MAX_WORK


@needs_node
def test_the_layer_gives_the_same_answers_as_the_runtime() -> None:
    script = (
        f"const m = await import({json.dumps(JS.as_uri())});\n"
        f"const cases = {json.dumps(list(VECTORS))};\n"
        "const out = cases.map((p) => { try { const c = m.patternCost(p); return [c.live, c.work]; } catch { return null; } });\n"
        "console.log(JSON.stringify({ out, ok: cases.map((p) => m.patternIsAffordable(p)) }));"
    )
    result = run_module(script)
    assert result["ok"] == list(VECTORS.values())
    for pattern, measured in zip(VECTORS, result["out"], strict=True):
        try:
            cost = pattern_cost(pattern)
        except ValueError:
            assert measured is None, pattern
        else:
            assert measured == [cost.live, cost.work], pattern


@needs_node
def test_the_layer_refuses_a_written_out_repetition_in_a_schema() -> None:
    if not (ROOT / "node_modules" / "@cfworker").is_dir():
        pytest.skip("node_modules is not installed (build.py build)")
    schema = {
        "type": "object",
        "properties": {"s": {"type": "string", "pattern": "^" + "a?" * 300 + "$"}},
    }
    script = (
        f"const layer = await import({json.dumps(LAYER.as_uri())});\n"
        f"const schema = {json.dumps(schema)};\n"
        "let result;\n"
        "try { layer.compileSchema(schema, 'inputSchema'); result = 'ok'; } catch (e) { result = e.name + ': ' + e.message; }\n"
        "console.log(JSON.stringify(result));"
    )
    result = run_module(script)
    assert result.startswith("NotSupportedError") and "ambiguous" in result


def tool(pattern: str) -> dict[str, Any]:
    parameters = {"type": "object", "properties": {"s": {"type": "string", "pattern": pattern}}}
    return {"name": "t", "parameters": parameters}


def test_the_runtime_refuses_such_a_tool_schema_before_any_provider() -> None:
    messages = [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]
    caps = Capabilities(tools=True, tool_choice_modes=("auto", "none", "required", "tool"))
    hostile = parse_generation_request(
        {"handle": "h", "messages": messages, "tools": [tool("^" + "a?" * 300 + "$")]}
    )
    with pytest.raises(NapError) as info:
        check_supported(hostile, caps)
    assert info.value.code is ErrorCode.UNSUPPORTED
    assert "ambiguous" in info.value.message
    plain = parse_generation_request(
        {"handle": "h", "messages": messages, "tools": [tool("^[a-z]{0,300}$")]}
    )
    check_supported(plain, caps)
