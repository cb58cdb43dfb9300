"""NAP-LLM <-> LMSP 1.0: the two translations, done once for every provider.

NAP -> LMSP (`check_supported`, then `nap_to_lmsp`; NAP-LLM, GenerationRequest
and Message; LMSP 6.1, 6.5)
- A connection that cannot take the request fails with `unsupported`
  *before* submission: images (and images in tool results), `format: json`,
  tools, an unlisted tool-choice mode (never substituted), a temperature out
  of range, tool history on a connection without tools, and thinking history
  on a connection that needs opaque reasoning state (NAP-LLM, Part).
- Messages become input items in order; roles are kept. Assistant text and
  `toolCall` parts become a `message` item and `function_call` items
  (arguments as a JSON string) in part order; `thinking` parts are omitted.
  A toolResult becomes a `function_call_output` whose `output` is its text
  parts joined by newlines, prefixed with `Tool execution failed.` when
  `isError` is true (LMSP has no native error flag); its images travel in
  the `images` extension. `format: json` -> `response_format` json_schema
  `{"type": "object"}`; `maxTokens` -> `max_output_tokens`.

LMSP -> NAP (`GenerationAssembler`; NAP-LLM, Generation, Delta, Tool)
- Events drive a `DeltaStream`: text -> `text` blocks, function calls ->
  `toolCall` blocks whose `start` carries the call id (synthesised once when
  the provider gives none, then reused in deltas and result) and name,
  reasoning summaries -> `thinking` blocks.
- Two halves, each with its module's rules: `output_order.OutputOrder`
  reads the output items (delta blocks in `output_index` order, so
  `blockIndex` is the index in `content`; surrogate pairs joined; each
  item checked against what was streamed), and `output_result` builds the
  terminal result (finish normalisation: `stop`, `toolUse`, `length`,
  `refusal`; tool calls against the current tools and the tool choice;
  `format: json`; usage).
- Everything the provider got wrong is `provider-error` with the fixed safe
  message; no provider text is echoed.
"""

from __future__ import annotations

import json
from typing import Any

from .connection_records import Capabilities
from .errors import unsupported
from .lmsp import (
    FunctionCallIn,
    FunctionCallOutputIn,
    FunctionTool,
    InputImage,
    InputText,
    JsonSchemaSpec,
    LmspEvent,
    LmspRequest,
    MessageItemIn,
    NamedToolChoice,
    ResponseFormat,
)
from .output_order import OutputOrder
from .output_result import build_generation
from .output_result import map_usage as map_usage  # part of this module's API
from .records import (
    Generation,
    GenerationRequest,
    ImagePart,
    Message,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolChoice,
)
from .schema import has_costly_pattern
from .streaming import DeltaStream

TOOL_FAILED_PREFIX = "Tool execution failed."


# --------------------------------------------------------------------------
# NAP -> LMSP


def tool_choice_mode(request: GenerationRequest) -> str | None:
    """The effective mode: explicit, `auto` when tools are present, else None."""
    choice = request.toolChoice
    if isinstance(choice, ToolChoice):
        return "tool"
    if choice is not None:
        return choice
    return "auto" if request.active_tools else None


def check_supported(request: GenerationRequest, caps: Capabilities) -> None:
    """Raise `unsupported` if the connection cannot take `request` as it is.

    Implements NAP-LLM "Provider-specific input restrictions MUST produce
    `unsupported` before the generation request is sent" and Tool/Model mode
    rules, and refuses tool `parameters` whose `pattern`s are too ambiguous
    for a grammar sampler (`schema.has_costly_pattern`). Never changes the
    request.
    """
    for message in request.messages:
        images = any(isinstance(p, ImagePart) for p in message.content)
        if images and message.role == "toolResult" and not caps.images_in_tool_results:
            raise unsupported("This connection does not accept images in tool results.")
        if images and not caps.images:
            raise unsupported("This connection does not accept image input.")
    if request.output_format == "json" and not caps.json_output:
        raise unsupported("This connection does not support JSON-object output.")
    if request.active_tools and not caps.tools:
        raise unsupported("This connection does not support tool calling.")
    if any(has_costly_pattern(tool.schema_or_default()) for tool in request.active_tools or ()):
        # docs/security.md, "grammar cost": a grammar-constrained provider would
        # follow such a pattern at a cost per token that stalls its other clients.
        raise unsupported(
            "A tool's parameters hold a pattern too ambiguous to enforce (written-out or "
            "overlapping repetition)."
        )
    mode = tool_choice_mode(request)
    if mode is not None and mode not in caps.tool_choice_modes:
        raise unsupported(f"This connection does not support the tool choice mode {mode}.")
    history_calls = any(
        isinstance(p, ToolCallPart) for m in request.messages for p in m.content
    ) or any(m.role == "toolResult" for m in request.messages)
    if history_calls and not caps.tools:
        raise unsupported("This connection cannot represent tool calls in the history.")
    if request.temperature is not None:
        bounds = caps.temperature
        if bounds is None:
            raise unsupported("This connection does not accept a temperature.")
        if not bounds[0] <= request.temperature <= bounds[1]:
            raise unsupported("This temperature is outside the connection's supported range.")
    if caps.requires_reasoning_state and any(
        m.role == "assistant" and any(isinstance(p, ThinkingPart) for p in m.content)
        for m in request.messages
    ):
        raise unsupported(
            "Continuing this history needs provider reasoning state that cannot be represented."
        )


