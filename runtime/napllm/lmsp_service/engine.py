"""llama.cpp generation for the LMSP service (LMSP 1.0, 6.1, 6.5; docs/lmsp.md).

Rules
- One GGUF model per service, loaded through llama-cpp-python. Generations
  run one at a time on a single worker thread (llama.cpp contexts are not
  thread-safe); text pieces are handed to the caller's `sink`, which must
  be thread-safe (the application wraps `loop.call_soon_threadsafe`).
- Prompts are rendered with the GGUF's own chat template
  (`tokenizer.chat_template`) through llama-cpp-python's Jinja formatter, in
  the OpenAI chat shape the template expects: input `message` items become
  `{"role", "content"}`, `function_call` items become an assistant message
  with `tool_calls`, `function_call_output` items become `{"role": "tool",
  "tool_call_id", "content"}`, and the tool definitions are passed as
  `tools`. A template that does not mention tools leaves them out: what the
  model sees is what it was trained on.
- Structured output (`response_format: json_schema`) and forced tool calls
  (`tool_choice: "required"` or a named tool) are constrained with a
  llama.cpp grammar made by llama-cpp-python's JSON-Schema converter. The
  grammar is not trusted (llama.cpp has run unconstrained on grammar
  errors): the caller checks the output afterwards.
- Cancellation is checked between tokens (a stopping criterion reading a
  `threading.Event`); prompt evaluation itself cannot be interrupted.
- `output_tokens` counts sampled tokens without the end-of-generation token.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast

import numpy as np
from llama_cpp import Llama, LogitsProcessorList, StoppingCriteriaList
from llama_cpp.llama_chat_format import Jinja2ChatFormatter
from llama_cpp.llama_grammar import LlamaGrammar, json_schema_to_gbnf

from ..lmsp import FunctionCallIn, FunctionCallOutputIn, FunctionTool, InputImage, MessageItemIn

DEFAULT_TEMPERATURE = 0.8

FinishReason = Literal["stop", "length", "cancelled", "error"]


class GrammarUnavailable(Exception):
    """A JSON Schema cannot be turned into a llama.cpp grammar."""


class TemplateError(Exception):
    """The chat template rejected the conversation (or has none)."""


@dataclass
class GenerationJob:
    """One generation: prompt token ids, limits and sampling settings.

    `max_tokens`: output limit in tokens (`None`: the room left in the
    context); `temperature`: 0 is greedy; `grammar`: optional constraint;
    `min_output_tokens`: end-of-generation tokens are forbidden until this
    many tokens were produced; `cancel`: set to stop between tokens.
    """

    prompt_tokens: list[int]
    max_tokens: int | None
    temperature: float
    grammar: LlamaGrammar | None = None
    min_output_tokens: int = 0
    cancel: threading.Event = field(default_factory=threading.Event)


@dataclass
class TextPiece:
    """A piece of generated text (valid UTF-8, possibly several tokens)."""

    text: str


@dataclass
class GenerationEnd:
    """The end of a generation: why it stopped and how many tokens it produced."""

    finish_reason: FinishReason
    output_tokens: int


Update = TextPiece | GenerationEnd
Sink = Callable[[Update], None]


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


def json_grammar(schema: dict[str, Any]) -> LlamaGrammar:
    """A grammar accepting JSON text valid for `schema` (structured output, 6.1).

    Raises `GrammarUnavailable` when the converter cannot express the schema.
    """
    try:
        gbnf = json_schema_to_gbnf(json.dumps(schema))
    except Exception as exc:  # the converter raises bare Exceptions and KeyErrors
        raise GrammarUnavailable("schema not expressible as a grammar") from exc
    return LlamaGrammar.from_string(gbnf, verbose=False)


_RULE_NAME = re.compile(r"(?<![\w-])root(?![\w-])")


def tool_call_grammar(tools: Sequence[FunctionTool]) -> LlamaGrammar:
    """A grammar forcing exactly one `<tool_call>` block calling one of `tools` (6.5).

    The block holds `{"name": <tool name>, "arguments": <object valid for the
    tool's parameters>}`. Raises `GrammarUnavailable` when a tool's
    parameters cannot be expressed as a grammar.
    """
    variants = [
        {
            "type": "object",
            "properties": {"name": {"const": tool.name}, "arguments": tool.parameters},
            "required": ["name", "arguments"],
        }
        for tool in tools
    ]
    schema = variants[0] if len(variants) == 1 else {"anyOf": variants}
    try:
        gbnf = json_schema_to_gbnf(json.dumps(schema))
    except Exception as exc:  # the converter raises bare Exceptions and KeyErrors
        raise GrammarUnavailable("tool parameters not expressible as a grammar") from exc
    rules = []
    for line in gbnf.splitlines():
        if line.startswith("root ::="):
            line = "tool-call-json ::=" + line[len("root ::=") :]
        elif line.startswith("tool-call-json ::="):
            raise GrammarUnavailable("grammar rule name clash")
        rules.append(line)
    if any(_RULE_NAME.search(rule) for rule in rules):
        raise GrammarUnavailable("recursive schema cannot be wrapped")
    rules.append('root ::= "<tool_call>\\n" tool-call-json "\\n</tool_call>"')
    return LlamaGrammar.from_string("\n".join(rules), verbose=False)


class Engine:
    """One llama.cpp model and the worker thread that runs its generations.

    `model_path`: a GGUF file; `model_id`: the id clients use (LMSP `model`);
    `n_ctx`: context window in tokens (default: the model's trained
    context); `n_threads`: CPU threads for llama.cpp (default: its own).
    Raises `ValueError` when the model cannot be loaded or has no chat
    template.
    """

    def __init__(
        self,
        model_path: Path,
        model_id: str,
        n_ctx: int | None = None,
        n_threads: int | None = None,
    ) -> None:
        self.model_id = model_id
        self._llama = Llama(
            model_path=str(model_path),
            n_ctx=n_ctx if n_ctx is not None else 0,  # 0: the trained context
            n_threads=n_threads,
            verbose=False,
        )
        self.n_ctx: int = int(self._llama.n_ctx())
        template = self._llama.metadata.get("tokenizer.chat_template")
        if not template:
            raise ValueError("the model has no chat template (tokenizer.chat_template)")
        self.chat_template: str = template
        model = self._llama._model
        self._formatter = Jinja2ChatFormatter(
            template=template,
            eos_token=model.token_get_text(self._llama.token_eos()),
            bos_token=model.token_get_text(self._llama.token_bos()),
        )
        self._add_bos = bool(model.add_bos_token())
        self._eog_ids = np.array(
            [
                token
                for token in range(self._llama.n_vocab())
                if self._llama_cpp_is_eog(model.vocab, token)
            ],
            dtype=np.intp,
        )
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llama")

    @staticmethod
    def _llama_cpp_is_eog(vocab: Any, token: int) -> bool:
        import llama_cpp

        return bool(llama_cpp.llama_vocab_is_eog(vocab, token))

    # -- capabilities ---------------------------------------------------------

    @property
    def supports_tools(self) -> bool:
        """Whether the chat template can render tool calls (and so tool use)."""
        return "tool_calls" in self.chat_template or "tools" in self.chat_template

    # -- prompt ---------------------------------------------------------------

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
        """Render chat `messages` (and `tools`) with the model's template.

        Raises `TemplateError` when the template rejects the conversation.
        """
        try:
            result = self._formatter(messages=messages, tools=tools)  # type: ignore[arg-type]
        except Exception as exc:  # Jinja raises many types; the template's own ValueError too
            raise TemplateError("the chat template rejected the conversation") from exc
        return str(result.prompt)

    def tokenize(self, prompt: str) -> list[int]:
        """Token ids of a rendered prompt (special tokens parsed, BOS per the model)."""
        tokens = self._llama.tokenize(prompt.encode("utf-8"), add_bos=self._add_bos, special=True)
        return list(tokens)

    # -- generation -------------------------------------------------------------

    def submit(self, job: GenerationJob, sink: Sink) -> Future[None]:
        """Queue `job` on the worker thread; `sink` receives its updates.

        `sink` gets `TextPiece`s and then exactly one `GenerationEnd`
        (`finish_reason` `error` when llama.cpp failed; the exception is
        re-raised through the returned future for logging).
        """
        return self._executor.submit(self._run, job, sink)

    def close(self) -> None:
        """Stop the worker thread after the running generation and free the model."""
        self._executor.shutdown(wait=True, cancel_futures=True)
        self._llama.close()

    def _run(self, job: GenerationJob, sink: Sink) -> None:
        if job.cancel.is_set():
            sink(GenerationEnd("cancelled", 0))
            return
        sampled = 0
        eog_ids = self._eog_ids

        def count_and_shape(_input_ids: Any, scores: Any) -> Any:
            nonlocal sampled
            sampled += 1
            if sampled <= job.min_output_tokens and eog_ids.size:
                scores[eog_ids] = -np.inf
            return scores

        def cancelled(_input_ids: Any, _scores: Any) -> bool:
            return job.cancel.is_set()

        finish: str | None = None
        try:
            stream = self._llama.create_completion(
                prompt=job.prompt_tokens,
                max_tokens=job.max_tokens if job.max_tokens is not None else -1,
                temperature=job.temperature,
                grammar=job.grammar,
                stream=True,
                logits_processor=LogitsProcessorList([count_and_shape]),
                stopping_criteria=StoppingCriteriaList([cancelled]),
            )
            for chunk in cast(Iterator[Any], stream):
                choice = chunk["choices"][0]
                if choice["text"]:
                    sink(TextPiece(choice["text"]))
                if choice["finish_reason"] is not None:
                    finish = choice["finish_reason"]
        except BaseException:
            sink(GenerationEnd("error", max(sampled - 1, 0)))
            raise
        if job.cancel.is_set():
            sink(GenerationEnd("cancelled", max(sampled - 1, 0)))
        elif finish == "length":
            sink(GenerationEnd("length", sampled))
        else:
            # Stopped on an end-of-generation token, which is not output.
            sink(GenerationEnd("stop", max(sampled - 1, 0)))
