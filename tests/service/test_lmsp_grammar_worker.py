"""Grammars in the model worker: no request option ends it, and grammar work is bounded.

The engine is driven directly with TinyChat (batching.py). Two faults:
- a complete grammar (`{"type": "boolean"}` once `true` is written) with
  the minimum-output rule masking the end of generation left llama.cpp no
  candidate: it threw inside the sampler and the worker aborted, failing
  every generation beside it;
- a grammar whose stacks multiply (`a?` written out 300 times, built here
  without the service's refusal) made each of its tokens cost seconds,
  and every other generation of the batch waited for it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")

from llama_cpp.llama_grammar import json_schema_to_gbnf
from tests.service.test_lmsp_batching import Run, job, make_engine

from napllm.lmsp_service.engine import Engine
from napllm.lmsp_service.grammar import json_grammar

pytestmark = pytest.mark.service

BOOLEAN = json_grammar({"type": "boolean"})
#: The issue's hostile pattern, built without the service's checks.
HOSTILE = str(
    json_schema_to_gbnf(json.dumps({"type": "string", "pattern": "^" + "a?" * 300 + "$"}))
)


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    engine = make_engine(slots=4)
    yield engine
    engine.close()


@pytest.mark.parametrize("temperature", [0.0, 1.0, 2.0])
@pytest.mark.parametrize(
    "options",
    [
        {"min_output_tokens": 40},
        {"min_output_tokens": 40, "max_tokens": 41},
        {"min_output_tokens": 1000, "max_tokens": None},
        {"min_output_tokens": 3, "max_tokens": 3},
        {"min_output_tokens": 0, "max_tokens": 1},
    ],
    ids=["min40", "min40-max41", "min1000", "min3-max3", "max1"],
)
def test_a_completed_grammar_ends_its_generation_under_every_option(
    engine: Engine, temperature: float, options: dict[str, object]
) -> None:
    settings = {"max_tokens": 64, **options}
    benign = [Run() for _ in range(3)]
    for run in benign:
        engine.submit(job(engine, "Hello!", 30), run)
    hostile = Run()
    engine.submit(
        job(engine, "Yes or no?", grammar=BOOLEAN, temperature=temperature, **settings), hostile
    )
    end = hostile.wait()
    assert end.finish_reason in {"stop", "length"}
    if end.finish_reason == "stop":
        assert hostile.text.strip() in {"true", "false"}
    else:
        assert end.output_tokens == settings["max_tokens"]
    for run in benign:
        assert run.wait().finish_reason == "length"  # the worker lived through it
    assert engine.restarts == 0


def test_a_costly_grammar_is_ended_and_does_not_hold_the_others(engine: Engine) -> None:
    hostile = Run()
    engine.submit(
        job(
            engine,
            "Write a's",
            max_tokens=100,
            temperature=1.0,
            grammar=HOSTILE,
            token_grammar_budget_s=2.5,
            grammar_budget_s=5.0,
        ),
        hostile,
    )
    benign = Run()
    engine.submit(job(engine, "Hello!", 40), benign)
    assert benign.wait().finish_reason == "length"
    end = hostile.wait()
    assert end.finish_reason == "grammar"
    # The other generation was not made to wait for the costly sampling.
    assert benign.end_time < hostile.end_time
    assert engine.restarts == 0


def test_sampling_left_running_by_ended_generations_does_not_end_the_next_ones(
    engine: Engine,
) -> None:
    # Four costly generations end on their token budget while their pool
    # threads still sample; a benign structured output that comes next
    # waited behind them and its wait was counted as its own grammar work:
    # it ended with `grammar` and no answer.
    hostile = [Run() for _ in range(4)]
    for run in hostile:
        engine.submit(
            job(engine, "Write a's", max_tokens=100, temperature=1.0, grammar=HOSTILE), run
        )
    for run in hostile:
        assert run.wait().finish_reason == "grammar"
    for _ in range(2):
        benign = Run()
        engine.submit(job(engine, "Yes or no?", max_tokens=8, grammar=BOOLEAN), benign)
        assert benign.wait().finish_reason == "stop"
        assert benign.text.strip() in {"true", "false"}
    assert engine.restarts == 0
