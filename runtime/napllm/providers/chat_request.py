"""LMSP requests as OpenAI chat-completions bodies (LMSP 1.0, 6.1, 6.5).

OpenAI-compatible servers (Ollama, llama.cpp server, LM Studio, vLLM), WebLLM,
wllama and transformers.js all take chat-completion requests; `lmsp_to_chat`
builds that body. The answers are mapped back by `chat_stream`.

Rules
- `message` items keep their role; text parts of one message are joined by
  a newline into one string (the one shape every engine accepts); images are
  sent as `image_url` parts with `data:` URIs, and only when present.
- Replayed `function_call` items join the assistant message right before
  them as `tool_calls` (a new assistant message with empty content when none
  precedes them); `function_call_output` items become `tool` messages with
  `tool_call_id`.
- `tool_choice` named `{"type": "function", "name": n}` becomes
  `{"type": "function", "function": {"name": n}}`; `response_format`
  `json_schema` is sent in the style the server understands
  (`ResponseFormatStyle`); `max_output_tokens` becomes `max_tokens`; a
  streamed request asks for usage in the last chunk.
"""

from __future__ import annotations

from typing import Any, Literal

from ..lmsp import (
    FunctionCallIn,
    FunctionCallOutputIn,
    InputImage,
    InputText,
    LmspRequest,
    MessageItemIn,
    NamedToolChoice,
    OutputTextIn,
)

ResponseFormatStyle = Literal["json_schema", "json_object", "json_object_schema"]
"""How `response_format: json_schema` is sent.

`json_schema`: `{"type": "json_schema", "json_schema": {"name", "schema"}}`
(OpenAI, Ollama, LM Studio, llama.cpp server); `json_object`:
`{"type": "json_object"}` for servers that know only JSON mode (the schema is
then not enforced by the server); `json_object_schema`:
`{"type": "json_object", "schema": {...}}` (llama-cpp-python's server, which
turns the schema into a grammar).
"""


def _data_uri(image: InputImage) -> dict[str, Any]:
    return {
        "type": "image_url",
        "image_url": {"url": f"data:{image.mime_type};base64,{image.data}"},
    }


def _message(item: MessageItemIn) -> dict[str, Any]:
    texts: list[str] = []
    has_image = False
    for part in item.content:
        if isinstance(part, InputText | OutputTextIn):
            texts.append(part.text)
        else:
            has_image = True
    if not has_image:
        return {"role": item.role, "content": "\n".join(texts)}
    parts: list[dict[str, Any]] = []
    for part in item.content:
        if isinstance(part, InputImage):
            parts.append(_data_uri(part))
        else:
            parts.append({"type": "text", "text": part.text})
    return {"role": item.role, "content": parts}


def _tool_message(item: FunctionCallOutputIn) -> dict[str, Any]:
    content: str | list[dict[str, Any]] = item.output
    if item.images:
        content = [{"type": "text", "text": item.output}, *map(_data_uri, item.images)]
    return {"role": "tool", "tool_call_id": item.call_id, "content": content}


def lmsp_to_chat(
    request: LmspRequest,
    *,
    response_format_style: ResponseFormatStyle = "json_schema",
    stream: bool | None = None,
) -> dict[str, Any]:
    """The chat-completions body for an LMSP request (LMSP 1.0, 6.1 and 6.5).

    Returns a JSON-ready dict with `model`, `messages`, `stream` and, when
    set, `tools`, `tool_choice`, `response_format`, `max_tokens`,
    `temperature` and `stream_options: {"include_usage": true}` (streamed
    requests). `stream` overrides the request's own (the in-browser engines
    always stream). `store`, `previous_response_id` and `extensions` have no
    chat-completions equivalent and are not sent (the translation never sets
    `previous_response_id` for these connections). Never raises for a valid
    `LmspRequest`.
    """
    messages: list[dict[str, Any]] = []
    assistant: dict[str, Any] | None = None  # where replayed calls attach
    for item in request.input:
        if isinstance(item, MessageItemIn):
            message = _message(item)
            messages.append(message)
            assistant = message if item.role == "assistant" else None
        elif isinstance(item, FunctionCallIn):
            if assistant is None:
                assistant = {"role": "assistant", "content": ""}
                messages.append(assistant)
            assistant.setdefault("tool_calls", []).append(
                {
                    "id": item.call_id,
                    "type": "function",
                    "function": {"name": item.name, "arguments": item.arguments},
                }
            )
        else:
            messages.append(_tool_message(item))
            assistant = None

    streamed = request.stream if stream is None else stream
    body: dict[str, Any] = {"model": request.model, "messages": messages, "stream": streamed}
    if streamed:
        body["stream_options"] = {"include_usage": True}
    if request.max_output_tokens is not None:
        body["max_tokens"] = request.max_output_tokens
    if request.temperature is not None:
        body["temperature"] = request.temperature
    if request.tools:
        tools = []
        for tool in request.tools:
            function: dict[str, Any] = {"name": tool.name, "parameters": tool.parameters}
            if tool.description is not None:
                function["description"] = tool.description
            tools.append({"type": "function", "function": function})
        body["tools"] = tools
    choice = request.tool_choice
    if isinstance(choice, NamedToolChoice):
        body["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
    elif choice is not None:
        body["tool_choice"] = choice
    fmt = request.response_format
    if fmt is not None and fmt.type == "json_schema" and fmt.json_schema is not None:
        spec = fmt.json_schema
        if response_format_style == "json_schema":
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": spec.name, "schema": spec.schema_},
            }
        elif response_format_style == "json_object_schema":
            body["response_format"] = {"type": "json_object", "schema": spec.schema_}
        else:
            body["response_format"] = {"type": "json_object"}
    return body
