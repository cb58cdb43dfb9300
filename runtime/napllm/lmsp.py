"""LMSP 1.0 records: requests, responses, output items and stream events.

Implements LMSP 1.0 section 6 (Responses and streaming) as data, plus the
documented assumptions of `docs/lmsp.md` for the sections we do not have
(problem objects, model listing, tasks).

Rules
- A *request* is what napllm sends: built by `translate.nap_to_lmsp`, always
  valid, serialised with `LmspRequest.to_json()` (fields left unset are not
  sent).
- A *response*, an *output item* and an *event* come from a service and are
  untrusted. They are parsed with `extra="allow"` (6.3: services MAY send
  more; clients MUST ignore what they do not know) but strict types: a wrong
  type is a malformed provider output, reported as `provider-error` by the
  caller.
- Item types: `message` (content parts `output_text` / `refusal`),
  `function_call` (`arguments` is a JSON-encoded string, 6.5) and
  `reasoning` (`summary` of `summary_text` parts). Unknown item types are
  kept as `UnknownItem` and ignored by the translation.
- Event names of 6.3, plus the extension events napllm's own providers emit
  (documented in `docs/lmsp.md`): `response.function_call_arguments.delta`,
  `response.reasoning_summary_text.delta` and `response.refusal.delta`.
- Images are reserved by LMSP 1.0; napllm carries them internally as the
  extension part `input_image` and refuses them before submission on any
  connection that does not declare image input.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from .errors import ErrorCode, ProviderFailure

LMSP_VERSION = "1.0"

# The bounds of one response's output, wherever it is read (the shell's
# `output_order`, the engines' and OpenAI-compatible `chat_stream`):
# docs/security.md, "Provider output".
#: Output items one response may have (a message, reasoning, each tool call).
MAX_OUTPUT_ITEMS = 256
#: Characters (code points) of text, thinking and tool-call arguments one
#: response may hold, all its items together: about a million tokens, far
#: past any model's context (how many generations run at once is
#: `ShellPolicy.max_active_total`).
MAX_OUTPUT_CHARS = 4 * 1024 * 1024

# --------------------------------------------------------------------------
# Request (6.1, 6.5)


class _Out(BaseModel):
    """Base for records napllm builds: strict, no unknown fields."""

    model_config = ConfigDict(extra="forbid", strict=True)

    def to_json(self) -> dict[str, Any]:
        """JSON-ready dict without unset optional fields."""
        return self.model_dump(mode="json", exclude_none=True)


class InputText(_Out):
    """`{"type": "input_text", "text": ...}` (6.1)."""

    type: Literal["input_text"] = "input_text"
    text: str


class InputImage(_Out):
    """Extension part carrying one image (LMSP 1.0 reserves images; 9.1)."""

    type: Literal["input_image"] = "input_image"
    mime_type: str
    data: str  # standard padded base64


class OutputTextIn(_Out):
    """Replayed assistant text inside an input `message` item."""

    type: Literal["output_text"] = "output_text"
    text: str


InputPart = Annotated[InputText | InputImage | OutputTextIn, Field(discriminator="type")]


class MessageItemIn(_Out):
    """Input `message` item: role `system`, `user` or `assistant` (6.1)."""

    type: Literal["message"] = "message"
    role: Literal["system", "user", "assistant"]
    content: list[InputPart]


class FunctionCallIn(_Out):
    """Replayed `function_call` item; `arguments` is a JSON string (6.5)."""

    type: Literal["function_call"] = "function_call"
    call_id: str
    name: str
    arguments: str


class FunctionCallOutputIn(_Out):
    """`function_call_output` item answering `call_id` (6.5).

    `output` is a string; an image in a tool result travels in the extension
    field `images` (only to connections that accept images in tool results).
    """

    type: Literal["function_call_output"] = "function_call_output"
    call_id: str
    output: str
    images: list[InputImage] | None = None


InputItem = Annotated[
    MessageItemIn | FunctionCallIn | FunctionCallOutputIn, Field(discriminator="type")
]


class FunctionTool(_Out):
    """A function tool (6.5): `parameters` is a JSON Schema object."""

    type: Literal["function"] = "function"
    name: str
    description: str | None = None
    parameters: dict[str, Any]


class NamedToolChoice(_Out):
    """`{"type": "function", "name": ...}` forces one tool (6.5)."""

    type: Literal["function"] = "function"
    name: str


class JsonSchemaSpec(_Out):
    """The `json_schema` member of `response_format` (6.1)."""

    name: str
    schema_: dict[str, Any] = Field(alias="schema", serialization_alias="schema")

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)

    def to_json(self) -> dict[str, Any]:
        """JSON-ready dict with the `schema` member under its wire name."""
        return {"name": self.name, "schema": self.schema_}


class ResponseFormat(_Out):
    """`{"type": "text"}` or `{"type": "json_schema", "json_schema": {...}}` (6.1)."""

    type: Literal["text", "json_schema"]
    json_schema: JsonSchemaSpec | None = None

    def to_json(self) -> dict[str, Any]:
        """JSON-ready dict (the nested schema keeps its wire name)."""
        out: dict[str, Any] = {"type": self.type}
        if self.json_schema is not None:
            out["json_schema"] = self.json_schema.to_json()
        return out


class LmspRequest(_Out):
    """`POST /lmsp/v1/responses` body (LMSP 1.0, 6.1)."""

    model: str
    input: list[InputItem]
    stream: bool = False
    max_output_tokens: int | None = None
    temperature: float | None = None
    response_format: ResponseFormat | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedToolChoice | None = None
    store: bool | None = None
    previous_response_id: str | None = None
    extensions: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        """The JSON body, with nested records in their wire shape."""
        body = self.model_dump(mode="json", exclude_none=True, by_alias=True)
        if self.response_format is not None:
            body["response_format"] = self.response_format.to_json()
        return body

    def uses_images(self) -> bool:
        """Whether any input item carries an image (extension part)."""
        for item in self.input:
            if isinstance(item, MessageItemIn) and any(
                isinstance(p, InputImage) for p in item.content
            ):
                return True
            if isinstance(item, FunctionCallOutputIn) and item.images:
                return True
        return False


# --------------------------------------------------------------------------
# Response and output items (6.2, 6.5), untrusted


class _In(BaseModel):
    """Base for records received from a service: unknown fields ignored."""

    model_config = ConfigDict(extra="allow", strict=True)


class OutputText(_In):
    """`{"type": "output_text", "text": ...}` inside a `message` item."""

    type: Literal["output_text"]
    text: str


class Refusal(_In):
    """`{"type": "refusal", "refusal": ...}`: the model declined (peer convention)."""

    type: Literal["refusal"]
    refusal: str


class UnknownPart(_In):
    """A content part type napllm does not know; ignored."""

    type: str


class MessageItem(_In):
    """Output `message` item (6.2)."""

    type: Literal["message"]
    id: str | None = None
    role: Literal["assistant"] = "assistant"
    content: list[OutputText | Refusal | UnknownPart] = Field(default_factory=list)


class FunctionCallItem(_In):
    """Output `function_call` item (6.5); `call_id` may be missing from peers."""

    type: Literal["function_call"]
    id: str | None = None
    call_id: str | None = None
    name: str
    arguments: str


class SummaryText(_In):
    """`{"type": "summary_text", "text": ...}` in a reasoning item."""

    type: Literal["summary_text"]
    text: str


class ReasoningItem(_In):
    """Output `reasoning` item (6.2): a displayable summary.

    `encrypted_content` (a peer convention) marks opaque state napllm cannot
    carry back; see NAP-LLM Part rules on `thinking`.
    """

    type: Literal["reasoning"]
    id: str | None = None
    summary: list[SummaryText | UnknownPart] = Field(default_factory=list)


class UnknownItem(_In):
    """An output item type napllm does not know; ignored by the translation."""

    type: str
    id: str | None = None


OutputItem = MessageItem | FunctionCallItem | ReasoningItem | UnknownItem


def parse_output_item(raw: object) -> OutputItem:
    """Parse one output item, dispatching on `type`.

    Raises `ValueError` when the item is not an object, has no text `type`,
    or a known type has the wrong shape.
    """
    if not isinstance(raw, dict) or not isinstance(raw.get("type"), str):
        raise ValueError("output item is not an object with a type")
    kind = raw["type"]
    models: dict[str, type[_In]] = {
        "message": MessageItem,
        "function_call": FunctionCallItem,
        "reasoning": ReasoningItem,
    }
    model = models.get(kind, UnknownItem)
    try:
        item = model.model_validate(raw)
    except ValidationError as exc:
        raise ValueError(f"malformed {kind} item") from exc
    assert isinstance(item, MessageItem | FunctionCallItem | ReasoningItem | UnknownItem)
    return item


class InputTokensDetails(_In):
    """Peer convention: cache token counts."""

    cached_tokens: int | None = None
    cache_write_tokens: int | None = None


class OutputTokensDetails(_In):
    """Peer convention: reasoning token counts."""

    reasoning_tokens: int | None = None


class LmspUsage(_In):
    """`usage` of a response (6.2)."""

    input_tokens: int
    output_tokens: int
    total_tokens: int | None = None
    input_tokens_details: InputTokensDetails | None = None
    output_tokens_details: OutputTokensDetails | None = None


class IncompleteDetails(_In):
    """`incomplete_details` (6.2): `reason` such as `max_output_tokens`."""

    reason: str | None = None


class Problem(_In):
    """RFC 9457 problem details with an LMSP `code` (docs/lmsp.md, 9.3)."""

    type: str = "about:blank"
    title: str | None = None
    status: int | None = None
    detail: str | None = None
    instance: str | None = None
    code: str | None = None


ResponseStatus = Literal["in_progress", "completed", "incomplete", "failed", "cancelled", "queued"]


class LmspResponse(_In):
    """The response object (6.2). `output` is parsed item by item."""

    id: str
    object: Literal["response"] = "response"
    created_at: int | None = None
    status: ResponseStatus
    model: str | None = None
    output: list[dict[str, Any]] = Field(default_factory=list)
    usage: LmspUsage | None = None
    error: Problem | None = None
    incomplete_details: IncompleteDetails | None = None

    def items(self) -> list[OutputItem]:
        """The output items, parsed; raises `ValueError` on a malformed one."""
        return [parse_output_item(raw) for raw in self.output]


# --------------------------------------------------------------------------
# Stream events (6.3)

TERMINAL_EVENTS = frozenset(
    {
        "response.completed",
        "response.incomplete",
        "response.failed",
        "response.cancelled",
        "error",
    }
)

KNOWN_EVENTS = TERMINAL_EVENTS | {
    "response.created",
    "response.output_item.added",
    "response.output_text.delta",
    "response.output_item.done",
    # extensions emitted by napllm's own providers (docs/lmsp.md)
    "response.function_call_arguments.delta",
    "response.reasoning_summary_text.delta",
    "response.refusal.delta",
}


class LmspEvent(BaseModel):
    """One server-sent event: `id` (sequence number from 1, 6.4), `event`, `data`.

    `id` is `None` for events produced in-process by a provider that has no
    wire (the engines), where ordering is guaranteed by the iterator itself.
    """

    model_config = ConfigDict(extra="forbid", strict=True)

    event: str
    data: dict[str, Any]
    id: int | None = None

    @property
    def terminal(self) -> bool:
        """Whether this event ends the response (6.3: a final event)."""
        return self.event in TERMINAL_EVENTS

    def to_sse(self) -> str:
        """Serialise as one SSE record (`id:`, `event:`, `data:`, blank line)."""
        lines = []
        if self.id is not None:
            lines.append(f"id: {self.id}")
        lines.append(f"event: {self.event}")
        lines.append("data: " + json.dumps(self.data, separators=(",", ":"), ensure_ascii=False))
        return "\n".join(lines) + "\n\n"


def item_added(response_id: str, index: int, item: dict[str, Any]) -> LmspEvent:
    """`response.output_item.added` for output item `index` (6.3, 6.5)."""
    data = {"response_id": response_id, "output_index": index, "item": item}
    return LmspEvent(event="response.output_item.added", data=data)


def item_done(response_id: str, index: int, item: dict[str, Any]) -> LmspEvent:
    """`response.output_item.done` for output item `index`, with the whole item (6.5)."""
    data = {"response_id": response_id, "output_index": index, "item": item}
    return LmspEvent(event="response.output_item.done", data=data)


def text_delta(response_id: str, item_id: str, delta: str) -> LmspEvent:
    """`response.output_text.delta`: `delta` appended to message `item_id`'s text (6.3)."""
    data = {"response_id": response_id, "item_id": item_id, "delta": delta}
    return LmspEvent(event="response.output_text.delta", data=data)


