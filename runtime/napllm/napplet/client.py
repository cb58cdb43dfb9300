"""`Llm`: the NAP-LLM operations for a napplet written in Python.

Rules (NAP-LLM, API Surface, Wire Protocol, Cancellation and deadlines)
- Every operation is one envelope sent through the `Transport`, built by
  `outgoing` and checked there by the shell's own intake before it is sent,
  with a fresh id (`py-<random>-<n>`; NAP-LLM: "a fresh ID for every
  request, including cancellation").
- Replies are matched by `inbox.Inbox`: by `id` *and* result type, deltas
  by `requestId`; exactly one terminal result is consumed per request.
- `select` remembers the chosen Model (`model`); `generate`, `stream` and
  `run_tools` use it, or select first (requirements derived from the
  request: `json` for structured output, `tools` for tools) when nothing is
  selected. `selection-expired` forgets it, so the next call selects
  again; nothing is retried automatically.
- Cancelling the asyncio task that awaits `generate` sends `llm.cancel` for
  it (and re-raises `asyncio.CancelledError`); the terminal result that
  follows is consumed.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, overload

from pydantic import BaseModel

from ..records import ModelRecord
from .errors import SelectionExpiredError, UnsupportedError
from .inbox import Inbox, OnMessage
from .outgoing import Messages, checked, to_messages
from .replies import Reply, read_cancelled, read_generation, read_model
from .streams import TextStream
from .structured import Structured
from .tools import run_tools
from .transport import Transport, available, default_transport

log = logging.getLogger("napllm.napplet")

M = TypeVar("M", bound=BaseModel)
#: A tool as `generate` takes it: a `Tool` from `@tool`, or a NAP-LLM Tool dict.
ToolLike = Any
#: `toolChoice`: "auto" | "none" | "required" | {"type": "tool", "name": ...}.
ToolChoiceLike = str | dict[str, str]


class Llm:
    """The napplet's NAP-LLM client (see the module rules).

    `transport`: the port to the shell; default `PyodideTransport` under
    Pyodide, created on first use. `napllm.napplet.llm` is the shared
    instance a napplet normally uses.
    """

    def __init__(self, transport: Transport | None = None) -> None:
        self._transport = transport
        self._listening = False
        self._inbox = Inbox()
        self._prefix = f"py-{secrets.token_hex(4)}-"
        self._ids = itertools.count(1)
        self._model: ModelRecord | None = None
        self._known: dict[str, ModelRecord] = {}
        self._selecting = asyncio.Lock()

    # -- the transport ----------------------------------------------------------

    @property
    def available(self) -> bool:
        """Whether this napplet has the `llm` domain (`window.napplet.llm` under
        Pyodide); when false every call raises `UnsupportedError` at once,
        without sending (NAP-LLM, Shell Behavior: domain absence)."""
        if self._transport is None:
            self._transport = default_transport()
        return available(self._transport)

    def _port(self) -> Transport:
        if not self.available:
            raise UnsupportedError("The llm domain is not available to this napplet.")
        assert self._transport is not None
        if not self._listening:
            self._transport.listen(self._inbox.receive)
            self._listening = True
        return self._transport

    def _send(
        self,
        kind: str,
        fields: dict[str, Any],
        *,
        model: ModelRecord | None = None,
        on_message: OnMessage | None = None,
    ) -> tuple[str, asyncio.Future[dict[str, Any]]]:
        """Check and send one request; its id and the future of its terminal result."""
        port = self._port()
        rid = f"{self._prefix}{next(self._ids)}"
        envelope = checked({"type": kind, "id": rid, **fields}, model)
        future = self._inbox.expect(rid, f"{kind}.result", on_message)
        try:
            port.send(envelope)
        except BaseException:
            self._inbox.forget(rid)
            raise
        return rid, future

    def _send_cancel(self, request_id: str) -> asyncio.Future[dict[str, Any]] | None:
        """Send `llm.cancel` for `request_id`; the future of its result (None if it failed)."""
        try:
            return self._send("llm.cancel", {"requestId": request_id})[1]
        except Exception:
            log.exception("could not send llm.cancel")
            return None

    # -- select / describe --------------------------------------------------------

    @property
    def model(self) -> ModelRecord | None:
        """The Model last selected (None before `select` or after it expired)."""
        return self._model

    async def select(
        self,
        *,
        model: str | None = None,
        images: bool | None = None,
        json: bool | None = None,
        tools: bool | None = None,
    ) -> ModelRecord:
        """Ask the person to choose a connection (NAP-LLM, `select`).

        Requirements: `model` (exact model id), `images`, `json`, `tools`
        (true requires the capability). Returns the `records.ModelRecord`
        (`handle`, `name`, `model`, `route`, `images`, `json_`, `tools`,
        `toolChoiceModes`) and remembers it for later calls. Raises
        `UserCancelledError` (declined), `UnsupportedError` (no compatible
        connection), `InvalidRequestError`, or another `LlmError`.
        """
        requirements = {
            k: v
            for k, v in (("model", model), ("images", images), ("json", json), ("tools", tools))
            if v is not None
        }
        fields = {"requirements": requirements} if requirements else {}
        _, future = self._send("llm.select", fields)
        chosen = read_model(await future)
        self._known[chosen.handle] = chosen
        self._model = chosen
        return chosen

    async def describe(self, model: ModelRecord | str | None = None) -> ModelRecord:
        """Revalidate a selection without a chooser (NAP-LLM, `describe`).

        `model`: a Model, a handle, or None for the current one. Returns the
        fresh Model. Raises `SelectionExpiredError` (select again; the
        current selection is forgotten), or another `LlmError`.
        """
        handle = self._handle(model)
        _, future = self._send("llm.describe", {"handle": handle})
        try:
            described = read_model(await future)
        except SelectionExpiredError:
            self._forget(handle)
            raise
        self._known[described.handle] = described
        return described

    def _handle(self, model: ModelRecord | str | None) -> str:
        if isinstance(model, ModelRecord):
            return model.handle
        if isinstance(model, str):
            return model
        if self._model is None:
            raise SelectionExpiredError("No model is selected; call select() first.")
        return self._model.handle

    def _forget(self, handle: str) -> None:
        self._known.pop(handle, None)
        if self._model is not None and self._model.handle == handle:
            self._model = None

    async def _model_for(
        self, model: ModelRecord | str | None, **needs: bool
    ) -> tuple[str, ModelRecord | None]:
        """The handle a generation uses (given, current, or selected now), and
        its Model record when known."""
        if isinstance(model, ModelRecord):
            return model.handle, model
        if isinstance(model, str):
            return model, self._known.get(model)
        async with self._selecting:
            if self._model is None:
                await self.select(
                    json=True if needs.get("json") else None,
                    tools=True if needs.get("tools") else None,
                )
            assert self._model is not None
            return self._model.handle, self._model

    # -- generate / stream / cancel ---------------------------------------------------

    async def _request(
        self,
        messages: Messages,
        *,
        model: ModelRecord | str | None,
        format: str | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        tools: Sequence[ToolLike] | None = None,
        tool_choice: ToolChoiceLike | None = None,
        prefix: list[dict[str, Any]] | None = None,
    ) -> tuple[ModelRecord | None, dict[str, Any]]:
        handle, chosen = await self._model_for(model, json=format == "json", tools=bool(tools))
        request: dict[str, Any] = {
            "handle": handle,
            "messages": [*(prefix or []), *to_messages(messages)],
        }
        optional = {
            "format": format,
            "maxTokens": max_tokens,
            "temperature": temperature,
            "tools": [t.record() if hasattr(t, "record") else t for t in tools] if tools else None,
            "toolChoice": tool_choice,
        }
        request.update({k: v for k, v in optional.items() if v is not None})
        return chosen, request

    async def _reply(
        self, messages: Messages, *, model: ModelRecord | str | None, **options: Any
    ) -> Reply:
        """Send one `llm.generate` (`_request`'s options) and await its terminal
        result (module rules)."""
        chosen, request = await self._request(messages, model=model, **options)
        rid, future = self._send("llm.generate", {"request": request}, model=chosen)
        try:
            message = await asyncio.shield(future)
        except asyncio.CancelledError:
            if not future.done():
                self._send_cancel(rid)
            raise
        try:
            return read_generation(message)
        except SelectionExpiredError:
            self._forget(request["handle"])
            raise

    @overload
    async def generate(
        self,
        messages: Messages,
        *,
        response_model: type[M],
        schema: None = None,
        schema_prompt: bool = True,
        format: str | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        tools: Sequence[ToolLike] | None = None,
        tool_choice: ToolChoiceLike | None = None,
        model: ModelRecord | str | None = None,
    ) -> M: ...
    @overload
    async def generate(
        self,
        messages: Messages,
        *,
        response_model: None = None,
        schema: dict[str, Any],
        schema_prompt: bool = True,
        format: str | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        tools: Sequence[ToolLike] | None = None,
        tool_choice: ToolChoiceLike | None = None,
        model: ModelRecord | str | None = None,
    ) -> dict[str, Any]: ...
    @overload
    async def generate(
        self,
        messages: Messages,
        *,
        response_model: None = None,
        schema: None = None,
        schema_prompt: bool = True,
        format: str | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        tools: Sequence[ToolLike] | None = None,
        tool_choice: ToolChoiceLike | None = None,
        model: ModelRecord | str | None = None,
    ) -> Reply: ...

    async def generate(
        self,
        messages: Messages,
        *,
        response_model: type[BaseModel] | None = None,
        schema: dict[str, Any] | None = None,
        schema_prompt: bool = True,
        format: str | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        tools: Sequence[ToolLike] | None = None,
        tool_choice: ToolChoiceLike | None = None,
        model: ModelRecord | str | None = None,
    ) -> Any:
        """One stateless generation (NAP-LLM, `generate`), awaited to its terminal result.

        `messages`: a user text, or NAP-LLM Message dicts (a `text` key is
        short for one text part). `response_model` (a pydantic model) or
        `schema` (a JSON Schema with root type object) asks for `format:
        "json"` and returns the validated instance / object (see
        `structured`); otherwise returns the `Reply` (`text`, `finish`,
        `tool_calls`, `usage`). `format` ("text" | "json"), `max_tokens`
        (maxTokens >= 1), `temperature`, `tools` (`Tool`s or Tool dicts; calls
        come back in `Reply.tool_calls`, nothing is run), `tool_choice`.
        `model`: a Model or handle (default: the selected one).

        Raises `InvalidRequestError` / `UnsupportedError` /
        `QuotaExceededError` before sending for a request the shell would
        refuse; the shell's errors as their `LlmError` class;
        `OutputValidationError` / `IncompleteOutputError` for structured output.
        """
        shape = Structured.of(response_model, schema)
        prefix = [shape.prompt()] if shape is not None and schema_prompt else None
        reply = await self._reply(
            messages,
            model=model,
            format="json" if shape is not None else format,
            max_tokens=max_tokens,
            temperature=temperature,
            tools=tools,
            tool_choice=tool_choice,
            prefix=prefix,
        )
        return shape.parse(reply) if shape is not None else reply

    def stream(
        self,
        messages: Messages,
        *,
        response_model: type[BaseModel] | None = None,
        schema: dict[str, Any] | None = None,
        schema_prompt: bool = True,
        max_tokens: int | None = None,
        temperature: float | None = None,
        model: ModelRecord | str | None = None,
    ) -> TextStream:
        """Stream a generation's text (NAP-LLM, `generate` with deltas).

        Returns a `TextStream`: `async for text in llm.stream(...)` yields
        text fragments as deltas arrive; `cancel()`, `break` or cancelling
        the task sends `llm.cancel` (see `streams`). The request is sent
        when the iteration starts; its errors are raised from the `async
        for`. With `response_model` / `schema` (as for `generate`) the JSON
        text streams and, at the end, `stream.parsed` holds the validated
        answer (`OutputValidationError` / `IncompleteOutputError` raised
        from the loop otherwise).
        """
        shape = Structured.of(response_model, schema)

        async def start(
            on_message: Callable[[dict[str, Any] | None], None],
        ) -> tuple[str, asyncio.Future[dict[str, Any]]]:
            chosen, request = await self._request(
                messages,
                model=model,
                format="json" if shape is not None else None,
                max_tokens=max_tokens,
                temperature=temperature,
                prefix=[shape.prompt()] if shape is not None and schema_prompt else None,
            )
            return self._send(
                "llm.generate", {"request": request}, model=chosen, on_message=on_message
            )

        return TextStream(start, self._send_cancel, shape.parse if shape is not None else None)

    async def cancel(self, request_id: str) -> bool:
        """Cancel this napplet's active generation `request_id` (NAP-LLM, `cancel`).

        Returns `cancelled`: true when an active generation was found and
        ended with `cancelled`; false when it had already ended or is unknown.
        """
        _, future = self._send("llm.cancel", {"requestId": request_id})
        return read_cancelled(await future)

    async def run_tools(self, messages: Messages, *, tools: Sequence[Any], **options: Any) -> Any:
        """The tool loop; see `tools.run_tools` for parameters, result and errors."""
        return await run_tools(self, messages, tools=tools, **options)
