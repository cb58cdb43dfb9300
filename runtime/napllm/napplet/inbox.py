"""Matching the shell's replies to the napplet's requests.

Rules (NAP-LLM, Wire Protocol: "A routable, validly correlated request
receives exactly one terminal result with its ID and matching result type";
"No deltas may follow the terminal result")
- A request waits under its id with the result type it expects. A result
  settles it only when both match; the first one removes it, so exactly one
  terminal result is consumed per request and anything later for that id
  is ignored.
- `llm.delta` goes to the waiting generation named by its `requestId`
  (`on_message`); after the terminal result, `on_message(None)` tells it
  the generation ended.
- Anything else (not an object, an unknown type, a foreign id) is ignored;
  `receive` never raises.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("napllm.napplet")

#: Gets a generation's deltas, then None once its terminal result arrived.
OnMessage = Callable[[dict[str, Any] | None], None]


@dataclass
class _Waiting:
    kind: str
    future: asyncio.Future[dict[str, Any]]
    on_message: OnMessage | None = None


class Inbox:
    """The requests waiting for their terminal result (see the module rules)."""

    def __init__(self) -> None:
        self._waiting: dict[str, _Waiting] = {}

    def __len__(self) -> int:
        return len(self._waiting)

    def expect(
        self, rid: str, kind: str, on_message: OnMessage | None = None
    ) -> asyncio.Future[dict[str, Any]]:
        """Wait for the `kind` result of request `rid`; the future of that envelope."""
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[rid] = _Waiting(kind, future, on_message)
        return future

    def forget(self, rid: str) -> None:
        """Stop waiting for `rid` (its request could not be sent)."""
        self._waiting.pop(rid, None)

    def receive(self, message: object) -> None:
        """Handle one shell -> napplet message. Never raises."""
        try:
            self._dispatch(message)
        except Exception:  # a bad message must never break the napplet
            log.exception("ignored a message from the shell")

    def _dispatch(self, message: object) -> None:
        if not isinstance(message, dict) or not isinstance(message.get("type"), str):
            return
        kind = message["type"]
        if kind == "llm.delta":
            rid = message.get("requestId")
            waiting = self._waiting.get(rid) if isinstance(rid, str) else None
            if waiting is not None and waiting.on_message is not None:
                waiting.on_message(message)
            return
        rid = message.get("id")
        waiting = self._waiting.get(rid) if isinstance(rid, str) else None
        if waiting is None or waiting.kind != kind:
            return
        del self._waiting[rid]  # type: ignore[arg-type]
        if not waiting.future.done():
            waiting.future.set_result(message)
        if waiting.on_message is not None:
            waiting.on_message(None)
