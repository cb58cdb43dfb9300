"""Generations: every `llm.generate` from its check to its one terminal result.

Rules (NAP-LLM, API Surface: generate and cancel; Wire Protocol;
Cancellation and deadlines; Shell Behavior: consent before submission)
- A generation belongs to one endpoint and the account current when it
  started; its state is one `lifecycle.Lifecycle` (`lifecycle.TRANSITIONS`),
  the only lifecycle state it has.
- `start`: an *active* duplicate id gets `invalid-request` and starts
  nothing (the original is unaffected); more than the policy's active
  generations (per endpoint, in all) is `quota-exceeded`. The policy
  deadline starts here, so it includes the consent wait, and ends the
  generation with `timeout`.
- Order of checks once started: handle (`selection-expired`), connection
  support (`unsupported`), size (`quota-exceeded`), then consent before
  *every* submission (decline or a failed dialog -> `user-cancelled`, zero
  submissions). A standing grant (`grants.Grants`) counts as consent. The
  selection is resolved again after consent: a connection edited, removed
  or replaced while the dialog was open is never used (`selection-expired`).
- Deltas go out through one `streaming.DeltaStream` per generation, timed
  by the shell's `Clock`, only while the lifecycle is delivering; a delta
  the transport refuses ends the generation with `provider-error` (a lost
  delta would leave a gap in `sequence`).
- Exactly one terminal result per request id and no delta after it
  (`Generations._settle`, on the table's one `SETTLE` transition). Settling
  is immediate and never waits for the provider: `cancel` (this endpoint's
  active generation only; true/false without revealing others), the
  deadline -> `timeout`, endpoint close (no result: the document is gone),
  account switch and removal of a submitted generation's connection ->
  `cancelled`, removal or edit before submission -> `selection-expired`.
  Late provider output is discarded.
- A result that cannot be flushed, built, observed or delivered is replaced
  by `provider-error`, sent once (`answer`); nothing raised there escapes.
- Provider failures keep their details for the developer log; a failure's
  user hint goes to the shell UI (`Observer.notice`), never to the napplet.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from .connection_records import Connection
from .errors import ErrorCode, NapError, ProviderFailure
from .grants import Grants
from .intake import Cancel, Generate
from .lifecycle import GenEvent, Lifecycle
from .providers.base import Provider
from .records import Generation, GenerationRequest
from .shell_ports import (
    Clock,
    ConsentDecision,
    Disclosure,
    NappletIdentity,
    ShellPolicy,
    TimerHandle,
    disclose,
)
from .streaming import DeltaStream
from .translate import GenerationAssembler, check_supported, nap_to_lmsp
from .wire import cancel_result, error_result, generation_result

log = logging.getLogger("napllm.shell")

#: Deliver one envelope to an endpoint: `(endpoint_id, envelope) -> delivered`.
Send = Callable[[str, dict[str, Any]], bool]


def answer(
    send: Send, endpoint_id: str, kind: str, rid: str, build: Callable[[], dict[str, Any]]
) -> None:
    """Send the one terminal result of request `kind`/`rid` that `build` makes.

    A result that cannot be built (a serializer limit, an inconsistent
    record) or delivered (`send` returned False) is replaced by a
    `provider-error` result, sent once; never raises (NAP-LLM, Wire
    Protocol: exactly one terminal result).
    """
    fallback = error_result(kind, rid, NapError(ErrorCode.PROVIDER_ERROR))
    envelope: dict[str, Any] | None = None
    try:
        envelope = build()
    except Exception:
        log.exception("building a result failed")
    if envelope is not None and send(endpoint_id, envelope):
        return
    already_fallback = envelope is not None and envelope.get("error") == fallback["error"]
    if not already_fallback and send(endpoint_id, fallback):
        return
    log.error("a result could not be delivered")


@dataclass
class _Generation:
    endpoint_id: str
    id: str
    account: str
    napplet: NappletIdentity
    life: Lifecycle = field(default_factory=Lifecycle)  # the only lifecycle state
    connection_id: str | None = None
    task: asyncio.Task[None] | None = None
    timer: TimerHandle | None = None
    stream: DeltaStream | None = None


class Generations:
    """The active generations of every endpoint of one shell (module rules).

    The shell hands in its ports as callables read at call time: `policy`
    (the current `ShellPolicy`), `send`
    (delivery to a live endpoint), `resolve(endpoint_id, handle)` (the
    handle under the current account; raises `NapError`), `consent`
    (the dialog), `providers` (connection -> provider), `observe(hook, *args)`
    (an `Observer` hook, never raising) and `spawn` (a task the shell
    tracks). Time is the `clock`: the deadline and the deltas' coalescing.
    """

    def __init__(
        self,
        *,
        policy: Callable[[], ShellPolicy],
        clock: Clock,
        grants: Grants,
        send: Send,
        resolve: Callable[[str, str], Connection],
        consent: Callable[[Disclosure], Awaitable[ConsentDecision]],
        providers: Callable[[Connection], Provider],
        observe: Callable[..., None],
        spawn: Callable[[Coroutine[Any, Any, None]], asyncio.Task[None]],
    ) -> None:
        self._policy = policy
        self._clock = clock
        self._grants = grants
        self._send = send
        self._resolve = resolve
        self._consent = consent
        self._providers = providers
        self._observe = observe
        self._spawn = spawn
        #: endpoint id -> request id -> its active generation
        self._active: dict[str, dict[str, _Generation]] = {}

    # -- the shell's calls -----------------------------------------------------

    def of(self, endpoint_id: str) -> dict[str, _Generation]:
        """The active generations of one endpoint, by request id (a copy)."""
        return dict(self._active.get(endpoint_id, {}))

    def total(self) -> int:
        """How many generations are active in all."""
        return sum(len(active) for active in self._active.values())

    def start(
        self, endpoint_id: str, napplet: NappletIdentity, msg: Generate, account: str
    ) -> None:
        """Start `msg` for the endpoint, or answer it at once (module rules)."""
        active = self._active.setdefault(endpoint_id, {})
        if msg.id in active:
            error = NapError(
                ErrorCode.INVALID_REQUEST, "A generation with this id is already active."
            )
            self._send(endpoint_id, error_result("llm.generate", msg.id, error))
            return
        if (
            len(active) >= self._policy().max_active_per_endpoint
            or self.total() >= self._policy().max_active_total
        ):
            error = NapError(ErrorCode.QUOTA_EXCEEDED, "Too many generations are active.")
            self._send(endpoint_id, error_result("llm.generate", msg.id, error))
            return
        gen = _Generation(endpoint_id, msg.id, account, napplet)
        active[msg.id] = gen
        gen.timer = self._clock.call_later(
            self._policy().deadline_s, lambda: self._settle(gen, NapError(ErrorCode.TIMEOUT))
        )
        gen.task = self._spawn(self._generate(gen, msg.request))

    def cancel(self, endpoint_id: str, msg: Cancel) -> None:
        """`llm.cancel`: settle this endpoint's active generation as `cancelled`."""
        gen = self._active.get(endpoint_id, {}).get(msg.request_id)
        if gen is None or not gen.life.can(GenEvent.SETTLE):
            self._send(endpoint_id, cancel_result(msg.id, False))
            return
        self._settle(gen, NapError(ErrorCode.CANCELLED))
        self._send(endpoint_id, cancel_result(msg.id, True))

    def close_endpoint(self, endpoint_id: str) -> None:
        """The document is gone: settle its generations silently."""
        for gen in list(self._active.pop(endpoint_id, {}).values()):
            self._settle(gen, None)

    def cancel_all(self) -> None:
        """The account changed: every generation settles as `cancelled`."""
        for active in list(self._active.values()):
            for gen in list(active.values()):
                self._settle(gen, NapError(ErrorCode.CANCELLED))

    def connection_removed(self, connection_id: str) -> None:
        """A connection was edited or removed: its generations settle.

        Submitted ones (the provider has them) are `cancelled`; the others
        (checking or waiting for consent) `selection-expired`.
        """
        for active in list(self._active.values()):
            for gen in list(active.values()):
                if gen.connection_id != connection_id:
                    continue
                if gen.life.delivering:
                    self._settle(gen, NapError(ErrorCode.CANCELLED))
                else:
                    self._settle(gen, NapError(ErrorCode.SELECTION_EXPIRED))

    # -- one generation ---------------------------------------------------------

    async def _generate(self, gen: _Generation, request: GenerationRequest) -> None:
        try:
            result = await self._run(gen, request)
        except asyncio.CancelledError:
            # Settling comes before cancelling (cancel, deadline, close,
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

    async def _run(self, gen: _Generation, request: GenerationRequest) -> Generation:
        connection = self._resolve(gen.endpoint_id, request.handle)
        gen.connection_id = connection.id
        check_supported(request, connection.capabilities)
        disclosure = disclose(gen.endpoint_id, gen.napplet, connection, request)
        if disclosure.characters > self._policy().max_characters:
            raise NapError(ErrorCode.QUOTA_EXCEEDED, "The request exceeds the size limit.")
        if not self._grants.covers(gen.napplet, connection.id, gen.account):
            gen.life.fire(GenEvent.ASK_CONSENT)
            try:
                decision = await self._consent(disclosure)
            except Exception:  # a dialog that failed authorised nothing
                log.exception("consent dialog failed")
                decision = ConsentDecision(allow=False)
            if gen.life.settled:
                raise asyncio.CancelledError
            if not decision.allow:
                raise NapError(ErrorCode.USER_CANCELLED)
            if decision.remember:
                self._grants.remember(gen.napplet, connection.id, gen.account)
        # the selection must still be the exact connection the disclosure
        # named (NAP-LLM, Shell Behavior: no silent replacement)
        current = self._resolve(gen.endpoint_id, request.handle)
        if current is not connection:
            raise NapError(ErrorCode.SELECTION_EXPIRED)
        gen.life.fire(GenEvent.SUBMIT)
        lmsp_request = nap_to_lmsp(request, connection.model)
        provider = self._providers(connection)
        gen.stream = DeltaStream(
            gen.id,
            lambda envelope: self._deliver_delta(gen, envelope),
            interval_s=self._policy().delta_interval_s,
            clock=self._clock,
        )
        assembler = GenerationAssembler(request, gen.stream)
        self._observe("submitted", gen.endpoint_id, connection.id)
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

    def _deliver_delta(self, gen: _Generation, envelope: dict[str, Any]) -> None:
        if not gen.life.delivering:
            return
        if not self._send(gen.endpoint_id, envelope):
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
        active = self._active.get(gen.endpoint_id)
        if active is not None and active.get(gen.id) is gen:
            del active[gen.id]
            if not active:
                del self._active[gen.endpoint_id]
        try:
            self._release(gen, aborted=not isinstance(outcome, Generation))
        except Exception:
            log.exception("releasing a generation failed")
        if outcome is None:
            return
        rid = gen.id
        if isinstance(outcome, Generation):
            success = outcome
            answer(
                self._send,
                gen.endpoint_id,
                "llm.generate",
                rid,
                lambda: generation_result(rid, success),
            )
        else:
            error = outcome
            answer(
                self._send,
                gen.endpoint_id,
                "llm.generate",
                rid,
                lambda: error_result("llm.generate", rid, error),
            )

    def _release(self, gen: _Generation, *, aborted: bool) -> None:
        if gen.timer is not None:
            gen.timer.cancel()
        if aborted and gen.stream is not None:
            gen.stream.abort()
        current = asyncio.current_task()
        if gen.task is not None and gen.task is not current and not gen.task.done():
            gen.task.cancel()  # best effort; late output is discarded
