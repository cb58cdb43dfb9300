"""Scripted responses: a connection kind for napplet development.

The developer gives a JSON *script*, a list of turns; every submission
(`generate`) to the connection takes the next turn and plays it as LMSP 1.0
events (section 6.3, with the extension events of docs/lmsp.md for streamed
tool arguments), so the answer goes through the same path as any provider's:
the shell's consent, the LMSP-to-NAP assembler, deltas and the terminal
result. The format is documented with examples in docs/napplets.md.

Script format (JSON)
- Either a list of turns, or an object `{"turns": [...], "repeat": bool,
  "capabilities": {"images", "json", "tools"}}`. `repeat` (default false)
  starts again at the first turn when the last one was used; otherwise a
  submission after the last turn fails with `provider-error`.
  `capabilities` (default: all true) is what the connection declares.
- A turn is an object with one main key:
  - `{"text": "..." | ["chunk", ...], "delayMs": 0, "finish": "stop"}`:
    streamed text, one delta per chunk, `delayMs` milliseconds before each
    chunk; `finish: "length"` ends it as cut short (`response.incomplete`).
  - `{"json": <any JSON value>, "delayMs": 0}`: the value's JSON text as the
    answer (for `format: "json"` requests), streamed in a few chunks.
  - `{"toolCalls": [{"name", "arguments": {...}, "id"?}], "text"?, "delayMs"?}`:
    tool calls (after an optional text), arguments streamed in fragments.
  - `{"error": {"code"?, "message"?}, "text"?, "delayMs"?}`: a provider
    failure (after optional streamed text). `code` is `provider-error`
    (default), `quota-exceeded` or `unsupported`; `message` is shown in the
    shell's notices only, never to the napplet.
  - `{"stall": true, "text"?, "delayMs"?}`: stream the optional text, then
    never finish: the generation waits until the napplet cancels it, the
    endpoint closes or the runtime's deadline ends it.

Rules
- The script is the developer's own text, read by the one strict reader
  (`jsontext.read_json`) and validated by pydantic models that forbid
  unknown keys. Every problem raises `ScriptError` with a *positioned*
  message (`line 3, column 7` for JSON text; `turns[2].toolCalls[0].name`
  for a value) and pydantic's description of what was expected; the
  message never repeats a value of the script.
- `ScriptedProvider` keeps the position in the script; the page builds one
  per connection revision, so editing the connection starts again at turn 1.
- Every submission it receives is reported to `on_request` (the page shows
  "Requests received: N" in the connection's entry), so a developer sees
  whether a generation reached the connection at all (after a denied
  consent it did not), and so is every stream closed before its end ("N
  stopped before the end": the napplet's cancel or reload reached it).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..errors import ErrorCode, ProviderFailure
from ..jsontext import JsonTextError, read_json
from ..lmsp import (
    LmspEvent,
    LmspRequest,
    arguments_delta,
    item_added,
    item_done,
    message_item,
    text_delta,
)

#: Longest script text accepted (characters).
MAX_SCRIPT_CHARS = 1_000_000
#: Most turns in one script; most chunks in one turn.
MAX_TURNS = 1000
MAX_CHUNKS = 10_000
#: Longest delay before a chunk (milliseconds).
MAX_DELAY_MS = 60_000

#: Shown in the shell (never to a napplet) when every turn has been used.
EXHAUSTED_HINT = (
    "The scripted connection has no turn left. Edit the connection to start the script again, "
    'or set "repeat": true in the script.'
)

_KINDS = ("text", "json", "toolCalls", "error", "stall")


class ScriptError(ProviderFailure):
    """A script that cannot be used; `str()` and `user_hint` say where and why.

    A `ProviderFailure` (`provider-error`), so that the connections form
    shows its message like any refused connection, and a stored script that
    no longer parses fails a submission like any provider that cannot be
    built. The message names positions and keys, never script values.
    """

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.PROVIDER_ERROR, user_hint=message, detail="invalid script")
        self.message = message

    def __str__(self) -> str:
        return self.message


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


Chunks = str | Annotated[list[str], Field(min_length=1, max_length=MAX_CHUNKS)]
Delay = Annotated[int, Field(ge=0, le=MAX_DELAY_MS)]


class TextTurn(_Strict):
    """Streamed text; `finish: "length"` ends it as cut short."""

    text: Chunks
    delayMs: Delay = 0
    finish: Literal["stop", "length"] = "stop"


class JsonTurn(_Strict):
    """A JSON answer: the value's text, streamed in a few chunks."""

    json_value: Any = Field(alias="json")
    delayMs: Delay = 0


