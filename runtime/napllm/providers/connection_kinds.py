"""Connection kinds: one class per kind, all with the same few methods.

Each kind of connection (an LMSP service, an OpenAI-compatible server, a
developer's script, each engine in the page) is one `ConnectionKind`, as an
HTTP client has one transport interface for every transport. The shell never
asks which kind a connection is: it looks the kind up (`KindTable.kind`) and
calls the same methods on any of them (docs/design.md, "Connection"):

- `add(spec, cid)`: the user's connection from the connections form
  (`ConnectionSpec`, already validated by its model), with its capabilities
  (read from the service, declared by the user or by the script, or the
  engine's) and its route. Raises `ProviderFailure` (the service cannot be
  reached or does not list the model; a script that does not parse is a
  `ScriptError`) or `ValueError` (an engine the page lacks).
- `provider(connection)`: the `Provider` a submission goes to; raises
  `ProviderFailure` when none can be built.
- `default_connections()`: the kind's built-in connections (only engines
  have any).
- `route(settings)`: the disclosure route, every hop in words, destination
  included (NAP-LLM, Privacy). Hosts come from `kinds.host_of` only, so a
  route never holds a path, a query or a credential.
- `stored(connection)`: a connection read back from storage, checked again
  as the form checks its kind (`connections.check_kind_settings`), with
  what the kind derives (the route; an engine's settings, capabilities and
  availability; a script's capabilities) derived again, never trusted from
  storage; an engine connection whose model its engine cannot read now is
  listed unavailable, claiming nothing. A server's capabilities came from
  its listing or its user when it was added and stay as stored (the server
  is asked again only when the user edits it). Raises `ValueError` for a
  record the form would refuse (the shell counts it unreadable).

Rules
- The kind's row (label, form fields, route words) is read from
  `kinds.KINDS`; an engine's kind wraps its spec (`EngineKind`). A kind the
  table does not know has no class and no route: `KindTable.kind` raises
  `ValueError`.
- Credentials are read from the connection at submission time and never
  leave Python/fetch.
- A scripted connection's provider is kept per connection revision, so each
  submission takes the next turn and an edit starts again; each submission
  is reported to `ScriptedKind.on_request` when set.
- An `lmsp` connection's capabilities, and the engine its route names, come
  from the service's model listing (docs/lmsp.md), read when it is added or
  edited; an `openai` connection's are declared by the user, and its context
  window (`contextSize`, tokens) is the user's or the server listing's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol

from ..connection_records import UrlRefused, check_base_url
from ..connections import ConnectionSpec, capabilities_for_spec, check_kind_settings
from ..errors import ErrorCode, ProviderFailure
from ..kinds import HOP, KindInfo, engine_words, host_of, kind_info
from ..records import Capabilities, Connection
from .base import HttpPort, Provider
from .engine import BridgeOpener, EngineSpec, SpecEngine
from .lmsp_client import LmspProvider, capabilities_from_entry, discover_models
from .scripted import ScriptedProvider, ScriptError, parse_script


class ConnectionKind(Protocol):
    """One kind of connection (module docstring): its row and its four methods."""

    info: KindInfo

    async def add(self, spec: ConnectionSpec, cid: str) -> Connection:
        """The user's connection `cid` from the form's `spec` (module rules)."""
        ...

    def provider(self, connection: Connection) -> Provider:
        """The provider a submission to `connection` goes to."""
        ...

    async def default_connections(self) -> list[Connection]:
        """The kind's built-in connections (none for a server kind)."""
        ...

    def route(self, settings: dict[str, Any]) -> str:
        """The disclosure route of a connection of this kind with `settings`."""
        ...

    def stored(self, connection: Connection) -> Connection:
        """`connection` as read from storage, checked and re-derived (module rules)."""
        ...


def context_size(settings: dict[str, Any]) -> int | None:
    """A connection's `contextSize` setting (tokens, a positive integer), or `None`."""
    value = settings.get("contextSize")
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    return None


def _row(kind: str) -> KindInfo:
    info = kind_info(kind)
    if info is None:
        raise ValueError("no row for an unknown connection kind")
    return info


