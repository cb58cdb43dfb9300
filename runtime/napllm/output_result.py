"""The terminal result of one response: the second half of `translate.GenerationAssembler`.

Rules (NAP-LLM, Generation, Tool, Finish; LMSP 6.3 terminal events)
- `response.completed` -> `stop`, or `toolUse` when any function call
  completed, whatever the provider's stop label. Every output item must
  have completed. Completed calls must have arguments parsing to a JSON
  object with the strict reader (`jsontext.read_json`) and a name in the
  current tools, and must obey the tool choice (`none`: no call;
  `required`: at least one; named: at least one, all that name); without
  current tools no call is accepted. `format: json` stop output must parse
  as a JSON object.
- `response.incomplete` with `max_output_tokens` -> `length`;
  `content_filter`, or a refusal part anywhere -> `refusal`. Truncated and
  refused results keep their text and thinking but carry no toolCall parts.
- `response.failed` and `error` raise the provider's own
  `errors.ProviderFailure` (its detail stays in the developer log); a stream
  without a terminal event, or any other terminal event, is
  `provider-error`.
- `content` follows `output_index`: the result is built from the frozen
  record the reader settles (`output_order.OutputOrder.settle`), never by
  calling back into it; usage is mapped when well formed and left out
  otherwise (`map_usage`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from pydantic import ValidationError

from .lmsp import LmspUsage, failure_from_problem, parse_problem
from .output_order import SettledOutput, loads_or_invalid, provider_error
from .records import (
    Generation,
    GenerationRequest,
    OutputPart,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolChoice,
    Usage,
)


def map_usage(raw: object) -> Usage | None:
    """LMSP usage -> NAP-LLM Usage; `None` when absent or malformed."""
    if not isinstance(raw, dict):
        return None
    try:
        usage = LmspUsage.model_validate(raw)
        data: dict[str, int] = {
            "inputTokens": usage.input_tokens,
            "outputTokens": usage.output_tokens,
        }
        if usage.input_tokens_details is not None:
            if usage.input_tokens_details.cached_tokens is not None:
                data["cacheReadTokens"] = usage.input_tokens_details.cached_tokens
            if usage.input_tokens_details.cache_write_tokens is not None:
                data["cacheWriteTokens"] = usage.input_tokens_details.cache_write_tokens
        if (
            usage.output_tokens_details is not None
            and usage.output_tokens_details.reasoning_tokens is not None
        ):
            data["reasoningTokens"] = usage.output_tokens_details.reasoning_tokens
        return Usage(**data)
    except (ValidationError, TypeError):
        return None


def build_generation(
    settle: Callable[[bool], SettledOutput],
    request: GenerationRequest,
    mode: str | None,
    terminal: tuple[str, dict[str, Any]] | None,
) -> Generation:
    """The Generation for the stream that ended (module rules).

    `settle(completed)`: the reader's `OutputOrder.settle`, called once,
    when the terminal event is known to end the output (`completed`: it
    is `response.completed`); `mode` is the request's effective tool
    choice (`translate.tool_choice_mode`), `terminal` the terminal event's
    name and data (None: the stream ended without one). Raises `NapError`
    (`provider-error`) when the stream broke the LMSP rules, and the
    provider's `ProviderFailure` for `response.failed` or `error`.
    """
    if terminal is None:
        raise provider_error("stream ended without a final event")
    name, data = terminal
    usage = map_usage(data.get("usage"))
    if name == "response.completed":
        return _completed(settle(True), request, mode, usage)
    if name == "response.incomplete":
        output = settle(False)
        details = data.get("incomplete_details")
        reason = details.get("reason") if isinstance(details, dict) else None
        refusal = reason == "content_filter" or output.refused
        return _partial(output, "refusal" if refusal else "length", usage)
    if name == "response.failed" or name == "error":
        problem = parse_problem(data.get("error"))
        raise failure_from_problem(None, problem)
    raise provider_error(f"terminal event {name}")


def _partial(
    output: SettledOutput, finish: Literal["length", "refusal"], usage: Usage | None
) -> Generation:
    parts: list[OutputPart] = []
    for block in output.blocks:
        if block.kind == "toolCall":
            continue  # toolCall parts never survive truncation or refusal
        if block.kind == "text" and block.text:
            parts.append(TextPart(type="text", text=block.text))
        elif block.kind == "thinking" and block.text:
            parts.append(ThinkingPart(type="thinking", text=block.text))
    return Generation(content=parts, finish=finish, usage=usage)


def _completed(
    output: SettledOutput, request: GenerationRequest, mode: str | None, usage: Usage | None
) -> Generation:
    if not output.complete:
        return _partial(output, "refusal", usage)
    tool_names = {t.name for t in request.active_tools}
    parts: list[OutputPart] = []
    calls: list[ToolCallPart] = []
    for block in output.blocks:
        if block.kind == "toolCall":
            call = _checked_call(tool_names, block.tool_call_id, block.name, block.final)
            calls.append(call)
            parts.append(call)
        elif not block.started:
            continue  # a message or summary that never had text
        elif block.kind == "text":
            parts.append(TextPart(type="text", text=block.final or ""))
        else:
            parts.append(ThinkingPart(type="thinking", text=block.final or ""))
    _check_choice(request, mode, calls)
    if calls:
        return Generation(content=parts, finish="toolUse", usage=usage)
    if request.output_format == "json":
        text = "".join(p.text for p in parts if isinstance(p, TextPart))
        if not isinstance(loads_or_invalid(text), dict):
            raise provider_error("format json output is not a JSON object")
    return Generation(content=parts, finish="stop", usage=usage)


def _checked_call(
    tool_names: set[str], call_id: str | None, name: str | None, final: str | None
) -> ToolCallPart:
    if not tool_names:
        raise provider_error("tool call without current tools")
    if name not in tool_names:
        raise provider_error("tool call names an unknown tool")
    arguments = loads_or_invalid(final or "")
    if not isinstance(arguments, dict):
        raise provider_error("tool call arguments are not a strict JSON object")
    assert call_id is not None and name is not None
    return ToolCallPart(type="toolCall", toolCallId=call_id, name=name, arguments=arguments)


def _check_choice(request: GenerationRequest, mode: str | None, calls: list[ToolCallPart]) -> None:
    if mode == "none" and calls:
        raise provider_error("tool call despite toolChoice none")
    if mode == "required" and not calls:
        raise provider_error("no tool call despite toolChoice required")
    if mode == "tool":
        choice = request.toolChoice
        assert isinstance(choice, ToolChoice)
        if not calls or any(c.name != choice.name for c in calls):
            raise provider_error("forced tool not called as required")
