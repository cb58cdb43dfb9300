"""Tools: typed Python functions the model may call, and the loop that runs them.

Rules (NAP-LLM, Tool, Message `toolResult`, Generation `toolUse`,
Security Considerations)
- `@tool` turns a function into a `Tool`: its name is the function's name
  (or `name=`), its description the docstring's first paragraph (or
  `description=`), and its `parameters` the JSON Schema pydantic derives
  from the signature (annotations, defaults, `Annotated[..., Field(...)]`),
  with no additional properties. The record is checked by the runtime's own
  `records.Tool` when decorating: a bad name or schema raises `ValueError`
  at once. `*args` and `**kwargs` cannot be described and raise `TypeError`.
  A `Tool` is still callable as the function.
- `run_tools` runs a tool only for a toolCall part of an authoritative
  terminal result with `finish: "toolUse"` (never on a delta): arguments
  are validated against the signature first; the function's return value
  (text as it is, anything else as JSON) becomes a `toolResult`; an
  exception from it (or arguments that do not validate, or an unknown tool
  name) becomes a `toolResult` with `isError: true` and the exception's
  type and text, for the model to see. The results follow the assistant
  turn, one per call, in the calls' order (NAP-LLM, Message adjacency).
- At most `max_rounds` tool rounds: a turn asking for tools after that
  raises `ToolRoundsExceededError` and runs nothing. Finish `length` or
  `refusal` raises `IncompleteOutputError`.
- Tool output is untrusted model input; a tool call is a request, not an
  authorization: a tool that acts must check its arguments itself.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Sequence
from typing import Any, Protocol, get_type_hints

from pydantic import BaseModel, ConfigDict, ValidationError, create_model
from pydantic_core import to_jsonable_python

from ..records import RecordError, ToolCallPart
from ..records import Tool as ToolRecord
from .errors import IncompleteOutputError, ToolRoundsExceededError
from .outgoing import Messages, to_messages
from .replies import Reply
from .structured import Structured


class Replier(Protocol):
    """What `run_tools` needs of a client: one generation awaited to its
    `Reply` (`client.Llm._reply`, with `Llm.generate`'s options)."""

    async def _reply(self, messages: Messages, *, model: Any, **options: Any) -> Reply: ...


#: Default round limit of `run_tools`.
DEFAULT_MAX_ROUNDS = 8


class Tool:
    """A function the model may call, with its NAP-LLM Tool record.

    Attributes: `name`, `description`, `parameters` (JSON Schema),
    `function` (the wrapped callable, sync or async), `arguments` (the
    pydantic model that validates a call's arguments).
    """

    def __init__(
        self,
        function: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
    ) -> None:
        self.function = function
        self.name = name or function.__name__
        doc = inspect.getdoc(function) or ""
        self.description = description if description is not None else doc.split("\n\n")[0].strip()
        self.arguments = _arguments_model(function, self.name)
        schema = self.arguments.model_json_schema()
        schema.pop("title", None)
        self.parameters: dict[str, Any] = schema
        try:
            ToolRecord.model_validate(self.record())
        except ValidationError as exc:
            raise ValueError(f"Tool {self.name!r} is not a valid NAP-LLM tool: {exc}") from None
        except RecordError as exc:  # pragma: no cover - records raise ValidationError
            raise ValueError(str(exc)) from None

    def record(self) -> dict[str, Any]:
        """The NAP-LLM Tool record: `{"name", "description"?, "parameters"}`."""
        record: dict[str, Any] = {"name": self.name, "parameters": self.parameters}
        if self.description:
            record["description"] = self.description
        return record

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.function(*args, **kwargs)

    async def run(self, arguments: dict[str, Any]) -> str:
        """Validate `arguments`, call the function, return its result as text.

        Raises `pydantic.ValidationError` for arguments that do not match
        the signature, and whatever the function raises.
        """
        values = self.arguments.model_validate(arguments)
        kwargs = {key: getattr(values, key) for key in type(values).model_fields}
        result = self.function(**kwargs)
        if inspect.isawaitable(result):
            result = await result
        if isinstance(result, str):
            return result
        return json.dumps(to_jsonable_python(result), ensure_ascii=False)

    def __repr__(self) -> str:
        return f"Tool({self.name!r})"


def _arguments_model(function: Callable[..., Any], name: str) -> type[BaseModel]:
    """A pydantic model of `function`'s parameters (no extra fields allowed)."""
    signature = inspect.signature(function)
    hints = get_type_hints(function, include_extras=True)
    fields: dict[str, Any] = {}
    for param in signature.parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise TypeError(f"Tool {name!r}: *args and **kwargs cannot be described to a model.")
        annotation = hints.get(param.name, Any)
        default = ... if param.default is param.empty else param.default
        fields[param.name] = (annotation, default)
    return create_model(f"{name}_arguments", __config__=ConfigDict(extra="forbid"), **fields)


def tool(
    function: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
) -> Any:
    """Decorator: `@tool` or `@tool(name=..., description=...)` -> a `Tool`.

    Raises `ValueError` (name or schema not a valid NAP-LLM Tool) or
    `TypeError` (`*args` / `**kwargs`) when decorating.
    """
    if function is not None:
        return Tool(function, name=name, description=description)
    return lambda fn: Tool(fn, name=name, description=description)


async def _answer(call: ToolCallPart, by_name: dict[str, Tool]) -> dict[str, Any]:
    """The toolResult message for one call (module rules)."""
    found = by_name.get(call.name)
    error = False
    try:
        if found is None:
            raise LookupError(f"There is no tool named {call.name!r}.")
        text = await found.run(call.arguments)
    except ValidationError as exc:
        error = True
        text = f"Invalid arguments: {exc.error_count()} error(s): " + "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}"
            for e in exc.errors(include_url=False, include_input=False)
        )
    except Exception as exc:
        error = True
        text = f"{type(exc).__name__}: {exc}"
    message: dict[str, Any] = {
        "role": "toolResult",
        "toolCallId": call.toolCallId,
        "toolName": call.name,
        "content": [{"type": "text", "text": text}],
    }
    if error:
        message["isError"] = True
    return message


