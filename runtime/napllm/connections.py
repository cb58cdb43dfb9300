"""User-configured connections and their capabilities (DESIGN.md, "Connection").

Rules
- A connection is a user-configured route to one model: provider kind, model
  id, endpoint URL and credential where needed. Its capabilities come from
  the provider (discovery, engine facts), never from a napplet.
- `Connection.public_model(handle)` is the only view a napplet gets (the
  NAP-LLM Model record): label, model id, route and capability flags. The
  connection id, URL, settings and credential never leave the shell.
- Every edit bumps `revision`; the shell compares revisions to invalidate
  handles (`selection-expired`) and standing consent grants.
- `toolChoiceModes` lists exactly the supported modes without duplicates;
  `tools: true` requires `auto` and `none`; `tools: false` requires an empty
  list (NAP-LLM, Model).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

ProviderKind = Literal["webllm", "wasm", "onnx", "lmsp", "openai", "fixture", "scripted"]
ToolChoiceMode = Literal["auto", "none", "required", "tool"]
TOOL_CHOICE_ORDER: tuple[ToolChoiceMode, ...] = ("auto", "none", "required", "tool")


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
        if len(set(modes)) != len(modes):
            raise ValueError("tool choice modes must not repeat")
        if self.tools and not {"auto", "none"} <= set(modes):
            raise ValueError("tools: true must support auto and none")
        if not self.tools and modes:
            raise ValueError("tool choice modes need tools: true")
        if self.images_in_tool_results and not self.images:
            raise ValueError("images in tool results need image input")
        ordered = tuple(m for m in TOOL_CHOICE_ORDER if m in modes)
        object.__setattr__(self, "tool_choice_modes", ordered)
        return self


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
    kind: ProviderKind
    model: str = Field(min_length=1)
    route: str
    capabilities: Capabilities = Field(default_factory=Capabilities)
    charges: bool = False
    settings: dict[str, Any] = Field(default_factory=dict)
    credential: SecretStr | None = None
    available: bool = True
    unavailable_reason: str | None = None
    revision: int = 0

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
    kind: Literal["lmsp", "openai", "wasm", "webllm", "onnx", "scripted"]
    model: str = Field(min_length=1, max_length=500)
    settings: dict[str, Any] = Field(default_factory=dict)
    credential: str | None = None
    capabilities: CapabilitySpec = Field(default_factory=CapabilitySpec)
    charges: bool = False

    @model_validator(mode="after")
    def _script(self) -> ConnectionSpec:
        if self.kind == "scripted" and not isinstance(self.settings.get("script"), str):
            raise ValueError("a scripted connection needs its script text")
        return self

    @model_validator(mode="after")
    def _settings(self) -> ConnectionSpec:
        if self.kind in ("lmsp", "openai"):
            base = self.settings.get("baseUrl")
            if not isinstance(base, str) or not base.startswith(("http://", "https://")):
                raise ValueError("baseUrl must be an http(s) URL")
        return self


def host_of(url: str) -> str:
    """`host:port` of an http(s) URL, for route texts (never the path or query)."""
    rest = url.split("://", 1)[-1]
    host = rest.split("/", 1)[0]
    return host.rsplit("@", 1)[-1]  # drop any userinfo


def route_for(kind: ProviderKind, settings: dict[str, Any]) -> str:
    """The disclosure route: every hop, destination included (DESIGN.md, Route)."""
    if kind == "lmsp":
        return f"This browser -> LMSP service at {host_of(str(settings.get('baseUrl', '')))}"
    if kind == "openai":
        return (
            "This browser -> OpenAI-compatible server at "
            f"{host_of(str(settings.get('baseUrl', '')))}"
        )
    if kind == "wasm":
        return "This browser -> llama.cpp on WebAssembly (this device)"
    if kind == "webllm":
        return "This browser -> WebLLM on WebGPU (this device)"
    if kind == "onnx":
        return "This browser -> transformers.js (ONNX Runtime) on WebGPU (this device)"
    if kind == "scripted":
        return "This browser -> scripted responses (this page; no model, nothing leaves the page)"
    return "This browser -> fixture provider (this page)"


def capabilities_for_spec(spec: ConnectionSpec) -> Capabilities:
    """Declared capabilities for an OpenAI-compatible server (auto/none modes
    plus required/tool: OpenAI's `tool_choice` accepts all four)."""
    caps = spec.capabilities
    modes: tuple[ToolChoiceMode, ...] = ("auto", "none", "required", "tool") if caps.tools else ()
    return Capabilities(
        images=caps.images, json_output=caps.json_output, tools=caps.tools, tool_choice_modes=modes
    )
