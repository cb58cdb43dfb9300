"""The shell: endpoints and accounts, dispatching each request to its part.

Pure asyncio behind ports (no browser imports; `shell_ports` defines them
and the records they exchange): `Transport` (envelopes to an endpoint),
`Chooser` (the model chooser), `Consent` (the disclosure dialog),
`ProviderFactory` (connection -> provider), `Clock` (deadlines, delta
coalescing) and an optional `Observer` (inspector, user notices). The
shell dispatches each request to one of three parts: handles are
`selections.Selections`, standing grants `grants.Grants`, generations
`generations.Generations`; the lifecycles of a generation and of an
endpoint are the tables of `lifecycle`.

Rules (NAP-LLM, API Surface, Wire Protocol, Cancellation and deadlines,
Shell Behavior, Security Considerations)
- An *endpoint* is one loaded napplet document (docs/design.md,
  "Endpoint"), live until it closes (`lifecycle.EndpointLife`). Every request is
  bound to the endpoint that sent it and to the current account; results,
  deltas and cancellation go only to that endpoint. A closed endpoint gets
  nothing more; its work is cancelled and its handles invalidated.
- `select` offers only connections that meet every requirement (exact
  model, images, json, tools); none -> `unsupported` without a dialog; the
  user's decline -> `user-cancelled`. Never substitutes, never downgrades.
- A pick binds only what the person saw: every list the chooser shows has
  a revision (`ChoiceRequest.revision`, bumped whenever the fitting
  connections change) and the pick names the revision it was made on
  (`ChoicePick`). A pick from an older list is never bound: the chooser
  shows the current list again (at most `max_chooser_reshows` times, then
  `selection-expired`). A pick of the current list binds only the exact
  connection record offered in it (a connection edited, or removed and
  re-added under the same id, is another record).
- Handles are random, opaque and scoped to endpoint + account + the exact
  connection record. Unknown, foreign, edited, removed, account-switched or
  endpoint-closed handles are `selection-expired`, all alike.
- `generate` and `cancel` belong to `generations.Generations`, which owns
  a generation from its checks through consent (before *every*
  submission; a standing grant counts) to its one terminal result, and
  settles it immediately on cancel, deadline, endpoint close, account
  switch or connection removal (its module holds those rules).
- Error messages are the runtime's own sentences; provider failures keep
  their details for the shell UI and developer log only.
- Tool calls are never executed by the runtime; they are returned.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field, replace
from typing import Any

from .connection_records import Connection
from .connections import ConnectionRegistry
from .errors import ErrorCode, NapError, unsupported
from .generations import Generations, answer
from .grants import Grants
from .intake import Cancel, Describe, Generate, Select, read_request
from .lifecycle import EndpointEvent, EndpointLife
from .records import ModelRecord, Requirements
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
from .wire import Dropped, Malformed, error_result, model_result

log = logging.getLogger("napllm.shell")

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
    # unique key -> (the napplet's select id, the chooser task); ids may repeat
    selects: dict[str, tuple[str, asyncio.Task[None]]] = field(default_factory=dict)
    # unique key (as in `selects`) -> the chooser's open choice
    choices: dict[str, _Choice] = field(default_factory=dict)


@dataclass
class _Choice:
    """An open chooser: what it was asked and what it offers now."""

    # the request given to the pending `choose` call (identifies the dialog)
    asked: ChoiceRequest
    # the list it shows now (`asked`, or the latest refresh), with its revision
    request: ChoiceRequest
    # connection id -> the exact record of every candidate offered now
    offered: dict[str, Connection]


def _same_offer(a: dict[str, Connection], b: dict[str, Connection]) -> bool:
    return list(a) == list(b) and all(a[k] is b[k] for k in a)


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
        self._selections = Selections(connections)
        self._grants = Grants(lambda: self._observe("grants_changed"))
        self._tasks: set[asyncio.Task[None]] = set()
        # the ports are read at call time: the test build wraps the transport
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
        return endpoint_id

    def close_endpoint(self, endpoint_id: str) -> None:
        """The document is gone: cancel its work silently, invalidate its handles."""
        endpoint = self._endpoints.pop(endpoint_id, None)
        if endpoint is None:
            return
        endpoint.life.fire(EndpointEvent.CLOSE)
        self._generations.close_endpoint(endpoint_id)
        for _, task in endpoint.selects.values():
            task.cancel()
        endpoint.selects.clear()
        self._selections.forget_endpoint(endpoint_id)

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
        for endpoint in self._endpoints.values():
            for rid, task in list(endpoint.selects.values()):
                task.cancel()
                error = NapError(ErrorCode.CANCELLED, "The account changed; select again.")
                self._send(endpoint, error_result("llm.select", rid, error))
            endpoint.selects.clear()
        self._selections.clear()
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
            self._observe("dropped", endpoint.id, "llm domain not exposed")
            return
        parsed = read_request(message)  # envelope shape -> records -> conversation rules
        if isinstance(parsed, Dropped):
            self._observe("dropped", endpoint.id, parsed.reason)
        elif isinstance(parsed, Malformed):
            self._send(endpoint, error_result(parsed.type, parsed.id, parsed.error))
        elif isinstance(parsed, Select):
            self._start_select(endpoint, parsed)
        elif isinstance(parsed, Describe):
            self._describe(endpoint, parsed)
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

    def _answer(
        self, endpoint: _Endpoint, kind: str, rid: str, build: Callable[[], dict[str, Any]]
    ) -> None:
        """`generations.answer` for a select or describe result."""
        answer(lambda _, envelope: self._send(endpoint, envelope), endpoint.id, kind, rid, build)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # -- select / describe -------------------------------------------------------

    def _meets(self, connection: Connection, req: Requirements) -> bool:
        caps = connection.capabilities
        return (
            connection.available
            and (req.model is None or connection.model == req.model)
            and (not req.images or caps.images)
            and (not req.json_ or caps.json_output)
            and (not req.tools or caps.tools)
        )

    def _start_select(self, endpoint: _Endpoint, msg: Select) -> None:
        if len(endpoint.selects) >= self.policy.max_pending_selects:
            error = NapError(ErrorCode.QUOTA_EXCEEDED, "Too many model selections are pending.")
            self._send(endpoint, error_result("llm.select", msg.id, error))
            return
        candidates = [c for c in self.connections.all() if self._meets(c, msg.requirements)]
        if not candidates:
            error = unsupported("No connection meets the requirements.")
            self._send(endpoint, error_result("llm.select", msg.id, error))
            return
        key = msg.id
        while key in endpoint.selects:  # a reused id still gets its own answer
            key += "\x00"
        task = self._spawn(self._select(endpoint, msg, candidates, key))
        endpoint.selects[key] = (msg.id, task)

    async def _select(
        self, endpoint: _Endpoint, msg: Select, candidates: list[Connection], key: str
    ) -> None:
        account = self._account
        request = ChoiceRequest(endpoint.id, endpoint.napplet, msg.requirements, candidates)
        choice = _Choice(request, request, {c.id: c for c in candidates})
        endpoint.choices[key] = choice
        expired = error_result("llm.select", msg.id, NapError(ErrorCode.SELECTION_EXPIRED))
        try:
            for _ in range(self.policy.max_chooser_reshows + 1):
                choice.asked = choice.request
                try:
                    pick = await self._chooser.choose(choice.asked)
                except asyncio.CancelledError:
                    return  # endpoint closed or account switched; answered there
                except Exception:
                    log.exception("chooser failed")
                    pick = None
                if not endpoint.life.live or account != self._account:
                    return
                if pick is None:
                    self._send(
                        endpoint,
                        error_result("llm.select", msg.id, NapError(ErrorCode.USER_CANCELLED)),
                    )
                    return
                if pick.revision != choice.request.revision:
                    continue  # picked on a list that changed since: show the current one
                connection = self.connections.get(pick.connection_id)
                if (
                    connection is None
                    or choice.offered.get(pick.connection_id) is not connection
                    or not self._meets(connection, msg.requirements)
                ):
                    self._send(endpoint, expired)
                    return
                self._bind(endpoint, msg, account, connection)
                return
            self._send(endpoint, expired)  # the list kept changing under the person's picks
        finally:
            endpoint.selects.pop(key, None)
            endpoint.choices.pop(key, None)

    def _bind(self, endpoint: _Endpoint, msg: Select, account: str, connection: Connection) -> None:
        """Issue a handle for `connection` (the exact record picked) and answer `msg`."""
        handle = self._selections.bind(endpoint.id, account, connection)
        self._answer(
            endpoint,
            "llm.select",
            msg.id,
            lambda: model_result("llm.select", msg.id, self._model(connection, handle)),
        )

    def _model(self, connection: Connection, handle: str) -> dict[str, Any]:
        return ModelRecord.model_validate(connection.public_model(handle)).to_json()

    def _resolve(self, endpoint: _Endpoint, handle: str) -> Connection:
        return self._selections.resolve(endpoint.id, self._account, handle)

    def _describe(self, endpoint: _Endpoint, msg: Describe) -> None:
        try:
            connection = self._resolve(endpoint, msg.handle)
        except NapError as error:
            self._send(endpoint, error_result("llm.describe", msg.id, error))
            return
        self._answer(
            endpoint,
            "llm.describe",
            msg.id,
            lambda: model_result("llm.describe", msg.id, self._model(connection, msg.handle)),
        )

    # -- connection changes -------------------------------------------------------------

    def _connection_changed(self, connection_id: str, change: str) -> None:
        self._refresh_choosers()
        if change == "added":
            return
        self._selections.forget_connection(connection_id)
        self._grants.forget_connection(connection_id)
        self._generations.connection_removed(connection_id)

    def _refresh_choosers(self) -> None:
        """Every open chooser offers the connections that fit now.

        A removed connection leaves its list, an added one that meets the
        requirements joins it, an edited one is offered as its new record
        (or leaves when it no longer fits). Each change makes a new list
        revision; a pick made on an older revision is not bound (`_select`
        shows the current list again). The chooser's `refresh`, when it has
        one, shows the new list in place.
        """
        refresh = getattr(self._chooser, "refresh", None)
        everything = self.connections.all()
        for endpoint in self._endpoints.values():
            for choice in endpoint.choices.values():
                requirements = choice.request.requirements
                fitting = [c for c in everything if self._meets(c, requirements)]
                offered = {c.id: c for c in fitting}
                if _same_offer(offered, choice.offered):
                    continue
                choice.offered = offered
                choice.request = replace(
                    choice.request, candidates=fitting, revision=choice.request.revision + 1
                )
                if not callable(refresh):
                    continue  # it keeps showing its list; a pick from it is asked again
                try:
                    refresh(choice.asked, choice.request)
                except Exception:  # the shell must survive its chooser
                    log.exception("chooser refresh failed")
