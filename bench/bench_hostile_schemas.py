"""Benchmark: napllm-lmsp stays responsive while hostile JSON Schemas are sent to it.

Serves napllm-lmsp's application (`build_app`, the schema workers, uvicorn
on a free 127.0.0.1 port) with an engine double that writes N `a`s (as
a JSON string, or inside the forced tool call) whatever the grammar says,
as a model would behind a grammar llama.cpp failed to parse. What is
measured is the service's handling of the schema, not inference, so no
model is needed. Hostile clients send, again and again, requests whose
output check used to freeze the whole service: structured output (and a
forced tool call) whose schema is a string of N characters with the
pattern `^a*a*…a*b$` (ten `a*`), on which Python's backtracking `re` needs
about N**9 steps (N = 40 is hours). (The earlier reproducer, `not:
{pattern: ...}`, is refused before generating now: the grammar cannot
enforce `not`.) Meanwhile a benign client sends
`GET /models` one after another. It prints:

- the benign requests' latency (median, p99, max) and count;
- each hostile request's status, problem code and duration, against the
  output check's limit (`OUTPUT_CHECK_TIME_LIMIT_S`).

Exit status 1 when the benign p99 is 1 s or more, when a hostile request
ended any other way than failing its check (or 503 `server_busy`), or took
longer than its bound (its check's limit, plus waiting for the hostile
checks ahead of it and for killed workers' replacements to start).

With `--grammar` it measures the other kind instead, with the real model
(TinyChat, models/tinychat/): a napllm-lmsp process is started (from
`--runtime`, this checkout's runtime by default, so an older checkout can
be measured the same way) and hostile clients send the grammars that are
cheap to build but costly to follow (`a?` written out 300 and 500 times as
structured output and as a forced tool's parameters) and the request that
aborted the model worker (`{"type": "boolean"}`, temperature 1,
`min_output_tokens` 40), while a benign client asks "Say hi" (16 tokens)
one request after another. It prints each hostile request's status, code
and duration and the benign latencies; exit status 1 when the benign p99
is 1 s or more or any request failed `model_crashed`.

Usage: python bench/bench_hostile_schemas.py [--n 40] [--hostile 4]
       [--rounds 2] [--quick] [--grammar [--runtime DIR]]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any, cast

import httpx
import uvicorn

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "runtime"))

from napllm.lmsp_service.app import build_app  # noqa: E402
from napllm.lmsp_service.engine import FastPath, GenerationEnd, GenerationJob, TextPiece  # noqa: E402
from napllm.lmsp_service.prompt import ChatTemplate  # noqa: E402
from napllm.lmsp_service.service import (  # noqa: E402
    OUTPUT_CHECK_TIME_LIMIT_S,
    SCHEMA_WORKERS,
    LmspService,
    ServiceConfig,
)

MODEL_ID = "bench"
#: Seconds the grammar-cost mode waits for one hostile request.
HOSTILE_WAIT_S = 120.0
#: Seconds the benign client runs alone first, in the grammar-cost mode.
BASELINE_S = 5.0
PATTERN = "^" + "a*" * 10 + "b$"
TOKEN = "bench-token"


class GrammarObeyingEngine:
    """An engine double that writes N `a`s whatever the grammar asks for."""

    model_id = MODEL_ID
    n_ctx = 4096
    max_prompt_bytes = n_ctx * 16
    template = ChatTemplate("{{ messages[-1]['content'] }}", "", "")
    supports_tools = True
    fast_path = FastPath(setting="auto", enabled=True, reason=None, cpu="")

    def __init__(self, n: int) -> None:
        self.word = "a" * n

    def render(self, messages: list[dict[str, Any]], tools: object) -> str:
        return "prompt"

    def tokenize(self, prompt: str) -> list[int]:
        return [1, 2, 3]

    def submit(self, job: GenerationJob, sink: Callable[[Any], None]) -> Future[None]:
        if job.grammar is not None and "<tool_call>" in job.grammar:
            text = (
                '<tool_call>\n{"name": "t", "arguments": {"s": "' + self.word + '"}}\n</tool_call>'
            )
        else:
            text = '"' + self.word + '"'
        sink(TextPiece(text))
        sink(GenerationEnd("stop", len(self.word)))
        done: Future[None] = Future()
        done.set_result(None)
        return done


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def hostile_bodies(n: int) -> list[dict[str, Any]]:
    """The two shapes of the reproducer: response_format, and a forced tool's parameters."""
    # No length keywords beside the pattern: the grammar drops them, so the
    # service refuses such a schema before generating (schema_keywords.py).
    string = {"type": "string", "pattern": PATTERN}
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
    print(f"hostile schema: string of {n} characters, pattern {PATTERN!r}")
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
    # A hostile request waits for the hostile checks ahead of it (two at a
    # time, each at most its limit) and for killed workers' replacements to
    # start (allowed 15 s each on a loaded machine).
    ahead = -(-(hostile_clients * rounds) // SCHEMA_WORKERS)
    bound = ahead * (OUTPUT_CHECK_TIME_LIMIT_S + 15.0)
    print(f"bound for one hostile request here: {bound:.0f} s (worst seen {worst:.1f} s)")
    statuses = {code for outcomes in results for _, code, _ in outcomes}
    print(f"hostile outcomes: {sorted(statuses)}")
    failed = p99 >= 1.0 or worst > bound or not statuses <= {"model_output_invalid", "server_busy"}
    print("verdict:", "FAIL" if failed else "ok (benign p99 < 1 s, hostile requests bounded)")
    return 1 if failed else 0


def grammar_bodies(quick: bool) -> list[tuple[str, dict[str, Any]]]:
    """The grammar-cost hostile requests (module docstring), named."""

    def message(text: str) -> list[dict[str, Any]]:
        return [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
        ]

    def written_out(copies: int) -> dict[str, Any]:
        return {"type": "string", "pattern": "^" + "a?" * copies + "$"}

    def structured(copies: int) -> dict[str, Any]:
        fmt = {"type": "json_schema", "json_schema": {"name": "a", "schema": written_out(copies)}}
        return {
            "input": message("Write a's"),
            "temperature": 1.0,
            "max_output_tokens": 16,
            "response_format": fmt,
        }

    tool = {
        "type": "function",
        "name": "t",
        "parameters": {"type": "object", "properties": {"s": written_out(500)}, "required": ["s"]},
    }
    boolean = {"type": "json_schema", "json_schema": {"name": "b", "schema": {"type": "boolean"}}}
    bodies = [
        ("a? x300 structured output", structured(300)),
        (
            "boolean + min_output_tokens 40",
            {
                "input": message("Yes or no?"),
                "temperature": 1.0,
                "response_format": boolean,
                "extensions": {"min_output_tokens": 40},
            },
        ),
    ]
    if not quick:
        bodies += [
            ("a? x500 structured output", structured(500)),
            (
                "a? x500 forced tool",
                {
                    "input": message("Call t"),
                    "temperature": 1.0,
                    "max_output_tokens": 16,
                    "tools": [tool],
                    "tool_choice": "required",
                },
            ),
        ]
    return bodies


async def measure_grammar(base: str, token: str, model_id: str, quick: bool) -> int:
    headers = {"Authorization": f"Bearer {token}", "LMSP-Version": "1.0"}
    benign_body = {
        "model": model_id,
        "input": [
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "Say hi"}],
            }
        ],
        "temperature": 0,
        "max_output_tokens": 16,
    }
    async with (
        httpx.AsyncClient(base_url=base, headers=headers, timeout=300) as client,
        httpx.AsyncClient(base_url=base, headers=headers, timeout=300) as probe,
    ):
        await probe.post("/lmsp/v1/responses", json=benign_body)  # warm
        stop = asyncio.Event()
        latencies: list[float] = []
        benign_failures: list[str] = []

        async def benign_loop() -> None:
            while not stop.is_set():
                started = time.monotonic()
                try:
                    answer = await probe.post("/lmsp/v1/responses", json=benign_body)
                except httpx.TimeoutException:
                    benign_failures.append("timeout")
                    continue
                finally:
                    latencies.append(time.monotonic() - started)
                if answer.status_code != 200:
                    benign_failures.append(str(answer.json().get("code")))

        async def one(name: str, body: dict[str, Any]) -> tuple[str, int, str, float]:
            started = time.monotonic()
            try:
                answer = await client.post(
                    "/lmsp/v1/responses", json={"model": model_id, **body}, timeout=HOSTILE_WAIT_S
                )
            except httpx.TimeoutException:
                return name, 0, f"no answer within {HOSTILE_WAIT_S:g} s", time.monotonic() - started
            took = time.monotonic() - started
            code = str(answer.json().get("code") or answer.json().get("status"))
            print(f"  hostile {name}: {answer.status_code} {code} in {took:.2f} s", flush=True)
            return name, answer.status_code, code, took

        benign_task = asyncio.create_task(benign_loop())
        await asyncio.sleep(BASELINE_S)  # the benign client alone: the machine's own noise
        stop.set()
        await benign_task
        baseline, latencies[:] = sorted(latencies), []
        stop.clear()
        benign_task = asyncio.create_task(benign_loop())
        results = []
        for name, body in grammar_bodies(quick):  # one hostile request at a time
            results.append(await one(name, body))
            await asyncio.sleep(1.0)  # the benign client keeps asking meanwhile
        stop.set()
        await benign_task
    ordered = sorted(latencies)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    for name, status, code, _took in results:
        if status == 0:
            print(f"  hostile {name}: {code}")
    print(
        f"benign 'Say hi' alone: {len(baseline)} requests, median "
        f"{statistics.median(baseline) * 1000:.1f} ms, "
        f"p99 {baseline[min(len(baseline) - 1, int(len(baseline) * 0.99))] * 1000:.1f} ms"
    )
    print(
        f"benign 'Say hi' (16 tokens) beside the hostile ones: {len(ordered)} requests, median "
        f"{statistics.median(ordered) * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms, "
        f"max {ordered[-1] * 1000:.1f} ms; failed: {benign_failures or 'none'}"
    )
    crashed = any(code == "model_crashed" for _, _, code, _ in results)
    failed = p99 >= 1.0 or crashed or bool(benign_failures)
    print("verdict:", "FAIL" if failed else "ok (benign p99 < 1 s, the worker never died)")
    return 1 if failed else 0


