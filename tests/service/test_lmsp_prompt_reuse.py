"""Prompt reuse across requests in the LMSP service (prompt_cache.py, batching.py).

Two engines on TinyChat, one reusing kept KV sequences and one not
(`prompt_reuse=False`, the `--no-prompt-reuse` switch): a second turn
decodes only what its history does not share with the first turn, a
conversation never reads another's tokens (the answers with reuse equal
the answers without), and concurrent identical prompts stay identical.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")

from tests.fixtures import lmsp_user
from tests.service.conftest import MODEL, LmspServiceHandle
from tests.service.test_lmsp_batching import Run, make_engine

from napllm.lmsp_service.engine import Engine, GenerationEnd, GenerationJob
from napllm.lmsp_service.prompt_cache import MIN_REUSE_TOKENS, common_prefix

pytestmark = pytest.mark.service

SYSTEM = {
    "role": "system",
    "content": "You are a helpful assistant who answers briefly and kindly.",
}


@pytest.fixture(scope="module")
def engines() -> Iterator[tuple[Engine, Engine]]:
    reusing = make_engine(slots=2)
    plain = Engine(MODEL, "tinychat", n_ctx=2048, n_threads=1, slots=2, prompt_reuse=False)
    yield reusing, plain
    reusing.close()
    plain.close()


def tokens(engine: Engine, messages: list[dict[str, Any]]) -> list[int]:
    return engine.tokenize(engine.render(messages, None))


def generate(engine: Engine, messages: list[dict[str, Any]]) -> tuple[str, GenerationEnd]:
    run = Run()
    job = GenerationJob(prompt_tokens=tokens(engine, messages), max_tokens=None, temperature=0.0)
    engine.submit(job, run)
    end = run.wait()
    assert end.finish_reason == "stop"
    return run.text, end


def test_a_second_turn_decodes_only_what_the_first_did_not_hold(
    engines: tuple[Engine, Engine],
) -> None:
    reusing, plain = engines
    first = [SYSTEM, {"role": "user", "content": "Hello!"}]
    answer, end = generate(reusing, first)
    second = [*first, {"role": "assistant", "content": answer},
              {"role": "user", "content": "Tell me a joke."}]  # fmt: skip
    text, end = generate(reusing, second)
    # At least the whole first prompt came from the kept sequence ...
    assert end.cached_tokens >= len(tokens(reusing, first))
    # ... never the last prompt token, whose logits give the first output token.
    assert end.cached_tokens < len(tokens(reusing, second))
    plain_text, plain_end = generate(plain, second)
    assert (text, end.output_tokens) == (plain_text, plain_end.output_tokens)
    assert plain_end.cached_tokens == 0


def test_conversations_sharing_a_system_prompt_never_read_each_others_history(
    engines: tuple[Engine, Engine],
) -> None:
    reusing, plain = engines
    one = [SYSTEM, {"role": "user", "content": "What is your name?"}]
    two = [SYSTEM, {"role": "user", "content": "Thanks!"}]
    generate(reusing, one)
    text, end = generate(reusing, two)
    shared = common_prefix(tokens(reusing, one), tokens(reusing, two), 10**6)
    assert shared >= MIN_REUSE_TOKENS  # the system prompt is worth reusing
    assert end.cached_tokens <= shared  # but nothing of the other conversation's question
    assert text == generate(plain, two)[0]


def test_the_same_prompt_again_decodes_its_last_token_and_answers_the_same(
    engines: tuple[Engine, Engine],
) -> None:
    reusing, plain = engines
    messages = [SYSTEM, {"role": "user", "content": "Hello!"}]
    first, _ = generate(reusing, messages)
    again, end = generate(reusing, messages)
    assert end.cached_tokens == len(tokens(reusing, messages)) - 1
    assert again == first == generate(plain, messages)[0]


def test_concurrent_identical_prompts_stay_identical(engines: tuple[Engine, Engine]) -> None:
    reusing, _ = engines
    messages = [SYSTEM, {"role": "user", "content": "Tell me a joke."}]
    alone, _ = generate(reusing, messages)  # leaves a kept sequence for one of them
    runs = [Run() for _ in range(4)]  # 4 on 2 slots: two wait and take freed sequences
    for run in runs:
        job = GenerationJob(tokens(reusing, messages), max_tokens=None, temperature=0.0)
        reusing.submit(job, run)
    ends = [run.wait() for run in runs]
    assert [run.text for run in runs] == [alone] * 4
    assert all(end.finish_reason == "stop" for end in ends)


def test_usage_reports_the_cached_prompt_tokens(lmsp_service: LmspServiceHandle) -> None:
    body = {
        "model": lmsp_service.model_id,
        "input": [{**lmsp_user(SYSTEM["content"]), "role": "system"}, lmsp_user("Hello!")],
        "temperature": 0,
    }
    with lmsp_service.client() as client:
        answers = []
        for _ in range(2):
            answer = client.post("/responses", json=body)
            assert answer.status_code == 200, answer.text
            answers.append(answer.json())
    first, second = (a["usage"] for a in answers)
    assert first["input_tokens"] == second["input_tokens"]
    assert second["input_tokens_details"]["cached_tokens"] == second["input_tokens"] - 1
    assert _texts(answers[0]) == _texts(answers[1])


def _texts(response: dict[str, Any]) -> list[str]:
    return [
        part.get("text", "")
        for item in response["output"]
        for part in item.get("content", []) or []
    ]
