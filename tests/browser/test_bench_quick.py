"""Every benchmark under bench/ runs to the end in its `--quick` mode.

A benchmark nobody runs rots (an import that moved, a page hook that
changed). Each `bench/*.py` is found by a glob, so a new benchmark is covered
without editing this file; it must accept `--quick`. The test asserts only
that the benchmark ran (exit status 0, which each benchmark also uses for
"the answers matched between the paths it compares") and printed figures;
the figures themselves are never asserted (tests assert behaviour, not
timing).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCHES = sorted((ROOT / "bench").glob("bench_*.py"))

#: Lines a benchmark's quick run must print (its comparison of answers).
EXPECTED = {
    "bench_wasm.py": "answers that differ between the paths: 0 of",
    "bench_lmsp_service.py": "napllm-lmsp answers identical to its answer with 1 client: yes",
    "bench_shell.py": "text received == text sent",
    "bench_hostile_schemas.py": "verdict: ok",
    "bench_python_napplet.py": "warm napplet / warm bare =",
    "bench_python_stream.py": "text intact                    yes",
}


def test_every_benchmark_is_covered() -> None:
    assert {p.name for p in BENCHES} >= {
        "bench_wasm.py",
        "bench_shell.py",
        "bench_lmsp_service.py",
        "bench_providers.py",
        "bench_dist_load.py",
        "bench_python_napplet.py",
        "bench_python_stream.py",
    }


@pytest.mark.parametrize("bench", BENCHES, ids=[p.stem for p in BENCHES])
def test_benchmark_runs_quick(bench: Path, dist_dir: Path) -> None:
    if bench.name in ("bench_lmsp_service.py", "bench_hostile_schemas.py"):
        pytest.importorskip("llama_cpp")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "runtime")}
    done = subprocess.run(
        [sys.executable, str(bench), "--quick"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    report = f"stdout:\n{done.stdout[-4000:]}\nstderr:\n{done.stderr[-4000:]}"
    assert done.returncode == 0, report
    assert done.stdout.strip(), report
    if bench.name in EXPECTED:
        assert EXPECTED[bench.name] in done.stdout, report
