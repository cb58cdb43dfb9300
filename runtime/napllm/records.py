"""NAP-LLM records as strict pydantic models (NAP-LLM, Schemas).

Rules (NAP-LLM, Schemas: "Unknown fields in these input records, explicit
`null`, invalid types and invalid encodings MUST produce `invalid-request`")
- Input records (Requirements, GenerationRequest, Tool, ToolChoice, Message,
  Part) forbid unknown fields, reject explicit `null` for every field, never
  coerce types (`"1"` is not `1`, `true` is not `1`, `1.5` is not an
  integer), reject invalid enum values, and require non-empty text where the
  spec says "non-empty text".
- `maxTokens` is a positive integer; `temperature` a finite number (its range
  is a connection capability, checked later as `unsupported`).
- Image `data` is standard padded base64 with no whitespace, data-URI prefix
  or URL, and decodes to an image of the declared `mimeType` (PNG, JPEG or
  WebP signature): anything else is an invalid encoding.
- Tool names match `^[A-Za-z0-9_-]{1,64}$` and are unique within `tools`;
  `parameters` has root `"type": "object"` and is a valid JSON Schema
  2020-12 document (checked through `schema.default_validator()`); the
  tools of one request hold at most `schema.MAX_SCHEMA_SUBSCHEMAS`
  subschemas together, counted before any is checked; JSON
  Schema keywords inside `parameters` are not unknown record fields, and
  `null` inside `parameters` or toolCall `arguments` is ordinary JSON.
- Placement rules between records (toolResult adjacency, where `toolCall`,
  `thinking` and `isError` may appear, tool choice vs tools) live in
  `conversation.py`.
- `RecordError` carries a safe message naming the offending field by its
  path in the napplet's own request, never its value. A path contains only
  list indices and the field names of these records: an unknown or
  unexpected member is named by its position in its object ("member 3"),
  never by its key, so no napplet text is ever echoed.
- Output records (Model, Generation, Usage, Delta, Error) are built by the
  runtime and validated on construction, so an internal mistake fails loudly
  in tests rather than reaching a napplet.
- The connection records (`Connection`, `Capabilities`) are the shell's
  own data, never from a napplet: they live in `connection_records`.
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    field_validator,
    model_validator,
)

# The connection records are importable from here too, so code that reads
# both kinds of record needs one import; `connection_records` defines them.
from .connection_records import Capabilities as Capabilities
from .connection_records import Connection as Connection
from .connection_records import ToolChoiceMode as ToolChoiceMode
from .connection_records import check_tool_choice_modes
from .errors import ErrorCode, NapError
from .schema import MAX_SCHEMA_SUBSCHEMAS, count_subschemas, default_validator

NonEmptyText = Annotated[str, StringConstraints(min_length=1)]
ToolName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
ImageMime = Literal["image/png", "image/jpeg", "image/webp"]

_BASE64 = re.compile(r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$")
_SIGNATURES: dict[str, tuple[bytes, ...]] = {
    "image/png": (b"\x89PNG\r\n\x1a\n",),
    "image/jpeg": (b"\xff\xd8\xff",),
}

DEFAULT_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {},
    "additionalProperties": False,
}


class RecordError(NapError):
    """`invalid-request` raised while parsing a record; message names the field path."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.INVALID_REQUEST, message)


