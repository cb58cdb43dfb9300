"""Run llama-cpp-python's OpenAI-compatible server with llama.cpp's CPU fast path off.

Usage: `python tests/service/llama_server_safe.py [llama_cpp.server arguments]`.
The tests of the OpenAI-compatible provider need a server that answers on
every CPU, not llama.cpp's fastest one: this starts `llama_cpp.server` with
every model loaded without the extra buffer types (the product's safe
parameters, `napllm.lmsp_service.llama_load.extra_bufts_off`), so a CPU whose
fast path crashes (AMX with llama-cpp-python 0.3.36) cannot fail them.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "runtime"))

from napllm.lmsp_service.llama_load import extra_bufts_off

if __name__ == "__main__":
    with extra_bufts_off():
        runpy.run_module("llama_cpp.server", run_name="__main__", alter_sys=True)
