"""HTTP routes of the LMSP local model service (LMSP 1.0, section 6; docs/lmsp.md).

Routes (all under `/lmsp/v1`, all behind the bearer token):
- `GET /models`, `GET /models/{id}`: the served model and its capabilities.
- `POST /responses`: synchronous (6.2) or streamed (6.3) response.
- `GET /responses/{id}`: a response stored with `store: true` (6.2).
- `POST /tasks`, `GET /tasks/{id}`, `GET /tasks/{id}/events`,
  `POST /tasks/{id}/cancel`: background generation with resumable events
  (6.4; task endpoints as assumed in docs/lmsp.md).

Rules
- Every error is an RFC 9457 problem document (problems.py); an unexpected
  exception is logged and answered with a detail-free 500.
- `LMSP-Version` is optional; a major version other than 1 is a 400
  `unsupported_version`. Every answer carries `LMSP-Version: 1.0`.
- Bodies above `max_body_bytes` are refused with 413 before they are read
  in full; POST bodies must be `application/json`.
- `Idempotency-Key` on `POST /responses` and `POST /tasks`: the same key and
  body replays the first outcome (the same response object, the same
  events, the same task); the same key with another body is 422
  `idempotency_conflict`; while the first request runs, 409
  `idempotency_in_progress`. A direct stream that ended before its final
  event was sent (the client went away, or stopped reading and a send
  timed out after `send_timeout_s`) is cancelled and forgotten, so a retry
  generates again.
- A direct stream or a synchronous request whose client disconnects cancels
  its generation (6.3); a task's generation is independent of its readers.
- CORS (Starlette's middleware) is answered for the configured origins
  only, including Private Network Access preflights
  (`Access-Control-Request-Private-Network: true` is answered with
  `Access-Control-Allow-Private-Network: true` for those origins only).
- Every answer passes through the CORS middleware, the 500 of an
  unexpected exception too: it is made by `ErrorGuard`, inside CORS
  (Starlette would answer handlers registered for `Exception` outside it,
  and the browser would report a network failure instead of the problem).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from sse_starlette import EventSourceResponse
from sse_starlette.sse import SendTimeoutError
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..jsontext import JsonTextError, read_json
from ..lmsp import LMSP_VERSION, LmspEvent, ModelList
from .auth import BearerAuth
from .output import new_id
from .problems import ProblemError, problem_body, problem_response
from .service import LmspService, _Idempotent
from .tasks import (
    EventCursorInvalid,
    EventHistoryExpired,
    ResponseRun,
    Task,
)
from .validation import (
    BODY_MAX_DEPTH,
    Checked,
)

log = logging.getLogger("napllm.lmsp_service")

PREFIX = "/lmsp/v1"
CORS_HEADERS = ["Authorization", "Content-Type", "Idempotency-Key", "LMSP-Version", "Last-Event-ID"]
_VERSION = re.compile(r"\s*(\d+)\.(\d+)\s*")
_IDEMPOTENCY_KEY = re.compile(r"[\x21-\x7e]{1,255}")
_TRANSIENT = frozenset({"model_unavailable", "server_busy"})


# -- HTTP helpers ------------------------------------------------------------------


async def _read_body(request: Request, limit: int, timeout_s: float) -> bytes:
    """The request body, refusing more than `limit` bytes (413), non-JSON types (415)
    and a body not received within `timeout_s` seconds (408 `request_timeout`)."""
    content_type = request.headers.get("content-type", "")
    if content_type.split(";")[0].strip().lower() != "application/json":
        raise ProblemError("unsupported_media_type")
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ProblemError("payload_too_large")
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise ProblemError("payload_too_large")
                chunks.append(chunk)
    except TimeoutError:
        raise ProblemError("request_timeout") from None
    except ClientDisconnect:
        # The client left while sending: no one reads an answer, and it is
        # no fault of the service (logged as one, a flood of such clients
        # filled the log with tracebacks).
        raise ProblemError("request_timeout") from None
    return b"".join(chunks)


def _fingerprint(path: str, raw: Any) -> str:
    canonical = json.dumps(raw, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(f"{path}\n{canonical}".encode()).hexdigest()


def _idempotency_key(request: Request) -> str | None:
    key = request.headers.get("idempotency-key")
    if key is None:
        return None
    if not _IDEMPOTENCY_KEY.fullmatch(key):
        raise ProblemError("invalid_request", "The Idempotency-Key header is malformed.")
    return key


def _sse(event: LmspEvent) -> dict[str, Any]:
    return {
        "id": str(event.id) if event.id is not None else None,
        "event": event.event,
        "data": json.dumps(event.data, separators=(",", ":"), ensure_ascii=False),
    }


def _event_stream(
    events: AsyncIterator[dict[str, Any]], send_timeout_s: float
) -> EventSourceResponse:
    """An SSE answer whose every send (event or ping) must finish within `send_timeout_s`.

    A reader that stops reading fills the socket buffers; the send that
    blocks then times out, the stream ends and `events` is closed (its
    `finally` blocks run).
    """
    return EventSourceResponse(
        events, ping=15, headers={"Cache-Control": "no-store"}, send_timeout=send_timeout_s
    )


async def _until_disconnected(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


# -- routes ----------------------------------------------------------------------------


class LmspHandlers:
    """The service's HTTP handlers, one method per route (docs/lmsp.md).

    Each handler takes a Starlette `Request` and returns a `Response`, or
    raises `ProblemError` (turned into a problem answer by the app); the
    shared state is `service` and its `config`. Built by `build_app`;
    tests may call a handler directly.
    """

    def __init__(self, service: LmspService) -> None:
        self.service = service
        self.config = service.config

    async def list_models(self, request: Request) -> Response:
        """GET /models: the one served model (6.4). Raises `ProblemError`."""
        return JSONResponse(
            ModelList(object="list", data=[self.service.model_entry()]).model_dump(mode="json")
        )

    async def get_model(self, request: Request) -> Response:
        """GET /models/{model_id}: the served model, or `model_not_found`. Raises `ProblemError`."""
        if request.path_params["model_id"] != self.service.facts.model_id:
            raise ProblemError("model_not_found")
        return JSONResponse(self.service.model_entry().model_dump(mode="json"))

    async def _begin(
        self, request: Request, scope_name: str
    ) -> tuple[_Idempotent | None, tuple[str, str] | None, Checked | None, list[int]]:
        """Shared start of POST /responses and POST /tasks, with idempotency.

        Returns `(entry, store_key, checked, tokens)`: `checked` is `None`
        when `entry` holds a finished outcome to replay; `entry` and
        `store_key` are `None` without an `Idempotency-Key`. Raises
        `ProblemError`.
        """
        body = await _read_body(request, self.config.max_body_bytes, self.config.body_timeout_s)
        key = _idempotency_key(request)
        if key is None:
            checked, tokens, _raw = await self.service.prepare(body)
            return None, None, checked, tokens
        store_key = (scope_name, key)
        try:
            raw_for_print = read_json(body, max_depth=BODY_MAX_DEPTH)
        except JsonTextError:
            raw_for_print = body.hex()  # refused later by prepare(); only the bytes count
        fingerprint = _fingerprint(scope_name, raw_for_print)
        existing = self.service.idempotency.get(store_key)
        if existing is not None:
            if existing.fingerprint != fingerprint:
                raise ProblemError("idempotency_conflict")
            if existing.problem is not None:
                raise existing.problem
            finished = existing.run is not None and existing.run.done.is_set()
            if existing.task is None and not finished:
                raise ProblemError("idempotency_in_progress")
            return existing, store_key, None, []
        entry = _Idempotent(fingerprint=fingerprint)
        self.service.idempotency.put(store_key, entry)
        try:
            checked, tokens, _raw = await self.service.prepare(body)
        except ProblemError as problem:
            if problem.code in _TRANSIENT:
                self.service.idempotency.pop(store_key)  # a retry may well succeed
            else:
                entry.problem = problem
            raise
        except BaseException:
            self.service.idempotency.pop(store_key)
            raise
        return entry, store_key, checked, tokens

    async def _start(
        self, request: Request, scope_name: str, retention_s: float | None
    ) -> tuple[_Idempotent | None, tuple[str, str] | None, ResponseRun, Checked | None]:
        """`_begin`, then start the generation unless the key replays an earlier one.

        Returns `(entry, store_key, run, checked)`: `checked` is `None` for
        a replay, and `run` is then the entry's earlier run; otherwise `run`
        is new (its events kept `retention_s` seconds, `None`: all of them)
        and recorded in `entry`. A refused start (`server_busy`) forgets the
        key, so that a retry may succeed. Raises `ProblemError`.
        """
        entry, store_key, checked, tokens = await self._begin(request, scope_name)
        if checked is None:
            assert entry is not None and entry.run is not None
            return entry, store_key, entry.run, None
        try:
            run = self.service.start(checked, tokens, retention_s=retention_s)
        except ProblemError as problem:
            if store_key is not None:
                self.service.idempotency.pop(store_key)
            raise problem from None
        if entry is not None:
            entry.run = run
        return entry, store_key, run, checked

    async def create_response(self, request: Request) -> Response:
        """POST /responses: generate, streamed (SSE) or answered whole (6.1-6.3).

        Raises `ProblemError`.
        """
        entry, store_key, run, checked = await self._start(request, "responses", None)
        if checked is None:
            # A replay of a finished request with the same key and body.
            if run.streamed:
                replay = run.all_events()

                async def replayed() -> AsyncIterator[dict[str, Any]]:
                    for event in replay:
                        yield _sse(event)

                return _event_stream(replayed(), self.config.send_timeout_s)
            return _final_answer(run, request.url.path)
        run_stream = checked.request.stream
        run.streamed = run_stream
        if run_stream:

            async def live() -> AsyncIterator[dict[str, Any]]:
                delivered = False
                try:
                    async for event in run.follow(0):
                        yield _sse(event)
                        delivered = event.terminal  # resumed: the send went through
                finally:
                    if not delivered:
                        # The client went away or stopped reading (send timeout):
                        # stop generating and forget the key, so a retry
                        # generates again instead of replaying what nobody read.
                        run.cancel_flag.set()
                        if (
                            store_key is not None
                            and self.service.idempotency.get(store_key) is entry
                        ):
                            self.service.idempotency.pop(store_key)

            return _event_stream(live(), self.config.send_timeout_s)
        waiter = asyncio.create_task(run.done.wait())
        watcher = asyncio.create_task(_until_disconnected(request))
        try:
            await asyncio.wait({waiter, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watcher.cancel()
            if not run.done.is_set():
                run.cancel_flag.set()
                if store_key is not None:
                    self.service.idempotency.pop(store_key)
                waiter.cancel()
        if not run.done.is_set():
            # The client is gone and generation was cancelled; nobody reads this.
            return Response(status_code=204)
        return _final_answer(run, request.url.path)

    async def get_response(self, request: Request) -> Response:
        """GET /responses/{response_id}: a stored response, or `response_not_found`.

        Raises `ProblemError`.
        """
        run = self.service.find_response(request.path_params["response_id"])
        if run is None:
            raise ProblemError("response_not_found")
        return JSONResponse(run.snapshot())

    async def create_task(self, request: Request) -> Response:
        """POST /tasks: start a background generation; 202 with the task (6.6).

        Raises `ProblemError`.
        """
        entry, _key, run, checked = await self._start(request, "tasks", self.config.retention_s)
        if checked is None:  # a replay: the same task again
            assert entry is not None and entry.task is not None
            task = entry.task
        else:
            task = Task(id=new_id("task"), run=run)
            self.service.add_task(task)
            if entry is not None:
                entry.task = task
        return JSONResponse(
            task.to_json(),
            status_code=202,
            headers={"Location": f"{PREFIX}/tasks/{task.id}"},
        )

    def _find_task(self, request: Request) -> Task:
        """The task named in the path; raises `ProblemError` (`task_not_found`)."""
        task = self.service.find_task(request.path_params["task_id"])
        if task is None:
            raise ProblemError("task_not_found")
        return task

    async def get_task(self, request: Request) -> Response:
        """GET /tasks/{task_id}: the task, or `task_not_found`. Raises `ProblemError`."""
        return JSONResponse(self._find_task(request).to_json())

    async def task_events(self, request: Request) -> Response:
        """GET /tasks/{task_id}/events: the task's events from `after` / `Last-Event-ID` (SSE).

        Raises `ProblemError`.
        """
        task = self._find_task(request)
        after_text = request.query_params.get("after")
        if after_text is None:
            after_text = request.headers.get("last-event-id")
        after = 0
        if after_text is not None:
            if not after_text.strip().isdigit():
                raise ProblemError("invalid_request", "The resume point must be an event id.")
            after = int(after_text.strip())
        run = task.run
        try:
            run.check_cursor(after)
        except EventCursorInvalid as exc:
            raise ProblemError(
                "invalid_request", "The resume point is after the last event."
            ) from exc
        except EventHistoryExpired as exc:
            raise ProblemError("event_history_expired") from exc

        async def follow() -> AsyncIterator[dict[str, Any]]:
            try:
                async for event in run.follow(after):
                    yield _sse(event)
            except EventHistoryExpired:
                yield {
                    "event": "error",
                    "data": json.dumps({"error": problem_body("event_history_expired")}),
                }

        return _event_stream(follow(), self.config.send_timeout_s)

    async def cancel_task(self, request: Request) -> Response:
        """POST /tasks/{task_id}/cancel: cancel and wait briefly for the run to end.

        Raises `ProblemError`.
        """
        task = self._find_task(request)
        task.run.cancel_flag.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(task.run.done.wait(), timeout=10)
        return JSONResponse(task.to_json())


def build_app(service: LmspService, token: str) -> Starlette:
    """The ASGI application serving `service` behind `token` (docs/lmsp.md)."""
    auth = BearerAuth(token)
    config = service.config
    handlers = LmspHandlers(service)
    routes = [
        Route(f"{PREFIX}/models", handlers.list_models, methods=["GET"]),
        Route(f"{PREFIX}/models/{{model_id:path}}", handlers.get_model, methods=["GET"]),
        Route(f"{PREFIX}/responses", handlers.create_response, methods=["POST"]),
        Route(f"{PREFIX}/responses/{{response_id}}", handlers.get_response, methods=["GET"]),
        Route(f"{PREFIX}/tasks", handlers.create_task, methods=["POST"]),
        Route(f"{PREFIX}/tasks/{{task_id}}", handlers.get_task, methods=["GET"]),
        Route(f"{PREFIX}/tasks/{{task_id}}/events", handlers.task_events, methods=["GET"]),
        Route(f"{PREFIX}/tasks/{{task_id}}/cancel", handlers.cancel_task, methods=["POST"]),
    ]

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        service.schema_pool.start()  # the workers import their modules meanwhile
        yield
        await service.close()

    middleware = [
        Middleware(
            LmspCors,
            allow_origins=list(config.allow_origins),
            allow_methods=["GET", "POST"],
            allow_headers=CORS_HEADERS,
            expose_headers=["LMSP-Version", "Location"],
            allow_private_network=True,  # answered for allowed origins only
            max_age=600,
        ),
        Middleware(ErrorGuard),
        Middleware(LmspGate, auth=auth),
    ]
    on_error: dict[Any, Callable[[Request, Exception], Awaitable[Response]]] = {
        ProblemError: _on_problem,
        HTTPException: _on_http,
    }
    return Starlette(
        routes=routes,
        middleware=middleware,
        exception_handlers=on_error,
        lifespan=lifespan,
    )


async def _on_problem(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ProblemError)
    return problem_response(exc, request.url.path)


async def _on_http(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "invalid_request")
    return problem_response(ProblemError(code), request.url.path)


def _final_answer(run: ResponseRun, instance: str) -> Response:
    """A synchronous answer (6.2): the response object, or a problem when it failed."""
    if run.status == "failed" and run.error is not None:
        body = dict(run.error)
        body["instance"] = instance
        return JSONResponse(
            body, status_code=int(body["status"]), media_type="application/problem+json"
        )
    return JSONResponse(run.snapshot())


# -- middleware --------------------------------------------------------------------------


class LmspGate:
    """Pure ASGI middleware: bearer token and `LMSP-Version` checks, version header.

    Written as plain ASGI (not `BaseHTTPMiddleware`) so streamed bodies and
    client disconnects pass through untouched.
    """

    def __init__(self, app: ASGIApp, auth: BearerAuth) -> None:
        self.app = app
        self.auth = auth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)

        async def send_with_version(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers.append((b"lmsp-version", LMSP_VERSION.encode()))
                message = {**message, "headers": headers}
            await send(message)

        try:
            self.auth.check(request.headers.get("authorization"))
            version = request.headers.get("lmsp-version")
            if version is not None:
                match = _VERSION.fullmatch(version)
                if match is None or match.group(1) != "1":
                    raise ProblemError("unsupported_version")
        except ProblemError as problem:
            response = problem_response(problem, request.url.path)
            await response(scope, receive, send_with_version)
            return
        await self.app(scope, receive, send_with_version)


class LmspCors(CORSMiddleware):
    """Starlette's CORS middleware, answering private-network preflights for allowed origins only.

    Starlette adds `Access-Control-Allow-Private-Network: true` to a refused
    preflight too; here it is removed unless the origin is allowed.
    """

    def preflight_response(self, request_headers: Headers) -> Response:
        """The preflight answer (see the class docstring)."""
        response = super().preflight_response(request_headers)
        if not self.is_allowed_origin(origin=request_headers["origin"]):
            del response.headers["access-control-allow-private-network"]
        return response


class ErrorGuard:
    """Pure ASGI middleware: any unexpected exception becomes the generic 500 problem.

    Placed inside the CORS middleware so the 500 carries the CORS headers;
    it adds `LMSP-Version` itself (the gate inside it may be what failed).
    When the answer had already started (a stream), the exception is only
    logged and the connection ends.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except SendTimeoutError:
            # The reader stopped reading; the stream's own cleanup already ran.
            log.info("ended a stream whose reader stopped reading (%s)", scope.get("path"))
        except Exception:
            path = str(scope.get("path", ""))
            log.exception("unhandled error on %s %s", scope.get("method"), path)
            if started:
                return
            response = problem_response(
                ProblemError("internal_error"), path, headers={"LMSP-Version": LMSP_VERSION}
            )
            await response(scope, receive, send)
