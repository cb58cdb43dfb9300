"""Looking for model servers on this computer, when the user asks (connections form).

Rules
- Nothing is probed unless the user presses "Look for running servers". The
  probe asks each usual address (`SERVERS`: Ollama 11434, llama.cpp's
  llama-server 8080, LM Studio 1234, napllm-lmsp 11435; on 127.0.0.1, then
  on localhost when nothing this page can read answered there) for its model list: `GET
  /v1/models` (OpenAI-compatible) or `GET /lmsp/v1/models` (LMSP,
  docs/lmsp.md). All probes run at once, each bounded by `PROBE_TIMEOUT_S`.
- A server's answer is hostile input: at most `MAX_LISTING_BYTES` are read,
  it is parsed by `jsontext.read_json` only, at most `MAX_MODELS` ids are
  kept, and an id is kept only if it is 1..200 visible characters
  (`kinds.model_id_shown`). Nothing
  of the answer but those ids reaches the page; the ids are shown as text.
- A failed probe is explained with the exact fix for that server
  (`Finding.fix`): a CORS refusal (the cross-origin fetch failed but an
  opaque `no-cors` one reached the port) names the setting that allows this
  page's origin; a refusal by the browser's local network permission gets
  `LOCAL_NETWORK_HINT`; 401/403 asks for the token or key. The page's origin
  appears in a fix only when it is a plain `scheme://host[:port]`.
- A cross-origin isolated page (`Cross-Origin-Embedder-Policy:
  require-corp`, as `build.py serve` sends) cannot make the opaque request
  to a server that sends no `Cross-Origin-Resource-Policy`, so a failed
  fetch cannot tell "refuses this page" from "nothing there": such a probe is
  `unreadable`, and its fix says what to change if the server does run.
- A secret typed in the form is sent only to the servers of the form's kind,
  and only to the address of the form's base URL when one is filled in
  (`secret_goes_to`), and only because the user pressed the button with it
  filled in.
- The addresses are a parameter (`targets`): the product uses
  `default_targets()`, the test build its own test servers.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

from .jsontext import JsonTextError, read_json
from .kinds import KindInfo, kind_info, model_id_shown
from .providers.base import LOCAL_NETWORK_HINT, HttpPort, LocalNetworkBlocked

PROBE_TIMEOUT_S = 3.0
MAX_LISTING_BYTES = 256 * 1024
MAX_MODELS = 50

Status = Literal[
    "found", "needs-key", "cors", "blocked", "not-a-model-server", "unreadable", "absent"
]


@dataclass(frozen=True)
class ServerInfo:
    """A model server people run locally: its name, connection kind and usual port.

    `kind`: the connection kind that talks to it (`openai` or `lmsp`);
    `port`: its default port; `cors_fix`: how to let a page at `{origin}`
    call it (the exact option of that server).
    """

    server: str
    label: str
    kind: Literal["openai", "lmsp"]
    port: int
    cors_fix: str

    @property
    def row(self) -> KindInfo:
        """Its kind's row (`kinds.KINDS`): where it lists models, what its secret is."""
        info = kind_info(self.kind)
        assert info is not None, "every server kind has a row"
        return info


SERVERS: tuple[ServerInfo, ...] = (
    ServerInfo(
        "ollama",
        "Ollama",
        "openai",
        11434,
        "Ollama answers only the origins it allows. Quit Ollama and start it with this "
        "page allowed: OLLAMA_ORIGINS={origin} ollama serve (for the macOS app: "
        'launchctl setenv OLLAMA_ORIGINS "{origin}", then restart Ollama).',
    ),
    ServerInfo(
        "llamacpp",
        "llama.cpp server (llama-server)",
        "openai",
        8080,
        "llama-server answers pages from any origin, so something else refused this "
        "page: a proxy in front of it, or another program on this port. Start "
        "llama-server itself: llama-server -m MODEL.gguf --port 8080.",
    ),
    ServerInfo(
        "lmstudio",
        "LM Studio",
        "openai",
        1234,
        "LM Studio answers other pages only with CORS turned on: in LM Studio's "
        'Developer tab, open the server settings and turn on "Enable CORS", or start '
        "the server with: lms server start --cors.",
    ),
    ServerInfo(
        "lmsp",
        "napllm-lmsp",
        "lmsp",
        11435,
        "napllm-lmsp answers only the origins it was started for. Restart it with this "
        "page allowed: napllm-lmsp --model MODEL.gguf --allow-origin {origin}.",
    ),
)