async def run_tools(
    llm: Replier,
    messages: Messages,
    *,
    tools: Sequence[Tool | Callable[..., Any]],
    max_rounds: int = DEFAULT_MAX_ROUNDS,
    response_model: type[BaseModel] | None = None,
    tool_choice: str | dict[str, str] | None = None,
    max_tokens: int | None = None,
    temperature: float | None = None,
    model: Any = None,
) -> Any:
    """Generate, run the tools the model calls, repeat until it answers.

    `messages`: a user text or Message dicts; `tools`: `Tool`s (plain
    functions are wrapped with `tool`); `max_rounds`: the most tool rounds
    (>= 0); `response_model`: parse the final answer into this pydantic
    model (sent as `format: "json"` with the schema prompt); `tool_choice`,
    `max_tokens`, `temperature`, `model` as for `Llm.generate`.

    Returns the final answer's text (or the `response_model` instance).
    Raises `ToolRoundsExceededError`, `IncompleteOutputError`,
    `OutputValidationError`, and every error of `Llm.generate`.
    Implements NAP-LLM, Generation (`toolUse`) and Message (`toolResult`).
    """
    if max_rounds < 0:
        raise ValueError("max_rounds must be >= 0")
    wrapped = [t if isinstance(t, Tool) else Tool(t) for t in tools]
    by_name = {t.name: t for t in wrapped}
    shape = Structured.of(response_model, None)
    history = to_messages(messages)
    prefix = [shape.prompt()] if shape is not None else None
    rounds = 0
    while True:
        reply = await llm._reply(
            history,
            model=model,
            format="json" if shape is not None else None,
            max_tokens=max_tokens,
            temperature=temperature,
            tools=wrapped,
            tool_choice=tool_choice,
            prefix=prefix,
        )
        if reply.finish == "toolUse":
            if rounds >= max_rounds:
                raise ToolRoundsExceededError(max_rounds, history)
            rounds += 1
            history.append(reply.assistant_message())
            for call in reply.tool_calls:
                history.append(await _answer(call, by_name))
            continue
        if reply.finish != "stop":
            raise IncompleteOutputError(reply)
        return shape.parse(reply) if shape is not None else reply.text
