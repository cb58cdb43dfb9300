"""The LMSP browser path: the shell in Chromium talks to a real LMSP service.

The LMSP service (``napllm-lmsp`` on TinyChat, tests/service/conftest.py) runs
on 127.0.0.1 with CORS allowing the served shell's origin. An ``lmsp``
connection is added through the connections panel with real typing and
clicks; napplet generations then go through the shell (consent click) to the
service: TinyChat's canned answers at temperature 0 make the results exact
(models/tinychat/README.md).

Checked: "Hello!" streams "Hello! How can I help you today?" with the delta
rules of NAP-LLM (LLM-C09); the Berlin weather tool call round trip with a
toolResult (LLM-C14/C15/C18 observations on a real model: the call's id and
name on its `start`, fragments parsing to the final arguments, ``toolUse``,
the same id accepted back); a forced named tool (LLM-C13, obeyed); cancelling
a running generation (LLM-C07/C09); a rejected token becomes
``provider-error`` for the napplet and a notice in the shell UI that never
contains the token.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from shellpage import (
    ShellPage,
    boot_shell,
    check_generation,
    code,
    deltas_of,
    generate,
    user,
)

pytestmark = [pytest.mark.browser, pytest.mark.service]

HERE = Path(__file__).resolve().parent
CONNECTION = "TinyChat over LMSP"
HELLO = "Hello! How can I help you today?"
WEATHER_TOOL = {
    "name": "get_weather",
    "description": "Look up current weather",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
GENERATION_TIMEOUT_MS = 60_000


def _service_module() -> ModuleType:
    """tests/service/conftest.py under a private name (it starts the service)."""
    path = HERE.parent / "service" / "conftest.py"
    spec = importlib.util.spec_from_file_location("napllm_service_fixture", path)
    if spec is None or spec.loader is None:
        raise RuntimeError("cannot import tests/service/conftest.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


service_fixture = _service_module()


def origin(url: str) -> str:
    """``scheme://host:port`` of `url`."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def stop(handle: Any) -> None:
    handle.process.terminate()
    try:
        handle.process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        handle.process.kill()
        handle.process.wait()


def start_service(workdir: Path, dist_url: str, *extra: str) -> Any:
    """The TinyChat LMSP service, with CORS allowing the shell's origin."""
    workdir.mkdir(parents=True, exist_ok=True)
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama-cpp-python is not installed (pip install 'napllm[service]')")
    if not service_fixture.MODEL.is_file():
        pytest.fail("TinyChat model missing at models/tinychat/tiny-chat-q8_0.gguf")
    return service_fixture.start_lmsp_service(workdir, "--allow-origin", origin(dist_url), *extra)


def restart_on_port(workdir: Path, dist_url: str, port: int) -> tuple[Any, str]:
    """A new service process on a given `port` with a new token: `(process, token)`.

    `start_lmsp_service` always picks a free port; a token rotation on the same
    address needs the port kept, so this starts the process itself.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    token_file = workdir / "lmsp-token"
    args = [
        sys.executable,
        "-m",
        "napllm.lmsp_service",
        "--model",
        str(service_fixture.MODEL),
        "--model-id",
        service_fixture.MODEL_ID,
        "--port",
        str(port),
        "--token-file",
        str(token_file),
        "--allow-origin",
        origin(dist_url),
    ]
    log = (workdir / "service.log").open("wb")
    env = {**os.environ, "XDG_CONFIG_HOME": str(workdir / "config")}
    process = subprocess.Popen(
        args, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=HERE.parents[1]
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError((workdir / "service.log").read_text(errors="replace"))
        if token_file.exists():
            token = token_file.read_text().strip()
            try:
                answer = httpx.get(
                    f"http://127.0.0.1:{port}/lmsp/v1/models",
                    headers={"Authorization": f"Bearer {token}"},
                    timeout=2,
                )
                if answer.status_code == 200:
                    return process, token
            except httpx.TransportError:
                pass
        time.sleep(0.1)
    process.kill()
    raise RuntimeError("the restarted LMSP service did not become ready within 60 s")


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory, dist_url: str) -> Iterator[Any]:
    """The LMSP service for this module."""
    handle = start_service(tmp_path_factory.mktemp("lmsp-browser"), dist_url)
    yield handle
    stop(handle)


def add_connection(shell: ShellPage, name: str, base_url: str, model: str, token: str) -> Any:
    """Fill the connections panel's form like a person and press Save; returns the form."""
    page = shell.page
    page.click("#connection-add")
    form = page.locator("#connection-form")
    form.wait_for(state="visible")
    page.locator("#connection-name").press_sequentially(name)
    page.select_option("#connection-kind", "lmsp")
    page.locator("#connection-base-url").press_sequentially(base_url)
    page.locator("#connection-model").press_sequentially(model)
    page.locator("#connection-secret").press_sequentially(token)
    page.click("#connection-save")
    return form


