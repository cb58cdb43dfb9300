"""The `lmsp` provider: a client of an LMSP 1.0 service (section 6; docs/lmsp.md).

Rules
- Every request carries `LMSP-Version: 1.0` and, when the connection has a
  credential, `Authorization: Bearer <credential>`. Every submission
  (`POST /lmsp/v1/responses` or `POST /lmsp/v1/tasks`) carries a fresh
  `Idempotency-Key` (a UUID4), reused only when the same submission is
  retried after a connection failure.
- Streams are read from the response body through `sse.py` (an
  `EventSource` cannot send `Authorization`). Events whose name napllm
  does not know (a `heartbeat`, a future event) are skipped first, before
  any id rule (6.3): SSE gives an event without an `id:` line the last id,
  so such an event must not count as a repeated id. Ids of known events
  must be integers, strictly increasing, the first one of a response being
  1 (6.4); a violation is a `provider-error`. Only the final `error` event
  may come without an id (docs/lmsp.md 2.3). Event data must be JSON
  objects, read by the strict reader (`jsontext.read_json`; lone surrogates
  are kept for the output assembler to join or replace), as is every
  other body.
- After a reconnection (6.4) a service may replay events the client
  already has (the last seen id, or ids at or below it): those are dropped
  silently until the first new id, so text is never doubled and the
  napplet's sequence stays contiguous. An id at or below the last one
  *after* new progress on that connection stays a violation.
- A synchronous answer (6.2) becomes events with `events_from_response`.
- Resumable mode (`resumable=True`) creates a task, follows
  `GET /lmsp/v1/tasks/{id}/events`, and after a dropped connection reconnects
  with `Last-Event-ID` and `?after=` (6.4) up to `max_reconnects` times in a
  row, with exponential backoff. On `410 event_history_expired` (or an
  `error` event carrying that code) it reads `GET /lmsp/v1/tasks/{id}`
  (polling while the task is still running) and turns the final response
  into events for what was not yet yielded: `response.created` is not
  repeated, items already done are skipped, an item that was added but not
  done only gets its `output_item.done` (whose full item lets the consumer
  complete the text already streamed, as `translate.GenerationAssembler` does),
  unseen items get `added` and `done`, then the terminal event. Text deltas
  already yielded are therefore never yielded again.
- Cancelling the iterating task (or `aclose()` on the iterator) closes the
  stream and, for a task not yet final, sends `POST /lmsp/v1/tasks/{id}/cancel`
  in the background, best effort, without blocking the caller.
- Failures are `ProviderFailure`s whose napplet-facing message is napllm's
  own (`failure_from_problem`): a service's `detail`, `title` or body never
  reaches a napplet; only the status and a sanitised LMSP `code` go into the
  developer `detail`.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any
from urllib.parse import quote

from pydantic import ValidationError

from ..errors import ProviderFailure
from ..jsontext import JsonTextError, read_json, read_stream_payload
from ..kinds import MAX_LISTED_MODELS, model_id_shown
from ..lmsp import (
    KNOWN_EVENTS,
    LMSP_VERSION,
    LmspEvent,
    LmspRequest,
    LmspResponse,
    ModelEntry,
    Task,
    failure_from_problem,
    parse_problem,
)
from ..records import Capabilities, ToolChoiceMode
from .base import HttpPort, HttpResponse, events_from_response, unreachable_hint
from .sse import SseEvent, SseParser

UNREACHABLE_HINT = (
    "Could not reach the LMSP service; check that it is running and the connection's address."
)
CONNECTION_LOST_HINT = "The connection to the LMSP service was lost during generation."

_FINAL = frozenset({"completed", "incomplete", "failed", "cancelled"})


def _malformed(what: str) -> ProviderFailure:
    return ProviderFailure(detail=f"LMSP protocol violation: {what}")


def _unreachable(what: str, exc: BaseException | None = None) -> ProviderFailure:
    hint = UNREACHABLE_HINT if exc is None else unreachable_hint(exc, UNREACHABLE_HINT)
    return ProviderFailure(detail=f"LMSP connection failed: {what}", user_hint=hint)


def _lost() -> ProviderFailure:
    return ProviderFailure(detail="LMSP stream ended early", user_hint=CONNECTION_LOST_HINT)


def api_root(base_url: str) -> str:
    """`<base>/lmsp/v1` for a connection's base URL (with or without that suffix)."""
    base = base_url.rstrip("/")
    if base.endswith("/lmsp/v1"):
        return base
    return base + "/lmsp/v1"


