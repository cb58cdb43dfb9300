"""Rendering a conversation with the model's chat template (LMSP 1.0, 6.1; docs/lmsp.md 9.2).

The chat template is Jinja text from the GGUF file, run by llama-cpp-python's
sandboxed formatter (`Jinja2ChatFormatter`): the sandbox keeps a template
away from Python's internals, but not from time or memory. A template is
code, and the conversation it loops over is a request's; a template that
loops (or a conversation that makes it loop) would hold a thread of the HTTP
process that nothing can stop. So the service renders in a schema worker
(`bounded.BoundedPool`), killed at `RENDER_TIME_LIMIT_S` and capped in
memory like every schema worker, and the rendered text is sent back only
when it could still fit the context (`max_chars`).

Rules
- Prompts are rendered outside the model worker with the GGUF's own chat
  template (`tokenizer.chat_template`, reported by the worker) in the
  OpenAI chat shape the template expects (`chat_messages`, `chat_tools`):
  input `message` items become `{"role", "content"}`, `function_call`
  items become an assistant message with `tool_calls`,
  `function_call_output` items become `{"role": "tool", "tool_call_id",
  "content"}`, and the tool definitions are passed as `tools`. A template
  that does not mention tools leaves them out.
- The prompt's token ids are llama.cpp's own for the conversation
  (llama-server's): the tokenizer adds the special tokens the vocabulary
  asks for (`add_bos`, `add_eos`) and parses special tokens in the text,
  so a BOS text the template writes at the start (`{{ bos_token }}`) is
  removed when the tokenizer adds BOS itself, and an EOS text at the end
  when it adds EOS, as llama.cpp's chat-template code does; otherwise
  such a prompt began with two BOS tokens. docs/lmsp.md 9.4.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from llama_cpp.llama_chat_format import Jinja2ChatFormatter

from ..lmsp import FunctionCallIn, FunctionCallOutputIn, FunctionTool, InputImage, MessageItemIn

#: Seconds rendering one prompt may take in a schema worker.
RENDER_TIME_LIMIT_S = 5.0


class TemplateError(Exception):
    """The chat template rejected the conversation (or has none)."""


class PromptTooLong(Exception):
    """The rendered prompt is longer than any prompt that fits the context."""


@dataclass(frozen=True)
class ChatTemplate:
    """A model's chat template: Jinja `text`, the texts of its BOS and EOS tokens,
    and whether the tokenizer adds BOS (`add_bos`) and EOS (`add_eos`) itself."""

    text: str
    bos_text: str
    eos_text: str
    add_bos: bool = False
    add_eos: bool = False


#: The formatter of the last template rendered in this process (one model per service).
_formatter: tuple[ChatTemplate, Jinja2ChatFormatter] | None = None


def render_prompt(
    template: ChatTemplate,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    max_chars: int | None = None,
) -> str:
    """Render chat `messages` (and `tools`, OpenAI chat shapes) with `template`.

    Returns the prompt text for a tokenizer that adds the vocabulary's
    special tokens (module rules). Raises `TemplateError` when the template
    rejects the conversation, `PromptTooLong` when the text has more than
    `max_chars` characters (`None`: no limit). Pure Python; the service
    calls it in a schema worker under `RENDER_TIME_LIMIT_S`.
    """
    global _formatter
    if _formatter is None or _formatter[0] != template:
        formatter = Jinja2ChatFormatter(
            template=template.text, eos_token=template.eos_text, bos_token=template.bos_text
        )
        _formatter = (template, formatter)
    try:
        result = _formatter[1](messages=messages, tools=tools)  # type: ignore[arg-type]
    except Exception as exc:  # Jinja raises many types; the template's own ValueError too
        raise TemplateError("the chat template rejected the conversation") from exc
    prompt = str(result.prompt)
    # The tokenizer adds these itself (module rules).
    if template.add_bos and template.bos_text and prompt.startswith(template.bos_text):
        prompt = prompt[len(template.bos_text) :]
    if template.add_eos and template.eos_text and prompt.endswith(template.eos_text):
        prompt = prompt[: -len(template.eos_text)]
    if max_chars is not None and len(prompt) > max_chars:
        raise PromptTooLong("the rendered prompt cannot fit the context")
    return prompt


def chat_messages(items: Sequence[Any]) -> list[dict[str, Any]]:
    """Map LMSP input items (6.1, 6.5) to OpenAI-style chat messages for a template.

    `items` are `MessageItemIn`, `FunctionCallIn` and `FunctionCallOutputIn`
    records. Consecutive `function_call` items join one assistant message
    (after its text, if the assistant message came right before). Images
    must have been refused before (raises `ValueError` if one is present).
    """
    messages: list[dict[str, Any]] = []
    for item in items:
        if isinstance(item, MessageItemIn):
            texts: list[str] = []
            for part in item.content:
                if isinstance(part, InputImage):
                    raise ValueError("images are not supported by this model")
                texts.append(part.text)
            messages.append({"role": item.role, "content": "".join(texts)})
        elif isinstance(item, FunctionCallIn):
            call = {
                "id": item.call_id,
                "type": "function",
                "function": {"name": item.name, "arguments": item.arguments},
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif isinstance(item, FunctionCallOutputIn):
            if item.images:
                raise ValueError("images are not supported by this model")
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": item.output})
        else:  # pragma: no cover - the request records admit no other item
            raise ValueError("unknown input item")
    return messages


def chat_tools(tools: Sequence[FunctionTool]) -> list[dict[str, Any]]:
    """LMSP function tools (6.5) in the OpenAI chat `tools` shape templates expect."""
    out = []
    for tool in tools:
        function: dict[str, Any] = {"name": tool.name, "parameters": tool.parameters}
        if tool.description is not None:
            function["description"] = tool.description
        out.append({"type": "function", "function": function})
    return out