class _Input(BaseModel):
    """Base of every input record: strict, closed, no explicit nulls."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _no_explicit_null(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for position, (key, value) in enumerate(data.items(), start=1):
                if value is None:
                    raise ValueError(f"explicit null for {_member_name(cls, key, position)}")
        return data


# --------------------------------------------------------------------------
# Parts (NAP-LLM, Part)


class TextPart(_Input):
    """`{"type": "text", "text": <text>}`."""

    type: Literal["text"]
    text: str


class ThinkingPart(_Input):
    """`{"type": "thinking", "text": <text>}`: display-only reasoning."""

    type: Literal["thinking"]
    text: str


class ImagePart(_Input):
    """`{"type": "image", "mimeType": ..., "data": <standard padded base64>}`."""

    type: Literal["image"]
    mimeType: ImageMime
    data: NonEmptyText

    @model_validator(mode="after")
    def _valid_image(self) -> ImagePart:
        raw = decode_base64(self.data)
        if raw is None:
            raise ValueError("data is not standard padded base64")
        if not _has_signature(self.mimeType, raw):
            raise ValueError("data does not match mimeType")
        return self


class ToolCallPart(_Input):
    """`{"type": "toolCall", "toolCallId", "name", "arguments": {...}}`."""

    type: Literal["toolCall"]
    toolCallId: NonEmptyText
    name: NonEmptyText
    arguments: dict[str, Any]


Part = Annotated[TextPart | ThinkingPart | ImagePart | ToolCallPart, Field(discriminator="type")]


def decode_base64(data: str) -> bytes | None:
    """Decode standard padded base64 strictly; `None` when it is not exactly that."""
    if not _BASE64.fullmatch(data):
        return None
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return None


def _has_signature(mime: str, raw: bytes) -> bool:
    if mime == "image/webp":
        return len(raw) >= 12 and raw[:4] == b"RIFF" and raw[8:12] == b"WEBP"
    return any(raw.startswith(sig) for sig in _SIGNATURES[mime])


# --------------------------------------------------------------------------
# Messages, tools, requests


class Message(_Input):
    """One conversation message (NAP-LLM, Message).

    `role`: system / user / assistant / toolResult; `content`: non-empty list
    of Part; `toolCallId`, `toolName`: required on toolResult only;
    `isError`: toolResult only (placement checked in conversation.py).
    """

    role: Literal["system", "user", "assistant", "toolResult"]
    content: Annotated[list[Part], Field(min_length=1)]
    toolCallId: NonEmptyText | None = None
    toolName: NonEmptyText | None = None
    isError: bool | None = None

    @model_validator(mode="after")
    def _tool_result_fields(self) -> Message:
        if self.role == "toolResult":
            if self.toolCallId is None or self.toolName is None:
                raise ValueError("toolResult needs toolCallId and toolName")
        elif self.toolCallId is not None or self.toolName is not None:
            raise ValueError("toolCallId and toolName are for toolResult only")
        return self


class Tool(_Input):
    """A tool the model may call (NAP-LLM, Tool).

    `name` matches `^[A-Za-z0-9_-]{1,64}$`; `parameters` is a JSON Schema
    2020-12 object schema (default: no properties, no additional ones).
    """

    name: ToolName
    description: str | None = None
    parameters: dict[str, Any] | None = None

    @field_validator("parameters")
    @classmethod
    def _object_schema(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is None:
            return value
        if value.get("type") != "object":
            raise ValueError('parameters needs root type "object"')
        if count_subschemas(value) > MAX_SCHEMA_SUBSCHEMAS:
            raise ValueError(f"parameters has more than {MAX_SCHEMA_SUBSCHEMAS} subschemas")
        if not default_validator().check_schema(value):
            raise ValueError("parameters is not a valid JSON Schema 2020-12 document")
        return value

    def schema_or_default(self) -> dict[str, Any]:
        """`parameters`, or the spec's default empty object schema."""
        return self.parameters if self.parameters is not None else dict(DEFAULT_PARAMETERS)


class ToolChoice(_Input):
    """`{"type": "tool", "name": ...}`: force one named tool (NAP-LLM, ToolChoice)."""

    type: Literal["tool"]
    name: NonEmptyText


ToolChoiceValue = Literal["auto", "none", "required"] | ToolChoice


class GenerationRequest(_Input):
    """One stateless generation (NAP-LLM, GenerationRequest).

    Shapes: `handle` non-empty text; `messages` non-empty list of Message;
    `format` "text" | "json"; `maxTokens` integer >= 1; `temperature` finite
    number; `tools` list of Tool with unique names (empty = omitted);
    `toolChoice` "auto" | "none" | "required" | ToolChoice.
    """

    handle: NonEmptyText
    messages: Annotated[list[Message], Field(min_length=1)]
    format: Literal["text", "json"] | None = None
    maxTokens: Annotated[int, Field(ge=1)] | None = None
    temperature: float | None = None
    tools: list[Tool] | None = None
    toolChoice: ToolChoiceValue | None = None

    @field_validator("tools", mode="before")
    @classmethod
    def _bounded_schemas(cls, value: Any) -> Any:
        # Before any tool's schema is checked (the check costs time per subschema).
        if isinstance(value, list):
            total = 0
            for tool in value:
                params = tool.get("parameters") if isinstance(tool, dict) else None
                if params is not None:
                    total += count_subschemas(params, MAX_SCHEMA_SUBSCHEMAS - total)
                if total > MAX_SCHEMA_SUBSCHEMAS:
                    raise ValueError(
                        f"the tools' parameters have more than {MAX_SCHEMA_SUBSCHEMAS} "
                        "subschemas together"
                    )
        return value

    @field_validator("toolChoice", mode="before")
    @classmethod
    def _choice_shape(cls, value: Any) -> Any:
        if isinstance(value, str) and value not in ("auto", "none", "required"):
            raise ValueError("toolChoice is not a known mode")
        return value

    @model_validator(mode="after")
    def _unique_tool_names(self) -> GenerationRequest:
        names = [tool.name for tool in self.tools or ()]
        if len(set(names)) != len(names):
            raise ValueError("tool names must be unique")
        return self

    @property
    def active_tools(self) -> list[Tool]:
        """The current tools; an empty list is equivalent to omission."""
        return list(self.tools or ())

    @property
    def output_format(self) -> Literal["text", "json"]:
        """`format`, defaulting to `text`."""
        return self.format or "text"


