"""The onnx engine's spec (napllm.providers.engine_onnx), under CPython.

Covers the built-in TinyChat (WebGPU) connection, where a user-added model is
read from (folder URL or hub id, everything else refused), the WebGPU probe,
the chat body, error kinds, and the worker's chunk shapes through the shared
`ChatStreamToLmsp` (text, `<tool_call>` blocks split across chunks, usage).
"""

from __future__ import annotations

from typing import Any

import pytest

from napllm.connections import ConnectionSpec
from napllm.errors import ErrorCode
from napllm.lmsp import LmspRequest
from napllm.providers.chat_stream import ChatStreamToLmsp
from napllm.providers.connection_kinds import route_for
from napllm.providers.engine import NO_ADAPTER_REASONS, NO_WEBGPU, engine_failure
from napllm.providers.engine_onnx import (
    ONNX_HINTS,
    ONNX_TINYCHAT_ID,
    onnx_capabilities,
    onnx_chat_body,
    onnx_dtype,
    onnx_settings,
    onnx_source,
    onnx_tinychat_connection,
    webgpu_unavailable_reason,
)


def request(**fields: Any) -> LmspRequest:
    base: dict[str, Any] = {
        "model": "m",
        "input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]}
        ],
        "stream": True,
    }
    return LmspRequest.model_validate(base | fields)


def test_builtin_connection_reads_the_shipped_model_and_ranks_after_tinychat() -> None:
    connection = onnx_tinychat_connection()
    assert connection.id == ONNX_TINYCHAT_ID
    assert connection.kind == "onnx"
    assert connection.name == "TinyChat (WebGPU, transformers.js)"
    assert connection.route == route_for("onnx", {})
    assert "WebGPU" in connection.route and "this device" in connection.route
    assert connection.available is True and connection.charges is False
    assert connection.settings["rank"] > 10  # after the llama.cpp TinyChat
    assert onnx_source(connection.model, connection.settings) == {
        "kind": "path",
        "base": "models/",
        "model": "tinychat-onnx",
    }
    assert onnx_dtype(connection.settings) == "fp32"
    public = connection.public_model("h")
    assert public["json"] is True and public["tools"] is True and public["images"] is False
    assert public["toolChoiceModes"] == ["auto", "none"]


def test_without_webgpu_the_builtin_connection_says_why() -> None:
    reason = webgpu_unavailable_reason({"webgpu": False, "reason": "no-adapter"})
    connection = onnx_tinychat_connection(reason)
    assert connection.available is False
    assert connection.unavailable_reason == NO_ADAPTER_REASONS["no-adapter"]


@pytest.mark.parametrize(
    ("probe", "reason"),
    [
        ({"webgpu": True, "fallback": True}, None),
        ({"webgpu": False, "reason": "no-webgpu"}, NO_ADAPTER_REASONS["no-webgpu"]),
        ({"webgpu": False, "reason": "timeout"}, NO_ADAPTER_REASONS["timeout"]),
        ({"webgpu": False, "reason": "<b>hostile</b>"}, NO_WEBGPU),
        ({"webgpu": "yes"}, NO_WEBGPU),
        (None, NO_WEBGPU),
        ([1, 2], NO_WEBGPU),
    ],
)
def test_probe_is_read_defensively(probe: object, reason: str | None) -> None:
    assert webgpu_unavailable_reason(probe) == reason


@pytest.mark.parametrize(
    ("model", "source"),
    [
        (
            "onnx-community/Qwen2.5-0.5B-Instruct",
            {"kind": "hub", "model": "onnx-community/Qwen2.5-0.5B-Instruct"},
        ),
        ("gpt2", {"kind": "hub", "model": "gpt2"}),
        (
            "https://models.example/chat/tiny/",
            {"kind": "path", "base": "https://models.example/chat/", "model": "tiny"},
        ),
        (
            "http://127.0.0.1:8000/models/tinychat-onnx",
            {"kind": "path", "base": "http://127.0.0.1:8000/models/", "model": "tinychat-onnx"},
        ),
    ],
)
def test_user_models_come_from_a_folder_url_or_a_hub_id(model: str, source: dict[str, str]) -> None:
    assert onnx_source(model, {}) == source
    assert onnx_capabilities(model, {}).json_output is True


