"""The `openai` provider: OpenAI-compatible chat-completions servers over HTTP.

Ollama, llama.cpp's server, llama-cpp-python's server, LM Studio and vLLM
speak `POST /v1/chat/completions`. Requests and chunks are mapped by
`chat_request.py` and `chat_stream.py`; this module only moves them through the `HttpPort`
(browser `fetch` or httpx, the same code under both).

Rules
- Discovery: `GET /v1/models` lists model ids (`discover_models`).
- Every submission is `POST /v1/chat/completions` with `stream: true` and
  `stream_options.include_usage`; the SSE body is parsed by `sse.py` and
  ends at `data: [DONE]` (never parsed as JSON) or the end of the body.
  Keep-alives are ignored: comments, `retry:` lines, events whose data is
  empty or blank (`data: ` as some proxies send before the first chunk) and
  events with a name other than `message` or `error`. Every other payload
  is read by the strict reader (`jsontext.read_json`); one that fails it is
  `provider-error`. A server that answers with
  a JSON completion instead is accepted (`chat_response_to_lmsp`).
- `Authorization: Bearer <api key>` is sent only when a key is set.
- Error answers (`{"error": {"message", "type", "code"}}`, Ollama's
  `{"error": "..."}`, or any other body) and mid-stream error chunks become
  `ProviderFailure`s with napllm's own messages: 401/403 -> `provider-error`
  with a key hint for the shell, 429 -> `quota-exceeded`, a context-length
  error -> `unsupported` with a fixed sentence, anything else ->
  `provider-error`. Server text never reaches a napplet.
- A prompt the server cut to fit its context ends the generation with
  `unsupported` (the context sentence), never a success: when the server
  flags it (`"truncated": true`) or the reported `usage` fills the context
  window the connection knows (`context_window`: the connection's
  `contextSize` setting, read from the server's model listing when the
  connection is added, `model_context_window`). A server that cuts
  silently and reports no window cannot be caught (docs/security.md).
- `<tool_call>` blocks in the content are parsed into calls when the request
  offers tools (servers whose chat template emits Hermes-style calls as
  text, such as llama-cpp-python's generic handler).
- Cancelling the iterating task (or `aclose()`) closes the stream, which is
  how these servers are told to stop generating.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

from ..errors import ErrorCode, ProviderFailure
from ..jsontext import JsonTextError, read_json, read_stream_payload
from ..kinds import MAX_LISTED_MODELS, model_id_shown
from ..lmsp import LmspEvent, LmspRequest
from .base import HttpPort, HttpResponse, unreachable_hint
from .chat_request import ResponseFormatStyle, lmsp_to_chat
from .chat_stream import ChatStreamToLmsp, chat_response_to_lmsp
from .sse import SseParser

CONTEXT_TOO_LONG = "The conversation is too long for the selected model's context window."
KEY_REJECTED_HINT = "The model server rejected the API key; check the connection's key."
UNREACHABLE_HINT = (
    "Could not reach the model server; check that it is running and the connection's address."
)
CONNECTION_LOST_HINT = "The connection to the model server was lost during generation."
MODEL_MISSING_HINT = "The model server does not serve the selected model."

_CONTEXT_CODES = frozenset(
    {"context_length_exceeded", "exceed_context_size_error", "context_window_exceeded"}
)
_TOKEN = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,63}")


def _token(value: object) -> str | None:
    return value if isinstance(value, str) and _TOKEN.fullmatch(value) else None


def api_root(base_url: str) -> str:
    """`<base>/v1` for a connection's base URL (with or without that suffix)."""
    base = base_url.rstrip("/")
    return base if base.endswith("/v1") else base + "/v1"


def failure_from_error(status: int | None, body: object) -> ProviderFailure:
    """The failure for an error answer or error chunk of an OpenAI-style server.

    `status`: the HTTP status (`None` for a mid-stream error chunk); `body`:
    the parsed JSON, whatever its shape. Only the status and a sanitised
    `type`/`code` token reach the developer `detail`; messages are fixed.
    """
    kind = code = None
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        kind = _token(body["error"].get("type"))
        code = _token(body["error"].get("code"))
    detail = f"OpenAI-compatible status={status} type={kind} code={code}"
    if code in _CONTEXT_CODES or kind in _CONTEXT_CODES:
        return ProviderFailure(ErrorCode.UNSUPPORTED, detail=detail, safe_message=CONTEXT_TOO_LONG)
    if status in (401, 403):
        return ProviderFailure(detail=detail, user_hint=KEY_REJECTED_HINT)
    if status == 429:
        return ProviderFailure(ErrorCode.QUOTA_EXCEEDED, detail=detail)
    if status == 404:
        return ProviderFailure(detail=detail, user_hint=MODEL_MISSING_HINT)
    return ProviderFailure(detail=detail)


