"""The records the shell's ports exchange, and the ports themselves.

The shell (`shell.Shell`) talks to the page only through these ports:
`Transport` (envelopes to an endpoint), `Chooser` (the model chooser),
`Consent` (the disclosure dialog), `Clock` (deadlines), an optional
`Observer`, and a provider factory. What crosses them is plain data, defined
here: who a napplet is (`NappletIdentity`), what the chooser shows and what
the user picked (`ChoiceRequest`, `ChoicePick`), what the consent dialog
discloses and what the user answered (`Disclosure`, `ConsentDecision`), a
standing grant (`Grant`) and the runtime's limits (`ShellPolicy`).

Rules (docs/design.md, "Napplet identity", "Consent", "Deadline")
- Records are frozen; their `to_json` is what the page receives.
- A dialog's Allow must return the digest of the disclosure it showed
  (`Disclosure.digest`).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from .connection_records import Connection
from .model_names import model_display_name
from .providers.base import Provider
from .records import (
    GenerationRequest,
    ImagePart,
    Requirements,
    TextPart,
    ThinkingPart,
    ToolCallPart,
)

# --------------------------------------------------------------------------
# Records the ports exchange


@dataclass(frozen=True)
class NappletIdentity:
    """A napplet as loaded: `name` plus the sha256 (hex) of its exact bytes.

    `domains`: the NAP domains exposed to it (the shell serves `llm` only if
    present). `origin`: where a napplet opened from a URL was loaded from
    (``"https://example.org"``), shown wherever it is named; ``""`` for a
    napplet listed by the shell itself.
    """

    name: str
    sha256: str
    domains: frozenset[str] = frozenset({"llm"})
    origin: str = ""

    @property
    def short_hash(self) -> str:
        """The first 12 hex digits, for dialogs."""
        return self.sha256[:12]

    def to_json(self) -> dict[str, str]:
        """`{"name", "sha256", "shortHash"}` (plus `"origin"` when set) for the UI."""
        out = {"name": self.name, "sha256": self.sha256, "shortHash": self.short_hash}
        if self.origin:
            out["origin"] = self.origin
        return out


@dataclass(frozen=True)
class ChoiceRequest:
    """What the chooser shows: who asks, what is required, which connections fit.

    `revision` numbers the candidate lists of one chooser (0 first, one more
    each time the fitting connections change while it is open); a pick says
    which list it was made on (`ChoicePick`).
    """

    endpoint_id: str
    napplet: NappletIdentity
    requirements: Requirements
    candidates: list[Connection]
    revision: int = 0

    def to_json(self) -> dict[str, Any]:
        """The chooser's input (no credentials, no settings)."""
        return {
            "revision": self.revision,
            "napplet": self.napplet.to_json(),
            "requirements": self.requirements.model_dump(exclude_none=True, by_alias=True),
            "candidates": [
                {
                    "id": c.id,
                    "name": c.name,
                    "kind": c.kind,
                    "model": c.model,
                    "route": c.route,
                    "charges": c.charges,
                    "capabilities": {
                        k: v for k, v in c.public_model("").items() if k not in _MODEL_IDENTITY
                    },
                }
                for c in self.candidates
            ],
        }


_MODEL_IDENTITY = ("handle", "name", "model", "route")


@dataclass(frozen=True)
class ChoicePick:
    """The person's pick: a candidate's connection id and the list it was on.

    `revision` is the `ChoiceRequest.revision` of the list the chooser
    showed when the person picked (NAP-LLM, API Surface `select`: the shell
    binds only the connection the person chose, never a replacement).
    """

    connection_id: str
    revision: int


@dataclass(frozen=True)
class ToolResultDisclosure:
    """One tool result to be disclosed: which call, how big, error flag."""

    tool_name: str
    tool_call_id: str
    characters: int
    images: int
    is_error: bool


@dataclass(frozen=True)
class Disclosure:
    """Everything the consent dialog must name (NAP-LLM, Shell Behavior).

    The requesting napplet, the route and model (its id and, for people, its
    name in words, `model_names.model_display_name`), what is disclosed (message
    count, characters, images, tool definitions, tool results) and whether
    charges may apply.
    """

    endpoint_id: str
    napplet: NappletIdentity
    connection: Connection
    messages: int
    characters: int
    images: int
    tool_definitions: list[dict[str, Any]]
    tool_results: list[ToolResultDisclosure]
    format: str
    max_tokens: int | None

    @property
    def digest(self) -> str:
        """SHA-256 (hex) of `to_json()`: what the dialog shows, exactly.

        A dialog returns it with its Allow, so an answer is only taken for
        the disclosure it was given (bridge.py `DomConsent`).
        """
        text = json.dumps(self.to_json(), sort_keys=True, ensure_ascii=False)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()

    def to_json(self) -> dict[str, Any]:
        """The consent dialog's input (no credentials, no settings)."""
        c = self.connection
        return {
            "napplet": self.napplet.to_json(),
            "connection": {"id": c.id, "name": c.name, "kind": c.kind},
            "route": c.route,
            "model": c.model,
            "modelName": model_display_name(c.model),
            "charges": c.charges,
            "disclosed": {
                "messages": self.messages,
                "characters": self.characters,
                "images": self.images,
                "toolDefinitions": self.tool_definitions,
                "toolResults": [
                    {
                        "toolName": r.tool_name,
                        "toolCallId": r.tool_call_id,
                        "characters": r.characters,
                        "images": r.images,
                        "isError": r.is_error,
                    }
                    for r in self.tool_results
                ],
                "format": self.format,
                "maxTokens": self.max_tokens,
            },
        }


@dataclass(frozen=True)
class ConsentDecision:
    """The user's answer: `allow`, and `remember` (opt-in standing grant)."""

    allow: bool
    remember: bool = False


