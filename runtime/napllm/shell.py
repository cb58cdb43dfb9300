"""The shell: endpoints and accounts, dispatching each request to its part.

Pure asyncio behind ports (no browser imports; `shell_ports` defines them
and the records they exchange): `Transport` (envelopes to an endpoint),
`Chooser` (the model chooser), `Consent` (the disclosure dialog),
`ProviderFactory` (connection -> provider), `Clock` (deadlines, delta
coalescing) and an optional `Observer` (inspector, user notices). The
shell reads each request once (`intake.read_request`) and hands it to one
of three parts, each of which owns its rules: `select` and `describe` (the
chooser, its list revisions, handles) to `selections.Selections`, standing
grants to `grants.Grants`, `generate` and `cancel` to
`generations.Generations`. The lifecycles of a generation and of an
endpoint are the tables of `lifecycle`.

Rules (NAP-LLM, API Surface, Wire Protocol, Cancellation and deadlines,
Shell Behavior, Security Considerations)
- An *endpoint* is one loaded napplet document (docs/design.md,
  "Endpoint"), live until it closes (`lifecycle.EndpointLife`). Every request is
  bound to the endpoint that sent it and to the current account; results,
  deltas and cancellation go only to that endpoint. A closed endpoint gets
  nothing more; its work is cancelled and its handles invalidated.
- An endpoint without the `llm` domain gets, for each request envelope (a
  request type with a usable id, well-formed or not), its result with
  `unsupported` and `DOMAIN_UNAVAILABLE` (NAP-LLM, Error Handling: domain
  unavailable), the same for every request, so it learns nothing a missing
  `window.napplet.llm` does not say (the page answers the same way for a
  frame whose LLM access is off, web/js/wire.js); anything else is dropped.
- A message that is not a request is dropped (`Observer.dropped`), a
  malformed request gets the error its check names.
- An account switch cancels every generation and pending select of every
  endpoint and invalidates every handle; a connection edited or removed
  takes its handles, grants and generations with it.
- Error messages are the runtime's own sentences; provider failures keep
  their details for the shell UI and developer log only.
- Tool calls are never executed by the runtime; they are returned.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

from .connections import ConnectionRegistry
from .errors import unsupported
from .generations import Generations
from .grants import Grants
from .intake import Cancel, Describe, Generate, Select, read_request
from .lifecycle import EndpointEvent, EndpointLife, EndpointState
from .selections import Selections
from .shell_ports import (
    AsyncioClock,
    ChoicePick,
    ChoiceRequest,
    Chooser,
    Clock,
    Consent,
    ConsentDecision,
    Disclosure,
    Grant,
    NappletIdentity,
    Observer,
    ProviderFactory,
    ShellPolicy,
    TimerHandle,
    ToolResultDisclosure,
    Transport,
)
from .wire import Dropped, Envelope, Malformed, error_result, parse_envelope

log = logging.getLogger("napllm.shell")

#: What every request of an endpoint without the `llm` domain is answered
#: (module rules; web/js/wire.js `WITHOUT_LLM` has the same words).
DOMAIN_UNAVAILABLE = "The llm domain is not available to this napplet."

#: The ports and their records live in `shell_ports`; they are importable from here too.
__all__ = [
    "AsyncioClock",
    "ChoicePick",
    "ChoiceRequest",
    "Chooser",
    "Clock",
    "Consent",
    "ConsentDecision",
    "Disclosure",
    "Grant",
    "NappletIdentity",
    "Observer",
    "ProviderFactory",
    "Shell",
    "ShellPolicy",
    "TimerHandle",
    "ToolResultDisclosure",
    "Transport",
]

# --------------------------------------------------------------------------
# State


@dataclass
class _Endpoint:
    id: str
    napplet: NappletIdentity
    life: EndpointLife = field(default_factory=EndpointLife)  # lifecycle.ENDPOINT_TRANSITIONS


class Shell:
    """The NAP-LLM runtime for all endpoints of one page.

    Construct with the ports, then call `open_endpoint` for each napplet
    frame, `receive` for each message it posts, `close_endpoint` when its
    document goes away, and `switch_account` on a profile change.
    """

    def __init__(
        self,
        connections: ConnectionRegistry,
        transport: Transport,
        chooser: Chooser,
        consent: Consent,
        providers: ProviderFactory,
        *,
        policy: ShellPolicy | None = None,
        clock: Clock | None = None,
        observer: Observer | None = None,
        account: str = "default",
    ) -> None:
        self.connections = connections
        self.policy = policy or ShellPolicy()
        self._transport = transport
        self._chooser = chooser
        self._consent = consent
        self._providers = providers
        self._clock = clock or AsyncioClock()
        self._observer = observer or Observer()
        self._account = account
        self._endpoints: dict[str, _Endpoint] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        # the ports are read at call time: the test build wraps the transport and chooser
        self._selections = Selections(
            connections,
            policy=lambda: self.policy,
            chooser=lambda: self._chooser,
            account=lambda: self._account,
            send=self._send_to,
            spawn=self._spawn,
        )
        self._grants = Grants(lambda: self._observe("grants_changed"))
        self._generations = Generations(
            policy=lambda: self.policy,
            clock=self._clock,
            grants=self._grants,
            send=self._send_to,
            resolve=lambda endpoint_id, handle: self._selections.resolve(
                endpoint_id, self._account, handle
            ),
            consent=lambda disclosure: self._consent.ask(disclosure),
            providers=lambda connection: self._providers(connection),
            observe=self._observe,
            spawn=self._spawn,
        )
        connections.subscribe(self._connection_changed)

    # -- public API ------------------------------------------------------------

    @property
    def account(self) -> str:
        """The current account (profile)."""
        return self._account

    def open_endpoint(self, napplet: NappletIdentity) -> str:
        """Register a newly loaded napplet document; returns its endpoint id."""
        endpoint_id = "ep-" + secrets.token_hex(8)
        self._endpoints[endpoint_id] = _Endpoint(endpoint_id, napplet)
        self._selections.open_endpoint(endpoint_id)
        return endpoint_id

    def close_endpoint(self, endpoint_id: str) -> None:
        """The document is gone: cancel its work silently, invalidate its handles.

        The close transition runs while the endpoint is still registered, so
        it is observable (`endpoint_state`, `Observer.endpoint_closed`) and
        everything its work does while being cancelled sees it closed; the
        endpoint is forgotten last. Closing twice, or an unknown id, is a no-op.
        """
        endpoint = self._endpoints.get(endpoint_id)
        if endpoint is None or not endpoint.life.can(EndpointEvent.CLOSE):
            return
        endpoint.life.fire(EndpointEvent.CLOSE)
        try:
            self._observe("endpoint_closed", endpoint_id)
            self._generations.close_endpoint(endpoint_id)
            self._selections.close_endpoint(endpoint_id)
        finally:
            del self._endpoints[endpoint_id]

    def endpoint_state(self, endpoint_id: str) -> EndpointState | None:
        """The endpoint's `lifecycle.EndpointState`, or None once it is forgotten."""
        endpoint = self._endpoints.get(endpoint_id)
        return endpoint.life.state if endpoint is not None else None

    def receive(self, endpoint_id: str, message: object) -> None:
        """Handle one message from an endpoint. Never raises.

        `message` is the parsed JSON value, or `wire.Unclonable`. Messages of
        unknown or closed endpoints are dropped silently.
        """
        endpoint = self._endpoints.get(endpoint_id)
        if endpoint is None or not endpoint.life.live:
            return
        self._observe("envelope", endpoint_id, "in", message)
        try:
            self._dispatch(endpoint, message)
        except Exception:  # the shell must survive its own bugs
            log.exception("unexpected failure handling a message")

    def switch_account(self, account: str) -> None:
        """Change the profile: cancel all pending work, invalidate every handle."""
        if account == self._account:
            return
        self._generations.cancel_all()
        self._selections.switch_account()
        self._account = account

    def grants(self) -> list[Grant]:
        """The standing consent grants."""
        return self._grants.all()

    def revoke_grant(self, key: str) -> bool:
        """Remove a standing grant; True if it existed."""
        return self._grants.revoke(key)

    async def idle(self) -> None:
        """Wait until every task the shell started has finished (tests, shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def aclose(self) -> None:
        """Close every endpoint and wait for the tasks to end."""
        for endpoint_id in list(self._endpoints):
            self.close_endpoint(endpoint_id)
        await self.idle()

    # -- dispatch ------------------------------------------------------------------

    def _dispatch(self, endpoint: _Endpoint, message: object) -> None:
        if "llm" not in endpoint.napplet.domains:
            shaped = parse_envelope(message)
            if isinstance(shaped, Envelope | Malformed):
                error = unsupported(DOMAIN_UNAVAILABLE)
                self._send(endpoint, error_result(shaped.type, shaped.id, error))
            else:
                self._observe("dropped", endpoint.id, "llm domain not exposed")
            return
        parsed = read_request(message)  # envelope shape -> records -> conversation rules
        if isinstance(parsed, Dropped):
            self._observe("dropped", endpoint.id, parsed.reason)
        elif isinstance(parsed, Malformed):
            self._send(endpoint, error_result(parsed.type, parsed.id, parsed.error))
        elif isinstance(parsed, Select):
            self._selections.start(endpoint.id, endpoint.napplet, parsed)
        elif isinstance(parsed, Describe):
            self._selections.describe(endpoint.id, parsed)
        elif isinstance(parsed, Generate):
            self._generations.start(endpoint.id, endpoint.napplet, parsed, self._account)
        elif isinstance(parsed, Cancel):
            self._generations.cancel(endpoint.id, parsed)

    def _observe(self, hook: str, *args: Any) -> None:
        """Call an `Observer` hook; it only watches, so its failure is logged, never raised."""
        try:
            getattr(self._observer, hook)(*args)
        except Exception:
            log.exception("observer failed")

    def _send(self, endpoint: _Endpoint, envelope: dict[str, Any]) -> bool:
        """Deliver one envelope; whether the transport took it.

        The observer only watches: its failure is logged and never stops a
        delivery. A transport that raises is taken as "not delivered".
        """
        if not endpoint.life.live:
            return False
        self._observe("envelope", endpoint.id, "out", envelope)
        try:
            self._transport.send(endpoint.id, envelope)
        except Exception:
            log.exception("transport failed")
            return False
        return True

    def _send_to(self, endpoint_id: str, envelope: dict[str, Any]) -> bool:
        """`_send` by endpoint id; False when the endpoint is gone."""
        endpoint = self._endpoints.get(endpoint_id)
        return endpoint is not None and self._send(endpoint, envelope)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # -- connection changes -------------------------------------------------------------

    def _connection_changed(self, connection_id: str, change: str) -> None:
        self._selections.connection_changed(connection_id, change)
        if change == "added":
            return
        self._grants.forget_connection(connection_id)
        self._generations.connection_removed(connection_id)
