"""Benchmark: napllm-lmsp stays responsive while hostile JSON Schemas are sent to it.

Starts `napllm-lmsp` with TinyChat on a free 127.0.0.1 port. Hostile
clients send, again and again, the requests that used to freeze the whole
service: structured output (and a forced tool call) whose schema is a
string of exactly N characters with `not: {pattern: "(?:.|.)*\\x00"}`. The
grammar makes the model write N characters, the grammar cannot enforce
`not`, and Python's backtracking `re` needs about 2**N steps to evaluate it
(N = 40 is about a day). Meanwhile a benign client sends `GET /models` one
after another. It prints:

- the benign requests' latency (median, p99, max) and count;
- each hostile request's status, problem code and duration, against the
  output check's limit (`OUTPUT_CHECK_TIME_LIMIT_S`).

Exit status 1 when the benign p99 is 1 s or more, or a hostile request
took longer than the check's limit plus 5 s.

Usage: python bench/bench_hostile_schemas.py [--model PATH] [--n 40]
       [--hostile 4] [--rounds 2] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "runtime"))

from napllm.lmsp_service.app import OUTPUT_CHECK_TIME_LIMIT_S  # noqa: E402

DEFAULT_MODEL = REPO / "models" / "tinychat" / "tiny-chat-q8_0.gguf"
MODEL_ID = "bench"
PATTERN = "(?:.|.)*\\x00"


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def hostile_bodies(n: int) -> list[dict[str, Any]]:
    """The two shapes of the reproducer: response_format, and a forced tool's parameters."""
    string = {"type": "string", "minLength": n, "maxLength": n, "not": {"pattern": PATTERN}}
    message = {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": "Write a long word."}],
    }
    structured = {
        "model": MODEL_ID,
        "input": [message],
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": string}},
        "max_output_tokens": 4 * n + 16,
    }
    tool = {
        "model": MODEL_ID,
        "input": [message],
        "tools": [
            {
                "type": "function",
                "name": "t",
                "parameters": {"type": "object", "properties": {"s": string}, "required": ["s"]},
            }
        ],
        "tool_choice": "required",
        "max_output_tokens": 4 * n + 64,
    }
    return [structured, tool]


async def benign(client: httpx.AsyncClient, stop: asyncio.Event) -> list[float]:
    latencies: list[float] = []
    while not stop.is_set():
        started = time.monotonic()
        answer = await client.get("/lmsp/v1/models")
        latencies.append(time.monotonic() - started)
        if answer.status_code != 200:
            raise RuntimeError(f"benign request answered {answer.status_code}")
        await asyncio.sleep(0.05)
    return latencies


async def hostile(
    client: httpx.AsyncClient, body: dict[str, Any], rounds: int
) -> list[tuple[int, str, float]]:
    outcomes: list[tuple[int, str, float]] = []
    for _ in range(rounds):
        started = time.monotonic()
        answer = await client.post("/lmsp/v1/responses", json=body)
        took = time.monotonic() - started
        code = ""
        if answer.headers.get("content-type", "").startswith("application/problem+json"):
            code = str(answer.json().get("code"))
        elif answer.status_code == 200:
            code = str(answer.json().get("status"))
        outcomes.append((answer.status_code, code, took))
    return outcomes


async def measure(base: str, token: str, n: int, hostile_clients: int, rounds: int) -> int:
    headers = {"Authorization": f"Bearer {token}", "LMSP-Version": "1.0"}
    limits = httpx.Limits(max_connections=hostile_clients + 2)
    async with (
        httpx.AsyncClient(base_url=base, headers=headers, timeout=600, limits=limits) as client,
        httpx.AsyncClient(base_url=base, headers=headers, timeout=600) as probe,
    ):
        stop = asyncio.Event()
        benign_task = asyncio.create_task(benign(probe, stop))
        bodies = hostile_bodies(n)
        started = time.monotonic()
        results = await asyncio.gather(
            *(hostile(client, bodies[i % len(bodies)], rounds) for i in range(hostile_clients))
        )
        wall = time.monotonic() - started
        stop.set()
        latencies = sorted(await benign_task)
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
    print(f"hostile schema: string of {n} characters, not.pattern {PATTERN!r}")
    print(
        f"hostile clients: {hostile_clients} x {rounds} requests, {wall:.1f} s in all; "
        f"output check limit {OUTPUT_CHECK_TIME_LIMIT_S:g} s"
    )
    worst = 0.0
    for index, outcomes in enumerate(results):
        for status, code, took in outcomes:
            worst = max(worst, took)
            print(f"  hostile {index}: {status} {code} in {took:.2f} s")
    print(
        f"benign GET /models: {len(latencies)} requests, median "
        f"{statistics.median(latencies) * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms, "
        f"max {latencies[-1] * 1000:.1f} ms"
    )
    failed = p99 >= 1.0 or worst > OUTPUT_CHECK_TIME_LIMIT_S * rounds + 5.0 + wall / rounds
    print("verdict:", "FAIL" if failed else "ok (benign p99 < 1 s, hostile requests bounded)")
    return 1 if failed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--n", type=int, default=40, help="characters of the hostile string")
    parser.add_argument("--hostile", type=int, default=4, help="hostile clients at once")
    parser.add_argument("--rounds", type=int, default=2, help="requests per hostile client")
    parser.add_argument("--quick", action="store_true", help="one round of two hostile clients")
    args = parser.parse_args()
    if args.quick:
        args.hostile, args.rounds = 2, 1
    with tempfile.TemporaryDirectory() as tmp:
        token_file = Path(tmp) / "token"
        port = free_port()
        python_path = os.pathsep.join(
            p for p in (str(REPO / "runtime"), os.environ.get("PYTHONPATH", "")) if p
        )
        service = subprocess.Popen(
            [
                sys.executable, "-m", "napllm.lmsp_service",
                "--model", str(args.model), "--model-id", MODEL_ID,
                "--port", str(port), "--token-file", str(token_file),
                "--n-ctx", "512", "--n-threads", "1",
            ],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env={**os.environ, "XDG_CONFIG_HOME": tmp, "PYTHONPATH": python_path},
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 120
            base = f"http://127.0.0.1:{port}"
            while True:
                if service.poll() is not None:
                    raise RuntimeError("napllm-lmsp exited early")
                if time.monotonic() > deadline:
                    raise RuntimeError("napllm-lmsp did not become ready")
                if token_file.exists() and token_file.read_text().strip():
                    token = token_file.read_text().strip()
                    try:
                        ready = httpx.get(
                            base + "/lmsp/v1/models",
                            headers={"Authorization": f"Bearer {token}"},
                            timeout=2,
                        )
                        if ready.status_code == 200:
                            break
                    except httpx.TransportError:
                        pass
                time.sleep(0.1)
            return asyncio.run(measure(base, token, args.n, args.hostile, args.rounds))
        finally:
            service.terminate()
            try:
                service.wait(timeout=15)
            except subprocess.TimeoutExpired:
                service.kill()
                service.wait()


if __name__ == "__main__":
    raise SystemExit(main())
