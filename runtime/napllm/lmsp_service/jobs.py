"""A generation as the service hands it to the engine, and what comes back (LMSP 1.0, 6.1, 6.3).

Rules
- A `GenerationJob` carries token ids, never text: the service rendered the
  prompt (prompt.py) and had it tokenized (`engine.Engine.tokenize`) before.
- Structured output and forced tool calls are constrained by GBNF text built
  by grammar.py (bounded); the grammar is not trusted (llama.cpp has run
  unconstrained on grammar errors): the caller checks the output afterwards.
- A job's sink receives `TextPiece`s and then exactly one `GenerationEnd`,
  from a service thread (scheduler.py). `finish_reason` is `stop`,
  `length`, `cancelled`, `time` (past its time limit), `error` (llama.cpp
  failed) or `crashed` (the model worker died during it).
- `EngineCrashed` is the one exception a caller of the engine handles: the
  model worker died (or is restarting) while the request needed it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from .tasks import CancelFlag

DEFAULT_TEMPERATURE = 0.8

FinishReason = Literal["stop", "length", "cancelled", "time", "grammar", "error", "crashed"]


class EngineCrashed(Exception):
    """The model worker died (or is restarting) while this request needed it."""


@dataclass
class GenerationJob:
    """One generation: prompt token ids, limits and sampling settings.

    `max_tokens`: output limit in tokens (`None`: the room left in the
    context); `temperature`: 0 is greedy; `grammar`: optional GBNF text;
    `min_output_tokens`: end-of-generation tokens are forbidden until this
    many tokens were produced; `cancel`: set to stop it (also inside a
    decoding step); `time_limit_s`: seconds it may run once it has a slot
    in the worker (`None`: the engine's `generation_time_limit_s`); past
    it, it ends with `finish_reason` `time`; `grammar_budget_s`,
    `token_grammar_budget_s`: seconds of grammar work the generation, and
    one of its tokens, may take (`None`: batching.py's defaults); past
    either, it ends with `finish_reason` `grammar`.
    """

    prompt_tokens: list[int]
    max_tokens: int | None
    temperature: float
    grammar: str | None = None
    min_output_tokens: int = 0
    cancel: CancelFlag = field(default_factory=CancelFlag)
    time_limit_s: float | None = None
    grammar_budget_s: float | None = None
    token_grammar_budget_s: float | None = None


@dataclass
class TextPiece:
    """A piece of generated text (valid UTF-8, possibly several tokens)."""

    text: str


@dataclass
class GenerationEnd:
    """The end of a generation: why it stopped and how many tokens it produced.

    `cached_tokens`: prompt tokens whose KV state was reused from an earlier
    generation instead of being decoded (prompt_cache.py).
    """

    finish_reason: FinishReason
    output_tokens: int
    cached_tokens: int = 0


Update = TextPiece | GenerationEnd
Sink = Callable[[Update], None]
