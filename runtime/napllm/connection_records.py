"""Connection records: the shell's own data about each route to a model
(docs/design.md, "Connection"; NAP-LLM, Model).

Rules
- A connection is a user-configured (or shipped) route to one model:
  provider kind, model id, settings, credential. Never from a napplet; its
  capabilities come from the provider (a service's listing, an engine's
  facts about the device) or, for servers that cannot report them, from
  the user.
- `Connection.public_model` is the only view a napplet gets (the NAP-LLM
  Model record); the connection id, settings and credential never leave
  the shell. Every edit bumps `revision`.
- `toolChoiceModes` lists exactly the supported modes without duplicates;
  `tools: true` requires `auto` and `none`; `tools: false` requires an
  empty list (NAP-LLM, Model).
- Base URLs are plain `http(s)://host[:port][/path]`: user info, a query
  and a fragment are refused, as is user info in a model URL, with fixed
  messages that never repeat the URL (`check_base_url`, `check_model_url`).

Split from `records` (the NAP-LLM records a napplet sends and gets) so that
each module holds one kind of data; the rule and provider layers import
these records, never the registry (`connections`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

#: A `Connection.kind` as a record holds it: a plain lower-case name. Which
#: kinds exist is the kinds table's rule (`kinds.ProviderKind`): the form's
#: spec checks it, and a stored connection of a kind the table does not know
#: has no route (`kinds.route_for` raises), so it is never read back.
KIND_NAME = r"^[a-z][a-z0-9-]{0,31}$"

ToolChoiceMode = Literal["auto", "none", "required", "tool"]
TOOL_CHOICE_ORDER: tuple[ToolChoiceMode, ...] = ("auto", "none", "required", "tool")


def check_tool_choice_modes(tools: bool, modes: Sequence[str]) -> None:
    """The module's `toolChoiceModes` rule (NAP-LLM, Model), for a connection's
    capabilities and for the Model record built from them alike.

    Raises `ValueError` (pydantic reports it as a validation error) when a
    mode repeats, when `tools` is true without `auto` and `none`, or when
    `tools` is false and `modes` is not empty.
    """
    if len(set(modes)) != len(modes):
        raise ValueError("tool choice modes must not repeat")
    if tools and not {"auto", "none"} <= set(modes):
        raise ValueError("tools: true must support auto and none")
    if not tools and modes:
        raise ValueError("tool choice modes need tools: true")


class Capabilities(BaseModel):
    """What a connection can take, as reported by its provider.

    `images`: image input in user messages; `images_in_tool_results`: images
    inside toolResult content; `json`: JSON-object output; `tools` and
    `tool_choice_modes`: tool calling (NAP-LLM, Model); `temperature`:
    inclusive accepted range or `None` when temperature cannot be set;
    `requires_reasoning_state`: replaying assistant history with `thinking`
    needs opaque provider state this contract cannot carry (NAP-LLM, Part).
    """

    images: bool = False
    images_in_tool_results: bool = False
    json_output: bool = Field(default=False, alias="json")
    tools: bool = False
    tool_choice_modes: tuple[ToolChoiceMode, ...] = ()
    temperature: tuple[float, float] | None = (0.0, 2.0)
    requires_reasoning_state: bool = False

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @model_validator(mode="after")
    def _modes_consistent(self) -> Capabilities:
        modes = self.tool_choice_modes
        check_tool_choice_modes(self.tools, modes)
        if self.images_in_tool_results and not self.images:
            raise ValueError("images in tool results need image input")
        ordered = tuple(m for m in TOOL_CHOICE_ORDER if m in modes)
        object.__setattr__(self, "tool_choice_modes", ordered)
        return self


#: The form's fixed message for a URL with `user:password@` in it.
USERINFO_MESSAGE = (
    "The URL must not contain a user name or password (user:secret@). "
    "Put the token or API key in the Access token / API key field instead."
)
BASE_URL_MESSAGE = "The base URL must be an http or https URL with a host."
QUERY_MESSAGE = (
    "The base URL must not have a query (?...) or fragment (#...). "
    "Put a token or API key in the Access token / API key field instead."
)


class UrlRefused(ValueError):
    """A URL a connection may not use; the message is fixed (never the URL)."""


def _split(url: object) -> Any:
    if not isinstance(url, str):
        raise UrlRefused(BASE_URL_MESSAGE)
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (raises ValueError for a malformed port)
    except ValueError:
        raise UrlRefused(BASE_URL_MESSAGE) from None
    return parts


def check_base_url(url: object) -> str:
    """Return `url` if it is a usable connection base URL.

    `http(s)://host[:port][/path]` only. Raises `UrlRefused` (a `ValueError`
    with one of the fixed messages above) for anything else, in particular
    for user info, a query or a fragment: a secret there would reach route
    texts, summaries and error reports.
    """
    parts = _split(url)
    if "@" in parts.netloc or parts.username is not None:
        raise UrlRefused(USERINFO_MESSAGE)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UrlRefused(BASE_URL_MESSAGE)
    if parts.query or parts.fragment or "?" in str(url) or "#" in str(url):
        raise UrlRefused(QUERY_MESSAGE)
    return str(url)


def check_model_url(url: object) -> str:
    """Return a model URL (`settings.url`, a GGUF) unless it has user info.

    Raises `UrlRefused` with `USERINFO_MESSAGE` for `user:secret@`.
    """
    parts = _split(url)
    if "@" in parts.netloc or parts.username is not None:
        raise UrlRefused(USERINFO_MESSAGE)
    return str(url)


def check_settings_urls(settings: dict[str, Any], *, base_required: bool) -> None:
    """Check `baseUrl` (required when `base_required`) and a model `url` of `settings`.

    Raises `UrlRefused` as `check_base_url` and `check_model_url` do.
    """
    if base_required or "baseUrl" in settings:
        check_base_url(settings.get("baseUrl"))
    if "url" in settings:
        check_model_url(settings["url"])


class Connection(BaseModel):
    """One user-configured route to one model.

    `id`: private, stable identifier (never sent to a napplet); `name`: the
    user's label; `kind`: provider kind; `model`: exact provider model id;
    `route`: every hop, for disclosure (never a credential); `charges`:
    whether the provider may bill the user; `settings`: provider settings
    such as `base_url`; `credential`: secret, shell-only; `available` and
    `unavailable_reason`: for engines whose device lacks support (WebGPU).
    """

    model_config = ConfigDict(extra="forbid")

    id: str
    name: str
    kind: str = Field(pattern=KIND_NAME)
    model: str = Field(min_length=1)
    route: str
    capabilities: Capabilities = Field(default_factory=Capabilities)
    charges: bool = False
    settings: dict[str, Any] = Field(default_factory=dict)
    credential: SecretStr | None = None
    available: bool = True
    unavailable_reason: str | None = None
    revision: int = 0

    @model_validator(mode="after")
    def _urls(self) -> Connection:
        # A stored connection from before this rule may carry user info.
        check_settings_urls(self.settings, base_required=False)
        return self

    def public_model(self, handle: str) -> dict[str, Any]:
        """The NAP-LLM Model record for `handle` (NAP-LLM, Model)."""
        caps = self.capabilities
        return {
            "handle": handle,
            "name": self.name,
            "model": self.model,
            "route": self.route,
            "images": caps.images,
            "json": caps.json_output,
            "tools": caps.tools,
            "toolChoiceModes": list(caps.tool_choice_modes),
        }

    def public_summary(self) -> dict[str, Any]:
        """What the shell's own UI may show (camelCase): everything but the credential."""
        caps = self.capabilities
        return {
            "id": self.id,
            "name": self.name,
            "kind": self.kind,
            "model": self.model,
            "route": self.route,
            "capabilities": {
                "images": caps.images,
                "imagesInToolResults": caps.images_in_tool_results,
                "json": caps.json_output,
                "tools": caps.tools,
                "toolChoiceModes": list(caps.tool_choice_modes),
                "temperature": list(caps.temperature) if caps.temperature else None,
            },
            "charges": self.charges,
            "settings": dict(self.settings),
            "hasCredential": self.credential is not None,
            "available": self.available,
            "unavailableReason": self.unavailable_reason,
            "revision": self.revision,
        }
