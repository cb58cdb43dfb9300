"""The LMSP service with TinyChat: responses, streaming, tools, JSON, limits, storage (6.1-6.5)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from fixtures import WEATHER_FUNCTION, lmsp_user
from napllm.providers.sse import SseParser

if TYPE_CHECKING:
    from tests.service.conftest import LmspServiceHandle

pytestmark = pytest.mark.service

TIME_TOOL = {
    "type": "function",
    "name": "get_time",
    "description": "Get the local time of a time zone.",
    "parameters": {
        "type": "object",
        "properties": {"zone": {"type": "string"}},
        "required": ["zone"],
    },
}
PERSON_SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


def body(service: LmspServiceHandle, text: str, **fields: Any) -> dict[str, Any]:
    return {"model": service.model_id, "input": [lmsp_user(text)], "temperature": 0, **fields}


def parse_sse(chunks: list[bytes]) -> list[tuple[int, str, dict[str, Any]]]:
    """(id, event, data) of each event; ids must be present and integers."""
    parser = SseParser()
    events = []
    for chunk in chunks:
        events.extend(parser.feed(chunk))
    events.extend(parser.close())
    return [(int(e.id), e.event, json.loads(e.data)) for e in events]


def stream(
    client: httpx.Client, payload: dict[str, Any], headers: dict[str, str] | None = None
) -> list[tuple[int, str, dict[str, Any]]]:
    with client.stream("POST", "/responses", json=payload, headers=headers or {}) as answer:
        assert answer.status_code == 200
        assert answer.headers["content-type"].startswith("text/event-stream")
        return parse_sse(list(answer.iter_bytes()))


def assert_well_formed_stream(events: list[tuple[int, str, dict[str, Any]]]) -> str:
    """Checks 6.3/6.4 rules common to every stream; returns the response id."""
    ids = [event_id for event_id, _, _ in events]
    assert ids == list(range(1, len(events) + 1))
    assert events[0][1] == "response.created"
    assert events[0][2]["status"] == "in_progress"
    response_id = events[0][2]["response_id"]
    assert response_id.startswith("resp_")
    assert all(data["response_id"] == response_id for _, _, data in events)
    terminal = {
        "response.completed",
        "response.incomplete",
        "response.failed",
        "response.cancelled",
    }
    assert events[-1][1] in terminal
    assert not any(name in terminal for _, name, _ in events[:-1])
    return str(response_id)


@pytest.fixture
def client(lmsp_service: LmspServiceHandle) -> Iterator[httpx.Client]:
    with lmsp_service.client() as http:
        yield http


def test_model_listing_reports_capabilities(
    lmsp_service: LmspServiceHandle, client: httpx.Client
) -> None:
    answer = client.get("/models")
    assert answer.status_code == 200
    assert answer.headers["lmsp-version"] == "1.0"
    listing = answer.json()
    assert listing["object"] == "list"
    (entry,) = listing["data"]
    fast = entry.pop("cpu_fast_path")
    assert fast["setting"] == "auto"
    assert isinstance(fast["cpu"], str) and fast["cpu"]
    if fast["enabled"]:
        assert fast["reason"] is None
    else:  # this CPU's fast path crashed (AMX with llama.cpp 0.3.36): the reason says so
        assert "crashed" in fast["reason"]
    assert entry == {
        "id": lmsp_service.model_id,
        "object": "model",
        "context_length": lmsp_service.n_ctx,
        "engine": "llama.cpp",
        "capabilities": {
            "tools": True,
            "structured_output": True,
            "conversations": True,
            "images": False,
            "tool_choice": ["auto", "none", "required", "tool"],
        },
    }
    one = client.get(f"/models/{lmsp_service.model_id}").json()
    assert one == {**entry, "cpu_fast_path": fast}
    assert client.get("/models/other").json()["code"] == "model_not_found"


def test_sync_response(lmsp_service: LmspServiceHandle, client: httpx.Client) -> None:
    answer = client.post("/responses", json=body(lmsp_service, "Hello!"))
    assert answer.status_code == 200
    response = answer.json()
    assert response["object"] == "response"
    assert response["id"].startswith("resp_")
    assert response["status"] == "completed"
    assert response["model"] == lmsp_service.model_id
    assert abs(response["created_at"] - time.time()) < 60
    assert response["error"] is None and response["incomplete_details"] is None
    (item,) = response["output"]
    assert item["type"] == "message" and item["role"] == "assistant"
    assert item["id"].startswith("msg_")
    assert item["content"] == [{"type": "output_text", "text": "Hello! How can I help you today?"}]
    usage = response["usage"]
    assert usage["input_tokens"] > 0
    assert usage["output_tokens"] == 9
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]


def test_stream_events_follow_6_3(lmsp_service: LmspServiceHandle, client: httpx.Client) -> None:
    events = stream(client, body(lmsp_service, "Hello!", stream=True))
    response_id = assert_well_formed_stream(events)
    names = [name for _, name, _ in events]
    assert names[:2] == ["response.created", "response.output_item.added"]
    assert names[-2:] == ["response.output_item.done", "response.completed"]
    assert set(names[2:-2]) == {"response.output_text.delta"}
    added = events[1][2]
    assert added["output_index"] == 0
    assert added["item"]["type"] == "message" and added["item"]["content"] == []
    item_id = added["item"]["id"]
    deltas = [data for _, name, data in events if name == "response.output_text.delta"]
    assert all(data["item_id"] == item_id for data in deltas)
    text = "".join(data["delta"] for data in deltas)
    assert text == "Hello! How can I help you today?"
    done = events[-2][2]
    assert done["output_index"] == 0
    assert done["item"]["id"] == item_id
    assert done["item"]["content"] == [{"type": "output_text", "text": text}]
    completed = events[-1][2]
    assert completed == {
        "response_id": response_id,
        "status": "completed",
        "usage": completed["usage"],
    }
    assert completed["usage"]["output_tokens"] == 9


def test_tool_call_round_trip(lmsp_service: LmspServiceHandle, client: httpx.Client) -> None:
    first_input = [lmsp_user("What is the weather in Berlin?")]
    first = client.post(
        "/responses",
        json={
            "model": lmsp_service.model_id,
            "input": first_input,
            "tools": [WEATHER_FUNCTION],
            "tool_choice": "auto",
            "temperature": 0,
        },
    ).json()
    assert first["status"] == "completed"
    (call,) = first["output"]
    assert call["type"] == "function_call"
    assert call["id"].startswith("fc_")
    assert call["call_id"].startswith("call_")
    assert call["name"] == "get_weather"
    assert json.loads(call["arguments"]) == {"city": "Berlin"}

    result = {"city": "Berlin", "temperature": 21, "condition": "sunny"}
    second = client.post(
        "/responses",
        json={
            "model": lmsp_service.model_id,
            "input": [
                *first_input,
                call,  # the function_call item as received, id included (6.5)
                {
                    "type": "function_call_output",
                    "call_id": call["call_id"],
                    "output": json.dumps(result),
                },
            ],
            "tools": [WEATHER_FUNCTION],
            "temperature": 0,
        },
    ).json()
    assert second["status"] == "completed"
    (message,) = second["output"]
    assert message["type"] == "message"
    assert message["content"][0]["text"] == (
        "It is sunny in Berlin with a temperature of 21 degrees."
    )


def test_streamed_tool_call_arrives_complete(
    lmsp_service: LmspServiceHandle, client: httpx.Client
) -> None:
    events = stream(
        client,
        body(lmsp_service, "What is the weather in Berlin?", tools=[WEATHER_FUNCTION], stream=True),
    )
    assert_well_formed_stream(events)
    names = [name for _, name, _ in events]
    assert names == [
        "response.created",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.output_item.done",
        "response.completed",
    ]
    item = events[3][2]["item"]
    assert item["type"] == "function_call" and item["name"] == "get_weather"
    assert json.loads(item["arguments"]) == {"city": "Berlin"}
    assert events[2][2]["item_id"] == item["id"]
    assert events[2][2]["delta"] == item["arguments"]
    # No part of the <tool_call> block leaked as text.
    assert "response.output_text.delta" not in names


def test_tool_choice_none_disables_tool_parsing(
    lmsp_service: LmspServiceHandle, client: httpx.Client
) -> None:
    response = client.post(
        "/responses",
        json=body(
            lmsp_service,
            "What is the weather in Berlin?",
            tools=[WEATHER_FUNCTION],
            tool_choice="none",
        ),
    ).json()
    assert response["status"] == "completed"
    assert [item["type"] for item in response["output"]] == ["message"]


def test_tool_choice_required_forces_a_call(
    lmsp_service: LmspServiceHandle, client: httpx.Client
) -> None:
    # TinyChat would greet; the grammar makes it call the tool instead.
    response = client.post(
        "/responses",
        json=body(lmsp_service, "Hello!", tools=[WEATHER_FUNCTION], tool_choice="required"),
    ).json()
    assert response["status"] == "completed"
    (call,) = response["output"]
    assert call["type"] == "function_call" and call["name"] == "get_weather"
    assert isinstance(json.loads(call["arguments"])["city"], str)


def test_named_tool_choice_calls_that_tool(
    lmsp_service: LmspServiceHandle, client: httpx.Client
) -> None:
    response = client.post(
        "/responses",
        json=body(
            lmsp_service,
            "Hello!",
            tools=[TIME_TOOL, WEATHER_FUNCTION],
            tool_choice={"type": "function", "name": "get_weather"},
        ),
    ).json()
    assert response["status"] == "completed"
    (call,) = response["output"]
    assert call["name"] == "get_weather"
    assert isinstance(json.loads(call["arguments"])["city"], str)


def test_json_schema_output(lmsp_service: LmspServiceHandle, client: httpx.Client) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON_SCHEMA}}
    response = client.post(
        "/responses",
        json=body(
            lmsp_service, "Return a JSON object with name Alice and age 30.", response_format=fmt
        ),
    ).json()
    assert response["status"] == "completed"
    assert json.loads(response["output"][0]["content"][0]["text"]) == {"name": "Alice", "age": 30}


def test_json_schema_is_enforced_on_an_unrelated_prompt(
    lmsp_service: LmspServiceHandle, client: httpx.Client
) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON_SCHEMA}}
    response = client.post(
        "/responses", json=body(lmsp_service, "Hello!", response_format=fmt)
    ).json()
    assert response["status"] == "completed"
    value = json.loads(response["output"][0]["content"][0]["text"])
    assert set(value) == {"name", "age"}
    assert isinstance(value["name"], str) and isinstance(value["age"], int)


def test_unconstrained_json_schema_mismatch_fails_not_succeeds(
    lmsp_service: LmspServiceHandle, client: httpx.Client
) -> None:
    # With tools on `auto` the grammar is not applied (the model may call a
    # tool); TinyChat then greets in prose, which must fail the response.
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON_SCHEMA}}
    payload = body(lmsp_service, "Hello!", response_format=fmt, tools=[WEATHER_FUNCTION])
    answer = client.post("/responses", json=payload)
    assert answer.status_code == 500
    assert answer.headers["content-type"] == "application/problem+json"
    assert answer.json()["code"] == "model_output_invalid"
    events = stream(client, {**payload, "stream": True})
    assert_well_formed_stream(events)
    assert events[-1][1] == "response.failed"
    assert events[-1][2]["status"] == "failed"
    assert events[-1][2]["error"]["code"] == "model_output_invalid"


def test_max_output_tokens_gives_incomplete(
    lmsp_service: LmspServiceHandle, client: httpx.Client
) -> None:
    response = client.post(
        "/responses", json=body(lmsp_service, "Hello!", max_output_tokens=3)
    ).json()
    assert response["status"] == "incomplete"
    assert response["incomplete_details"] == {"reason": "max_output_tokens"}
    assert response["usage"]["output_tokens"] == 3
    assert response["output"][0]["content"][0]["text"] == "Hello! How"

    events = stream(client, body(lmsp_service, "Hello!", max_output_tokens=3, stream=True))
    assert_well_formed_stream(events)
    assert events[-1][1] == "response.incomplete"
    final = events[-1][2]
    assert final["status"] == "incomplete"
    assert final["incomplete_details"] == {"reason": "max_output_tokens"}
    assert final["usage"]["output_tokens"] == 3


def test_store_get_and_previous_response_id(
    lmsp_service: LmspServiceHandle, client: httpx.Client
) -> None:
    first = client.post(
        "/responses",
        json=body(
            lmsp_service, "What is the weather in Berlin?", tools=[WEATHER_FUNCTION], store=True
        ),
    ).json()
    fetched = client.get(f"/responses/{first['id']}")
    assert fetched.status_code == 200
    assert fetched.json() == first
    call = first["output"][0]
    follow_up = client.post(
        "/responses",
        json={
            "model": lmsp_service.model_id,
            "previous_response_id": first["id"],
            "input": [
                {
                    "type": "function_call_output",
                    "call_id": call["call_id"],
                    "output": json.dumps(
                        {"city": "Berlin", "temperature": 17, "condition": "rainy"}
                    ),
                }
            ],
            "tools": [WEATHER_FUNCTION],
            "temperature": 0,
        },
    ).json()
    assert follow_up["status"] == "completed"
    assert follow_up["output"][0]["content"][0]["text"] == (
        "It is rainy in Berlin with a temperature of 17 degrees."
    )


def test_unstored_and_unknown_responses_are_not_found(
    lmsp_service: LmspServiceHandle, client: httpx.Client
) -> None:
    unstored = client.post("/responses", json=body(lmsp_service, "Hello!")).json()
    for response_id in (unstored["id"], "resp_unknown"):
        answer = client.get(f"/responses/{response_id}")
        assert answer.status_code == 404
        assert answer.headers["content-type"] == "application/problem+json"
        assert answer.json()["code"] == "response_not_found"
    answer = client.post(
        "/responses", json=body(lmsp_service, "Hello!", previous_response_id="resp_unknown")
    )
    assert answer.status_code == 404
    assert answer.json()["code"] == "response_not_found"


def test_client_disconnect_stops_generation(
    lmsp_service: LmspServiceHandle, client: httpx.Client
) -> None:
    limit = 4000
    payload = body(
        lmsp_service,
        "Hello!",
        stream=True,
        store=True,
        max_output_tokens=limit,
        extensions={"min_output_tokens": limit},
    )
    with client.stream("POST", "/responses", json=payload) as answer:
        parser = SseParser()
        response_id = None
        for chunk in answer.iter_bytes():
            events = parser.feed(chunk)
            if events and response_id is None:
                response_id = json.loads(events[0].data)["response_id"]
            if any(event.event == "response.output_text.delta" for event in events):
                break
    assert response_id is not None
    deadline = time.monotonic() + 30
    while True:
        stored = client.get(f"/responses/{response_id}").json()
        if stored["status"] != "in_progress" or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert stored["status"] == "cancelled"
    assert stored["usage"]["output_tokens"] < limit


def test_images_are_an_unsupported_capability(
    lmsp_service: LmspServiceHandle, client: httpx.Client
) -> None:
    image = {"type": "input_image", "mime_type": "image/png", "data": "iVBORw0KGgo="}
    payload = {
        "model": lmsp_service.model_id,
        "input": [{"type": "message", "role": "user", "content": [image]}],
    }
    answer = client.post("/responses", json=payload)
    assert answer.status_code == 400
    assert answer.headers["content-type"] == "application/problem+json"
    assert answer.json()["code"] == "unsupported_capability"


def test_context_too_long(lmsp_service: LmspServiceHandle, client: httpx.Client) -> None:
    answer = client.post("/responses", json=body(lmsp_service, "Hello! " * lmsp_service.n_ctx))
    assert answer.status_code == 400
    assert answer.json()["code"] == "context_length_exceeded"


def test_sync_client_disconnect_stops_generation(
    lmsp_service: LmspServiceHandle, client: httpx.Client
) -> None:
    # A 4000-token generation takes seconds; the client gives up after 0.3 s.
    limit = 4000
    payload = body(
        lmsp_service, "Hello!", max_output_tokens=limit, extensions={"min_output_tokens": limit}
    )
    headers = {"Idempotency-Key": "sync-disconnect-1"}
    with pytest.raises(httpx.ReadTimeout):
        client.post("/responses", json=payload, headers=headers, timeout=0.3)
    # Had the generation gone on, the same key would now be 409 (in progress).
    # It was stopped and forgotten, so the retry generates anew (and is
    # abandoned the same way).
    time.sleep(0.3)
    with pytest.raises(httpx.ReadTimeout):
        client.post("/responses", json=payload, headers=headers, timeout=0.3)
    # The service is free for the next request.
    answer = client.post("/responses", json=body(lmsp_service, "Hello!"))
    assert answer.json()["output"][0]["content"][0]["text"] == "Hello! How can I help you today?"
