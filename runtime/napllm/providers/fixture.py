"""A controllable LMSP-speaking provider for tests and the conformance suite.

Rules
- `FixtureProvider.respond` plays a *script*: a list of steps, each an LMSP
  event (`LmspEvent` or `{"event", "data"}`), a `Stall` (wait, or forever),
  a `Fail` (raise `ProviderFailure` whose developer detail may contain
  secret-looking text) or a `Crash` (raise an arbitrary exception whose
  text may contain secrets). Scripts come from `queue()` (next submissions
  first) or from the default script factory.
- It counts submissions (`submissions`), keeps every LMSP request it was
  given (`requests`) and counts streams closed before their terminal event
  (`closed_early`), so tests can assert "zero provider generations" and
  "provider cancellation requested".
- Script builders (`text_script`, `tool_call_script`, ...) produce event
  sequences in the exact shape of LMSP 1.0 section 6.3, with the extension
  events of docs/lmsp.md for streamed tool arguments.
- `steps_from_json` accepts the same steps as plain JSON so the browser
  conformance suite can script the fixture through the test hooks.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import ErrorCode, ProviderFailure
from ..lmsp import (
    LmspEvent,
    LmspRequest,
    MessageItemIn,
    arguments_delta,
    item_added,
    item_done,
    message_item,
    text_delta,
)


@dataclass(frozen=True)
class Stall:
    """Wait `seconds` (None: forever) before the next step."""

    seconds: float | None = None


@dataclass(frozen=True)
class Fail:
    """Raise `ProviderFailure(code)`; `detail` is developer-only text."""

    detail: str = ""
    code: ErrorCode = ErrorCode.PROVIDER_ERROR
    user_hint: str | None = None


@dataclass(frozen=True)
class Crash:
    """Raise `RuntimeError(message)`: an unexpected provider bug."""

    message: str = ""


Step = LmspEvent | Stall | Fail | Crash
Script = list[Step]


@dataclass
class FixtureProvider:
    """An in-process provider driven by scripts; see the module rules."""

    default: Callable[[LmspRequest], Script] | None = None
    submissions: int = 0
    requests: list[LmspRequest] = field(default_factory=list)
    closed_early: int = 0
    _queue: deque[Script] = field(default_factory=deque)

    def clear(self) -> int:
        """Drop the queued scripts (e.g. of a submission that never happened); returns how many."""
        dropped = len(self._queue)
        self._queue.clear()
        return dropped

    @property
    def queued(self) -> int:
        """How many scripts are waiting for a submission."""
        return len(self._queue)

    def queue(self, *scripts: Sequence[Step | dict[str, Any]]) -> None:
        """Use these scripts for the next submissions, in order."""
        for script in scripts:
            self._queue.append([_step(s) for s in script])

    async def respond(self, request: LmspRequest) -> AsyncIterator[LmspEvent]:
        """Play the next script (LMSP 6.3 events); see the module rules."""
        self.submissions += 1
        self.requests.append(request)
        if self._queue:
            script = self._queue.popleft()
        elif self.default is not None:
            script = self.default(request)
        else:
            script = echo_script(request)
        finished = False
        try:
            for step in script:
                if isinstance(step, Stall):
                    if step.seconds is None:
                        await asyncio.Event().wait()
                    else:
                        await asyncio.sleep(step.seconds)
                elif isinstance(step, Fail):
                    raise ProviderFailure(step.code, user_hint=step.user_hint, detail=step.detail)
                elif isinstance(step, Crash):
                    raise RuntimeError(step.message)
                else:
                    if step.terminal:
                        finished = True  # the consumer may stop reading here
                    yield step
                    await asyncio.sleep(0)
            finished = True
        finally:
            if not finished:
                self.closed_early += 1


def _step(raw: Step | dict[str, Any]) -> Step:
    if isinstance(raw, LmspEvent | Stall | Fail | Crash):
        return raw
    return steps_from_json([raw])[0]


def steps_from_json(raw: object) -> Script:
    """Steps from JSON: `{"event", "data"}`, `{"stall": seconds|null}`,
    `{"fail": {"detail", "code"?, "userHint"?}}` or `{"crash": message}`.

    Raises `ValueError` for anything else.
    """
    if not isinstance(raw, list):
        raise ValueError("a script is a list of steps")
    steps: Script = []
    for item in raw:
        if not isinstance(item, dict):
            raise ValueError("a step is an object")
        if "stall" in item:
            seconds = item["stall"]
            steps.append(Stall(float(seconds) if seconds is not None else None))
        elif "fail" in item:
            spec = item["fail"] or {}
            steps.append(
                Fail(
                    detail=str(spec.get("detail", "")),
                    code=ErrorCode(spec.get("code", "provider-error")),
                    user_hint=spec.get("userHint"),
                )
            )
        elif "crash" in item:
            steps.append(Crash(str(item["crash"])))
        elif "event" in item:
            steps.append(LmspEvent(event=item["event"], data=dict(item.get("data") or {})))
        else:
            raise ValueError("unknown step")
    return steps


# --------------------------------------------------------------------------
# Script builders (LMSP 1.0, 6.3 and 6.5)


def _created(rid: str) -> LmspEvent:
    return LmspEvent(event="response.created", data={"response_id": rid, "status": "in_progress"})


def _usage(inp: int, out: int) -> dict[str, int]:
    return {"input_tokens": inp, "output_tokens": out, "total_tokens": inp + out}


def text_events(
    text: str | Sequence[str], *, rid: str = "resp_fixture", output_index: int = 0
) -> list[LmspEvent]:
    """Added / text deltas / done for one message item (no created/terminal)."""
    chunks = [text] if isinstance(text, str) else list(text)
    item_id = f"msg_{output_index}"
    return [
        item_added(rid, output_index, message_item(item_id)),
        *(text_delta(rid, item_id, chunk) for chunk in chunks),
        item_done(rid, output_index, message_item(item_id, "".join(chunks))),
    ]


def call_events(
    name: str,
    arguments: str | dict[str, Any],
    *,
    call_id: str | None = "call_1",
    rid: str = "resp_fixture",
    output_index: int = 0,
    fragments: Sequence[str] | None = None,
) -> list[LmspEvent]:
    """Added / argument deltas / done for one function_call item."""
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    item_id = f"fc_{output_index}"
    base: dict[str, Any] = {"id": item_id, "type": "function_call", "name": name}
    if call_id is not None:
        base["call_id"] = call_id
    return [
        item_added(rid, output_index, {**base, "arguments": ""}),
        *(arguments_delta(rid, item_id, output_index, part) for part in fragments or ()),
        item_done(rid, output_index, {**base, "arguments": args}),
    ]


def completed(rid: str = "resp_fixture", inp: int = 12, out: int = 7) -> LmspEvent:
    """`response.completed` with usage."""
    return LmspEvent(
        event="response.completed",
        data={"response_id": rid, "status": "completed", "usage": _usage(inp, out)},
    )


def incomplete(reason: str = "max_output_tokens", rid: str = "resp_fixture") -> LmspEvent:
    """`response.incomplete` with `incomplete_details.reason`."""
    return LmspEvent(
        event="response.incomplete",
        data={
            "response_id": rid,
            "status": "incomplete",
            "incomplete_details": {"reason": reason},
            "usage": _usage(12, 3),
        },
    )


def text_script(text: str | Sequence[str]) -> Script:
    """A complete streamed text answer."""
    return [_created("resp_fixture"), *text_events(text), completed()]


def tool_call_script(
    calls: Sequence[tuple[str, dict[str, Any] | str, str | None]], *, stream_arguments: bool = True
) -> Script:
    """A complete turn of function calls: `(name, arguments, call_id)` each."""
    events: Script = [_created("resp_fixture")]
    for index, (name, arguments, call_id) in enumerate(calls):
        args = arguments if isinstance(arguments, str) else json.dumps(arguments)
        fragments = [args[: len(args) // 2], args[len(args) // 2 :]] if stream_arguments else None
        events.extend(
            call_events(name, args, call_id=call_id, output_index=index, fragments=fragments)
        )
    events.append(completed())
    return events


def echo_script(request: LmspRequest) -> Script:
    """Default: answer `You said: <last user text>` in word-sized chunks."""
    last = ""
    for item in request.input:
        if isinstance(item, MessageItemIn) and item.role == "user":
            last = " ".join(getattr(p, "text", "") for p in item.content if hasattr(p, "text"))
    words = f"You said: {last}".split(" ")
    return text_script([w + (" " if i < len(words) - 1 else "") for i, w in enumerate(words)])
