"""Wires the napplet-side Python API (`napllm.napplet.Llm`) to the CPython shell.

`link(h)` opens an endpoint on `harness.Harness` `h` and returns a
`NappletSide`: the `napllm.napplet.Transport` of that endpoint. What the API
sends goes to `Shell.receive` (after a JSON round trip, as postMessage and
the page's wire text would carry it) on a later turn of the event loop;
what the shell sends to the endpoint comes back to the API the same way.
So an envelope the API builds passes the shell's intake, chooser, consent
and a fixture provider, and the real replies come back. `NappletSide.sent`
keeps every envelope the API sent, in order.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from harness import Harness, Transport


def _copy(value: Any) -> Any:
    return json.loads(json.dumps(value))


class LinkedTransport(Transport):
    """The shell's transport: records (as `harness.Transport`) and delivers to the napplet."""

    def __init__(self) -> None:
        super().__init__()
        self.receivers: dict[str, Callable[[object], None]] = {}

    def send(self, endpoint_id: str, envelope: dict[str, Any]) -> None:
        super().send(endpoint_id, envelope)
        receiver = self.receivers.get(endpoint_id)
        if receiver is not None:
            asyncio.get_running_loop().call_soon(receiver, _copy(envelope))


class NappletSide:
    """The API's transport for one endpoint of the harness."""

    def __init__(self, h: Harness, endpoint_id: str) -> None:
        self.h = h
        self.endpoint_id = endpoint_id
        self.sent: list[dict[str, Any]] = []

    def send(self, envelope: dict[str, Any]) -> None:
        self.sent.append(envelope)
        asyncio.get_running_loop().call_soon(self.h.send, self.endpoint_id, _copy(envelope))

    def listen(self, receiver: Callable[[object], None]) -> None:
        transport = self.h.transport
        assert isinstance(transport, LinkedTransport)
        transport.receivers[self.endpoint_id] = receiver

    def types(self) -> list[str]:
        """The types of the envelopes the API sent, in order."""
        return [e["type"] for e in self.sent]


def linked_harness(**options: Any) -> Harness:
    """A `Harness` whose transport delivers to linked napplets."""
    return Harness(transport=LinkedTransport(), **options)


def link(h: Harness, name: str = "python-napplet") -> NappletSide:
    """Open an endpoint with the llm domain and return its napplet-side transport."""
    return NappletSide(h, h.endpoint(name))
