"""A real LMSP service running TinyChat, for tests that need one.

Fixture `lmsp_service` (session scope) starts
`python -m napllm.lmsp_service --model models/tinychat/tiny-chat-q8_0.gguf`
on a free 127.0.0.1 port with a token file under a temporary directory,
waits until `GET /lmsp/v1/models` answers, yields an `LmspServiceHandle` and
stops the process at the end of the session. Tests using it should be
marked `@pytest.mark.service`; they are skipped (with the reason) when
llama-cpp-python is not importable. A missing model file is an error.

The service is started with:
- model id `tinychat` (`LmspServiceHandle.model_id`);
- `--n-ctx 4096` (longer than TinyChat's trained 512 tokens, so that long
  generations and oversized prompts can be produced);
- `--retention-seconds 2` (`LmspServiceHandle.retention_s`): task events
  expire quickly, so resume tests must read within that window;
- `--allow-origin http://allowed.example` (`LmspServiceHandle.allowed_origin`);
- `--max-body-bytes 1048576` (`LmspServiceHandle.max_body_bytes`).

Other test packages can reuse it by importing the fixture, e.g. in their own
conftest: `from tests.service.conftest import lmsp_service  # noqa: F401`,
or by copying `start_lmsp_service` with other options.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]
MODEL = REPO / "models" / "tinychat" / "tiny-chat-q8_0.gguf"
MODEL_ID = "tinychat"
ALLOWED_ORIGIN = "http://allowed.example"
RETENTION_S = 2.0
MAX_BODY_BYTES = 1024 * 1024
N_CTX = 4096


@dataclass
class LmspServiceHandle:
    """A running service: `base_url` (`http://127.0.0.1:PORT`), `token`, settings."""

    base_url: str
    token: str
    model_id: str
    retention_s: float
    allowed_origin: str
    max_body_bytes: int
    n_ctx: int
    process: subprocess.Popen[bytes]

    @property
    def api(self) -> str:
        """`base_url` + `/lmsp/v1`."""
        return self.base_url + "/lmsp/v1"

    def headers(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        """Authorization and LMSP-Version headers, plus `extra`."""
        return {"Authorization": f"Bearer {self.token}", "LMSP-Version": "1.0", **(extra or {})}

    def client(self, timeout_s: float = 30.0) -> httpx.Client:
        """An httpx client for `api` that sends the token on every request."""
        return httpx.Client(base_url=self.api, headers=self.headers(), timeout=timeout_s)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def service_env() -> dict[str, str]:
    """This process's environment with this checkout's runtime first on `PYTHONPATH`.

    For every `python -m napllm.lmsp_service` a test starts, so the service
    under test is the one beside the tests (napllm need not be installed).
    """
    python_path = os.pathsep.join(
        p for p in (str(REPO / "runtime"), os.environ.get("PYTHONPATH", "")) if p
    )
    return {**os.environ, "PYTHONPATH": python_path}


def start_lmsp_service(workdir: Path, *extra_args: str) -> LmspServiceHandle:
    """Start the service on a free port and wait (up to 60 s) until it answers."""
    port = free_port()
    token_file = workdir / "lmsp-token"
    log = (workdir / "service.log").open("wb")
    args = [
        sys.executable,
        "-m",
        "napllm.lmsp_service",
        "--model",
        str(MODEL),
        "--model-id",
        MODEL_ID,
        "--port",
        str(port),
        "--token-file",
        str(token_file),
        "--retention-seconds",
        str(RETENTION_S),
        "--allow-origin",
        ALLOWED_ORIGIN,
        "--max-body-bytes",
        str(MAX_BODY_BYTES),
        "--n-ctx",
        str(N_CTX),
        *extra_args,
    ]
    env = {**service_env(), "XDG_CONFIG_HOME": str(workdir / "config")}
    process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    base_url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        if process.poll() is not None:
            log.close()
            output = (workdir / "service.log").read_text(errors="replace")
            raise RuntimeError(f"the LMSP service exited early:\n{output}")
        if token_file.exists():
            token = token_file.read_text().strip()
            try:
                answer = httpx.get(
                    base_url + "/lmsp/v1/models",
                    headers={"Authorization": f"Bearer {token}"},
                    timeout=2,
                )
                if answer.status_code == 200:
                    break
            except httpx.TransportError:
                pass
        if time.monotonic() > deadline:
            process.kill()
            raise RuntimeError("the LMSP service did not become ready within 60 s")
        time.sleep(0.1)
    return LmspServiceHandle(
        base_url=base_url,
        token=token,
        model_id=MODEL_ID,
        retention_s=RETENTION_S,
        allowed_origin=ALLOWED_ORIGIN,
        max_body_bytes=MAX_BODY_BYTES,
        n_ctx=N_CTX,
        process=process,
    )


@pytest.fixture(scope="session")
def lmsp_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LmspServiceHandle]:
    """The running TinyChat LMSP service (see the module docstring)."""
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama-cpp-python is not installed (pip install 'napllm[service]')")
    if not MODEL.is_file():
        pytest.fail(f"TinyChat model missing at {MODEL.relative_to(REPO)}")
    handle = start_lmsp_service(tmp_path_factory.mktemp("lmsp-service"))
    try:
        yield handle
    finally:
        handle.process.terminate()
        try:
            handle.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            handle.process.kill()
            handle.process.wait()