def _headers(api_key: str | None, accept: str) -> dict[str, str]:
    headers = {"Accept": accept}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return headers


async def _json(response: HttpResponse) -> Any:
    try:
        raw = await response.read()
    except ConnectionError:
        return None
    try:
        return read_json(raw)
    except JsonTextError:
        return None


async def _get_models(
    http: HttpPort, base_url: str, api_key: str | None, timeout_s: float | None
) -> tuple[int, Any]:
    """`GET /v1/models`: (status, the JSON body or `None`); raises what the port raises."""
    response = await http.request(
        "GET",
        api_root(base_url) + "/models",
        headers=_headers(api_key, "application/json"),
        timeout_s=timeout_s,
    )
    try:
        return response.status, await _json(response)
    finally:
        await response.aclose()


async def discover_models(
    http: HttpPort, base_url: str, api_key: str | None, *, timeout_s: float | None = 30.0
) -> list[str]:
    """`GET /v1/models`: the ids the server lists, in its order, without duplicates.

    Only ids `kinds.model_id_shown` accepts, at most `MAX_LISTED_MODELS`.

    Raises `ProviderFailure` for an unreachable server (with a hint), an
    error answer, or a body that is not `{"data": [{"id": ...}, ...]}`.
    """
    try:
        status, body = await _get_models(http, base_url, api_key, timeout_s)
    except ConnectionError as exc:
        hint = unreachable_hint(exc, UNREACHABLE_HINT)
        raise ProviderFailure(detail="models: unreachable", user_hint=hint) from exc
    if status != 200:
        raise failure_from_error(status, body)
    if not isinstance(body, dict) or not isinstance(body.get("data"), list):
        raise ProviderFailure(detail="models: not a model list")
    ids = [e.get("id") for e in body["data"] if isinstance(e, dict)]
    kept = list(dict.fromkeys(i for i in ids if isinstance(i, str) and model_id_shown(i)))
    return kept[:MAX_LISTED_MODELS]


#: Fields of a `/v1/models` entry that servers use for the serving context (tokens):
#: OpenRouter and others `context_length`, vLLM `max_model_len`, LM Studio
#: `max_context_length`; llama.cpp's server `meta.n_ctx` (not `n_ctx_train`).
_WINDOW_FIELDS = ("context_length", "max_model_len", "max_context_length", "context_window")
#: Largest context window believed (tokens); a larger claim is ignored.
MAX_CONTEXT_WINDOW = 16 * 1024 * 1024


def context_window_of(entry: object) -> int | None:
    """The serving context window a `/v1/models` entry reports, in tokens, or `None`."""
    if not isinstance(entry, dict):
        return None
    candidates = [entry.get(name) for name in _WINDOW_FIELDS]
    meta = entry.get("meta")
    if isinstance(meta, dict):
        candidates.append(meta.get("n_ctx"))
    for value in candidates:
        if (
            isinstance(value, int)
            and not isinstance(value, bool)
            and 1 <= value <= MAX_CONTEXT_WINDOW
        ):
            return value
    return None


async def model_context_window(
    http: HttpPort, base_url: str, api_key: str | None, model: str, *, timeout_s: float = 5.0
) -> int | None:
    """The context window `GET /v1/models` reports for `model` (tokens), or `None`.

    Never raises: an unreachable server, an error answer or a listing
    without such a field all give `None` (the window is then unknown).
    """
    try:
        status, body = await _get_models(http, base_url, api_key, timeout_s)
    except Exception:  # unreachable, blocked, cut off: the window stays unknown
        return None
    if status != 200 or not isinstance(body, dict) or not isinstance(body.get("data"), list):
        return None
    for entry in body["data"]:
        if isinstance(entry, dict) and entry.get("id") == model:
            return context_window_of(entry)
    return None


