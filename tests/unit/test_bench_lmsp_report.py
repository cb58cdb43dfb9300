"""The LMSP benchmark's report survives figures that a quick run cannot measure.

A quick run on a 1 MB model can finish inside one tick of the CPU clock, so a
server's CPU time may read zero: the report prints `n/a` for such a ratio
instead of dividing by it.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_lmsp_service.py"


def load_bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_lmsp_service_under_test", BENCH)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def test_a_reference_that_used_no_measurable_cpu_is_reported_not_divided(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = load_bench()
    model = tmp_path / "tiny.gguf"
    model.write_bytes(b"\0" * 1000)
    args = argparse.Namespace(
        model=model, tokens=16, requests_per_client=1, rounds=1, n_ctx=512, n_threads=1,
        extra_bufts=False, levels=[1, 4], reuse_exchanges=15,
    )  # fmt: skip
    sample = bench.Sample(first_event_s=0.01, first_token_s=0.02, tokens=16, text="Hi")
    results = {}
    for level in args.levels:
        results[(bench.NAPLLM, level)] = bench.LevelResult(
            wall_s=0.1, samples=[sample] * level, cpu_s=0.05
        )
        # The reference: no CPU time measured, and a zero wall time besides.
        results[(bench.LLAMA_SERVER, level)] = bench.LevelResult(
            wall_s=0.0, samples=[sample] * level, cpu_s=0.0
        )
    servers = [
        argparse.Namespace(name=bench.NAPLLM, note=""),
        argparse.Namespace(name=bench.LLAMA_SERVER, note=""),
    ]
    code = bench.report(args, "random weights", servers, results, 0.0, [], {})
    out = capsys.readouterr().out
    assert "CPU ms/token 3.12 vs llama-server 0.00, n/ax" in out
    assert "not measured" in out
    assert code == 0


def test_a_thread_that_ends_while_cpu_time_is_read_does_not_void_the_figure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bench = load_bench()
    real = Path
    pid = os.getpid()

    class EndingThread(type(Path())):  # type: ignore[misc]
        def iterdir(self):  # type: ignore[no-untyped-def]
            yield from super().iterdir()
            if str(self) == f"/proc/{pid}/task":
                yield real(f"/proc/{pid}/task/999999999")  # ended meanwhile

    monkeypatch.setattr(bench, "Path", EndingThread)
    if not real(f"/proc/{pid}/stat").exists():
        pytest.skip("no /proc here")
    figure = bench.cpu_seconds(pid)
    assert figure == figure and figure > 0