@pytest.fixture(scope="module")
def booted(
    shell_context: Any, dist_url: str, test_pages_dir: Path, service: Any
) -> Iterator[ShellPage]:
    """The shell with the LMSP connection added through the panel."""
    shell = boot_shell(shell_context.new_page(), dist_url, test_pages_dir)
    form = add_connection(shell, CONNECTION, service.base_url, service.model_id, service.token)
    form.wait_for(state="hidden", timeout=30_000)
    yield shell


def text_of(result: dict[str, Any]) -> str:
    return "".join(p["text"] for p in result["content"] if p["type"] == "text")


def test_connection_added_through_the_panel(shell: ShellPage, service: Any) -> None:
    item = shell.page.locator("#connection-list .connection", has_text=CONNECTION)
    text = item.inner_text()
    assert "LMSP service" in text and service.model_id in text
    assert f"127.0.0.1:{urlsplit(service.base_url).port}" in text
    assert "credential saved" in text and "tools" in text
    # the token is nowhere in the page's DOM (the secret field was reset)
    assert service.token not in shell.page.content()
    assert shell.page.input_value("#connection-secret") == ""


def test_hello_streams_through_the_shell(shell: ShellPage, service: Any, request_log: Any) -> None:
    app = shell.open_napplet()
    handle = app.select(CONNECTION)
    app.post(generate("g1", handle, user("Hello!"), temperature=0))
    dialog = shell.consent()
    assert f"127.0.0.1:{urlsplit(service.base_url).port}" in dialog.inner_text()
    shell.allow()
    app.wait_for("g1", timeout_ms=GENERATION_TIMEOUT_MS)
    envelopes = app.quiet()
    result = check_generation(envelopes, "g1")
    assert result["result"]["finish"] == "stop"
    assert text_of(result["result"]) == HELLO
    deltas = deltas_of(envelopes, "g1")
    assert deltas[0]["event"] == "start" and deltas[-1]["event"] == "end"
    assert envelopes[-1] == result  # nothing after the terminal result
    # the shell itself called the service, on 127.0.0.1
    assert any(u.startswith(service.base_url + "/lmsp/v1/") for u in request_log.requests)


def test_weather_tool_call_round_trip(shell: ShellPage) -> None:
    app = shell.open_napplet()
    app.post({"type": "llm.select", "id": "s1", "requirements": {"tools": True}})
    shell.choose(CONNECTION)
    model = app.wait_for("s1", "llm.select.result")["model"]
    assert model["tools"] is True and {"auto", "none"} <= set(model["toolChoiceModes"])
    handle = model["handle"]
    question = user("What is the weather in Berlin?")
    app.post(
        generate("g1", handle, question, tools=[WEATHER_TOOL], toolChoice="auto", temperature=0)
    )
    shell.remember()
    app.wait_for("g1", timeout_ms=GENERATION_TIMEOUT_MS)
    first = check_generation(app.quiet(), "g1")
    assert first["result"]["finish"] == "toolUse"
    (call,) = [p for p in first["result"]["content"] if p["type"] == "toolCall"]
    assert call["name"] == "get_weather" and call["arguments"] == {"city": "Berlin"}
    assert call["toolCallId"]
    starts = [
        d
        for d in deltas_of(app.envelopes(), "g1")
        if d["block"] == "toolCall" and d["event"] == "start"
    ]
    assert [(s["toolCallId"], s["name"]) for s in starts] == [(call["toolCallId"], "get_weather")]
    observation = {"city": "Berlin", "temperature": 18, "condition": "cloudy"}
    history = [
        question,
        {"role": "assistant", "content": [call]},
        {
            "role": "toolResult",
            "toolCallId": call["toolCallId"],
            "toolName": "get_weather",
            "content": [{"type": "text", "text": json.dumps(observation)}],
        },
    ]
    app.post(generate("g2", handle, *history, tools=[WEATHER_TOOL], temperature=0))
    app.wait_for("g2", timeout_ms=GENERATION_TIMEOUT_MS)
    second = check_generation(app.quiet(), "g2")
    assert second["result"]["finish"] == "stop"
    assert text_of(second["result"]) == "It is cloudy in Berlin with a temperature of 18 degrees."
    # a forced named tool is obeyed, never replaced by plain text
    if "tool" in model["toolChoiceModes"]:
        forced = {"type": "tool", "name": "get_weather"}
        app.post(
            generate(
                "g3",
                handle,
                user("What is the weather in Paris?"),
                tools=[WEATHER_TOOL],
                toolChoice=forced,
                temperature=0,
            )
        )
        app.wait_for("g3", timeout_ms=GENERATION_TIMEOUT_MS)
        third = check_generation(app.quiet(), "g3")
        assert third["result"]["finish"] == "toolUse"
        assert {p["name"] for p in third["result"]["content"] if p["type"] == "toolCall"} == {
            "get_weather"
        }


