"""User-configured connections: the registry, the form's specs, routes
(docs/design.md, "Connection").

The records themselves (`Connection`, `Capabilities`, `ToolChoiceMode`)
live in `connection_records` and the kinds in `kinds.py`, so the rule and
provider layers depend on data only, never on this module.

Rules
- A connection is a user-configured route to one model: provider kind, model
  id, endpoint URL and credential where needed. Its capabilities come from
  the provider (discovery, engine facts), never from a napplet.
- `Connection.public_model(handle)` is the only view a napplet gets (the
  NAP-LLM Model record): label, model id, route and capability flags. The
  connection id, URL, settings and credential never leave the shell.
- Every edit bumps `revision`; the shell compares revisions to invalidate
  handles (`selection-expired`) and standing consent grants.
- A secret belongs in the credential (the form's token field) only. Base
  URLs (`settings.baseUrl`) are plain `http(s)://host[:port][/path]`: user
  info (`user:secret@`), a query and a fragment are refused, as is user
  info in a model URL (`settings.url`), both in the form's spec and in a
  stored connection, with fixed messages that never repeat the URL
  (`check_base_url`, `check_model_url`, `spec_error_text`).
- Kinds, their form fields and their routes are described once, in
  `kinds.py` (`host_of` is re-exported here); what each kind does, in its
  class (`providers.connection_kinds`).
- `toolChoiceModes` lists exactly the supported modes without duplicates;
  `tools: true` requires `auto` and `none`; `tools: false` requires an empty
  list (NAP-LLM, Model).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from .connection_records import (
    BASE_URL_MESSAGE,
    QUERY_MESSAGE,
    TOOL_CHOICE_ORDER,
    USERINFO_MESSAGE,
    Capabilities,
    Connection,
    ToolChoiceMode,
    UrlRefused,
    check_base_url,
    check_model_url,
)
from .connection_records import check_settings_urls as _check_settings_urls
from .kinds import FormKind, ProviderKind, host_of, kind_info


def spec_error_text(exc: ValidationError) -> str:
    """A message for the connections form from a failed `ConnectionSpec`.

    Only napllm's own fixed texts (`UrlRefused`) are passed on; pydantic's
    text is never used, because it repeats the input (the URL, the token).
    """
    for error in exc.errors(include_input=False, include_url=False):
        cause = (error.get("ctx") or {}).get("error")
        if isinstance(cause, UrlRefused):
            return str(cause)
    return "The connection could not be saved. Check the fields and try again."


__all__ = [  # the records are re-exported for older imports; import them from records
    "BASE_URL_MESSAGE",
    "QUERY_MESSAGE",
    "TOOL_CHOICE_ORDER",
    "USERINFO_MESSAGE",
    "Capabilities",
    "CapabilitySpec",
    "Connection",
    "ConnectionRegistry",
    "ConnectionSpec",
    "ProviderKind",
    "ToolChoiceMode",
    "UrlRefused",
    "capabilities_for_spec",
    "check_base_url",
    "check_model_url",
    "host_of",
    "spec_error_text",
]

Listener = Callable[[str, Literal["added", "edited", "removed"]], None]


class ConnectionRegistry:
    """The user's connections, keyed by id, with change notification.

    `add`, `edit` and `remove` notify listeners with `(connection_id, change)`;
    the shell listens to invalidate handles and grants. Raises `KeyError` for
    an unknown id and `ValueError` for a duplicate one.
    """

    def __init__(self) -> None:
        self._items: dict[str, Connection] = {}
        self._listeners: list[Listener] = []

    def subscribe(self, listener: Listener) -> None:
        """Call `listener(connection_id, change)` after every change."""
        self._listeners.append(listener)

    def _notify(self, cid: str, change: Literal["added", "edited", "removed"]) -> None:
        for listener in list(self._listeners):
            listener(cid, change)

    def add(self, connection: Connection) -> Connection:
        """Add a new connection; its revision starts at 0."""
        if connection.id in self._items:
            raise ValueError("duplicate connection id")
        self._items[connection.id] = connection
        self._notify(connection.id, "added")
        return connection

    def edit(self, cid: str, **changes: Any) -> Connection:
        """Replace fields of a connection and bump its revision."""
        old = self._items[cid]
        data = old.model_dump(by_alias=True)
        data.update(changes)
        data["revision"] = old.revision + 1
        data["id"] = cid
        if "credential" not in changes:
            data["credential"] = old.credential
        new = Connection.model_validate(data)
        self._items[cid] = new
        self._notify(cid, "edited")
        return new

    def remove(self, cid: str) -> None:
        """Remove a connection (its handles become invalid)."""
        del self._items[cid]
        self._notify(cid, "removed")

    def get(self, cid: str) -> Connection | None:
        """The connection with id `cid`, if it exists."""
        return self._items.get(cid)

    def all(self) -> list[Connection]:
        """Every connection, in insertion order."""
        return list(self._items.values())


# --------------------------------------------------------------------------
# Connections the user configures in the shell UI


class CapabilitySpec(BaseModel):
    """Capabilities a user declares for a server that cannot report them."""

    model_config = ConfigDict(extra="ignore", strict=True)

    images: bool = False
    json_output: bool = Field(default=False, alias="json")
    tools: bool = False


class ConnectionSpec(BaseModel):
    """What the connections form submits (JSON from the shell UI).

    `settings.baseUrl` is required for `lmsp` and `openai`, `settings.url`
    (a GGUF) for `wasm`, `settings.script` (JSON text, validated by
    `providers.scripted.parse_script` when the connection is built) for
    `scripted`; `credential` is the token or API key (None keeps the stored
    one on edit).
    """

    model_config = ConfigDict(extra="ignore", strict=True)

    name: str = Field(min_length=1, max_length=200)
    kind: FormKind
    model: str = Field(min_length=1, max_length=500)
    settings: dict[str, Any] = Field(default_factory=dict)
    credential: str | None = None
    capabilities: CapabilitySpec = Field(default_factory=CapabilitySpec)
    charges: bool = False

    @model_validator(mode="after")
    def _fields(self) -> ConnectionSpec:
        check_kind_settings(self.kind, self.settings)
        return self


def check_kind_settings(kind: str, settings: dict[str, Any]) -> None:
    """The form's checks of `settings` for a connection of `kind`.

    The kind's row (kinds.KINDS) says which of the form's fields it has: a
    script kind needs its script text, a server kind its `baseUrl`; every
    URL is checked (`connection_records.check_settings_urls`). Raises
    `ValueError` (`UrlRefused` with a fixed message for a URL). Applied to
    the form's `ConnectionSpec` and again to every stored connection read
    back (`connection_kinds`, `stored`), which storage may hand back changed.
    """
    info = kind_info(kind)
    if info is not None and info.script and not isinstance(settings.get("script"), str):
        raise ValueError("a scripted connection needs its script text")
    _check_settings_urls(settings, base_required=info is not None and info.base_url)


def capabilities_for_spec(spec: ConnectionSpec) -> Capabilities:
    """Declared capabilities for an OpenAI-compatible server (auto/none modes
    plus required/tool: OpenAI's `tool_choice` accepts all four)."""
    caps = spec.capabilities
    modes: tuple[ToolChoiceMode, ...] = ("auto", "none", "required", "tool") if caps.tools else ()
    return Capabilities(
        images=caps.images, json_output=caps.json_output, tools=caps.tools, tool_choice_modes=modes
    )
