"""Every JSON text the LMSP service reads goes through the strict reader (napllm.jsontext)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import httpx
import pytest

if TYPE_CHECKING:
    from tests.service.conftest import LmspServiceHandle


def _body(model: str, extra: str) -> bytes:
    message = '{"type":"message","role":"user","content":[{"type":"input_text","text":"hi"}]}'
    return f'{{"model":"{model}","input":[{message}]{extra}}}'.encode()


@pytest.fixture
def client(lmsp_service: LmspServiceHandle) -> Iterator[httpx.Client]:
    with lmsp_service.client() as http:
        yield http


@pytest.mark.service
@pytest.mark.parametrize(
    ("extra", "detail"),
    [
        (',"temperature":NaN', "The body contains a number JSON cannot represent."),
        (',"temperature":-Infinity', "The body contains a number JSON cannot represent."),
        (',"temperature":1e400', "The body contains a number too large for a double."),
        (
            ',"max_output_tokens":9007199254740993',
            "The body contains an integer too large to represent exactly.",
        ),
        (',"temperature":0,"temperature":1', "The body contains a duplicate object key."),
        (',"temperature":0}}', "The body is not valid JSON."),
        (',"metadata":' + "[" * 100 + "]" * 100, "The body is nested too deeply."),
        (',"x":"\\ud83d"', "The body contains a lone UTF-16 surrogate."),
    ],
)
def test_malformed_bodies_are_invalid_requests(
    lmsp_service: LmspServiceHandle, client: httpx.Client, extra: str, detail: str
) -> None:
    answer = client.post(
        "/responses",
        content=_body(lmsp_service.model_id, extra),
        headers={"Content-Type": "application/json"},
    )
    assert answer.status_code == 400
    assert answer.headers["content-type"] == "application/problem+json"
    assert answer.json()["code"] == "invalid_request"
    assert answer.json()["detail"] == detail


@pytest.mark.service
def test_a_body_that_is_not_utf8_is_an_invalid_request(
    lmsp_service: LmspServiceHandle, client: httpx.Client
) -> None:
    answer = client.post(
        "/responses",
        content=_body(lmsp_service.model_id, ',"x":"\xff"').replace(b"\xc3\xbf", b"\xff"),
        headers={"Content-Type": "application/json"},
    )
    assert answer.status_code == 400
    assert answer.json()["detail"] == "The body is not valid UTF-8."