def _connection(
    kind: ConnectionKind, spec: ConnectionSpec, cid: str, settings: dict[str, Any], **rest: Any
) -> Connection:
    """The `Connection` record every kind's `add` ends with (route derived, never given)."""
    return Connection.model_validate(
        {
            "id": cid,
            "name": spec.name,
            "kind": spec.kind,
            "model": spec.model,
            "route": kind.route(settings),
            "charges": spec.charges,
            "settings": settings,
            "credential": spec.credential,
            **rest,
        }
    )


def _user_settings(spec: ConnectionSpec) -> dict[str, Any]:
    return dict(spec.settings) | {"userDefined": True}


def _checked(kind: ConnectionKind, connection: Connection, settings: dict[str, Any]) -> Connection:
    """`connection` with `settings`, checked as the form checks its kind, its route derived.

    Raises `ValueError` (module rules, `stored`).
    """
    check_kind_settings(kind.info.kind, settings)
    return connection.model_copy(update={"settings": settings, "route": kind.route(settings)})


def _base_url(connection: Connection) -> str:
    """A server connection's `baseUrl`; `ProviderFailure` when it has no usable one."""
    try:
        return check_base_url(connection.settings.get("baseUrl"))
    except UrlRefused:
        raise ProviderFailure(
            user_hint="This connection has no usable server address; edit it in Connections.",
            detail="no usable baseUrl",
        ) from None


def _secret(connection: Connection) -> str | None:
    return connection.credential.get_secret_value() if connection.credential else None


class _NoBuiltIns:
    async def default_connections(self) -> list[Connection]:
        """None: a server or a script is always the user's own connection."""
        return []

    def stored(self, connection: Connection) -> Connection:
        """`connection` checked as the form checks its kind, its route derived again."""
        return _checked(self, connection, dict(connection.settings))  # type: ignore[arg-type]


class LmspKind(_NoBuiltIns):
    """An LMSP service (docs/lmsp.md): capabilities and engine from its model listing."""

    name = "lmsp"

    def __init__(self, http: HttpPort) -> None:
        self.info = _row(self.name)
        self.http = http

    async def add(self, spec: ConnectionSpec, cid: str) -> Connection:
        """The connection, once the service lists `spec.model` (else `ProviderFailure`)."""
        settings = _user_settings(spec)
        entries = await discover_models(self.http, str(settings["baseUrl"]), spec.credential)
        entry = next((e for e in entries if e.id == spec.model), None)
        if entry is None:
            raise ProviderFailure(
                user_hint="The LMSP service does not list this model.", detail="model not listed"
            )
        # The engine the service names becomes the route's last hop.
        settings.pop("serviceEngine", None)
        engine = engine_words(entry.engine)
        if engine is not None:
            settings["serviceEngine"] = engine
        return _connection(self, spec, cid, settings, capabilities=capabilities_from_entry(entry))

    def provider(self, connection: Connection) -> Provider:
        """An `LmspProvider` over the page's fetch."""
        return LmspProvider(
            self.http,
            _base_url(connection),
            _secret(connection),
            resumable=bool(connection.settings.get("resumable", False)),
        )

    @staticmethod
    def route(settings: dict[str, Any]) -> str:
        """The service, then the engine it reported (when it reported plain words)."""
        route = f"This browser{HOP}LMSP service at {host_of(str(settings.get('baseUrl', '')))}"
        engine = engine_words(settings.get("serviceEngine"))
        return route + (f"{HOP}{engine}" if engine else "")


class OpenAIKind(_NoBuiltIns):
    """An OpenAI-compatible server: declared capabilities, context window from its listing."""

    name = "openai"

    def __init__(self, http: HttpPort) -> None:
        self.info = _row(self.name)
        self.http = http

    async def add(self, spec: ConnectionSpec, cid: str) -> Connection:
        """The connection; asks the server's listing for the context window if not given."""
        settings = _user_settings(spec)
        if context_size(settings) is None:
            # What the server's listing reports; unknown stays unknown (openai_compat rules).
            from .openai_compat import model_context_window

            settings.pop("contextSize", None)
            window = await model_context_window(
                self.http, str(settings["baseUrl"]), spec.credential, spec.model
            )
            if window is not None:
                settings["contextSize"] = window
        return _connection(self, spec, cid, settings, capabilities=capabilities_for_spec(spec))

    def provider(self, connection: Connection) -> Provider:
        """An `OpenAICompatProvider` over the page's fetch."""
        from .openai_compat import OpenAICompatProvider

        return OpenAICompatProvider(
            self.http,
            _base_url(connection),
            _secret(connection),
            context_window=context_size(connection.settings),
        )

    @staticmethod
    def route(settings: dict[str, Any]) -> str:
        """The server, and the proxy in front of it when `forwardsTo` names one."""
        server = host_of(str(settings.get("baseUrl", "")))
        upstream = settings.get("forwardsTo")
        if isinstance(upstream, str) and upstream.strip():
            target = host_of(upstream if "://" in upstream else f"https://{upstream.strip()}")
            return f"This browser{HOP}proxy at {server}{HOP}OpenAI-compatible server at {target}"
        return f"This browser{HOP}OpenAI-compatible server at {server}"


