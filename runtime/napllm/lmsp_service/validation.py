"""Service-side checks of a response request (LMSP 1.0, 6.1, 6.5; docs/lmsp.md).

Rules
- The body is parsed into `napllm.lmsp.LmspRequest` (strict types, unknown
  fields refused). Any defect is a 400 `invalid_request` problem whose
  detail names the offending location by field names and indices only
  (never a value from the request).
- Checks that need the model: `model` must be the served id (404
  `model_not_found`); images, tools or structured output beyond the model's
  capabilities give 400 `unsupported_capability`; a prompt that leaves no
  room for one output token gives 400 `context_length_exceeded`.
- Other checks: `max_output_tokens >= 1`; `0 <= temperature <= 2`; tool
  names unique and `[A-Za-z0-9_-]{1,64}`; tool `parameters` and the
  `response_format` schema must be valid JSON Schemas (`check_schemas`,
  which the service runs in a bounded child process, `bounded.py`, since
  checking a schema compiles its patterns); `tool_choice` other
  than `auto` needs tools and a named choice must name one; a
  `function_call_output` must answer an earlier `function_call` of the
  conversation; only the documented `extensions` are accepted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import jsonschema
from jsonschema.exceptions import SchemaError
from pydantic import ValidationError

from ..jsontext import JsonTextError, read_json
from ..lmsp import (
    FunctionCallIn,
    FunctionCallOutputIn,
    LmspRequest,
    MessageItemIn,
    NamedToolChoice,
    OutputTextIn,
)
from .problems import ProblemError

TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_SAFE_KEY = re.compile(r"[A-Za-z0-9_]{1,40}")
KNOWN_EXTENSIONS = frozenset({"min_output_tokens"})
#: Deepest nesting of objects and arrays accepted in a request body.
BODY_MAX_DEPTH = 64

# Shared by the checks below; these hold no request data.
_ERROR_KINDS = {
    "extra_forbidden": "unknown field",
    "missing": "missing field",
    "literal_error": "unexpected value",
    "union_tag_invalid": "unknown type",
    "union_tag_not_found": "missing type",
}


def _location(loc: tuple[int | str, ...]) -> str:
    parts: list[str] = []
    for step in loc:
        if isinstance(step, int):
            parts.append(f"[{step}]")
        elif _SAFE_KEY.fullmatch(step):
            parts.append(("." if parts else "") + step)
        else:
            parts.append(("." if parts else "") + "?")
    return "".join(parts) or "body"


def parse_body(body: bytes) -> tuple[LmspRequest, Any]:
    """Parse a request body into an `LmspRequest` (6.1).

    The body is read by the strict reader (`napllm.jsontext.read_json`:
    RFC 8259 only, no duplicate keys, numbers that fit a double, no lone
    surrogates, at most `BODY_MAX_DEPTH` levels). Returns the record and the
    decoded JSON (for idempotency fingerprints). Raises
    `ProblemError("invalid_request")` naming the first bad location.
    """
    try:
        raw = read_json(body, max_depth=BODY_MAX_DEPTH)
    except JsonTextError as exc:
        # The reader's sentences never quote the text; name the body, not "the text".
        detail = str(exc).replace("The text", "The body", 1)
        raise ProblemError("invalid_request", detail) from exc
    if not isinstance(raw, dict):
        raise ProblemError("invalid_request", "The body must be a JSON object.")
    try:
        request = LmspRequest.model_validate(_without_output_members(raw))
    except ValidationError as exc:
        first = exc.errors(include_url=False, include_input=False, include_context=False)[0]
        # Discriminated unions add the tag name as a location step; drop it.
        loc = tuple(
            step
            for step in first["loc"]
            if not (
                isinstance(step, str)
                and step
                in {
                    "message",
                    "function_call",
                    "function_call_output",
                    "input_text",
                    "input_image",
                    "output_text",
                }
            )
        )
        kind = _ERROR_KINDS.get(first["type"], "wrong type or value")
        raise ProblemError(
            "invalid_request", f"Invalid request: {kind} at {_location(loc)}."
        ) from exc
    except RecursionError as exc:
        raise ProblemError("invalid_request", "The body is nested too deeply.") from exc
    return request, raw


def _without_output_members(raw: dict[str, Any]) -> dict[str, Any]:
    """Drop `id` and `status` from replayed input items (6.5: sent back "as received").

    Output items carry a string `id` (and peers add a `status`); a client
    replaying them as input need not strip them, so they are ignored here.
    Any other unknown member is still refused.
    """
    items = raw.get("input")
    if not isinstance(items, list):
        return raw
    cleaned: list[Any] = []
    for item in items:
        if isinstance(item, dict) and item.get("type") in {"message", "function_call"}:
            item = dict(item)
            if isinstance(item.get("id"), str):
                del item["id"]
            if item.get("status") in {"completed", "incomplete", "in_progress"}:
                del item["status"]
        cleaned.append(item)
    return {**raw, "input": cleaned}


@dataclass
class ModelFacts:
    """What the served model can do: `model_id`, `n_ctx` (tokens), `tools`, `images`."""

    model_id: str
    n_ctx: int
    tools: bool
    images: bool = False


@dataclass
class Checked:
    """A request that passed the model-independent checks.

    `items`: the whole conversation (previous response context + `input`);
    `tool_names`: callable tools, or `None` when tool calling is off;
    `forced_tool`: whether `tool_choice` forces a call; `output_schema`: the
    `json_schema` to enforce, if any; `min_output_tokens`: extension value;
    `schemas`: `(what, schema)` pairs still to be checked by `check_schemas`.
    """

    request: LmspRequest
    items: list[Any]
    tool_names: list[str] | None
    forced_tool: bool
    output_schema: dict[str, Any] | None
    min_output_tokens: int = 0
    grammar: str | None = field(default=None)
    schemas: list[tuple[str, Any]] = field(default_factory=list)


def check_schemas(schemas: list[tuple[str, Any]]) -> str | None:
    """The first of `(what, schema)` that is not a valid JSON Schema, as a sentence, or `None`.

    Checking compiles every `pattern` (the metaschema's `format: regex`),
    whose cost depends on outside text: the service calls this in a bounded
    child process (`bounded.py`), never on the event loop.
    """
    for what, schema in schemas:
        try:
            # JSON Schema 2020-12 whatever `$schema` says: the grammar reads it so.
            jsonschema.Draft202012Validator.check_schema(schema)
        except (SchemaError, OverflowError, RecursionError, ValueError, MemoryError):
            # OverflowError/ValueError: a `pattern` Python's `re` cannot compile.
            return f"The {what} is not a valid JSON Schema."
    return None


@dataclass(frozen=True)
class OutputFacts:
    """What the post-generation check needs, as plain data that crosses to a child process.

    `forced_tool`: `tool_choice` forced a call; `calls`: `(name, arguments
    JSON text)` of each function call produced; `tool_schemas`: the
    `parameters` of each offered tool by name; `output_schema`: the
    `json_schema` to enforce or `None`; `message_text`: the message text
    produced.
    """

    forced_tool: bool
    calls: list[tuple[str, str]]
    tool_schemas: dict[str, Any]
    output_schema: dict[str, Any] | None
    message_text: str


def check_output(facts: OutputFacts) -> str | None:
    """Post-generation checks (6.1, 6.5); a safe failure sentence or `None`.

    A forced tool call must exist and its arguments must satisfy the tool's
    `parameters`; structured output must be JSON satisfying the schema.
    Evaluating a schema against text can take any time (backtracking
    `pattern`s, exponential `anyOf`/`$ref` graphs): the service calls this
    in a bounded child process (`bounded.py`) only.
    """
    if facts.forced_tool and not facts.calls:
        return "The model did not call a tool although tool_choice required one."
    if facts.forced_tool:
        for name, arguments_text in facts.calls:
            try:
                arguments = read_json(arguments_text)
            except JsonTextError:
                return "The model's tool call arguments are not JSON."
            schema = facts.tool_schemas[name]
            if not jsonschema.Draft202012Validator(schema).is_valid(arguments):
                return "The model's tool call arguments do not match the tool's parameters."
    if facts.output_schema is not None and not facts.calls:
        try:
            value = read_json(facts.message_text)
        except JsonTextError:
            return "The model's output is not JSON."
        # 2020-12, as the grammar and the tool check read it: an older draft's
        # `$schema` would make its keywords (`dependencies`, `divisibleBy`)
        # assertions that no grammar enforced.
        if not jsonschema.Draft202012Validator(facts.output_schema).is_valid(value):
            return "The model's output does not match the requested JSON schema."
    return None


def check_request(request: LmspRequest, facts: ModelFacts, previous: list[Any] | None) -> Checked:
    """Apply the checks of this module's docstring that need no tokenizer.

    The schemas are not checked here but listed in `Checked.schemas` for
    `check_schemas`.

    `previous` is the conversation of the stored response named by
    `previous_response_id` (already resolved), or `None`. Raises
    `ProblemError` (`model_not_found`, `unsupported_capability`,
    `invalid_request`).
    """
    if request.model != facts.model_id:
        raise ProblemError("model_not_found")
    if request.uses_images() and not facts.images:
        raise ProblemError("unsupported_capability", "The model does not accept images.")
    items: list[Any] = list(previous or []) + list(request.input)
    if not items:
        raise ProblemError("invalid_request", "The input is empty.")
    if request.max_output_tokens is not None and request.max_output_tokens < 1:
        raise ProblemError("invalid_request", "max_output_tokens must be at least 1.")
    if request.temperature is not None and not 0.0 <= request.temperature <= 2.0:
        raise ProblemError("invalid_request", "temperature must be between 0 and 2.")

    call_ids: set[str] = set()
    for item in items:
        if isinstance(item, FunctionCallIn):
            call_ids.add(item.call_id)
        elif isinstance(item, FunctionCallOutputIn) and item.call_id not in call_ids:
            raise ProblemError(
                "invalid_request", "A function_call_output answers no earlier function_call."
            )

    tools = request.tools or []
    schemas: list[tuple[str, Any]] = []
    names = [tool.name for tool in tools]
    if len(set(names)) != len(names):
        raise ProblemError("invalid_request", "Tool names must be unique.")
    for tool in tools:
        if not TOOL_NAME.fullmatch(tool.name):
            raise ProblemError("invalid_request", "A tool name is not [A-Za-z0-9_-]{1,64}.")
        schemas.append(("parameters schema of a tool", tool.parameters))
    if tools and not facts.tools:
        raise ProblemError("unsupported_capability", "The model does not support tools.")

    choice = request.tool_choice if request.tool_choice is not None else "auto"
    if choice != "auto" and choice != "none" and not tools:
        raise ProblemError("invalid_request", "tool_choice needs tools.")
    if isinstance(choice, NamedToolChoice) and choice.name not in names:
        raise ProblemError("invalid_request", "tool_choice names a tool that is not offered.")
    tool_names: list[str] | None = None
    if tools and choice != "none":
        tool_names = [choice.name] if isinstance(choice, NamedToolChoice) else names
    forced = choice == "required" or isinstance(choice, NamedToolChoice)

    schema: dict[str, Any] | None = None
    fmt = request.response_format
    if fmt is not None:
        if fmt.type == "json_schema":
            if fmt.json_schema is None:
                raise ProblemError("invalid_request", "response_format needs json_schema.")
            schema = fmt.json_schema.schema_
            schemas.append(("response_format schema", schema))
            if forced:
                raise ProblemError(
                    "invalid_request", "A forced tool call cannot be combined with json_schema."
                )
        elif fmt.json_schema is not None:
            raise ProblemError("invalid_request", "json_schema is only allowed with that type.")

    min_output = 0
    for key, value in (request.extensions or {}).items():
        if key not in KNOWN_EXTENSIONS:
            raise ProblemError("invalid_request", "The request uses an unknown extension.")
        if key == "min_output_tokens":
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ProblemError(
                    "invalid_request", "extensions.min_output_tokens must be an integer >= 0."
                )
            min_output = value
    return Checked(
        request=request,
        items=items,
        tool_names=tool_names,
        forced_tool=forced,
        output_schema=schema,
        min_output_tokens=min_output,
        schemas=schemas,
    )


def output_as_input(output: list[dict[str, Any]]) -> list[Any]:
    """Turn a stored response's output items into input items for the next turn.

    `message` items become assistant messages of `output_text` parts;
    `function_call` items are replayed as they are (6.5). Other item types
    are skipped.
    """
    items: list[Any] = []
    for item in output:
        if item["type"] == "message":
            parts = [OutputTextIn(text=p["text"]) for p in item["content"] if "text" in p]
            items.append(MessageItemIn(role="assistant", content=list(parts)))
        elif item["type"] == "function_call":
            items.append(
                FunctionCallIn(
                    call_id=item["call_id"], name=item["name"], arguments=item["arguments"]
                )
            )
    return items
