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
  once per `interval_s` (the first immediately). Adjacent `delta` events of
  the same block still pending are merged by concatenation: a slow consumer
  gets fewer, larger deltas and never loses text (NAP-LLM, Wire Protocol:
  "Slow consumers may receive fewer, larger deltas; the runtime MUST NOT
  silently drop text").
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

import asyncio
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

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


@dataclass
class _Pending:
    event: Literal["start", "delta", "end"]
    block: BlockKind
    index: int
    text: str | None = None
    tool_call_id: str | None = None
    name: str | None = None


@dataclass
class _Block:
    kind: BlockKind
    state: Literal["open", "ended"] = "open"
    fragments: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "".join(self.fragments)


class DeltaStream:
    """Block lifecycle, sequence numbers and coalescing for one generation.

    `send(envelope)` delivers one `llm.delta` envelope (a dict). `interval_s`
    is the minimum time between flushes (0 sends every event at once).
    """

    def __init__(
        self,
        request_id: str,
        send: Callable[[dict[str, Any]], None],
        *,
        interval_s: float = 0.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.request_id = request_id
        self._send = send
        self._interval = interval_s
        self._monotonic = monotonic
        self._blocks: list[_Block] = []
        self._pending: list[_Pending] = []
        self._sequence = 0
        self._last_flush: float | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._closed = False

    # -- building blocks --------------------------------------------------

    def start(
        self, kind: BlockKind, *, tool_call_id: str | None = None, name: str | None = None
    ) -> int:
        """Open a new block; returns its `blockIndex` (0, 1, 2, ... in start order)."""
        if (kind == "toolCall") != (tool_call_id is not None and name is not None):
            raise RuntimeError("toolCall blocks start with an id and a name, others without")
        index = len(self._blocks)
        self._blocks.append(_Block(kind))
        # A start waits (at most one interval) for its first fragment, so the
        # first text reaches the napplet with its start instead of one
        # interval later.
        self._queue(
            _Pending("start", kind, index, tool_call_id=tool_call_id, name=name), urgent=False
        )
        return index

    def append(self, index: int, text: str) -> None:
        """Add a fragment to an open block (empty fragments are skipped)."""
        block = self._open_block(index)
        if not text:
            return
        block.fragments.append(text)
        last = next((p for p in reversed(self._pending) if p.index == index), None)
        if last is not None and last.event == "delta":
            # Coalesce with this block's unsent fragment; other blocks' events
            # may sit in between, which is fine because order only matters
            # within a block.
            last.text = (last.text or "") + text
        else:
            self._queue(_Pending("delta", block.kind, index, text=text))

    def end(self, index: int) -> None:
        """Close an open block."""
        block = self._open_block(index)
        block.state = "ended"
        self._queue(_Pending("end", block.kind, index))

    def block_text(self, index: int) -> str:
        """The concatenation of the fragments appended to block `index`."""
        return self._blocks[index].text

    def is_open(self, index: int) -> bool:
        """Whether block `index` has started and not ended."""
        return self._blocks[index].state == "open"

    @property
    def sent(self) -> int:
        """How many delta envelopes were sent (the next sequence number)."""
        return self._sequence

    def _open_block(self, index: int) -> _Block:
        if not 0 <= index < len(self._blocks):
            raise RuntimeError("unknown block")
        block = self._blocks[index]
        if block.state != "open":
            raise RuntimeError("block already ended")
        return block

    # -- delivery ------------------------------------------------------------

    def _queue(self, item: _Pending, *, urgent: bool = True) -> None:
        if self._closed:
            raise RuntimeError("delta stream closed")
        self._pending.append(item)
        self._maybe_flush(urgent)

    def _maybe_flush(self, urgent: bool = True) -> None:
        now = self._monotonic()
        due = self._last_flush is None or now - self._last_flush >= self._interval
        if self._interval == 0 or (due and urgent):
            self.flush()
            return
        if self._timer is not None:
            return
        if due or self._last_flush is None:
            delay = self._interval  # a lone start waits one interval for its fragment
        else:
            delay = self._interval - (now - self._last_flush)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.flush()
            return
        self._timer = loop.call_later(delay, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        if not self._closed:
            self.flush()

    def flush(self) -> None:
        """Send everything pending now, numbering envelopes contiguously."""
        if self._closed or not self._pending:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        pending, self._pending = self._pending, []
        self._last_flush = self._monotonic()
        for item in pending:
            # Built as a dict on this hot path (one per streamed fragment); the
            # shape is exactly `records.Delta`'s, which tests check against it.
            envelope: dict[str, Any] = {
                "type": "llm.delta",
                "requestId": self.request_id,
                "sequence": self._sequence,
                "event": item.event,
                "block": item.block,
                "blockIndex": item.index,
            }
            if item.event == "delta":
                envelope["text"] = item.text
            elif item.event == "start" and item.block == "toolCall":
                envelope["toolCallId"] = item.tool_call_id
                envelope["name"] = item.name
            self._sequence += 1
            self._send(envelope)

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
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
