"""The page's side of the shell's ports, and the intake of a frame's messages.

The page (web/shell.js) defines `window.napllmHost`; this module is the
Python half of that contract for everything the shell itself needs:

- `BridgeTransport` (the shell's transport): envelopes to frames through
  `napllmHost.postAll(json)`, those of one run of Python together.
- `DomChooser` / `DomConsent` (the shell's dialogs): the page's `<dialog>`s
  through `napllmHost.openChooser` / `openConsent`, closed with
  `napllmHost.closeDialog` when the shell no longer needs them.
- `BridgeObserver`: inspector notes and user notices (`napllmHost.inspect`,
  `napllmHost.notice`).
- `message_from_wire` and `identity_from_json`: what the page sends about a
  frame (web/js/wire.js `toWireJson`; the document's identity) turned into
  the shell's inputs.

Rules
- Everything crossing the bridge is JSON text, so JS `null` stays `None`
  and no JS object is held by Python (docs/design.md, "Known behaviours":
  `jsnull`, proxies). Text from
  the page is read by the one strict reader (`jsontext.read_json`).
- A dialog that fails or answers anything but an explicit Allow denies.
- An answer names what the person saw: the chooser's pick carries the
  revision of the candidate list it was made on (`ChoicePick`), the
  consent's Allow the digest of the disclosure shown (`Disclosure.digest`).
  An Allow without the digest of this disclosure denies; a pick without a
  revision is a cancel.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
from collections.abc import Callable
from typing import Any

from js import napllmHost  # type: ignore[import-not-found]

from ..jsontext import read_json
from ..shell import (
    ChoicePick,
    ChoiceRequest,
    ConsentDecision,
    Disclosure,
    NappletIdentity,
    Observer,
)
from ..wire import Unclonable, loads_strict

log = logging.getLogger("napllm.browser.bridge")


class BridgeTransport:
    """Delivers envelopes through `napllmHost.postAll`, in the order sent.

    Envelopes sent while Python runs are serialized at once and handed to
    the page together when that run ends (a microtask, before the browser
    does anything else): `[[endpointId, envelope], ...]` as one JSON text.
    An answer's start and first delta, or its last delta, end and result,
    then cost one bridge crossing and one parse instead of one each.
    `schedule(flush)` arranges the hand-over (the page's `queueMicrotask`).
    """

    def __init__(self, schedule: Callable[[Callable[[], None]], None] | None = None) -> None:
        self._pending: list[str] = []
        if schedule is None:
            from js import queueMicrotask  # type: ignore[import-not-found]
            from pyodide.ffi import create_proxy  # type: ignore[import-not-found]

            flush = create_proxy(self.flush)  # one proxy for the page's lifetime

            def schedule(_fn: Callable[[], None]) -> None:
                queueMicrotask(flush)

        self._schedule = schedule

    def send(self, endpoint_id: str, envelope: dict[str, Any]) -> None:
        """Queue for the endpoint's frame; the page drops it if the frame is gone by then.

        Raises `ValueError` for an envelope that is not JSON (NaN or an
        infinity, which `JSON.parse` refuses) and `TypeError` for a value
        JSON has no form for; nothing is queued then, so the run's other
        envelopes still reach the page (they share one JSON text), and the
        shell answers the request with `provider-error` instead.
        """
        self._pending.append(
            json.dumps(
                [endpoint_id, envelope], ensure_ascii=False, separators=(",", ":"), allow_nan=False
            )
        )
        if len(self._pending) == 1:
            try:
                self._schedule(self.flush)
            except Exception:
                # Without a hand-over the queue would wait for ever (and every
                # later envelope with it): deliver now, as a plain post would.
                log.exception("napllm: the hand-over of envelopes could not be scheduled")
                self.flush()

    def flush(self) -> None:
        """Hand every queued envelope to the page now (`napllmHost.postAll`)."""
        if not self._pending:
            return
        batch = "[" + ",".join(self._pending) + "]"
        self._pending = []
        napllmHost.postAll(batch)


class DomChooser:
    """The page's `<dialog>` chooser; closed when the shell no longer needs it.

    An open chooser is refreshed in place when the connections change
    (`refresh`, called by the shell; `napllmHost.updateChooser`). The page
    answers `{"id": candidate id, "revision": the list's revision}` as JSON
    text, or null for Cancel.
    """

    def __init__(self) -> None:
        # id() of the request of each open chooser -> its dialog token
        self._open: dict[int, str] = {}

    async def choose(self, request: ChoiceRequest) -> ChoicePick | None:
        """Show the dialog; the pick (`pick_from_json`) or None."""
        token = "c-" + secrets.token_hex(8)
        self._open[id(request)] = token
        try:
            payload = request.to_json() | {"endpointId": request.endpoint_id}
            answer = await napllmHost.openChooser(token, json.dumps(payload))
        except asyncio.CancelledError:
            napllmHost.closeDialog(token)
            raise
        finally:
            self._open.pop(id(request), None)
        return pick_from_json(answer)

    def refresh(self, request: ChoiceRequest, updated: ChoiceRequest) -> None:
        """Show `updated`'s candidates in the open chooser of `request`."""
        token = self._open.get(id(request))
        if token is not None:
            payload = updated.to_json() | {"endpointId": updated.endpoint_id}
            napllmHost.updateChooser(token, json.dumps(payload))


class DomConsent:
    """The page's `<dialog>` consent; closed when the shell no longer needs it.

    The payload carries the disclosure's `digest`; the page's Allow returns
    it (`consent_from_json`).
    """

    async def ask(self, disclosure: Disclosure) -> ConsentDecision:
        """Show the dialog; Deny unless the page answered an explicit Allow of this disclosure."""
        token = "k-" + secrets.token_hex(8)
        try:
            digest = disclosure.digest
            payload = disclosure.to_json() | {
                "endpointId": disclosure.endpoint_id,
                "digest": digest,
            }
            answer = await napllmHost.openConsent(token, json.dumps(payload))
        except asyncio.CancelledError:
            napllmHost.closeDialog(token)
            raise
        try:
            data = read_json(str(answer))
        except ValueError:
            return ConsentDecision(allow=False)
        return consent_from_json(data, digest)


def pick_from_json(answer: object) -> ChoicePick | None:
    """The chooser page's answer as a pick; None (a cancel) for anything else.

    `answer`: JSON text `{"id": non-empty text, "revision": integer >= 0}`
    (web/js/dialogs.js); null, other text or other shapes are a cancel.
    """
    if not isinstance(answer, str) or not answer:
        return None
    try:
        data = read_json(answer)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    cid, revision = data.get("id"), data.get("revision")
    if not isinstance(cid, str) or not cid:
        return None
    if not isinstance(revision, int) or isinstance(revision, bool) or revision < 0:
        return None
    return ChoicePick(cid, revision)


def consent_from_json(data: object, digest: str) -> ConsentDecision:
    """The consent page's answer (parsed JSON) for the disclosure with `digest`.

    Allow only for `{"allow": true, "digest": digest, ...}`; "remember" only
    with that Allow. Anything else denies (NAP-LLM, Shell Behavior: a
    disclosure not shown is no authorization).
    """
    if not isinstance(data, dict) or data.get("digest") != digest:
        return ConsentDecision(allow=False)
    allow = data.get("allow") is True
    return ConsentDecision(allow=allow, remember=allow and data.get("remember") is True)


class BridgeObserver(Observer):
    """Forwards inspector notes and user notices to the page.

    `on_grants_changed` is called when the standing grants change (the page
    re-renders its list).
    """

    def __init__(self, on_grants_changed: Callable[[], None]) -> None:
        self._on_grants_changed = on_grants_changed

    # Envelopes are recorded by the page itself, in (before `receive`) and
    # out (in `napllmHost.postAll`), so `envelope` keeps the no-op default.

    def dropped(self, endpoint_id: str, reason: str) -> None:
        """Shown in the inspector as a note, not as an envelope."""
        napllmHost.inspect(endpoint_id, "note", json.dumps({"dropped": reason}))

    def notice(self, level: str, text: str, connection_id: str | None = None) -> None:
        """A message for the user in the shell UI."""
        payload: dict[str, Any] = {"level": level, "text": text}
        if connection_id:
            payload["connectionId"] = connection_id
        napllmHost.notice(json.dumps(payload))

    def grants_changed(self) -> None:
        """Refresh the grants list in the connections panel."""
        self._on_grants_changed()


def message_from_wire(wire_text: str) -> object | None:
    """The message a frame posted, from the page's wire text; None to drop it.

    `wire_text` is web/js/wire.js `toWireJson`'s output: `{"json": text}`
    for a message the page could serialise (read here by the wire layer's
    strict reader; unreadable text becomes an `Unclonable` without type or
    id), else `{"type"?, "id"?, "tooLarge"?}` describing one it could not
    (an `Unclonable`, which the shell answers when it can correlate it).
    Text that is not a JSON object is dropped (None).
    """
    try:
        wire = read_json(str(wire_text))
    except ValueError:
        return None
    if not isinstance(wire, dict):
        return None
    if "json" in wire and isinstance(wire["json"], str):
        try:
            return loads_strict(wire["json"])
        except ValueError:
            return Unclonable(None, None)
    kind = wire.get("type")
    rid = wire.get("id")
    return Unclonable(
        kind if isinstance(kind, str) else None,
        rid if isinstance(rid, str) else None,
        too_large=wire.get("tooLarge") is True,
    )


def identity_from_json(identity_text: str) -> NappletIdentity:
    """A frame document's identity from the page's JSON text.

    `{"name": str, "sha256": hex str, "domains": [str], "origin"?: str}`;
    non-string domains are ignored and the origin is cut to 200 characters.
    Raises `ValueError` (`JsonTextError`) for text that is not JSON and
    `KeyError` / `AttributeError` for a record missing name or sha256.
    """
    data = read_json(str(identity_text))
    domains = frozenset(d for d in data.get("domains", []) if isinstance(d, str))
    origin = data.get("origin")
    return NappletIdentity(
        str(data["name"]),
        str(data["sha256"]),
        domains,
        origin[:200] if isinstance(origin, str) else "",
    )
