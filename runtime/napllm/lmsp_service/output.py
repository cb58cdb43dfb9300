"""Turning generated text into LMSP output items and events (LMSP 1.0, 6.2, 6.3, 6.5).

Rules
- Text goes into `message` items (`output_text` parts) and is streamed as
  `response.output_text.delta` events between `response.output_item.added`
  and `response.output_item.done`.
- When tool calling is active, `<tool_call>` blocks of the model's output
  (the Hermes convention that ChatML tool templates use) are scanned and
  judged by `napllm.toolcall_text` (the one rule the browser engines share):
  each completed call becomes one `function_call` item with a generated
  `call_id` and `arguments` as a JSON-encoded string (6.5); its text is never
  streamed as message text. A call must also name one of the request's
  tools. A malformed call is a `ModelOutputError`; the response then fails
  (it is never reported as text or as a success).
- A function call is emitted whole once its block is closed:
  `response.output_item.added` (empty `arguments`), one
  `response.function_call_arguments.delta` (the extension event of
  docs/lmsp.md) and `response.output_item.done` (6.5: the item arrives
  complete in `output_item.done`).
- Whitespace-only text is not reported as a message item.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Collection
from typing import Any

from ..toolcall_text import MalformedToolCall, PieceKind, ToolCallScanner, parse_tool_call

Emit = Callable[[str, dict[str, Any]], object]


class ModelOutputError(Exception):
    """The model's output cannot be turned into valid output items."""


def new_id(prefix: str) -> str:
    """A fresh opaque id such as `msg_0f3c...` (32 hex digits after the prefix)."""
    return f"{prefix}_{uuid.uuid4().hex}"


class OutputItemAssembler:
    """Assembles LMSP output items (6.2) from generated text and emits their events.

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
        self._scanner = ToolCallScanner()
        self._message: dict[str, Any] | None = None
        self._message_index = -1
        self._held_space = ""

    # -- public ------------------------------------------------------------

    def feed(self, text: str) -> None:
        """Take the next piece of generated text. Raises `ModelOutputError`."""
        if self._tool_names is None:
            self._text(text)
            return
        self._pieces(self._scanner.feed(text))

    def finish(self, complete: bool) -> None:
        """Flush what is left at the end of generation.

        `complete` is false when generation was cut (output limit,
        cancellation): a tool-call block still open is then dropped, since
        half a call cannot be executed. When `complete` is true an open
        block is parsed as if closed (models often stop right after the
        JSON). Raises `ModelOutputError`.
        """
        if self._tool_names is not None:
            pieces, open_body = self._scanner.finish()
            self._pieces(pieces)
            if open_body is not None and complete:
                self._function_call(open_body)
        self._close_message()

    def _pieces(self, pieces: list[tuple[PieceKind, str]]) -> None:
        for kind, text in pieces:
            if kind == "text":
                self._text(text)
            elif kind == "open":
                self._close_message()
            else:
                self._function_call(text)

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
        try:
            call = parse_tool_call(block, self._tool_names)
        except MalformedToolCall as exc:
            raise ModelOutputError(str(exc)) from exc
        name, arguments = call.name, call.arguments
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