class ToolCallSpec(_Strict):
    """One tool call: `name`, `arguments` (an object) and an optional call id."""

    name: str = Field(min_length=1, max_length=200)
    arguments: dict[str, Any] = Field(default_factory=dict)
    id: str | None = Field(default=None, min_length=1, max_length=200)


class ToolCallsTurn(_Strict):
    """Tool calls, after an optional text."""

    toolCalls: Annotated[list[ToolCallSpec], Field(min_length=1, max_length=64)]
    text: Chunks | None = None
    delayMs: Delay = 0


class ErrorSpec(_Strict):
    """The failure a provider reports: its NAP-LLM code and a shell-only message."""

    code: Literal["provider-error", "quota-exceeded", "unsupported"] = "provider-error"
    message: str = Field(default="The scripted connection reported an error.", max_length=500)


class ErrorTurn(_Strict):
    """A provider failure, after optional streamed text."""

    error: ErrorSpec
    text: Chunks | None = None
    delayMs: Delay = 0


class StallTurn(_Strict):
    """Optional streamed text, then no end until the generation is cancelled."""

    stall: Literal[True]
    text: Chunks | None = None
    delayMs: Delay = 0


Turn = TextTurn | JsonTurn | ToolCallsTurn | ErrorTurn | StallTurn
_MODELS: dict[str, type[_Strict]] = {
    "text": TextTurn,
    "json": JsonTurn,
    "toolCalls": ToolCallsTurn,
    "error": ErrorTurn,
    "stall": StallTurn,
}


class ScriptCapabilities(_Strict):
    """What the scripted connection declares (all true by default)."""

    images: bool = True
    json_output: bool = Field(default=True, alias="json")
    tools: bool = True


class Script(BaseModel):
    """A validated script: its turns, whether it repeats, its capabilities."""

    model_config = ConfigDict(frozen=True)

    turns: tuple[Turn, ...]
    repeat: bool = False
    capabilities: ScriptCapabilities = ScriptCapabilities()


_KEY = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,39}")


def _key(name: object) -> str:
    """A key of the script as named in a message: short identifiers only."""
    return name if isinstance(name, str) and _KEY.fullmatch(name) else "<unknown key>"


def _where(loc: Sequence[int | str]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, str):
            part = _key(part)
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else part
    return out or "the script"


def _first_problem(exc: ValidationError, prefix: Sequence[int | str]) -> str:
    error = exc.errors(include_input=False, include_url=False)[0]
    # Union members add their type names to the location; they are no position.
    loc = [p for p in error["loc"] if not (isinstance(p, str) and p.startswith(("str", "list[")))]
    return f"{_where([*prefix, *loc])}: {error['msg']}"


def _json_position(text: str) -> str:
    try:
        json.loads(text)
    except json.JSONDecodeError as exc:
        return f" at line {exc.lineno}, column {exc.colno}"
    except ValueError:
        pass
    return ""


def _turn(raw: object, index: int) -> Turn:
    where = f"turns[{index}]"
    if not isinstance(raw, dict):
        raise ScriptError(f"{where}: a turn must be a JSON object")
    main = [k for k in ("json", "toolCalls", "error", "stall") if k in raw]
    if len(main) > 1:
        raise ScriptError(f"{where}: a turn has one kind; found {' and '.join(main)}")
    if main and main[0] == "json" and "text" in raw:
        raise ScriptError(f"{where}: a json turn cannot also have text")
    kind = main[0] if main else ("text" if "text" in raw else None)
    if kind is None:
        raise ScriptError(f"{where}: a turn needs one of {', '.join(_KINDS)}")
    try:
        turn = _MODELS[kind].model_validate(raw)
    except ValidationError as exc:
        raise ScriptError(f"{_first_problem(exc, ['turns', index])} ({kind} turn)") from None
    assert isinstance(turn, TextTurn | JsonTurn | ToolCallsTurn | ErrorTurn | StallTurn)
    return turn