def _headers(credential: str | None, **extra: str) -> dict[str, str]:
    headers = {"LMSP-Version": LMSP_VERSION, **extra}
    if credential:
        headers["Authorization"] = f"Bearer {credential}"
    return headers


async def _json_body(response: HttpResponse) -> Any:
    """The body parsed as JSON, `None` when it is not JSON. Raises `ConnectionError`."""
    raw = await response.read()
    try:
        return read_json(raw)
    except JsonTextError:
        return None


async def _error_from(response: HttpResponse) -> ProviderFailure:
    """Read an error answer and map it; the body itself is then dropped."""
    try:
        body = await _json_body(response)
    except ConnectionError:
        body = None
    return failure_from_problem(response.status, parse_problem(body))


async def discover_models(
    http: HttpPort, base_url: str, credential: str | None, *, timeout_s: float | None = 30.0
) -> list[ModelEntry]:
    """`GET /lmsp/v1/models` (docs/lmsp.md): the service's models and capabilities.

    Returns the entries that parse as `ModelEntry` and whose id
    `kinds.model_id_shown` accepts (others and repeated ids are skipped), at
    most `MAX_LISTED_MODELS`.
    Raises `ProviderFailure`: unreachable service (with a hint), an error
    answer (`failure_from_problem`), or a body that is not a model list.
    """
    try:
        response = await http.request(
            "GET",
            api_root(base_url) + "/models",
            headers=_headers(credential, Accept="application/json"),
            timeout_s=timeout_s,
        )
    except ConnectionError as exc:
        raise _unreachable("models", exc) from exc
    if response.status != 200:
        raise await _error_from(response)
    try:
        body = await _json_body(response)
    except ConnectionError as exc:
        raise _unreachable("models body") from exc
    if not isinstance(body, dict) or not isinstance(body.get("data"), list):
        raise _malformed("model list is not an object with a data list")
    entries: list[ModelEntry] = []
    for raw in body["data"]:
        try:
            entry = ModelEntry.model_validate(raw)
        except ValidationError:
            continue
        if model_id_shown(entry.id) and all(e.id != entry.id for e in entries):
            entries.append(entry)
            if len(entries) == MAX_LISTED_MODELS:
                break
    return entries


def capabilities_from_entry(entry: ModelEntry) -> Capabilities:
    """NAP-LLM capability flags of one LMSP model (NAP-LLM, Model; docs/lmsp.md).

    `tools` -> tool calling, with the modes of `capabilities.tool_choice`
    (always including `auto` and `none`, which NAP-LLM requires of every
    tool-capable connection and LMSP 6.5 defines) or `auto`, `none` when the
    service lists none; `structured_output` -> `json`; `images` -> image
    input (images in tool results are not assumed).
    """
    caps = entry.capabilities
    modes: tuple[ToolChoiceMode, ...] = ()
    if caps.tools:
        listed: list[ToolChoiceMode] = list(caps.tool_choice or [])
        modes = tuple(dict.fromkeys(["auto", "none", *listed]))
    return Capabilities(
        images=caps.images,
        json_output=caps.structured_output,
        tools=caps.tools,
        tool_choice_modes=modes,
    )


