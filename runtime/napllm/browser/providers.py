"""Provider construction in the page: one provider per connection kind.

Rules
- `lmsp` and `openai` connections use the protocol providers of
  `napllm.providers` over `FetchHttp`; their credential is read from the
  registry at submission time and never leaves Python/fetch.
- A `scripted` connection plays the developer's script
  (`providers.scripted`); its provider is kept per connection revision so
  that each submission takes the next turn and an edit starts again.
  Each submission is reported to `on_script_request(connection, provider)`
  when set (the runtime shows the count in the connection's entry).
- An `lmsp` connection's capabilities, and the engine its route names,
  come from the service's model listing (docs/lmsp.md), read when the user
  adds or edits it; an `openai`
  connection's are declared by the user (OpenAI-compatible servers cannot
  report them), and the consent dialog still guards every submission. An
  `openai` connection's context window (`contextSize`, tokens) is the
  user's setting or else what the server's model listing reports when the
  connection is added; the provider uses it to refuse a prompt the server
  cut (`providers.openai_compat`).
- There are no test connections here: a test build subclasses
  `BrowserProviders` in a module only that build contains.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..connections import ConnectionSpec, capabilities_for_spec
from ..errors import ErrorCode, ProviderFailure
from ..kinds import engine_words, route_for
from ..providers.base import Provider
from ..providers.engine import Engine
from ..providers.lmsp_client import LmspProvider, capabilities_from_entry, discover_models
from ..providers.scripted import ScriptedProvider, parse_script
from ..records import Capabilities, Connection
from .http_fetch import FetchHttp


class BrowserProviders:
    """Builds the provider for a connection (protocol kinds and engines)."""

    def __init__(self) -> None:
        self.http = FetchHttp()
        #: kind -> the engine (`browser.engines.register_engines`).
        self.engines: dict[str, Engine] = {}
        self._scripted: dict[str, tuple[int, ScriptedProvider]] = {}
        #: Called after each submission to a scripted connection (see the rules).
        self.on_script_request: Callable[[Connection, ScriptedProvider], None] | None = None

    def provider_for(self, connection: Connection) -> Provider:
        """The provider to submit to; raises `ProviderFailure` if none can be built."""
        secret = connection.credential.get_secret_value() if connection.credential else None
        if connection.kind == "lmsp":
            return LmspProvider(
                self.http,
                str(connection.settings["baseUrl"]),
                secret,
                resumable=bool(connection.settings.get("resumable", False)),
            )
        if connection.kind == "openai":
            from ..providers.openai_compat import OpenAICompatProvider

            return OpenAICompatProvider(
                self.http,
                str(connection.settings["baseUrl"]),
                secret,
                context_window=context_size(connection.settings),
            )
        if connection.kind == "scripted":
            kept = self._scripted.get(connection.id)
            if kept is None or kept[0] != connection.revision:
                # A stored script that no longer parses raises ScriptError (a ProviderFailure).
                script = parse_script(str(connection.settings.get("script", "")))

                def report(provider: ScriptedProvider, connection: Connection = connection) -> None:
                    if self.on_script_request is not None:
                        self.on_script_request(connection, provider)

                kept = (connection.revision, ScriptedProvider(script, on_request=report))
                self._scripted[connection.id] = kept
            return kept[1]
        engine = self.engines.get(connection.kind)
        if engine is None:
            raise ProviderFailure(
                ErrorCode.PROVIDER_ERROR,
                user_hint="This connection's engine is not available in this browser.",
            )
        return engine.provider_for(connection)


def context_size(settings: dict[str, Any]) -> int | None:
    """A connection's `contextSize` setting (tokens, a positive integer), or `None`."""
    value = settings.get("contextSize")
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    return None


async def connection_from_spec(
    spec: ConnectionSpec, cid: str, providers: BrowserProviders
) -> Connection:
    """A user connection from the form; discovers LMSP capabilities.

    Raises `ProviderFailure` when an LMSP service cannot be reached or does
    not list the model, `ValueError` for an engine kind the page lacks. An
    engine model this device cannot run is added as unavailable, with the
    reason, so it is shown but never offered to a napplet.
    """
    settings: dict[str, Any] = dict(spec.settings) | {"userDefined": True}
    caps: Capabilities
    unavailable: dict[str, Any] = {}
    if spec.kind == "lmsp":
        entries = await discover_models(providers.http, str(settings["baseUrl"]), spec.credential)
        entry = next((e for e in entries if e.id == spec.model), None)
        if entry is None:
            raise ProviderFailure(
                user_hint="The LMSP service does not list this model.", detail="model not listed"
            )
        caps = capabilities_from_entry(entry)
        # The engine the service names becomes the route's last hop (kinds.route_for).
        settings.pop("serviceEngine", None)
        engine = engine_words(entry.engine)
        if engine is not None:
            settings["serviceEngine"] = engine
    elif spec.kind == "openai":
        caps = capabilities_for_spec(spec)
        if context_size(settings) is None:
            # What the server's listing reports; unknown stays unknown (openai_compat rules).
            from ..providers.openai_compat import model_context_window

            settings.pop("contextSize", None)
            window = await model_context_window(
                providers.http, str(settings["baseUrl"]), spec.credential, spec.model
            )
            if window is not None:
                settings["contextSize"] = window
    elif spec.kind == "scripted":
        # Raises ScriptError (positioned, shown in the form) for a bad script.
        declared = parse_script(str(settings.get("script", ""))).capabilities
        caps = Capabilities(
            images=declared.images,
            images_in_tool_results=declared.images,
            json_output=declared.json_output,
            tools=declared.tools,
            tool_choice_modes=("auto", "none", "required", "tool") if declared.tools else (),
        )
    else:
        engine = providers.engines.get(spec.kind)
        if engine is None:
            raise ValueError("this engine is not available in this browser")
        settings = engine.settings_for(spec.model, settings)
        caps = engine.capabilities_for(spec.model, settings)
        reason = engine.unavailable_reason(spec.model)
        if reason is not None:
            unavailable = {"available": False, "unavailable_reason": reason}
    return Connection.model_validate(
        {
            "id": cid,
            "name": spec.name,
            "kind": spec.kind,
            "model": spec.model,
            "route": route_for(spec.kind, settings),
            "capabilities": caps,
            "charges": spec.charges,
            "settings": settings,
            "credential": spec.credential,
            **unavailable,
        }
    )


async def default_connections(providers: BrowserProviders) -> list[Connection]:
    """The built-in connections (the engines register theirs).

    Ordered by `settings.rank` (lower first, stable): a model ready on the
    device comes before TinyChat, which comes before models still to fetch.
    """
    found: list[Connection] = []
    for engine in providers.engines.values():
        found.extend(await engine.default_connections())
    found.sort(key=lambda c: int(c.settings.get("rank", 100)))
    return found
