"""The shell: endpoints, accounts, handles, generations, consent, deadlines.

Pure asyncio behind ports (no browser imports; `shell_ports` defines them
and the records they exchange): `Transport` (envelopes to an endpoint),
`Chooser` (the model chooser), `Consent` (the disclosure dialog),
`ProviderFactory` (connection -> provider), `Clock` (deadlines) and an
optional `Observer` (inspector, user notices). Handles are
`selections.Selections`, standing grants `grants.Grants`, and the
lifecycles of a generation and of an endpoint are the tables of
`lifecycle`.

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
- `generate`: an *active* duplicate id gets `invalid-request` and starts
  nothing (the original is unaffected). Order of checks: record and
  conversation (`invalid-request`), handle (`selection-expired`),
  connection support (`unsupported`), runtime policy (`quota-exceeded`),
  then consent before *every* submission (decline -> `user-cancelled`,
  zero submissions). A standing grant (opt-in, per napplet identity +
  connection + account, until revoked or the page closes) counts as consent.
  The selection is checked again after consent: a connection edited,
  removed or replaced while the dialog was open is never used
  (`selection-expired`); the disclosure carries a digest of what the
  dialog showed (`Disclosure.digest`) that a dialog's Allow must return.
- Exactly one terminal result per request id; no delta after it. It holds
  even when finishing the deltas, building, observing or delivering the
  result fails: such a failure becomes `provider-error`, and a delta the
  transport refuses ends the generation (`_settle`). Settling is
  immediate and never waits for the provider: `cancel` (this endpoint's
  active generation only; true/false without revealing others), the policy
  deadline (which includes the consent wait) -> `timeout`, endpoint close,
  account switch and connection removal -> `cancelled`. Late provider output
  is discarded.
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

from .connections import ConnectionRegistry
from .errors import ErrorCode, NapError, ProviderFailure, unsupported
from .grants import Grants
from .intake import Cancel, Describe, Generate, Select, read_request
from .lifecycle import EndpointEvent, EndpointLife, GenEvent, Lifecycle
from .records import (
    Connection,
    Generation,
    GenerationRequest,
    ModelRecord,
    Requirements,
)
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
    disclose,
)
from .streaming import DeltaStream
from .translate import GenerationAssembler, check_supported, nap_to_lmsp
from .wire import (
    Dropped,
    Malformed,
    cancel_result,
    error_result,
    generation_result,
    model_result,
)

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
class _Generation:
    endpoint_id: str
    id: str
    account: str
    life: Lifecycle = field(default_factory=Lifecycle)  # the only lifecycle state
    connection_id: str | None = None
    task: asyncio.Task[None] | None = None
    timer: TimerHandle | None = None
    stream: DeltaStream | None = None


@dataclass
class _Endpoint:
    id: str
    napplet: NappletIdentity
    life: EndpointLife = field(default_factory=EndpointLife)  # lifecycle.ENDPOINT_TRANSITIONS
    generations: dict[str, _Generation] = field(default_factory=dict)
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
        for gen in list(endpoint.generations.values()):
            self._settle(gen, None)
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
        for endpoint in self._endpoints.values():
            for gen in list(endpoint.generations.values()):
                self._settle(gen, NapError(ErrorCode.CANCELLED))
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
            self._start_generate(endpoint, parsed)
        elif isinstance(parsed, Cancel):
            self._cancel(endpoint, parsed)

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

    # -- generate -----------------------------------------------------------------------

    def _active_total(self) -> int:
        return sum(len(e.generations) for e in self._endpoints.values())

    def _start_generate(self, endpoint: _Endpoint, msg: Generate) -> None:
        if msg.id in endpoint.generations:
            error = NapError(
                ErrorCode.INVALID_REQUEST, "A generation with this id is already active."
            )
            self._send(endpoint, error_result("llm.generate", msg.id, error))
            return
        if (
            len(endpoint.generations) >= self.policy.max_active_per_endpoint
            or self._active_total() >= self.policy.max_active_total
        ):
            error = NapError(ErrorCode.QUOTA_EXCEEDED, "Too many generations are active.")
            self._send(endpoint, error_result("llm.generate", msg.id, error))
            return
        gen = _Generation(endpoint.id, msg.id, self._account)
        endpoint.generations[msg.id] = gen
        gen.timer = self._clock.call_later(
            self.policy.deadline_s, lambda: self._settle(gen, NapError(ErrorCode.TIMEOUT))
        )
        gen.task = self._spawn(self._generate(endpoint, gen, msg.request))

    async def _generate(
        self, endpoint: _Endpoint, gen: _Generation, request: GenerationRequest
    ) -> None:
        try:
            result = await self._run(endpoint, gen, request)
        except asyncio.CancelledError:
            # The shell settles before it cancels (cancel, deadline, close,
            # account switch). Unsettled means a provider or port raised
            # CancelledError by itself (an aborted fetch): answer now rather
            # than leave the request open until the deadline.
            if not gen.life.settled:
                log.warning("provider raised CancelledError without being cancelled")
                self._settle(gen, NapError(ErrorCode.PROVIDER_ERROR))
            return
        except NapError as error:
            self._settle(gen, error)
            return
        except ProviderFailure as failure:
            if failure.user_hint and gen.connection_id:
                self._observe("notice", "error", failure.user_hint, gen.connection_id)
            log.warning("provider failure: %s", failure.detail or failure.code)
            self._settle(gen, failure.to_nap_error())
            return
        except Exception:
            log.exception("provider or runtime failure")
            self._settle(gen, NapError(ErrorCode.PROVIDER_ERROR))
            return
        self._settle(gen, result)

    async def _run(
        self, endpoint: _Endpoint, gen: _Generation, request: GenerationRequest
    ) -> Generation:
        connection = self._resolve(endpoint, request.handle)
        gen.connection_id = connection.id
        check_supported(request, connection.capabilities)
        disclosure = disclose(endpoint.id, endpoint.napplet, connection, request)
        if disclosure.characters > self.policy.max_characters:
            raise NapError(ErrorCode.QUOTA_EXCEEDED, "The request exceeds the size limit.")
        if not self._grants.covers(endpoint.napplet, connection.id, gen.account):
            gen.life.fire(GenEvent.ASK_CONSENT)
            try:
                decision = await self._consent.ask(disclosure)
            except Exception:  # a dialog that failed authorised nothing
                log.exception("consent dialog failed")
                decision = ConsentDecision(allow=False)
            if gen.life.settled:
                raise asyncio.CancelledError
            if not decision.allow:
                raise NapError(ErrorCode.USER_CANCELLED)
            if decision.remember:
                self._grants.remember(endpoint.napplet, connection.id, gen.account)
        # the selection must still be the exact connection the disclosure
        # named (NAP-LLM, Shell Behavior: no silent replacement)
        current = self._resolve(endpoint, request.handle)
        if current is not connection:
            raise NapError(ErrorCode.SELECTION_EXPIRED)
        gen.life.fire(GenEvent.SUBMIT)
        lmsp_request = nap_to_lmsp(request, connection.model)
        provider = self._providers(connection)
        gen.stream = DeltaStream(
            gen.id,
            lambda envelope: self._deliver_delta(endpoint, gen, envelope),
            interval_s=self.policy.delta_interval_s,
        )
        assembler = GenerationAssembler(request, gen.stream)
        self._observe("submitted", endpoint.id, connection.id)
        events = provider.respond(lmsp_request)
        try:
            async for event in events:
                if gen.life.settled:
                    break
                if assembler.feed(event):
                    break
        finally:
            closer = getattr(events, "aclose", None)
            if closer is not None:
                await closer()
        return assembler.finish()

    def _deliver_delta(
        self, endpoint: _Endpoint, gen: _Generation, envelope: dict[str, Any]
    ) -> None:
        if not gen.life.delivering:
            return
        if not self._send(endpoint, envelope):
            # a lost delta would leave a gap in `sequence` (NAP-LLM, Wire
            # Protocol: no text silently dropped): end the generation instead
            self._settle(gen, NapError(ErrorCode.PROVIDER_ERROR))

    def _settle(self, gen: _Generation, outcome: Generation | NapError | None) -> None:
        """End `gen` with exactly one terminal result (None: endpoint gone, send nothing).

        Invariant (NAP-LLM, Wire Protocol: exactly one terminal result): the
        result is sent only on the lifecycle's `SETTLE` transition, which the
        table (`lifecycle.TRANSITIONS`) allows once; no exception while
        finishing the delta stream, building the envelope, observing or
        sending it leaves the request open or unanswered. The generation is
        settled and forgotten first (so a later cancel answers false); a
        success that cannot be flushed, serialised or delivered is replaced
        by `provider-error`; nothing raised here escapes.
        """
        if not gen.life.can(GenEvent.SETTLE):
            return
        if (
            isinstance(outcome, Generation)
            and gen.stream is not None
            and gen.life.can(GenEvent.FLUSH)
        ):
            # flush coalesced deltas before settling: `_deliver_delta` drops
            # everything once settled, and a completed block must end before
            # the terminal result (NAP-LLM, Delta; Wire Protocol)
            gen.life.fire(GenEvent.FLUSH)
            try:
                gen.stream.finish()
            except Exception:
                log.exception("flushing the deltas failed")
                outcome = NapError(ErrorCode.PROVIDER_ERROR)
            if gen.life.settled:  # a delta that could not be delivered ended it
                return
        gen.life.fire(GenEvent.SETTLE)
        endpoint = self._endpoints.get(gen.endpoint_id)
        if endpoint is not None and endpoint.generations.get(gen.id) is gen:
            del endpoint.generations[gen.id]
        try:
            self._release(gen, aborted=not isinstance(outcome, Generation))
        except Exception:
            log.exception("releasing a generation failed")
        if endpoint is None or outcome is None:
            return
        self._send_terminal(endpoint, gen.id, outcome)

    def _release(self, gen: _Generation, *, aborted: bool) -> None:
        if gen.timer is not None:
            gen.timer.cancel()
        if aborted and gen.stream is not None:
            gen.stream.abort()
        current = asyncio.current_task()
        if gen.task is not None and gen.task is not current and not gen.task.done():
            gen.task.cancel()  # best effort; late output is discarded

    def _send_terminal(self, endpoint: _Endpoint, rid: str, outcome: Generation | NapError) -> None:
        """Send `outcome`, falling back to `provider-error` when it cannot be sent."""
        if isinstance(outcome, Generation):
            self._answer(endpoint, "llm.generate", rid, lambda: generation_result(rid, outcome))
        else:
            self._answer(
                endpoint, "llm.generate", rid, lambda: error_result("llm.generate", rid, outcome)
            )

    def _answer(
        self, endpoint: _Endpoint, kind: str, rid: str, build: Callable[[], dict[str, Any]]
    ) -> None:
        """Send the one terminal result of request `kind`/`rid` that `build` makes.

        A result that cannot be built (a serializer limit, an inconsistent
        record) or delivered (the transport raised) is replaced by a
        `provider-error` result, sent once; never raises.
        """
        fallback = error_result(kind, rid, NapError(ErrorCode.PROVIDER_ERROR))
        envelope: dict[str, Any] | None = None
        try:
            envelope = build()
        except Exception:
            log.exception("building a result failed")
        if envelope is not None and self._send(endpoint, envelope):
            return
        already_fallback = envelope is not None and envelope.get("error") == fallback["error"]
        if not already_fallback and self._send(endpoint, fallback):
            return
        log.error("a result could not be delivered")

    def _cancel(self, endpoint: _Endpoint, msg: Cancel) -> None:
        gen = endpoint.generations.get(msg.request_id)
        if gen is None or not gen.life.can(GenEvent.SETTLE):
            self._send(endpoint, cancel_result(msg.id, False))
            return
        self._settle(gen, NapError(ErrorCode.CANCELLED))
        self._send(endpoint, cancel_result(msg.id, True))

    # -- connection changes -------------------------------------------------------------

    def _connection_changed(self, connection_id: str, change: str) -> None:
        self._refresh_choosers()
        if change == "added":
            return
        self._selections.forget_connection(connection_id)
        self._grants.forget_connection(connection_id)
        for endpoint in self._endpoints.values():
            for gen in list(endpoint.generations.values()):
                if gen.connection_id != connection_id:
                    continue
                if gen.life.delivering:  # submitted: the provider has it
                    self._settle(gen, NapError(ErrorCode.CANCELLED))
                else:
                    self._settle(gen, NapError(ErrorCode.SELECTION_EXPIRED))

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
