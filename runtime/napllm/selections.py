"""Selections: every `llm.select` from the chooser to its handle, and the
handles it binds (NAP-LLM, API Surface: select and describe; Model; Shell
Behavior; Security Considerations; docs/design.md, "Endpoint" and
"Connection").

Rules
- `select` offers only the connections that meet every requirement
  (`meets`: available, the exact model when one is named, images, json,
  tools); none -> `unsupported` without a dialog. More selects pending on
  one endpoint than `shell_ports.ShellPolicy.max_pending_selects` ->
  `quota-exceeded`. The user's decline, or a chooser that fails ->
  `user-cancelled`. Never substitutes, never downgrades.
- A pick binds only what the person saw: every list the chooser shows has
  a revision (`shell_ports.ChoiceRequest.revision`, one more whenever the
  fitting connections change while it is open, `Selections.connection_changed`)
  and the pick names the revision it was made on (`shell_ports.ChoicePick`).
  A pick from an older list is never bound: the chooser shows the current
  list again (at most `shell_ports.ShellPolicy.max_chooser_reshows` times,
  then `selection-expired`). A pick of the current list binds only the exact
  connection record offered in it, and only if it still fits; a connection
  edited, or removed and re-added under the same id, is another record
  (`selection-expired`).
- Every select gets one terminal result: the Model record with its new
  handle, or its error. A napplet may reuse a select id; each request still
  gets its own answer. An endpoint that closes gets nothing (its chooser
  is cancelled); an account switch answers every pending select
  `cancelled`. Each answer of the chooser is one `PickVerdict`, and what
  follows it is one row of `SELECT_FLOW`.
- A handle is random and opaque, and scoped to one endpoint, one account
  and the exact connection record the user picked. A handle that is
  unknown, another endpoint's, from another account, for a connection
  edited, removed or no longer available, or of a closed endpoint is
  `selection-expired`, all alike, so a napplet learns nothing about handles
  that are not its own. `describe` answers the Model record of a handle
  that resolves, under the same rule.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any

from .connection_records import Connection
from .connections import ConnectionRegistry
from .errors import ErrorCode, NapError, unsupported
from .generations import Send, answer
from .intake import Describe, Select
from .records import ModelRecord, Requirements
from .shell_ports import ChoicePick, ChoiceRequest, Chooser, NappletIdentity, ShellPolicy
from .wire import error_result, model_result

log = logging.getLogger("napllm.shell")


def meets(connection: Connection, requirements: Requirements) -> bool:
    """Whether `connection` is available and meets every one of `requirements`
    (NAP-LLM, API Surface: select): the exact model when one is named, and
    images, JSON output and tools when asked for.
    """
    caps = connection.capabilities
    return (
        connection.available
        and (requirements.model is None or connection.model == requirements.model)
        and (not requirements.images or caps.images)
        and (not requirements.json_ or caps.json_output)
        and (not requirements.tools or caps.tools)
    )


@dataclass
class Selection:
    """One handle's binding (module rules)."""

    endpoint_id: str
    account: str
    connection_id: str
    #: The exact record bound; an edit or a re-add under the id is another one.
    connection: Connection


@dataclass
class _Choice:
    """An open chooser: what it was asked and what it offers now."""

    # the request given to the pending `choose` call (identifies the dialog)
    asked: ChoiceRequest
    # the list it shows now (`asked`, or the latest refresh), with its revision
    request: ChoiceRequest
    # connection id -> the exact record of every candidate offered now
    offered: dict[str, Connection]


@dataclass
class _Pending:
    """One select waiting for its chooser."""

    rid: str  # the napplet's select id (it may repeat)
    task: asyncio.Task[None] | None = None
    choice: _Choice | None = None  # set once the chooser is asked


class PickVerdict(Enum):
    """What one answer of the chooser is (module rules)."""

    #: The endpoint closed or the account switched while the chooser was open.
    GONE = "gone"
    #: The person declined, or the chooser failed.
    DECLINED = "declined"
    #: A pick made on a list that changed since it was shown.
    OLD_LIST = "old-list"
    #: A pick of the current list of a record it does not offer (or no longer fits).
    NOT_OFFERED = "not-offered"
    #: Old-list picks past `ShellPolicy.max_chooser_reshows`.
    RESHOWN_TOO_OFTEN = "reshown-too-often"
    #: A pick of the exact record the current list offers.
    BOUND = "bound"


@dataclass(frozen=True)
class SelectStep:
    """What a select does for one `PickVerdict`: answer `error` (None: no error),
    show the chooser again, or bind a handle and answer the Model record."""

    error: ErrorCode | None = None
    show_again: bool = False
    binds: bool = False


