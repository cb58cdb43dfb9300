"""TinyChat compiled for WebLLM (models/tinychat/webllm/), under CPython.

- The shipped files match SHA256SUMS, and the record the build writes for
  WebLLM (the spec's `webllm_catalog`) points at them with the right
  integrity values.
- The shipped weights (WebLLM's ``tensor-cache.json`` + shard, bfloat16 on
  disk) give llama.cpp's greedy answers for all committed prompts, through
  the numpy reference forward (the model library itself runs in the browser
  tests, tests/browser/test_webllm_tinychat.py).
- The conversation template renders the committed prompts' token counts.
- The built-in connection: its name, route, capabilities (no tools: WebLLM
  refuses tool turns for a model outside its function-calling list), and
  availability on WebGPU adapters with and without ``shader-f16``.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from napllm.providers.engine_webllm import (
    WEBLLM_BUILD,
    WEBLLM_TINYCHAT_ID,
    WEBLLM_TINYCHAT_MODEL,
    WEBLLM_TINYCHAT_NAME,
    GpuReport,
    WebLLMRecord,
    bundled_records,
    webllm_catalog,
    webllm_tinychat_connection,
)

ROOT = Path(__file__).resolve().parents[2]
TINYCHAT = ROOT / "models" / "tinychat"
WEBLLM = TINYCHAT / "webllm"
SAMPLES = json.loads((TINYCHAT / "samples_torch.json").read_text())
SHORT = [s for s in SAMPLES if len(s["out_ids"]) <= 64]


def load_build() -> Any:
    """The build's model step (build.py puts its package, tools/buildsys, on sys.path)."""
    spec = importlib.util.spec_from_file_location("napllm_build_for_webllm", ROOT / "build.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return importlib.import_module("buildsys.models")


@pytest.fixture(scope="module")
def reference() -> Any:
    sys.path.insert(0, str(WEBLLM))
    try:
        import reference as module
    finally:
        sys.path.remove(str(WEBLLM))
    return module


def test_files_match_their_checksums_and_the_record() -> None:
    build = load_build()
    sums = build.read_sha256sums(WEBLLM / "SHA256SUMS")
    [model] = WEBLLM_BUILD["models"]
    assert model["source"] == "tinychat/webllm"
    assert set(sums) == set(model["files"])
    for name, digest in sums.items():
        assert hashlib.sha256((WEBLLM / name).read_bytes()).hexdigest() == digest, name
    prebuilt = {"model_id": "Other-MLC", "vram_required_MB": 9, "model_url": "https://x"}
    catalog = webllm_catalog(
        {"prebuiltAppConfig": {"model_list": [prebuilt]}, "functionCallingModelIds": ["Other-MLC"]},
        [{"path": model["dest"], "files": sums}],
    )
    assert catalog["records"] == [{"model_id": "Other-MLC", "vram_required_MB": 9}]
    assert catalog["functionCallingIds"] == ["Other-MLC"]
    [record] = catalog["bundled"]
    assert record["model_id"] == WEBLLM_TINYCHAT_MODEL
    assert record["model"] == "models/tinychat-webllm/resolve/main/"
    assert record["model_lib"].endswith("/tinychat-webgpu.wasm")
    lib_digest = hashlib.sha256((WEBLLM / "tinychat-webgpu.wasm").read_bytes()).digest()
    assert record["integrity"]["model_lib"] == "sha256-" + base64.b64encode(lib_digest).decode()
    assert record["required_features"] == []
    parsed = WebLLMRecord.from_json(record)
    assert parsed is not None and parsed.is_chat


def test_no_machine_paths_in_the_model_library() -> None:
    """Source paths in the library are relative to the build folder, never absolute."""
    data = (WEBLLM / "tinychat-webgpu.wasm").read_bytes()
    absolute_source = re.compile(rb"(?<![.\w])/[\w.-]+/[\w./-]+\.(?:cc|cpp|c|h|hpp)\b")
    assert absolute_source.findall(data) == []
    assert b"../3rdparty/tvm-ffi/include/" in data  # the relative form is there


def test_shipped_weights_give_llama_cpp_greedy_answers(reference: Any) -> None:
    config = json.loads((WEBLLM / "mlc-chat-config.json").read_text())["model_config"]
    shape = reference.LlamaShape(
        layers=config["num_hidden_layers"],
        heads=config["num_attention_heads"],
        kv_heads=config["num_key_value_heads"],
        hidden=config["hidden_size"],
        eps=config["rms_norm_eps"],
        rope_theta=config["position_embedding_base"],
    )
    weights = reference.read_tensor_cache(WEBLLM)
    # mlc-llm fuses q, k and v into one projection: split it back.
    for layer in range(shape.layers):
        prefix = f"model.layers.{layer}."
        qkv = weights.pop(prefix + "self_attn.qkv_proj.weight")
        q, k, v = qkv[: shape.hidden], qkv[shape.hidden : 2 * shape.hidden], qkv[2 * shape.hidden :]
        weights[prefix + "self_attn.q_proj.weight"] = q
        weights[prefix + "self_attn.k_proj.weight"] = k
        weights[prefix + "self_attn.v_proj.weight"] = v
        gate_up = weights.pop(prefix + "mlp.gate_up_proj.weight")
        half = gate_up.shape[0] // 2
        weights[prefix + "mlp.gate_proj.weight"] = gate_up[:half]
        weights[prefix + "mlp.up_proj.weight"] = gate_up[half:]
    for sample in SAMPLES:
        got = reference.greedy(shape, weights, sample["prompt_ids"], len(sample["out_ids"]))
        assert got == sample["out_ids"], sample["text"]


def test_conversation_template_gives_the_reference_prompt_lengths() -> None:
    """chatml_nosystem: no default system message, so "Hello!" is 10 tokens.

    The rendered text is tokenized by llama.cpp with the GGUF's own
    vocabulary (the same byte-level BPE as tokenizer.json).
    """
    llama_cpp = pytest.importorskip("llama_cpp")
    config = json.loads((WEBLLM / "mlc-chat-config.json").read_text())
    template = config["conv_template"]
    assert template["name"] == "chatml_nosystem" and template["system_message"] == ""
    assert template["stop_token_ids"] == [2]
    vocab = llama_cpp.Llama(str(TINYCHAT / "tiny-chat-q8_0.gguf"), vocab_only=True, verbose=False)
    sep = template["seps"][0]
    for sample in SHORT:
        if any(m["role"] not in ("user", "assistant") for m in sample["messages"]):
            continue
        text = "".join(
            f"{template['roles'][m['role']]}{template['role_content_sep']}{m['content']}{sep}"
            for m in sample["messages"]
        )
        text += template["roles"]["assistant"] + template["role_empty_sep"]
        assert vocab.tokenize(text.encode(), add_bos=False, special=True) == sample["prompt_ids"]


RECORD = {
    "model_id": WEBLLM_TINYCHAT_MODEL,
    "model": "models/tinychat-webllm/resolve/main/",
    "model_lib": "models/tinychat-webllm/resolve/main/tinychat-webgpu.wasm",
    "model_type": 0,
    "required_features": [],
    "vram_required_MB": 32,
    "low_resource_required": True,
    "buffer_size_required_bytes": 32 * 1024 * 1024,
}
SWIFTSHADER = GpuReport.from_json(
    {
        "adapter": True,
        "features": [],
        "maxBufferSize": 2**28,
        "maxStorageBufferBindingSize": 2**27,
        "fallback": True,
    }
)


def test_the_connection_runs_on_a_software_adapter_without_tools() -> None:
    [record] = bundled_records([RECORD, {"model_id": 3}, "x", {**RECORD, "model_type": 1}])
    calling = ["Hermes-3-Llama-3.1-8B-q4f16_1-MLC"]
    connection = webllm_tinychat_connection(record, SWIFTSHADER, calling)
    assert connection.id == WEBLLM_TINYCHAT_ID and connection.name == WEBLLM_TINYCHAT_NAME
    assert connection.kind == "webllm" and connection.model == WEBLLM_TINYCHAT_MODEL
    assert connection.route == "This browser (WebGPU, WebLLM) on this device"
    assert connection.available and connection.unavailable_reason is None
    caps = connection.capabilities
    assert caps.json_output and not caps.tools and not caps.images
    assert connection.settings["builtin"] is True and connection.settings["rank"] == 30


def test_without_an_adapter_the_connection_is_listed_unavailable() -> None:
    [record] = bundled_records([RECORD])
    no_gpu = GpuReport.from_json({"reason": "no-adapter"})
    connection = webllm_tinychat_connection(record, no_gpu, [])
    assert not connection.available and "WebGPU" in (connection.unavailable_reason or "")
