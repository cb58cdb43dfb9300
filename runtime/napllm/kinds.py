"""Connection kinds: the one table the runtime and the page share (docs/design.md, "Connection").

Rules
- Each provider kind is described once, here: its label, a one-line
  summary, the connections form's fields, whether the user declares its
  capabilities and charges, what a device needs to run it and how to get
  that, its route words (a fixed route) and where a server lists its
  models. The page keeps no copy: the runtime publishes
  `catalogue()` at start (`napllmHost.connectionKinds`) and the page renders
  the form, the kind labels and the group of unavailable connections from it.
- A route names every hop a request takes, in words, destination included
  (NAP-LLM, Privacy: "disclose intermediaries as well as the ultimate
  provider"): "This browser → LMSP service at 127.0.0.1:11435 → llama.cpp",
  "This browser → proxy at 127.0.0.1:4000 → OpenAI-compatible server at
  api.example.com", "This browser (WebGPU, WebLLM) on this device". Hosts
  are `host[:port]` only: never a path, a query or user info, so never a
  credential. Words a service reports about itself (its model engine) are
  used only when they are short plain words (`engine_words`).
- The kinds are named once, here: `FormKind` (what a user may add, one
  `KINDS` row each) and `ProviderKind` (those and the test build's
  `fixture`); records, the form's spec and the registry take them from here. An
  engine's row and route words are its spec's data (`EngineSpec.form`,
  `EngineSpec.route`), read from the one registry
  (`providers.engine_specs.ENGINE_SPECS`): adding an engine edits nothing here.
- What a kind does (adding a connection, its provider, its built-in
  connections, its route) is its class's, one per kind with the same
  methods (`providers.connection_kinds`); this table is their data. A kind
  the table does not know has no route: `connection_kinds.route_for`
  raises `ValueError` rather than invent one. The test build adds its fixture kind
  to the table it publishes (`catalogue(extra)`); the product has none.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Annotated, Any
from urllib.parse import urlsplit

from pydantic import AfterValidator

from .model_names import MAX_LISTED_MODELS as MAX_LISTED_MODELS
from .model_names import model_display_name as model_display_name
from .model_names import model_id_shown as model_id_shown
from .providers.engine_specs import ENGINE_SPECS

#: The arrow between hops of a route.
HOP = " → "


@dataclass(frozen=True)
class KindInfo:
    """One provider kind as the connections form and panel show it.

    `kind`: the `Connection.kind` value; `label`: its name; `summary`: one
    sentence saying where the model runs; `base_url` / `model_url` /
    `script`: which of the form's fields it has (a service's base URL, a
    GGUF URL, a JSON script); `secret_label`: the secret field's label, or
    None when it takes none; `declare_capabilities` / `ask_charges`: whether
    the user states what the server supports / whether it may charge (a
    server that cannot report them); `forwards_to`: whether the form offers
    "forwards requests to" for a proxy in front of the server; `discover`:
    whether the form offers to look for running servers on this computer;
    `model_hint`: help under the model id field; `needs` / `needs_how`:
    what a device must have to run it and how to get that (None when
    nothing); `test_only`: present only in the test build; `route_words`:
    the whole route of a kind whose route does not depend on its settings
    (engines, the script; "" for a server, whose kind class words it:
    `providers.connection_kinds`); `api_root` / `listing_path`: for a
    server kind, the path its API lives under and the path of its model
    listing, both relative to the server's root; `secret_words`: the
    secret as a sentence names it ("access token").
    """

    kind: str
    label: str
    summary: str
    base_url: bool = False
    model_url: bool = False
    script: bool = False
    secret_label: str | None = None
    declare_capabilities: bool = False
    ask_charges: bool = False
    forwards_to: bool = False
    discover: bool = False
    model_hint: str = ""
    needs: str | None = None
    needs_how: str | None = None
    test_only: bool = False
    route_words: str = ""
    api_root: str = ""
    listing_path: str = ""
    secret_words: str = ""

    def to_json(self) -> dict[str, Any]:
        """The page's record of this kind (camelCase keys)."""
        data = asdict(self)
        return {_camel(key): value for key, value in data.items()}


def _camel(key: str) -> str:
    head, *rest = key.split("_")
    return head + "".join(word.title() for word in rest)


