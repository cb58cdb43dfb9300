"""Every JSON Schema keyword the service accepts is enforced by the grammar or refused first.

`{"type": "integer", "minimum": 100, "maximum": 105}` was accepted, the
grammar dropped the bounds, the model wrote another integer and the
request ended 500 `model_output_invalid` after the whole generation. Each
keyword the converter drops is now refused before generating (400
`unsupported_capability` naming it, schema_keywords.py); each keyword it
keeps still builds and is shown to constrain the grammar.

Integer bounds are now enforced: the grammar writes only the digits of
the range (schema_grammar.py), and every enforced keyword is shown to
let the valid texts through and stop the invalid ones (`ENFORCED_TEXTS`,
checked on a model of llama.cpp's grammar sampler, grammar_accept.py).
`{"const": "\u0000"}` answered 500: the converter wrote the JSON escape
into a GBNF literal without escaping its backslash, so the grammar asked
for a raw NUL character; every backslash is escaped now.
"""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import jsonschema
import pytest
from tests.service.conftest import LmspServiceHandle

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")

from tests.service.grammar_accept import grammar_accepts

from napllm.lmsp import FunctionTool
from napllm.lmsp_service.grammar import (
    MAX_CHAR_WORK,
    MAX_LIVE_STACKS,
    GrammarUnavailable,
    json_grammar,
    tool_call_grammar,
)
from napllm.lmsp_service.grammar_cost import parse_gbnf, worst_case
from napllm.lmsp_service.schema_keywords import unenforced_keyword

#: keyword -> a schema whose validity depends on it, which the converter drops
REFUSED: dict[str, dict[str, Any]] = {
    "minimum": {"type": "number", "minimum": 100, "maximum": 105},
    "maximum": {"type": "number", "maximum": 5},
    "exclusiveMinimum": {"type": "number", "exclusiveMinimum": 0},
    "exclusiveMaximum": {"type": "number", "exclusiveMaximum": 1},
    "multipleOf": {"type": "integer", "multipleOf": 3},
    "uniqueItems": {"type": "array", "items": {"type": "integer"}, "uniqueItems": True},
    "minProperties": {"type": "object", "minProperties": 1},
    "maxProperties": {"type": "object", "maxProperties": 1},
    "contains": {"type": "array", "contains": {"type": "integer"}},
    "minContains": {"type": "array", "minContains": 2},
    "maxContains": {"type": "array", "maxContains": 2},
    "not": {"type": "integer", "not": {"const": 3}},
    "if": {"type": "object", "if": {"required": ["a"]}, "then": {"required": ["b"]}},
    "dependentRequired": {"type": "object", "dependentRequired": {"a": ["b"]}},
    "dependentSchemas": {"type": "object", "dependentSchemas": {"a": {"required": ["b"]}}},
    "propertyNames": {"type": "object", "propertyNames": {"pattern": "^a"}},
    "patternProperties": {"type": "object", "patternProperties": {"^a": {"type": "integer"}}},
    "unevaluatedProperties": {"type": "object", "unevaluatedProperties": False},
    "unevaluatedItems": {"type": "array", "unevaluatedItems": False},
    "oneOf": {"oneOf": [{"type": "integer"}, {"type": "number"}]},
}
#: keyword -> a schema using it that builds (the grammar keeps it, or it is an annotation)
KEPT: dict[str, tuple[dict[str, Any], str]] = {
    "type": ({"type": "boolean"}, "true"),
    "properties": ({"type": "object", "properties": {"zq": {"type": "string"}}}, "zq"),
    "required": (
        {"type": "object", "properties": {"zq": {"type": "string"}}, "required": ["zq"]},
        "zq",
    ),
    "additionalProperties": (
        {"type": "object", "additionalProperties": {"type": "integer"}},
        "additional",
    ),
    "items": ({"type": "array", "items": {"const": "zq"}}, "zq"),
    "prefixItems": ({"type": "array", "prefixItems": [{"const": "zq"}]}, "zq"),
    "minItems": ({"type": "array", "items": {"const": "zq"}, "minItems": 3}, "zq"),
    "maxItems": ({"type": "array", "items": {"const": "zq"}, "maxItems": 3}, "zq"),
    "enum": ({"enum": ["zq", 1, None]}, "zq"),
    "const": ({"const": {"zq": 1}}, "zq"),
    "anyOf": ({"anyOf": [{"const": "zq"}, {"type": "integer"}]}, "zq"),
    "allOf": ({"allOf": [{"type": "object", "properties": {"zq": {"type": "integer"}}}]}, "zq"),
    "$ref": ({"$defs": {"zq": {"const": "zqv"}}, "$ref": "#/$defs/zq"}, "zqv"),
    "pattern": ({"type": "string", "pattern": "^zq[0-9]$"}, '"z" "q"'),
    "minLength": ({"type": "string", "minLength": 3}, "char"),
    "maxLength": ({"type": "string", "maxLength": 3}, "char"),
    "oneOf (distinct consts)": ({"oneOf": [{"const": "zq"}, {"const": "zr"}]}, "zq"),
    "format (an annotation)": ({"type": "string", "format": "email"}, "char"),
    "annotations": (
        {"type": "string", "title": "t", "description": "d", "default": "x", "examples": ["y"]},
        "char",
    ),
    "uniqueItems: false": ({"type": "array", "items": {"const": "zq"}, "uniqueItems": False}, "zq"),
}


