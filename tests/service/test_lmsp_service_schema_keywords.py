"""Every JSON Schema keyword the service accepts is enforced by the grammar or refused first.

`{"type": "integer", "minimum": 100, "maximum": 105}` was accepted, the
grammar dropped the bounds, the model wrote another integer and the
request ended 500 `model_output_invalid` after the whole generation. Each
keyword the converter drops is now refused before generating (400
`unsupported_capability` naming it, schema_keywords.py); each keyword it
keeps still builds and is shown to constrain the grammar.
"""

from __future__ import annotations

from typing import Any

import pytest
from tests.service.conftest import LmspServiceHandle

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")

from napllm.lmsp import FunctionTool
from napllm.lmsp_service.grammar import GrammarUnavailable, json_grammar, tool_call_grammar
from napllm.lmsp_service.schema_keywords import unenforced_keyword

#: keyword -> a schema whose validity depends on it, which the converter drops
REFUSED: dict[str, dict[str, Any]] = {
    "minimum": {"type": "integer", "minimum": 100, "maximum": 105},
    "maximum": {"type": "number", "maximum": 5},
    "exclusiveMinimum": {"type": "integer", "exclusiveMinimum": 0},
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


def test_the_service_refuses_the_issues_schema_before_generating(
    lmsp_service: LmspServiceHandle,
) -> None:
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 100, "maximum": 105}},
        "required": ["n"],
    }
    message = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "n?"}]}
    fmt = {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}}
    request = {"model": lmsp_service.model_id, "input": [message], "response_format": fmt}
    with lmsp_service.client(timeout_s=60) as http:
        answer = http.post("/responses", json=request)
    assert answer.status_code == 400, answer.text
    assert answer.json()["code"] == "unsupported_capability"
    assert "minimum" in answer.json()["detail"]
