"""Command line of the LMSP local model service: `napllm-lmsp` / `python -m napllm.lmsp_service`.

Usage::

    napllm-lmsp --model PATH.gguf [--host 127.0.0.1] [--port 11435]
                [--model-id ID] [--allow-origin ORIGIN ...] [--token-file PATH]
                [--retention-seconds N] [--n-ctx N] [--slots N] [--n-threads N]
                [--max-body-bytes N] [--send-timeout-seconds N]
                [--body-timeout-seconds N] [--cancel-grace-seconds N]
                [--generation-time-limit-seconds N]
                [--send-buffer-bytes N] [--store PATH]
                [--store-retention-seconds N] [--store-max-records N]
                [--store-max-bytes N] [--extra-bufts auto|on|off]
                [--no-prompt-reuse]

Rules
- Listens on 127.0.0.1 by default; the bearer token is created on the first
  start (auth.py) and printed once. The model id defaults to the GGUF file
  name without `.gguf`.
- Readiness: the service answers `GET /lmsp/v1/models` once it accepts
  connections (supervisors poll it with the token).
- Generation: up to `--slots` requests are decoded together in one batch
  (continuous batching, scheduler.py and batching.py), each with a context
  of `--n-ctx` tokens; further requests wait in arrival order (their
  `response.created` event is sent at once). A request whose prompt starts
  with the exact tokens a finished one left in a free slot decodes only
  the rest (prompt reuse, prompt_cache.py; `--no-prompt-reuse` turns it
  off); `usage.input_tokens_details.cached_tokens` says how many it reused.
- Stored responses and tasks persist in an SQLite file (store.py), by
  default `lmsp-store.sqlite3` beside the token file, within the
  `--store-*` retention and size limits.
- Streams: a send that blocks for `--send-timeout-seconds` ends the stream
  (the reader stopped reading); each connection's socket send buffer and
  write buffer are bounded by `--send-buffer-bytes`, so such a reader is
  noticed after a bounded amount of output, not after megabytes.
- Bounds on a generation: a cancelled one stops within a graph node of
  llama.cpp (its abort callback), and one that has run
  `--generation-time-limit-seconds` in the model worker ends there,
  keeping its output (`incomplete`, reason `max_generation_time`); a worker
  still running either `--cancel-grace-seconds` later is killed and
  restarted (scheduler.py, engine.py).
- Any CPU: with `--extra-bufts auto` (the default) a model worker that
  crashes with llama.cpp's CPU fast path on is restarted without it, and
  `GET /models` says so in the entry's `cpu_fast_path` (engine.py).
- Exit status 2 for bad arguments, 1 when the model or the token file cannot
  be used.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import socket
import sqlite3
import sys
from pathlib import Path

import uvicorn

from .app import build_app
from .auth import TokenFileError, default_token_path, load_or_create_token
from .engine import GENERATION_TIME_LIMIT_S, Engine
from .llama_load import EXTRA_BUFTS_CHOICES
from .service import LmspService, ServiceConfig
from .store import SqliteStore
from .worker import DEFAULT_SLOTS


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError("must be positive")
    return value


STORE_FILE_NAME = "lmsp-store.sqlite3"


def bounded_listener(host: str, port: int, send_buffer_bytes: int) -> socket.socket:
    """A listening TCP socket whose accepted connections get a bounded send buffer.

    Linux copies `SO_SNDBUF` from the listening socket to each accepted one
    (and turns off its automatic growth, which on loopback reaches
    megabytes), so a reader that stops reading blocks the service's sends
    after about `send_buffer_bytes` * 2 bytes: the send timeout can then
    end the stream. Raises `OSError` when the address cannot be used.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP explicitly: asyncio turns Nagle's algorithm off (TCP_NODELAY)
    # only on sockets whose `proto` says TCP, and a stream's small events
    # would otherwise wait for delayed acknowledgements (about 40 ms each).
    listener = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer_bytes)
        listener.bind((host, port))
        listener.listen(2048)
    except OSError:
        listener.close()
        raise
    return listener


