"""The catalogue fitted to a device (web/catalogue/fit.js), run in node.

The real catalogue (web/catalogue/models.json) read by `readCatalogue`:
every entry is kept; an entry with a URL on another host, a plain `http:`
URL, a bad hash or size is dropped. The verdicts for a small device (1 GB,
no WebGPU) and a large one (8 GB, a WebGPU adapter with shader-f16), the
reasons given, the first-run suggestion for each, and the filter.
"""

# ruff: noqa: E501  (the JavaScript embedded below keeps its natural line length)

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from nodejs import needs_node, run_module

ROOT = Path(__file__).resolve().parents[2]
FIT = ROOT / "web" / "catalogue" / "fit.js"
CATALOGUE = ROOT / "web" / "catalogue" / "models.json"

pytestmark = needs_node

GiB = 1024**3
SMALL = {"gpu": None, "memoryGB": 1, "cores": 2, "storageFreeBytes": 50 * GiB}
LARGE = {
    "gpu": {
        "features": ["shader-f16"],
        "limits": {"maxBufferSize": 4 * GiB, "maxStorageBufferBindingSize": 2 * GiB},
        "fallback": False,
    },
    "memoryGB": 8,
    "cores": 16,
    "storageFreeBytes": 200 * GiB,
}


def fit(body: str, text: str | None = None) -> Any:
    """Run `body` with `cat` (the read catalogue) and `fit` (the module) in scope."""
    data = text if text is not None else CATALOGUE.read_text(encoding="utf-8")
    script = f"""
const fit = await import({json.dumps(FIT.as_uri())});
const cat = fit.readCatalogue({json.dumps(data)});
const result = await (async () => {{ {body} }})();
console.log(JSON.stringify(result));
"""
    return run_module(script)


def verdicts(device: dict[str, Any]) -> dict[str, Any]:
    return fit(
        f"return Object.fromEntries(cat.entries.map((e) => [e.id, fit.fitOf(e, {json.dumps(device)}, cat.engines)]));"
    )


def test_every_entry_of_the_catalogue_is_read() -> None:
    count = len(json.loads(CATALOGUE.read_text(encoding="utf-8"))["entries"])
    assert fit("return cat.entries.length;") == count


def test_entries_off_the_hosts_or_malformed_are_dropped() -> None:
    data = json.loads(CATALOGUE.read_text(encoding="utf-8"))
    good = data["entries"][0]
    bad_host = json.loads(json.dumps(good)) | {"id": "bad-host"}
    bad_host["files"][0]["url"] = "https://evil.example/model.gguf"
    plain = json.loads(json.dumps(good)) | {"id": "plain-http"}
    plain["files"][0]["url"] = plain["files"][0]["url"].replace("https:", "http:")
    user = json.loads(json.dumps(good)) | {"id": "user-info"}
    user["files"][0]["url"] = "https://me:secret@huggingface.co/x.gguf"
    bad_hash = json.loads(json.dumps(good)) | {"id": "bad-hash"}
    bad_hash["files"][0]["sha256"] = "zz"
    bad_size = json.loads(json.dumps(good)) | {"id": "bad-size"}
    bad_size["files"][0]["bytes"] = -1
    unknown = json.loads(json.dumps(good)) | {"id": "unknown-engine", "engine": "mystery"}
    no_licence = json.loads(json.dumps(good)) | {
        "id": "no-licence",
        "licence": {"name": "x", "url": "javascript:alert(1)"},
    }
    url_model = json.loads(json.dumps(good)) | {
        "id": "url-model",
        "model": "https://evil.example/m",
    }
    data["entries"] = [
        good,
        bad_host,
        plain,
        user,
        bad_hash,
        bad_size,
        unknown,
        no_licence,
        url_model,
    ]
    assert fit("return cat.entries.map((e) => e.id);", json.dumps(data)) == [good["id"]]
    # Settings: only the keys the engine's row lists, plain values (never a URL of another host).
    sneaky = json.loads(json.dumps(good)) | {"id": "sneaky"}
    sneaky["settings"] = {
        "contextSize": 2048,
        "url": "https://evil.example/x.gguf",
        "source": {"kind": "path"},
    }
    data["entries"] = [sneaky]
    assert fit("return cat.entries[0].settings;", json.dumps(data)) == {"contextSize": 2048}
    # Loopback http is a model server of this computer (the test build's host).
    data["hosts"].append("127.0.0.1:8000")
    local = json.loads(json.dumps(good)) | {"id": "local"}
    local["files"][0]["url"] = "http://127.0.0.1:8000/model.gguf"
    data["entries"] = [local]
    assert fit("return cat.entries.map((e) => e.id);", json.dumps(data)) == ["local"]
    assert fit("return cat.entries.length;", "not json") == 0


def test_a_small_device_without_webgpu() -> None:
    small = verdicts(SMALL)
    for entry_id, result in small.items():
        if "webllm" in entry_id or "onnx" in entry_id:
            assert result["verdict"] == "no"
            assert any("WebGPU" in r for r in result["reasons"])
    assert small["smollm2-135m-wasm-q8_0"] == {"verdict": "fits", "reasons": []}
    phi = small["phi3.5-mini-wasm-q4_k_m"]
    assert phi["verdict"] == "no" and "memory" in phi["reasons"][0]
    assert small["smollm2-360m-wasm-q8_0"]["verdict"] == "no"
    # With 2 GB it is under the page's share of memory but close to it: may be slow.
    assert verdicts(SMALL | {"memoryGB": 2})["smollm2-360m-wasm-q8_0"]["verdict"] == "slow"
    assert (
        fit(f"return fit.suggestion(cat.entries, {json.dumps(SMALL)}, cat.engines)?.id;")
        == "smollm2-135m-wasm-q8_0"
    )


