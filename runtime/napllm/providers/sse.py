"""Incremental server-sent events parser (WHATWG HTML, "Server-sent events", 9.2.6).

Why our own code: LMSP streams (LMSP 1.0, 6.3) and OpenAI-compatible streams
arrive as bytes from a body stream. In the browser that stream is a `fetch`
body read from Pyodide (an `EventSource` cannot send `Authorization`), where
the httpx-based SSE libraries cannot run; the same parser must therefore work
on plain bytes, unchanged, under CPython and Pyodide.

Rules (WHATWG "Interpreting an event stream")
- Bytes are decoded as UTF-8 with an incremental decoder, so a multi-byte
  character split between two chunks decodes once both halves are in;
  invalid sequences become U+FFFD. One leading U+FEFF (BOM) is dropped.
- A line ends at CRLF, LF or CR, mixed freely. A CR at the end of one chunk
  and an LF at the start of the next are one line end.
- An empty line dispatches the event being built. A line starting with `:`
  is a comment and ignored. Otherwise the field name runs to the first `:`
  (or the whole line) and one space after the colon is dropped from the value.
- `event` sets the event type (default `message`); `data` appends the value
  plus LF to the data buffer (so `data` with an empty value is a legal empty
  payload); `id` sets the last event id unless the value contains NUL, and an
  event without `id` keeps the last id; `retry` with ASCII digits only sets
  the reconnection time in milliseconds; other fields are ignored.
- Dispatch: an event whose data buffer is empty (no `data` line) is not
  dispatched; otherwise the final LF of the data is removed.
- A final event not terminated by a blank line is discarded at end of stream.

Bound (docs/security.md, "Provider output"): the event being built (its
data so far and the line not yet ended) holds at most `MAX_EVENT_CHARS`
characters; past that `feed` raises `SseEventTooLarge`, a `ConnectionError`
(the stream is unusable, as when it is cut off). A stream is otherwise
unbounded in length; a line that never ends, or `data:` lines without the
blank line that dispatches them, used to grow in memory until the deadline.
"""

from __future__ import annotations

import codecs
import re
from collections.abc import AsyncIterable, AsyncIterator
from dataclasses import dataclass

_LINE_END = re.compile(r"\r\n|\r|\n")

#: Characters one event may hold while it is built (its data lines and the
#: line not yet ended): the strict JSON reader's own limit
#: (`jsontext.DEFAULT_MAX_CHARS`), so no payload it would accept is refused.
MAX_EVENT_CHARS = 16 * 1024 * 1024


class SseEventTooLarge(ConnectionError):
    """An event (or one line) grew past `MAX_EVENT_CHARS` before it ended."""


@dataclass(frozen=True, slots=True)
class SseEvent:
    """One dispatched event.

    `event`: the event type (`message` when the stream gave none); `data`:
    the payload text (lines joined by LF); `id`: the last event id in effect
    when the event was dispatched (`""` when none was ever set); `retry`: the
    reconnection time in milliseconds last announced by the stream, if any.
    """

    event: str
    data: str
    id: str
    retry: int | None = None


class SseParser:
    """Feed bytes with `feed`, receive the events completed so far.

    Usage: `events = parser.feed(chunk)` for every chunk of the body, then
    `parser.close()` at the end of the stream (which discards an event not
    terminated by a blank line). Raises `SseEventTooLarge` past
    `MAX_EVENT_CHARS`, and nothing else on any input.
    Implements WHATWG HTML 9.2.6 (see the module docstring).
    """

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._partial: list[str] = []  # decoded text of the line not yet ended
        self._partial_chars = 0
        self._data_chars = 0  # characters in `_data`, with one per line end
        self._skip_lf = False  # the previous text ended in CR
        self._bom_checked = False
        self._event_type = ""
        self._data: list[str] = []
        self._has_data = False
        self._closed = False
        self.last_event_id = ""
        self.retry: int | None = None

    def feed(self, chunk: bytes) -> list[SseEvent]:
        """Parse one chunk; returns the events it completed, in order."""
        if self._closed or not chunk:
            return []
        return self._feed_text(self._decoder.decode(chunk, final=False))

    def close(self) -> list[SseEvent]:
        """End of stream: flush the decoder and discard an unterminated event.

        Returns the events completed by the last bytes (a final line end
        may still complete one). Later `feed` calls return nothing.
        """
        if self._closed:
            return []
        events = self._feed_text(self._decoder.decode(b"", final=True))
        self._closed = True
        self._partial = []
        self._reset_event()
        return events

    def _feed_text(self, text: str) -> list[SseEvent]:
        if not text:
            return []
        if not self._bom_checked:
            self._bom_checked = True
            if text.startswith("\ufeff"):
                text = text[1:]
                if not text:
                    return []
        if self._skip_lf:
            self._skip_lf = False
            if text.startswith("\n"):
                text = text[1:]
        if _LINE_END.search(text) is None:
            # no line end: keep the piece (joining only when a line completes
            # keeps a long line arriving in many chunks linear, not quadratic)
            self._hold(text)
            return []
        buffer = "".join(self._partial) + text
        self._partial = []
        self._partial_chars = 0
        events: list[SseEvent] = []
        start = 0
        for match in _LINE_END.finditer(buffer):
            event = self._process_line(buffer[start : match.start()])
            if event is not None:
                events.append(event)
            start = match.end()
            if match.group() == "\r" and start == len(buffer):
                # a CR ending this text may be the first half of a CRLF
                self._skip_lf = True
        if start < len(buffer):
            self._hold(buffer[start:])
        return events

    def _hold(self, piece: str) -> None:
        """Keep `piece` of the line not yet ended, within the bound."""
        self._partial.append(piece)
        self._partial_chars += len(piece)
        self._check_size()

    def _check_size(self) -> None:
        if self._partial_chars + self._data_chars > MAX_EVENT_CHARS:
            self._closed = True
            self._partial = []
            self._partial_chars = 0
            self._reset_event()
            raise SseEventTooLarge("an event of the stream is larger than the bound")

    def _process_line(self, line: str) -> SseEvent | None:
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            return None
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "event":
            self._event_type = value
        elif name == "data":
            self._data.append(value)
            self._data_chars += len(value) + 1
            self._has_data = True
            self._check_size()
        elif name == "id" and "\x00" not in value:
            self.last_event_id = value
        elif name == "retry" and value.isascii() and value.isdigit():
            self.retry = int(value)
        return None

    def _dispatch(self) -> SseEvent | None:
        if not self._has_data:
            self._event_type = ""
            return None
        event = SseEvent(
            event=self._event_type or "message",
            data="\n".join(self._data),
            id=self.last_event_id,
            retry=self.retry,
        )
        self._reset_event()
        return event

    def _reset_event(self) -> None:
        self._event_type = ""
        self._data = []
        self._data_chars = 0
        self._has_data = False


async def aiter_sse(chunks: AsyncIterable[bytes]) -> AsyncIterator[SseEvent]:
    """Parse an async stream of byte chunks into events (WHATWG 9.2.6).

    Yields each event as soon as its terminating blank line arrived; an
    unterminated final event is discarded. Errors of `chunks` propagate.
    """
    parser = SseParser()
    async for chunk in chunks:
        for event in parser.feed(chunk):
            yield event
    for event in parser.close():
        yield event