KINDS: tuple[KindInfo, ...] = (
    KindInfo(
        kind="lmsp",
        label="LMSP service",
        summary="A model server that speaks LMSP, such as napllm-lmsp on this computer.",
        base_url=True,
        secret_label="Access token",
        discover=True,
        model_hint="The id the service lists for the model.",
        listing_path="/lmsp/v1/models",
        secret_words="access token",
    ),
    KindInfo(
        kind="openai",
        label="OpenAI-compatible server",
        summary=(
            "A server with the OpenAI chat API: Ollama, llama.cpp's llama-server, "
            "LM Studio, or a hosted service."
        ),
        base_url=True,
        secret_label="API key",
        declare_capabilities=True,
        ask_charges=True,
        forwards_to=True,
        discover=True,
        model_hint="The model id as the server lists it under /v1/models.",
        api_root="/v1",
        listing_path="/v1/models",
        secret_words="API key",
    ),
    *(KindInfo(kind=spec.kind, route_words=spec.route, **spec.form) for spec in ENGINE_SPECS),
    KindInfo(
        kind="scripted",
        label="Scripted responses — for napplet development",
        summary=(
            "Each request gets the next turn of a JSON script; no model, nothing leaves the page."
        ),
        script=True,
        route_words="This page (scripted responses: no model, nothing leaves the page)",
    ),
)


#: What every route of an engine says (`EngineSpec.route`), by kind.
#: The kinds a user may add, in the form's order.
FORM_KINDS: tuple[str, ...] = tuple(k.kind for k in KINDS)
#: The test build's kind (`catalogue(extra)`): a `Connection.kind`, never a form's.
FIXTURE_KIND = "fixture"


def _form_kind(value: str) -> str:
    if value not in FORM_KINDS:
        raise ValueError("not a connection kind of this shell")
    return value


def _provider_kind(value: str) -> str:
    return value if value == FIXTURE_KIND else _form_kind(value)


#: A kind a user may add (the connections form's `kind`): one `KindInfo`
#: row each in `KINDS`; anything else fails validation (`ValueError`).
FormKind = Annotated[str, AfterValidator(_form_kind)]
#: Every `Connection.kind` the shell builds a provider for: the form's kinds
#: and the test build's `fixture`.
ProviderKind = Annotated[str, AfterValidator(_provider_kind)]


def kind_info(kind: str) -> KindInfo | None:
    """The product's description of `kind`, or None for a kind it does not have."""
    return next((k for k in KINDS if k.kind == kind), None)


def catalogue(extra: tuple[KindInfo, ...] = ()) -> list[dict[str, Any]]:
    """The table published to the page: every product kind, then `extra` (test build)."""
    return [k.to_json() for k in (*KINDS, *extra)]


_HOST_NAME = re.compile(r"[a-z0-9_](?:[a-z0-9_.\-]{0,252})")
_IPV6 = re.compile(r"[0-9a-f:.]{2,45}")


def _shown_host(host: str) -> str | None:
    """`host` (lower case, from `urlsplit`) as it may appear in a route, or None.

    Only host names, IPv4 and IPv6 addresses: a stored address must not
    write words, arrows, markup or bidi controls into the consent dialog.
    A Unicode name is shown in its ASCII (IDNA) form, as the browser sends
    it, and only if it converts back to itself (no ignored characters).
    """
    if ":" in host:
        return host if _IPV6.fullmatch(host) else None
    if not host.isascii():
        try:
            ascii_host = host.encode("idna").decode("ascii")
            if ascii_host.encode("ascii").decode("idna") != host:
                return None
        except UnicodeError:
            return None
        host = ascii_host.lower()
    return host if _HOST_NAME.fullmatch(host) else None


def host_of(url: str) -> str:
    """`host[:port]` of an http(s) URL for route texts: never user info, path or query.

    An IPv6 host keeps its brackets; a Unicode host name is shown in its
    ASCII (IDNA) form; a URL without a host, or whose host is not a host
    name or IP address (spaces, arrows, markup, controls), gives "an
    unknown address".
    """
    try:
        parts = urlsplit(url)
        host = parts.hostname
        port = parts.port
    except ValueError:
        return "an unknown address"
    shown_host = _shown_host(host) if host else None
    if shown_host is None:
        return "an unknown address"
    shown = f"[{shown_host}]" if ":" in shown_host else shown_host
    return f"{shown}:{port}" if port is not None else shown


_PLAIN_WORDS = re.compile(r"[A-Za-z0-9][A-Za-z0-9 .+_-]{0,39}")


def engine_words(value: object) -> str | None:
    """Words a service reports about its model engine, if safe to show in a route.

    Plain words only (letters, digits, space, `.+_-`, at most 40 characters,
    no arrow or markup): anything else is dropped (None), never shown.
    """
    if isinstance(value, str) and _PLAIN_WORDS.fullmatch(value):
        return value.strip() or None
    return None