def parse_script(text: str) -> Script:
    """Read and validate a script's JSON text (see the module docstring).

    Raises `ScriptError` with a positioned message for text that is not
    strict JSON, a script that is neither a list nor an object of the
    documented shape, and every invalid turn (the first problem found).
    """
    if len(text) > MAX_SCRIPT_CHARS:
        raise ScriptError(f"the script is longer than {MAX_SCRIPT_CHARS} characters")
    if not text.strip():
        raise ScriptError("the script is empty: give a JSON list of turns")
    try:
        value = read_json(text)
    except JsonTextError as exc:
        raise ScriptError(f"{str(exc).rstrip('.')}{_json_position(text)}") from None
    return script_from_value(value)


def script_from_value(value: object) -> Script:
    """Validate an already parsed script value; raises `ScriptError`."""
    options: dict[str, Any] = {}
    if isinstance(value, dict):
        unknown = sorted(set(value) - {"turns", "repeat", "capabilities"})
        if unknown:
            raise ScriptError(
                f"the script object has unknown key(s) {', '.join(_key(k) for k in unknown[:5])}; "
                "expected turns, repeat, capabilities"
            )
        if "turns" not in value:
            raise ScriptError("the script object needs a turns list")
        if "repeat" in value:
            if not isinstance(value["repeat"], bool):
                raise ScriptError("repeat: must be true or false")
            options["repeat"] = value["repeat"]
        if "capabilities" in value:
            try:
                options["capabilities"] = ScriptCapabilities.model_validate(value["capabilities"])
            except ValidationError as exc:
                raise ScriptError(_first_problem(exc, ["capabilities"])) from None
        raw_turns = value["turns"]
    else:
        raw_turns = value
    if not isinstance(raw_turns, list):
        raise ScriptError("a script is a JSON list of turns, or an object with a turns list")
    if not raw_turns:
        raise ScriptError("the script has no turns")
    if len(raw_turns) > MAX_TURNS:
        raise ScriptError(f"the script has more than {MAX_TURNS} turns")
    turns = tuple(_turn(raw, index) for index, raw in enumerate(raw_turns))
    return Script(turns=turns, **options)


# --------------------------------------------------------------------------
# Playing a turn as LMSP events (LMSP 1.0, 6.3)


def _chunks(text: str | list[str] | None) -> list[str]:
    if text is None:
        return []
    return [text] if isinstance(text, str) else list(text)


