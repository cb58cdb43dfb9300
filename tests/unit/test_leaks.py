"""Secrets never leak (NAP-LLM, Error Handling; Shell Behavior; Security
Considerations).

Provider failures, crashes, failed/error events and malformed outputs carry
planted secrets: the connection credential, API keys, a provider body and
another endpoint's prompt. No envelope sent to any endpoint may contain
them; provider failures always surface as the fixed safe sentence; the
views of a connection that leave the shell's storage (`public_model`,
`public_summary`, chooser and consent inputs) never contain the credential.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from harness import Harness, generate, user
from napcheck import assert_not_leaked, assert_safe_error, check_generation, code, terminal

from fixtures import WEATHER_TOOL
from napllm.connection_records import Capabilities, Connection
from napllm.connections import ConnectionRegistry
from napllm.errors import SAFE_MESSAGES, ErrorCode, ProviderFailure
from napllm.lmsp import LmspEvent
from napllm.providers.fixture import (
    Crash,
    Fail,
    Stall,
    call_events,
    completed,
    text_events,
    text_script,
    tool_call_script,
)
from napllm.shell import ChoiceRequest, Disclosure, NappletIdentity

API_KEY = "sk-live-9Z8Y7X6W5V4U3T2S1R0Q"
CREDENTIAL = "tok-PRIVATE-credential-5150"
BODY = '{"error":{"message":"upstream said: internal trace id 0xDEADBEEF"}}'
OTHER_PROMPT = "VICTIM-PROMPT my medical history"
SECRETS = (API_KEY, CREDENTIAL, BODY, "0xDEADBEEF", OTHER_PROMPT)
CREATED = LmspEvent(
    event="response.created", data={"response_id": "resp_fixture", "status": "in_progress"}
)
PLANTED = f"{BODY} key={API_KEY} auth={CREDENTIAL} prompt={OTHER_PROMPT}"


def problem_event(name: str, **problem: Any) -> LmspEvent:
    data: dict[str, Any] = {"response_id": "resp_fixture", "status": "failed", "error": problem}
    return LmspEvent(event=name, data=data)


FAILURES: dict[str, list[Any]] = {
    "fail detail": [Fail(detail=PLANTED)],
    "fail after output": [CREATED, *text_events("partial"), Fail(detail=PLANTED)],
    "fail with hint": [Fail(detail=PLANTED, user_hint=f"The key {API_KEY} was rejected")],
    "fail unsupported": [Fail(detail=PLANTED, code=ErrorCode.UNSUPPORTED)],
    "fail quota": [Fail(detail=PLANTED, code=ErrorCode.QUOTA_EXCEEDED)],
    "crash": [Crash(PLANTED)],
    "crash mid-stream": [CREATED, *text_events("so far"), Crash(PLANTED)],
    "response.failed": [
        CREATED,
        problem_event("response.failed", title=PLANTED, detail=PLANTED, status=500),
    ],
    "response.failed unauthorized": [
        problem_event(
            "response.failed", title="Unauthorized", detail=PLANTED, status=401, code="unauthorized"
        ),
    ],
    "response.failed unsupported": [
        problem_event("response.failed", detail=PLANTED, code="unsupported_capability"),
    ],
    "error event": [LmspEvent(event="error", data={"message": PLANTED, "code": API_KEY})],
    "cancelled event": [LmspEvent(event="response.cancelled", data={"reason": PLANTED})],
    "malformed item": [
        CREATED,
        LmspEvent(
            event="response.output_item.done",
            data={"output_index": 0, "item": {"type": "message", "content": PLANTED}},
        ),
        completed(),
    ],
    "delta for unknown item": [
        CREATED,
        LmspEvent(event="response.output_text.delta", data={"item_id": API_KEY, "delta": PLANTED}),
        completed(),
    ],
    "no terminal": [CREATED],
}


async def two_endpoints(
    **connection: Any,
) -> tuple[Harness, Any, str, str, str, str]:
    h = Harness()
    fx = h.connect(
        credential=CREDENTIAL, settings={"baseUrl": f"http://127.0.0.1:9/{API_KEY}"}, **connection
    )
    victim = h.endpoint("victim")
    attacker = h.endpoint("attacker")
    return h, fx, victim, attacker, await h.select(victim), await h.select(attacker)


@pytest.mark.parametrize("case", sorted(FAILURES))
async def test_provider_failures_leak_nothing(case: str) -> None:
    h, fx, victim, attacker, hv, ha = await two_endpoints()
    fx.queue([CREATED, Stall(0.005), *text_events("victim answer"), completed()])
    h.send(victim, generate("g1", hv, [user(OTHER_PROMPT)]))
    fx.queue(FAILURES[case])
    h.send(attacker, generate("g1", ha, [user("hello")]))
    await h.settle()
    result = check_generation(h, attacker, "g1")
    error = result["error"]
    # provider failures surface as the code's fixed sentence
    assert error["message"] == SAFE_MESSAGES[ErrorCode(error["code"])]
    assert code(check_generation(h, victim, "g1")) is None
    assert_not_leaked(h, API_KEY, CREDENTIAL, BODY, "0xDEADBEEF")
    assert OTHER_PROMPT not in json.dumps(h.out(attacker))


async def test_user_hint_goes_to_the_shell_ui_only() -> None:
    h, fx, _victim, attacker, _hv, ha = await two_endpoints()
    fx.queue([Fail(detail=PLANTED, user_hint="The service rejected the connection's token.")])
    h.send(attacker, generate("g1", ha))
    await h.settle()
    assert h.observer.notices == [("error", "The service rejected the connection's token.", "fx")]
    assert "rejected" not in json.dumps(h.transport.sent)


@pytest.mark.parametrize(
    "script",
    [
        tool_call_script([("get_weather", f'{{"city": "{API_KEY}"', "c1")], stream_arguments=False),
        tool_call_script([(f"tool_{API_KEY[:20]}", {"k": API_KEY}, "c1")], stream_arguments=False),
        tool_call_script([("get_weather", f'["{API_KEY}"]', "c1")], stream_arguments=False),
        [CREATED, *call_events("get_weather", '{"city": "x"}', call_id=API_KEY)],
    ],
    ids=["truncated-args", "unknown-name", "array-args", "no-terminal"],
)
async def test_malformed_tool_output_error_echoes_no_provider_text(script: list[Any]) -> None:
    h, fx, victim, attacker, _hv, ha = await two_endpoints()
    fx.queue(script)
    h.send(attacker, generate("g1", ha, tools=[WEATHER_TOOL]))
    await h.settle()
    result = check_generation(h, attacker, "g1")
    assert_safe_error(result, ErrorCode.PROVIDER_ERROR)
    assert API_KEY[:20] not in json.dumps(result)
    assert_not_leaked(h, CREDENTIAL)
    assert h.out(victim)[1:] == []


async def test_invalid_json_output_error_echoes_nothing() -> None:
    h, fx, _victim, attacker, _hv, ha = await two_endpoints()
    fx.queue(text_script(f"not an object {API_KEY}"))
    h.send(attacker, generate("g1", ha, format="json"))
    await h.settle()
    result = check_generation(h, attacker, "g1")
    assert_safe_error(result, ErrorCode.PROVIDER_ERROR)
    assert API_KEY not in json.dumps(result)


@pytest.mark.parametrize(
    "request_update",
    [
        {"temperature": API_KEY},
        {"format": API_KEY},
        {"maxTokens": API_KEY},
        {"messages": [{"role": API_KEY, "content": [{"type": "text", "text": "x"}]}]},
        {"messages": [{"role": "user", "content": [{"type": API_KEY}]}]},
        {"tools": [{"name": API_KEY + " !"}]},
        {"toolChoice": API_KEY},
    ],
)
async def test_invalid_request_messages_never_echo_values(request_update: dict[str, Any]) -> None:
    h, _fx, _victim, attacker, _hv, ha = await two_endpoints()
    envelope = generate("g1", ha)
    envelope["request"].update(request_update)
    h.send(attacker, envelope)
    await h.settle()
    result = terminal(h, attacker, "g1")
    assert result["error"]["code"] == "invalid-request"
    assert API_KEY not in json.dumps(result)


async def test_foreign_handle_error_reveals_nothing_about_the_owner() -> None:
    h, _fx, _victim, attacker, hv, _ha = await two_endpoints()
    h.send(attacker, {"type": "llm.describe", "id": "d1", "handle": hv})
    h.send(attacker, {"type": "llm.describe", "id": "d2", "handle": "h-never-issued"})
    await h.settle()
    foreign = terminal(h, attacker, "d1", "llm.describe.result")
    unknown = terminal(h, attacker, "d2", "llm.describe.result")
    assert foreign["error"] == unknown["error"]
    assert "victim" not in json.dumps(h.out(attacker))


async def test_victim_prompt_and_output_never_reach_other_endpoints() -> None:
    h, fx, victim, attacker, hv, ha = await two_endpoints()
    bystander = h.endpoint("bystander")
    fx.queue(text_script(["VICTIM-OUTPUT ", "secret diagnosis"]))
    h.send(victim, generate("g1", hv, [user(OTHER_PROMPT)]))
    fx.queue([Crash(f"while handling {OTHER_PROMPT}")])
    h.send(attacker, generate("g1", ha))
    await h.settle()
    leaked = json.dumps([h.out(attacker), h.out(bystander)])
    for secret in (OTHER_PROMPT, "VICTIM-OUTPUT", "secret diagnosis"):
        assert secret not in leaked
    assert h.out(bystander) == []


# --------------------------------------------------------------------------
# Views of a connection


def secret_connection() -> Connection:
    return Connection(
        id="private-connection-id",
        name="Work",
        kind="openai",
        model="m",
        route="This browser → OpenAI-compatible server at 127.0.0.1:8080",
        capabilities=Capabilities(tools=True, tool_choice_modes=("auto", "none")),
        settings={"baseUrl": "http://127.0.0.1:8080/v1"},
        credential=CREDENTIAL,
    )


def test_public_model_has_no_credential_or_private_fields() -> None:
    connection = secret_connection()
    model = connection.public_model("h-1")
    text = json.dumps(model)
    assert CREDENTIAL not in text and "private-connection-id" not in text
    assert "127.0.0.1:8080/v1" not in text  # settings stay in the shell
    assert set(model) == {
        "handle",
        "name",
        "model",
        "route",
        "images",
        "json",
        "tools",
        "toolChoiceModes",
    }


def test_public_summary_has_no_credential() -> None:
    summary = secret_connection().public_summary()
    assert CREDENTIAL not in json.dumps(summary)
    assert "credential" not in summary and summary["hasCredential"] is True


def test_connection_repr_and_dump_mask_the_credential() -> None:
    connection = secret_connection()
    assert CREDENTIAL not in repr(connection) and CREDENTIAL not in str(connection)
    assert CREDENTIAL not in json.dumps(connection.model_dump(mode="json"))


def test_edit_keeps_credential_private() -> None:
    registry = ConnectionRegistry()
    registry.add(secret_connection())
    edited = registry.edit("private-connection-id", name="Renamed")
    assert edited.credential is not None
    assert edited.credential.get_secret_value() == CREDENTIAL
    assert CREDENTIAL not in json.dumps(edited.public_summary())


def test_chooser_and_consent_inputs_have_no_credential() -> None:
    from napllm.records import Requirements, parse_generation_request

    connection = secret_connection()
    napplet = NappletIdentity("n", "ab" * 32)
    choice = ChoiceRequest("ep-1", napplet, Requirements(), [connection]).to_json()
    request = parse_generation_request({"handle": "h", "messages": [user("hi")]})
    disclosure = Disclosure("ep-1", napplet, connection, 1, 2, 0, [], [], "text", None)
    for view in (choice, disclosure.to_json()):
        text = json.dumps(view)
        assert CREDENTIAL not in text and "127.0.0.1:8080/v1" not in text
    assert request.messages[0].role == "user"


def test_provider_failure_text_is_not_its_message() -> None:
    failure = ProviderFailure(detail=PLANTED, user_hint="hint")
    error = failure.to_nap_error()
    assert error.to_record() == {
        "code": "provider-error",
        "message": SAFE_MESSAGES[ErrorCode.PROVIDER_ERROR],
    }
    assert PLANTED not in str(failure)


def test_secrets_list_is_checked() -> None:
    # the planted text really contains every secret the tests look for
    assert all(s in PLANTED for s in SECRETS)
