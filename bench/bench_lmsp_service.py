"""Benchmark: napllm's LMSP service against llama-cpp-python's own server.

Starts both servers on free 127.0.0.1 ports with the same GGUF model (TinyChat
by default) and the same context size, then runs N concurrent streaming
clients (1, 4 and 16 by default), each sending a bounded number of requests
with the same chat prompt, greedy, generating exactly `--tokens` tokens (the
end-of-generation tokens are suppressed: `extensions.min_output_tokens` on
LMSP, `logit_bias` on the OpenAI-compatible server). Each of `--rounds`
rounds runs every level against both servers, the two one right after the
other and in alternating order (ABBA), so a change in machine load affects
both alike; a level's figures pool its rounds. It prints, per concurrency
level and server:

- throughput: generated tokens per second of wall time for the whole level;
- first-event latency: request sent -> first SSE event (median and p95);
- first-token latency: request sent -> first text delta (median and p95);

and the ratio napllm / llama-cpp-python for each figure (throughput: higher
is better; latencies: lower is better), with the model-size caveat: on a
small model that makes thousands of tokens per second (TinyChat, 1.2 MB),
the per-chunk cost of each server's HTTP streaming dominates, not inference,
so the ratio says how lean the streaming is, not how fast a real model is
served. It also checks that every response of both servers starts with
TinyChat's answer to the prompt (exit status 1 otherwise).

Usage: python bench/bench_lmsp_service.py [--model PATH] [--tokens 200]
       [--requests-per-client 2] [--levels 1 4 16] [--rounds 3] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from napllm.providers.sse import SseParser

REPO = Path(__file__).resolve().parents[1]
DEFAULT_MODEL = REPO / "models" / "tinychat" / "tiny-chat-q8_0.gguf"
PROMPT = "Hello!"
#: TinyChat's greedy answer to PROMPT (models/tinychat/README.md).
ANSWER = "Hello! How can I help you today?"
MODEL_ID = "bench"


@dataclass
class Sample:
    """One request: seconds to the first event and to the first text, and tokens made."""

    first_event_s: float
    first_token_s: float
    tokens: int
    text: str = ""


@dataclass
class LevelResult:
    """All requests of one concurrency level against one server."""

    wall_s: float
    samples: list[Sample] = field(default_factory=list)

    def add(self, other: LevelResult) -> None:
        """Pool another round of the same level and server into this one."""
        self.wall_s += other.wall_s
        self.samples += other.samples

    @property
    def tokens_per_s(self) -> float:
        return sum(s.tokens for s in self.samples) / self.wall_s

    def latency(self, attribute: str, quantile: float) -> float:
        values = sorted(getattr(s, attribute) for s in self.samples)
        if quantile == 0.5:
            return statistics.median(values)
        return values[min(len(values) - 1, round(quantile * (len(values) - 1)))]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_ready(url: str, headers: dict[str, str], process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited early ({url})")
        try:
            if httpx.get(url, headers=headers, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"server not ready: {url}")


def stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


async def lmsp_request(client: httpx.AsyncClient, tokens: int) -> Sample:
    body = {
        "model": MODEL_ID,
        "input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": PROMPT}]}
        ],
        "stream": True,
        "temperature": 0,
        "max_output_tokens": tokens,
        "extensions": {"min_output_tokens": tokens},
    }
    start = time.perf_counter()
    first_event = first_token = None
    produced = 0
    text: list[str] = []
    async with client.stream("POST", "/lmsp/v1/responses", json=body) as answer:
        answer.raise_for_status()
        parser = SseParser()
        async for chunk in answer.aiter_bytes():
            for event in parser.feed(chunk):
                now = time.perf_counter()
                first_event = first_event if first_event is not None else now
                if event.event == "response.output_text.delta":
                    first_token = first_token if first_token is not None else now
                    text.append(json.loads(event.data)["delta"])
                if event.event in ("response.completed", "response.incomplete"):
                    produced = json.loads(event.data)["usage"]["output_tokens"]
    if first_event is None or first_token is None:
        raise RuntimeError("LMSP stream without text")
    return Sample(first_event - start, first_token - start, produced, "".join(text))


async def openai_request(client: httpx.AsyncClient, tokens: int, eog_ids: list[int]) -> Sample:
    body = {
        "model": MODEL_ID,
        "messages": [{"role": "user", "content": PROMPT}],
        "stream": True,
        "temperature": 0,
        "max_tokens": tokens,
        "logit_bias": {str(token): -100 for token in eog_ids},
    }
    start = time.perf_counter()
    first_event = first_token = None
    finish = None
    text: list[str] = []
    async with client.stream("POST", "/v1/chat/completions", json=body) as answer:
        answer.raise_for_status()
        parser = SseParser()
        async for chunk in answer.aiter_bytes():
            for event in parser.feed(chunk):
                now = time.perf_counter()
                first_event = first_event if first_event is not None else now
                if event.data == "[DONE]":
                    continue
                choice = json.loads(event.data)["choices"][0]
                if choice["delta"].get("content"):
                    first_token = first_token if first_token is not None else now
                    text.append(choice["delta"]["content"])
                finish = choice.get("finish_reason") or finish
    if first_event is None or first_token is None or finish != "length":
        raise RuntimeError("chat completion stream did not run to the token limit")
    # finish_reason "length" means exactly max_tokens were generated.
    return Sample(first_event - start, first_token - start, tokens, "".join(text))


async def run_level(
    make_request: Callable[[httpx.AsyncClient], Awaitable[Sample]],
    base_url: str,
    headers: dict[str, str],
    concurrency: int,
    per_client: int,
) -> LevelResult:
    limits = httpx.Limits(max_connections=concurrency + 2)
    async with httpx.AsyncClient(
        base_url=base_url, headers=headers, timeout=300, limits=limits
    ) as client:
        await make_request(client)  # warm-up, not measured
        samples: list[Sample] = []

        async def one_client() -> None:
            for _ in range(per_client):
                samples.append(await make_request(client))

        start = time.perf_counter()
        await asyncio.gather(*(one_client() for _ in range(concurrency)))
        return LevelResult(time.perf_counter() - start, samples)


def eog_token_ids(model: Path) -> list[int]:
    import llama_cpp

    llama = llama_cpp.Llama(model_path=str(model), n_ctx=64, verbose=False)
    vocab = llama._model.vocab
    ids = [t for t in range(llama.n_vocab()) if llama_cpp.llama_vocab_is_eog(vocab, t)]
    llama.close()
    return ids


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--tokens", type=int, default=200, help="tokens per response")
    parser.add_argument("--requests-per-client", type=int, default=2)
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--n-ctx", type=int, default=512)
    parser.add_argument("--n-threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds per level")
    parser.add_argument(
        "--quick", action="store_true", help="a short run that checks the benchmark works"
    )
    args = parser.parse_args()
    if args.quick:
        args.tokens, args.requests_per_client, args.levels, args.rounds = 20, 1, [1, 2], 1

    eog_ids = eog_token_ids(args.model)
    results: dict[tuple[str, int], LevelResult] = {}
    with tempfile.TemporaryDirectory() as tmp:
        token_file = Path(tmp) / "token"
        ours_port, theirs_port = free_port(), free_port()
        ours = subprocess.Popen(
            [
                sys.executable, "-m", "napllm.lmsp_service",
                "--model", str(args.model), "--model-id", MODEL_ID,
                "--port", str(ours_port), "--token-file", str(token_file),
                "--n-ctx", str(args.n_ctx), "--n-threads", str(args.n_threads),
            ],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env={**os.environ, "XDG_CONFIG_HOME": tmp},
        )  # fmt: skip
        theirs = subprocess.Popen(
            [
                sys.executable, "-m", "llama_cpp.server",
                "--model", str(args.model), "--model_alias", MODEL_ID,
                "--host", "127.0.0.1", "--port", str(theirs_port),
                "--n_ctx", str(args.n_ctx), "--n_threads", str(args.n_threads),
                # By default a new request interrupts the running stream;
                # queue them instead, as napllm-lmsp does.
                "--interrupt_requests", "False",
            ],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            ours_url = f"http://127.0.0.1:{ours_port}"
            theirs_url = f"http://127.0.0.1:{theirs_port}"
            # The file may exist before its token is written: wait for the text.
            while not (token_file.exists() and token_file.read_text().strip()):
                if ours.poll() is not None:
                    raise RuntimeError("napllm-lmsp exited early")
                time.sleep(0.05)
            ours_headers = {
                "Authorization": f"Bearer {token_file.read_text().strip()}",
                "LMSP-Version": "1.0",
            }
            wait_ready(ours_url + "/lmsp/v1/models", ours_headers, ours)
            wait_ready(theirs_url + "/v1/models", {}, theirs)
            runners = {
                "napllm": lambda level: run_level(
                    lambda c: lmsp_request(c, args.tokens),
                    ours_url,
                    ours_headers,
                    level,
                    args.requests_per_client,
                ),
                "llama-cpp": lambda level: run_level(
                    lambda c: openai_request(c, args.tokens, eog_ids),
                    theirs_url,
                    {},
                    level,
                    args.requests_per_client,
                ),
            }
            order = ["napllm", "llama-cpp"]
            for _ in range(args.rounds):
                for level in args.levels:
                    for name in order:
                        result = asyncio.run(runners[name](level))
                        if (name, level) in results:
                            results[(name, level)].add(result)
                        else:
                            results[(name, level)] = result
                    order.reverse()
        finally:
            stop(ours)
            stop(theirs)

    size_mb = args.model.stat().st_size / 1e6
    print(
        f"model {args.model.name} ({size_mb:.1f} MB), prompt {PROMPT!r}, {args.tokens} tokens "
        f"per response, {args.requests_per_client} requests per client, {args.rounds} "
        f"alternating round(s), n_ctx {args.n_ctx}, {args.n_threads} threads, streaming, loopback"
    )
    header = (
        f"{'clients':>7} | {'server':<9} | {'tok/s':>8} | {'1st event p50/p95 ms':>20} | "
        f"{'1st token p50/p95 ms':>20}"
    )
    print(header)
    print("-" * len(header))
    for level in args.levels:
        for name in ("napllm", "llama-cpp"):
            r = results[(name, level)]
            print(
                f"{level:>7} | {name:<9} | {r.tokens_per_s:>8.0f} | "
                f"{r.latency('first_event_s', 0.5) * 1000:>9.1f} / "
                f"{r.latency('first_event_s', 0.95) * 1000:>8.1f} | "
                f"{r.latency('first_token_s', 0.5) * 1000:>9.1f} / "
                f"{r.latency('first_token_s', 0.95) * 1000:>8.1f}"
            )
        ours_r, theirs_r = results[("napllm", level)], results[("llama-cpp", level)]
        print(
            f"{level:>7} | {'ratio':<9} | {ours_r.tokens_per_s / theirs_r.tokens_per_s:>8.2f} | "
            f"{ours_r.latency('first_event_s', 0.5) / theirs_r.latency('first_event_s', 0.5):>9.2f}"
            f" / {'':>8} | "
            f"{ours_r.latency('first_token_s', 0.5) / theirs_r.latency('first_token_s', 0.5):>9.2f}"
            f" / {'':>8}"
        )
    print("ratio = napllm / llama-cpp-python (tok/s: higher is better; latency: lower is better)")
    fastest = max(r.tokens_per_s for r in results.values())
    print(
        f"caveat: a {size_mb:.1f} MB model at up to {fastest:,.0f} tokens/s: the servers' "
        "per-chunk HTTP streaming cost dominates these ratios, not inference; with a model "
        "that makes tens of tokens per second they tend to 1."
    )
    # Past the model's own answer the forced tokens run free with small
    # argmax margins (a server's prompt-cache reuse can change them), so
    # only the answer itself is compared.
    texts = [(n, s.text) for (n, _), r in results.items() for s in r.samples]
    wrong = [n for n, text in texts if not text.startswith(ANSWER)]
    same = not wrong
    print(
        f"every response of both servers starts with the model's answer {ANSWER!r}: "
        f"{'yes' if same else f'NO ({len(wrong)} of {len(texts)})'}"
    )
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