def test_cancel_running_generation(shell: ShellPage) -> None:
    app = shell.open_napplet()
    handle = app.select(CONNECTION)
    app.post(generate("g1", handle, user("Hello!"), temperature=0))
    dialog = shell.consent()
    app.post({"type": "llm.cancel", "id": "c1", "requestId": "g1"})
    # cancelled while the consent dialog is open: the dialog goes, nothing is sent
    dialog.wait_for(state="detached")
    assert app.wait_for("c1", "llm.cancel.result")["cancelled"] is True
    assert code(app.wait_for("g1")) == "cancelled"
    assert deltas_of(app.quiet(), "g1") == []
    # after a completed generation, cancelling it is false and changes nothing
    app.post(generate("g2", handle, user("Hello!"), temperature=0))
    shell.allow()
    app.wait_for("g2", timeout_ms=GENERATION_TIMEOUT_MS)
    app.post({"type": "llm.cancel", "id": "c2", "requestId": "g2"})
    assert app.wait_for("c2", "llm.cancel.result")["cancelled"] is False
    assert text_of(check_generation(app.quiet(), "g2")["result"]) == HELLO


def test_rejected_token_is_provider_error_and_a_safe_notice(
    shell: ShellPage, dist_url: str, tmp_path: Path
) -> None:
    # a second service whose token changes after the connection was saved
    first = start_service(tmp_path / "before", dist_url)
    try:
        port = int(urlsplit(first.base_url).port or 0)
        form = add_connection(shell, "Rotated token", first.base_url, first.model_id, first.token)
        form.wait_for(state="hidden", timeout=30_000)
    finally:
        stop(first)
    process, new_token = restart_on_port(tmp_path / "after", dist_url, port)
    second = SimpleNamespace(
        process=process, token=new_token, base_url=first.base_url, model_id=first.model_id
    )
    try:
        assert second.token != first.token
        app = shell.open_napplet()
        handle = app.select("Rotated token")
        app.post(generate("g1", handle, user("Hello!"), temperature=0))
        shell.allow()
        result = app.wait_for("g1", timeout_ms=GENERATION_TIMEOUT_MS)
        assert code(result) == "provider-error"
        assert first.token not in json.dumps(app.quiet())
        notice = shell.page.locator("#notice-list .notice.error").last
        notice.wait_for(state="visible")
        text = notice.inner_text()
        assert "token" in text.lower() or "rejected" in text.lower(), text
        shown = shell.page.locator("#notice-list").inner_text()
        assert first.token not in shown and second.token not in shown
        # a wrong token typed into the form is refused with a fixed sentence
        wrong = "wrong-" + second.token[::-1]
        form = add_connection(shell, "Wrong token", second.base_url, second.model_id, wrong)
        error = shell.page.locator("#connection-form-error")
        error.wait_for(state="visible")
        shell.page.wait_for_function(
            "() => document.querySelector('#connection-form-error').textContent.length > 0",
            timeout=30_000,
        )
        assert wrong not in error.inner_text() and wrong not in shell.page.content()
        shell.page.click("#connection-cancel")
        form.wait_for(state="hidden")
    finally:
        stop(second)
