"""Provider construction in the page: the shell's connection kinds over fetch.

Rules
- Every kind is a `providers.connection_kinds.ConnectionKind` in one
  `KindTable` (`BrowserProviders.kinds`): the servers and the script from
  the start, each engine when `browser.engines.register_engines` adds its
  `EngineKind`. Nothing here asks which kind a connection is.
- The server kinds go over `FetchHttp`; a credential is read from the
  registry at submission time and never leaves Python/fetch.
- Each submission to a scripted connection is reported to
  `on_script_request(connection, provider)` when set (the runtime shows the
  count in the connection's entry).
- There are no test connections here: a test build registers its own kind
  in a module only that build contains.
"""

from __future__ import annotations

from collections.abc import Callable

from ..connections import ConnectionSpec
from ..providers.base import Provider
from ..providers.connection_kinds import (
    EngineKind,
    KindTable,
    ScriptedKind,
    context_size,
    product_kinds,
)
from ..providers.engine import SpecEngine
from ..providers.scripted import ScriptedProvider
from ..records import Connection
from .http_fetch import FetchHttp

__all__ = ["BrowserProviders", "connection_from_spec", "context_size", "default_connections"]


class BrowserProviders:
    """The page's connection kinds (`kinds`) and the provider for a connection."""

    def __init__(self) -> None:
        self.http = FetchHttp()
        #: Every kind this page offers, by `Connection.kind`.
        self.kinds: KindTable = product_kinds(self.http)

    @property
    def engines(self) -> dict[str, SpecEngine]:
        """The registered engines by kind (read-only view of the engine kinds)."""
        return {k.info.kind: k.engine for k in self.kinds if isinstance(k, EngineKind)}

    @property
    def on_script_request(self) -> Callable[[Connection, ScriptedProvider], None] | None:
        """Called after each submission to a scripted connection (module rules)."""
        scripted = self.kinds.get("scripted")
        return scripted.on_request if isinstance(scripted, ScriptedKind) else None

    @on_script_request.setter
    def on_script_request(self, report: Callable[[Connection, ScriptedProvider], None]) -> None:
        for kind in self.kinds:
            if isinstance(kind, ScriptedKind):
                kind.on_request = report

    def provider_for(self, connection: Connection) -> Provider:
        """The provider to submit to; raises `ProviderFailure` if none can be built."""
        return self.kinds.provider(connection)


async def connection_from_spec(
    spec: ConnectionSpec, cid: str, providers: BrowserProviders
) -> Connection:
    """A user connection from the form, made by its kind (`ConnectionKind.add`).

    Raises `ProviderFailure` when a service cannot be reached or does not
    list the model, `ValueError` for a kind the page lacks. An engine model
    this device cannot run is added as unavailable, with the reason, so it
    is shown but never offered to a napplet.
    """
    return await providers.kinds.kind(spec.kind).add(spec, cid)


async def default_connections(providers: BrowserProviders) -> list[Connection]:
    """Every kind's built-in connections (only engines have any).

    Ordered by `settings.rank` (lower first, stable): a model ready on the
    device comes before TinyChat, which comes before models still to fetch.
    """
    found: list[Connection] = []
    for kind in providers.kinds:
        found.extend(await kind.default_connections())
    found.sort(key=lambda c: int(c.settings.get("rank", 100)))
    return found
