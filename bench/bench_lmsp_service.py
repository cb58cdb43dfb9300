"""Benchmark: napllm-lmsp against llama-server, llama-cpp-python's server and the engine alone.

What runs
- The model: a llama of realistic size with random weights (115 M
  parameters: 16 layers of width 768, feed-forward 2048, 12 heads; Q8_0,
  about 122 MB) and TinyChat's tokenizer and chat template, written by this
  script with the `gguf` package into the cache folder (it is not
  committed); `--model` uses another GGUF instead.
- The servers, each started on a free 127.0.0.1 port with the same model,
  context per request (`--n-ctx`) and CPU threads (`--n-threads`, for
  generation and prompts alike):
  - `napllm-lmsp` (this repository) with `--slots` (default: its own default);
  - `llama-server` (llama.cpp's C++ server) with its default slot count;
  - `llama_cpp.server` (llama-cpp-python's server; one request at a time,
    `--interrupt_requests False` so that requests queue).
  llama.cpp's extra CPU buffer types (weight repacking) are used by all of
  them or by none (`--extra-bufts`, default off: some CPUs crash with them;
  napllm-lmsp gets `--extra-bufts on` or `off` to match, so its own
  fallback cannot change the comparison). Models are loaded only through
  napllm's `llama_load` (its model parameters), and only in child
  processes, except the vocabulary read for the end-of-generation ids
  (nothing is decoded there); `llama_cpp.server` runs with the model
  parameters patched by `llama_load.extra_bufts_off`.
- The engine alone: `llama-bench -p 0 -n TOKENS` (one stream, the same
  threads), the upper bound of one stream's tokens per second.

Where llama-server and llama-bench come from
- `--llama-server PATH` / `--llama-bench PATH`, else the build in the cache
  folder (`~/.cache/napllm-bench/llama.cpp-VERSION/build/bin`, or under
  `$XDG_CACHE_HOME`), else, with `--build`, they are built there from the
  llama.cpp that the installed llama-cpp-python vendors: `pip download
  --no-deps --no-binary :all: llama-cpp-python==VERSION` (its sdist holds
  the llama.cpp sources), then CMake (Release, static, no web UI, no
  downloads; several minutes on two cores). Without them those rows are
  skipped with a message. `--quick` never builds.

How it measures
- N concurrent streaming clients (1, 4 and 16 by default), each sending
  `--requests-per-client` requests with the same chat prompt, greedy,
  generating exactly `--tokens` tokens (end-of-generation tokens are
  suppressed: `extensions.min_output_tokens` on LMSP, `logit_bias` on the
  OpenAI-compatible servers). Within each of `--rounds` rounds every level
  runs against every server one right after the other, in an order that
  rotates from level to level and round to round, so a change in machine
  load affects all alike; a level's figures pool its rounds.
- Per level and server: tokens per second of wall time for the whole
  level; first event and first token (request sent -> first SSE event / first
  text delta), median and p95; connections dropped (a request that failed
  or ended early).
- CPU time per generated token of each server's processes (from /proc:
  napllm-lmsp's HTTP process and model worker together), side by side
  with llama-server's (target: within 10 %).
- Prompt reuse: fresh servers with a longer context get, per round, the
  first turn of a conversation with a history of `--reuse-exchanges`
  exchanges (about 100 tokens each, 15 by default: about 1,500 tokens)
  and then its second turn (the first answer and a new question added);
  the figure is the second turn's first-token median over the first
  turn's (target <= 0.2x: the second turn must not read the history
  again). Each round's conversation has its own first ids.
  `--no-prompt-reuse` starts napllm-lmsp with that switch (the figures
  of every prompt decoded in full, for comparison).
- Ratios to llama-server (tokens/s, first-token median) and to the engine,
  then the targets: at 1 client napllm-lmsp >= 0.95x llama-server and
  >= 0.95x the engine; at 4 and 16 clients >= 0.95x llama-server's tokens/s
  and a first-token median within 1.5x of llama-server's; no dropped
  connection; every napllm-lmsp answer identical to its answer with one
  client (the one-at-a-time path). Each is printed as met or missed by how
  much. Exit status 1 when the answers differ or a napllm-lmsp connection
  dropped; the timing targets are reported, not enforced (the figures
  depend on the machine and its load, which the report states).

`--quick` checks that all of this works: a 2-layer random model written to
a temporary folder, 16 tokens, 1 and 2 clients, one round, a history of 2
exchanges for the reuse figure, no build.

Usage: python bench/bench_lmsp_service.py [--quick] [--build] [--model PATH]
       [--tokens 128] [--levels 1 4 16] [--requests-per-client 2] [--rounds 2]
       [--n-ctx 512] [--n-threads 1] [--slots N] [--extra-bufts]
       [--llama-server PATH] [--llama-bench PATH] [--skip-llama-cpp-python]
       [--reuse-exchanges 15] [--no-prompt-reuse]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

import napllm
from napllm.lmsp_service.llama_load import model_params
from napllm.providers.sse import SseParser

REPO = Path(__file__).resolve().parents[1]
TOKENIZER_MODEL = REPO / "models" / "tinychat" / "tiny-chat-q8_0.gguf"
PROMPT = "Hello!"
MODEL_ID = "bench"
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "napllm-bench"

#: Shapes of the random-weight models: the realistic one and the quick one.
REALISTIC = {"dim": 768, "layers": 16, "ffn": 2048, "heads": 12}
QUICK = {"dim": 128, "layers": 2, "ffn": 384, "heads": 4}

NAPLLM, LLAMA_SERVER, LLAMA_CPP_PY = "napllm-lmsp", "llama-server", "llama_cpp.server"


# -- the model ---------------------------------------------------------------------------------


def write_random_model(path: Path, shape: dict[str, int], seed: int = 0) -> Path:
    """Write a llama GGUF with random Q8_0 weights and TinyChat's tokenizer to `path`.

    `shape`: `dim`, `layers`, `ffn`, `heads`. Returns `path`; a file already
    there is reused (the weights depend only on `shape` and `seed`).
    """
    if path.is_file():
        return path
    import gguf
    import numpy as np

    reader = gguf.GGUFReader(TOKENIZER_MODEL)

    def field_value(key: str) -> Any:
        return reader.fields[key].contents()

    tokens = field_value("tokenizer.ggml.tokens")
    dim, layers, ffn, heads = shape["dim"], shape["layers"], shape["ffn"], shape["heads"]
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    writer = gguf.GGUFWriter(str(partial), "llama")
    writer.add_name("napllm-bench-random")
    writer.add_context_length(4096)
    writer.add_embedding_length(dim)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(heads)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_rope_dimension_count(dim // heads)
    writer.add_vocab_size(len(tokens))
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    writer.add_tokenizer_model(field_value("tokenizer.ggml.model"))
    writer.add_tokenizer_pre(field_value("tokenizer.ggml.pre"))
    writer.add_token_list(tokens)
    writer.add_token_types(field_value("tokenizer.ggml.token_type"))
    writer.add_token_merges(field_value("tokenizer.ggml.merges"))
    writer.add_bos_token_id(field_value("tokenizer.ggml.bos_token_id"))
    writer.add_eos_token_id(field_value("tokenizer.ggml.eos_token_id"))
    writer.add_eot_token_id(field_value("tokenizer.ggml.eot_token_id"))
    writer.add_pad_token_id(field_value("tokenizer.ggml.padding_token_id"))
    writer.add_add_bos_token(False)
    writer.add_add_eos_token(False)
    writer.add_chat_template(field_value("tokenizer.chat_template"))

    rng = np.random.default_rng(seed)

    def matrix(rows: int, cols: int) -> None:
        # (rows, cols) in numpy order is a GGUF tensor of cols inputs, rows outputs.
        weights = rng.standard_normal((rows, cols), dtype=np.float32) / np.sqrt(cols)
        return gguf.quants.quantize(weights, gguf.GGMLQuantizationType.Q8_0)

    q8 = gguf.GGMLQuantizationType.Q8_0
    writer.add_tensor("token_embd.weight", matrix(len(tokens), dim), raw_dtype=q8)
    writer.add_tensor("output_norm.weight", np.ones(dim, dtype=np.float32))
    writer.add_tensor("output.weight", matrix(len(tokens), dim), raw_dtype=q8)
    for i in range(layers):
        block = f"blk.{i}."
        writer.add_tensor(block + "attn_norm.weight", np.ones(dim, dtype=np.float32))
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            writer.add_tensor(block + name + ".weight", matrix(dim, dim), raw_dtype=q8)
        writer.add_tensor(block + "ffn_norm.weight", np.ones(dim, dtype=np.float32))
        writer.add_tensor(block + "ffn_gate.weight", matrix(ffn, dim), raw_dtype=q8)
        writer.add_tensor(block + "ffn_up.weight", matrix(ffn, dim), raw_dtype=q8)
        writer.add_tensor(block + "ffn_down.weight", matrix(dim, ffn), raw_dtype=q8)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    partial.replace(path)
    return path


def model_parameters(shape: dict[str, int], n_vocab: int) -> int:
    """Weights of a random model of `shape` (norms not counted)."""
    dim, ffn = shape["dim"], shape["ffn"]
    return shape["layers"] * (4 * dim * dim + 3 * dim * ffn) + 2 * n_vocab * dim


def eog_token_ids(model: Path, extra_bufts: bool) -> list[int]:
    """End-of-generation token ids of `model` (its vocabulary only is loaded)."""
    import logging

    import llama_cpp

    logging.getLogger("llama-cpp-python").setLevel(logging.ERROR)  # llama.cpp's own log
    params = model_params(extra_bufts=extra_bufts)
    params.vocab_only = True
    handle = llama_cpp.llama_model_load_from_file(str(model).encode(), params)
    if not handle:
        raise RuntimeError(f"cannot load {model}")
    try:
        vocab = llama_cpp.llama_model_get_vocab(handle)
        n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
        return [t for t in range(n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, t)]
    finally:
        llama_cpp.llama_model_free(handle)


# -- llama.cpp's own tools ---------------------------------------------------------------------


def llama_cpp_version() -> str:
    """The installed llama-cpp-python's version (its sdist vendors the llama.cpp to build)."""
    import llama_cpp

    return str(llama_cpp.__version__)


