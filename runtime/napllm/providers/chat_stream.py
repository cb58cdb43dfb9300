"""OpenAI chat-completion chunks as LMSP events (LMSP 1.0, 6.2, 6.3, 6.5).

The stream state machine every engine that answers with chat-completion
chunks shares (OpenAI-compatible servers, WebLLM, wllama, transformers.js):
`ChatStreamToLmsp` for streams, `chat_response_to_lmsp` for one whole
completion. Events carry the extension events of `docs/lmsp.md` and
`id=None`: they are produced in-process and ordered by the iterator.

Rules: see `ChatStreamToLmsp`. Tool calls the server reports in `tool_calls`
are passed through faithfully as `function_call` items; judging them
(arguments must be a JSON object, names must be offered, tool choice
honoured) is the translation's job (NAP-LLM, Generation), not this
module's. Hermes `<tool_call>` blocks in the content are scanned and judged
by `napllm.toolcall_text` (the rule the LMSP service shares): a malformed
block raises `ProviderFailure` (`provider-error`, the fixed reason as
detail). A chunk that is not a chat-completion chunk, or an error chunk,
raises `ProviderFailure` without echoing the body.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

from ..errors import ErrorCode, ProviderFailure
from ..lmsp import CONTEXT_TOO_LONG, MAX_OUTPUT_CHARS, LmspEvent
from ..toolcall_text import MalformedToolCall, ToolCallScanner, parse_tool_call
from .chat_arguments import ArgumentsText
from .chat_fields import arguments_text, malformed, usage_to_lmsp


@dataclass
class _OutputItem:
    """One LMSP output item (6.2) being built from chat-completion chunks."""

    kind: Literal["message", "reasoning", "function_call"]
    item_id: str
    output_index: int = -1  # assigned when announced
    # message content parts as (type, pieces) and reasoning text pieces:
    # joined only for snapshots, so long outputs are not copied per delta
    parts: list[tuple[str, list[str]]] | None = None
    text: list[str] | None = None
    raw_id: str | None = None  # the server's tool call id
    call_id: str = ""
    name: str = ""
    arguments: ArgumentsText = field(default_factory=ArgumentsText)
    announced: bool = False
    done: bool = False

    def snapshot(self) -> dict[str, Any]:
        if self.kind == "message":
            content = [
                {"type": kind, "text" if kind == "output_text" else "refusal": "".join(pieces)}
                for kind, pieces in self.parts or []
            ]
            return {"id": self.item_id, "type": "message", "role": "assistant", "content": content}
        if self.kind == "reasoning":
            text = "".join(self.text or [])
            summary = [{"type": "summary_text", "text": text}] if text else []
            return {"id": self.item_id, "type": "reasoning", "summary": summary}
        return {
            "id": self.item_id,
            "type": "function_call",
            "call_id": self.call_id,
            "name": self.name,
            "arguments": self.arguments.text,
        }


_COMPLETED = frozenset({"stop", "tool_calls", "function_call", "eos", "end_turn", "stop_sequence"})
_LENGTH = frozenset({"length", "max_tokens"})


class ChatStreamToLmsp:
    """State machine: OpenAI chat-completion chunks (dicts) in, LMSP events out.

    `feed(chunk)` returns the events a chunk completes; `finish()` returns
    the closing events once the stream ended (`[DONE]` or end of body).
    Shapes produced (all with `response_id`):
    - `response.created` on the first chunk;
    - text: `response.output_item.added` (message item), then
      `response.output_text.delta` (`item_id`, `output_index`,
      `content_index`, `delta`), `response.output_item.done` with the text;
    - `refusal` deltas: `response.refusal.delta` into a `refusal` part;
    - `reasoning_content` / `reasoning` deltas: a `reasoning` item with
      `response.reasoning_summary_text.delta` (`summary_index` 0);
    - tool calls: a `function_call` item announced once its name is known,
      `response.function_call_arguments.delta` per fragment, done at the end.
      Fragments are keyed by `index` (position when absent); a fragment with
      a different id, or a new name after a call whose arguments are already
      complete JSON, starts a new call even on a shared index; missing or
      empty ids get a synthesised `call_...` id that stays the same in every
      event; object arguments are serialised;
    - Hermes-style `<tool_call>{...}</tool_call>` blocks in the content (when
      `parse_tool_call_blocks`) become `function_call` items and never text
      (`toolcall_text`: text that may be the start of such a block is held
      back until decided; a block still open at the end is a call when the
      turn completed and dropped when it was cut; a malformed call raises
      `ProviderFailure`); whitespace-only text between blocks is dropped;
    - with `tool_text_in_content` (WebLLM with tools: the engine streams the
      calls' raw JSON as content, then reports them in the last chunk) text is
      held to the end and dropped if the stream carried a `tool_calls` list,
      even an empty one: WebLLM sends that list only after parsing the held
      text as an array of calls, so held-back tool-call text is never
      released as the answer (`[` `]`, then `tool_calls: []` with
      `finish_reason: "tool_calls"`, is a `stop` with no text). Without the
      list (WebLLM relabels every stop `tool_calls` when tools are offered,
      docs/design.md, "Known behaviours") the held text is the answer;
    - terminal, from the last `finish_reason`: `stop`/`tool_calls` ->
      `response.completed`; `length` -> `response.incomplete`
      (`max_output_tokens`); `content_filter` -> `response.incomplete`
      (`content_filter`); any other label -> `response.failed`. Usage comes
      from the last chunk carrying one. A stream without `finish_reason` gets
      no closing events at all: the runtime reports the missing completion.
    - a prompt the server cut to fit its context (NAP-LLM, Errors: limits
      "MUST fail explicitly rather than truncating messages"): when a chunk
      says so (`"truncated": true`, as llama.cpp's server reports it), or
      when `context_window` (tokens, what the connection knows) is given and
      the reported usage fills it (`input_tokens >= context_window`, or
      input plus output beyond it), `finish()` raises `ProviderFailure`
      (`unsupported`, the fixed context sentence) instead of any terminal
      event. Without either signal a silent cut cannot be seen
      (docs/security.md).
    Raises `ProviderFailure` (`provider-error`, fixed detail) for a chunk
    that is not an object, an error chunk, or wrongly typed fields.
    """

    def __init__(
        self,
        *,
        parse_tool_call_blocks: bool = False,
        tool_text_in_content: bool = False,
        response_id: str | None = None,
        context_window: int | None = None,
    ) -> None:
        self.response_id = response_id or f"resp_{uuid.uuid4().hex}"
        self._context_window = context_window
        #: The server said it cut the prompt (`"truncated": true` in a chunk).
        self.prompt_truncated = False
        self._parse_blocks = parse_tool_call_blocks
        self._withhold_text = tool_text_in_content
        self._started = False
        self._finished = False
        self._next_output_index = 0
        self._items: list[_OutputItem] = []
        self._message: _OutputItem | None = None
        self._reasoning: _OutputItem | None = None
        self._calls: list[_OutputItem] = []
        self._call_at: dict[int, _OutputItem] = {}
        self._scanner = ToolCallScanner()
        # whitespace-only text while no message is open, as pieces: joined
        # only when released (a copy per piece was quadratic)
        self._ws_hold: list[str] = []
        # content characters received: text held back (whitespace, a
        # `<tool_call>` block still open, WebLLM's withheld text) is output
        # no later bound counts yet, so all of it stays within MAX_OUTPUT_CHARS
        self._content_chars = 0
        self._withheld: list[str] = []
        self._tool_list_seen = False  # a chunk carried a `tool_calls` list
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None
        self._events: list[LmspEvent] = []

    # -- helpers ----------------------------------------------------------

    def _emit(self, event: str, data: dict[str, Any]) -> None:
        # Built without validation: the name is one of ours and `data` a dict
        # this class assembled (one event per streamed token: the hot path).
        self._events.append(
            LmspEvent.model_construct(
                event=event, data={"response_id": self.response_id, **data}, id=None
            )
        )

    def _take(self) -> list[LmspEvent]:
        events, self._events = self._events, []
        return events

    def _announce(self, item: _OutputItem) -> None:
        item.output_index = self._next_output_index
        self._next_output_index += 1
        item.announced = True
        self._items.append(item)
        snapshot = item.snapshot()
        if item.kind == "function_call":
            snapshot["arguments"] = ""
        self._emit(
            "response.output_item.added", {"output_index": item.output_index, "item": snapshot}
        )

    def _close(self, item: _OutputItem | None) -> None:
        if item is None or item.done or not item.announced:
            return
        item.done = True
        self._emit(
            "response.output_item.done",
            {"output_index": item.output_index, "item": item.snapshot()},
        )
        if item is self._message:
            self._message = None
        if item is self._reasoning:
            self._reasoning = None

    def _new_id(self, prefix: str) -> str:
        return f"{prefix}_{uuid.uuid4().hex[:24]}"

    # -- text, refusal, reasoning --------------------------------------------

    def _message_part(self, kind: Literal["output_text", "refusal"], delta: str) -> None:
        self._close(self._reasoning)
        if self._message is None:
            self._message = _OutputItem("message", self._new_id("msg"), parts=[])
            self._announce(self._message)
        parts = self._message.parts
        assert parts is not None
        if not parts or parts[-1][0] != kind:
            parts.append((kind, []))
        parts[-1][1].append(delta)
        event = "response.output_text.delta" if kind == "output_text" else "response.refusal.delta"
        self._emit(
            event,
            {
                "item_id": self._message.item_id,
                "output_index": self._message.output_index,
                "content_index": len(parts) - 1,
                "delta": delta,
            },
        )

    def _drop_ws(self) -> None:
        self._ws_hold = []

    def _plain_text(self, text: str) -> None:
        """Emit text outside tool-call blocks, holding whitespace between blocks."""
        if not text:
            return
        if self._parse_blocks and self._message is None:
            if not text.strip():
                self._ws_hold.append(text)
                return
            text = "".join(self._ws_hold) + text
            self._drop_ws()
        self._message_part("output_text", text)

    def _scan_text(self, text: str) -> None:
        """Split content into text and `<tool_call>` blocks (Hermes style)."""
        for kind, piece in self._scanner.feed(text):
            if kind == "text":
                self._plain_text(piece)
            elif kind == "open":
                self._drop_ws()  # whitespace before a block is dropped
            else:
                self._block_call(piece)

    def _block_call(self, body: str) -> None:
        try:
            parsed = parse_tool_call(body)
        except MalformedToolCall as exc:
            raise ProviderFailure(ErrorCode.PROVIDER_ERROR, detail=f"model output: {exc}") from exc
        call = _OutputItem(
            "function_call", self._new_id("fc"), call_id=self._new_id("call"), name=parsed.name
        )
        self._calls.append(call)
        self._start_call(call)
        self._call_arguments(call, parsed.arguments)

    def _count_content(self, text: str) -> None:
        self._content_chars += len(text)
        if self._content_chars > MAX_OUTPUT_CHARS:
            raise malformed("content longer than the output bound")

    def _text(self, text: str) -> None:
        if not text:
            return
        self._count_content(text)
        if self._withhold_text:
            self._withheld.append(text)
        elif self._parse_blocks:
            self._scan_text(text)
        else:
            self._message_part("output_text", text)

    def _reasoning_delta(self, text: str) -> None:
        if not text:
            return
        self._close(self._message)
        if self._reasoning is None:
            self._reasoning = _OutputItem("reasoning", self._new_id("rs"), text=[])
            self._announce(self._reasoning)
        assert self._reasoning.text is not None
        self._reasoning.text.append(text)
        self._emit(
            "response.reasoning_summary_text.delta",
            {
                "item_id": self._reasoning.item_id,
                "output_index": self._reasoning.output_index,
                "summary_index": 0,
                "delta": text,
            },
        )

    # -- tool calls -------------------------------------------------------

    def _start_call(self, call: _OutputItem) -> None:
        self._close(self._message)
        self._close(self._reasoning)
        self._announce(call)
        if call.arguments:
            self._emit_arguments(call, call.arguments.text)

    def _emit_arguments(self, call: _OutputItem, delta: str) -> None:
        self._emit(
            "response.function_call_arguments.delta",
            {"item_id": call.item_id, "output_index": call.output_index, "delta": delta},
        )

    def _call_arguments(self, call: _OutputItem, delta: str) -> None:
        if not delta:
            return
        call.arguments.append(delta)
        if call.announced:
            self._emit_arguments(call, delta)

    def _tool_call_fragment(self, position: int, raw: object) -> None:
        if not isinstance(raw, dict):
            raise malformed("tool call is not an object")
        index = raw.get("index")
        key = index if isinstance(index, int) and not isinstance(index, bool) else position
        raw_id = raw.get("id") if isinstance(raw.get("id"), str) and raw.get("id") else None
        function = raw.get("function")
        if function is None:
            function = {}
        if not isinstance(function, dict):
            raise malformed("tool call function is not an object")
        name = function.get("name")
        if name is not None and not isinstance(name, str):
            raise malformed("tool call name is not text")
        arguments = arguments_text(function.get("arguments"))

        call = self._call_at.get(key)
        if call is None:
            new_call = True
        elif raw_id is not None and call.raw_id is not None:
            new_call = raw_id != call.raw_id  # calls sharing an index
        elif raw_id is not None:
            new_call = call.announced and bool(name)
            if not new_call and not call.announced:
                call.raw_id = call.call_id = raw_id
        else:
            # no id: a new name after a finished call starts the next call
            new_call = bool(name and call.name and (name != call.name or call.arguments.complete()))
        if new_call:
            call = _OutputItem(
                "function_call",
                self._new_id("fc"),
                raw_id=raw_id,
                call_id=raw_id or self._new_id("call"),
            )
            self._calls.append(call)
            self._call_at[key] = call
        assert call is not None
        if name and not call.name:
            call.name = name
        if call.announced:
            self._call_arguments(call, arguments)
        else:
            call.arguments.append(arguments)
            if call.name:
                self._start_call(call)

    # -- chunks -------------------------------------------------------------

    def feed(self, chunk: object) -> list[LmspEvent]:
        """Process one chat-completion chunk; returns the events it produced.

        Raises `ProviderFailure` for an error chunk (`{"error": ...}`) or a
        chunk of the wrong shape; the body is never put in the failure.
        """
        if self._finished:
            return []
        if not isinstance(chunk, dict):
            raise malformed("chunk is not an object")
        if chunk.get("error"):
            raise ProviderFailure(ErrorCode.PROVIDER_ERROR, detail="error chunk in stream")
        if not self._started:
            self._started = True
            self._emit("response.created", {"status": "in_progress"})
        usage = usage_to_lmsp(chunk.get("usage"))
        if usage is not None:
            self.usage = usage
        if chunk.get("truncated") is True:
            self.prompt_truncated = True
        choices = chunk.get("choices")
        if choices is None:
            return self._take()
        if not isinstance(choices, list):
            raise malformed("choices is not a list")
        for choice in choices:
            if not isinstance(choice, dict):
                raise malformed("choice is not an object")
            if choice.get("index", 0) not in (0, None):
                continue  # only the first choice is requested (n = 1)
            self._choice(choice)
        return self._take()

    def _choice(self, choice: dict[str, Any]) -> None:
        delta = choice.get("delta")
        if delta is None:
            delta = {}
        if not isinstance(delta, dict):
            raise malformed("delta is not an object")
        for key in ("reasoning_content", "reasoning"):
            value = delta.get(key)
            if value is not None and not isinstance(value, str):
                raise malformed("reasoning is not text")
            if value:
                self._reasoning_delta(value)
                break
        content = delta.get("content")
        if content is not None and not isinstance(content, str):
            raise malformed("content is not text")
        if content:
            self._text(content)
        refusal = delta.get("refusal")
        if refusal is not None and not isinstance(refusal, str):
            raise malformed("refusal is not text")
        if refusal:
            self._count_content(refusal)  # kept here, and by no later bound
            self._message_part("refusal", refusal)
        tool_calls = delta.get("tool_calls")
        if tool_calls is not None:
            if not isinstance(tool_calls, list):
                raise malformed("tool_calls is not a list")
            self._tool_list_seen = True
            for position, raw in enumerate(tool_calls):
                self._tool_call_fragment(position, raw)
        reason = choice.get("finish_reason")
        if reason is not None:
            if not isinstance(reason, str):
                raise malformed("finish_reason is not text")
            self.finish_reason = reason

    def finish(self) -> list[LmspEvent]:
        """Close the stream: pending text, open items and the terminal event.

        Returns nothing when no `finish_reason` arrived (the completion marker
        is missing; the runtime reports `provider-error`). Idempotent.
        """
        if self._finished:
            return []
        self._finished = True
        if self.finish_reason is None or not self._started:
            return []
        if self.prompt_was_cut():
            raise ProviderFailure(
                ErrorCode.UNSUPPORTED,
                detail="chat: the server cut the prompt to its context",
                safe_message=CONTEXT_TOO_LONG,
            )
        if self._withheld:
            text = "".join(self._withheld)
            self._withheld = []
            if not self._calls and not self._tool_list_seen:
                self._withhold_text = False
                self._text(text)
        if self._parse_blocks:
            pieces, open_body = self._scanner.finish()
            for _, pending in pieces:
                self._plain_text(pending)
            if open_body is not None and self.finish_reason in _COMPLETED:
                self._block_call(open_body)  # models often stop right after the JSON
        if self._ws_hold and not self._calls:
            self._message_part("output_text", "".join(self._ws_hold))
        self._drop_ws()
        for call in self._calls:
            if not call.announced:
                self._start_call(call)
        for item in sorted(self._items, key=lambda i: i.output_index):
            self._close(item)
        self._terminal(self.finish_reason)
        return self._take()

    def prompt_was_cut(self) -> bool:
        """Whether the server cut the prompt (class rules): flagged, or usage fills the window."""
        if self.prompt_truncated:
            return True
        window, usage = self._context_window, self.usage
        if window is None or usage is None:
            return False
        prompt, output = usage["input_tokens"], usage["output_tokens"]
        return bool(prompt >= window or prompt + output > window)

    def _terminal(self, reason: str) -> None:
        usage = {"usage": self.usage} if self.usage is not None else {}
        if reason in _COMPLETED:
            self._emit("response.completed", {"status": "completed", **usage})
        elif reason in _LENGTH or reason == "content_filter":
            why = "content_filter" if reason == "content_filter" else "max_output_tokens"
            self._emit(
                "response.incomplete",
                {"status": "incomplete", "incomplete_details": {"reason": why}, **usage},
            )
        else:
            self._emit(
                "response.failed",
                {
                    "status": "failed",
                    "error": {
                        "type": "about:blank",
                        "title": "Unrecognised finish reason",
                        "code": "provider_error",
                    },
                },
            )


def chat_response_to_lmsp(
    body: object,
    *,
    parse_tool_call_blocks: bool = False,
    response_id: str | None = None,
    context_window: int | None = None,
) -> list[LmspEvent]:
    """The LMSP event sequence (6.3) for a non-streamed chat completion.

    `body` is the parsed JSON of `POST /v1/chat/completions` without
    streaming. Its first choice's `message` is treated as one delta (so the
    same rules as `ChatStreamToLmsp` apply; tool calls without `index` are
    numbered by position), followed by `finish_reason` and `usage`. Raises
    `ProviderFailure` for an error body or a body of the wrong shape.
    """
    if not isinstance(body, dict):
        raise malformed("body is not an object")
    if body.get("error"):
        raise ProviderFailure(ErrorCode.PROVIDER_ERROR, detail="error body")
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise malformed("no choices")
    choice = choices[0]
    message = choice.get("message")
    if message is None:
        message = {}
    if not isinstance(message, dict):
        raise malformed("message is not an object")
    delta = dict(message)
    tool_calls = message.get("tool_calls")
    if isinstance(tool_calls, list):
        delta["tool_calls"] = [
            {**call, "index": position} if isinstance(call, dict) else call
            for position, call in enumerate(tool_calls)
        ]
    stream = ChatStreamToLmsp(
        parse_tool_call_blocks=parse_tool_call_blocks,
        response_id=response_id,
        context_window=context_window,
    )
    chunk = {
        "choices": [{"index": 0, "delta": delta, "finish_reason": choice.get("finish_reason")}],
        "usage": body.get("usage"),
        "truncated": body.get("truncated") is True,
    }
    return [*stream.feed(chunk), *stream.finish()]
