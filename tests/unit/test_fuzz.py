"""Fuzzing envelopes and records (hypothesis).

Properties, for any message a napplet can post:
- nothing escapes the shell (no exception, no logged runtime failure);
- every routable request (a known type with a usable id) gets exactly one
  terminal result, and nothing else is answered;
- nothing invalid reaches a provider: every submission comes from an
  envelope that parses to a valid, conversation-checked GenerationRequest.

CI runs a few hundred examples; `pytest -m fuzz_long` runs 10,000+.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from typing import Any

import pytest
from harness import PNG, Harness
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fixtures import WEATHER_TOOL
from napllm.intake import Generate, read_request
from napllm.providers.fixture import text_script
from napllm.wire import usable_id

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**60), 2**60)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=20,
)

TYPES = st.sampled_from(
    [
        "llm.select",
        "llm.describe",
        "llm.generate",
        "llm.cancel",
        "llm.delta",
        "llm.select.result",
        "llm.x",
        "foo",
    ]
)
IDS = st.one_of(st.text(min_size=0, max_size=8), st.integers(), st.none(), st.just("g1"))

VALID_REQUEST: dict[str, Any] = {
    "handle": "HANDLE",
    "messages": [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Weather?"},
                {"type": "image", "mimeType": "image/png", "data": PNG},
            ],
        },
        {
            "role": "assistant",
            "content": [
                {
                    "type": "toolCall",
                    "toolCallId": "c1",
                    "name": "get_weather",
                    "arguments": {"city": "Oslo"},
                }
            ],
        },
        {
            "role": "toolResult",
            "toolCallId": "c1",
            "toolName": "get_weather",
            "isError": False,
            "content": [{"type": "text", "text": "5°C"}],
        },
    ],
    "format": "text",
    "maxTokens": 16,
    "temperature": 0.5,
    "tools": [WEATHER_TOOL],
    "toolChoice": "auto",
}


def paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix] if prefix else []
    if isinstance(node, dict):
        for key, value in node.items():
            found.extend(paths(value, (*prefix, key)))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            found.extend(paths(value, (*prefix, index)))
    return found


ALL_PATHS = paths(VALID_REQUEST)


@st.composite
def mutated_generate(draw: st.DrawFn) -> dict[str, Any]:
    request = copy.deepcopy(VALID_REQUEST)
    for _ in range(draw(st.integers(0, 3))):
        path = draw(st.sampled_from(ALL_PATHS))
        parent: Any = request
        try:
            for key in path[:-1]:
                parent = parent[key]
            action = draw(st.sampled_from(["delete", "replace", "add"]))
            if action == "delete" and isinstance(parent, dict):
                parent.pop(path[-1], None)
            elif action == "replace":
                parent[path[-1]] = draw(JSON)
            elif isinstance(parent, dict):
                parent[draw(st.text(max_size=6))] = draw(JSON)
        except (KeyError, IndexError, TypeError):
            pass
    return {"type": "llm.generate", "id": draw(IDS), "request": request}


ENVELOPES = st.one_of(
    JSON,
    st.fixed_dictionaries(
        {"type": TYPES, "id": IDS},
        optional={
            "requirements": JSON,
            "handle": st.one_of(JSON, st.just("HANDLE")),
            "request": JSON,
            "requestId": st.one_of(JSON, st.just("g1")),
        },
    ),
    mutated_generate(),
)


class FailOnError(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def substitute(value: Any, handle: str) -> Any:
    if value == "HANDLE":
        return handle
    if isinstance(value, dict):
        return {k: substitute(v, handle) for k, v in value.items()}
    if isinstance(value, list):
        return [substitute(v, handle) for v in value]
    return value


async def run_one(envelopes: list[Any]) -> int:
    """Send the envelopes; check the properties; return the submission count."""
    handler = FailOnError()
    logging.getLogger("napllm").addHandler(handler)
    try:
        h = Harness()
        fx = h.connect()
        fx.default = lambda request: text_script("ok")
        ep = h.endpoint()
        handle = await h.select(ep, rid="setup")
        h.transport.sent.clear()
        sent = [substitute(e, handle) for e in envelopes]
        valid_generates = 0
        routable: list[tuple[str, str]] = []
        for envelope in sent:
            parsed = read_request(envelope)
            if isinstance(parsed, Generate):
                valid_generates += 1
            if (
                isinstance(envelope, dict)
                and envelope.get("type")
                in ("llm.select", "llm.describe", "llm.generate", "llm.cancel")
                and usable_id(envelope.get("id"))
            ):
                routable.append((envelope["type"] + ".result", envelope["id"]))
            h.send(ep, envelope)
        await h.settle()
        results = [(e["type"], e["id"]) for e in h.results(ep)]
        assert sorted(results) == sorted(routable)
        assert fx.submissions <= valid_generates
        for result in h.results(ep):
            assert ("error" in result) != any(k in result for k in ("model", "result", "cancelled"))
        assert not handler.records, [r.getMessage() for r in handler.records]
        return fx.submissions
    finally:
        logging.getLogger("napllm").removeHandler(handler)


def check(envelopes: list[Any]) -> int:
    return asyncio.run(run_one(envelopes))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(ENVELOPES, min_size=1, max_size=3))
def test_fuzz_envelopes(envelopes: list[Any]) -> None:
    check(envelopes)


@pytest.mark.fuzz_long
@settings(max_examples=10_000, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(ENVELOPES, min_size=1, max_size=4))
def test_fuzz_envelopes_long(envelopes: list[Any]) -> None:
    check(envelopes)


def test_the_unmutated_request_is_valid_and_submitted() -> None:
    assert check([{"type": "llm.generate", "id": "g1", "request": VALID_REQUEST}]) == 1