@pytest.mark.parametrize(
    "model",
    [
        "javascript:alert(1)",
        "data:text/plain,x",
        "file:///etc/passwd",
        "ftp://host/model",
        "a/b/c",
        "../secrets",
        "owner/..",
        "https://host/",
        "https://host/model?x=1",
        "has space/name",
        "",
    ],
)
def test_other_model_sources_are_refused(model: str) -> None:
    with pytest.raises(ValueError):
        onnx_source(model, {})


def test_malformed_source_setting_is_refused() -> None:
    with pytest.raises(ValueError):
        onnx_source("x", {"source": {"kind": "hub", "model": 1}})


def test_a_user_connection_stores_its_source_resolved_once_from_its_model() -> None:
    """The page reads `settings.source` (offline download, storage panel): the
    rule lives only in `onnx_source`, and a form's own `source` never wins."""
    planted = {"kind": "path", "base": "https://elsewhere.example/", "model": "x"}
    stored = onnx_settings("owner/name", {"dtype": "q4", "source": planted})
    assert stored == {"dtype": "q4", "source": {"kind": "hub", "model": "owner/name"}}
    assert onnx_source("anything", stored) == onnx_source("owner/name", {})
    folder = onnx_settings("https://h.example/m/tiny/", {})["source"]
    assert folder == {"kind": "path", "base": "https://h.example/m/", "model": "tiny"}
    with pytest.raises(ValueError):
        onnx_settings("../../etc", {})
    # A stored hub source is checked like a typed hub id.
    with pytest.raises(ValueError):
        onnx_source("m", {"source": {"kind": "hub", "model": "../../etc"}})


def test_dtype_setting_is_a_known_name_or_the_default() -> None:
    assert onnx_dtype({"dtype": "q4"}) == "q4"
    assert onnx_dtype({"dtype": "q4; drop"}) == ""
    assert onnx_dtype({}) == ""


def test_user_connection_spec_accepts_the_onnx_kind() -> None:
    spec = ConnectionSpec.model_validate(
        {"name": "Qwen", "kind": "onnx", "model": "onnx-community/Qwen2.5-0.5B-Instruct"}
    )
    assert spec.kind == "onnx"


def test_chat_body_is_streamed_with_tools_and_usage() -> None:
    body = onnx_chat_body(
        request(
            temperature=0,
            max_output_tokens=32,
            tools=[
                {
                    "type": "function",
                    "name": "get_weather",
                    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
                }
            ],
        )
    )
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["temperature"] == 0 and body["max_tokens"] == 32
    assert body["tools"][0]["function"]["name"] == "get_weather"
    assert body["messages"] == [{"role": "user", "content": "Hi"}]


@pytest.mark.parametrize("kind", sorted(ONNX_HINTS))
def test_failures_are_fixed_texts(kind: str) -> None:
    failure = engine_failure(kind, "onnx", ONNX_HINTS)
    assert failure.user_hint == ONNX_HINTS[kind]
    expected = ErrorCode.QUOTA_EXCEEDED if kind == "context" else ErrorCode.PROVIDER_ERROR
    assert failure.code == expected


@pytest.mark.parametrize("kind", ["<script>", None, 3, "__proto__"])
def test_unknown_failure_kinds_are_generic(kind: object) -> None:
    failure = engine_failure(kind, "onnx", ONNX_HINTS)
    assert failure.user_hint == ONNX_HINTS["unknown"]
    assert failure.code == ErrorCode.PROVIDER_ERROR
    assert "script" not in (failure.detail or "")


def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def test_worker_tool_call_text_becomes_one_function_call() -> None:
    # The worker streams TinyChat's text word by word; the block is split.
    state = ChatStreamToLmsp(parse_tool_call_blocks=True)
    pieces = [
        "<tool_call>\n",
        '{"name": "get_weather", ',
        '"arguments": {"city": ',
        '"Berlin"}}\n',
        "</tool_call>",
    ]
    events = [
        e
        for i, p in enumerate(pieces)
        for e in state.feed(chunk({"content": p} if i else {"role": "assistant", "content": p}))
    ]
    events += state.feed(chunk({}, "stop"))
    events += state.feed({"choices": [], "usage": {"prompt_tokens": 15, "completion_tokens": 29}})
    events += state.finish()
    done = [e.data["item"] for e in events if e.event == "response.output_item.done"]
    assert [(d["type"], d.get("name"), d.get("arguments")) for d in done] == [
        ("function_call", "get_weather", '{"city":"Berlin"}')
    ]
    assert not [e for e in events if e.event == "response.output_text.delta"]
    assert events[-1].event == "response.completed"
    assert events[-1].data["usage"]["output_tokens"] == 29
