"""The napplet-side Python API (`napllm.napplet`) against the real CPython shell.

Each test links an `Llm` to an endpoint of `harness.Harness`
(tests/unit/napplet_link.py): what the API builds goes through the shell's
intake, chooser, consent and a fixture provider, and the shell's replies
come back. The tests assert what the napplet sees (values, exception
classes and codes) and what crossed the link (envelope types, the provider's
submissions).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from harness import Harness
from napplet_link import NappletSide, link, linked_harness
from pydantic import BaseModel

from napllm.connection_records import Capabilities
from napllm.errors import ErrorCode
from napllm.napplet import (
    ERROR_CLASSES,
    GenerationCancelledError,
    GenerationTimeoutError,
    Llm,
    LlmError,
    OutputValidationError,
    ProviderError,
    QuotaExceededError,
    Reply,
    SelectionExpiredError,
    ToolRoundsExceededError,
    UnsupportedError,
    UserCancelledError,
    tool,
)
from napllm.providers.fixture import (
    Fail,
    FixtureProvider,
    Stall,
    call_events,
    completed,
    text_events,
    text_script,
    tool_call_script,
)
from napllm.shell import ConsentDecision, ShellPolicy

CREATED = text_script("x")[0]


class Person(BaseModel):
    name: str
    age: int


async def until(condition: Callable[[], bool], what: str) -> None:
    """Yield to the loop until `condition()` holds (bounded by turns, not time)."""
    for _ in range(2000):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"never happened: {what}")


async def bounded(awaitable: Awaitable[Any]) -> Any:
    return await asyncio.wait_for(awaitable, 5)


def setup(
    caps: Capabilities | None = None, **options: Any
) -> tuple[Harness, FixtureProvider, NappletSide, Llm]:
    h = linked_harness(**options)
    fx = h.connect() if caps is None else h.connect(caps=caps)
    side = link(h)
    return h, fx, side, Llm(side)


async def settled(h: Harness, llm: Llm) -> None:
    """The shell is idle and every reply it sent has been consumed by the API."""
    await h.settle()
    await until(lambda: not len(llm._inbox), "every request's terminal result consumed")


def stalled_text(*chunks: str) -> list[Any]:
    """A streamed answer that never finishes (until cancelled)."""
    return [CREATED, *text_events(chunks)[:-1], Stall()]


# --------------------------------------------------------------------------
# select, describe, generate


async def test_select_describe_generate_through_the_shell() -> None:
    h, fx, side, llm = setup()
    model = await bounded(llm.select(json=True))
    assert (model.model, model.json_, model.tools) == ("fixture-model", True, True)
    assert h.chooser.requests[0].requirements.json_ is True
    assert llm.model == model
    assert (await bounded(llm.describe())).handle == model.handle
    reply = await bounded(llm.generate([{"role": "user", "text": "Hello!"}]))
    assert isinstance(reply, Reply)
    assert (reply.text, reply.finish, reply.complete) == ("You said: Hello!", "stop", True)
    assert reply.usage is not None and reply.usage.outputTokens == 7
    assert len(h.consent.asked) == 1 and fx.submissions == 1
    assert side.types() == ["llm.select", "llm.describe", "llm.generate"]
    assert len({e["id"] for e in side.sent}) == 3
    await settled(h, llm)


async def test_generate_selects_first_with_the_requirements_it_needs() -> None:
    h, fx, _side, llm = setup()
    fx.queue(text_script('{"name": "Alice", "age": 30}'))
    person = await bounded(llm.generate("Alice is 30.", response_model=Person))
    assert person == Person(name="Alice", age=30)
    assert len(h.chooser.requests) == 1 and h.chooser.requests[0].requirements.json_ is True
    await bounded(llm.generate("again"))  # the selection is kept
    assert len(h.chooser.requests) == 1


# --------------------------------------------------------------------------
# stream and its three ways of stopping


async def test_stream_yields_deltas_and_keeps_the_terminal_reply() -> None:
    h, fx, side, llm = setup()
    fx.queue(text_script(["Once ", "upon ", "a time."]))
    stream = llm.stream("Tell me a story.")
    texts = [text async for text in stream]
    assert texts == ["Once ", "upon ", "a time."]
    assert stream.reply is not None and stream.reply.text == "Once upon a time."
    assert not stream.cancelled and "llm.cancel" not in side.types()
    await settled(h, llm)


async def _stopped(how: str) -> None:
    h, fx, side, llm = setup()
    fx.queue(stalled_text("Once ", "upon "))
    stream = llm.stream("Tell me a story.")
    seen: list[str] = []

    async def read() -> None:
        async for text in stream:
            seen.append(text)
            if how == "break" and len(seen) == 2:
                break
            if how == "cancel()" and len(seen) == 2:
                stream.cancel()

    task = asyncio.create_task(read())
    if how == "task":
        await until(lambda: len(seen) == 2, "two deltas")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await bounded(task)
    else:
        await bounded(task)
    assert seen == ["Once ", "upon "] and stream.cancelled and stream.reply is None
    await settled(h, llm)
    cancels = [e for e in side.sent if e["type"] == "llm.cancel"]
    assert [c["requestId"] for c in cancels] == [stream.request_id]
    assert h.results(side.endpoint_id, stream.request_id)[0]["error"]["code"] == "cancelled"
    assert h.results(side.endpoint_id, cancels[0]["id"])[0]["cancelled"] is True
    assert fx.closed_early == 1


@pytest.mark.parametrize("how", ["break", "cancel()", "task"])
async def test_stream_stops_by_break_cancel_or_task_cancellation(how: str) -> None:
    await _stopped(how)


async def test_cancelling_the_task_awaiting_generate_cancels_the_generation() -> None:
    h, fx, side, llm = setup()
    fx.queue(stalled_text("Hel"))
    task = asyncio.create_task(llm.generate("Hi"))
    await until(lambda: len(side.sent) == 2, "the generate request")
    await until(lambda: h.deltas(side.endpoint_id, side.sent[-1]["id"]), "a delta")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await bounded(task)
    await settled(h, llm)
    assert side.types() == ["llm.select", "llm.generate", "llm.cancel"]
    assert fx.closed_early == 1


async def test_a_stream_error_is_raised_from_the_loop() -> None:
    h, fx, _side, llm = setup()
    fx.queue([CREATED, *text_events(["par"])[:-1], Fail("secret detail")])
    seen = []
    with pytest.raises(ProviderError) as caught:
        async for text in llm.stream("Hi"):
            seen.append(text)
    assert seen == ["par"] and caught.value.code == "provider-error"
    assert "secret" not in caught.value.message
    h.observer.notices.clear()


# --------------------------------------------------------------------------
# structured output


async def test_response_model_valid_answer_and_the_request_it_sent() -> None:
    _h, fx, side, llm = setup()
    fx.queue(text_script(['{"name": "Al', 'ice", "age": 30}']))
    person = await bounded(llm.generate("Alice is 30.", response_model=Person))
    assert isinstance(person, Person) and person.age == 30
    request = side.sent[-1]["request"]
    assert request["format"] == "json"
    system = request["messages"][0]
    assert system["role"] == "system" and '"age"' in system["content"][0]["text"]
    assert request["messages"][1]["content"][0]["text"] == "Alice is 30."


async def test_response_model_invalid_answer_is_a_typed_error_never_an_object() -> None:
    _h, fx, _side, llm = setup()
    fx.queue(text_script('{"name": "Alice", "age": "thirty"}'))
    with pytest.raises(OutputValidationError) as caught:
        await bounded(llm.generate("Alice is thirty.", response_model=Person))
    assert caught.value.code == "invalid-output"
    assert [e["loc"] for e in caught.value.errors] == [("age",)]
    assert caught.value.reply.text == '{"name": "Alice", "age": "thirty"}'


async def test_json_schema_format_checks_the_answer() -> None:
    _h, fx, side, llm = setup()
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    }
    fx.queue(text_script('{"city": "Paris"}'), text_script('{"town": "Paris"}'))
    assert await bounded(llm.generate("Where?", schema=schema)) == {"city": "Paris"}
    assert side.sent[-1]["request"]["format"] == "json"
    with pytest.raises(OutputValidationError):
        await bounded(llm.generate("Where?", schema=schema))


async def test_a_cut_short_structured_answer_is_incomplete() -> None:
    from napllm.napplet import IncompleteOutputError
    from napllm.providers.fixture import incomplete

    _h, fx, _side, llm = setup()
    fx.queue([CREATED, *text_events('{"name": "Al'), incomplete()])
    with pytest.raises(IncompleteOutputError) as caught:
        await bounded(llm.generate("Alice", response_model=Person))
    assert caught.value.reply.finish == "length"


async def test_a_structured_stream_shows_the_json_text_then_the_validated_answer() -> None:
    _h, fx, side, llm = setup()
    fx.queue(text_script(['{"name": "Al', 'ice", "age": 30}']), text_script('{"name": 1}'))
    stream = llm.stream("Alice is 30.", response_model=Person)
    assert [t async for t in stream] == ['{"name": "Al', 'ice", "age": 30}']
    assert stream.parsed == Person(name="Alice", age=30)
    assert side.sent[-1]["request"]["format"] == "json"
    bad = llm.stream("Alice is 30.", response_model=Person)
    with pytest.raises(OutputValidationError):
        async for _ in bad:
            pass
    assert bad.parsed is None and bad.reply is not None


# --------------------------------------------------------------------------
# tools


def weather_tools() -> tuple[Any, list[str]]:
    calls: list[str] = []

    @tool
    def get_weather(city: str) -> str:
        """Current weather in a city."""
        calls.append(city)
        if city == "Atlantis":
            raise ValueError("no such city")
        return f"18 C and clear in {city}"

    return get_weather, calls


def test_a_tool_schema_comes_from_the_signature() -> None:
    get_weather, _ = weather_tools()
    assert get_weather.record() == {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"title": "City", "type": "string"}},
            "required": ["city"],
            "additionalProperties": False,
        },
    }
    assert get_weather("Oslo") == "18 C and clear in Oslo"
    with pytest.raises(TypeError):
        tool(lambda *args: None)
    with pytest.raises(ValueError):
        tool(name="bad name!")(lambda: None)


async def test_run_tools_runs_the_tool_after_the_toolUse_result() -> None:
    _h, fx, side, llm = setup()
    get_weather, calls = weather_tools()
    fx.queue(
        tool_call_script([("get_weather", {"city": "Paris"}, "call_1")]),
        text_script("It is 18 C and clear in Paris."),
    )
    answer = await bounded(llm.run_tools("Weather in Paris?", tools=[get_weather], max_rounds=8))
    assert answer == "It is 18 C and clear in Paris."
    assert calls == ["Paris"]
    second = side.sent[-1]["request"]
    assert second["tools"] == [get_weather.record()]
    assert [m["role"] for m in second["messages"]] == ["user", "assistant", "toolResult"]
    assert second["messages"][2]["content"][0]["text"] == "18 C and clear in Paris"
    assert "isError" not in second["messages"][2]


async def test_a_tool_that_raises_is_reported_to_the_model_as_a_tool_error() -> None:
    _h, fx, side, llm = setup()
    get_weather, calls = weather_tools()
    fx.queue(
        tool_call_script([("get_weather", {"city": "Atlantis"}, "c1"), ("get_weather", {}, "c2")]),
        text_script("Sorry."),
    )
    assert await bounded(llm.run_tools("Weather?", tools=[get_weather])) == "Sorry."
    assert calls == ["Atlantis"]  # c2's arguments did not validate: the function never ran
    results = side.sent[-1]["request"]["messages"][2:]
    assert [(r["toolCallId"], r["isError"]) for r in results] == [("c1", True), ("c2", True)]
    assert results[0]["content"][0]["text"] == "ValueError: no such city"
    assert results[1]["content"][0]["text"].startswith("Invalid arguments")
    # the shell's translation marked both as failed for the provider (NAP-LLM, Message)
    assert fx.submissions == 2


async def test_the_tool_loop_stops_at_its_round_limit() -> None:
    _h, fx, _side, llm = setup()
    get_weather, calls = weather_tools()
    fx.queue(
        tool_call_script([("get_weather", {"city": "Paris"}, "c1")]),
        tool_call_script([("get_weather", {"city": "Rome"}, "c2")]),
    )
    with pytest.raises(ToolRoundsExceededError) as caught:
        await bounded(llm.run_tools("Weather?", tools=[get_weather], max_rounds=1))
    assert calls == ["Paris"] and fx.submissions == 2
    assert caught.value.rounds == 1 and len(caught.value.messages) == 3


async def test_a_tool_never_runs_on_a_delta() -> None:
    h, fx, side, llm = setup()
    get_weather, calls = weather_tools()
    events = call_events("get_weather", {"city": "Paris"}, fragments=['{"city"', ': "Paris"}'])
    fx.queue([CREATED, *events, Stall()])  # the call completes in deltas; no terminal result
    task = asyncio.create_task(llm.run_tools("Weather?", tools=[get_weather]))
    await until(lambda: len(side.sent) >= 2, "the generate request")
    rid = side.sent[-1]["id"]
    await until(lambda: any(d["event"] == "end" for d in h.deltas(side.endpoint_id, rid)), "end")
    for _ in range(50):
        await asyncio.sleep(0)
    assert calls == []
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await bounded(task)
    await settled(h, llm)
    assert calls == [] and side.types()[-1] == "llm.cancel"
    _ = completed  # (a completed event would have made it a toolUse result)


# --------------------------------------------------------------------------
# errors: every code is its class; the shell's own answers


@pytest.mark.parametrize("code", [c.value for c in ErrorCode])
async def test_every_error_code_is_its_own_exception_class(code: str) -> None:
    class Scripted:
        def __init__(self) -> None:
            self.receiver: Callable[[object], None] = lambda m: None

        def send(self, envelope: dict[str, Any]) -> None:
            reply = {"type": "llm.select.result", "id": envelope["id"]}
            reply["error"] = {"code": code, "message": "A safe sentence."}
            asyncio.get_running_loop().call_soon(self.receiver, reply)

        def listen(self, receiver: Callable[[object], None]) -> None:
            self.receiver = receiver

    with pytest.raises(LlmError) as caught:
        await bounded(Llm(Scripted()).select())
    assert type(caught.value) is ERROR_CLASSES[code]
    assert (caught.value.code, caught.value.message) == (code, "A safe sentence.")
    assert len(set(ERROR_CLASSES.values())) == len(ErrorCode)


async def test_user_cancelled_unsupported_and_expired_from_the_shell() -> None:
    h, fx, _side, llm = setup(caps=Capabilities())
    with pytest.raises(UnsupportedError):
        await bounded(llm.select(json=True))
    await bounded(llm.select())
    h.consent.decision = ConsentDecision(allow=False)
    with pytest.raises(UserCancelledError):
        await bounded(llm.generate("Hi"))
    h.registry.remove("fx")
    with pytest.raises(SelectionExpiredError):
        await bounded(llm.generate("Hi"))
    assert llm.model is None and fx.submissions == 0


async def test_timeout_quota_provider_and_cancelled_from_the_shell() -> None:
    h, fx, _side, llm = setup(policy=ShellPolicy(delta_interval_s=0.0, deadline_s=0.05))
    await bounded(llm.select())
    fx.queue([Stall()])
    with pytest.raises(GenerationTimeoutError):
        await bounded(llm.generate("Hi"))
    h.shell.policy = ShellPolicy(delta_interval_s=0.0, max_characters=10)
    with pytest.raises(QuotaExceededError):
        await bounded(llm.generate("A prompt longer than ten characters"))
    h.shell.policy = ShellPolicy(delta_interval_s=0.0)
    fx.queue([Fail("key sk-secret")])
    with pytest.raises(ProviderError):
        await bounded(llm.generate("Hi"))
    fx.queue(stalled_text("Hel"))
    task = asyncio.create_task(llm.generate("Hi"))
    await until(lambda: fx.submissions == 3, "the third submission")
    h.shell.switch_account("other")
    with pytest.raises(GenerationCancelledError):
        await bounded(task)
    h.observer.notices.clear()
