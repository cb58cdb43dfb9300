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
- `completed` -> `stop`, or `toolUse` when any function call completed,
  whatever the provider's stop label. Completed calls must have arguments
  parsing to a JSON object and a name in the current tools, and must obey
  the tool choice (`none`: no call; `required`: at least one; named: at least
  one, all that name); otherwise `provider-error`. Without current tools, no
  new call is accepted. `format: json` stop output must parse as a JSON
  object.
- `incomplete` with `max_output_tokens` -> `length`; `content_filter` or a
  refusal part -> `refusal`. Truncated and refused results keep their text
  and thinking but carry no toolCall parts.
- The result follows `output_index`, and the delta blocks start in that
  order too (a later item waits until every earlier one has started or
  completed), so `blockIndex` is the index in `content` even when items
  complete out of order; replays then keep the provider's order.
- Text fragments pass through `streaming.SurrogateJoiner` (split UTF-16
  pairs joined, unpaired halves U+FFFD). Completed arguments and call ids
  with a lone surrogate, and arguments or `format: json` answers that fail
  the strict reader (`jsontext.read_json`: NaN, 1e400, unsafe integers,
  duplicate keys, nesting over `DEFAULT_MAX_DEPTH`), are `provider-error`.
- `failed`, `cancelled` (not asked by us), `error`, a stream that ends
  without a final event, an item never completed, a delta for an unknown
  item, or text deltas contradicting the completed item -> `provider-error`.
  Messages are the fixed safe ones; no provider text is echoed.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import ValidationError

from .errors import ErrorCode, NapError, unsupported
from .jsontext import JsonTextError, read_json
from .lmsp import (
    FunctionCallIn,
    FunctionCallItem,
    FunctionCallOutputIn,
    FunctionTool,
    InputImage,
    InputText,
    JsonSchemaSpec,
    LmspEvent,
    LmspRequest,
    LmspUsage,
    MessageItem,
    MessageItemIn,
    NamedToolChoice,
    OutputText,
    ReasoningItem,
    Refusal,
    ResponseFormat,
    SummaryText,
    failure_from_problem,
    parse_output_item,
    parse_problem,
)
from .records import (
    Capabilities,
    Generation,
    GenerationRequest,
    ImagePart,
    Message,
    OutputPart,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolChoice,
    Usage,
)
from .streaming import (
    Block,
    BlockKind,
    DeltaStream,
    SurrogateJoiner,
    has_lone_surrogate,
    join_surrogates,
)

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
    rules. Never changes the request.
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


def _fail(reason: str) -> NapError:
    """`provider-error` with the fixed safe message; `reason` is for developers only."""
    error = NapError(ErrorCode.PROVIDER_ERROR)
    error.__notes__ = [reason]
    return error


@dataclass(eq=False)
class _Block(Block):
    """A block read from LMSP output: the stream's record (`streaming.Block`,
    which holds its text once) and the reader's state."""

    final: str | None = None  # text / arguments of the completed item
    done: bool = False
    synthesized: bool = False
    joiner: SurrogateJoiner = field(default_factory=SurrogateJoiner)


@dataclass
class _ItemBlocks:
    """One LMSP output item being read and the NAP blocks it becomes."""

    output_index: int
    item_id: str | None
    kind: Literal["message", "function_call", "reasoning", "other"]
    blocks: list[_Block] = field(default_factory=list)
    done: bool = False
    refusal: bool = False


