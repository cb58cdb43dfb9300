"""TinyChat compiled for WebLLM: the built-in "TinyChat (WebGPU, WebLLM)" connection.

Rules
- The model (``models/tinychat/webllm/``: weights, ``mlc-chat-config.json``,
  tokenizer and the WebGPU model library) is served from the shell's own
  folder (``dist/models/tinychat-webllm/resolve/main/``). Its WebLLM
  ``ModelRecord`` is written by build.py into ``vendor/web-llm/catalog.json``
  under ``bundled``, with URLs relative to the shell page;
  web/engines/webllm-engine.js resolves them and hands WebLLM an
  ``appConfig`` of its prebuilt records plus these. So the model is loaded,
  cached and run by WebLLM exactly like a prebuilt one, with no model host.
- Availability and capabilities are WebLLM's own rules
  (``providers.engine_webllm``): WebGPU must give an adapter; the record needs no
  ``shader-f16`` and small buffers, so Chromium's software adapter
  (SwiftShader) runs it.
- Tools: the model is not in WebLLM's function-calling list, and WebLLM
  refuses a request with ``tools`` for such a model, so the connection has
  ``tools: false`` and the runtime answers a tool request with
  `unsupported` before anything is submitted (NAP-LLM capabilities).
- JSON output is WebLLM's grammar (``response_format`` with a schema;
  ``webllm_chat_body`` always sends one).
"""

from __future__ import annotations

from collections.abc import Iterable

from ..records import Connection
from .engine_webllm import GpuReport, WebLLMRecord, webllm_connection

#: The record's `model_id` (build.py `WEBLLM_TINYCHAT_RECORD`).
WEBLLM_TINYCHAT_MODEL = "TinyChat-q0f32-MLC"
WEBLLM_TINYCHAT_ID = "builtin-tinychat-webllm"
WEBLLM_TINYCHAT_NAME = "TinyChat (WebGPU, WebLLM)"
#: After llama.cpp's TinyChat (10) and transformers.js' (20).
WEBLLM_TINYCHAT_RANK = 30


def bundled_records(raw: object) -> list[WebLLMRecord]:
    """The chat records of the catalogue's `bundled` list (malformed entries dropped)."""
    if not isinstance(raw, list):
        return []
    records = [WebLLMRecord.from_json(item) for item in raw]
    return [r for r in records if r is not None and r.is_chat]


def webllm_tinychat_connection(
    record: WebLLMRecord, gpu: GpuReport, function_calling_ids: Iterable[str]
) -> Connection:
    """The built-in connection for the bundled TinyChat record (module rules).

    Unavailable, with WebLLM's reason, where the device cannot run it.
    """
    base = webllm_connection(record, gpu, function_calling_ids)
    settings = {**base.settings, "rank": WEBLLM_TINYCHAT_RANK, "bundled": True}
    return base.model_copy(
        update={"id": WEBLLM_TINYCHAT_ID, "name": WEBLLM_TINYCHAT_NAME, "settings": settings}
    )