@dataclass(frozen=True)
class Grant:
    """A standing consent: this napplet, this connection, this account."""

    key: str
    napplet: NappletIdentity
    connection_id: str
    account: str

    def to_json(self, connection_name: str) -> dict[str, Any]:
        """For the connections panel."""
        return {
            "key": self.key,
            "napplet": {"name": self.napplet.name, "shortHash": self.napplet.short_hash},
            "connectionId": self.connection_id,
            "connectionName": connection_name,
            "account": self.account,
        }


# --------------------------------------------------------------------------
# Ports


class Transport(Protocol):
    """Delivers one envelope (a JSON-ready dict) to an endpoint."""

    def send(self, endpoint_id: str, envelope: dict[str, Any]) -> None:
        """Deliver now; must not raise for a gone endpoint."""
        ...


class Chooser(Protocol):
    """The model chooser (a DOM dialog in the browser).

    A chooser may also offer `refresh(request, updated)`: while `choose(request)`
    is pending, the connections changed and `updated` (the same request with
    the candidates that fit now, at the next `revision`) replaces its
    candidate list. The shell calls it when present; a chooser without it
    keeps showing the first list, and its pick (of an older revision) makes
    the shell ask again with the current list.
    """

    async def choose(self, request: ChoiceRequest) -> ChoicePick | None:
        """The pick (with the revision of the list shown), or None when the user cancels.

        The shell cancels the awaiting task when the answer is no longer
        needed; the implementation closes its dialog then.
        """
        ...


class Consent(Protocol):
    """The per-request disclosure dialog."""

    async def ask(self, disclosure: Disclosure) -> ConsentDecision:
        """The user's decision; cancelled like `Chooser.choose`."""
        ...


ProviderFactory = Callable[[Connection], Provider]


class TimerHandle(Protocol):
    """A scheduled callback that can be cancelled."""

    def cancel(self) -> None:
        """Do not run the callback."""
        ...


class Clock(Protocol):
    """Time for deadlines and delta coalescing (seconds): timers only."""

    def call_later(self, delay: float, callback: Callable[[], None]) -> TimerHandle:
        """Run `callback` after `delay` seconds."""
        ...


class AsyncioClock:
    """The running event loop's timers (works under Pyodide's webloop too)."""

    def call_later(self, delay: float, callback: Callable[[], None]) -> TimerHandle:
        """The asyncio loop's `call_later`."""
        return asyncio.get_running_loop().call_later(delay, callback)


class Observer:
    """Hooks for the inspector and the shell UI; the default does nothing."""

    def envelope(self, endpoint_id: str, direction: Literal["in", "out"], envelope: Any) -> None:
        """Every envelope received (as parsed JSON) or sent."""

    def dropped(self, endpoint_id: str, reason: str) -> None:
        """A message that got no reply (not an envelope, unknown type, no id)."""

    def endpoint_closed(self, endpoint_id: str) -> None:
        """An endpoint's close transition ran (`lifecycle.EndpointLife`); its work
        is cancelled next, then it is forgotten."""

    def notice(self, level: str, text: str, connection_id: str | None = None) -> None:
        """A message for the user, shown by the shell (never in a frame)."""

    def submitted(self, endpoint_id: str, connection_id: str) -> None:
        """A generation was submitted to a provider."""

    def grants_changed(self) -> None:
        """The standing grants changed."""


@dataclass(frozen=True)
class ShellPolicy:
    """Runtime limits (NAP-LLM: "Runtime limits are policy").

    `deadline_s`: bound per generation, consent wait included; `delta_interval_s`:
    minimum time between delta flushes (coalescing); `max_active_per_endpoint`,
    `max_active_total`, `max_pending_selects`: concurrency limits
    (`quota-exceeded`); `max_characters`: text characters per request;
    `max_chooser_reshows`: how often one `select` shows the current list
    again after a pick made on an older one (then `selection-expired`).
    """

    deadline_s: float = 300.0
    delta_interval_s: float = 0.004
    max_active_per_endpoint: int = 16
    max_active_total: int = 128
    max_pending_selects: int = 4
    max_characters: int = 4_000_000
    max_chooser_reshows: int = 8


def disclose(
    endpoint_id: str, napplet: NappletIdentity, connection: Connection, request: GenerationRequest
) -> Disclosure:
    """What the consent dialog shows for `request` to `connection` (docs/design.md,
    "Consent"): message count, text characters, images, tool definitions, tool
    results, output format and token limit. Characters count text, thinking,
    and tool calls' names and arguments.
    """
    characters = 0
    images = 0
    results: list[ToolResultDisclosure] = []
    for message in request.messages:
        message_chars = 0
        message_images = 0
        for part in message.content:
            if isinstance(part, TextPart | ThinkingPart):
                message_chars += len(part.text)
            elif isinstance(part, ImagePart):
                message_images += 1
            elif isinstance(part, ToolCallPart):
                message_chars += len(part.name) + len(
                    json.dumps(part.arguments, ensure_ascii=False)
                )
        characters += message_chars
        images += message_images
        if message.role == "toolResult":
            assert message.toolName is not None and message.toolCallId is not None
            results.append(
                ToolResultDisclosure(
                    message.toolName,
                    message.toolCallId,
                    message_chars,
                    message_images,
                    bool(message.isError),
                )
            )
    tools = [
        {"name": t.name, "description": t.description or "", "parameters": t.schema_or_default()}
        for t in request.active_tools
    ]
    return Disclosure(
        endpoint_id,
        napplet,
        connection,
        len(request.messages),
        characters,
        images,
        tools,
        results,
        request.output_format,
        request.maxTokens,
    )
