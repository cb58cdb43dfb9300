"""Delta blocks for one generation (NAP-LLM, Delta; Wire Protocol).

Rules
- Each block has one `start`, zero or more `delta` events and one `end`, in
  that order; `blockIndex` and the block kind never change; a toolCall
  `start` carries `toolCallId` and `name`.
- A block's `start` waits (at most one interval) to travel with its first
  fragment, so coalescing never delays the first text.
- `sequence` is contiguous from 0 for the generation. Numbers are assigned
  when an envelope is *sent*, so coalescing never leaves a gap.
- Deltas are optional and postMessage has no backpressure, so pending
  fragments are coalesced: events are queued, and a flush happens at most
  once per `interval_s` (the first immediately). Time is the shell's
  `Clock` port (its timers only): the stream itself does no I/O and reads
  no clock, so the product's coalescing runs unchanged under a test clock.
  Adjacent `delta` events of the same block still pending are merged by
  concatenation: a slow consumer gets fewer, larger deltas and never
  loses text (NAP-LLM, Wire Protocol: "Slow consumers may receive fewer,
  larger deltas; the runtime MUST NOT silently drop text").
- `finish()` flushes what is pending and closes the stream before the
  terminal result of a successful generation; `abort()` discards what is
  pending (after the last sent sequence, so no gap) before an error,
  cancellation or timeout. Nothing is sent after either: no delta may
  follow the terminal result.
- Lifecycle violations are runtime bugs and raise `RuntimeError`.

Text from providers (one rule for every provider and engine path)
- Providers stream text as fragments that may split a UTF-16 surrogate
  pair (`"\\ud83d"` in one event, `"\\ude00"` in the next): JSON and
  JavaScript strings are UTF-16, Python's are code points. Before any
  fragment is emitted, `SurrogateJoiner` holds back a trailing high
  surrogate and joins it with the next fragment's leading low surrogate,
  so U+1F600 arrives as one code point. A surrogate that is never paired
  (a low one without its high half, a high one followed by anything else,
  or one still held when its block completes or the stream ends) becomes
  U+FFFD REPLACEMENT CHARACTER, as a UTF-16 decoder with replacement does.
  No lone surrogate ever reaches a napplet, so every envelope encodes as
  UTF-8. (Tool-call arguments are stricter: a lone surrogate left in
  completed arguments is `provider-error`; see `translate.py`.)
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from .wire import delta_envelope

if TYPE_CHECKING:
    from .shell_ports import Clock, TimerHandle

BlockKind = Literal["text", "thinking", "toolCall"]

_SURROGATE = re.compile("[\ud800-\udfff]")


def has_lone_surrogate(text: str) -> bool:
    """Whether `text` holds a surrogate that is not half of a well-ordered pair."""
    return _SURROGATE.search(join_surrogates(text, replace=False)) is not None


def join_surrogates(text: str, *, replace: bool = True) -> str:
    """`text` with each well-ordered UTF-16 surrogate pair joined into one code point.

    Every other (lone) surrogate becomes U+FFFD, or stays as it is when
    `replace` is false (so a caller can refuse it). Text without surrogates
    is returned unchanged (the common case costs one regex search).
    """
    if _SURROGATE.search(text) is None:
        return text
    return text.encode("utf-16-le", "surrogatepass").decode(
        "utf-16-le", "replace" if replace else "surrogatepass"
    )


class SurrogateJoiner:
    """Joins UTF-16 surrogate pairs split across streamed fragments (module rules).

    `feed(fragment)` returns the text that may be emitted now (possibly
    empty); a trailing high surrogate is held back for the next fragment.
    `flush()` returns what is still held, as U+FFFD. `discard()` drops it.
    """

    __slots__ = ("_held",)

    def __init__(self) -> None:
        self._held = ""

    @property
    def held(self) -> str:
        """The high surrogate waiting for its low half (`""` when none)."""
        return self._held

    def feed(self, fragment: str) -> str:
        """The emit-ready text of `held + fragment`, holding a trailing high surrogate."""
        text = self._held + fragment if self._held else fragment
        self._held = ""
        if text and "\ud800" <= text[-1] <= "\udbff":
            self._held = text[-1]
            text = text[:-1]
        return join_surrogates(text)

    def flush(self) -> str:
        """End of the fragments: a held high surrogate becomes U+FFFD."""
        held, self._held = self._held, ""
        return join_surrogates(held)

    def discard(self) -> None:
        """Forget a held surrogate (the completed item's text replaces it)."""
        self._held = ""


@dataclass(slots=True)
class _Pending:
    """One queued block event; the attributes are the Delta record's names, so
    `wire.delta_envelope` builds its envelope when it is sent."""

    event: Literal["start", "delta", "end"]
    block: BlockKind
    blockIndex: int
    text: str | None = None
    toolCallId: str | None = None
    name: str | None = None
    requestId: str = ""
    sequence: int = 0  # set when sent


@dataclass(eq=False)
class Block:
    """One delta block of a generation: its kind, its text, where it stands.

    The one record of a block's text (NAP-LLM, Delta): `fragments` is the
    emit-ready text in order (surrogate pairs already joined), `sent` how
    many of them went into the stream, `index` the `blockIndex` once the
    block started (None before: a reader may hold fragments back until the
    block may start), `ended` whether its `end` was queued. A toolCall block
    carries `tool_call_id` and `name` for its `start`. Readers
    (`translate.GenerationAssembler`) may keep more state in a subclass.
    """

    kind: BlockKind
    fragments: list[str] = field(default_factory=list)
    index: int | None = None
    sent: int = 0
    ended: bool = False
    tool_call_id: str | None = None
    name: str | None = None

    @property
    def text(self) -> str:
        """The block's text so far."""
        return "".join(self.fragments)


class DeltaStream:
    """Block lifecycle, sequence numbers and coalescing for one generation.

    `send(envelope)` delivers one `llm.delta` envelope (a dict, built by
    `wire.delta_envelope`). `interval_s` is the minimum time between flushes
    (0 sends every event at once); above 0 the stream needs `clock` (the
    shell's `shell_ports.Clock`): its timers are the only time the stream
    knows, so the coalescing runs the same under a test clock. Does no I/O
    of its own; raises `RuntimeError` on a lifecycle violation (module rules)
    and `ValueError` for a positive interval without a clock.
    """

    def __init__(
        self,
        request_id: str,
        send: Callable[[dict[str, Any]], None],
        *,
        interval_s: float = 0.0,
        clock: Clock | None = None,
    ) -> None:
        if interval_s > 0 and clock is None:
            raise ValueError("coalescing deltas needs a clock")
        self.request_id = request_id
        self._send = send
        self._interval = interval_s
        self._clock = clock
        self._blocks: list[Block] = []
        self._pending: list[_Pending] = []
        self._sequence = 0
        # After each flush the stream cools down for one interval: events
        # queued meanwhile wait for the cool-down's end, which flushes them
        # (and starts another). A lone start waits on its own timer instead.
        self._cooling: TimerHandle | None = None
        self._waiting: TimerHandle | None = None
        self._closed = False

    # -- building blocks --------------------------------------------------

    def start(
        self, kind: BlockKind, *, tool_call_id: str | None = None, name: str | None = None
    ) -> int:
        """Open a new block; returns its `blockIndex` (0, 1, 2, ... in start order)."""
        return self.begin(Block(kind, tool_call_id=tool_call_id, name=name))

    def begin(self, block: Block) -> int:
        """Start `block` (a record its reader made); returns its `blockIndex`.

        The fragments it already holds are queued right after its start.
        """
        kind = block.kind
        if (kind == "toolCall") != (block.tool_call_id is not None and block.name is not None):
            raise RuntimeError("toolCall blocks start with an id and a name, others without")
        if block.index is not None:
            raise RuntimeError("block already started")
        block.index = len(self._blocks)
        self._blocks.append(block)
        # A start waits (at most one interval) for its first fragment, so the
        # first text reaches the napplet with its start instead of one
        # interval later.
        self._queue(
            _Pending("start", kind, block.index, toolCallId=block.tool_call_id, name=block.name),
            urgent=False,
        )
        self.push(block)
        return block.index

    def append(self, index: int, text: str) -> None:
        """Add a fragment to an open block (empty fragments are skipped)."""
        block = self._open_block(index)
        if not text:
            return
        block.fragments.append(text)
        self.push(block)

    def push(self, block: Block) -> None:
        """Queue the fragments of a started, open `block` not yet sent."""
        if block.sent == len(block.fragments):
            return
        if block.index is None:
            raise RuntimeError("block not started")
        self._open_block(block.index)
        while block.sent < len(block.fragments):
            text = block.fragments[block.sent]
            block.sent += 1
            if not text:
                continue
            last = next((p for p in reversed(self._pending) if p.blockIndex == block.index), None)
            if last is not None and last.event == "delta":
                # Coalesce with this block's unsent fragment; other blocks'
                # events may sit in between, which is fine because order
                # only matters within a block.
                last.text = (last.text or "") + text
            else:
                self._queue(_Pending("delta", block.kind, block.index, text=text))

    def end(self, index: int) -> None:
        """Close an open block."""
        block = self._open_block(index)
        block.ended = True
        self._queue(_Pending("end", block.kind, index))

    def block_text(self, index: int) -> str:
        """The concatenation of the fragments appended to block `index`."""
        return self._blocks[index].text

    def is_open(self, index: int) -> bool:
        """Whether block `index` has started and not ended."""
        return not self._blocks[index].ended

    @property
    def sent(self) -> int:
        """How many delta envelopes were sent (the next sequence number)."""
        return self._sequence

    def _open_block(self, index: int) -> Block:
        if not 0 <= index < len(self._blocks):
            raise RuntimeError("unknown block")
        block = self._blocks[index]
        if block.ended:
            raise RuntimeError("block already ended")
        return block

    # -- delivery ------------------------------------------------------------

    def _queue(self, item: _Pending, *, urgent: bool = True) -> None:
        if self._closed:
            raise RuntimeError("delta stream closed")
        self._pending.append(item)
        if self._clock is None or self._interval <= 0:
            self.flush()
        elif self._cooling is not None:
            return  # the cool-down's end flushes it
        elif urgent:
            self.flush()
        elif self._waiting is None:
            self._waiting = self._clock.call_later(self._interval, self._waited)

    def _waited(self) -> None:
        self._waiting = None
        self.flush()

    def _cooled(self) -> None:
        self._cooling = None
        self.flush()  # what queued meanwhile; cools down again if anything went

    def flush(self) -> None:
        """Send everything pending now, numbering envelopes contiguously."""
        if self._closed or not self._pending:
            return
        if self._waiting is not None:
            self._waiting.cancel()
            self._waiting = None
        pending, self._pending = self._pending, []
        if self._clock is not None and self._interval > 0 and self._cooling is None:
            self._cooling = self._clock.call_later(self._interval, self._cooled)
        for item in pending:
            item.requestId = self.request_id
            item.sequence = self._sequence
            self._sequence += 1
            self._send(delta_envelope(item))

    def finish(self) -> None:
        """Flush and close: call right before a successful terminal result."""
        self.flush()
        self._close()

    def abort(self) -> None:
        """Discard pending events and close: call before an error result."""
        self._pending.clear()
        self._close()

    def _close(self) -> None:
        self._closed = True
        for timer in (self._cooling, self._waiting):
            if timer is not None:
                timer.cancel()
        self._cooling = self._waiting = None