class _EventCheck:
    """Strictly increasing integer event ids from 1 (6.4) and JSON-object data.

    `accept(raw)` returns the checked event, or `None` for an event to skip
    silently (an unknown event name, or a replayed id right after
    `reconnected()`); raises `ProviderFailure` for a violation.
    """

    def __init__(self) -> None:
        self.last_id = 0
        self._replay_floor = 0  # ids at or below it may be replayed once

    def reconnected(self) -> None:
        """A new connection for the same response: tolerate replayed ids."""
        self._replay_floor = self.last_id

    def accept(self, raw: SseEvent) -> LmspEvent | None:
        if raw.event not in KNOWN_EVENTS:
            return None  # skipped before any id rule (see the module rules)
        text = raw.id
        event_id: int | None = None
        if text.isascii() and text.isdigit() and len(text) <= 16:
            event_id = int(text)
        replayed = event_id is not None and event_id <= self._replay_floor
        if self._replay_floor and replayed and raw.event != "error":
            return None  # already seen before the reconnection
        self._replay_floor = 0  # new progress: from here on, strictly increasing
        try:
            data = read_stream_payload(raw.data)
        except JsonTextError as exc:
            raise _malformed("event data is not strict JSON") from exc
        if not isinstance(data, dict):
            raise _malformed("event data is not an object")
        if raw.event == "error" and (not text or text == str(self.last_id)):
            # docs/lmsp.md 2.3: the `error` event is not tied to the response
            # and has no `id:` (SSE then repeats the last id, if any)
            return LmspEvent(id=None, event=raw.event, data=data)
        if event_id is None:
            raise _malformed("event id is not an integer")
        if event_id <= self.last_id or (self.last_id == 0 and event_id != 1):
            raise _malformed("event ids are not strictly increasing from 1")
        self.last_id = event_id
        return LmspEvent(id=event_id, event=raw.event, data=data)


class SeenEvents:
    """What was yielded of one response, to resume from its final response object.

    `note(event)` records each yielded event; `remaining(response)` returns
    the events of `events_from_response(response)` not yet yielded:
    `response.created` once, `output_item.added` only for unseen items,
    `output_item.done` for items not yet done, and the terminal event
    (6.4 and docs/lmsp.md 5.3; see the module rules).
    """

    def __init__(self) -> None:
        self.created = False
        self.added: set[int] = set()
        self.done: set[int] = set()

    def note(self, event: LmspEvent) -> None:
        index = event.data.get("output_index")
        if event.event == "response.created":
            self.created = True
        elif event.event == "response.output_item.added" and isinstance(index, int):
            self.added.add(index)
        elif event.event == "response.output_item.done" and isinstance(index, int):
            self.done.add(index)

    def remaining(self, response: LmspResponse) -> list[LmspEvent]:
        """Events of `response` not yet yielded (see the module rules)."""
        out: list[LmspEvent] = []
        for event in events_from_response(response):
            index = event.data.get("output_index")
            if event.event == "response.created":
                if self.created:
                    continue
            elif event.event == "response.output_item.added":
                if index in self.added or index in self.done:
                    continue
            elif event.event == "response.output_item.done" and index in self.done:
                continue
            out.append(event)
        return out


def _is_history_expired(event: SseEvent) -> bool:
    if event.event != "error":
        return False
    try:
        data = read_json(event.data)
    except JsonTextError:
        return False
    error = data.get("error") if isinstance(data, dict) else None
    return isinstance(error, dict) and error.get("code") == "event_history_expired"


class _HistoryExpired(Exception):
    """The task's event history no longer holds what we need (6.4)."""


