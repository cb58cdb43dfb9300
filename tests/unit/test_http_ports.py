"""The HTTP ports (providers/http_httpx.py, browser/http_fetch.py) against hostile servers.

A server that sends a never-ending or huge body must not fill the page's
memory through `read()`, and a redirect must never move a request (and the
conversation in its body) to an address the route does not name.
The fetch port runs here on small stand-ins for `js` and `pyodide.ffi`.
"""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from napllm.providers.base import MAX_BODY_BYTES
from napllm.providers.http_httpx import HttpxPort

CHUNK = b"x" * 65536


async def endless() -> AsyncIterator[bytes]:
    while True:
        yield CHUNK


async def test_httpx_read_stops_a_body_larger_than_the_bound() -> None:
    async def handler(req: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"Content-Length": "10"}, content=endless())

    client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    response = await HttpxPort(client).request("GET", "http://127.0.0.1:9/v1/models")
    with pytest.raises(ConnectionError) as caught:
        await response.read()
    assert "127.0.0.1" not in str(caught.value)


async def test_httpx_read_returns_a_body_within_the_bound() -> None:
    async def handler(req: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=b'{"data": []}')

    client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    response = await HttpxPort(client).request("GET", "http://127.0.0.1:9/v1/models")
    assert await response.read() == b'{"data": []}'


async def test_httpx_port_never_follows_a_redirect() -> None:
    seen: list[str] = []

    async def handler(req: httpx.Request) -> httpx.Response:
        seen.append(str(req.url))
        return httpx.Response(307, headers={"Location": "http://evil.example/v1/chat"})

    client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    response = await HttpxPort(client).request("POST", "http://127.0.0.1:9/v1/chat", json_body={})
    assert response.status == 307
    assert seen == ["http://127.0.0.1:9/v1/chat"]


# -- the fetch port on stand-ins -------------------------------------------------


class _Chunk:
    def __init__(self, value: bytes | None) -> None:
        self.done = value is None
        self.value = types.SimpleNamespace(to_bytes=lambda: value)


class _Reader:
    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks

    async def read(self) -> _Chunk:
        return _Chunk(next(self._chunks, None))

    def releaseLock(self) -> None:
        pass


class _Body:
    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks

    def getReader(self) -> _Reader:
        return _Reader(self._chunks)


class _Response:
    def __init__(self, chunks: Iterator[bytes]) -> None:
        self.status = 200
        self.headers = types.SimpleNamespace(entries=lambda: [])
        self.body = _Body(chunks)

    async def arrayBuffer(self) -> Any:
        data = b"".join(self.body._chunks)  # what an unbounded read would do
        return types.SimpleNamespace(to_bytes=lambda: data)


class _Controller:
    aborted = False
    signal = None

    @classmethod
    def new(cls) -> _Controller:
        return cls()

    def abort(self) -> None:
        self.aborted = True


@pytest.fixture
def fetch_port(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """`browser.http_fetch` imported on stand-ins; `.calls` records each fetch's options."""
    calls: list[dict[str, Any]] = []
    bodies: list[Iterator[bytes]] = []

    async def fetch(url: str, options: dict[str, Any]) -> _Response:
        calls.append(options)
        return _Response(bodies.pop(0))

    js = types.ModuleType("js")
    js.AbortController = _Controller  # type: ignore[attr-defined]
    js.Object = types.SimpleNamespace(fromEntries=dict)  # type: ignore[attr-defined]
    js.fetch = fetch  # type: ignore[attr-defined]
    js.navigator = types.SimpleNamespace(permissions=None)  # type: ignore[attr-defined]
    ffi = types.ModuleType("pyodide.ffi")
    ffi.JsException = type("JsException", (Exception,), {})  # type: ignore[attr-defined]
    ffi.to_js = lambda value, dict_converter=None: value  # type: ignore[attr-defined]
    pyodide = types.ModuleType("pyodide")
    pyodide.ffi = ffi  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "js", js)
    monkeypatch.setitem(sys.modules, "pyodide", pyodide)
    monkeypatch.setitem(sys.modules, "pyodide.ffi", ffi)
    monkeypatch.delitem(sys.modules, "napllm.browser.http_fetch", raising=False)
    module = importlib.import_module("napllm.browser.http_fetch")
    port = module.FetchHttp()
    port.calls, port.bodies = calls, bodies
    yield port
    sys.modules.pop("napllm.browser.http_fetch", None)


async def test_fetch_port_refuses_redirects(fetch_port: Any) -> None:
    fetch_port.bodies.append(iter([b"{}"]))
    await fetch_port.request("POST", "http://127.0.0.1:9/v1/chat", json_body={"a": 1})
    assert fetch_port.calls[0]["redirect"] == "error"
    assert fetch_port.calls[0]["credentials"] == "omit"


async def test_fetch_read_stops_a_body_larger_than_the_bound(fetch_port: Any) -> None:
    sent = 0

    def chunks() -> Iterator[bytes]:
        nonlocal sent
        while sent <= 4 * MAX_BODY_BYTES:
            sent += len(CHUNK)
            yield CHUNK

    fetch_port.bodies.append(chunks())
    response = await fetch_port.request("GET", "http://127.0.0.1:9/v1/models")
    with pytest.raises(ConnectionError):
        await response.read()
    assert sent <= MAX_BODY_BYTES + len(CHUNK)


async def test_fetch_read_returns_a_body_within_the_bound(fetch_port: Any) -> None:
    fetch_port.bodies.append(iter([b'{"data"', b": []}"]))
    response = await fetch_port.request("GET", "http://127.0.0.1:9/v1/models")
    assert await response.read() == b'{"data": []}'
