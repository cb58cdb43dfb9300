"""Streaming text: an async iterator over a generation's text deltas.

Rules (NAP-LLM, Delta; Wire Protocol; Cancellation and deadlines)
- `TextStream` sends its `llm.generate` when iteration starts (the checks
  of `outgoing.checked` run then, so a request the shell would refuse
  raises from the `async for` before anything is sent) and yields the text
  of each `delta` event of a `text` block, in `sequence` order; a delta
  that is not a valid `records.Delta` or breaks the contiguous sequence is
  not shown (the terminal result is authoritative anyway).
- The iteration ends after the terminal result: `reply` holds it (its
  content replaces what the deltas showed); an error result raises its
  `LlmError`. A structured stream (`parse` given) then sets `parsed`, or
  raises what `parse` raises (`structured.Structured.parse`).
- Stopping: `cancel()`, leaving the `async for` early (`break`, an
  exception) or cancelling the asyncio task that iterates sends
  `llm.cancel` (once, only while the generation is not settled) and ends
  the iteration quietly, with `cancelled` true and `reply` None. The
  terminal result the shell still sends for it is consumed by the client,
  so each request gets exactly one terminal result consumed. The cleanup
  runs without awaiting, so it also runs when the iterator is only
  garbage-collected.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

from .errors import GenerationCancelledError
from .replies import Reply, read_delta, read_generation

if TYPE_CHECKING:
    from types import TracebackType

_END = object()

#: Starts the generation: `(on_message) -> (request id, future of its terminal result)`.
Starter = Callable[
    [Callable[[dict[str, Any] | None], None]],
    Awaitable[tuple[str, "asyncio.Future[dict[str, Any]]"]],
]
#: Sends `llm.cancel` for a request id (without waiting for its result).
Canceller = Callable[[str], object]


class TextStream:
    """Text deltas of one generation, as an async iterator (see the module rules).

    Use `async for text in stream`, or `async with stream:` around it to
    make sure the generation is cancelled when the block is left early.
    Attributes after the end: `reply` (the `Reply`, or None when cancelled),
    `parsed` (the validated answer of a structured stream), `cancelled`,
    `request_id`, `text` (everything streamed so far, replaced by the
    reply's text at the end).
    """

    def __init__(
        self, start: Starter, cancel: Canceller, parse: Callable[[Reply], Any] | None = None
    ) -> None:
        self._start = start
        self._send_cancel = cancel
        self._parse = parse
        self._queue: asyncio.Queue[object] = asyncio.Queue()
        self._future: asyncio.Future[dict[str, Any]] | None = None
        self._next_sequence = 0
        self._started = False
        self._ended = False
        self.request_id: str | None = None
        self.reply: Reply | None = None
        self.cancelled = False
        self.text = ""
        self.parsed: Any = None

    def __aiter__(self) -> AsyncIterator[str]:
        if self._started:
            raise RuntimeError("A TextStream can be iterated only once.")
        self._started = True
        return self._texts()

    async def _texts(self) -> AsyncIterator[str]:
        try:
            if self._ended:
                return
            self.request_id, self._future = await self._start(self._on_message)
            while True:
                item = await self._queue.get()
                if item is _END:
                    break
                assert isinstance(item, str)
                yield item
            if self.cancelled:
                return
            assert self._future.done()
            self._ended = True
            self.reply = read_generation(self._future.result())
            self.text = self.reply.text
            if self._parse is not None:
                self.parsed = self._parse(self.reply)
        finally:
            self.cancel()

    def _on_message(self, message: dict[str, Any] | None) -> None:
        """A delta of this generation, or None once its terminal result arrived."""
        if message is None:
            self._queue.put_nowait(_END)
            return
        delta = read_delta(message)
        if delta is None or delta.sequence != self._next_sequence:
            return
        self._next_sequence += 1
        if delta.event == "delta" and delta.block == "text" and delta.text and not self.cancelled:
            self.text += delta.text
            self._queue.put_nowait(delta.text)

    def cancel(self) -> None:
        """Stop the generation: send `llm.cancel` if it is still running and end
        the iteration quietly. Does nothing once the stream has ended."""
        if self._ended:
            return
        self._ended = True
        self.cancelled = True
        if self.request_id is not None and self._future is not None and not self._future.done():
            self._send_cancel(self.request_id)
        self._queue.put_nowait(_END)

    async def collect(self) -> Reply:
        """Read the stream to its end; the `Reply`. Raises the generation's
        `LlmError`, or `GenerationCancelledError` when this stream was cancelled."""
        async for _ in self:
            pass
        if self.reply is None:
            raise GenerationCancelledError("The stream was cancelled.")
        return self.reply

    async def __aenter__(self) -> TextStream:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cancel()