def bound_write_buffer(config: uvicorn.Config, limit_bytes: int) -> None:
    """Make uvicorn pause writing (and so block a send) past `limit_bytes` per connection.

    uvicorn's HTTP protocol waits while its transport is paused; the
    transport pauses above its high-water mark (64 KiB by default). Loads
    `config` and wraps its HTTP protocol class.
    """
    if not config.loaded:
        config.load()
    base: type[asyncio.Protocol] = config.http_protocol_class

    class BoundedProtocol(base):  # type: ignore[misc,valid-type]
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)
            if isinstance(transport, asyncio.WriteTransport):
                transport.set_write_buffer_limits(high=limit_bytes)

    config.http_protocol_class = BoundedProtocol


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line described in the module docstring."""
    parser = argparse.ArgumentParser(
        prog="napllm-lmsp", description="Serve a GGUF model over LMSP 1.0 (napllm)."
    )
    parser.add_argument("--model", required=True, type=Path, help="GGUF model file")
    parser.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    parser.add_argument("--port", default=11435, type=int, help="listen port (default 11435)")
    parser.add_argument("--model-id", help="model id clients use (default: file name)")
    parser.add_argument(
        "--allow-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="web origin allowed by CORS, e.g. https://napllm.example (repeatable)",
    )
    parser.add_argument("--token-file", type=Path, help="bearer token file (created if absent)")
    parser.add_argument(
        "--retention-seconds",
        type=_positive_float,
        default=600.0,
        help="how long task events stay readable (default 600)",
    )
    parser.add_argument(
        "--send-timeout-seconds",
        type=_positive_float,
        default=30.0,
        help="end a stream whose reader stopped reading for this long (default 30)",
    )
    parser.add_argument(
        "--body-timeout-seconds",
        type=_positive_float,
        default=60.0,
        help="refuse a request body that takes longer to arrive (default 60)",
    )
    parser.add_argument(
        "--send-buffer-bytes",
        type=_positive_int,
        default=64 * 1024,
        help="socket send buffer and write buffer per connection (default 65536)",
    )
    parser.add_argument(
        "--store",
        type=Path,
        help="SQLite file of stored responses and tasks (default: next to the token file)",
    )
    parser.add_argument(
        "--store-retention-seconds",
        type=_positive_float,
        default=86400.0,
        help="how long stored responses and tasks are kept (default 86400)",
    )
    parser.add_argument(
        "--store-max-records",
        type=_positive_int,
        default=1000,
        help="stored responses (with their tasks) kept at most (default 1000)",
    )
    parser.add_argument(
        "--store-max-bytes",
        type=_positive_int,
        default=256 * 1024 * 1024,
        help="bytes of stored JSON kept at most (default 256 MiB)",
    )
    parser.add_argument(
        "--n-ctx",
        type=_positive_int,
        help="context window of one request in tokens (default: the model's trained context)",
    )
    parser.add_argument(
        "--slots",
        type=_positive_int,
        default=DEFAULT_SLOTS,
        help=f"requests decoded together; the KV cache holds slots * n-ctx tokens "
        f"(default {DEFAULT_SLOTS})",
    )
    parser.add_argument(
        "--n-threads",
        type=_positive_int,
        help="llama.cpp CPU threads, for single tokens and batches alike (default: half the "
        "usable CPUs for one stream, all of them for a batch)",
    )
    parser.add_argument(
        "--extra-bufts",
        choices=EXTRA_BUFTS_CHOICES,
        default="auto",
        help="llama.cpp's CPU fast path (extra buffer types: AMX, repacked weights): auto "
        "(on, turned off for good if the model worker crashes with it), on, or off "
        "(default auto)",
    )
    parser.add_argument(
        "--no-prompt-reuse",
        dest="prompt_reuse",
        action="store_false",
        help="decode every prompt in full instead of reusing the KV state a finished request "
        "left for the same leading tokens (default: reuse)",
    )
    parser.add_argument(
        "--cancel-grace-seconds",
        type=_positive_float,
        default=10.0,
        help="restart the model worker when a cancelled generation runs this long (default 10)",
    )
    parser.add_argument(
        "--generation-time-limit-seconds",
        type=_positive_float,
        default=GENERATION_TIME_LIMIT_S,
        help="end a generation that has run this long in the model worker, keeping its "
        "output (an incomplete response, reason max_generation_time; default "
        f"{GENERATION_TIME_LIMIT_S:g})",
    )
    parser.add_argument(
        "--max-body-bytes",
        type=_positive_int,
        default=8 * 1024 * 1024,
        help="largest accepted request body (default 8 MiB)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the service until interrupted; returns the exit status."""
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if not args.model.is_file():
        print(f"napllm-lmsp: no model file at {args.model}", file=sys.stderr)
        return 1
    model_id = args.model_id or args.model.name.removesuffix(".gguf")
    try:
        engine = Engine(
            args.model,
            model_id,
            n_ctx=args.n_ctx,
            n_threads=args.n_threads,
            cancel_grace_s=args.cancel_grace_seconds,
            generation_time_limit_s=args.generation_time_limit_seconds,
            extra_bufts=args.extra_bufts,
            slots=args.slots,
            prompt_reuse=args.prompt_reuse,
        )
    except ValueError as exc:
        print(f"napllm-lmsp: cannot load the model: {exc}", file=sys.stderr)
        return 1
    token_path: Path = args.token_file or default_token_path()
    try:
        token, created = load_or_create_token(token_path)
    except (TokenFileError, OSError) as exc:
        print(f"napllm-lmsp: cannot use token file {token_path}: {exc}", file=sys.stderr)
        engine.close()
        return 1
    if created:
        print(f"napllm-lmsp: created access token (stored in {token_path}): {token}", flush=True)
    else:
        print(f"napllm-lmsp: using the access token stored in {token_path}", flush=True)

    config = ServiceConfig(
        retention_s=args.retention_seconds,
        send_timeout_s=args.send_timeout_seconds,
        body_timeout_s=args.body_timeout_seconds,
        max_body_bytes=args.max_body_bytes,
        allow_origins=tuple(args.allow_origin),
    )
    store_path: Path = args.store or token_path.parent / STORE_FILE_NAME
    try:
        store = SqliteStore(
            store_path,
            retention_s=args.store_retention_seconds,
            max_records=args.store_max_records,
            max_bytes=args.store_max_bytes,
        )
    except (sqlite3.Error, OSError) as exc:
        print(f"napllm-lmsp: cannot use the store {store_path}: {exc}", file=sys.stderr)
        engine.close()
        return 1
    service = LmspService(engine, config, store)
    app = build_app(service, token)
    uv_config = uvicorn.Config(
        app, host=args.host, port=args.port, log_level="warning", lifespan="on"
    )
    try:
        listener = bounded_listener(args.host, args.port, args.send_buffer_bytes)
    except OSError as exc:
        print(f"napllm-lmsp: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        engine.close()
        return 1
    bound_write_buffer(uv_config, args.send_buffer_bytes)
    server = uvicorn.Server(uv_config)
    print(f"napllm-lmsp: serving {model_id} on http://{args.host}:{args.port}/lmsp/v1", flush=True)

    try:
        server.run(sockets=[listener])
    finally:
        engine.close()
    return 0 if server.started else 1


if __name__ == "__main__":
    sys.exit(main())