def server_info(server: str) -> ServerInfo | None:
    """The entry of `SERVERS` named `server`, or None."""
    return next((s for s in SERVERS if s.server == server), None)


@dataclass(frozen=True)
class Target:
    """One address to probe: a server of `SERVERS` on `host`:`port`.

    `fallback_host`: asked instead when nothing this page can read answered
    on `host` (some servers listen on `localhost` only), or None.
    """

    server: str
    host: str
    port: int
    fallback_host: str | None = None


def default_targets() -> list[Target]:
    """Each server of `SERVERS` on its usual port of 127.0.0.1, then of localhost."""
    return [Target(s.server, "127.0.0.1", s.port, "localhost") for s in SERVERS]


@dataclass
class Finding:
    """What one probe found (`to_json` is what the page shows).

    `status`: `found` (a model list; `models` may be empty), `needs-key`
    (401/403), `cors` (running, but it refuses this page), `blocked` (the
    browser's local network permission), `not-a-model-server` (something
    else answered), `unreadable` (nothing this page could read, and it
    cannot tell why), `absent` (nothing answered). `fix`: a sentence saying
    what to do, or "".
    """

    target: Target
    info: ServerInfo
    status: Status
    models: list[str] = field(default_factory=list)
    fix: str = ""

    @property
    def address(self) -> str:
        """`host:port`."""
        return f"{self.target.host}:{self.target.port}"

    @property
    def base_url(self) -> str:
        """The base URL a connection to it takes (`/v1` for OpenAI-compatible servers)."""
        return f"http://{self.address}{self.info.row.api_root}"

    def to_json(self) -> dict[str, Any]:
        """`{server, label, kind, address, baseUrl, status, models, fix}`."""
        return {
            "server": self.info.server,
            "label": self.info.label,
            "kind": self.info.kind,
            "address": self.address,
            "baseUrl": self.base_url,
            "status": self.status,
            "models": list(self.models),
            "fix": self.fix,
        }


_ORIGIN = re.compile(r"https?://[A-Za-z0-9.\-\[\]:]{1,200}")


def plain_origin(origin: object) -> str:
    """`origin` if it is a plain `scheme://host[:port]`, else "THIS_PAGE_ORIGIN"."""
    if isinstance(origin, str) and _ORIGIN.fullmatch(origin):
        return origin
    return "THIS_PAGE_ORIGIN"


def model_ids(body: object, kind: str) -> list[str] | None:
    """The model ids of a listing body (`{"data": [{"id": ...}]}`), or None if it is none.

    At most `MAX_MODELS` ids, each 1..200 visible characters
    (`kinds.model_id_shown`: no controls, bidi or zero-width characters), duplicates
    dropped. `kind` is accepted for symmetry: both listings share this shape.
    """
    if not isinstance(body, dict) or not isinstance(body.get("data"), list):
        return None
    ids: list[str] = []
    for entry in body["data"]:
        value = entry.get("id") if isinstance(entry, dict) else None
        if isinstance(value, str) and model_id_shown(value) and value not in ids:
            ids.append(value)
            if len(ids) == MAX_MODELS:
                break
    return ids


def secret_goes_to(target: Target, kind: str, base_url: str) -> bool:
    """Whether the form's typed secret may be sent to `target` (module rules).

    Only to a server of the form's `kind`, and, when the form's `base_url`
    is filled in, only to the address it names (same host and port): a key
    typed for another server (a cloud API, a proxy) never reaches a program
    that happens to listen on a usual local port. A base URL that is not a
    URL sends the secret nowhere.
    """
    info = server_info(target.server)
    if info is None or info.kind != kind:
        return False
    if not base_url.strip():
        return True
    try:
        parts = urlsplit(base_url.strip())
        port = parts.port
    except ValueError:
        return False
    return parts.scheme == "http" and parts.hostname == target.host and port == target.port


