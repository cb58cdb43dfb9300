"""The wasm and webllm engines' specs (napllm.providers.engine_wasm,
engine_webllm) and the shared failure rule (providers.engine), under CPython.

Covers the TinyChat connection, wllama load parameters and chat bodies, the
WebLLM model rules (availability per device, capabilities per model, the
recommended list), the WebLLM chat body, engine error mapping, and the
chunk shapes each engine streams, through the shared `ChatStreamToLmsp`.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from napllm.connection_records import Capabilities
from napllm.errors import ErrorCode
from napllm.lmsp import LmspRequest
from napllm.providers.chat_stream import ChatStreamToLmsp
from napllm.providers.engine import ENGINE_HINTS, NO_WEBGPU, engine_failure
from napllm.providers.engine_wasm import (
    TINYCHAT_ID,
    TINYCHAT_PATH,
    tinychat_connection,
    wasm_capabilities,
    wasm_chat_body,
    wasm_load_params,
    wllama_threads,
)
from napllm.providers.engine_webllm import (
    WEBLLM_DEFAULT_BUFFER_BYTES,
    GpuReport,
    WebLLMRecord,
    webllm_blocker,
    webllm_capabilities,
    webllm_chat_body,
    webllm_connection,
    webllm_recommended,
    webllm_unavailable_reason,
)

FUNCTION_CALLING = ("Hermes-3-Llama-3.1-8B-q4f32_1-MLC", "Hermes-3-Llama-3.1-8B-q4f16_1-MLC")

#: A slice of WebLLM 0.2.86's prebuiltAppConfig.model_list (the fields used).
RECORDS: list[dict[str, Any]] = [
    {"model_id": "SmolLM2-360M-Instruct-q4f16_1-MLC", "vram_required_MB": 376.06,
     "required_features": ["shader-f16"], "low_resource_required": True},
    {"model_id": "SmolLM2-360M-Instruct-q4f32_1-MLC", "vram_required_MB": 579.61,
     "low_resource_required": True},
    {"model_id": "Qwen2.5-0.5B-Instruct-q4f16_1-MLC", "vram_required_MB": 944.62},
    {"model_id": "Qwen2.5-0.5B-Instruct-q4f32_1-MLC", "vram_required_MB": 1060.2},
    {"model_id": "Llama-3.2-1B-Instruct-q4f32_1-MLC", "vram_required_MB": 1128.82},
    {"model_id": "Llama-3.2-1B-Instruct-q4f16_1-MLC", "vram_required_MB": 879.04},
    {"model_id": "Hermes-3-Llama-3.1-8B-q4f32_1-MLC", "vram_required_MB": 5779.27},
    {"model_id": "Hermes-3-Llama-3.1-8B-q4f16_1-MLC", "vram_required_MB": 4876.13},
    {"model_id": "Phi-3.5-vision-instruct-q4f16_1-MLC", "vram_required_MB": 4521.54,
     "model_type": 2},
    {"model_id": "Phi-3.5-vision-instruct-q4f32_1-MLC", "vram_required_MB": 7050.65,
     "model_type": 2},
    {"model_id": "gemma-2b-it-q4f32_1-MLC", "vram_required_MB": 1750.66,
     "buffer_size_required_bytes": 262144000},
    {"model_id": "snowflake-arctic-embed-s-q0f32-MLC-b4", "vram_required_MB": 238.71,
     "model_type": 1},
]  # fmt: skip

SWIFTSHADER = GpuReport.from_json(
    {
        "adapter": True,
        "features": ["subgroups", "timestamp-query"],
        "maxBufferSize": 1_073_741_824,
        "maxStorageBufferBindingSize": 1_073_741_824,
        "fallback": True,
    }
)
F16_GPU = GpuReport.from_json(
    {
        "adapter": True,
        "features": ["shader-f16"],
        "maxBufferSize": 4_294_967_296,
        "maxStorageBufferBindingSize": 2_147_483_648,
        "deviceMemory": 8,
    }
)


def records() -> list[WebLLMRecord]:
    parsed = [WebLLMRecord.from_json(r) for r in RECORDS]
    return [r for r in parsed if r is not None]


def record(model_id: str) -> WebLLMRecord:
    return next(r for r in records() if r.model_id == model_id)


def request(**fields: Any) -> LmspRequest:
    base: dict[str, Any] = {
        "model": "m",
        "input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]}
        ],
        "stream": True,
    }
    return LmspRequest.model_validate(base | fields)


WEATHER = {
    "type": "function",
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}


# --------------------------------------------------------------------------- TinyChat / wllama


def test_tinychat_connection_is_offline_and_honest() -> None:
    connection = tinychat_connection()
    assert connection.id == TINYCHAT_ID
    assert connection.kind == "wasm"
    assert connection.name == "TinyChat (on this device)"
    assert connection.model == "tinychat-q8_0"
    assert connection.route == "This browser (WebAssembly, llama.cpp) on this device"
    assert connection.settings["url"] == TINYCHAT_PATH and not TINYCHAT_PATH.startswith("/")
    assert connection.available is True and connection.charges is False
    public = connection.public_model("h")
    assert public["json"] is True and public["tools"] is True and public["images"] is False
    assert public["toolChoiceModes"] == ["auto", "none"]


@pytest.mark.parametrize(
    ("isolated", "cores", "threads"),
    [
        (False, 16, 1),
        (False, 1, 1),
        (True, 1, 1),
        (True, 2, 1),
        (True, 4, 2),
        (True, 12, 6),
        (True, 64, 8),
    ],
)
def test_threads_follow_cross_origin_isolation(isolated: bool, cores: int, threads: int) -> None:
    assert wllama_threads(isolated, cores) == threads


def test_load_params_use_the_context_setting_and_no_gpu_layers() -> None:
    params = wasm_load_params(
        {"contextSize": 512}, cross_origin_isolated=False, hardware_concurrency=8
    )
    assert params == {"n_ctx": 512, "n_threads": 1, "n_gpu_layers": 0}
    for bad in (None, 0, 10, True, "512", 10**7):
        assert (
            wasm_load_params(
                {"contextSize": bad}, cross_origin_isolated=True, hardware_concurrency=8
            )["n_ctx"]
            == 4096
        )


def test_wasm_chat_body_is_streamed_greedy_at_zero_temperature() -> None:
    body = wasm_chat_body(request(temperature=0.0))
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["temperature"] == 0.0 and body["top_k"] == 1
    assert body["messages"] == [{"role": "user", "content": "Hi"}]
    warm = wasm_chat_body(request(temperature=0.7))
    assert "top_k" not in warm
    assert "top_k" not in wasm_chat_body(request())


def test_wasm_chat_body_sends_json_schema_and_tools() -> None:
    body = wasm_chat_body(
        request(
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "json_object", "schema": {"type": "object"}},
            },
            tools=[WEATHER],
            tool_choice="auto",
        )
    )
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "json_object", "schema": {"type": "object"}},
    }
    assert body["tools"][0]["function"]["name"] == "get_weather"
    assert body["tool_choice"] == "auto"


def test_wasm_capabilities_need_a_usable_url() -> None:
    caps = wasm_capabilities("m", {"url": "https://example.org/m.gguf"})
    assert caps.json_output and caps.tools and not caps.images
    assert wasm_capabilities("m", {"url": "models/x.gguf"}) == caps
    for bad in ({}, {"url": ""}, {"url": 3}, {"url": "javascript:alert(1)"}, {"url": "ftp://h/x"}):
        with pytest.raises(ValueError):
            wasm_capabilities("m", bad)


# --------------------------------------------------------------------------- WebLLM records


def test_records_parse_defensively() -> None:
    assert WebLLMRecord.from_json(None) is None
    assert WebLLMRecord.from_json({"model_id": ""}) is None
    odd = WebLLMRecord.from_json(
        {
            "model_id": "x",
            "vram_required_MB": True,
            "required_features": ["shader-f16", 3],
            "model_type": "2",
            "buffer_size_required_bytes": 1.5,
        }
    )
    assert odd == WebLLMRecord(model_id="x", required_features=("shader-f16",))


def test_gpu_report_without_adapter_or_malformed_means_no_webgpu() -> None:
    for raw in (None, [], {"adapter": False}, {"adapter": "yes"}):
        report = GpuReport.from_json(raw)
        assert report.adapter is False and report.reason == NO_WEBGPU
    assert SWIFTSHADER.fallback is True and "shader-f16" not in SWIFTSHADER.features
    timeout = GpuReport.from_json({"adapter": False, "reason": "timeout"})
    assert timeout.reason is not None and "did not answer" in timeout.reason
    assert GpuReport.from_json({"adapter": False, "reason": "<b>x</b>"}).reason == NO_WEBGPU
    assert "in this browser" in (GpuReport.from_json({"reason": "no-webgpu"}).reason or "")


def test_availability_without_webgpu_gives_the_reason() -> None:
    reason = webllm_unavailable_reason(record("SmolLM2-360M-Instruct-q4f32_1-MLC"), GpuReport())
    assert reason == NO_WEBGPU


def test_availability_checks_features_buffers_and_memory() -> None:
    f16 = record("SmolLM2-360M-Instruct-q4f16_1-MLC")
    f32 = record("SmolLM2-360M-Instruct-q4f32_1-MLC")
    assert "shader-f16" in (webllm_unavailable_reason(f16, SWIFTSHADER) or "")
    assert webllm_unavailable_reason(f32, SWIFTSHADER) is None
    assert webllm_unavailable_reason(f16, F16_GPU) is None
    small = GpuReport(
        adapter=True, max_buffer_size=128 * 2**20, max_storage_buffer_binding_size=2**30
    )
    assert "buffer limit (128 MB)" in (webllm_unavailable_reason(f32, small) or "")
    at_limit = GpuReport(
        adapter=True,
        max_buffer_size=WEBLLM_DEFAULT_BUFFER_BYTES,
        max_storage_buffer_binding_size=WEBLLM_DEFAULT_BUFFER_BYTES,
    )
    assert webllm_unavailable_reason(f32, at_limit) is None
    hermes = record("Hermes-3-Llama-3.1-8B-q4f16_1-MLC")
    low_memory = GpuReport(**{**F16_GPU.__dict__, "device_memory_gb": 2.0})
    assert "4876 MB" in (webllm_unavailable_reason(hermes, low_memory) or "")
    embed = record("snowflake-arctic-embed-s-q0f32-MLC-b4")
    assert "embedding" in (webllm_unavailable_reason(embed, F16_GPU) or "")


def test_blocker_kinds_stop_a_model_before_any_download() -> None:
    f16 = record("SmolLM2-360M-Instruct-q4f16_1-MLC")
    f32 = record("SmolLM2-360M-Instruct-q4f32_1-MLC")
    assert webllm_blocker(f32, GpuReport()) == "webgpu"
    assert webllm_blocker(None, GpuReport()) == "webgpu"
    assert webllm_blocker(f16, SWIFTSHADER) == "feature"
    assert webllm_blocker(f32, SWIFTSHADER) is None
    assert webllm_blocker(None, SWIFTSHADER) is None  # not in the catalogue: WebLLM decides
    tiny = GpuReport(adapter=True, max_buffer_size=2**20, max_storage_buffer_binding_size=2**20)
    assert webllm_blocker(f32, tiny) == "device"
    for kind in ("webgpu", "feature", "device"):
        assert kind in ENGINE_HINTS


def test_capabilities_per_model() -> None:
    llm = webllm_capabilities(record("Llama-3.2-1B-Instruct-q4f32_1-MLC"), FUNCTION_CALLING)
    assert llm == Capabilities(json_output=True)
    tools = webllm_capabilities(record("Hermes-3-Llama-3.1-8B-q4f32_1-MLC"), FUNCTION_CALLING)
    assert tools.tools and tools.tool_choice_modes == ("auto", "none") and tools.json_output
    vlm = webllm_capabilities(record("Phi-3.5-vision-instruct-q4f32_1-MLC"), FUNCTION_CALLING)
    assert vlm.images and not vlm.tools and not vlm.images_in_tool_results
    embed = webllm_capabilities(record("snowflake-arctic-embed-s-q0f32-MLC-b4"), ())
    assert not embed.json_output


def test_recommended_picks_one_variant_per_device() -> None:
    f32 = [r.model_id for r in webllm_recommended(records(), SWIFTSHADER)]
    assert f32 == [
        "SmolLM2-360M-Instruct-q4f32_1-MLC",
        "Qwen2.5-0.5B-Instruct-q4f32_1-MLC",
        "Llama-3.2-1B-Instruct-q4f32_1-MLC",
        "Hermes-3-Llama-3.1-8B-q4f32_1-MLC",
        "Phi-3.5-vision-instruct-q4f32_1-MLC",
    ]
    f16 = [r.model_id for r in webllm_recommended(records(), F16_GPU)]
    assert all("q4f16_1" in m for m in f16) and len(f16) == 5
    missing = [r for r in records() if not r.model_id.startswith("Qwen")]
    assert len(webllm_recommended(missing, F16_GPU)) == 4
    assert webllm_recommended([], F16_GPU) == []


def test_webllm_connections_show_availability_and_rank() -> None:
    none = webllm_connection(record("SmolLM2-360M-Instruct-q4f32_1-MLC"), GpuReport(), ())
    assert none.available is False and none.unavailable_reason == NO_WEBGPU
    assert none.settings["rank"] == 50
    assert none.route == "This browser (WebGPU, WebLLM) on this device"
    assert none.public_summary()["unavailableReason"] == NO_WEBGPU
    ready = webllm_connection(
        record("Hermes-3-Llama-3.1-8B-q4f16_1-MLC"), F16_GPU, FUNCTION_CALLING, cached=True
    )
    assert ready.available and ready.settings["rank"] == 0
    assert ready.settings["rank"] < tinychat_connection().settings["rank"]
    assert ready.capabilities.tools
    assert ready.id == "webllm-Hermes-3-Llama-3.1-8B-q4f16_1-MLC"
    # Cached but unusable on this device does not rank first.
    stuck = webllm_connection(
        record("SmolLM2-360M-Instruct-q4f16_1-MLC"), SWIFTSHADER, (), cached=True
    )
    assert stuck.available is False and stuck.settings["rank"] == 50


# --------------------------------------------------------------------------- WebLLM body


def test_webllm_body_sends_schema_as_text_and_usage() -> None:
    body = webllm_chat_body(
        request(
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "json_object", "schema": {"type": "object"}},
            }
        )
    )
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["response_format"] == {"type": "json_object", "schema": '{"type": "object"}'}


def test_webllm_body_drops_tools_for_choice_none() -> None:
    with_tools = webllm_chat_body(request(tools=[WEATHER], tool_choice="auto"))
    assert with_tools["tools"][0]["function"]["name"] == "get_weather"
    assert with_tools["tool_choice"] == "auto"
    without = webllm_chat_body(request(tools=[WEATHER], tool_choice="none"))
    assert "tools" not in without and "tool_choice" not in without


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize("kind", sorted(ENGINE_HINTS))
def test_engine_failures_are_fixed_texts(kind: str) -> None:
    failure = engine_failure(kind, "wasm")
    assert failure.user_hint == ENGINE_HINTS[kind]
    expected = ErrorCode.QUOTA_EXCEEDED if kind == "context" else ErrorCode.PROVIDER_ERROR
    assert failure.code == expected
    nap = failure.to_nap_error()
    assert nap.code == expected and "wasm" not in nap.message


def test_unknown_engine_error_kinds_are_generic() -> None:
    for kind in (None, 3, "no such kind", "<script>"):
        failure = engine_failure(kind, "webllm")
        assert failure.user_hint == ENGINE_HINTS["unknown"]
        assert failure.detail == "webllm: unknown"


# --------------------------------------------------------------------------- chunk shapes


def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}


def run(chunks: list[dict[str, Any]], **options: Any) -> list[Any]:
    state = ChatStreamToLmsp(**options)
    events = [e for c in chunks for e in state.feed(c)]
    return events + state.finish()


def test_wllama_tool_call_chunks_become_one_function_call() -> None:
    # wllama (llama.cpp's server) streams the parsed call by index with an id.
    events = run(
        [
            chunk({"role": "assistant", "content": None}),
            chunk(
                {
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": "abc",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": ""},
                        }
                    ]
                }
            ),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]}),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"Berlin"}'}}]}),
            chunk({}, "tool_calls"),
            {"choices": [], "usage": {"prompt_tokens": 40, "completion_tokens": 19}},
        ],
        parse_tool_call_blocks=True,
    )
    done = [e.data["item"] for e in events if e.event == "response.output_item.done"]
    assert done == [
        {
            "id": done[0]["id"],
            "type": "function_call",
            "call_id": "abc",
            "name": "get_weather",
            "arguments": '{"city": "Berlin"}',
        }
    ]
    assert events[-1].event == "response.completed"
    assert events[-1].data["usage"]["output_tokens"] == 19


def test_webllm_tool_stream_drops_raw_call_text() -> None:
    raw = '{"name": "get_weather", "arguments": {"city": "Berlin"}}'
    events = run(
        [
            chunk({"content": raw[:20]}),
            chunk({"content": raw[20:]}),
            chunk(
                {
                    "tool_calls": [
                        {
                            "index": 0,
                            "function": {
                                "name": "get_weather",
                                "arguments": json.dumps({"city": "Berlin"}),
                            },
                        }
                    ]
                },
                "tool_calls",
            ),
        ],
        tool_text_in_content=True,
    )
    assert not [e for e in events if e.event == "response.output_text.delta"]
    calls = [e.data["item"] for e in events if e.event == "response.output_item.done"]
    assert [c["name"] for c in calls] == ["get_weather"]
    assert calls[0]["call_id"]  # synthesised: WebLLM gives none


def test_webllm_tool_finish_without_a_call_keeps_the_text() -> None:
    # WebLLM labels a plain answer `tool_calls` whenever tools were offered
    # (docs/design.md, "Known behaviours"): the withheld text is the answer, and
    # the response completes.
    events = run(
        [chunk({"content": "It is "}), chunk({"content": "sunny."}, "tool_calls")],
        tool_text_in_content=True,
    )
    text = "".join(e.data["delta"] for e in events if e.event == "response.output_text.delta")
    assert text == "It is sunny."
    assert not [e for e in events if e.event == "response.function_call_arguments.delta"]
    assert events[-1].event == "response.completed"
