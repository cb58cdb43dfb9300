"""`HttpPort` on `httpx.AsyncClient`, for the providers under CPython.

The browser has its own port on `fetch` (in `browser/`); this one serves the
CPython runtime, the tests and the command-line tools. It implements the port
of `providers/base.py` and nothing more.

Rules
- A request returns as soon as the status and headers arrived; the body is
  read with `read()` (at most `base.MAX_BODY_BYTES`) or streamed with
  `iter_bytes()` (decoded from any `Content-Encoding`), and the caller
  releases it with `aclose()`.
- Header names in `HttpxResponse.headers` are lower case; repeated headers
  are joined with ", " (RFC 9110, 5.3).
- Every transport failure (refused, reset, DNS, timeout, a body cut off
  mid-stream) is raised as `ConnectionError` with a fixed message naming the
  kind of failure, never the URL or a header; HTTP error statuses are not
  exceptions (the provider reads them). Redirects are not followed (httpx's
  default): a 3xx is an answer like any other, so a request never reaches
  an address its route does not name.
- `timeout_s` bounds connecting, each read and each write; `None` leaves
  reads unbounded (a model may think for a long time before its first
  token) while connecting is still bounded by `connect_timeout_s`. The
  runtime's own generation deadline bounds the whole exchange.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING

from .base import MAX_BODY_BYTES, HttpCall, HttpPort

if TYPE_CHECKING:
    import httpx

# httpx is imported where it is used: the module stays importable (and the
# package walkable) under Pyodide, where httpx is not installed and the
# browser's fetch port is used instead.


def _connection_error(exc: Exception) -> ConnectionError:
    import httpx

    if isinstance(exc, httpx.TimeoutException):
        return ConnectionError("the HTTP exchange timed out")
    if isinstance(exc, httpx.ConnectError):
        return ConnectionError("could not connect")
    if isinstance(exc, httpx.RemoteProtocolError | httpx.ReadError):
        return ConnectionError("the connection was closed before the response was complete")
    return ConnectionError("the HTTP exchange failed")


class HttpxResponse:
    """A received response (`HttpResponse` of providers/base.py) over httpx.

    `status`: the HTTP status code; `headers`: lower-case names to values.
    """

    def __init__(self, response: httpx.Response) -> None:
        self._response = response
        self.status = response.status_code
        headers: dict[str, str] = {}
        for name, value in response.headers.multi_items():
            key = name.lower()
            headers[key] = f"{headers[key]}, {value}" if key in headers else value
        self.headers: Mapping[str, str] = headers

    async def read(self) -> bytes:
        """The whole body; raises `ConnectionError` if it is cut off or
        larger than `MAX_BODY_BYTES` (counted as it arrives, whatever
        `Content-Length` claims)."""
        import httpx

        data = bytearray()
        try:
            async for chunk in self._response.aiter_bytes():
                data.extend(chunk)
                if len(data) > MAX_BODY_BYTES:
                    raise ConnectionError("the response body is too large")
            return bytes(data)
        except (httpx.TransportError, httpx.StreamError) as exc:
            raise _connection_error(exc) from exc
        finally:
            await self._response.aclose()

    async def iter_bytes(self) -> AsyncIterator[bytes]:
        """The body chunk by chunk as it arrives; raises `ConnectionError` on a drop."""
        import httpx

        try:
            async for chunk in self._response.aiter_bytes():
                if chunk:
                    yield chunk
        except (httpx.TransportError, httpx.StreamError) as exc:
            raise _connection_error(exc) from exc

    async def aclose(self) -> None:
        """Release the connection; a body still streaming is aborted."""
        await self._response.aclose()


class HttpxPort(HttpPort):
    """`HttpPort` (providers/base.py) on an `httpx.AsyncClient`.

    `client`: an existing client to use (its owner closes it); without one,
    the port makes its own and `aclose()` closes it. `connect_timeout_s`:
    seconds allowed to connect. Raises `ConnectionError` when no response
    arrives.
    """

    def __init__(
        self,
        client: httpx.AsyncClient | None = None,
        *,
        connect_timeout_s: float = 10.0,
    ) -> None:
        import httpx

        self._owned = client is None
        self._client = client if client is not None else httpx.AsyncClient()
        self._connect_timeout_s = connect_timeout_s

    async def send(self, call: HttpCall) -> HttpxResponse:
        """Send `call` (`HttpPort.send`); returns once the status and headers arrived.

        Raises `ConnectionError` for a transport failure.
        """
        import httpx

        limit = call.timeout_s
        timeout = httpx.Timeout(
            connect=self._connect_timeout_s, read=limit, write=limit, pool=limit
        )
        try:
            request = self._client.build_request(
                call.method,
                call.url,
                headers=call.headers,
                json=call.json_body,
                timeout=timeout,
            )
            response = await self._client.send(request, stream=True)
        except httpx.InvalidURL as exc:
            raise ConnectionError("the URL is not valid") from exc
        except httpx.UnsupportedProtocol as exc:
            raise ConnectionError("the URL scheme is not supported") from exc
        except (httpx.TransportError, httpx.StreamError) as exc:
            raise _connection_error(exc) from exc
        return HttpxResponse(response)

    async def aclose(self) -> None:
        """Close the client if this port created it."""
        if self._owned:
            await self._client.aclose()