def nap_to_lmsp(request: GenerationRequest, model: str) -> LmspRequest:
    """Translate a validated, supported GenerationRequest into an LMSP request.

    `model` is the connection's model id. The result always streams; a
    provider that talks to a synchronous service turns the response into
    events itself.
    """
    items: list[Any] = []
    for message in request.messages:
        items.extend(_message_items(message))
    body: dict[str, Any] = {"model": model, "input": items, "stream": True}
    if request.maxTokens is not None:
        body["max_output_tokens"] = request.maxTokens
    if request.temperature is not None:
        body["temperature"] = request.temperature
    if request.output_format == "json":
        body["response_format"] = ResponseFormat(
            type="json_schema",
            json_schema=JsonSchemaSpec(name="json_object", schema_={"type": "object"}),
        )
    tools = request.active_tools
    if tools:
        body["tools"] = [
            FunctionTool(name=t.name, description=t.description, parameters=t.schema_or_default())
            for t in tools
        ]
        choice = request.toolChoice
        if isinstance(choice, ToolChoice):
            body["tool_choice"] = NamedToolChoice(name=choice.name)
        elif choice is not None:
            body["tool_choice"] = choice
    return LmspRequest(**body)


def _image(part: ImagePart) -> InputImage:
    return InputImage(mime_type=part.mimeType, data=part.data)


def _message_items(message: Message) -> list[Any]:
    if message.role == "toolResult":
        texts = [p.text for p in message.content if isinstance(p, TextPart)]
        if message.isError:
            texts.insert(0, TOOL_FAILED_PREFIX)
        images = [_image(p) for p in message.content if isinstance(p, ImagePart)]
        assert message.toolCallId is not None
        return [
            FunctionCallOutputIn(
                call_id=message.toolCallId, output="\n".join(texts), images=images or None
            )
        ]
    items: list[Any] = []
    run: list[Any] = []

    def close_run() -> None:
        if run:
            items.append(MessageItemIn(role=message.role, content=list(run)))  # type: ignore[arg-type]
            run.clear()

    for part in message.content:
        if isinstance(part, TextPart):
            run.append(InputText(text=part.text))
        elif isinstance(part, ImagePart):
            run.append(_image(part))
        elif isinstance(part, ToolCallPart):
            close_run()
            items.append(
                FunctionCallIn(
                    call_id=part.toolCallId,
                    name=part.name,
                    arguments=json.dumps(part.arguments, ensure_ascii=False),
                )
            )
        # thinking parts are display-only: omitted on replay (NAP-LLM, Part)
    close_run()
    return items


# --------------------------------------------------------------------------
# LMSP -> NAP


class GenerationAssembler:
    """Assemble a NAP-LLM Generation from the LMSP events of one response.

    Streams the deltas on the way (`output_order.OutputOrder`: output
    order, surrogates, the checks of each item) and builds the terminal
    result (`output_result.build_generation`: finish, tool calls, tool
    choice, JSON output, usage).

    `feed(event)` returns `True` once a terminal event was handled; it
    raises `NapError` as soon as the output is known to be invalid. When the
    stream has ended, `finish()` returns the Generation or raises: `NapError`
    (`provider-error`, e.g. a missing completion marker), or the provider's
    own `ProviderFailure` for a `response.failed` or `error` event, so that
    the shell keeps its detail for the developer log and shows its hint.
    """

    def __init__(self, request: GenerationRequest, stream: DeltaStream) -> None:
        self._request = request
        self._order = OutputOrder(stream, {t.name for t in request.active_tools})
        self._terminal: tuple[str, dict[str, Any]] | None = None

    def feed(self, event: LmspEvent) -> bool:
        """Handle one event; unknown event types are ignored (LMSP 6.3)."""
        if self._terminal is not None:
            return True
        data = event.data
        name = event.event
        if name == "response.output_item.added":
            self._order.added(data)
        elif name == "response.output_text.delta":
            self._order.text_delta(data, "text")
        elif name == "response.reasoning_summary_text.delta":
            self._order.text_delta(data, "thinking")
        elif name == "response.refusal.delta":
            self._order.refusal(data)
        elif name == "response.function_call_arguments.delta":
            self._order.arguments_delta(data)
        elif name == "response.output_item.done":
            self._order.done(data)
        elif event.terminal:
            self._terminal = (name, data)
            return True
        return False

    def finish(self) -> Generation:
        """Build the Generation after the stream ended (see the class)."""
        return build_generation(
            self._order.settle, self._request, tool_choice_mode(self._request), self._terminal
        )
