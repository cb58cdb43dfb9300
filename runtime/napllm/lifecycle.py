"""The shell's lifecycles as transition tables: a generation's and an endpoint's.

Rules (NAP-LLM, Wire Protocol: "exactly one terminal result" per request;
Shell Behavior: consent before submission)
- States: `CHECKING` (handle, capabilities, size), `CONSENT` (the dialog is
  open), `RUNNING` (submitted to the provider; deltas flow), `FLUSHING` (a
  success is being closed: coalesced deltas still go out, so every block
  ends before the result), `SETTLED` (the one terminal result was sent, or
  the endpoint is gone). Deltas are delivered only in `RUNNING` and
  `FLUSHING`.
- Events and the only allowed transitions are the rows of `TRANSITIONS`;
  anything else is refused (`LifecycleError`, or `False` from `can`).
  `SETTLED` has no outgoing row and every other state has a `SETTLE` row,
  so a generation settles exactly once, from wherever it is: the shell
  sends the terminal result only on the `SETTLE` transition.
- The settle path keeps its invariant: a success moves `RUNNING` ->
  `FLUSHING` -> `SETTLED`, and a delta that cannot be delivered while
  flushing settles it with an error instead (`FLUSHING` -> `SETTLED`); the
  success then finds the generation settled and sends nothing more.

- An endpoint (one loaded napplet document; docs/design.md, "Endpoint") is
  `LIVE` from `Shell.open_endpoint` until `CLOSE` (its document went away),
  then `CLOSED` for good: nothing it sends is read and nothing is sent to
  it (`ENDPOINT_TRANSITIONS`). A reload is a new endpoint.

Written here rather than with a state-machine library: the table is a few
rows, and the shell needs it to run unchanged in Pyodide.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import Any, ClassVar, Generic, TypeVar

S = TypeVar("S", bound=Enum)
E = TypeVar("E", bound=Enum)


class GenState(Enum):
    """Where a generation is (module rules)."""

    CHECKING = "checking"
    CONSENT = "consent"
    RUNNING = "running"
    FLUSHING = "flushing"
    SETTLED = "settled"


class GenEvent(Enum):
    """What happens to a generation (module rules)."""

    ASK_CONSENT = "ask-consent"
    SUBMIT = "submit"
    FLUSH = "flush"
    SETTLE = "settle"


TRANSITIONS: dict[tuple[GenState, GenEvent], GenState] = {
    (GenState.CHECKING, GenEvent.ASK_CONSENT): GenState.CONSENT,
    (GenState.CHECKING, GenEvent.SUBMIT): GenState.RUNNING,
    (GenState.CONSENT, GenEvent.SUBMIT): GenState.RUNNING,
    (GenState.RUNNING, GenEvent.FLUSH): GenState.FLUSHING,
    (GenState.CHECKING, GenEvent.SETTLE): GenState.SETTLED,
    (GenState.CONSENT, GenEvent.SETTLE): GenState.SETTLED,
    (GenState.RUNNING, GenEvent.SETTLE): GenState.SETTLED,
    (GenState.FLUSHING, GenEvent.SETTLE): GenState.SETTLED,
}
"""Every allowed `(state, event) -> next state`; nothing else is."""

DELIVERING = frozenset({GenState.RUNNING, GenState.FLUSHING})
"""States in which deltas go out."""


class LifecycleError(RuntimeError):
    """An event the table does not allow in the current state (a shell bug)."""


class Table(Generic[S, E]):
    """A state that starts at `initial` and changes only through the rows of
    `transitions`; a lifecycle is a subclass that names both (here, and the
    local model service's jobs, `lmsp_service.scheduler.JobLife`)."""

    transitions: ClassVar[Mapping[tuple[Any, Any], Any]]
    initial: ClassVar[Any]

    def __init__(self) -> None:
        self.state: S = self.initial

    def can(self, event: E) -> bool:
        """Whether `event` is allowed now."""
        return (self.state, event) in self.transitions

    def fire(self, event: E) -> S:
        """Apply `event`; returns the new state. Raises `LifecycleError` if refused."""
        try:
            self.state = self.transitions[(self.state, event)]
        except KeyError:
            raise LifecycleError(f"{event.value} refused in state {self.state.value}") from None
        return self.state


class Lifecycle(Table[GenState, GenEvent]):
    """One generation's state, changed only through `TRANSITIONS`."""

    transitions = TRANSITIONS
    initial = GenState.CHECKING

    @property
    def settled(self) -> bool:
        """Whether the terminal result was sent (or the endpoint is gone)."""
        return self.state is GenState.SETTLED

    @property
    def delivering(self) -> bool:
        """Whether deltas go out now."""
        return self.state in DELIVERING


class EndpointState(Enum):
    """Where an endpoint is (module rules)."""

    LIVE = "live"
    CLOSED = "closed"


class EndpointEvent(Enum):
    """What happens to an endpoint (module rules)."""

    CLOSE = "close"


ENDPOINT_TRANSITIONS: dict[tuple[EndpointState, EndpointEvent], EndpointState] = {
    (EndpointState.LIVE, EndpointEvent.CLOSE): EndpointState.CLOSED,
}
"""Every allowed `(state, event) -> next state` of an endpoint; nothing else is."""


class EndpointLife(Table[EndpointState, EndpointEvent]):
    """One endpoint's state, changed only through `ENDPOINT_TRANSITIONS`."""

    transitions = ENDPOINT_TRANSITIONS
    initial = EndpointState.LIVE

    @property
    def live(self) -> bool:
        """Whether the endpoint's document is still there."""
        return self.state is EndpointState.LIVE