def run_grammar(runtime: Path, quick: bool) -> int:
    """Start napllm-lmsp with TinyChat from `runtime` and run `measure_grammar`."""
    import os
    import subprocess
    import tempfile

    model = REPO / "models" / "tinychat" / "tiny-chat-q8_0.gguf"
    port = free_port()
    with tempfile.TemporaryDirectory() as workdir:
        token_file = Path(workdir) / "token"
        env = {**os.environ, "PYTHONPATH": str(runtime), "XDG_CONFIG_HOME": workdir}
        args = [
            sys.executable,
            "-m",
            "napllm.lmsp_service",
            "--model",
            str(model),
            "--model-id",
            "tinychat",
            "--port",
            str(port),
            "--token-file",
            str(token_file),
            "--n-ctx",
            "2048",
        ]
        process = subprocess.Popen(
            args, env=env, cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            base = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 120
            while True:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the service did not start")
                if token_file.exists():
                    token = token_file.read_text().strip()
                    try:
                        ready = httpx.get(
                            base + "/lmsp/v1/models",
                            timeout=2,
                            headers={"Authorization": f"Bearer {token}"},
                        )
                        if ready.status_code == 200:
                            break
                    except httpx.TransportError:
                        pass
                time.sleep(0.2)
            print(f"engine: TinyChat in napllm-lmsp from {runtime.name}/ on 127.0.0.1:{port}")
            return asyncio.run(measure_grammar(base, token, "tinychat", quick))
        finally:
            process.terminate()
            process.wait(30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=40, help="characters of the hostile string")
    parser.add_argument("--hostile", type=int, default=4, help="hostile clients at once")
    parser.add_argument("--rounds", type=int, default=2, help="requests per hostile client")
    parser.add_argument("--quick", action="store_true", help="one round of two hostile clients")
    parser.add_argument("--grammar", action="store_true", help="grammar cost, with TinyChat")
    parser.add_argument("--runtime", type=Path, default=REPO / "runtime", help="for --grammar")
    args = parser.parse_args()
    if args.grammar:
        return run_grammar(args.runtime.resolve(), args.quick)
    if args.quick:
        args.hostile, args.rounds = 2, 1
    port = free_port()
    servers: list[uvicorn.Server] = []

    def serve() -> None:
        # Built on the server's thread: the service's SQLite store stays on one thread.
        service = LmspService(cast(Any, GrammarObeyingEngine(args.n)), ServiceConfig())
        config = uvicorn.Config(
            build_app(service, TOKEN), host="127.0.0.1", port=port, log_level="warning"
        )
        servers.append(uvicorn.Server(config))
        servers[0].run()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while not (servers and servers[0].started):
            if time.monotonic() > deadline or not thread.is_alive():
                raise RuntimeError("the service did not start")
            time.sleep(0.05)
        # Both schema workers started and imported their modules.
        warm = {
            "model": MODEL_ID,
            "input": hostile_bodies(args.n)[0]["input"],
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "w", "schema": {"type": "string"}},
            },
        }
        headers = {"Authorization": f"Bearer {TOKEN}"}
        for _ in range(2):
            httpx.post(base + "/lmsp/v1/responses", json=warm, headers=headers, timeout=120)
        print(
            "engine: a double that writes N a's whatever the grammar (no model); "
            f"service: napllm-lmsp's application under uvicorn on 127.0.0.1:{port}"
        )
        return asyncio.run(measure(base, TOKEN, args.n, args.hostile, args.rounds))
    finally:
        if servers:
            servers[0].should_exit = True
        thread.join(30)


if __name__ == "__main__":
    raise SystemExit(main())
