"""A client that opens a stream and stops reading cannot hold the service (docs/lmsp.md, limits)."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from tests.service.conftest import LmspServiceHandle, start_lmsp_service

pytestmark = pytest.mark.service

SEND_TIMEOUT_S = 1.0
LIMIT = 2000  # output tokens: far more than the bounded buffers hold


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LmspServiceHandle]:
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")
    handle = start_lmsp_service(
        Path(tmp_path_factory.mktemp("lmsp-stalled")),
        "--send-timeout-seconds",
        str(SEND_TIMEOUT_S),
        "--send-buffer-bytes",
        "4096",
        "--body-timeout-seconds",
        "1",
    )
    try:
        yield handle
    finally:
        handle.process.terminate()
        handle.process.wait(timeout=10)


def long_stream_body(service: LmspServiceHandle) -> bytes:
    message = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]}
    return json.dumps(
        {
            "model": service.model_id,
            "input": [message],
            "stream": True,
            "store": True,
            "max_output_tokens": LIMIT,
            "extensions": {"min_output_tokens": LIMIT},
        }
    ).encode()


def open_stalled_stream(service: LmspServiceHandle, key: str) -> tuple[socket.socket, str]:
    """POST a long stream with a tiny receive buffer; read up to the first event, then stop."""
    port = int(service.base_url.rsplit(":", 1)[1])
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
    sock.connect(("127.0.0.1", port))
    payload = long_stream_body(service)
    head = (
        "POST /lmsp/v1/responses HTTP/1.1\r\n"
        "Host: 127.0.0.1\r\n"
        f"Authorization: Bearer {service.token}\r\n"
        "Content-Type: application/json\r\n"
        f"Idempotency-Key: {key}\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n"
    )
    sock.sendall(head.encode() + payload)
    seen = b""
    while b"response.created" not in seen or b"\r\n\r\n" not in seen.split(b"data: ", 1)[-1]:
        chunk = sock.recv(512)
        assert chunk, "the service closed the stream before its first event"
        seen += chunk
    data = seen.split(b"data: ", 1)[1].split(b"\r\n", 1)[0]
    return sock, json.loads(data)["response_id"]


def first_event(client: httpx.Client, body: bytes, key: str) -> tuple[int, str | None]:
    """Status of a stream request and the response id of its first event (then disconnect)."""
    headers = {"Content-Type": "application/json", "Idempotency-Key": key}
    with client.stream("POST", "/responses", content=body, headers=headers) as answer:
        if answer.status_code != 200:
            answer.read()
            return answer.status_code, None
        for line in answer.iter_lines():
            if line.startswith("data: "):
                return 200, str(json.loads(line[6:])["response_id"])
    return 200, None


def test_a_reader_that_stops_reading_loses_its_stream_generation_and_key(
    service: LmspServiceHandle,
) -> None:
    key = "stalled-reader-1"
    stalled, stalled_id = open_stalled_stream(service, key)
    try:
        with service.client(timeout_s=120) as client:
            # While the stream is stuck, the key is still in use.
            assert first_event(client, long_stream_body(service), key) == (409, None)
            # The send timeout ends the stream and cancels its generation.
            deadline = time.monotonic() + 120
            while True:
                stored = client.get(f"/responses/{stalled_id}").json()
                if stored["status"] != "in_progress":
                    break
                assert time.monotonic() < deadline, "the stalled stream was never ended"
                time.sleep(0.2)
            assert stored["status"] == "cancelled"
            assert stored["usage"]["output_tokens"] < LIMIT
            # Other clients are served, and a retry with the same key generates afresh.
            small = {
                "model": service.model_id,
                "input": [
                    {
                        "type": "message",
                        "role": "user",
                        "content": [{"type": "input_text", "text": "Hi"}],
                    }
                ],
                "max_output_tokens": 4,
            }
            answer = client.post("/responses", json=small)
            assert answer.status_code == 200
            assert answer.json()["status"] in {"completed", "incomplete"}
            status, fresh_id = first_event(client, long_stream_body(service), key)
            assert status == 200
            assert fresh_id is not None and fresh_id != stalled_id
    finally:
        stalled.close()


def test_a_body_that_never_arrives_is_a_timeout(service: LmspServiceHandle) -> None:
    port = int(service.base_url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port)) as sock:
        head = (
            "POST /lmsp/v1/responses HTTP/1.1\r\n"
            "Host: 127.0.0.1\r\n"
            f"Authorization: Bearer {service.token}\r\n"
            "Content-Type: application/json\r\n"
            "Content-Length: 500\r\n\r\n"
            '{"model":'  # and then nothing more
        )
        sock.sendall(head.encode())
        sock.settimeout(30)
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
            chunk = sock.recv(4096)
            assert chunk, "the service closed the connection without an answer"
            answer += chunk
    status_line, rest = answer.split(b"\r\n", 1)
    assert status_line.split()[1] == b"408"
    problem = json.loads(rest.split(b"\r\n\r\n", 1)[1])
    assert problem["code"] == "request_timeout"