def arguments_delta(response_id: str, item_id: str, index: int, delta: str) -> LmspEvent:
    """`response.function_call_arguments.delta`, napllm's extension event (docs/lmsp.md)."""
    data = {"response_id": response_id, "item_id": item_id, "output_index": index, "delta": delta}
    return LmspEvent(event="response.function_call_arguments.delta", data=data)


def message_item(item_id: str, text: str | None = None) -> dict[str, Any]:
    """An assistant message output item: no content (as added) or one `output_text` part."""
    content = [] if text is None else [{"type": "output_text", "text": text}]
    return {"id": item_id, "type": "message", "role": "assistant", "content": content}


# --------------------------------------------------------------------------
# Model discovery (docs/lmsp.md, assumed section)


class ModelCapabilities(_In):
    """Capabilities of one model of an LMSP service (docs/lmsp.md).

    `tools`, `structured_output` and `conversations` are LMSP capability
    names; `images` and `tool_choice` are napllm's documented extensions.
    """

    tools: bool = False
    structured_output: bool = False
    conversations: bool = False
    images: bool = False
    tool_choice: list[Literal["auto", "none", "required", "tool"]] | None = None


class ModelEntry(_In):
    """One entry of `GET /lmsp/v1/models` (docs/lmsp.md).

    `engine`: napllm extension, the words a service gives for the engine
    that runs the model (such as "llama.cpp"); any JSON value is accepted
    here and only plain words are ever shown (`kinds.engine_words`).
    `cpu_fast_path`: napllm extension of `napllm-lmsp`, whether llama.cpp's
    CPU fast path is on and why not (`lmsp_service.engine.FastPath`); kept
    as received, never shown.
    """

    id: str
    object: str = "model"
    context_length: int | None = None
    capabilities: ModelCapabilities = Field(default_factory=ModelCapabilities)
    engine: Any = None
    cpu_fast_path: Any = None