@pytest.mark.parametrize("keyword", REFUSED)
def test_a_keyword_the_grammar_drops_is_refused_naming_it(keyword: str) -> None:
    schema = REFUSED[keyword]
    assert unenforced_keyword(schema) == keyword
    with pytest.raises(GrammarUnavailable, match=f"keyword {keyword}\\b"):
        json_grammar(schema)
    parameters = {"type": "object", "properties": {"v": schema}, "required": ["v"]}
    with pytest.raises(GrammarUnavailable, match=f"keyword {keyword}\\b"):
        tool_call_grammar([FunctionTool(name="t", parameters=parameters)])


#: A kept keyword in a place the converter does not read it (its branch of
#: the schema is taken by another keyword): the grammar dropped it and the
#: model could write what the schema rejects. id -> (schema, the keyword).
DROPPED_BY_BRANCH: dict[str, tuple[dict[str, Any], str]] = {
    "maxItems without items": ({"type": "array", "maxItems": 1}, "maxItems"),
    "maxLength under a type list": ({"type": ["string", "null"], "maxLength": 2}, "maxLength"),
    "maxLength beside pattern": (
        {"type": "string", "pattern": "^a*$", "maxLength": 3},
        "maxLength",
    ),
    "maxItems beside prefixItems": (
        {"type": "array", "prefixItems": [{"type": "integer"}], "maxItems": 0},
        "maxItems",
    ),
    "required without properties": ({"type": "object", "required": ["a"]}, "required"),
    "integer bounds under a type list": (
        {"type": ["integer", "null"], "minimum": 0},
        "minimum",
    ),
    "integer bounds beside enum": ({"type": "integer", "enum": [1, 9], "maximum": 5}, "maximum"),
    "bounds without a type": ({"minimum": 3}, "minimum"),
    "draft 4's boolean exclusiveMinimum": (
        {"type": "integer", "minimum": 0, "exclusiveMinimum": True},
        "exclusiveMinimum",
    ),
    "sibling of $ref": (
        {"$defs": {"s": {"type": "string"}}, "$ref": "#/$defs/s", "maxLength": 1},
        "maxLength",
    ),
}


@pytest.mark.parametrize("case", DROPPED_BY_BRANCH)
def test_a_kept_keyword_where_the_converter_does_not_read_it_is_refused(case: str) -> None:
    schema, keyword = DROPPED_BY_BRANCH[case]
    with pytest.raises(GrammarUnavailable, match=f"keyword {keyword}\\b"):
        json_grammar(schema)
    # Where the converter does read them, the same keywords still build.
    json_grammar({"type": "string", "format": "email", "maxLength": 5})
    json_grammar({"type": "array", "items": {"type": "integer"}, "maxItems": 1})


@pytest.mark.parametrize("keyword", KEPT)
def test_a_keyword_the_grammar_keeps_still_builds(keyword: str) -> None:
    schema, marker = KEPT[keyword]
    assert unenforced_keyword(schema) is None
    assert marker in json_grammar(schema)  # the keyword shaped the grammar


def test_keyword_names_inside_data_or_property_names_are_not_keywords() -> None:
    schema = {
        "type": "object",
        "properties": {"not": {"type": "string"}, "minimum": {"const": {"not": 1}}},
        "default": {"oneOf": 1},
    }
    assert unenforced_keyword(schema) is None
    json_grammar(schema)