def _split(text: str, pieces: int = 4) -> list[str]:
    size = max(1, -(-len(text) // pieces))
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


class ScriptedProvider:
    """Plays one turn of `script` per submission (see the module rules).

    `position` is the index of the next turn; `submissions` counts calls;
    `stopped` counts streams closed before their terminal event.
    `on_request`, when given, is called with the provider after each
    submission took its turn (or found none left), before any event is
    played, and again when a stream is stopped; an exception it raises is
    not caught.
    """

    def __init__(
        self,
        script: Script,
        rid_prefix: str = "resp_scripted",
        on_request: Callable[[ScriptedProvider], None] | None = None,
    ) -> None:
        self.script = script
        self.position = 0
        self.submissions = 0
        self.stopped = 0
        self._rid_prefix = rid_prefix
        self._on_request = on_request

    @property
    def next_turn(self) -> int | None:
        """The 1-based number of the turn the next submission plays; None when
        no turn is left (and the script does not repeat)."""
        if self.position < len(self.script.turns):
            return self.position + 1
        return 1 if self.script.repeat else None

    def _next_turn(self) -> Turn:
        turns = self.script.turns
        if self.position >= len(turns):
            if not self.script.repeat:
                raise ProviderFailure(
                    ErrorCode.PROVIDER_ERROR,
                    user_hint=EXHAUSTED_HINT,
                    detail="scripted connection: no turn left",
                )
            self.position = 0
        turn = turns[self.position]
        self.position += 1
        return turn

    async def respond(self, request: LmspRequest) -> AsyncIterator[LmspEvent]:
        """The next turn's events, the last one terminal; raises `ProviderFailure`
        for an `error` turn or when no turn is left. A stream closed before its
        terminal event (cancelled, its endpoint closed, the deadline) counts in
        `stopped` and is reported to `on_request` too."""
        self.submissions += 1
        try:
            turn = self._next_turn()
        finally:
            self._report()
        finished = False
        try:
            async for event in self._play(turn):
                finished = event.event in ("response.completed", "response.incomplete")
                yield event
        except ProviderFailure:
            finished = True
            raise
        finally:
            if not finished:
                self.stopped += 1
                self._report()

    def _report(self) -> None:
        if self._on_request is not None:
            self._on_request(self)

    async def _play(self, turn: Turn) -> AsyncIterator[LmspEvent]:
        rid = f"{self._rid_prefix}_{self.submissions}"
        delay = turn.delayMs / 1000
        yield LmspEvent(
            event="response.created", data={"response_id": rid, "status": "in_progress"}
        )
        index = 0
        chunks: list[str]
        if isinstance(turn, JsonTurn):
            chunks = _split(json.dumps(turn.json_value, ensure_ascii=False))
        else:
            chunks = _chunks(turn.text)
        if chunks:
            async for event in _message(rid, index, chunks, delay):
                yield event
            index += 1
        if isinstance(turn, ToolCallsTurn):
            for number, call in enumerate(turn.toolCalls):
                call_id = call.id or f"call_{self.submissions}_{number + 1}"
                async for event in _call(rid, index, call, call_id, delay):
                    yield event
                index += 1
        elif isinstance(turn, ErrorTurn):
            raise ProviderFailure(
                ErrorCode(turn.error.code),
                user_hint=turn.error.message,
                detail="scripted connection: error turn",
            )
        elif isinstance(turn, StallTurn):
            await asyncio.Event().wait()  # until the shell cancels this task
        usage = {"input_tokens": 1, "output_tokens": max(1, len(chunks)), "total_tokens": 0}
        usage["total_tokens"] = usage["input_tokens"] + usage["output_tokens"]
        if isinstance(turn, TextTurn) and turn.finish == "length":
            yield LmspEvent(
                event="response.incomplete",
                data={
                    "response_id": rid,
                    "status": "incomplete",
                    "incomplete_details": {"reason": "max_output_tokens"},
                    "usage": usage,
                },
            )
            return
        yield LmspEvent(
            event="response.completed",
            data={"response_id": rid, "status": "completed", "usage": usage},
        )


async def _message(
    rid: str, index: int, chunks: list[str], delay: float
) -> AsyncIterator[LmspEvent]:
    item_id = f"msg_{index}"
    yield item_added(rid, index, message_item(item_id))
    for chunk in chunks:
        await asyncio.sleep(delay)
        yield text_delta(rid, item_id, chunk)
    yield item_done(rid, index, message_item(item_id, "".join(chunks)))


async def _call(
    rid: str, index: int, call: ToolCallSpec, call_id: str, delay: float
) -> AsyncIterator[LmspEvent]:
    item_id = f"fc_{index}"
    arguments = json.dumps(call.arguments, ensure_ascii=False)
    base = {"id": item_id, "type": "function_call", "name": call.name, "call_id": call_id}
    yield item_added(rid, index, {**base, "arguments": ""})
    for fragment in _split(arguments, 2):
        await asyncio.sleep(delay)
        yield arguments_delta(rid, item_id, index, fragment)
    yield item_done(rid, index, {**base, "arguments": arguments})