class ModelList(_In):
    """`GET /lmsp/v1/models` body: `{"object": "list", "data": [ModelEntry]}`."""

    object: str = "list"
    data: list[ModelEntry]


class Task(_In):
    """A task (docs/lmsp.md, assumed 7.4): `id`, `status`, and `response` when final."""

    id: str
    object: str = "task"
    status: ResponseStatus
    response: LmspResponse | None = None


_problem_adapter: TypeAdapter[Problem] = TypeAdapter(Problem)


# --------------------------------------------------------------------------
# Problems -> failures (docs/lmsp.md, problem codes)

CONTEXT_TOO_LONG = "The conversation is too long for the selected model's context window."
TOKEN_REJECTED_HINT = "The LMSP service rejected the access token; check the connection's token."
MODEL_MISSING_HINT = "The LMSP service does not serve the selected model."
BUSY_HINT = "The LMSP service is busy; try again later."
MODEL_RESTARTED_HINT = (
    "The LMSP service's model stopped while answering and is being restarted; try again."
)
INTERRUPTED_HINT = "The LMSP service was restarted before it finished this answer."

_CODE_SHAPE = re.compile(r"[a-z][a-z0-9_]{0,63}")


def _safe_code(code: object) -> str:
    """An LMSP error code fit for a log line, or `other`."""
    return code if isinstance(code, str) and _CODE_SHAPE.fullmatch(code) else "other"


