"""Secrets in connection URLs are refused with fixed messages (napllm.connections)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from napllm.connections import (
    QUERY_MESSAGE,
    USERINFO_MESSAGE,
    Connection,
    ConnectionSpec,
    check_base_url,
    spec_error_text,
)

CANARY = "CANARY-5e1f"


def spec(base_url: Any, kind: str = "openai", **settings: Any) -> dict[str, Any]:
    return {
        "name": "n",
        "kind": kind,
        "model": "m",
        "settings": {"baseUrl": base_url, **settings},
        "credential": None,
    }


@pytest.mark.parametrize(
    ("url", "message"),
    [
        (f"http://user:{CANARY}@127.0.0.1:11434/v1", USERINFO_MESSAGE),
        (f"https://{CANARY}@example.org/v1", USERINFO_MESSAGE),
        (f"http://:{CANARY}@127.0.0.1/v1", USERINFO_MESSAGE),
        (f"http://127.0.0.1/v1?key={CANARY}", QUERY_MESSAGE),
        (f"http://127.0.0.1/v1#{CANARY}", QUERY_MESSAGE),
    ],
)
def test_secrets_in_base_urls_are_refused_without_echo(url: str, message: str) -> None:
    with pytest.raises(ValidationError) as caught:
        ConnectionSpec.model_validate(spec(url))
    text = spec_error_text(caught.value)
    assert text == message
    assert CANARY not in text
    assert "token" in text


@pytest.mark.parametrize("url", ["ftp://127.0.0.1/", "http://", "127.0.0.1:8080", 42, None])
def test_other_bad_base_urls_get_the_fixed_message(url: Any) -> None:
    with pytest.raises(ValidationError) as caught:
        ConnectionSpec.model_validate(spec(url))
    assert spec_error_text(caught.value) == "The base URL must be an http or https URL with a host."


def test_userinfo_in_a_model_url_is_refused() -> None:
    data = spec(None, kind="wasm", url=f"https://u:{CANARY}@example.org/m.gguf")
    del data["settings"]["baseUrl"]
    with pytest.raises(ValidationError) as caught:
        ConnectionSpec.model_validate(data)
    assert spec_error_text(caught.value) == USERINFO_MESSAGE


def test_plain_urls_pass() -> None:
    assert check_base_url("http://127.0.0.1:11434/v1") == "http://127.0.0.1:11434/v1"
    ConnectionSpec.model_validate(spec("https://api.example.org/v1"))


def test_a_stored_connection_with_userinfo_is_not_loaded() -> None:
    stored = {
        "id": "u-1",
        "name": "old",
        "kind": "openai",
        "model": "m",
        "route": "r",
        "settings": {"baseUrl": f"http://u:{CANARY}@127.0.0.1/v1", "userDefined": True},
    }
    with pytest.raises(ValidationError) as caught:
        Connection.model_validate(stored)
    assert spec_error_text(caught.value) == USERINFO_MESSAGE


def test_unrelated_errors_never_repeat_the_input() -> None:
    with pytest.raises(ValidationError) as caught:
        ConnectionSpec.model_validate({**spec("http://127.0.0.1/v1"), "name": CANARY * 100})
    assert CANARY not in spec_error_text(caught.value)
