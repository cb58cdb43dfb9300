"""LMSP output items in output order: the first half of `translate.GenerationAssembler`.

Rules (LMSP 6.3 output items and their events; NAP-LLM, Delta, Message)
- Output items may complete out of order (a function call done before the
  message that precedes it). Delta blocks follow `output_index`: an item's
  block starts only once every item with a lower `output_index` has started
  its block or completed (until then its fragments are held in its
  `streaming.Block`), so each `blockIndex` is the block's index in the
  result's `content` while blocks already started still interleave. An item
  added below one whose block already started is `provider-error`.
- Text: each block's fragments pass through its own
  `streaming.SurrogateJoiner` (split UTF-16 pairs joined, lone halves
  U+FFFD). A completed item's text must extend what was streamed; completed
  tool-call arguments must equal the streamed ones as text or as strict JSON
  (`jsontext.read_json`), and hold no lone surrogate; call ids must be valid
  Unicode and keep the id their `start` carried (one synthesised when the
  provider gives none, NAP-LLM, Message). A toolCall block starts only when
  its name is one of the current tools: an unknown name is never streamed.
- A delta for an unknown item, of the wrong kind, after its item completed,
  or an item completed twice, is `provider-error` with the fixed safe
  message (`provider_error`); no provider text is echoed.
- One response's output is bounded (docs/security.md, "Provider output"):
  at most `lmsp.MAX_OUTPUT_ITEMS` output items and `lmsp.MAX_OUTPUT_CHARS` characters
  of text, thinking and arguments together (counted as they are kept);
  past either bound the response is `provider-error` at once. Without them
  a fast server fills the page's memory before the deadline, and reading
  an item costs time linear in the items before it (output order), so
  20,000 items held the page's only thread for minutes.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any, Literal

from .errors import ErrorCode, NapError
from .jsontext import JsonTextError, read_json
from .lmsp import (
    MAX_OUTPUT_CHARS,
    MAX_OUTPUT_ITEMS,
    FunctionCallItem,
    MessageItem,
    OutputText,
    ReasoningItem,
    Refusal,
    SummaryText,
    parse_output_item,
)
from .streaming import (
    Block,
    BlockKind,
    DeltaStream,
    SurrogateJoiner,
    has_lone_surrogate,
    join_surrogates,
)


def provider_error(reason: str) -> NapError:
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


class OutputOrder:
    """The output items of one response and the delta blocks they become (module rules).

    `added(data)`, `text_delta(data, kind)`, `refusal(data)`,
    `arguments_delta(data)` and `done(data)` take the `data` of the matching
    LMSP events and raise `NapError` (`provider-error`) as soon as the output
    is known to be invalid; blocks start, grow and end on `stream` as soon
    as their order allows. `settle(completed)` ends the reading and returns
    the frozen `SettledOutput` the result is built from
    (`output_result.build_generation`), which never calls back.
    """

    def __init__(self, stream: DeltaStream, tool_names: set[str]) -> None:
        self._stream = stream
        self._tool_names = tool_names
        self.items: dict[int, _ItemBlocks] = {}
        self._by_id: dict[str, _ItemBlocks] = {}
        self._held_back = False  # a ready block waits for an earlier item
        self._chars = 0  # characters kept by every block so far

    def _keep(self, block: _Block, piece: str) -> None:
        """Append `piece` to `block`, within `MAX_OUTPUT_CHARS` for the response."""
        self._chars += len(piece)
        if self._chars > MAX_OUTPUT_CHARS:
            raise provider_error("output longer than the bound")
        block.fragments.append(piece)

    # -- events ----------------------------------------------------------------

    def text_delta(self, data: dict[str, Any], kind: BlockKind) -> None:
        """`response.output_text.delta` (`text`) or a reasoning summary's (`thinking`)."""
        self._text_delta(self._lookup(data), kind, data.get("delta"))

    def refusal(self, data: dict[str, Any]) -> None:
        """`response.refusal.delta`: the item is a refusal."""
        self._lookup(data).refusal = True

    def arguments_delta(self, data: dict[str, Any]) -> None:
        """`response.function_call_arguments.delta`."""
        self._arguments_delta(self._lookup(data), data.get("delta"))

    def _index_of(self, data: dict[str, Any]) -> int:
        index = data.get("output_index")
        if not isinstance(index, int) or isinstance(index, bool) or index < 0:
            raise provider_error("output_index missing")
        return index

    def added(self, data: dict[str, Any]) -> None:
        """`response.output_item.added`."""
        raw = data.get("item")
        if not isinstance(raw, dict):
            raise provider_error("added item is not an object")
        index = self._index_of(data)
        if index in self.items:
            raise provider_error("output_index reused")
        if len(self.items) >= MAX_OUTPUT_ITEMS:
            raise provider_error("more output items than the bound")
        if any(
            block.index is not None
            for later, other in self.items.items()
            if later > index
            for block in other.blocks
        ):
            raise provider_error("output item added below one already streaming")
        kind_raw = raw.get("type")
        kind: Literal["message", "function_call", "reasoning", "other"] = (
            kind_raw if kind_raw in ("message", "function_call", "reasoning") else "other"
        )
        item_id = raw.get("id") if isinstance(raw.get("id"), str) else None
        item = _ItemBlocks(index, item_id, kind)
        self.items[index] = item
        if item_id:
            self._by_id[item_id] = item
        if kind == "function_call":
            name = raw.get("name")
            call_id = raw.get("call_id")
            block = _Block("toolCall")
            if isinstance(call_id, str) and call_id:
                if has_lone_surrogate(call_id):
                    raise provider_error("call id is not valid Unicode")
                block.tool_call_id = call_id
            else:
                block.tool_call_id = synth_call_id()
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
        if isinstance(index, int) and index in self.items:
            return self.items[index]
        raise provider_error("delta for an unknown item")

    # -- streaming in output order ---------------------------------------------

    @staticmethod
    def _settled_order(item: _ItemBlocks) -> bool:
        """Whether `item`'s place among the blocks is fixed (started or completed)."""
        return item.done or any(block.index is not None for block in item.blocks)

    def _streamable(self, item: _ItemBlocks) -> bool:
        """Every item before `item` (by output_index) has started or completed."""
        return all(
            self._settled_order(other)
            for index, other in self.items.items()
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
            if self._held_back:
                self._held_back = False
                self.pump()
        else:
            self._stream.push(block)
        if block.done and not block.ended and block.index is not None:
            self._stream.end(block.index)

    def pump(self) -> None:
        """Sync every item in output order, up to the first one neither started nor done."""
        for index in sorted(self.items):
            item = self.items[index]
            for block in item.blocks:
                self._sync(item, block)
            if not self._settled_order(item):
                return

    # -- deltas --------------------------------------------------------------------

    def _text_delta(self, item: _ItemBlocks, kind: BlockKind, delta: object) -> None:
        if not isinstance(delta, str):
            raise provider_error("delta is not text")
        if item.done:
            raise provider_error("delta after the item completed")
        expected = "message" if kind == "text" else "reasoning"
        if item.kind != expected:
            raise provider_error("delta kind does not match the item")
        if not item.blocks or item.blocks[-1].kind != kind:
            item.blocks.append(_Block(kind))
        block = item.blocks[-1]
        if not delta:
            return
        piece = block.joiner.feed(delta)
        if piece:
            self._keep(block, piece)
            self._sync(item, block)

    def _arguments_delta(self, item: _ItemBlocks, delta: object) -> None:
        if not isinstance(delta, str):
            raise provider_error("arguments delta is not text")
        if item.kind != "function_call" or item.done:
            raise provider_error("arguments delta for a non-call item")
        block = item.blocks[0]
        piece = block.joiner.feed(delta)
        if piece:
            self._keep(block, piece)
            self._sync(item, block)

    def done(self, data: dict[str, Any]) -> None:
        """`response.output_item.done`."""
        index = self._index_of(data)
        raw = data.get("item")
        item = self.items.get(index)
        if item is None:
            # an item completed without being added first: treat as both
            self.added(data)
            item = self.items[index]
        if item.done:
            raise provider_error("item completed twice")
        try:
            parsed = parse_output_item(raw)
        except ValueError as exc:
            raise provider_error("malformed completed item") from exc
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
        self.pump()

    def _complete_call(self, item: _ItemBlocks, parsed: FunctionCallItem) -> None:
        block = item.blocks[0] if item.blocks else None
        if block is None or block.kind != "toolCall":
            raise provider_error("function call completed for a non-call item")
        if parsed.call_id and block.tool_call_id != parsed.call_id:
            if has_lone_surrogate(parsed.call_id):
                raise provider_error("call id is not valid Unicode")
            if block.index is None:
                block.tool_call_id = parsed.call_id
                block.synthesized = False
            elif not block.synthesized:
                raise provider_error("call id changed after the call started")
            # else: the id synthesised at start stays, so deltas and
            # result agree (NAP-LLM, Message: synthesised ids are stable)
        if block.name is None:
            block.name = parsed.name
        elif block.name != parsed.name:
            raise provider_error("tool name changed after the call started")
        arguments = join_surrogates(parsed.arguments, replace=False)
        if has_lone_surrogate(arguments):
            raise provider_error("tool call arguments hold a lone surrogate")
        block.joiner.discard()
        streamed = block.text
        if not streamed:
            self._keep(block, arguments)
        elif streamed != arguments and loads_or_invalid(streamed) != loads_or_invalid(arguments):
            raise provider_error("streamed arguments differ from the completed call")
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
                raise provider_error("streamed text differs from the completed item")
            self._keep(blocks[-1], final[len(streamed) :])
        for block in blocks:
            block.joiner.discard()  # the completed text holds the whole pair
            block.final = block.text
            block.done = True

    # -- the settled record for the result ---------------------------------------

    def settle(self, completed: bool) -> SettledOutput:
        """End the reading and hand the result its frozen record (no call back).

        `completed`: the response ended `response.completed`. Then every item
        must have completed (else `provider-error`) and, unless one carried a
        refusal, the blocks still held back start on the stream (`complete`).
        Otherwise (truncated, refused) each unfinished text or thinking block
        keeps what it holds, a half pair that never completed as U+FFFD (sent
        on as a last fragment when the block started).
        """
        refused = any(item.refusal for item in self.items.values())
        if completed and not all(item.done for item in self.items.values()):
            raise provider_error("an output item never completed")
        complete = completed and not refused
        if complete:
            self.pump()
        else:
            self._end_unfinished_text()
        blocks = tuple(
            SettledBlock(
                kind=block.kind,
                started=block.index is not None,
                text=block.text,
                final=block.final,
                tool_call_id=block.tool_call_id,
                name=block.name,
            )
            for index in sorted(self.items)
            for block in self.items[index].blocks
        )
        return SettledOutput(blocks=blocks, refused=refused, complete=complete)

    def _end_unfinished_text(self) -> None:
        for index in sorted(self.items):
            item = self.items[index]
            for block in item.blocks:
                if block.kind == "toolCall" or block.done:
                    continue
                rest = block.joiner.flush()
                if rest:
                    block.fragments.append(rest)
                    if block.index is not None:
                        self._sync(item, block)


@dataclass(frozen=True)
class SettledBlock:
    """One block of a settled response, by `output_index` (`OutputOrder.settle`).

    `kind`: `text`, `thinking` or `toolCall`; `started`: whether it reached
    the delta stream (a message or summary that never had text did not);
    `text`: what it holds (a truncated block's text); `final`: the completed
    item's text or arguments (None when its item never completed);
    `tool_call_id` / `name`: a toolCall block's id and tool name.
    """

    kind: BlockKind
    started: bool
    text: str
    final: str | None
    tool_call_id: str | None
    name: str | None


@dataclass(frozen=True)
class SettledOutput:
    """A response's output once its stream ended: what `output_result` builds from.

    `blocks`: every block by `output_index`, then as its item made them;
    `refused`: an item carried a refusal; `complete`: the response completed
    without a refusal, so every block holds its `final` text.
    """

    blocks: tuple[SettledBlock, ...]
    refused: bool
    complete: bool


INVALID = object()


def loads_or_invalid(text: str) -> Any:
    """Parse provider JSON with the strict reader; a sentinel (never equal to a
    JSON value) when it fails (`jsontext.read_json`: RFC 8259, finite doubles,
    safe integers, no lone surrogates, depth at most `DEFAULT_MAX_DEPTH`)."""
    try:
        return read_json(text)
    except JsonTextError:
        return INVALID


def synth_call_id() -> str:
    """A fresh call id for a provider that gave none (NAP-LLM, Message)."""
    return "call_" + secrets.token_hex(12)