#: id -> (schema, JSON texts it allows, JSON texts it rejects): each keyword
#: the grammar enforces lets the first through and stops the second.
ENFORCED_TEXTS: dict[str, tuple[dict[str, Any], list[str], list[str]]] = {
    "minimum and maximum": (
        {"type": "integer", "minimum": 100, "maximum": 105},
        ["100", "103", "105"],
        ["99", "106", "1000", "10", "-100", "0100", "104.0"],
    ),
    "minimum alone": ({"type": "integer", "minimum": -7}, ["-7", "0", "12345"], ["-8", "-70"]),
    "maximum alone": ({"type": "integer", "maximum": -12}, ["-12", "-99999"], ["-11", "0", "12"]),
    "exclusiveMinimum": (
        {"type": "integer", "exclusiveMinimum": 0},
        ["1", "20"],
        ["0", "-0", "-1"],
    ),
    "exclusiveMaximum": (
        {"type": "integer", "exclusiveMinimum": -3, "exclusiveMaximum": 3},
        ["-2", "0", "2"],
        ["-3", "3", "-0"],
    ),
    "fractional bounds": (
        {"type": "integer", "minimum": 1.5, "maximum": 4.5},
        ["2", "4"],
        ["1", "5"],
    ),
    "a negative range": (
        {"type": "integer", "minimum": -1005, "maximum": -998},
        ["-1005", "-1000", "-999", "-998"],
        ["-1006", "-997", "998", "-99"],
    ),
    "a wide range": (
        {"type": "integer", "minimum": -(10**15), "maximum": 10**15},
        ["-1000000000000000", "0", "999999999999999", "1000000000000000"],
        ["-1000000000000001", "1000000000000001", "10000000000000000"],
    ),
    "const string with control characters and escapes": (
        {"const": '\u0000a\\b"c\n\u001f'},
        ['"\\u0000a\\\\b\\"c\\n\\u001f"'],
        ['"\u0000a\\\\b\\"c\\n\\u001f"', '"a"'],
    ),
    "const of each JSON type": (
        {"anyOf": [{"const": 1.5}, {"const": True}, {"const": None}, {"const": [1, "x"]}]},
        ["1.5", "true", "null", '[1, "x"]'],
        ["1", "false", '[1, "y"]'],
    ),
    "const object": ({"const": {"a\\": {"b": [None]}}}, ['{"a\\\\": {"b": [null]}}'], ['{"a": 1}']),
    "enum of any type": (
        {"enum": ['a"', 2, False, None, {"k": []}, ["\t"]]},
        ['"a\\""', "2", "false", "null", '{"k": []}', '["\\t"]'],
        ['"a"', "3", "true", '{"k": [1]}', '["\t"]'],
    ),
    "nested $ref and $defs": (
        {
            "$defs": {
                "leaf": {"type": "integer", "minimum": 1, "maximum": 3},
                "pair": {
                    "type": "object",
                    "properties": {"x": {"$ref": "#/$defs/leaf"}},
                    "required": ["x"],
                    "additionalProperties": False,
                },
            },
            "type": "array",
            "items": {"$ref": "#/$defs/pair"},
        },
        ['[{"x": 1}, {"x": 3}]', "[]"],
        ['[{"x": 4}]', '[{"y": 1}]', '[{"x": 1, "y": 2}]'],
    ),
    "additionalProperties schema": (
        {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0}},
        ['{"a": 1, "b": 0}', "{}"],
        ['{"a": -1}', '{"a": "x"}'],
    ),
    "additionalProperties false": (
        {"type": "object", "properties": {"a": {"type": "boolean"}}, "additionalProperties": False},
        ['{"a": true}', "{}"],
        ['{"b": true}'],
    ),
    "minItems and maxItems": (
        {"type": "array", "items": {"type": "boolean"}, "minItems": 1, "maxItems": 2},
        ["[true]", "[true, false]"],
        ["[]", "[true, true, true]"],
    ),
    "minLength and maxLength": (
        {"type": "string", "minLength": 2, "maxLength": 3},
        ['"ab"', '"abc"', '"\\n\\u00e9"'],
        ['"a"', '"abcd"', '""'],
    ),
    "format date": ({"type": "string", "format": "date"}, ['"2024-02-28"'], ['"2024-2-28"', '"x"']),
    "format time": (
        {"type": "string", "format": "time"},
        ['"23:59:59Z"', '"01:02:03.123+05:30"'],
        ['"24:00:00Z"', '"12:00"'],
    ),
    "format date-time": (
        {"type": "string", "format": "date-time"},
        ['"2024-02-28T12:00:00Z"'],
        ['"2024-02-28 12:00:00Z"'],
    ),
    "format uuid": (
        {"type": "string", "format": "uuid"},
        ['"123e4567-e89b-12d3-a456-426614174000"'],
        ['"123e4567e89b12d3a456426614174000"'],
    ),
    "pattern with regex escapes": (
        {"type": "string", "pattern": "^\\d{3}-[a-z]\\.\\w$"},
        ['"123-a.b"', '"000-z._"'],
        ['"123-a-b"', '"12-a.b"', '"123-a.bc"'],
    ),
    "pattern allowing quotes, backslashes and control characters": (
        {"type": "string", "pattern": "^[^a]{2}$"},
        ['"\\"\\\\"', '"\\u0001b"', '"\\n\\t"', '"é☕"'],
        ['"""', '"\\"a"', '"\u0001b"', '"b"'],
    ),
    "pattern with a literal backslash and quote": (
        {"type": "string", "pattern": '^a\\\\"$'},
        ['"a\\\\\\""'],
        ['"a\\""', '"a\\\\"'],
    ),
    "pattern with any character": (
        {"type": "string", "pattern": "^x.$"},
        ['"x\\""', '"x\\u001f"', '"xé"'],
        ['"x\\n"', '"x\u2028"', '"x"'],
    ),
    "property names with escapes": (
        {"type": "object", "properties": {'q"\\': {"const": 1}}, "required": ['q"\\']},
        ['{"q\\"\\\\": 1}'],
        ['{"q\\"\\": 1}'],
    ),
}