def build_dir() -> Path:
    return CACHE / f"llama.cpp-{llama_cpp_version()}" / "build"


def find_tool(name: str, given: Path | None) -> Path | None:
    """`given`, else the cached build's binary, else `None`."""
    if given is not None:
        return given if given.is_file() else None
    candidate = build_dir() / "bin" / name
    return candidate if candidate.is_file() else None


def build_tools() -> str | None:
    """Build llama-server and llama-bench from llama-cpp-python's sdist; a reason on failure."""
    if shutil.which("cmake") is None:
        return "cmake is not installed"
    version = llama_cpp_version()
    root = CACHE / f"llama.cpp-{version}"
    source = root / "src"
    if not (source / "vendor" / "llama.cpp" / "CMakeLists.txt").is_file():
        downloads = root / "sdist"
        downloads.mkdir(parents=True, exist_ok=True)
        got = subprocess.run(
            [
                sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                "--dest", str(downloads), f"llama-cpp-python=={version}",
            ],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        archives = sorted(downloads.glob("llama_cpp_python-*.tar.gz"))
        if got.returncode != 0 or not archives:
            return f"pip download of the llama-cpp-python {version} sdist failed"
        with tarfile.open(archives[-1]) as archive:
            unpacked = root / "unpacked"
            archive.extractall(unpacked, filter="data")
        [top] = list(unpacked.iterdir())
        top.replace(source)
        shutil.rmtree(unpacked)
    llama = source / "vendor" / "llama.cpp"
    print(f"building llama-server and llama-bench from {llama} (several minutes)", flush=True)
    configure = [
        "cmake", "-S", str(llama), "-B", str(build_dir()), "-DCMAKE_BUILD_TYPE=Release",
        "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
        "-DLLAMA_BUILD_TOOLS=ON", "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_UI=OFF",
        "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_CURL=OFF",
    ]  # fmt: skip
    build = [
        "cmake", "--build", str(build_dir()), "--config", "Release", "-j", str(os.cpu_count() or 1),
        "--target", "llama-server", "llama-bench",
    ]  # fmt: skip
    for command in (configure, build):
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            return f"the build failed: {done.stderr.strip()[-500:]}"
    return None


def engine_tokens_per_s(
    bench: Path, model: Path, tokens: int, threads: int, extra_bufts: bool
) -> float:
    """One stream's generation speed by `llama-bench` (tokens/s, mean of its repetitions)."""
    done = subprocess.run(
        [
            str(bench), "-m", str(model), "-p", "0", "-n", str(tokens), "-t", str(threads),
            "-r", "3", "-o", "json", "--repack", "1" if extra_bufts else "0",
        ],
        capture_output=True, text=True, check=True, timeout=600,
    )  # fmt: skip
    [row] = json.loads(done.stdout)
    return float(row["avg_ts"])


# -- clients -----------------------------------------------------------------------------------


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
    dropped: int = 0
    cpu_s: float = float("nan")  # CPU time of the server's processes (Linux)

    def add(self, other: LevelResult) -> None:
        """Pool another round of the same level and server into this one."""
        self.wall_s += other.wall_s
        self.samples += other.samples
        self.dropped += other.dropped
        self.cpu_s += other.cpu_s

    @property
    def cpu_ms_per_token(self) -> float:
        return 1000 * self.cpu_s / max(1, sum(s.tokens for s in self.samples))

    @property
    def tokens_per_s(self) -> float:
        return share(sum(s.tokens for s in self.samples), self.wall_s)

    def latency(self, attribute: str, quantile: float) -> float:
        values = sorted(getattr(s, attribute) for s in self.samples)
        if not values:
            return float("nan")
        if quantile == 0.5:
            return statistics.median(values)
        return values[min(len(values) - 1, round(quantile * (len(values) - 1)))]


def lmsp_items(messages: list[dict[str, str]]) -> list[dict[str, Any]]:
    """Chat `messages` ({"role", "content"}) as LMSP message input items."""
    return [
        {"type": "message", "role": m["role"],
         "content": [{"type": "output_text" if m["role"] == "assistant" else "input_text",
                      "text": m["content"]}]}
        for m in messages
    ]  # fmt: skip


async def lmsp_request(
    client: httpx.AsyncClient, tokens: int, messages: list[dict[str, str]] | None = None
) -> Sample:
    body = {
        "model": MODEL_ID,
        "input": lmsp_items(messages or [{"role": "user", "content": PROMPT}]),
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
    if first_event is None or first_token is None or produced != tokens:
        raise RuntimeError("LMSP stream ended early")
    return Sample(first_event - start, first_token - start, produced, "".join(text))


async def openai_request(
    client: httpx.AsyncClient,
    tokens: int,
    eog_ids: list[int],
    messages: list[dict[str, str]] | None = None,
) -> Sample:
    body = {
        "model": MODEL_ID,
        "messages": messages or [{"role": "user", "content": PROMPT}],
        "stream": True,
        "temperature": 0,
        "max_tokens": tokens,
        "logit_bias": {str(token): -100 for token in eog_ids},
        # Greedy and nothing else, as napllm-lmsp samples at temperature 0
        # (llama_cpp.server's default repeat penalty is 1.1).
        "repeat_penalty": 1.0,
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
                choices = json.loads(event.data).get("choices") or [{}]
                delta = choices[0].get("delta") or {}
                if delta.get("content"):
                    first_token = first_token if first_token is not None else now
                    text.append(delta["content"])
                finish = choices[0].get("finish_reason") or finish
    if first_event is None or first_token is None or finish != "length":
        raise RuntimeError("chat completion stream did not run to the token limit")
    # finish_reason "length" means exactly max_tokens were generated.
    return Sample(first_event - start, first_token - start, tokens, "".join(text))


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid` and its descendants (Linux; NaN elsewhere).

    Unlike wall time on a shared machine, this is what the server itself
    spent, so it shows where the cost per token goes even under load.
    """
    total, stack = 0.0, [pid]
    while stack:
        current = stack.pop()
        try:
            fields = Path(f"/proc/{current}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
            tasks = list(Path(f"/proc/{current}/task").iterdir())
        except (OSError, ValueError, IndexError):
            if current == pid:
                return float("nan")  # no /proc, or the server is gone
            continue  # a child that ended meanwhile
        for task in tasks:
            try:
                stack += [int(child) for child in (task / "children").read_text().split()]
            except (OSError, ValueError):
                continue  # a thread that ended while it was read: it has no children
    return total


async def run_level(
    make_request: Callable[[httpx.AsyncClient], Awaitable[Sample]],
    base_url: str,
    headers: dict[str, str],
    concurrency: int,
    per_client: int,
    pid: int,
) -> LevelResult:
    limits = httpx.Limits(max_connections=concurrency + 2)
    async with httpx.AsyncClient(
        base_url=base_url, headers=headers, timeout=600, limits=limits
    ) as client:
        for _ in range(2):  # warm-up (first-request costs of each server), not measured
            await make_request(client)
        result = LevelResult(0.0)

        async def one_client() -> None:
            for _ in range(per_client):
                try:
                    result.samples.append(await make_request(client))
                except (httpx.HTTPError, RuntimeError):
                    result.dropped += 1

        cpu_before = cpu_seconds(pid)
        start = time.perf_counter()
        await asyncio.gather(*(one_client() for _ in range(concurrency)))
        result.wall_s = time.perf_counter() - start
        result.cpu_s = cpu_seconds(pid) - cpu_before
        return result


# -- servers -----------------------------------------------------------------------------------

#: llama_cpp.server with llama.cpp's model parameters set like the other servers'
#: (its command line has no switch for the extra buffer types): off through
#: the product's own `llama_load.extra_bufts_off`, on as llama.cpp's default.
LLAMA_CPP_PY_LAUNCHER = """
import contextlib, runpy, sys
from napllm.lmsp_service.llama_load import extra_bufts_off
extra = sys.argv.pop(1) == "1"
sys.argv[0] = "llama_cpp.server"
with contextlib.nullcontext() if extra else extra_bufts_off():
    runpy.run_module("llama_cpp.server", run_name="__main__", alter_sys=True)
"""

#: The folder napllm is imported from, for the launcher's child process.
NAPLLM_ROOT = str(Path(napllm.__file__).resolve().parents[1])


@dataclass
class Server:
    """A started server: its name, URL, headers, process and request maker."""

    name: str
    url: str
    headers: dict[str, str]
    process: subprocess.Popen[bytes]
    request: Callable[[httpx.AsyncClient], Awaitable[Sample]]
    note: str = ""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_ready(url: str, headers: dict[str, str], process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited early ({url}, status {process.returncode})")
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


def start_napllm(args: argparse.Namespace, tmp: Path) -> Server:
    token_file = tmp / "token"
    port = free_port()
    command = [
        sys.executable, "-m", "napllm.lmsp_service", "--model", str(args.model),
        "--model-id", MODEL_ID, "--port", str(port), "--token-file", str(token_file),
        "--n-ctx", str(args.n_ctx), "--n-threads", str(args.n_threads),
        "--extra-bufts", "on" if args.extra_bufts else "off",
    ]  # fmt: skip
    if args.slots is not None:
        command += ["--slots", str(args.slots)]
    if not args.prompt_reuse:
        command.append("--no-prompt-reuse")
    process = subprocess.Popen(
        command,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "XDG_CONFIG_HOME": str(tmp)},
    )
    # The file may exist before its token is written: wait for the text.
    while not (token_file.exists() and token_file.read_text().strip()):
        if process.poll() is not None:
            raise RuntimeError("napllm-lmsp exited early")
        time.sleep(0.05)
    headers = {"Authorization": f"Bearer {token_file.read_text().strip()}", "LMSP-Version": "1.0"}
    url = f"http://127.0.0.1:{port}"
    wait_ready(url + "/lmsp/v1/models", headers, process)
    return Server(NAPLLM, url, headers, process, lambda c: lmsp_request(c, args.tokens))


def start_llama_server(args: argparse.Namespace, binary: Path, eog: list[int]) -> Server:
    port = free_port()
    # Its context is shared by its slots: the default slot count (4) times
    # the per-request context, as napllm-lmsp's KV cache.
    slots = 4
    command = [
        str(binary), "-m", str(args.model), "--host", "127.0.0.1", "--port", str(port),
        "-c", str(args.n_ctx * slots), "-t", str(args.n_threads), "-tb", str(args.n_threads),
        "-a", MODEL_ID, "--no-webui",
    ]  # fmt: skip
    if not args.extra_bufts:
        command.append("--no-repack")
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    wait_ready(url + "/health", {}, process)
    props = httpx.get(url + "/props", timeout=10).json()
    note = f"{props.get('total_slots', '?')} slots"
    return Server(
        LLAMA_SERVER, url, {}, process, lambda c: openai_request(c, args.tokens, eog), note
    )


def start_llama_cpp_py(args: argparse.Namespace, eog: list[int]) -> Server:
    port = free_port()
    command = [
        sys.executable, "-c", LLAMA_CPP_PY_LAUNCHER, "1" if args.extra_bufts else "0",
        "--model", str(args.model), "--model_alias", MODEL_ID, "--host", "127.0.0.1",
        "--port", str(port), "--n_ctx", str(args.n_ctx), "--n_threads", str(args.n_threads),
        "--n_threads_batch", str(args.n_threads),
        # By default a new request interrupts the running stream; queue them instead.
        "--interrupt_requests", "False",
    ]  # fmt: skip
    path = os.pathsep.join(p for p in (NAPLLM_ROOT, os.environ.get("PYTHONPATH")) if p)
    process = subprocess.Popen(
        command,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": path},
    )
    url = f"http://127.0.0.1:{port}"
    wait_ready(url + "/v1/models", {}, process)
    return Server(
        LLAMA_CPP_PY, url, {}, process, lambda c: openai_request(c, args.tokens, eog), "1 slot"
    )


# -- prompt reuse ------------------------------------------------------------------------------

#: One earlier exchange of the reuse figure's history (about 100 tokens with
#: the template's markers; 15 of them make about 1,500).
NOTE = (
    "Here is a note about the garden: the tomatoes need water every morning, the roses "
    "want sun, and the old apple tree by the fence should be pruned before the first frost."
)


def history(exchanges: int, label: int) -> list[dict[str, str]]:
    """A conversation of `exchanges` user/assistant turns; `label` makes its first ids unique."""
    messages = [{"role": "system", "content": f"Conversation {label}. Keep the notes."}]
    for i in range(exchanges):
        messages += [
            {"role": "user", "content": f"Note {i}. {NOTE}"},
            {"role": "assistant", "content": f"Noted ({i})."},
        ]
    return messages


@dataclass
class ReuseResult:
    """First-token seconds of first and second turns over a long history, per round."""

    first: list[float] = field(default_factory=list)
    second: list[float] = field(default_factory=list)

    @property
    def ratio(self) -> float:
        if not self.first:
            return float("nan")
        return statistics.median(self.second) / statistics.median(self.first)


async def reuse_rounds(
    ask: Callable[[httpx.AsyncClient, list[dict[str, str]]], Awaitable[Sample]],
    server: Server,
    exchanges: int,
    rounds: int,
) -> ReuseResult:
    """Per round: a long history's first turn, then its second turn (the first answer added)."""
    result = ReuseResult()
    async with httpx.AsyncClient(base_url=server.url, headers=server.headers, timeout=600) as c:
        await ask(c, [{"role": "user", "content": PROMPT}])  # warm-up, not measured
        for label in range(rounds):
            messages = [*history(exchanges, label), {"role": "user", "content": "Hello!"}]
            first = await ask(c, messages)
            messages += [
                {"role": "assistant", "content": first.text},
                {"role": "user", "content": "Thanks!"},
            ]
            second = await ask(c, messages)
            result.first.append(first.first_token_s)
            result.second.append(second.first_token_s)
    return result


def run_reuse(
    args: argparse.Namespace, tmp: Path, server_bin: Path | None, eog: list[int]
) -> dict[str, ReuseResult]:
    """The prompt-reuse figure for napllm-lmsp and llama-server (fresh servers, longer context).

    A history of `args.reuse_exchanges` exchanges (about 100 tokens each),
    8 output tokens per turn; `args.rounds` conversations, each with its
    own first ids (nothing is shared between rounds).
    """
    exchanges = args.reuse_exchanges
    reuse_args = argparse.Namespace(
        **{**vars(args), "n_ctx": max(args.n_ctx, 128 * exchanges + 512)}
    )
    results: dict[str, ReuseResult] = {}
    tokens = 8
    starters: list[tuple[str, Callable[[], Server]]] = [
        (NAPLLM, lambda: start_napllm(reuse_args, tmp))
    ]
    if server_bin is not None:
        starters.append((LLAMA_SERVER, lambda: start_llama_server(reuse_args, server_bin, eog)))
    for name, start in starters:
        server = start()
        try:
            if name == NAPLLM:
                ask = lambda c, m: lmsp_request(c, tokens, m)  # noqa: E731
            else:
                ask = lambda c, m: openai_request(c, tokens, eog, m)  # noqa: E731
            results[name] = asyncio.run(reuse_rounds(ask, server, exchanges, args.rounds))
        finally:
            stop(server.process)
    return results


# -- report ------------------------------------------------------------------------------------


def number(value: float) -> str:
    """`value` with two decimals, or `n/a` when it was not measured (NaN)."""
    return "n/a" if value != value else f"{value:.2f}"


def share(value: float, reference: float | None) -> float:
    """`value / reference`, or NaN when the reference was not measured or is
    zero: a tiny model's server can finish a quick run inside one tick of the
    CPU clock, and a figure that was not measured is printed as `n/a`."""
    if reference is None or reference != reference or reference == 0:
        return float("nan")
    return value / reference


def verdict(value: float, target: float, higher_is_better: bool) -> str:
    if value != value:  # NaN: nothing measured
        return "not measured"
    if higher_is_better:
        met = value >= target
        gap = (target - value) / target
    else:
        met = value <= target
        gap = (value - target) / target
    return "met" if met else f"MISSED by {gap * 100:.0f} %"


def machine_line() -> str:
    cpu = "unknown CPU"
    with_path = Path("/proc/cpuinfo")
    if with_path.is_file():
        for line in with_path.read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    return (
        f"machine: {cpu}, {os.cpu_count()} logical CPUs, load average "
        f"{load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} (1/5/15 min)"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="a GGUF model (default: the random one)")
    parser.add_argument("--tokens", type=int, default=128, help="tokens per response")
    parser.add_argument("--requests-per-client", type=int, default=2)
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--n-ctx", type=int, default=512, help="context per request")
    parser.add_argument("--n-threads", type=int, default=1)
    parser.add_argument("--slots", type=int, help="napllm-lmsp --slots (default: its own)")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds per level")
    parser.add_argument("--extra-bufts", action="store_true", help="let llama.cpp repack weights")
    parser.add_argument("--llama-server", type=Path, help="a llama-server binary")
    parser.add_argument("--llama-bench", type=Path, help="a llama-bench binary")
    parser.add_argument("--build", action="store_true", help="build llama-server and llama-bench")
    parser.add_argument(
        "--skip-llama-cpp-python",
        action="store_true",
        help="leave llama_cpp.server out (it serves one request at a time: slow at 16 clients)",
    )
    parser.add_argument(
        "--no-prompt-reuse",
        dest="prompt_reuse",
        action="store_false",
        help="start napllm-lmsp with --no-prompt-reuse (every prompt decoded in full)",
    )
    parser.add_argument(
        "--reuse-exchanges",
        type=int,
        default=15,
        help="earlier exchanges in the prompt-reuse figure's history (about 100 tokens each)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="a short run that checks the benchmark works"
    )
    args = parser.parse_args()
    if args.quick:
        args.tokens, args.requests_per_client, args.levels, args.rounds = 16, 1, [1, 2], 1
        args.build, args.reuse_exchanges = False, 2

    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        shape = QUICK if args.quick else REALISTIC
        if args.model is None:
            folder = tmp if args.quick else CACHE
            name = "random-{dim}x{layers}-ffn{ffn}-q8_0.gguf".format(**shape)
            print(f"writing the random-weight model {folder / name} ...", flush=True)
            args.model = write_random_model(folder / name, shape)
            described = f"random weights, {model_parameters(shape, 1024) / 1e6:.0f} M parameters"
        else:
            described = "given model"
        return run(args, tmp, described)


def run(args: argparse.Namespace, tmp: Path, described: str) -> int:
    eog = eog_token_ids(args.model, args.extra_bufts)
    server_bin = find_tool("llama-server", args.llama_server)
    bench_bin = find_tool("llama-bench", args.llama_bench)
    if (server_bin is None or bench_bin is None) and args.build:
        reason = build_tools()
        if reason is not None:
            print(f"llama-server / llama-bench: not built: {reason}")
        server_bin = find_tool("llama-server", args.llama_server)
        bench_bin = find_tool("llama-bench", args.llama_bench)
    skipped: list[str] = []
    if server_bin is None:
        skipped.append(
            "llama-server: not found (give --llama-server PATH, or --build to build it "
            f"into {build_dir()})"
        )
    if bench_bin is None:
        skipped.append("llama-bench: not found (--llama-bench PATH or --build); no engine figure")

    engine = float("nan")
    if bench_bin is not None:
        try:
            engine = engine_tokens_per_s(
                bench_bin, args.model, args.tokens, args.n_threads, args.extra_bufts
            )
        except (subprocess.SubprocessError, ValueError, KeyError) as exc:
            skipped.append(f"llama-bench failed ({type(exc).__name__})")

    servers: list[Server] = []
    results: dict[tuple[str, int], LevelResult] = {}
    try:
        servers.append(start_napllm(args, tmp))
        if server_bin is not None:
            try:
                servers.append(start_llama_server(args, server_bin, eog))
            except RuntimeError as exc:
                skipped.append(f"llama-server: {exc}")
        if args.skip_llama_cpp_python:
            skipped.append("llama_cpp.server: left out (--skip-llama-cpp-python)")
        else:
            try:
                servers.append(start_llama_cpp_py(args, eog))
            except RuntimeError as exc:
                skipped.append(f"llama_cpp.server: {exc}")
        turn = 0
        for _ in range(args.rounds):
            for level in args.levels:
                order = servers[turn % len(servers) :] + servers[: turn % len(servers)]
                turn += 1
                for server in order:
                    result = asyncio.run(
                        run_level(
                            server.request,
                            server.url,
                            server.headers,
                            level,
                            args.requests_per_client,
                            server.process.pid,
                        )
                    )
                    key = (server.name, level)
                    if key in results:
                        results[key].add(result)
                    else:
                        results[key] = result
    finally:
        for server in servers:
            stop(server.process)
    reuse = run_reuse(args, tmp, server_bin, eog)

    return report(args, described, servers, results, engine, skipped, reuse)


def report(
    args: argparse.Namespace,
    described: str,
    servers: list[Server],
    results: dict[tuple[str, int], LevelResult],
    engine: float,
    skipped: list[str],
    reuse: dict[str, ReuseResult],
) -> int:
    size_mb = args.model.stat().st_size / 1e6
    print(
        f"model {args.model.name} ({size_mb:.0f} MB, {described}), prompt {PROMPT!r}, "
        f"{args.tokens} tokens per response, {args.requests_per_client} requests per client, "
        f"{args.rounds} alternating round(s), n_ctx {args.n_ctx} per request, "
        f"{args.n_threads} thread(s) per server, extra buffer types "
        f"{'on' if args.extra_bufts else 'off'}, streaming, loopback"
    )
    print(machine_line() + " (shared machines: figures vary from run to run)")
    for line in skipped:
        print("skipped: " + line)
    if engine == engine:
        print(f"engine alone (llama-bench, one stream of {args.tokens} tokens): {engine:.1f} tok/s")
    names = [s.name for s in servers]
    notes = {s.name: s.note for s in servers}
    header = (
        f"{'clients':>7} | {'server':<26} | {'tok/s':>7} | {'x llama-server':>14} | "
        f"{'x engine':>8} | {'CPU ms/tok':>10} | {'1st event p50 ms':>16} | "
        f"{'1st token p50 / p95 ms':>22} | dropped"
    )
    print(header)
    print("-" * len(header))
    for level in args.levels:
        reference = results.get((LLAMA_SERVER, level))
        for name in names:
            r = results[(name, level)]
            versus = share(r.tokens_per_s, reference.tokens_per_s if reference else None)
            label = f"{name} ({notes[name]})" if notes[name] else name
            print(
                f"{level:>7} | {label:<26} | {r.tokens_per_s:>7.1f} | {number(versus):>14} | "
                f"{number(share(r.tokens_per_s, engine)):>8} | {number(r.cpu_ms_per_token):>10} | "
                f"{r.latency('first_event_s', 0.5) * 1000:>16.1f} | "
                f"{r.latency('first_token_s', 0.5) * 1000:>10.1f} / "
                f"{r.latency('first_token_s', 0.95) * 1000:>9.1f} | {r.dropped}"
            )
    print(
        "x llama-server, x engine: tokens/s ratios (higher is better); CPU ms/tok: CPU time "
        "of the server's processes per generated token (all threads; napllm-lmsp: HTTP "
        "process + model worker)"
    )

    print("targets:")
    ok = True
    for level in args.levels:
        ours = results[(NAPLLM, level)]
        theirs = results.get((LLAMA_SERVER, level))
        ratio = share(ours.tokens_per_s, theirs.tokens_per_s if theirs else None)
        print(f"  {level} client(s): tok/s {number(ratio)}x llama-server (>= 0.95): "
              f"{verdict(ratio, 0.95, True)}")  # fmt: skip
        if level == 1:
            alone = share(ours.tokens_per_s, engine)
            print(
                f"  {level} client(s): tok/s {number(alone)}x the engine "
                f"(>= 0.95): {verdict(alone, 0.95, True)}"
            )
        first = share(
            ours.latency("first_token_s", 0.5),
            theirs.latency("first_token_s", 0.5) if theirs else None,
        )
        print(
            f"  {level} client(s): first token p50 {number(first)}x llama-server's (<= 1.5): "
            f"{verdict(first, 1.5, False)}"
        )
        cpu = share(ours.cpu_ms_per_token, theirs.cpu_ms_per_token if theirs else None)
        print(f"  {level} client(s): CPU ms/token {number(ours.cpu_ms_per_token)} vs "
              f"llama-server {number(theirs.cpu_ms_per_token if theirs else float('nan'))}, "
              f"{number(cpu)}x (<= 1.10): {verdict(cpu, 1.10, False)}")  # fmt: skip
        print(f"  {level} client(s): napllm-lmsp connections dropped: {ours.dropped}")
        ok = ok and ours.dropped == 0
    for name, figure in reuse.items():
        print(
            f"  prompt reuse, {name}: a history of {args.reuse_exchanges} exchanges (about "
            f"{args.reuse_exchanges * 100} tokens), second turn's first token "
            f"{statistics.median(figure.second) * 1000:.1f} ms vs the first turn's "
            f"{statistics.median(figure.first) * 1000:.1f} ms: {number(figure.ratio)}x"
            + (f" (<= 0.2): {verdict(figure.ratio, 0.2, False)}" if name == NAPLLM else "")
        )
    reference_text = next((s.text for s in results[(NAPLLM, args.levels[0])].samples), None)
    answers = [s.text for level in args.levels for s in results[(NAPLLM, level)].samples]
    differ = sum(text != reference_text for text in answers)
    print(
        f"napllm-lmsp answers identical to its answer with {args.levels[0]} client: "
        f"{'yes' if differ == 0 and reference_text else f'NO ({differ} of {len(answers)} differ)'}"
    )
    for name in names:
        if name == NAPLLM:
            continue
        same = sum(
            s.text == reference_text
            for level in args.levels
            for s in results[(name, level)].samples
        )
        total = sum(len(results[(name, level)].samples) for level in args.levels)
        print(f"{name} answers equal to napllm-lmsp's: {same} of {total}")
    return 0 if ok and differ == 0 and reference_text else 1


if __name__ == "__main__":
    sys.exit(main())
