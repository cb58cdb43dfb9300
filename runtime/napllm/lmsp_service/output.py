"""Turning generated text into LMSP output items and events (LMSP 1.0, 6.2, 6.3, 6.5).

Rules
- Text goes into `message` items (`output_text` parts) and is streamed as
  `response.output_text.delta` events between `response.output_item.added`
  and `response.output_item.done`.
- When tool calling is active, a `<tool_call>{"name": ..., "arguments":
  {...}}</tool_call>` block of the model's output (the Hermes convention
  that ChatML tool templates use) becomes one `function_call` item with a
  generated `call_id` and `arguments` as a JSON-encoded string (6.5). The
  block's text is never streamed as message text: a possible start of a
  block is held back until it is known not to be one.
- A function call is emitted whole once its block is closed:
  `response.output_item.added` (empty `arguments`), one
  `response.function_call_arguments.delta` (the extension event of
  docs/lmsp.md) and `response.output_item.done` (6.5: the item arrives
  complete in `output_item.done`).
- A block is read by the strict reader (`napllm.jsontext.read_json`), as
  is a string `arguments` member; a block that is not strict JSON, names an unknown tool or carries
  arguments that are not an object is a `ModelOutputError`; the response
  then fails (it is never reported as text or as a success).
- Whitespace-only text is not reported as a message item.

The held-back prefix matching is written here because the block syntax is
part of the protocol mapping; no library parses Hermes tool-call text from
a token stream.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Collection
from typing import Any

from ..jsontext import JsonTextError, read_json

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"

Emit = Callable[[str, dict[str, Any]], object]


class ModelOutputError(Exception):
    """The model's output cannot be turned into valid output items."""


def new_id(prefix: str) -> str:
    """A fresh opaque id such as `msg_0f3c...` (32 hex digits after the prefix)."""
    return f"{prefix}_{uuid.uuid4().hex}"


def parse_tool_call(block: str, tool_names: Collection[str]) -> tuple[str, str]:
    """Parse the JSON inside one `<tool_call>` block.

    Returns `(name, arguments)` with `arguments` re-encoded as compact JSON
    text. Raises `ModelOutputError` when the block is not an object with a
    known `name` and object `arguments` (a JSON object or a string holding
    one).
    """
    try:
        call = read_json(block)
    except JsonTextError as exc:
        raise ModelOutputError("tool call is not JSON") from exc
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        raise ModelOutputError("tool call has no name")
    name: str = call["name"]
    if name not in tool_names:
        raise ModelOutputError("tool call names an unknown tool")
    arguments = call.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = read_json(arguments)
        except JsonTextError as exc:
            raise ModelOutputError("tool call arguments are not JSON") from exc
    if not isinstance(arguments, dict):
        raise ModelOutputError("tool call arguments are not an object")
    return name, json.dumps(arguments, separators=(",", ":"), ensure_ascii=False)


def _held_prefix_length(text: str, marker: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `marker`."""
    for size in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0


class OutputAssembler:
    """Builds output items from streamed text and emits their events.

    `response_id` goes into every event's data; `emit(event, data)` receives
    the events in order; `tool_names` are the callable tools, or `None` when
    tool calling is off (`tools` absent or `tool_choice: "none"`), in which
    case all text is message text. `output` holds the finished items (6.2).
    """

    def __init__(self, response_id: str, emit: Emit, tool_names: Collection[str] | None) -> None:
        self.response_id = response_id
        self.output: list[dict[str, Any]] = []
        self._emit = emit
        self._tool_names = tool_names
        self._pending = ""
        self._in_call = False
        self._message: dict[str, Any] | None = None
        self._message_index = -1
        self._held_space = ""

    # -- public ------------------------------------------------------------

    def feed(self, text: str) -> None:
        """Take the next piece of generated text. Raises `ModelOutputError`."""
        if self._tool_names is None:
            self._text(text)
            return
        self._pending += text
        while True:
            if self._in_call:
                end = self._pending.find(TOOL_CALL_CLOSE)
                if end < 0:
                    return
                self._function_call(self._pending[:end])
                self._pending = self._pending[end + len(TOOL_CALL_CLOSE) :]
                self._in_call = False
                continue
            start = self._pending.find(TOOL_CALL_OPEN)
            if start >= 0:
                self._text(self._pending[:start])
                self._close_message()
                self._pending = self._pending[start + len(TOOL_CALL_OPEN) :]
                self._in_call = True
                continue
            held = _held_prefix_length(self._pending, TOOL_CALL_OPEN)
            cut = len(self._pending) - held
            self._text(self._pending[:cut])
            self._pending = self._pending[cut:]
            return

    def finish(self, complete: bool) -> None:
        """Flush what is left at the end of generation.

        `complete` is false when generation was cut (output limit,
        cancellation): a tool-call block still open is then dropped, since
        half a call cannot be executed. When `complete` is true an open
        block is parsed as if closed (models often stop right after the
        JSON). Raises `ModelOutputError`.
        """
        if self._in_call:
            if complete:
                self._function_call(self._pending)
            self._pending = ""
            self._in_call = False
        elif self._pending:
            self._text(self._pending)
            self._pending = ""
        self._close_message()

    def function_calls(self) -> list[dict[str, Any]]:
        """The `function_call` items produced so far."""
        return [item for item in self.output if item["type"] == "function_call"]

    def message_text(self) -> str:
        """The concatenated text of all message items produced so far."""
        return "".join(
            part["text"]
            for item in self.output
            if item["type"] == "message"
            for part in item["content"]
        )

    # -- items ---------------------------------------------------------------

    def _text(self, text: str) -> None:
        if not text:
            return
        if self._message is None:
            if not text.strip():
                self._held_space += text
                return
            text = self._held_space + text
            self._held_space = ""
            self._message = {
                "id": new_id("msg"),
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": ""}],
            }
            self._message_index = len(self.output)
            self.output.append(self._message)
            self._emit(
                "response.output_item.added",
                {
                    "response_id": self.response_id,
                    "output_index": self._message_index,
                    "item": {**self._message, "content": []},
                },
            )
        self._message["content"][0]["text"] += text
        self._emit(
            "response.output_text.delta",
            {"response_id": self.response_id, "item_id": self._message["id"], "delta": text},
        )

    def _close_message(self) -> None:
        self._held_space = ""
        if self._message is None:
            return
        self._emit(
            "response.output_item.done",
            {
                "response_id": self.response_id,
                "output_index": self._message_index,
                "item": self._message,
            },
        )
        self._message = None

    def _function_call(self, block: str) -> None:
        assert self._tool_names is not None
        name, arguments = parse_tool_call(block.strip(), self._tool_names)
        item = {
            "id": new_id("fc"),
            "type": "function_call",
            "call_id": new_id("call"),
            "name": name,
            "arguments": arguments,
        }
        index = len(self.output)
        self.output.append(item)
        self._emit(
            "response.output_item.added",
            {
                "response_id": self.response_id,
                "output_index": index,
                "item": {**item, "arguments": ""},
            },
        )
        self._emit(
            "response.function_call_arguments.delta",
            {
                "response_id": self.response_id,
                "item_id": item["id"],
                "output_index": index,
                "delta": arguments,
            },
        )
        self._emit(
            "response.output_item.done",
            {"response_id": self.response_id, "output_index": index, "item": item},
        )