@pytest.mark.parametrize("case", ENFORCED_TEXTS)
def test_an_enforced_keyword_lets_valid_texts_through_and_stops_the_others(case: str) -> None:
    schema, valid, invalid = ENFORCED_TEXTS[case]
    gbnf = json_grammar(schema)
    validator = jsonschema.validators.validator_for(schema)(schema)
    for text in valid:
        assert validator.is_valid(json.loads(text)), text  # the table itself is right
        assert grammar_accepts(gbnf, text), text
    for text in invalid:
        assert not grammar_accepts(gbnf, text), text
    # The same schema in a tool's parameters (its `$defs` at their root) enforces the same.
    inner = {key: value for key, value in schema.items() if key != "$defs"}
    parameters = {"type": "object", "properties": {"v": inner}, "required": ["v"]}
    if "$defs" in schema:
        parameters["$defs"] = schema["$defs"]
    tools = [FunctionTool(name="t", parameters=parameters)]
    gbnf = tool_call_grammar(tools)
    for text in valid:
        assert grammar_accepts(
            gbnf, f'<tool_call>\n{{"name": "t", "arguments": {{"v": {text}}}}}\n</tool_call>'
        )
    for text in invalid:
        assert not grammar_accepts(
            gbnf, f'<tool_call>\n{{"name": "t", "arguments": {{"v": {text}}}}}\n</tool_call>'
        )


def test_references_resolve_in_schema_positions_only_each_to_its_own_rule() -> None:
    # `$ref` inside const data is data: the converter used to rewrite it.
    data = {"$ref": "#/properties"}
    gbnf = json_grammar({"type": "object", "properties": {"a": {"const": data}}, "required": ["a"]})
    assert grammar_accepts(gbnf, '{"a": {"$ref": "#/properties"}}')
    # `#/$defs/x` beside a property `x` took that property's rule (a string).
    schema = {
        "type": "object",
        "properties": {"x": {"type": "string"}, "y": {"$ref": "#/$defs/x"}},
        "required": ["x", "y"],
        "$defs": {"x": {"type": "integer", "minimum": 3}},
    }
    gbnf = json_grammar(schema)
    assert grammar_accepts(gbnf, '{"x": "s", "y": 3}')
    assert not grammar_accepts(gbnf, '{"x": "s", "y": "s"}')
    # A recursive reference.
    tree = {"$defs": {"n": {"type": "object", "properties": {"k": {"$ref": "#/$defs/n"}}}}}
    gbnf = json_grammar({**tree, "$ref": "#/$defs/n"})
    assert grammar_accepts(gbnf, '{"k": {"k": {}}}')


def test_each_tools_references_are_relative_to_its_own_parameters() -> None:
    def tool(name: str, low: int) -> FunctionTool:
        return FunctionTool(
            name=name,
            parameters={
                "$defs": {"n": {"type": "integer", "minimum": low, "maximum": low + 1}},
                "type": "object",
                "properties": {"v": {"$ref": "#/$defs/n"}},
                "required": ["v"],
            },
        )

    gbnf = tool_call_grammar([tool("a", 10), tool("b", 20)])
    call = '<tool_call>\n{{"name": "{}", "arguments": {{"v": {}}}}}\n</tool_call>'
    assert grammar_accepts(gbnf, call.format("a", 11))
    assert grammar_accepts(gbnf, call.format("b", 20))
    assert not grammar_accepts(gbnf, call.format("a", 20))
    assert not grammar_accepts(gbnf, call.format("b", 11))