class Requirements(_Input):
    """What `select` requires of a connection (NAP-LLM, Requirements)."""

    model: NonEmptyText | None = None
    images: bool | None = None
    json_: bool | None = Field(default=None, alias="json")
    tools: bool | None = None

    model_config = ConfigDict(
        extra="forbid", strict=True, allow_inf_nan=False, populate_by_name=False
    )


# --------------------------------------------------------------------------
# Output records


class _Output(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    def to_json(self) -> dict[str, Any]:
        """The wire dict, omitting optional fields that are unset."""
        return self.model_dump(mode="json", exclude_none=True, by_alias=True)


class ModelRecord(_Output):
    """The Model record returned by select/describe (NAP-LLM, Model)."""

    handle: NonEmptyText
    name: str
    model: NonEmptyText
    route: str
    images: bool
    json_: bool = Field(alias="json")
    tools: bool
    toolChoiceModes: list[Literal["auto", "none", "required", "tool"]]

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)

    @model_validator(mode="after")
    def _modes(self) -> ModelRecord:
        check_tool_choice_modes(self.tools, self.toolChoiceModes)
        return self


class Usage(_Output):
    """Provider-reported token counts (NAP-LLM, Usage); all non-negative."""

    inputTokens: Annotated[int, Field(ge=0)]
    outputTokens: Annotated[int, Field(ge=0)]
    cacheReadTokens: Annotated[int, Field(ge=0)] | None = None
    cacheWriteTokens: Annotated[int, Field(ge=0)] | None = None
    reasoningTokens: Annotated[int, Field(ge=0)] | None = None


OutputPart = Annotated[TextPart | ThinkingPart | ToolCallPart, Field(discriminator="type")]


class Generation(_Output):
    """A terminal result (NAP-LLM, Generation).

    `finish: toolUse` requires at least one toolCall part; `length` and
    `refusal` carry no toolCall parts; any toolCall part means `toolUse`.
    """

    content: list[OutputPart]
    finish: Literal["stop", "length", "refusal", "toolUse"]
    usage: Usage | None = None

    @model_validator(mode="after")
    def _finish_matches_content(self) -> Generation:
        calls = [p for p in self.content if isinstance(p, ToolCallPart)]
        if self.finish == "toolUse" and not calls:
            raise ValueError("toolUse needs at least one toolCall")
        if calls and self.finish != "toolUse":
            raise ValueError("toolCall parts need finish toolUse")
        return self


class Delta(_Output):
    """One streamed block event (NAP-LLM, Delta)."""

    requestId: NonEmptyText
    sequence: Annotated[int, Field(ge=0)]
    event: Literal["start", "delta", "end"]
    block: Literal["text", "thinking", "toolCall"]
    blockIndex: Annotated[int, Field(ge=0)]
    text: str | None = None
    toolCallId: NonEmptyText | None = None
    name: str | None = None

    @model_validator(mode="after")
    def _fields_by_event(self) -> Delta:
        if (self.event == "delta") != (self.text is not None):
            raise ValueError("text is for delta events only")
        is_call_start = self.event == "start" and self.block == "toolCall"
        if is_call_start != (self.toolCallId is not None and self.name is not None):
            raise ValueError("toolCallId and name are for toolCall start only")
        return self


# --------------------------------------------------------------------------
# Parsing helpers