def _fixed_route(info: KindInfo) -> str:
    if not info.route_words:
        raise ValueError("no route for a kind without route words")
    return info.route_words


#: Why a stored engine connection whose model its engine cannot read now is unavailable.
UNREADABLE_MODEL = (
    "This engine cannot use this model on this device now; edit or remove the connection."
)


def _script_capabilities(settings: dict[str, Any]) -> Capabilities:
    """What a script's `capabilities` declare; `ScriptError` for a script that does not parse."""
    declared = parse_script(str(settings.get("script", ""))).capabilities
    return Capabilities(
        images=declared.images,
        images_in_tool_results=declared.images,
        json_output=declared.json_output,
        tools=declared.tools,
        tool_choice_modes=("auto", "none", "required", "tool") if declared.tools else (),
    )


class ScriptedKind(_NoBuiltIns):
    """A developer's JSON script played turn by turn (`providers.scripted`)."""

    def __init__(self) -> None:
        self.info = _row("scripted")
        self._kept: dict[str, tuple[int, ScriptedProvider]] = {}
        #: Called after each submission to a scripted connection (module rules).
        self.on_request: Callable[[Connection, ScriptedProvider], None] | None = None

    async def add(self, spec: ConnectionSpec, cid: str) -> Connection:
        """The connection with the capabilities its script declares (`ScriptError` if bad)."""
        settings = _user_settings(spec)
        caps = _script_capabilities(settings)
        return _connection(self, spec, cid, settings, capabilities=caps)

    def stored(self, connection: Connection) -> Connection:
        """`connection` checked as the form checks it, with its script's capabilities again.

        Raises `ValueError` for a script the form would refuse.
        """
        settings = dict(connection.settings)
        checked = _checked(self, connection, settings)
        try:
            caps = _script_capabilities(settings)
        except ScriptError as exc:
            raise ValueError("a stored script that does not parse") from exc
        return checked.model_copy(update={"capabilities": caps})

    def provider(self, connection: Connection) -> Provider:
        """The connection's `ScriptedProvider`, kept per revision (module rules)."""
        kept = self._kept.get(connection.id)
        if kept is None or kept[0] != connection.revision:
            # A stored script that no longer parses raises ScriptError (a ProviderFailure).
            script = parse_script(str(connection.settings.get("script", "")))

            def report(provider: ScriptedProvider, connection: Connection = connection) -> None:
                if self.on_request is not None:
                    self.on_request(connection, provider)

            kept = (connection.revision, ScriptedProvider(script, on_request=report))
            self._kept[connection.id] = kept
        return kept[1]

    def route(self, settings: dict[str, Any]) -> str:
        """The row's fixed words: no model, nothing leaves the page."""
        return _fixed_route(self.info)