def test_integer_ranges_of_every_shape_match_exactly_their_integers() -> None:
    ranges = [(0, 0), (-1, -1), (-9, 9), (7, 1234), (-999, 12), (-105, -100), (10, 99), (19, 91)]
    ranges += [(-3001 + 97 * i, -3001 + 211 * i) for i in range(30)]
    for low, high in ranges:
        gbnf = json_grammar({"type": "integer", "minimum": low, "maximum": high})
        for number in range(low - 120, high + 121):
            assert grammar_accepts(gbnf, str(number)) == (low <= number <= high), (
                low,
                high,
                number,
            )


def test_wide_integer_ranges_build_within_the_grammar_budgets() -> None:
    for schema in (
        {"type": "integer", "minimum": -(10**15), "maximum": 10**15},
        {"type": "integer", "minimum": -(2**53), "maximum": 2**53},
        {"type": "integer", "exclusiveMinimum": -1e300},
        {"type": "integer", "maximum": 1e300},
    ):
        cost = worst_case(parse_gbnf(json_grammar(schema)), MAX_LIVE_STACKS, MAX_CHAR_WORK)
        assert not cost.over
        assert cost.live <= 32


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "integer", "minimum": 5, "maximum": 4},
        {"type": "integer", "exclusiveMinimum": 4, "exclusiveMaximum": 5},
        {"type": "integer", "minimum": 1e300},
    ],
)
def test_integer_bounds_the_grammar_cannot_meet_are_refused_naming_them(
    schema: dict[str, Any],
) -> None:
    with pytest.raises(GrammarUnavailable, match="integer bounds"):
        json_grammar(schema)


@pytest.mark.parametrize(
    ("pattern", "feature"),
    [
        ("^a(?=b)b$", "lookaround"),
        ("^\\bx$", "assertion"),
        ("^[\\S]$", "negated shorthand inside a class"),
        ("^\\01$", "octal escape"),
        ("^a{,3}$", "brace that is not a repetition count"),
        ("^a*+$", "quantifier after a quantifier"),
        ("^[]a]$", "class that starts with ]"),
        ("^[a&&b]$", "set operation inside a class"),
        ("^a", "anchors"),
        ("^a^b$", "anchor inside"),
    ],
)
def test_a_pattern_the_grammar_cannot_write_exactly_is_refused_naming_it(
    pattern: str, feature: str
) -> None:
    with pytest.raises(GrammarUnavailable, match=f"keyword pattern with .*{feature}"):
        json_grammar({"type": "string", "pattern": pattern})


def _post(service: LmspServiceHandle, schema: dict[str, Any]) -> httpx.Response:
    message = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "n?"}]}
    fmt = {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}}
    request = {
        "model": service.model_id,
        "input": [message],
        "response_format": fmt,
        "temperature": 0,
        "max_output_tokens": 64,
    }
    with service.client(timeout_s=120) as http:
        return http.post("/responses", json=request)


def _output_json(answer: httpx.Response) -> Any:
    assert answer.status_code == 200, answer.text
    texts = [
        part["text"]
        for item in answer.json()["output"]
        if item["type"] == "message"
        for part in item["content"]
    ]
    return json.loads("".join(texts))


def test_the_service_keeps_the_issues_integer_bounds_while_generating(
    lmsp_service: LmspServiceHandle,
) -> None:
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 100, "maximum": 105}},
        "required": ["n"],
    }
    value = _output_json(_post(lmsp_service, schema))
    assert isinstance(value["n"], int) and 100 <= value["n"] <= 105


def test_the_service_writes_a_control_character_const(lmsp_service: LmspServiceHandle) -> None:
    assert _output_json(_post(lmsp_service, {"const": "\u0000"})) == "\u0000"


def test_the_service_writes_a_pattern_with_regex_escapes(lmsp_service: LmspServiceHandle) -> None:
    value = _output_json(_post(lmsp_service, {"type": "string", "pattern": "^\\d{2}\\.\\d$"}))
    assert re.fullmatch(r"\d{2}\.\d", value)


def test_the_service_refuses_a_bound_it_cannot_enforce_before_generating(
    lmsp_service: LmspServiceHandle,
) -> None:
    answer = _post(lmsp_service, {"type": "number", "minimum": 0.5})
    assert answer.status_code == 400, answer.text
    assert answer.json()["code"] == "unsupported_capability"
    assert "minimum" in answer.json()["detail"]


def test_a_bound_beyond_exact_integers_is_refused_by_the_body_reader(
    lmsp_service: LmspServiceHandle,
) -> None:
    answer = _post(lmsp_service, {"type": "integer", "minimum": 2**53 + 1})
    assert answer.status_code == 400, answer.text
    assert "too large to represent exactly" in answer.json()["detail"]
