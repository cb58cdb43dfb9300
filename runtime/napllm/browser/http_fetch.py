"""`HttpPort` over the browser's `fetch` (Pyodide only).

Rules
- `timeout_s` bounds the wait for the status line and headers only (a
  stream may then run for minutes); on expiry the fetch is aborted.
- Requests go through `fetch` with an `AbortController`; closing a
  response (or cancelling the coroutine reading it) aborts the fetch, so a
  streamed body stops downloading (pyodide/pyodide #3867: an aborted fetch
  must not leave the reader hung, so every read is raced against the abort).
- A network failure, a CORS refusal or an aborted fetch raises
  `ConnectionError` with a generic text (browser messages are not echoed).
- Local network permission: when the shell is served from a public address
  (a GitHub Pages site, say) and the model server is on 127.0.0.1 or the
  home network, Chromium's Local Network Access refuses the request until
  the user allows it for the site; `fetch` only says "Failed to fetch".
  After a failed fetch the port asks `navigator.permissions` for the
  local network permissions (`loopback-network`, `local-network`, and the
  earlier combined `local-network-access`): one that reads `denied` (which
  Chromium records when it refused such a request) means the browser
  blocked it, and `LocalNetworkBlocked` is raised so the shell can tell
  the user what to allow (`providers.base.LOCAL_NETWORK_HINT`). A browser
  without these permission names gets the generic `ConnectionError`.
- Bodies stream through `response.body.getReader()`; chunks arrive as bytes.
  `read()` keeps at most `MAX_BODY_BYTES` and aborts a larger body.
- Redirects are refused (`redirect: "error"`, a `ConnectionError`): a
  redirect would carry the request, and the conversation in its body, to
  an address the route shown in the consent dialog does not name.
- `reaches_opaquely` sends one `no-cors` GET without credentials and reads
  nothing of the answer (it is opaque): it only tells "something answered"
  from "nothing there", so the connections form can explain a CORS refusal.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import js  # type: ignore[import-not-found]
from js import AbortController, Object, fetch, navigator  # type: ignore[import-not-found]
from pyodide.ffi import JsException, to_js  # type: ignore[import-not-found]

from ..providers.base import MAX_BODY_BYTES, HttpCall, HttpPort, LocalNetworkBlocked

#: Permission names of Chromium's Local Network Access, newest first.
LOCAL_NETWORK_PERMISSIONS = ("loopback-network", "local-network", "local-network-access")


async def local_network_denied() -> bool:
    """Whether the browser reports a local network permission as `denied`.

    Unknown permission names (other browsers, older versions) count as not
    denied; never raises.
    """
    permissions = getattr(navigator, "permissions", None)
    if permissions is None:
        return False
    for name in LOCAL_NETWORK_PERMISSIONS:
        try:
            status = await permissions.query(
                to_js({"name": name}, dict_converter=Object.fromEntries)
            )
        except JsException:
            continue  # this browser does not know the name
        if str(status.state) == "denied":
            return True
    return False


async def reaches_opaquely(url: str, timeout_s: float) -> bool | None:
    """Whether a `no-cors` GET of `url` gets any answer within `timeout_s` seconds.

    The answer is opaque (status and body unreadable) and dropped at once;
    never raises. A cross-origin isolated page (COEP `require-corp`) blocks
    opaque answers without a `Cross-Origin-Resource-Policy` header, so there
    a failure means "cannot tell" (None), not "nothing there" (False).
    """
    unsure = None if getattr(js, "crossOriginIsolated", False) is True else False
    controller = AbortController.new()
    init = {"mode": "no-cors", "credentials": "omit", "cache": "no-store"}
    options = to_js(init | {"signal": controller.signal}, dict_converter=Object.fromEntries)
    try:
        await asyncio.wait_for(fetch(url, options), timeout_s)
    except TimeoutError:
        return unsure
    except JsException:
        return unsure
    finally:
        controller.abort()
    return True


class FetchResponse:
    """A `fetch` response whose body is read as it arrives."""

    def __init__(self, response: Any, controller: Any) -> None:
        self._response = response
        self._controller = controller
        self.status = int(response.status)
        headers: dict[str, str] = {}
        for pair in response.headers.entries():
            key, value = pair[0], pair[1]
            headers[str(key).lower()] = str(value)
        self.headers = headers
        self._closed = False

    async def read(self) -> bytes:
        """The whole body; raises `ConnectionError` when it cannot be read or
        grows beyond `MAX_BODY_BYTES` (counted as it arrives, whatever
        `Content-Length` claims; the fetch is then aborted)."""
        data = bytearray()
        try:
            async for chunk in self.iter_bytes():
                data.extend(chunk)
                if len(data) > MAX_BODY_BYTES:
                    raise ConnectionError("the response body is too large")
        finally:
            if len(data) > MAX_BODY_BYTES:
                await self.aclose()
        return bytes(data)

    async def iter_bytes(self) -> AsyncIterator[bytes]:
        """The body chunk by chunk; ends when the stream ends or is closed."""
        body = self._response.body
        if body is None:
            return
        reader = body.getReader()
        try:
            while not self._closed:
                try:
                    chunk = await reader.read()
                except JsException as exc:
                    if self._closed:
                        return
                    raise ConnectionError("the connection was interrupted") from exc
                if chunk.done:
                    return
                yield chunk.value.to_bytes()
        finally:
            with contextlib.suppress(JsException):
                reader.releaseLock()

    async def aclose(self) -> None:
        """Abort the fetch (stops a body still streaming)."""
        if not self._closed:
            self._closed = True
            self._controller.abort()


class FetchHttp(HttpPort):
    """`HttpPort` implementation on `fetch` (see providers/base.py)."""

    async def send(self, call: HttpCall) -> FetchResponse:
        """Send `call` (`HttpPort.send`); returns when status and headers arrived."""
        controller = AbortController.new()
        init: dict[str, Any] = {
            "method": call.method,
            "headers": dict(call.headers),
            "signal": controller.signal,
            "credentials": "omit",
            "cache": "no-store",
            "redirect": "error",
        }
        if call.json_body is not None:
            init["body"] = json.dumps(call.json_body, ensure_ascii=False)
            init["headers"].setdefault("Content-Type", "application/json")
        options = to_js(init, dict_converter=Object.fromEntries)
        try:
            if call.timeout_s is None:
                response = await fetch(call.url, options)
            else:
                response = await asyncio.wait_for(fetch(call.url, options), call.timeout_s)
        except TimeoutError as exc:
            controller.abort()
            raise ConnectionError("the service did not answer in time") from exc
        except asyncio.CancelledError:
            controller.abort()
            raise
        except JsException as exc:
            if await local_network_denied():
                raise LocalNetworkBlocked("the browser blocked a local network request") from exc
            raise ConnectionError("the service could not be reached") from exc
        return FetchResponse(response, controller)
