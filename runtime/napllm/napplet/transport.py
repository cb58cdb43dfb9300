"""How the napplet-side API reaches the shell: a two-method port.

Rules (NIP-5D web projection; NAP-LLM, Wire Protocol)
- `Transport.send(envelope)` posts one napplet -> shell envelope (a plain
  JSON dict); `Transport.listen(receiver)` registers the one function that
  gets every shell -> napplet message (results and `llm.delta`), as plain
  JSON values. An optional `available()` says whether the `llm` domain is
  present (`available`); without it the domain is taken as present. The
  API never assumes anything else of a transport, so tests inject their
  own (for example one wired to the CPython shell).
- `PyodideTransport` (the default under Pyodide, `sys.platform ==
  "emscripten"`) posts raw envelopes to the napplet's own window, which the
  frame's prelude forwards to the shell over its private port, and reads
  `message` events whose `source` is `window.parent`: the prelude
  dispatches the shell's envelopes that way. Events from anything else
  (the napplet's own posts, other frames) are ignored.
- Received data is copied into Python through JSON text, so nothing but
  plain JSON reaches the API; data that cannot be copied is ignored.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any, Protocol

#: Gets one shell -> napplet message (a plain JSON value).
Receiver = Callable[[object], None]


class Transport(Protocol):
    """The port between the API and the shell (see the module rules)."""

    def send(self, envelope: dict[str, Any]) -> None:
        """Post one napplet -> shell envelope (plain JSON); may raise on failure."""

    def listen(self, receiver: Receiver) -> None:
        """Deliver every shell -> napplet message to `receiver` from now on."""


def available(transport: Transport) -> bool:
    """Whether the `llm` domain is present: the transport's optional
    `available()` method, true when it has none (NAP-LLM, Shell Behavior:
    "Domain absence MUST be discoverable without a `shell` handshake")."""
    check = getattr(transport, "available", None)
    return bool(check()) if callable(check) else True


class PyodideTransport:
    """The frame's transport under Pyodide (see the module rules).

    Raises `RuntimeError` when constructed outside a browser (no `js` module).
    """

    def __init__(self) -> None:
        try:
            import js  # type: ignore[import-not-found]
            from pyodide.ffi import create_proxy, to_js  # type: ignore[import-not-found]
        except ImportError as exc:  # pragma: no cover - CPython
            raise RuntimeError("PyodideTransport needs Pyodide in a browser window.") from exc
        self._js = js
        self._to_js = to_js
        self._create_proxy = create_proxy
        self._listener: Any = None

    def available(self) -> bool:
        """Whether the prelude gave this frame the `llm` domain (`window.napplet.llm`)."""
        try:
            napplet = getattr(self._js.window, "napplet", None)
            return napplet is not None and getattr(napplet, "llm", None) is not None
        except Exception:
            return False

    def send(self, envelope: dict[str, Any]) -> None:
        """Post `envelope` to this window; the prelude forwards it to the shell."""
        js = self._js
        value = self._to_js(envelope, dict_converter=js.Object.fromEntries)
        js.window.postMessage(value, "*")

    def listen(self, receiver: Receiver) -> None:
        """Deliver the shell's envelopes (events from `window.parent`) to `receiver`."""
        js = self._js
        same = getattr(js.Object, "is")  # `Object.is`: `is` is a Python keyword

        def on_message(event: Any) -> None:
            try:
                if not same(event.source, js.window.parent):
                    return
                text = js.JSON.stringify(event.data)
            except Exception:
                return
            if not isinstance(text, str):
                return
            try:
                message = json.loads(text)
            except ValueError:
                return
            receiver(message)

        if self._listener is not None:
            js.window.removeEventListener("message", self._listener)
        self._listener = self._create_proxy(on_message)
        js.window.addEventListener("message", self._listener)


def default_transport() -> Transport:
    """`PyodideTransport` under Pyodide; elsewhere raises `RuntimeError`
    (construct `Llm(transport)` with a transport of your own)."""
    if sys.platform == "emscripten":
        return PyodideTransport()
    raise RuntimeError(
        "No default transport outside Pyodide: construct Llm(transport) with your own transport."
    )