def test_a_large_device_with_webgpu() -> None:
    large = verdicts(LARGE)
    assert large["webllm-llama-3.2-1b-instruct-q4f16_1-mlc"]["verdict"] == "fits"
    assert large["qwen2.5-0.5b-onnx-q4f16"]["verdict"] == "fits"
    # 8 GB is the browser's cap: a large model may still be slow, never refused for memory.
    assert large["phi3.5-mini-wasm-q4_k_m"]["verdict"] == "slow"
    best = fit(f"return fit.suggestion(cat.entries, {json.dumps(LARGE)}, cat.engines);")
    # The largest that fits (Llama 3.2 3B needs more than half the page's share: may be slow).
    assert best["id"] == "webllm-gemma-2-2b-it-q4f16_1-mlc"
    assert best["downloadBytes"] > 0


def test_gpu_feature_buffer_fallback_and_storage_reasons() -> None:
    no_f16 = LARGE | {"gpu": LARGE["gpu"] | {"features": []}}
    result = verdicts(no_f16)["webllm-llama-3.2-1b-instruct-q4f16_1-mlc"]
    assert result["verdict"] == "no" and "shader-f16" in result["reasons"][0]
    assert verdicts(no_f16)["webllm-llama-3.2-1b-instruct-q4f32_1-mlc"]["verdict"] == "fits"
    small_buffers = LARGE | {
        "gpu": LARGE["gpu"]
        | {"limits": {"maxBufferSize": 256 * 1024**2, "maxStorageBufferBindingSize": 128 * 1024**2}}
    }
    gemma = verdicts(small_buffers)["webllm-gemma-2-2b-it-q4f16_1-mlc"]
    assert gemma["verdict"] == "no" and "buffer" in gemma["reasons"][0]
    fallback = LARGE | {"gpu": LARGE["gpu"] | {"fallback": True}}
    assert verdicts(fallback)["webllm-llama-3.2-1b-instruct-q4f16_1-mlc"]["verdict"] == "slow"
    full = LARGE | {"storageFreeBytes": 100 * 1024**2}
    result = verdicts(full)["smollm2-360m-wasm-q8_0"]
    assert result["verdict"] == "no" and "storage" in result["reasons"][0]
    # Facts the browser does not give are not held against an entry.
    unknown = {"gpu": None, "memoryGB": None, "cores": None, "storageFreeBytes": None}
    assert verdicts(unknown)["phi3.5-mini-wasm-q4_k_m"]["verdict"] == "fits"


def test_the_filter() -> None:
    assert fit(
        "return fit.filterEntries(cat.entries, {text: 'qwen', engine: 'wasm'}).map((e) => e.id);"
    ) == ["qwen2.5-0.5b-wasm-q8_0", "qwen2.5-1.5b-wasm-q4_k_m"]
    small = fit(
        "return fit.filterEntries(cat.entries, {maxBytes: 200 * 1024 * 1024}).map((e) => e.downloadBytes);"
    )
    assert small and all(size <= 200 * 1024**2 for size in small)
    tools = fit("return fit.filterEntries(cat.entries, {capability: 'tools'}).map((e) => e.name);")
    assert "Gemma 2 2B Instruct" not in tools and "Qwen2.5 0.5B Instruct" in tools
    assert fit("return fit.filterEntries(cat.entries, {capability: 'images'}).length;") == 0


def test_an_engines_ceiling_is_a_byte_ceiling_of_limits_js_or_none() -> None:
    data = json.loads(CATALOGUE.read_text(encoding="utf-8"))
    names = [
        "HEADERS_TIMEOUT_MS",
        "constructor",
        "__proto__",
        "MIN_RATE_BYTES",
        "MAX_ONNX_WEIGHTS_BYTES",
    ]
    for index, name in enumerate(names):
        data["engines"][f"x{index}"] = {"label": "X", "ceiling": name}
    ceilings = fit(
        "return Object.fromEntries(Object.entries(cat.engines).map(([k, e]) => [k, e.ceiling]));",
        json.dumps(data),
    )
    assert ceilings["wasm"] == "MAX_GGUF_MODEL_BYTES"
    assert [ceilings[f"x{i}"] for i in range(len(names))] == [None] * 4 + ["MAX_ONNX_WEIGHTS_BYTES"]


def test_an_engine_kind_the_build_does_not_declare_is_dropped() -> None:
    data = json.loads(CATALOGUE.read_text(encoding="utf-8"))
    data["engines"]["invented"] = dict(data["engines"]["wasm"])
    invented = dict(data["entries"][0], id="invented-entry", engine="invented")
    data["entries"].append(invented)
    kept = fit(
        "const only = fit.readCatalogue(JSON.stringify(DATA), new Set(['wasm', 'webllm', 'onnx']));"
        " return [Object.keys(only.engines).sort(), only.entries.some((e) => e.engine === 'invented')];".replace(
            "DATA", json.dumps(data)
        ),
        json.dumps(data),
    )
    assert kept == [["onnx", "wasm", "webllm"], False]