#: The select flow: every chooser answer and what follows it; nothing else happens.
#: A `GONE` select sends nothing (a closed endpoint gets nothing; an account
#: switch answered it `cancelled` already).
SELECT_FLOW: dict[PickVerdict, SelectStep] = {
    PickVerdict.GONE: SelectStep(),
    PickVerdict.DECLINED: SelectStep(error=ErrorCode.USER_CANCELLED),
    PickVerdict.OLD_LIST: SelectStep(show_again=True),
    PickVerdict.NOT_OFFERED: SelectStep(error=ErrorCode.SELECTION_EXPIRED),
    PickVerdict.RESHOWN_TOO_OFTEN: SelectStep(error=ErrorCode.SELECTION_EXPIRED),
    PickVerdict.BOUND: SelectStep(binds=True),
}


def _same_offer(a: dict[str, Connection], b: dict[str, Connection]) -> bool:
    return list(a) == list(b) and all(a[k] is b[k] for k in a)


class Selections:
    """The pending selects and the live handles of one shell (module rules).

    The shell hands in its ports as callables read at call time: `policy`
    (the current `ShellPolicy`), `chooser` (the `Chooser` port), `account`
    (the current account), `send` (delivery to a live endpoint) and `spawn`
    (a task the shell tracks). The shell registers each endpoint
    (`open_endpoint`) before it sends anything, and reports closes, account
    switches and connection changes.
    """

    def __init__(
        self,
        connections: ConnectionRegistry,
        *,
        policy: Callable[[], ShellPolicy],
        chooser: Callable[[], Chooser],
        account: Callable[[], str],
        send: Send,
        spawn: Callable[[Coroutine[Any, Any, None]], asyncio.Task[None]],
    ) -> None:
        self._connections = connections
        self._policy = policy
        self._chooser = chooser
        self._account = account
        self._send = send
        self._spawn = spawn
        #: handle -> its binding.
        self.handles: dict[str, Selection] = {}
        #: endpoint id -> unique key -> its pending select, for every open endpoint
        self._pending: dict[str, dict[str, _Pending]] = {}

    # -- the shell's calls -----------------------------------------------------

    def open_endpoint(self, endpoint_id: str) -> None:
        """A new endpoint: it may select from now on."""
        self._pending[endpoint_id] = {}

    def close_endpoint(self, endpoint_id: str) -> None:
        """The document is gone: cancel its choosers silently, drop its handles."""
        for pending in self._pending.pop(endpoint_id, {}).values():
            if pending.task is not None:
                pending.task.cancel()
        for handle, sel in list(self.handles.items()):
            if sel.endpoint_id == endpoint_id:
                del self.handles[handle]

    def switch_account(self) -> None:
        """The account is about to change: every pending select is answered
        `cancelled` and every handle dropped."""
        for endpoint_id, pending in self._pending.items():
            for entry in list(pending.values()):
                if entry.task is not None:
                    entry.task.cancel()
                error = NapError(ErrorCode.CANCELLED, "The account changed; select again.")
                self._send(endpoint_id, error_result("llm.select", entry.rid, error))
            pending.clear()
        self.handles.clear()

    def connection_changed(self, connection_id: str, change: str) -> None:
        """A connection was `added`, edited or removed: every open chooser
        offers what fits now, and an edited or removed connection's handles go.
        """
        self._refresh_choosers()
        if change != "added":
            for handle, sel in list(self.handles.items()):
                if sel.connection_id == connection_id:
                    del self.handles[handle]

    def start(self, endpoint_id: str, napplet: NappletIdentity, msg: Select) -> None:
        """`llm.select`: ask the chooser, or answer at once (module rules)."""
        pending = self._pending.get(endpoint_id)
        if pending is None:
            return  # not an open endpoint: nothing is sent there
        if len(pending) >= self._policy().max_pending_selects:
            error = NapError(ErrorCode.QUOTA_EXCEEDED, "Too many model selections are pending.")
            self._send(endpoint_id, error_result("llm.select", msg.id, error))
            return
        candidates = [c for c in self._connections.all() if meets(c, msg.requirements)]
        if not candidates:
            error = unsupported("No connection meets the requirements.")
            self._send(endpoint_id, error_result("llm.select", msg.id, error))
            return
        key = msg.id
        while key in pending:  # a reused id still gets its own answer
            key += "\x00"
        entry = pending[key] = _Pending(msg.id)
        request = ChoiceRequest(endpoint_id, napplet, msg.requirements, candidates)
        entry.task = self._spawn(self._select(endpoint_id, msg, entry, request, key))

    def describe(self, endpoint_id: str, msg: Describe) -> None:
        """`llm.describe`: the Model record of a handle that resolves."""
        try:
            connection = self.resolve(endpoint_id, self._account(), msg.handle)
        except NapError as error:
            self._send(endpoint_id, error_result("llm.describe", msg.id, error))
            return
        self._answer(endpoint_id, "llm.describe", msg.id, connection, msg.handle)

    def resolve(self, endpoint_id: str, account: str, handle: str) -> Connection:
        """The connection `handle` binds for this endpoint and account.

        Raises `NapError` `selection-expired` otherwise (module rules).
        """
        sel = self.handles.get(handle)
        connection = self._connections.get(sel.connection_id) if sel else None
        if (
            sel is None
            or connection is None
            or sel.endpoint_id != endpoint_id
            or sel.account != account
            or connection is not sel.connection
            or not connection.available
        ):
            raise NapError(ErrorCode.SELECTION_EXPIRED)
        return connection

    # -- one select --------------------------------------------------------------

    async def _select(
        self, endpoint_id: str, msg: Select, entry: _Pending, request: ChoiceRequest, key: str
    ) -> None:
        account = self._account()
        choice = entry.choice = _Choice(request, request, {c.id: c for c in request.candidates})
        try:
            for _ in range(self._policy().max_chooser_reshows + 1):
                choice.asked = choice.request
                try:
                    pick = await self._chooser().choose(choice.asked)
                except asyncio.CancelledError:
                    return  # endpoint closed or account switched; answered there
                except Exception:
                    log.exception("chooser failed")
                    pick = None
                verdict, connection = self._judge(endpoint_id, account, msg, choice, pick)
                if not SELECT_FLOW[verdict].show_again:
                    self._follow(verdict, endpoint_id, account, msg.id, connection)
                    return
            self._follow(PickVerdict.RESHOWN_TOO_OFTEN, endpoint_id, account, msg.id, None)
        finally:
            pending = self._pending.get(endpoint_id, {})
            if pending.get(key) is entry:
                del pending[key]

    def _follow(
        self,
        verdict: PickVerdict,
        endpoint_id: str,
        account: str,
        rid: str,
        connection: Connection | None,
    ) -> None:
        """Do what `SELECT_FLOW` says for `verdict` (never shows the chooser again)."""
        step = SELECT_FLOW[verdict]
        if step.binds and connection is not None:
            handle = "h-" + secrets.token_urlsafe(18)
            self.handles[handle] = Selection(endpoint_id, account, connection.id, connection)
            self._answer(endpoint_id, "llm.select", rid, connection, handle)
        elif step.error is not None:
            self._send(endpoint_id, error_result("llm.select", rid, NapError(step.error)))

    def _judge(
        self,
        endpoint_id: str,
        account: str,
        msg: Select,
        choice: _Choice,
        pick: ChoicePick | None,
    ) -> tuple[PickVerdict, Connection | None]:
        """What the chooser's answer is (`PickVerdict`), and the record it binds if any."""
        if endpoint_id not in self._pending or account != self._account():
            return PickVerdict.GONE, None
        if pick is None:
            return PickVerdict.DECLINED, None
        if pick.revision != choice.request.revision:
            return PickVerdict.OLD_LIST, None
        connection = self._connections.get(pick.connection_id)
        if (
            connection is None
            or choice.offered.get(pick.connection_id) is not connection
            or not meets(connection, msg.requirements)
        ):
            return PickVerdict.NOT_OFFERED, None
        return PickVerdict.BOUND, connection

    def _answer(
        self, endpoint_id: str, kind: str, rid: str, connection: Connection, handle: str
    ) -> None:
        """Answer a select or describe with the Model record of `handle`
        (`generations.answer`: one terminal result, even if it cannot be built)."""

        answer(
            self._send,
            endpoint_id,
            kind,
            rid,
            lambda: model_result(kind, rid, self._model(connection, handle)),
        )

    def _model(self, connection: Connection, handle: str) -> dict[str, Any]:
        """The Model record of `handle` (NAP-LLM, Model); raises if it is inconsistent."""
        return ModelRecord.model_validate(connection.public_model(handle)).to_json()

    def _refresh_choosers(self) -> None:
        """Every open chooser offers the connections that fit now.

        A removed connection leaves its list, an added one that meets the
        requirements joins it, an edited one is offered as its new record
        (or leaves when it no longer fits). Each change makes a new list
        revision; a pick made on an older revision is not bound (`_select`
        shows the current list again). The chooser's `refresh`, when it has
        one, shows the new list in place.
        """
        refresh = getattr(self._chooser(), "refresh", None)
        everything = self._connections.all()
        for pending in self._pending.values():
            for entry in pending.values():
                choice = entry.choice
                if choice is None:
                    continue  # not asked yet: a pick of a record changed since is not bound
                requirements = choice.request.requirements
                fitting = [c for c in everything if meets(c, requirements)]
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