class OpenAICompatProvider:
    """`Provider` for one model of an OpenAI-compatible server.

    `http`: the HTTP port; `base_url`: the server root (`/v1` optional);
    `api_key`: sent as a bearer token when set; `response_format_style`: how
    JSON output is asked for (`chat_request.ResponseFormatStyle`);
    `parse_tool_call_blocks`: parse `<tool_call>` content into calls (`None`:
    whenever the request offers tools); `timeout_s`: per-read bound passed
    to the port; `context_window`: the model's serving context in tokens,
    when known (module rules). `respond` raises `ProviderFailure` (module
    rules).
    """

    def __init__(
        self,
        http: HttpPort,
        base_url: str,
        api_key: str | None = None,
        *,
        response_format_style: ResponseFormatStyle = "json_schema",
        parse_tool_call_blocks: bool | None = None,
        timeout_s: float | None = None,
        context_window: int | None = None,
    ) -> None:
        self._http = http
        self._context_window = context_window
        self._url = api_root(base_url) + "/chat/completions"
        self._api_key = api_key
        self._style: ResponseFormatStyle = response_format_style
        self._parse_blocks = parse_tool_call_blocks
        self._timeout_s = timeout_s

    def respond(self, request: LmspRequest) -> AsyncIterator[LmspEvent]:
        """Stream one chat completion as LMSP events (6.3). Raises `ProviderFailure`."""
        return self._respond(request)

    async def _respond(self, request: LmspRequest) -> AsyncIterator[LmspEvent]:
        body = lmsp_to_chat(request, response_format_style=self._style)
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
        parse_blocks = bool(request.tools) if self._parse_blocks is None else self._parse_blocks
        try:
            response = await self._http.request(
                "POST",
                self._url,
                headers=_headers(self._api_key, "text/event-stream"),
                json_body=body,
                timeout_s=self._timeout_s,
            )
        except ConnectionError as exc:
            hint = unreachable_hint(exc, UNREACHABLE_HINT)
            raise ProviderFailure(detail="chat: unreachable", user_hint=hint) from exc
        try:
            if response.status != 200:
                raise failure_from_error(response.status, await _json(response))
            if response.headers.get("content-type", "").startswith("application/json"):
                completion = await _json(response)
                if isinstance(completion, dict) and completion.get("error"):
                    raise failure_from_error(None, completion)
                for event in chat_response_to_lmsp(
                    completion,
                    parse_tool_call_blocks=parse_blocks,
                    context_window=self._context_window,
                ):
                    yield event
                return
            state = ChatStreamToLmsp(
                parse_tool_call_blocks=parse_blocks, context_window=self._context_window
            )
            try:
                async for event in self._stream(response, state):
                    yield event
            except ConnectionError as exc:
                raise ProviderFailure(
                    detail="chat: stream cut off", user_hint=CONNECTION_LOST_HINT
                ) from exc
            for event in state.finish():
                yield event
        finally:
            await response.aclose()

    async def _stream(
        self, response: HttpResponse, state: ChatStreamToLmsp
    ) -> AsyncIterator[LmspEvent]:
        """Chunks of the SSE body, mapped; returns at `[DONE]` or the body's end."""
        parser = SseParser()
        async for raw in response.iter_bytes():
            for event in parser.feed(raw):
                payload = event.data.strip()
                if payload == "[DONE]":
                    return
                if not payload or event.event not in ("message", "error"):
                    continue  # keep-alive or an event this provider does not use
                for lmsp_event in self._chunk(event.event, payload, state):
                    yield lmsp_event
        for event in parser.close():
            payload = event.data.strip()
            if payload == "[DONE]":
                return
            if not payload or event.event not in ("message", "error"):
                continue
            for lmsp_event in self._chunk(event.event, payload, state):
                yield lmsp_event

    def _chunk(self, name: str, data: str, state: ChatStreamToLmsp) -> list[LmspEvent]:
        try:
            # lone surrogates are kept: a delta may carry half of a UTF-16
            # pair, joined with the next one by the output assembler
            chunk = read_stream_payload(data)
        except JsonTextError as exc:
            raise ProviderFailure(detail="chat: chunk is not strict JSON") from exc
        if name == "error" or (isinstance(chunk, dict) and chunk.get("error")):
            raise failure_from_error(None, chunk)
        return state.feed(chunk)
