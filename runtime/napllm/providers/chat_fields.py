"""The fields of an OpenAI chat completion, read the same way streamed or whole.

`ChatStreamToLmsp` and `chat_response_to_lmsp` (chat_stream.py) read a
completion's `usage` and its tool calls' `arguments` through these
functions, so a count or an argument value means the same on both paths.

Rules
- Token counts are non-negative integers (booleans are not counts); a
  `usage` object without both main counts is no usage at all (LMSP 6.2
  makes `usage` optional, not partial).
- Tool-call `arguments` are kept as the server sent them when text, and
  serialised when a server sent an object; judging them is the
  translation's job (NAP-LLM, Generation).
- A malformed completion is a `ProviderFailure` (`provider-error`) whose
  detail names what was wrong, never the body.
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import ErrorCode, ProviderFailure
from ..jsontext import JsonTextError, read_json


def malformed(what: str) -> ProviderFailure:
    """`provider-error` for a completion of the wrong shape; `what` says which part."""
    return ProviderFailure(ErrorCode.PROVIDER_ERROR, detail=f"malformed chat completion: {what}")


def _count(value: object) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def usage_to_lmsp(raw: object) -> dict[str, Any] | None:
    """LMSP `usage` (6.2) from an OpenAI `usage` object, or `None` if unusable.

    `prompt_tokens` -> `input_tokens`, `completion_tokens` -> `output_tokens`,
    `total_tokens` (or their sum), `prompt_tokens_details.cached_tokens` ->
    `input_tokens_details.cached_tokens`,
    `completion_tokens_details.reasoning_tokens` ->
    `output_tokens_details.reasoning_tokens`. Counts must be non-negative
    integers; a usage object without both main counts is ignored.
    """
    if not isinstance(raw, dict):
        return None
    prompt = _count(raw.get("prompt_tokens"))
    completion = _count(raw.get("completion_tokens"))
    if prompt is None or completion is None:
        return None
    total = _count(raw.get("total_tokens"))
    usage: dict[str, Any] = {
        "input_tokens": prompt,
        "output_tokens": completion,
        "total_tokens": total if total is not None else prompt + completion,
    }
    prompt_details = raw.get("prompt_tokens_details")
    if isinstance(prompt_details, dict):
        cached = _count(prompt_details.get("cached_tokens"))
        if cached is not None:
            usage["input_tokens_details"] = {"cached_tokens": cached}
    completion_details = raw.get("completion_tokens_details")
    if isinstance(completion_details, dict):
        reasoning = _count(completion_details.get("reasoning_tokens"))
        if reasoning is not None:
            usage["output_tokens_details"] = {"reasoning_tokens": reasoning}
    return usage


def arguments_text(value: object) -> str:
    """A tool call's `arguments` as text: strings as received, objects serialised."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


def is_complete_json(text: str) -> bool:
    """Whether `text` is one whole JSON value (lone surrogates allowed, as in arguments)."""
    try:
        read_json(text, allow_lone_surrogates=True)
    except JsonTextError:
        return False
    return True
