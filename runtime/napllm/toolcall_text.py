"""Hermes `<tool_call>` blocks in generated text: the one scanner and parser.

Models whose chat template has no native tool-call channel (ChatML tool
templates, TinyChat, llama.cpp on WebAssembly, transformers.js) write each
call as `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` inside
their text. The browser engines' chat mapping (`providers.chat_stream`) and
the LMSP local model service (`lmsp_service.output`) both turn such text
into LMSP `function_call` items (LMSP 1.0, 6.5) with this module, so both
follow the same rule. Pure: no I/O, runs unchanged under CPython and Pyodide.

Rules (NAP-LLM, Tool: "Every completed call's arguments MUST parse as a JSON
object ... Malformed arguments, non-object arguments, unknown names ...
MUST produce `provider-error`"; LLM-C16)
- Scanning: text outside blocks is text; a block's body is everything
  between `<tool_call>` and `</tool_call>` and is never text. A possible
  start of `<tool_call>` at the end of the text seen so far is held back
  until it is known not to be one (`held_prefix_length`).
- A closed block is a completed call. A block still open when the text
  ends is a completed call when the turn completed (models often stop right
  after the JSON) and is discarded when the turn was truncated or cut (its
  arguments are incomplete).
- A completed call's body must be one strict JSON object
  (`jsontext.read_json`: no NaN, no duplicate keys, bounded depth) with a
  non-empty string `name` and at most one of `arguments` or `parameters`
  (the key some templates use for the same thing). The arguments must be a
  JSON object, or a string holding one strict JSON object; absent arguments
  are `{}`. When the offered tool names are given, `name` must be one of
  them. Anything else is a malformed call (`MalformedToolCall`, a fixed
  reason that never echoes the body); each user turns it into its own
  failure (`provider-error` in the runtime, `model_output_invalid` in the
  service).
- Arguments are re-encoded as compact JSON text (`{"a":1}`), non-ASCII kept.

Why not a library: the block syntax is part of the protocol mapping, and no
library parses Hermes tool-call text from a token stream.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass
from typing import Literal

from .jsontext import JsonTextError, read_json

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"


class MalformedToolCall(ValueError):
    """A completed `<tool_call>` block that breaks the rule (module docstring).

    `str(exc)` is a fixed reason such as `"tool call is not JSON"`; it never
    contains the block's text.
    """


@dataclass(frozen=True)
class ToolCallText:
    """A well-formed call: `name` and `arguments` as compact JSON object text."""

    name: str
    arguments: str


def parse_tool_call(body: str, tool_names: Collection[str] | None = None) -> ToolCallText:
    """Read the body of one completed `<tool_call>` block (surrounding space ignored).

    `tool_names`: the offered tools' names, or `None` to leave the name
    check to the caller. Raises `MalformedToolCall` (module docstring).
    """
    try:
        call = read_json(body.strip())
    except JsonTextError as exc:
        raise MalformedToolCall("tool call is not JSON") from exc
    if not isinstance(call, dict):
        raise MalformedToolCall("tool call is not an object")
    name = call.get("name")
    if not isinstance(name, str) or not name:
        raise MalformedToolCall("tool call has no name")
    if tool_names is not None and name not in tool_names:
        raise MalformedToolCall("tool call names an unknown tool")
    if "arguments" in call and "parameters" in call:
        raise MalformedToolCall("tool call has both arguments and parameters")
    arguments = call.get("arguments", call.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = read_json(arguments)
        except JsonTextError as exc:
            raise MalformedToolCall("tool call arguments are not JSON") from exc
    if not isinstance(arguments, dict):
        raise MalformedToolCall("tool call arguments are not an object")
    return ToolCallText(name, json.dumps(arguments, separators=(",", ":"), ensure_ascii=False))


def held_prefix_length(text: str, marker: str = TOOL_CALL_OPEN) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `marker`."""
    for size in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0


PieceKind = Literal["text", "open", "call"]
"""`text`: text outside blocks; `open`: a block started (empty text); `call`:
a closed block's body (not yet parsed)."""


class ToolCallScanner:
    """Splits streamed text into text, block starts and closed block bodies.

    `feed(text)` returns the pieces the text completes, in order, as
    `(kind, text)` pairs (`PieceKind`); text that may start a tag is held
    back. `finish()` returns the held-back text as a last `text` piece and
    the body of a block still open (or `None`); the caller judges that body
    (a call when the turn completed, discarded when it was cut). The close
    tag is searched only in the newly arrived text (plus the tag's length
    before it), so a long block is scanned once.
    """

    def __init__(self) -> None:
        self._pending = ""  # text that may start a <tool_call> tag
        self._block: list[str] | None = None  # body so far while in a block
        self._block_tail = ""  # last characters of the body (a split close tag)

    @property
    def in_block(self) -> bool:
        """Whether a block is open."""
        return self._block is not None

    def feed(self, text: str) -> list[tuple[PieceKind, str]]:
        """Scan the next piece of text; returns the pieces it completes."""
        pieces: list[tuple[PieceKind, str]] = []
        buf = self._pending + text
        self._pending = ""
        while buf:
            if self._block is not None:
                window = self._block_tail + buf
                end = window.find(TOOL_CALL_CLOSE)
                if end < 0:
                    self._block.append(buf)
                    self._block_tail = window[-(len(TOOL_CALL_CLOSE) - 1) :]
                    return pieces
                # the close tag may start inside the tail already stored
                body = "".join(self._block)
                body = body[: len(body) - len(self._block_tail)] + window[:end]
                self._block = None
                self._block_tail = ""
                pieces.append(("call", body))
                buf = window[end + len(TOOL_CALL_CLOSE) :]
                continue
            start = buf.find(TOOL_CALL_OPEN)
            if start >= 0:
                if start:
                    pieces.append(("text", buf[:start]))
                pieces.append(("open", ""))
                self._block = []
                buf = buf[start + len(TOOL_CALL_OPEN) :]
                continue
            keep = held_prefix_length(buf)
            if len(buf) > keep:
                pieces.append(("text", buf[: len(buf) - keep]))
            self._pending = buf[len(buf) - keep :]
            return pieces
        return pieces

    def finish(self) -> tuple[list[tuple[PieceKind, str]], str | None]:
        """End of text: `(pieces, open_body)`; `open_body` is `None` outside a block."""
        pending, self._pending = self._pending, ""
        pieces: list[tuple[PieceKind, str]] = [("text", pending)] if pending else []
        if self._block is None:
            return pieces, None
        body = "".join(self._block)
        self._block = None
        self._block_tail = ""
        return pieces, body