async def _read_bounded(response: Any) -> bytes | None:
    """The body, or None when it is larger than `MAX_LISTING_BYTES`."""
    data = bytearray()
    async for chunk in response.iter_bytes():
        data.extend(chunk)
        if len(data) > MAX_LISTING_BYTES:
            return None
    return bytes(data)


#: `reachable(url, timeout_s)`: True when an opaque request got an answer,
#: False when nothing answered, None when this page cannot tell.
Opaque = Callable[[str, float], Awaitable[bool | None]]


async def probe(
    http: HttpPort,
    target: Target,
    *,
    origin: str,
    reachable: Opaque,
    secret: str | None = None,
    timeout_s: float = PROBE_TIMEOUT_S,
) -> Finding:
    """Ask `target` for its model list; never raises (every failure is a `Finding`).

    `reachable(url, timeout_s)`: whether an opaque (`no-cors`) request
    reaches `url` (None: this page cannot tell), telling a CORS refusal
    from an empty port; `secret`: a token or key to send (module rules).
    """
    info = server_info(target.server)
    if info is None:
        raise ValueError("unknown server")
    finding = Finding(target, info, "absent")
    url = f"http://{finding.address}{info.row.listing_path}"
    headers = {"Accept": "application/json"}
    if secret:
        headers["Authorization"] = f"Bearer {secret}"
    try:
        response = await http.request("GET", url, headers=headers, timeout_s=timeout_s)
    except LocalNetworkBlocked:
        finding.status, finding.fix = "blocked", LOCAL_NETWORK_HINT
        return finding
    except ConnectionError:
        running: bool | None
        try:
            running = await asyncio.wait_for(reachable(url, timeout_s), timeout_s + 0.5)
        except (TimeoutError, ConnectionError):
            running = False
        fix = info.cors_fix.replace("{origin}", plain_origin(origin))
        if running is True:
            finding.status, finding.fix = "cors", fix
        elif running is None:
            finding.status = "unreadable"
            finding.fix = f"If {info.label} runs there, it does not accept this page. {fix}"
        return finding
    try:
        if response.status in (401, 403):
            finding.status = "needs-key"
            key = info.row.secret_words
            finding.fix = f"It asks for its {key}: enter it in the form, then look again."
            return finding
        body: bytes | None = None
        if response.status == 200:
            try:
                body = await asyncio.wait_for(_read_bounded(response), timeout_s)
            except (TimeoutError, ConnectionError):
                body = None
        ids = None
        if body is not None:
            try:
                ids = model_ids(read_json(body), info.kind)
            except JsonTextError:
                ids = None
        if ids is None:
            finding.status = "not-a-model-server"
            finding.fix = "Something answers on this port, but not with a list of models."
        else:
            finding.status, finding.models = "found", ids
        return finding
    finally:
        await response.aclose()


async def discover(
    http: HttpPort,
    targets: list[Target],
    *,
    origin: str,
    reachable: Opaque,
    secret_for: Callable[[Target], str | None] = lambda _t: None,
    timeout_s: float = PROBE_TIMEOUT_S,
) -> list[Finding]:
    """Probe every target at once; an empty address is tried again on its `fallback_host`.

    Returns one `Finding` per target, in the order of `targets`.
    """

    def ask(target: Target) -> Awaitable[Finding]:
        secret = secret_for(target)
        return probe(
            http, target, origin=origin, reachable=reachable, secret=secret, timeout_s=timeout_s
        )

    async def one(target: Target) -> Finding:
        found = await ask(target)
        if found.status in ("absent", "unreadable") and target.fallback_host:
            retry = await ask(Target(target.server, target.fallback_host, target.port))
            if retry.status not in ("absent", "unreadable"):
                return retry
        return found

    return list(await asyncio.gather(*(one(t) for t in targets)))
