"""WebGPU detection shared by the GPU engines (web/engines/gpu.js), run in node.

Every way an adapter request can go (no WebGPU, no adapter, a rejected
request, a driver that never answers, a software adapter) gives the reason
code the Python side reads (`providers.engine.NO_ADAPTER_REASONS`).
"""

# ruff: noqa: E501  (the JavaScript embedded below keeps its natural line length)

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from nodejs import needs_node, run_module

from napllm.providers.engine import NO_ADAPTER_REASONS

ROOT = Path(__file__).resolve().parents[2]
GPU = ROOT / "web" / "engines" / "gpu.js"

pytestmark = needs_node


def detect(navigator_gpu: str) -> Any:
    """`requestAdapter` with `navigator.gpu` set to the JS expression given."""
    script = f"""
Object.defineProperty(globalThis, "navigator", {{ value: {{ gpu: {navigator_gpu} }}, configurable: true }});
const gpu = await import({json.dumps(GPU.as_uri())});
const {{ adapter, reason }} = await gpu.requestAdapter({{ powerPreference: "high-performance" }});
console.log(JSON.stringify({{
  adapter: adapter === null ? null : {{ fallback: gpu.isFallback(adapter), vendor: gpu.vendorOf(adapter) }},
  reason,
}}));
process.exit(0);
"""
    return run_module(script)


def test_without_webgpu() -> None:
    assert detect("undefined") == {"adapter": None, "reason": "no-webgpu"}


def test_without_an_adapter_or_with_a_failing_request() -> None:
    assert detect("{ requestAdapter: async () => null }")["reason"] == "no-adapter"
    assert (
        detect("{ requestAdapter: async () => { throw new Error('x'); } }")["reason"]
        == "no-adapter"
    )


def test_a_driver_that_never_answers_times_out() -> None:
    assert detect("{ requestAdapter: () => new Promise(() => {}) }")["reason"] == "timeout"


def test_an_adapter_is_reported_with_its_kind() -> None:
    software = (
        "{ requestAdapter: async () => ({ info: { isFallbackAdapter: true, vendor: 'google' } }) }"
    )
    assert detect(software) == {"adapter": {"fallback": True, "vendor": "google"}, "reason": None}
    bare = "{ requestAdapter: async () => ({}) }"
    assert detect(bare) == {"adapter": {"fallback": False, "vendor": ""}, "reason": None}


def test_every_reason_code_has_a_sentence_on_the_python_side() -> None:
    text = GPU.read_text(encoding="utf-8")
    for code in ("no-webgpu", "no-adapter", "timeout"):
        assert f'"{code}"' in text
        assert code in NO_ADAPTER_REASONS