class GenerationAssembler:
    """Assemble a NAP-LLM Generation from the LMSP events of one response.

    Streams the deltas on the way and builds the terminal result.

    `feed(event)` returns `True` once a terminal event was handled. When
    the stream has ended, `finish()` returns the Generation or raises
    `NapError`: without a terminal event it raises `provider-error` (missing
    completion marker). `feed` raises `NapError` as soon as the output is
    known to be invalid.

    Order: output items may complete out of order (a function call done
    before the message that precedes it). The result follows `output_index`,
    and so do the delta blocks: an item's block starts only once every item
    with a lower `output_index` has started its block or completed (until
    then its fragments are buffered), so each `blockIndex` is the block's
    index in the result's `content` (NAP-LLM, Delta) while blocks already
    started still interleave. An item added below one whose block already
    started is `provider-error`.
    Text: fragments pass through a `streaming.SurrogateJoiner` per block,
    so split UTF-16 pairs are joined and lone surrogates become U+FFFD;
    completed tool-call arguments holding a lone surrogate, and call ids
    that are not valid Unicode, are `provider-error`. A toolCall block starts
    only when its name is one of the current tools (an unknown name is never
    streamed; it fails the completed result).
    """

    def __init__(self, request: GenerationRequest, stream: DeltaStream) -> None:
        self._request = request
        self._stream = stream
        self._items: dict[int, _ItemBlocks] = {}
        self._by_id: dict[str, _ItemBlocks] = {}
        self._order: list[_Block] = []  # started blocks, by block index
        self._usage: Usage | None = None
        self._terminal: tuple[str, dict[str, Any]] | None = None
        self._tool_names = {t.name for t in request.active_tools}
        self._held_back = False  # a ready block waits for an earlier item

    # -- events ----------------------------------------------------------------

    def feed(self, event: LmspEvent) -> bool:
        """Handle one event; unknown event types are ignored (LMSP 6.3)."""
        if self._terminal is not None:
            return True
        data = event.data
        name = event.event
        if name == "response.output_item.added":
            self._added(data)
        elif name == "response.output_text.delta":
            item = self._lookup(data)
            self._text_delta(item, "text", data.get("delta"))
        elif name == "response.reasoning_summary_text.delta":
            item = self._lookup(data)
            self._text_delta(item, "thinking", data.get("delta"))
        elif name == "response.refusal.delta":
            self._lookup(data).refusal = True
        elif name == "response.function_call_arguments.delta":
            self._arguments_delta(self._lookup(data), data.get("delta"))
        elif name == "response.output_item.done":
            self._done(data)
        elif event.terminal:
            self._terminal = (name, data)
            self._usage = map_usage(data.get("usage"))
            return True
        return False

    def _index_of(self, data: dict[str, Any]) -> int:
        index = data.get("output_index")
        if not isinstance(index, int) or isinstance(index, bool) or index < 0:
            raise _fail("output_index missing")
        return index

    def _added(self, data: dict[str, Any]) -> None:
        raw = data.get("item")
        if not isinstance(raw, dict):
            raise _fail("added item is not an object")
        index = self._index_of(data)
        if index in self._items:
            raise _fail("output_index reused")
        if any(
            block.index is not None
            for later, other in self._items.items()
            if later > index
            for block in other.blocks
        ):
            raise _fail("output item added below one already streaming")
        kind_raw = raw.get("type")
        kind: Literal["message", "function_call", "reasoning", "other"] = (
            kind_raw if kind_raw in ("message", "function_call", "reasoning") else "other"
        )
        item_id = raw.get("id") if isinstance(raw.get("id"), str) else None
        item = _ItemBlocks(index, item_id, kind)
        self._items[index] = item
        if item_id:
            self._by_id[item_id] = item
        if kind == "function_call":
            name = raw.get("name")
            call_id = raw.get("call_id")
            block = _Block("toolCall")
            if isinstance(call_id, str) and call_id:
                if has_lone_surrogate(call_id):
                    raise _fail("call id is not valid Unicode")
                block.tool_call_id = call_id
            else:
                block.tool_call_id = _synth_call_id()
                block.synthesized = True
            item.blocks.append(block)
            if isinstance(name, str) and name:
                block.name = name
                self._sync(item, block)

    def _lookup(self, data: dict[str, Any]) -> _ItemBlocks:
        item_id = data.get("item_id")
        if isinstance(item_id, str) and item_id in self._by_id:
            return self._by_id[item_id]
        index = data.get("output_index")
        if isinstance(index, int) and index in self._items:
            return self._items[index]
        raise _fail("delta for an unknown item")

    # -- streaming in output order ---------------------------------------------

    @staticmethod
    def _settled_order(item: _ItemBlocks) -> bool:
        """Whether `item`'s place among the blocks is fixed (started or completed)."""
        return item.done or any(block.index is not None for block in item.blocks)

    def _streamable(self, item: _ItemBlocks) -> bool:
        """Every item before `item` (by output_index) has started or completed."""
        return all(
            self._settled_order(other)
            for index, other in self._items.items()
            if index < item.output_index
        )

    def _ready(self, block: _Block) -> bool:
        if block.kind == "toolCall":
            return block.name is not None and block.name in self._tool_names
        return bool(block.fragments)

    def _sync(self, item: _ItemBlocks, block: _Block) -> None:
        """Start `block` when it may, send its unsent fragments, end it when done."""
        if block.index is None:
            if not self._ready(block):
                return
            if not self._streamable(item):
                self._held_back = True
                return
            self._stream.begin(block)  # with the fragments it holds
            self._order.append(block)
            if self._held_back:
                self._held_back = False
                self._pump()
        else:
            self._stream.push(block)
        if block.done and not block.ended and block.index is not None:
            self._stream.end(block.index)

    def _pump(self) -> None:
        """Sync every item in output order, up to the first one neither started nor done."""
        for index in sorted(self._items):
            item = self._items[index]
            for block in item.blocks:
                self._sync(item, block)
            if not self._settled_order(item):
                return

    # -- deltas --------------------------------------------------------------------

    def _text_delta(self, item: _ItemBlocks, kind: BlockKind, delta: object) -> None:
        if not isinstance(delta, str):
            raise _fail("delta is not text")
        if item.done:
            raise _fail("delta after the item completed")
        expected = "message" if kind == "text" else "reasoning"
        if item.kind != expected:
            raise _fail("delta kind does not match the item")
        if not item.blocks or item.blocks[-1].kind != kind:
            item.blocks.append(_Block(kind))
        block = item.blocks[-1]
        if not delta:
            return
        piece = block.joiner.feed(delta)
        if piece:
            block.fragments.append(piece)
            self._sync(item, block)

    def _arguments_delta(self, item: _ItemBlocks, delta: object) -> None:
        if not isinstance(delta, str):
            raise _fail("arguments delta is not text")
        if item.kind != "function_call" or item.done:
            raise _fail("arguments delta for a non-call item")
        block = item.blocks[0]
        piece = block.joiner.feed(delta)
        if piece:
            block.fragments.append(piece)
            self._sync(item, block)

    def _done(self, data: dict[str, Any]) -> None:
        index = self._index_of(data)
        raw = data.get("item")
        item = self._items.get(index)
        if item is None:
            # an item completed without being added first: treat as both
            self._added(data)
            item = self._items[index]
        if item.done:
            raise _fail("item completed twice")
        try:
            parsed = parse_output_item(raw)
        except ValueError as exc:
            raise _fail("malformed completed item") from exc
        if isinstance(parsed, MessageItem):
            text = "".join(p.text for p in parsed.content if isinstance(p, OutputText))
            if any(isinstance(p, Refusal) for p in parsed.content):
                item.refusal = True
            self._complete_text(item, "text", text)
        elif isinstance(parsed, ReasoningItem):
            text = "".join(p.text for p in parsed.summary if isinstance(p, SummaryText))
            self._complete_text(item, "thinking", text)
        elif isinstance(parsed, FunctionCallItem):
            self._complete_call(item, parsed)
        # unknown item types are ignored
        item.done = True
        self._pump()

    def _complete_call(self, item: _ItemBlocks, parsed: FunctionCallItem) -> None:
        block = item.blocks[0] if item.blocks else None
        if block is None or block.kind != "toolCall":
            raise _fail("function call completed for a non-call item")
        if parsed.call_id and block.tool_call_id != parsed.call_id:
            if has_lone_surrogate(parsed.call_id):
                raise _fail("call id is not valid Unicode")
            if block.index is None:
                block.tool_call_id = parsed.call_id
                block.synthesized = False
            elif not block.synthesized:
                raise _fail("call id changed after the call started")
            # else: the id synthesised at start stays, so deltas and
            # result agree (NAP-LLM, Message: synthesised ids are stable)
        if block.name is None:
            block.name = parsed.name
        elif block.name != parsed.name:
            raise _fail("tool name changed after the call started")
        arguments = join_surrogates(parsed.arguments, replace=False)
        if has_lone_surrogate(arguments):
            raise _fail("tool call arguments hold a lone surrogate")
        block.joiner.discard()
        streamed = block.text
        if not streamed:
            block.fragments.append(arguments)
        elif streamed != arguments and _loads(streamed) != _loads(arguments):
            raise _fail("streamed arguments differ from the completed call")
        block.final = arguments
        block.done = True

    def _complete_text(self, item: _ItemBlocks, kind: BlockKind, final: str) -> None:
        final = join_surrogates(final)
        blocks = [b for b in item.blocks if b.kind == kind]
        if not blocks:
            if not final:
                return
            blocks = [_Block(kind)]
            item.blocks.append(blocks[0])
        streamed = "".join(b.text for b in blocks)
        if streamed != final:
            if not final.startswith(streamed):
                raise _fail("streamed text differs from the completed item")
            blocks[-1].fragments.append(final[len(streamed) :])
        for block in blocks:
            block.joiner.discard()  # the completed text holds the whole pair
            block.final = block.text
            block.done = True

    # -- the terminal result -----------------------------------------------------

    def finish(self) -> Generation:
        """Build the Generation after the stream ended.

        Raises `NapError` when the stream broke the LMSP rules, and the
        provider's own `ProviderFailure` for a `response.failed` or `error`
        event, so that the shell keeps its detail for the developer log and
        shows its hint, as for a failure raised by the provider itself.
        """
        if self._terminal is None:
            raise _fail("stream ended without a final event")
        name, data = self._terminal
        if name == "response.completed":
            return self._completed()
        if name == "response.incomplete":
            details = data.get("incomplete_details")
            reason = details.get("reason") if isinstance(details, dict) else None
            refusal = reason == "content_filter" or any(i.refusal for i in self._items.values())
            return self._partial("refusal" if refusal else "length")
        if name == "response.failed" or name == "error":
            problem = parse_problem(data.get("error"))
            raise failure_from_problem(None, problem)
        raise _fail(f"terminal event {name}")

    def _blocks_in_order(self) -> list[_Block]:
        return [block for index in sorted(self._items) for block in self._items[index].blocks]

    def _partial(self, finish: Literal["length", "refusal"]) -> Generation:
        parts: list[OutputPart] = []
        for block in self._blocks_in_order():
            if block.kind == "toolCall":
                continue  # toolCall parts never survive truncation or refusal
            if not block.done:
                rest = block.joiner.flush()  # a half pair that never completed
                if rest:
                    block.fragments.append(rest)
                    if block.index is not None:
                        self._sync(self._items[self._item_of(block)], block)
            text = block.text
            if block.kind == "text" and text:
                parts.append(TextPart(type="text", text=text))
            elif block.kind == "thinking" and text:
                parts.append(ThinkingPart(type="thinking", text=text))
        return Generation(content=parts, finish=finish, usage=self._usage)

    def _item_of(self, block: _Block) -> int:
        for index, item in self._items.items():
            if block in item.blocks:
                return index
        raise _fail("block without an item")

    def _completed(self) -> Generation:
        if any(not item.done for item in self._items.values()):
            raise _fail("an output item never completed")
        if any(item.refusal for item in self._items.values()):
            return self._partial("refusal")
        self._pump()
        parts: list[OutputPart] = []
        calls: list[ToolCallPart] = []
        for block in self._blocks_in_order():
            if block.kind == "toolCall":
                call = self._checked_call(block)
                calls.append(call)
                parts.append(call)
            elif block.index is None:
                continue  # a message or summary that never had text
            elif block.kind == "text":
                parts.append(TextPart(type="text", text=block.final or ""))
            else:
                parts.append(ThinkingPart(type="thinking", text=block.final or ""))
        self._check_choice(calls)
        if calls:
            return Generation(content=parts, finish="toolUse", usage=self._usage)
        if self._request.output_format == "json":
            text = "".join(p.text for p in parts if isinstance(p, TextPart))
            if not isinstance(_loads(text), dict):
                raise _fail("format json output is not a JSON object")
        return Generation(content=parts, finish="stop", usage=self._usage)

    def _checked_call(self, block: _Block) -> ToolCallPart:
        if not self._tool_names:
            raise _fail("tool call without current tools")
        if block.name not in self._tool_names:
            raise _fail("tool call names an unknown tool")
        arguments = _loads(block.final or "")
        if not isinstance(arguments, dict):
            raise _fail("tool call arguments are not a strict JSON object")
        assert block.tool_call_id is not None and block.name is not None
        return ToolCallPart(
            type="toolCall", toolCallId=block.tool_call_id, name=block.name, arguments=arguments
        )

    def _check_choice(self, calls: list[ToolCallPart]) -> None:
        mode = tool_choice_mode(self._request)
        if mode == "none" and calls:
            raise _fail("tool call despite toolChoice none")
        if mode == "required" and not calls:
            raise _fail("no tool call despite toolChoice required")
        if mode == "tool":
            choice = self._request.toolChoice
            assert isinstance(choice, ToolChoice)
            if not calls or any(c.name != choice.name for c in calls):
                raise _fail("forced tool not called as required")


_INVALID = object()


def _loads(text: str) -> Any:
    """Parse provider JSON with the strict reader; a sentinel (never equal to a
    JSON value) when it fails (`jsontext.read_json`: RFC 8259, finite doubles,
    safe integers, no lone surrogates, depth at most `DEFAULT_MAX_DEPTH`)."""
    try:
        return read_json(text)
    except JsonTextError:
        return _INVALID


def _synth_call_id() -> str:
    """A fresh call id for a provider that gave none (NAP-LLM, Message)."""
    return "call_" + secrets.token_hex(12)