class LmspProvider:
    """`Provider` for one model of an LMSP 1.0 service (section 6; docs/lmsp.md).

    `http`: the HTTP port; `base_url`: the service root (e.g.
    `http://127.0.0.1:11435`); `credential`: the bearer token or `None`.
    `resumable`: submit as a task and resume dropped streams (6.4);
    `max_reconnects`: reconnections allowed in a row without a new event;
    `backoff_s` / `max_backoff_s`: first and largest pause between them
    (doubling); `timeout_s`: per-read bound passed to the port (`None`: only
    the runtime's deadline bounds a generation); `sleep` and
    `idempotency_key` may be replaced (tests). `respond` raises
    `ProviderFailure` (see the module rules).
    """

    def __init__(
        self,
        http: HttpPort,
        base_url: str,
        credential: str | None = None,
        *,
        resumable: bool = False,
        max_reconnects: int = 5,
        backoff_s: float = 0.25,
        max_backoff_s: float = 4.0,
        timeout_s: float | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        idempotency_key: Callable[[], str] = lambda: str(uuid.uuid4()),
    ) -> None:
        self._http = http
        self._root = api_root(base_url)
        self._credential = credential
        self.resumable = resumable
        self._max_reconnects = max_reconnects
        self._backoff_s = backoff_s
        self._max_backoff_s = max_backoff_s
        self._timeout_s = timeout_s
        self._sleep = sleep
        self._new_key = idempotency_key
        self._background: set[asyncio.Task[None]] = set()

    # -- public ----------------------------------------------------------------

    def respond(self, request: LmspRequest) -> AsyncIterator[LmspEvent]:
        """Submit `request`; yield its events, the last one terminal (6.3).

        Synchronous requests (`stream: false`, not resumable) are answered by
        one response object turned into events. Raises `ProviderFailure`.
        """
        if self.resumable:
            return self._respond_task(request)
        if request.stream:
            return self._respond_stream(request)
        return self._respond_sync(request)

    async def join_background(self, timeout_s: float = 5.0) -> None:
        """Wait (bounded) for background task cancellations to finish."""
        pending = set(self._background)
        if pending:
            await asyncio.wait(pending, timeout=timeout_s)

    # -- helpers -----------------------------------------------------------------

    def _backoff(self, attempt: int) -> float:
        return float(min(self._max_backoff_s, self._backoff_s * (2 ** max(0, attempt - 1))))

    async def _submit(self, path: str, body: dict[str, Any], accept: str) -> HttpResponse:
        """POST a submission, retrying connection failures with the same key."""
        key = self._new_key()
        attempt = 0
        while True:
            try:
                return await self._http.request(
                    "POST",
                    self._root + path,
                    headers=_headers(self._credential, Accept=accept, **{"Idempotency-Key": key}),
                    json_body=body,
                    timeout_s=self._timeout_s,
                )
            except ConnectionError as exc:
                attempt += 1
                if attempt > self._max_reconnects or not self.resumable:
                    raise _unreachable("submission", exc) from exc
                await self._sleep(self._backoff(attempt))

    async def _read_response_object(self, response: HttpResponse) -> LmspResponse:
        try:
            body = await _json_body(response)
        except ConnectionError as exc:
            raise _lost() from exc
        try:
            return LmspResponse.model_validate(body)
        except ValidationError as exc:
            raise _malformed("response object") from exc

    async def _events(
        self, response: HttpResponse, check: _EventCheck, *, task_stream: bool = False
    ) -> AsyncIterator[LmspEvent]:
        """The checked, known events of one SSE body; stops after a terminal one.

        Raises `ConnectionError` when the body is cut off (the caller decides
        whether to resume), `_HistoryExpired` on a task stream's expiry error.
        """
        parser = SseParser()
        async for chunk in response.iter_bytes():
            for raw in parser.feed(chunk):
                if task_stream and _is_history_expired(raw):
                    raise _HistoryExpired
                event = check.accept(raw)
                if event is None:
                    continue
                yield event
                if event.terminal:
                    return
        for raw in parser.close():
            if task_stream and _is_history_expired(raw):
                raise _HistoryExpired
            event = check.accept(raw)
            if event is not None:
                yield event
                if event.terminal:
                    return
        raise ConnectionError("the event stream ended before a final event")

    # -- synchronous (6.2) ---------------------------------------------------------

    async def _respond_sync(self, request: LmspRequest) -> AsyncIterator[LmspEvent]:
        response = await self._submit("/responses", request.to_json(), "application/json")
        try:
            if response.status != 200:
                raise await _error_from(response)
            result = await self._read_response_object(response)
        finally:
            await response.aclose()
        for event in events_from_response(result):
            yield event

    # -- direct stream (6.3) ---------------------------------------------------------

    async def _respond_stream(self, request: LmspRequest) -> AsyncIterator[LmspEvent]:
        response = await self._submit("/responses", request.to_json(), "text/event-stream")
        try:
            if response.status != 200:
                raise await _error_from(response)
            if response.headers.get("content-type", "").startswith("application/json"):
                # a service that answered synchronously despite `stream: true`
                for event in events_from_response(await self._read_response_object(response)):
                    yield event
                return
            try:
                async for event in self._events(response, _EventCheck()):
                    yield event
            except ConnectionError as exc:
                # 6.4: a direct stream belongs to its connection; no resume
                raise _lost() from exc
        finally:
            await response.aclose()

    # -- tasks and resume (6.4) --------------------------------------------------------

    async def _respond_task(self, request: LmspRequest) -> AsyncIterator[LmspEvent]:
        body = request.to_json()
        body["stream"] = True
        created = await self._submit("/tasks", body, "application/json")
        try:
            if created.status not in (200, 201, 202):
                raise await _error_from(created)
            try:
                task = Task.model_validate(await _json_body(created))
            except (ValidationError, ConnectionError) as exc:
                raise _malformed("task object") from exc
        finally:
            await created.aclose()

        task_url = f"{self._root}/tasks/{quote(task.id, safe='')}"
        finished = False
        try:
            async for event in self._follow_task(task_url):
                if event.terminal:
                    finished = True
                yield event
        finally:
            if not finished:
                self._cancel_in_background(task_url)

    async def _follow_task(self, task_url: str) -> AsyncIterator[LmspEvent]:
        check = _EventCheck()
        seen = SeenEvents()
        failures = 0
        while True:
            after = check.last_id
            headers = _headers(self._credential, Accept="text/event-stream")
            url = task_url + "/events"
            if after:
                headers["Last-Event-ID"] = str(after)
                url += f"?after={after}"
            try:
                response = await self._http.request(
                    "GET", url, headers=headers, timeout_s=self._timeout_s
                )
            except ConnectionError as exc:
                failures += 1
                await self._retry_after(failures, exc)
                continue
            expired = False
            try:
                if response.status == 410:
                    problem = parse_problem(await _safe_json(response))
                    if problem is not None and problem.code not in (None, "event_history_expired"):
                        raise failure_from_problem(410, problem)
                    expired = True
                elif response.status != 200:
                    raise await _error_from(response)
                else:
                    before = check.last_id
                    if before:
                        check.reconnected()
                    try:
                        async for event in self._events(response, check, task_stream=True):
                            seen.note(event)
                            yield event
                            if event.terminal:
                                return
                    except _HistoryExpired:
                        expired = True
                    except ConnectionError as exc:
                        if check.last_id > before:
                            failures = 0  # progress was made; the count starts again
                        failures += 1
                        if failures > self._max_reconnects:
                            raise _lost() from exc
            finally:
                await response.aclose()
            if expired:
                for event in await self._final_events(task_url, seen):
                    yield event
                return
            await self._sleep(self._backoff(failures))

    async def _retry_after(self, failures: int, exc: ConnectionError) -> None:
        """Wait before reconnect try `failures` (from 1) after `exc`.

        Raises the lost-stream `ProviderFailure` once `failures` passes
        `max_reconnects` (6.4: a client resumes a broken stream a bounded
        number of times).
        """
        if failures > self._max_reconnects:
            raise _lost() from exc
        await self._sleep(self._backoff(failures))

    async def _final_events(self, task_url: str, seen: SeenEvents) -> list[LmspEvent]:
        """After 410: the task's final response as the events not yet yielded."""
        attempt = 0
        while True:
            try:
                response = await self._http.request(
                    "GET",
                    task_url,
                    headers=_headers(self._credential, Accept="application/json"),
                    timeout_s=self._timeout_s,
                )
            except ConnectionError as exc:
                attempt += 1
                await self._retry_after(attempt, exc)
                continue
            try:
                if response.status != 200:
                    raise await _error_from(response)
                try:
                    task = Task.model_validate(await _json_body(response))
                except ValidationError as exc:
                    raise _malformed("task object") from exc
                except ConnectionError as exc:
                    raise _lost() from exc
            finally:
                await response.aclose()
            if task.response is not None and task.response.status in _FINAL:
                return seen.remaining(task.response)
            if task.status in _FINAL:
                raise _malformed("final task without a final response")
            # still generating: poll (the runtime's deadline bounds this)
            attempt = min(attempt + 1, 8)
            await self._sleep(self._backoff(attempt))

    def _cancel_in_background(self, task_url: str) -> None:
        """Send `POST {task}/cancel` without waiting for it (best effort)."""
        try:
            job = asyncio.ensure_future(self._send_cancel(task_url))
        except RuntimeError:
            return  # no running loop: nothing can be sent any more
        self._background.add(job)
        job.add_done_callback(self._background.discard)

    async def _send_cancel(self, task_url: str) -> None:
        try:
            response = await self._http.request(
                "POST",
                task_url + "/cancel",
                headers=_headers(self._credential, Accept="application/json"),
                timeout_s=10.0,
            )
            await response.aclose()
        except Exception:  # best effort: the generation may already be over
            return


async def _safe_json(response: HttpResponse) -> Any:
    try:
        return await _json_body(response)
    except ConnectionError:
        return None