class EngineKind:
    """An engine in the page: its spec (`EngineSpec`) and the opener of its host.

    `engine` is the spec's `SpecEngine` (its device report, its model loads);
    the row is the spec's kind's (`kinds.KINDS`). Raises `ValueError` for a
    spec whose kind has no row.
    """

    def __init__(self, spec: EngineSpec, open_bridge: BridgeOpener) -> None:
        self.engine = SpecEngine(spec, open_bridge)
        self.info = _row(spec.kind)

    async def add(self, spec: ConnectionSpec, cid: str) -> Connection:
        """The connection; a model this device cannot run is added unavailable, with why."""
        settings = self.engine.settings_for(spec.model, _user_settings(spec))
        caps = self.engine.capabilities_for(spec.model, settings)
        reason = self.engine.unavailable_reason(spec.model)
        unavailable = {} if reason is None else {"available": False, "unavailable_reason": reason}
        return _connection(self, spec, cid, settings, capabilities=caps, **unavailable)

    def provider(self, connection: Connection) -> Provider:
        """An `EngineProvider` for `connection`."""
        return self.engine.provider_for(connection)

    async def default_connections(self) -> list[Connection]:
        """The spec's built-in connections (after the device report, if it wants one)."""
        return await self.engine.default_connections()

    def route(self, settings: dict[str, Any]) -> str:
        """The row's fixed words: the engine, on this device."""
        return _fixed_route(self.info)

    def stored(self, connection: Connection) -> Connection:
        """`connection` with the spec's settings and capabilities again, unavailable when
        this device says so.

        A stored "unavailable" stays (it only withholds the connection); a
        device report that finds the model cannot run here marks it so.
        Raises `ValueError` for a model the spec cannot name, or settings the
        form would refuse.
        """
        settings = self.engine.settings_for(connection.model, dict(connection.settings))
        checked = _checked(self, connection, settings)
        # As `add` derives them: a stored claim (images, tools) is not trusted.
        # A model the spec cannot read now (a GGUF URL the form refuses, a
        # WebLLM id this device's report does not list, or no report at all)
        # stays listed, unavailable and claiming nothing, so the user sees it
        # and can edit or remove it; the record in storage is not changed.
        try:
            caps = self.engine.capabilities_for(connection.model, settings)
            reason = self.engine.unavailable_reason(connection.model)
        except ValueError:
            caps, reason = Capabilities(), UNREADABLE_MODEL
        update: dict[str, Any] = {"capabilities": caps}
        if reason is not None:
            update |= {"available": False, "unavailable_reason": reason}
        return checked.model_copy(update=update)


class KindTable:
    """The kinds a shell offers, by `Connection.kind` (module docstring).

    `kinds`: the `ConnectionKind`s, later ones replacing earlier ones of the
    same kind. Raises nothing on construction.
    """

    def __init__(self, kinds: Iterable[ConnectionKind] = ()) -> None:
        self._kinds: dict[str, ConnectionKind] = {}
        for kind in kinds:
            self.register(kind)

    def register(self, kind: ConnectionKind) -> None:
        """Offer `kind` (replacing a kind of the same name)."""
        self._kinds[kind.info.kind] = kind

    def kind(self, name: str) -> ConnectionKind:
        """The kind named `name`; `ValueError` when this shell has none."""
        found = self._kinds.get(name)
        if found is None:
            raise ValueError("this kind of connection is not available in this browser")
        return found

    def get(self, name: str) -> ConnectionKind | None:
        """The kind named `name`, or None."""
        return self._kinds.get(name)

    def __iter__(self) -> Any:
        return iter(self._kinds.values())

    def route(self, name: str, settings: dict[str, Any]) -> str:
        """The route of a connection of kind `name`; `ValueError` for an unknown kind."""
        return self.kind(name).route(settings)

    def provider(self, connection: Connection) -> Provider:
        """The provider for `connection`; `ProviderFailure` when its kind is not here."""
        found = self._kinds.get(connection.kind)
        if found is None:
            raise ProviderFailure(
                ErrorCode.PROVIDER_ERROR,
                user_hint="This connection's engine is not available in this browser.",
            )
        return found.provider(connection)


def product_kinds(http: HttpPort) -> KindTable:
    """The kinds every shell offers before its engines are registered (servers, script)."""
    return KindTable([LmspKind(http), OpenAIKind(http), ScriptedKind()])


#: The kinds whose route depends on their settings (the others have fixed words).
_SERVER_KINDS: dict[str, type[LmspKind] | type[OpenAIKind]] = {
    k.name: k for k in (LmspKind, OpenAIKind)
}


def route_for(kind: str, settings: dict[str, Any]) -> str:
    """The disclosure route of a connection of `kind` with `settings`, without a shell.

    Engines and the script have fixed words (`KindInfo.route_words`); a
    server's route is its kind's (`LmspKind.route`, `OpenAIKind.route`).
    Raises `ValueError` for a kind the table does not know (NAP-LLM, Privacy).
    """
    info = _row(kind)
    server = _SERVER_KINDS.get(kind)
    return server.route(settings) if server is not None else _fixed_route(info)
