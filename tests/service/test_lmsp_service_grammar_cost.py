"""A grammar that is cheap to build but costly to follow must not freeze the service.

llama.cpp's grammar sampler keeps one parse stack per way the text so far
can be matched and checks every candidate token against every stack. The
generation loop is shared by every running generation, so one request whose
stacks multiply stalls everyone's. The refused `(a?){500}` form could be
written out (`a?a?a?…`, 300 or 500 copies) and was accepted: the service
now measures the grammar it built (grammar_cost.py) and refuses it with
the reason, in structured output and as a forced tool's parameters alike.
A complete grammar with the minimum-output rule used to abort the worker.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import httpx
import pytest
from tests.service.conftest import LmspServiceHandle

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")

from llama_cpp.llama_grammar import json_schema_to_gbnf

from napllm.lmsp import FunctionTool
from napllm.lmsp_service.grammar import (
    MAX_CHAR_WORK,
    MAX_LIVE_STACKS,
    GrammarUnavailable,
    check_grammar_cost,
    json_grammar,
    tool_call_grammar,
)
from napllm.lmsp_service.grammar_cost import parse_gbnf, worst_case

AMBIGUOUS = {"type": "string", "pattern": "^(a?){500}$"}
WRITTEN_OUT_300 = {"type": "string", "pattern": "^" + "a?" * 300 + "$"}
WRITTEN_OUT_500 = {"type": "string", "pattern": "^" + "a?" * 500 + "$"}
#: Hostile schemas: each kind of grammar whose parse stacks multiply.
HOSTILE = {
    "repeated-group": AMBIGUOUS,
    "written-out-300": WRITTEN_OUT_300,
    "written-out-500": WRITTEN_OUT_500,
    "overlapping-alternatives": {"type": "string", "pattern": "^" + "(a|aa)" * 60 + "$"},
    "many-wildcards": {"type": "string", "pattern": "^" + ".*" * 40 + "$"},
    "nested-in-object": {
        "type": "object",
        "properties": {"deep": {"type": "object", "properties": {"s": WRITTEN_OUT_300}}},
        "required": ["deep"],
    },
}
#: Ordinary schemas that must keep building.
BENIGN = {
    "object": {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "age": {"type": "integer"},
            "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 20},
        },
        "required": ["name"],
    },
    "boolean": {"type": "boolean"},
    "any": {},
    "enum-100": {"enum": [f"value_{i}" for i in range(100)]},
    "optional-60": {
        "type": "object",
        "properties": {f"p{i}": {"type": "string"} for i in range(60)},
    },
    "date-time": {"type": "string", "format": "date-time"},
    "bounded-string": {"type": "string", "maxLength": 500},
    "email": {"type": "string", "pattern": "^[a-z]{1,64}@[a-z]{1,64}\\.[a-z]{2,}$"},
    "few-optionals": {"type": "string", "pattern": "^" + "a?" * 12 + "$"},
}


def body(service: LmspServiceHandle, text: str, **fields: Any) -> dict[str, Any]:
    message = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    return {"model": service.model_id, "input": [message], "temperature": 0, **fields}


def tool(schema: dict[str, Any]) -> dict[str, Any]:
    parameters = {"type": "object", "properties": {"s": schema}, "required": ["s"]}
    return {"type": "function", "name": "t", "parameters": parameters}


@pytest.mark.parametrize("schema", HOSTILE.values(), ids=HOSTILE.keys())
def test_a_grammar_whose_stacks_multiply_is_refused_on_every_path(schema: dict[str, Any]) -> None:
    reason = "ambiguous|repeats a group"  # the cheap pattern rules name their own reason
    with pytest.raises(GrammarUnavailable, match=reason):
        json_grammar(schema)
    parameters = tool(schema)["parameters"]
    with pytest.raises(GrammarUnavailable, match=reason):
        tool_call_grammar([FunctionTool(name="t", parameters=parameters)])


def test_the_grammar_check_sees_what_the_pattern_check_cannot() -> None:
    # The converter's own text, with no pattern to look at: measured as llama.cpp runs it.
    gbnf = str(json_schema_to_gbnf(json.dumps(WRITTEN_OUT_300)))
    cost = worst_case(parse_gbnf(gbnf), MAX_LIVE_STACKS, MAX_CHAR_WORK)
    assert cost.over
    with pytest.raises(GrammarUnavailable, match="ambiguous"):
        check_grammar_cost(gbnf)
    listed = "root ::= " + " | ".join(f'"{"a" * 3}" "{i}"' for i in range(300))
    with pytest.raises(GrammarUnavailable, match="ambiguous"):
        check_grammar_cost(listed)  # 300 alternatives that share a prefix
    with pytest.raises(GrammarUnavailable, match="analysed"):
        check_grammar_cost("root ::= undefined-rule")


@pytest.mark.parametrize("schema", BENIGN.values(), ids=BENIGN.keys())
def test_ordinary_schemas_still_build(schema: dict[str, Any]) -> None:
    assert "root ::=" in json_grammar(schema)
    gbnf = str(json_schema_to_gbnf(json.dumps(schema)))
    cost = worst_case(parse_gbnf(gbnf), MAX_LIVE_STACKS, MAX_CHAR_WORK)
    assert not cost.over and cost.live <= MAX_LIVE_STACKS and cost.work <= MAX_CHAR_WORK


@pytest.mark.parametrize("as_tool", [False, True], ids=["structured-output", "forced-tool"])
def test_the_service_refuses_a_written_out_repetition_naming_the_reason(
    lmsp_service: LmspServiceHandle, as_tool: bool
) -> None:
    if as_tool:
        fields: dict[str, Any] = {"tools": [tool(WRITTEN_OUT_500)], "tool_choice": "required"}
    else:
        fmt = {"type": "json_schema", "json_schema": {"name": "a", "schema": WRITTEN_OUT_300}}
        fields = {"response_format": fmt}
    with lmsp_service.client(timeout_s=120) as http:
        answer = http.post(
            "/responses",
            json=body(lmsp_service, "Write a's", max_output_tokens=8, temperature=1.0, **fields),
        )
    assert answer.status_code == 400, answer.text
    assert answer.json()["code"] == "unsupported_capability"
    assert "ambiguous" in answer.json()["detail"]


@pytest.mark.parametrize("schema", [AMBIGUOUS, WRITTEN_OUT_300], ids=["group", "written-out"])
def test_an_ambiguous_grammar_does_not_stall_other_generations(
    lmsp_service: LmspServiceHandle, schema: dict[str, Any]
) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}
    hostile_done = threading.Event()

    def hostile() -> None:
        try:
            with lmsp_service.client(timeout_s=40) as http:
                http.post(
                    "/responses",
                    json=body(
                        lmsp_service,
                        "Write a's",
                        max_output_tokens=100,
                        temperature=1.0,
                        response_format=fmt,
                    ),
                )
        except httpx.HTTPError:
            pass
        finally:
            hostile_done.set()

    benign = body(lmsp_service, "Say hi", max_output_tokens=16)
    with lmsp_service.client(timeout_s=30) as http:  # warm: the worker has served one
        assert http.post("/responses", json=benign).status_code == 200
    thread = threading.Thread(target=hostile, daemon=True)
    thread.start()
    time.sleep(1.0)
    try:
        with lmsp_service.client(timeout_s=15) as http:
            started = time.monotonic()
            try:
                answer = http.post("/responses", json=benign)
            except httpx.ReadTimeout:
                pytest.fail("a benign generation got no answer within 15 s")
            elapsed = time.monotonic() - started
        assert answer.status_code == 200, answer.text
        assert elapsed < 10, elapsed
    finally:
        hostile_done.wait(60)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_complete_grammar_with_a_minimum_output_ends_instead_of_killing_the_worker(
    lmsp_service: LmspServiceHandle, temperature: float
) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "b", "schema": {"type": "boolean"}}}
    hostile = body(
        lmsp_service,
        "Yes or no?",
        temperature=temperature,
        response_format=fmt,
        extensions={"min_output_tokens": 40},
    )
    benign = body(
        lmsp_service, "Hello!", max_output_tokens=40, extensions={"min_output_tokens": 40}
    )
    answers: list[httpx.Response] = []

    def post(payload: dict[str, Any]) -> None:
        with lmsp_service.client(timeout_s=120) as http:
            answers.append(http.post("/responses", json=payload))

    threads = [threading.Thread(target=post, args=(benign,)) for _ in range(3)]
    for thread in threads:
        thread.start()
    with lmsp_service.client(timeout_s=120) as http:
        answer = http.post("/responses", json=hostile)
    for thread in threads:
        thread.join(120)
    assert answer.status_code == 200, answer.text
    assert answer.json()["status"] == "completed"
    text = answer.json()["output"][0]["content"][0]["text"]
    assert json.loads(text) in (True, False)
    assert [a.status_code for a in answers] == [200, 200, 200], [a.text for a in answers]


@pytest.mark.parametrize(
    "option",
    [
        {"logit_bias": {"1": -100}},
        {"stop": ["true"]},
        {"seed": 1},
        {"top_k": 1},
        {"top_p": 0.1},
        {"min_p": 0.5},
    ],
    ids=["logit_bias", "stop", "seed", "top_k", "top_p", "min_p"],
)
def test_sampling_options_the_service_does_not_define_never_reach_the_worker(
    lmsp_service: LmspServiceHandle, option: dict[str, Any]
) -> None:
    # Only max_output_tokens, temperature and extensions.min_output_tokens
    # shape sampling (each tested against a completed grammar in
    # test_lmsp_grammar_worker.py); any other option is refused before generating.
    fmt = {"type": "json_schema", "json_schema": {"name": "b", "schema": {"type": "boolean"}}}
    with lmsp_service.client(timeout_s=60) as http:
        answer = http.post(
            "/responses",
            json=body(lmsp_service, "Yes or no?", response_format=fmt, **option),
        )
        assert answer.status_code == 400, answer.text
        assert answer.json()["code"] == "invalid_request"
        after = http.post("/responses", json=body(lmsp_service, "Hi", max_output_tokens=4))
    assert after.status_code == 200


@pytest.mark.parametrize("as_tool", [False, True], ids=["structured", "tool"])
def test_a_schema_part_no_value_satisfies_is_refused_before_generating(
    lmsp_service: LmspServiceHandle, as_tool: bool
) -> None:
    # `{"enum": []}` (valid JSON Schema: no value is valid) converts to an
    # empty rule (`x ::= `). As the whole schema, the grammar cost walk
    # failed an assertion on it (500 internal_error); inside a tool's
    # parameters, the grammar let the model write nothing where the value
    # goes and the generation failed (500 generation_failed).
    empty = {"enum": []}
    if as_tool:
        items = {"type": "array", "items": empty, "minItems": 1}
        fields: dict[str, Any] = {"tools": [tool(items)], "tool_choice": "required"}
    else:
        schema = {"type": "json_schema", "json_schema": {"name": "e", "schema": empty}}
        fields = {"response_format": schema}
    with lmsp_service.client(timeout_s=120) as http:
        answer = http.post(
            "/responses",
            json=body(lmsp_service, "Anything", max_output_tokens=8, temperature=1.0, **fields),
        )
        assert answer.status_code == 400, answer.text
        assert answer.json()["code"] == "unsupported_capability"
        assert "no value" in answer.json()["detail"]
        ok = http.post("/responses", json=body(lmsp_service, "Hello!", max_output_tokens=4))
    assert ok.status_code == 200, ok.text
