"""The one internal provider contract: LMSP 1.0 requests in, LMSP events out.

Rules (docs/design.md, "The data path")
- Every provider kind (`kinds.ProviderKind`: the in-browser engines wasm,
  webllm and onnx, the services lmsp and openai, scripted, and the test
  build's fixture) implements `Provider.respond(request)`: an async
  iterator of `LmspEvent`s for one submission, ending with a terminal event
  (6.3). A provider whose service answers synchronously turns the response
  object into the same events (`events_from_response`), so the runtime
  normalises output in one place (`translate.GenerationAssembler`).
- A provider never sees a napplet, an endpoint or a NAP-LLM record: the
  shell validates, asks consent, translates and only then calls `respond`.
- Failures are raised as `ProviderFailure` (errors.py), never as raw
  exceptions carrying a service body; the shell turns any other exception
  into `provider-error` as well.
- Cancellation is task cancellation: the shell cancels the task iterating
  `respond`; a provider releases what it holds (aborts its fetch, interrupts
  its engine, cancels its LMSP task) in `finally`/`aclose`, best effort, and
  must not block the shell while doing so.
- Providers talk to the outside through ports: `HttpPort` (browser `fetch`
  or httpx under CPython) and engine ports defined by the engine providers.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from ..lmsp import LmspEvent, LmspRequest, LmspResponse, item_added, item_done


@runtime_checkable
class Provider(Protocol):
    """A route to one model that speaks LMSP 1.0 responses (section 6)."""

    def respond(self, request: LmspRequest) -> AsyncIterator[LmspEvent]:
        """Submit `request` and yield its events, the last one terminal.

        Raises `errors.ProviderFailure` for a failed submission or stream.
        """
        ...


#: The most bytes `HttpResponse.read` returns: a larger (or never-ending)
#: body is a `ConnectionError`, so a hostile server cannot fill the page's
#: memory. Streamed bodies (`iter_bytes`) are bounded by the generation's
#: own limits instead.
MAX_BODY_BYTES = 16 * 1024 * 1024


class HttpResponse(Protocol):
    """A received HTTP response whose body may still be streaming."""

    status: int
    headers: Mapping[str, str]  # lower-case names

    async def read(self) -> bytes:
        """The whole body; raises `ConnectionError` beyond `MAX_BODY_BYTES`."""
        ...

    def iter_bytes(self) -> AsyncIterator[bytes]:
        """The body as it arrives, chunk by chunk."""
        ...

    async def aclose(self) -> None:
        """Release the connection (aborts a body still streaming)."""
        ...


#: Shown in the shell UI (never to a napplet) when the browser refused a
#: request to a local address (`LocalNetworkBlocked`).
LOCAL_NETWORK_HINT = (
    "The browser blocked this page from reaching the model server on your local "
    "network. Allow local network access for this site (in the site settings, from "
    "the icon next to the address), then try again."
)


class LocalNetworkBlocked(ConnectionError):
    """The browser refused a request to a local or loopback address.

    Chromium's Local Network Access (a permission the user grants per site,
    denied or not yet granted) or its older private-network preflight, when
    the shell is served from a public address such as a GitHub Pages site
    and the model server listens on 127.0.0.1 or the home network.
    Providers turn it into `ProviderFailure` with `LOCAL_NETWORK_HINT`.
    """


def unreachable_hint(exc: BaseException, default: str) -> str:
    """The user hint for a request that got no response: `LOCAL_NETWORK_HINT`
    when the browser blocked a local address, else `default`."""
    return LOCAL_NETWORK_HINT if isinstance(exc, LocalNetworkBlocked) else default


@dataclass(frozen=True)
class HttpCall:
    """One HTTP request as a port sends it.

    `headers`: names as given (a plain dict, the port's own copy);
    `json_body`: sent as JSON with `Content-Type: application/json` when not
    `None`; `timeout_s`: seconds for the status and headers to arrive (and
    for each read), `None` for no limit.
    """

    method: str
    url: str
    headers: dict[str, str]
    json_body: Any = None
    timeout_s: float | None = None


class HttpPort(abc.ABC):
    """The HTTP client a network provider uses (fetch in the browser, httpx here).

    Callers use `request`; an implementation writes `send` only, so the
    call's shape is declared once. Both raise `ConnectionError` (or a
    subclass) when no response arrives: refused, reset, DNS, CORS or an
    aborted fetch; `LocalNetworkBlocked` when the browser refused a request
    to a local address.
    """

    async def request(
        self,
        method: str,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        json_body: Any = None,
        timeout_s: float | None = None,
    ) -> HttpResponse:
        """Send one request; returns once the status and headers arrived."""
        return await self.send(HttpCall(method, url, dict(headers or {}), json_body, timeout_s))

    @abc.abstractmethod
    async def send(self, call: HttpCall) -> HttpResponse:
        """Send `call`; returns once the status and headers arrived."""


def events_from_response(response: LmspResponse) -> list[LmspEvent]:
    """The event sequence (6.3) equivalent to a final synchronous response (6.2).

    Shape: `response.created`, then `output_item.added`/`done` per item, then
    the terminal event matching `status`. Items are passed through unparsed so
    that malformed ones are judged in one place (`translate`).
    """
    rid = response.id
    events = [
        LmspEvent(event="response.created", data={"response_id": rid, "status": "in_progress"})
    ]
    for index, item in enumerate(response.output):
        events += [item_added(rid, index, item), item_done(rid, index, item)]
    usage = response.usage.model_dump(exclude_none=True) if response.usage else None
    status = response.status
    if status == "completed":
        data: dict[str, Any] = {"response_id": rid, "status": status}
        if usage is not None:
            data["usage"] = usage
        events.append(LmspEvent(event="response.completed", data=data))
    elif status == "incomplete":
        details = (
            response.incomplete_details.model_dump(exclude_none=True)
            if response.incomplete_details
            else {}
        )
        data = {"response_id": rid, "status": status, "incomplete_details": details}
        if usage is not None:
            data["usage"] = usage
        events.append(LmspEvent(event="response.incomplete", data=data))
    elif status == "cancelled":
        events.append(
            LmspEvent(event="response.cancelled", data={"response_id": rid, "status": status})
        )
    else:
        # failed, or a non-final status where a final one was required
        error = response.error.model_dump(exclude_none=True) if response.error else {}
        events.append(
            LmspEvent(
                event="response.failed",
                data={"response_id": rid, "status": "failed", "error": error},
            )
        )
    return events
