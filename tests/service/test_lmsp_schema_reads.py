"""A schema the service accepts never ends 500 after generating (docs/lmsp.md 2.5).

Found by an attack on the service, each answered 500 before:
- the converter's own primitives let through text the output check
  refuses: a raw control character in a plain `{"type": "string"}` (a
  model wrote a raw newline at temperature 0), a lone surrogate escape,
  an integer of 16 digits beyond 2**53, an exponent that overflows;
- a property named `""` at the top level took over the grammar's root;
- keywords the converter reads only in part: `type` beside `const`,
  `anyOf` or `$ref`; `oneOf` beside `anyOf`; `required` naming a missing
  property; `allOf` branches that are not plain objects; a `$ref` into
  data or percent-encoded; `$id` below the root;
- empty length and item ranges, left-recursive references (llama.cpp
  refuses those grammars only once generation starts), a tool whose
  parameters are not an object schema;
- an older draft's `$schema` made the output check enforce keywords
  (`dependencies`) that the grammar read as annotations;
- a tool with a property named `root` was refused as recursive.
Each is now enforced by the grammar or refused with 400 before generating.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import jsonschema
import pytest
from tests.service.conftest import LmspServiceHandle

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")

from tests.service.grammar_accept import grammar_accepts

from napllm.lmsp import FunctionTool
from napllm.lmsp_service.grammar import GrammarUnavailable, json_grammar, tool_call_grammar
from napllm.lmsp_service.validation import OutputFacts, check_output

#: id -> (schema, texts the grammar must accept, texts it must refuse)
OUTPUT_READABLE: dict[str, tuple[dict[str, Any], list[str], list[str]]] = {
    "plain string": (
        {"type": "string"},
        ['"a b"', '"\\n\\t"', '"\\u00e9"', '"é☕"', '"\\ud7ff"', '"\\ue000"'],
        ['"a\nb"', '"\u0001"', '"\\ud800"', '"\\uDC00"'],
    ),
    "string with lengths": (
        {"type": "string", "minLength": 1, "maxLength": 3},
        ['"ab"', '"\\n"'],
        ['"a\nb"', '"\\udfff"'],
    ),
    "plain integer": (
        {"type": "integer"},
        ["0", "-5", "999999999999999", "-999999999999999"],
        ["9277777777777777", "1000000000000000"],
    ),
    "plain number": (
        {"type": "number"},
        ["1e10", "-1.5E-99", "0.5", "123456789012345.125"],
        ["1e400", "1e100000", "9277777777777777"],
    ),
    "an integer range beyond the edge of the plain rule": (
        {"type": "integer", "minimum": 9 * 10**15},
        ["9000000000000000", "9007199254740991"],
        ["9007199254740992", "10000000000000000"],
    ),
    "a property named empty": (
        {"type": "object", "properties": {"": {"const": 5}}},
        ['{"": 5}', "{}"],
        ["5", '{"": 6}'],
    ),
}


@pytest.mark.parametrize("case", OUTPUT_READABLE)
def test_the_grammar_writes_only_what_the_output_check_reads(case: str) -> None:
    schema, valid, invalid = OUTPUT_READABLE[case]
    gbnf = json_grammar(schema)
    for text in valid:
        assert grammar_accepts(gbnf, text), text
    for text in invalid:
        assert not grammar_accepts(gbnf, text), text


#: id -> (schema, the keyword named in the refusal)
READ_IN_PART: dict[str, tuple[dict[str, Any], str]] = {
    "type beside const": ({"type": "string", "const": 1}, "type"),
    "type beside enum": ({"type": "string", "enum": [1, "x"]}, "type"),
    "type beside anyOf": (
        {"type": "string", "anyOf": [{"type": "integer"}, {"type": "string"}]},
        "type",
    ),
    "type beside $ref": (
        {"type": "string", "$ref": "#/$defs/i", "$defs": {"i": {"type": "integer"}}},
        "type",
    ),
    "a type list beside anyOf": (
        {"type": ["string", "null"], "anyOf": [{"type": "integer"}, {"type": "null"}]},
        "type",
    ),
    "oneOf beside anyOf": (
        {"oneOf": [{"const": 1}, {"const": 2}], "anyOf": [{"const": 3}]},
        "anyOf",
    ),
    "required not in properties": (
        {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["b"]},
        "required",
    ),
    "required with empty properties": ({"properties": {}, "required": ["b"]}, "required"),
    "allOf of an integer": ({"allOf": [{"type": "integer", "minimum": 3}]}, "allOf"),
    "allOf nested": ({"allOf": [{"allOf": [{"properties": {"a": {"const": 1}}}]}]}, "allOf"),
    "allOf with additionalProperties": (
        {"allOf": [{"properties": {"a": {"const": 1}}, "additionalProperties": False}]},
        "allOf",
    ),
    "allOf naming a property twice": (
        {
            "allOf": [
                {"properties": {"a": {"const": 1}}},
                {"properties": {"a": {"const": 2}}},
            ]
        },
        "allOf",
    ),
    "allOf with anyOf": (
        {"allOf": [{"anyOf": [{"properties": {"a": {"const": 1}}, "required": ["a"]}]}]},
        "allOf",
    ),
    "$ref into const data": (
        {
            "properties": {"a": {"$ref": "#/$defs/x/const"}},
            "$defs": {"x": {"const": {"type": "integer", "multipleOf": 7919}}},
        },
        "$ref",
    ),
    "$ref into a default": (
        {
            "properties": {
                "a": {"$ref": "#/properties/b/default"},
                "b": {"default": {"type": "integer", "multipleOf": 7}},
            },
        },
        "$ref",
    ),
    "$ref percent-encoded": (
        {"properties": {"a": {"$ref": "#/$defs/a%20b"}}, "$defs": {"a b": {"type": "integer"}}},
        "$ref",
    ),
    "$id below the root": (
        {
            "properties": {"a": {"$id": "http://other.example/", "$ref": "#/$defs/a"}},
            "$defs": {"a": {"type": "integer"}},
        },
        "$id",
    ),
}


@pytest.mark.parametrize("case", READ_IN_PART)
def test_a_keyword_the_converter_reads_in_part_is_refused_naming_it(case: str) -> None:
    schema, keyword = READ_IN_PART[case]
    with pytest.raises(GrammarUnavailable, match=f"keyword {keyword.replace('$', '[$]')}\\b"):
        json_grammar(schema)


#: Schemas of the same shapes that say nothing the converter drops: they still build.
STILL_BUILD: dict[str, dict[str, Any]] = {
    "enum of its type": {"type": "string", "enum": ["a", "b"]},
    "const of its type": {"type": "integer", "const": 3},
    "anyOf of the same type": {
        "type": "object",
        "anyOf": [{"type": "object", "properties": {"a": {"type": "integer"}}}],
    },
    "allOf of plain objects": {
        "allOf": [
            {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
            {"properties": {"b": {"type": "string"}}},
        ]
    },
    "recursive $defs": {
        "$defs": {
            "n": {
                "type": "object",
                "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/n"}}},
            }
        },
        "$ref": "#/$defs/n",
    },
    "$ref to a property": {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"$ref": "#/properties/a"}},
    },
    "$id at the root": {"$id": "https://example.org/s", "type": "object"},
    "a pointer with escapes": {
        "properties": {"a": {"$ref": "#/$defs/a~1b"}},
        "$defs": {"a/b": {"type": "integer"}},
    },
}


@pytest.mark.parametrize("case", STILL_BUILD)
def test_the_same_shapes_that_say_nothing_more_still_build(case: str) -> None:
    json_grammar(STILL_BUILD[case])


@pytest.mark.parametrize(
    ("schema", "words"),
    [
        ({"type": "string", "minLength": 3, "maxLength": 1}, "minLength is above its maxLength"),
        (
            {"type": "array", "items": {"type": "integer"}, "minItems": 3, "maxItems": 1},
            "minItems is above its maxItems",
        ),
        (
            {"$defs": {"a": {"$ref": "#/$defs/a"}}, "properties": {"x": {"$ref": "#/$defs/a"}}},
            "refers to itself",
        ),
        (
            {
                "$defs": {"a": {"anyOf": [{"$ref": "#/$defs/a"}, {"const": 1}]}},
                "properties": {"x": {"$ref": "#/$defs/a"}},
            },
            "refers to itself",
        ),
        (
            {
                "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
                "properties": {"x": {"$ref": "#/$defs/a"}},
            },
            "refers to itself",
        ),
    ],
)
def test_a_schema_no_value_or_no_grammar_can_meet_is_refused(
    schema: dict[str, Any], words: str
) -> None:
    with pytest.raises(GrammarUnavailable, match=words):
        json_grammar(schema)


@pytest.mark.parametrize(
    "parameters",
    [
        {"type": "integer"},
        {"type": "null"},
        {"type": "array", "items": {"type": "integer"}},
        {"enum": ["{}"]},
        {"const": "x"},
        {"type": ["object", "null"]},
    ],
)
def test_a_tool_whose_parameters_are_no_object_is_refused(parameters: dict[str, Any]) -> None:
    with pytest.raises(GrammarUnavailable, match="object schema"):
        tool_call_grammar([FunctionTool(name="t", parameters=parameters)])


def test_a_tool_with_a_property_named_root_is_not_recursive() -> None:
    parameters = {
        "type": "object",
        "properties": {"root": {"type": "integer"}},
        "required": ["root"],
    }
    gbnf = tool_call_grammar([FunctionTool(name="t", parameters=parameters)])
    assert grammar_accepts(
        gbnf, '<tool_call>\n{"name": "t", "arguments": {"root": 4}}\n</tool_call>'
    )


def test_the_output_check_reads_json_schema_2020_12_whatever_schema_says() -> None:
    # Draft 7's `dependencies` is an annotation in 2020-12, as the grammar read it.
    schema = {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "dependencies": {"a": ["b"]},
    }
    assert not jsonschema.Draft7Validator(schema).is_valid({"a": 1})  # the draft would refuse
    facts = OutputFacts(
        forced_tool=False, calls=[], tool_schemas={}, output_schema=schema, message_text='{"a": 1}'
    )
    assert check_output(facts) is None


def _post(service: LmspServiceHandle, schema: dict[str, Any], temperature: float) -> httpx.Response:
    message = {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": "Give me JSON."}],
    }
    request = {
        "model": service.model_id,
        "input": [message],
        "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}},
        "temperature": temperature,
        "max_output_tokens": 48,
    }
    with service.client(timeout_s=120) as http:
        return http.post("/responses", json=request)


def test_plain_strings_at_any_temperature_end_valid(lmsp_service: LmspServiceHandle) -> None:
    # Before: 9 of 15 such requests at temperature 1 ended 500 model_output_invalid.
    schema = {"type": "object", "properties": {"s": {"type": "string"}}, "required": ["s"]}
    for temperature in (0, 1, 1, 1, 1, 1, 1, 1, 1, 1):
        answer = _post(lmsp_service, schema, temperature)
        assert answer.status_code == 200, answer.text
        texts = [
            part["text"]
            for item in answer.json()["output"]
            if item["type"] == "message"
            for part in item["content"]
        ]
        if answer.json()["status"] == "completed":
            assert isinstance(json.loads("".join(texts))["s"], str)