def _field_names(*models: type[BaseModel]) -> frozenset[str]:
    names: set[str] = set()
    for model in models:
        for name, info in model.model_fields.items():
            names.add(name)
            if info.alias:
                names.add(info.alias)
    return frozenset(names)


#: Every field name of the input records: the only words a path may quote.
_KNOWN_FIELDS = _field_names(
    TextPart,
    ThinkingPart,
    ImagePart,
    ToolCallPart,
    Message,
    Tool,
    ToolChoice,
    GenerationRequest,
    Requirements,
)


def _member_name(model: type[BaseModel], key: object, position: int) -> str:
    """A field by its name when `model` declares it, else by its position."""
    fields = model.model_fields
    if isinstance(key, str) and (
        key in fields or any(info.alias == key for info in fields.values())
    ):
        return key
    return f"member {position}"


def _member_position(raw: Any, loc: tuple[int | str, ...]) -> int | None:
    """The 1-based position of the key `loc[-1]` in the object at `loc[:-1]` of `raw`."""
    node = raw
    for item in loc[:-1]:
        in_list = isinstance(item, int) and isinstance(node, list) and 0 <= item < len(node)
        if in_list or (isinstance(item, str) and isinstance(node, dict) and item in node):
            node = node[item]
        elif isinstance(item, str):
            continue  # a branch label pydantic inserted (tagged union, function)
        else:
            return None
    if isinstance(node, dict):
        for position, key in enumerate(node, start=1):
            if key == loc[-1]:
                return position
    return None


def _loc_path(root: str, loc: tuple[int | str, ...]) -> str:
    path = root
    previous: int | str | None = None
    for item in loc:
        if isinstance(item, int):
            path += f"[{item}]"
        elif item.startswith(("function-", "tagged-union", "literal[")):
            pass
        elif isinstance(previous, int) and item in ("text", "image", "thinking", "toolCall"):
            pass  # the discriminated-union branch pydantic inserts after a list index
        elif item in _KNOWN_FIELDS:
            path += f".{item}"
        else:
            path += ".(unknown member)"  # never the napplet's own key
        previous = item
    return path


def safe_validation_message(root: str, exc: ValidationError, raw: Any = None) -> str:
    """A safe one-line reason for the first error: field path and kind, no values.

    `raw`: the input that failed, used only to name an unknown member by its
    position in its object. The message never contains napplet text.
    """
    err = exc.errors(include_url=False, include_input=False, include_context=False)[0]
    loc = tuple(err.get("loc", ()))
    kind = err.get("type", "invalid")
    if kind == "extra_forbidden" and loc:
        position = _member_position(raw, loc)
        where = _loc_path(root, loc[:-1])
        member = f"member {position}" if position is not None else "a member"
        return f"Invalid {where}: {member} is an unknown field."
    path = _loc_path(root, loc)
    reason = {
        "extra_forbidden": "unknown field",
        "missing": "missing required field",
        "literal_error": "not an allowed value",
        "union_tag_invalid": "unknown part type",
        "union_tag_not_found": "missing part type",
        "string_type": "must be text",
        "string_unicode": "contains text that is not valid Unicode",
        "int_type": "must be an integer",
        "float_type": "must be a number",
        "bool_type": "must be a boolean",
        "list_type": "must be a list",
        "dict_type": "must be an object",
        "model_type": "must be an object",
        "too_short": "must not be empty",
        "string_too_short": "must not be empty",
        "string_pattern_mismatch": "does not match the allowed pattern",
        "greater_than_equal": "is below the minimum",
        "finite_number": "must be a finite number",
    }.get(kind)
    if reason is None:
        # value_error messages are written by this module and hold no input values
        msg = str(err.get("msg", "invalid value"))
        reason = msg.removeprefix("Value error, ") if kind == "value_error" else "invalid value"
    return f"Invalid {path}: {reason}."


def parse_generation_request(raw: Any) -> GenerationRequest:
    """Parse `llm.generate`'s `request`; raises `RecordError` (`invalid-request`)."""
    try:
        return GenerationRequest.model_validate(raw)
    except ValidationError as exc:
        raise RecordError(safe_validation_message("request", exc, raw)) from None


def parse_requirements(raw: Any) -> Requirements:
    """Parse `llm.select`'s `requirements`; raises `RecordError` (`invalid-request`)."""
    try:
        return Requirements.model_validate(raw)
    except ValidationError as exc:
        raise RecordError(safe_validation_message("requirements", exc, raw)) from None
