"""The model catalogue's data (web/catalogue/models.json): every entry checked.

Each entry: an engine the repository has (`napllm.kinds.FORM_KINDS` and the
catalogue's engine table), every file URL `https:` on one of the hosts the
catalogue names (the shell's fit.js refuses any other), positive sizes, a
sha256 of 64 hex digits or none, a licence with an `https:` link (and
acceptance for the licences that require it), and a memory figure that is
consistent with its parameters and bits per weight, plus the KV cache its
architecture needs at the default context.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from napllm.kinds import FORM_KINDS, kind_info

ROOT = Path(__file__).resolve().parents[2]
CATALOGUE = json.loads((ROOT / "web" / "catalogue" / "models.json").read_text(encoding="utf-8"))
ENTRIES: list[dict[str, Any]] = CATALOGUE["entries"]
MiB = 1024 * 1024
#: Weights may differ from parameters x bits / 8 by this share (embeddings and
#: norms kept at higher precision, block scales).
WEIGHTS_TOLERANCE = 0.35
#: The KV cache (f16 keys and values, every layer) may differ by this share.
KV_TOLERANCE = 0.05
#: Licences whose terms must be accepted before use.
GATED_FAMILIES = ("Llama", "Gemma")


def ids(entry: dict[str, Any]) -> str:
    return str(entry["id"])


def test_the_catalogue_covers_every_engine_and_the_named_models() -> None:
    engines = {e["engine"] for e in ENTRIES}
    assert engines == {"wasm", "webllm", "onnx"}
    names = {e["name"] for e in ENTRIES}
    for name in (
        "SmolLM2 135M Instruct",
        "SmolLM2 360M Instruct",
        "SmolLM2 1.7B Instruct",
        "Qwen2.5 0.5B Instruct",
        "Qwen2.5 1.5B Instruct",
        "Llama 3.2 1B Instruct",
        "Llama 3.2 3B Instruct",
        "Phi-3.5 mini Instruct",
        "Gemma 2 2B Instruct",
    ):
        assert name in names
    assert len({e["id"] for e in ENTRIES}) == len(ENTRIES)


@pytest.mark.parametrize("entry", ENTRIES, ids=ids)
def test_an_entry_has_a_known_engine_and_allowed_urls(entry: dict[str, Any]) -> None:
    assert entry["engine"] in FORM_KINDS and kind_info(entry["engine"]) is not None
    assert entry["engine"] in CATALOGUE["engines"]
    hosts = set(CATALOGUE["hosts"])
    assert entry["files"]
    for file in entry["files"]:
        parts = urlsplit(file["url"])
        assert parts.scheme == "https" and parts.netloc in hosts, file["url"]
        assert not parts.username and not parts.query and not parts.fragment
        assert isinstance(file["bytes"], int) and file["bytes"] > 0
        assert file["sha256"] is None or re.fullmatch(r"[0-9a-f]{64}", file["sha256"])
        # A figure nobody confirmed says so (the shell then asks the host).
        assert file["sha256"] is not None or file["estimate"] is True


@pytest.mark.parametrize("entry", ENTRIES, ids=ids)
def test_an_entry_names_its_licence(entry: dict[str, Any]) -> None:
    licence = entry["licence"]
    assert licence["name"] and urlsplit(licence["url"]).scheme == "https"
    gated = entry["family"].startswith(GATED_FAMILIES)
    assert licence["accept"] is gated


@pytest.mark.parametrize("entry", ENTRIES, ids=ids)
def test_the_memory_estimate_is_parameters_times_bits_plus_the_kv_cache(
    entry: dict[str, Any],
) -> None:
    memory = entry["memory"]
    weights = entry["parameters"] * entry["bitsPerWeight"] / 8 / MiB
    assert abs(memory["weightsMB"] - weights) <= WEIGHTS_TOLERANCE * weights
    arch = entry["architecture"]
    kv = 2 * arch["layers"] * arch["kvHeads"] * arch["headDim"] * entry["contextSize"] * 2 / MiB
    assert abs(memory["kvCacheMB"] - kv) <= KV_TOLERANCE * kv
    assert memory["totalMB"] == pytest.approx(memory["weightsMB"] + memory["kvCacheMB"], abs=0.2)
    # The download is the weights, within the same tolerance.
    weight_files = sum(f["bytes"] for f in entry["files"] if f["role"] != "model library")
    assert abs(weight_files / MiB - weights) <= WEIGHTS_TOLERANCE * weights
    assert 0 < entry["contextSize"] <= entry["maxContext"]


def test_webllm_entries_are_its_prebuilt_list() -> None:
    import subprocess

    index = ROOT / "node_modules" / "@mlc-ai" / "web-llm" / "lib" / "index.js"
    if not index.is_file():
        pytest.skip("node_modules is not installed")
    script = (
        f"import({json.dumps(index.as_uri())}).then((m) => "
        "console.log(JSON.stringify(m.prebuiltAppConfig.model_list)))"
    )
    out = subprocess.run(
        ["node", "-e", script], capture_output=True, text=True, check=True, timeout=60
    )
    prebuilt = {r["model_id"]: r for r in json.loads(out.stdout)}
    for entry in (e for e in ENTRIES if e["engine"] == "webllm"):
        record = prebuilt[entry["model"]]
        assert entry["files"][0]["url"] == record["model"] + "/resolve/main/"
        assert entry["files"][1]["url"] == record["model_lib"]
        assert entry["memory"]["gpuTotalMB"] == record["vram_required_MB"]
        for feature in record.get("required_features", []):
            assert feature in entry["requires"]["features"]