def failure_from_problem(status: int | None, problem: Problem | None) -> ProviderFailure:
    """The failure for an HTTP error answer of an LMSP service (docs/lmsp.md, problems).

    `status`: the HTTP status (or `None` for an `error` event); `problem`: the
    parsed RFC 9457 document, if the body was one. Mapping:
    `unsupported_capability` -> `unsupported`; `context_length_exceeded` ->
    `unsupported` with `CONTEXT_TOO_LONG` as its message; 401/403 (or
    `unauthorized`/`forbidden`) -> `provider-error` with `TOKEN_REJECTED_HINT`
    for the shell; 429 / `rate_limited`, `model_not_found` and 503 /
    `server_busy` -> `provider-error` with a hint; `model_crashed` and
    `model_unavailable` (the service restarts its model worker) and
    `interrupted` (a response cut by a service restart) -> `provider-error`
    with a hint; anything else ->
    `provider-error`. The problem's text members are never used.
    """
    code = _safe_code(problem.code if problem else None)
    detail = f"LMSP status={status} code={code}"
    if code == "unsupported_capability":
        return ProviderFailure(ErrorCode.UNSUPPORTED, detail=detail)
    if code == "context_length_exceeded":
        return ProviderFailure(ErrorCode.UNSUPPORTED, detail=detail, safe_message=CONTEXT_TOO_LONG)
    if status in (401, 403) or code in ("unauthorized", "forbidden"):
        return ProviderFailure(detail=detail, user_hint=TOKEN_REJECTED_HINT)
    if status == 429 or code == "rate_limited":
        # a service's rate limit is not the runtime's policy (quota-exceeded)
        return ProviderFailure(detail=detail, user_hint=BUSY_HINT)
    if code == "model_not_found":
        return ProviderFailure(detail=detail, user_hint=MODEL_MISSING_HINT)
    if code in ("model_crashed", "model_unavailable"):
        return ProviderFailure(detail=detail, user_hint=MODEL_RESTARTED_HINT)
    if code == "interrupted":
        return ProviderFailure(detail=detail, user_hint=INTERRUPTED_HINT)
    if status == 503 or code == "server_busy":
        return ProviderFailure(detail=detail, user_hint=BUSY_HINT)
    return ProviderFailure(detail=detail)


def parse_problem(raw: object) -> Problem | None:
    """Parse an RFC 9457 problem document; `None` when `raw` is not one."""
    try:
        return _problem_adapter.validate_python(raw)
    except ValidationError:
        return None
