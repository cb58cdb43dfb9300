"""A grammar that is cheap to build but costly to follow must not freeze the service.

The schema below passes every bound of `grammar.py` (repetition 500, a
small grammar, shallow nesting), yet llama.cpp's grammar sampler keeps one
parse stack per way the text so far can be matched, and `(a?){500}` gives
hundreds of them for every candidate token (sampled, not greedy: every
candidate is checked). The generation loop is shared
by every running generation, so one such request stalls everyone's.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import pytest
from tests.service.conftest import LmspServiceHandle

pytestmark = pytest.mark.service

AMBIGUOUS = {"type": "string", "pattern": "^(a?){500}$"}


def body(service: LmspServiceHandle, text: str, **fields: Any) -> dict[str, Any]:
    message = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    return {"model": service.model_id, "input": [message], "temperature": 0, **fields}


def test_an_ambiguous_grammar_does_not_stall_other_generations(
    lmsp_service: LmspServiceHandle,
) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "a", "schema": AMBIGUOUS}}
    hostile_done = threading.Event()

    def hostile() -> None:
        try:
            with lmsp_service.client(timeout_s=40) as http:
                http.post(
                    "/responses",
                    json=body(
                        lmsp_service,
                        "Write a's",
                        max_output_tokens=100,
                        temperature=1.0,
                        response_format=fmt,
                    ),
                )
        except httpx.HTTPError:
            pass
        finally:
            hostile_done.set()

    benign = body(lmsp_service, "Say hi", max_output_tokens=16)
    with lmsp_service.client(timeout_s=30) as http:  # warm: the worker has served one
        assert http.post("/responses", json=benign).status_code == 200
    thread = threading.Thread(target=hostile, daemon=True)
    thread.start()
    time.sleep(1.0)
    try:
        with lmsp_service.client(timeout_s=15) as http:
            started = time.monotonic()
            try:
                answer = http.post("/responses", json=benign)
            except httpx.ReadTimeout:
                pytest.fail("a benign generation got no answer within 15 s")
            elapsed = time.monotonic() - started
        assert answer.status_code == 200, answer.text
        assert elapsed < 10, elapsed
    finally:
        hostile_done.wait(60)
