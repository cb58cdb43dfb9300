"""What `napllm-check` concludes from a recorded run (pure; no browser).

Input: the envelopes the shell's envelope inspector announced, in order
(`Envelope`: endpoint id, direction `in`/`out`/`note`, the parsed value or
None), plus what the napplet frame reported (unhandled rejections, errors,
`console.error` calls, CSP violations) and requests that left the page.

Findings (kind: meaning; every one is a violation)
- `invalid-request`: the runtime answered a request with `invalid-request`
  (NAP-LLM, Error Handling); the finding names the request type and id
  and quotes the runtime's own safe message.
- `dropped-message`: the runtime dropped a message without any answer
  (a known type without a usable id, or the llm domain not exposed).
- `ignored-message`: a message the runtime ignores silently (not an
  object, no text `type`, or an unknown `llm.*` type; NIP-5D).
- `duplicate-id`: a request id used twice by one endpoint (NAP-LLM, Wire
  Protocol: callers MUST use a fresh id for every request).
- `handle-after-expired`: a handle used again after a request with it
  got `selection-expired` (the napplet must select again).
- `request-after-endpoint-closed`: a request on one endpoint with a
  handle issued to an earlier endpoint (a reload is a new endpoint; the
  old endpoint's handles are gone with it).
- `generation-abandoned`: a generation of the napplet's current document
  that neither finished nor was cancelled by the end of the run (never
  awaited to its end, never cancelled).
- `unhandled-llm-error`: an `LlmError` rejection nobody handled.
- `page-error`: any other uncaught exception or unhandled rejection.
- `console-error`: `console.error` called by the napplet.
- `network-request`: the napplet tried to reach the network (a CSP
  violation in its frame, or a request the browser saw leave the page).
- `step-failed`: a step of the steps file could not be performed.
- `napplet-unresponsive`: the napplet's frame never finished loading, or
  stopped answering a call of the checker (a script that does not yield).
- `inspector-gap`: envelopes the shell's inspector announced never
  reached the check (numbers missing); they were not checked.
- `envelope-limit`: the napplet exchanged more envelopes or text than the
  check records (`check_observe.MAX_RECORDED_ENVELOPES`, `MAX_RECORDED_CHARS`);
  the rest were not checked.
- `event-limit`: the napplet caused more console errors, exceptions or
  CSP reports of one kind than the check keeps
  (`check_observe.MAX_FRAME_EVENTS_PER_KIND`); the rest were counted.
- `napplet-stopped`: the shell stopped the napplet (too many messages or
  reloads, or its frame left its sandboxed page); the notice it showed.
- `check-aborted`: the check ended early (the browser or its driver
  failed, or the whole check overran its limit); the report holds what was
  recorded until then.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

REQUEST_TYPES = ("llm.select", "llm.describe", "llm.generate", "llm.cancel")

#: JUnit test case of each finding kind.
CATEGORIES: dict[str, str] = {
    "invalid-request": "protocol",
    "dropped-message": "protocol",
    "ignored-message": "protocol",
    "duplicate-id": "protocol",
    "handle-after-expired": "protocol",
    "request-after-endpoint-closed": "protocol",
    "generation-abandoned": "protocol",
    "unhandled-llm-error": "errors",
    "page-error": "errors",
    "console-error": "console",
    "network-request": "network",
    "step-failed": "steps",
    "napplet-unresponsive": "errors",
    "check-aborted": "steps",
    "inspector-gap": "protocol",
    "envelope-limit": "protocol",
    "event-limit": "errors",
    "napplet-stopped": "protocol",
}


@dataclass(frozen=True)
class Envelope:
    """One inspector entry: `endpoint` id, `direction` (in/out/note), `value`
    (the parsed envelope, or None when its text is not JSON) and `text`."""

    endpoint: str
    direction: str
    value: Any
    text: str = ""


@dataclass
class Finding:
    """One violation: `kind` (see the module docstring), a `message` for
    people and `detail` (JSON-able) for tools."""

    kind: str
    message: str
    detail: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The finding as JSON (with its JUnit category)."""
        return asdict(self) | {"category": CATEGORIES.get(self.kind, "other")}


def _handle_of(value: dict[str, Any]) -> str | None:
    if value.get("type") == "llm.describe":
        handle = value.get("handle")
    elif value.get("type") == "llm.generate":
        request = value.get("request")
        handle = request.get("handle") if isinstance(request, dict) else None
    else:
        handle = None
    return handle if isinstance(handle, str) else None


def analyse_envelopes(envelopes: list[Envelope]) -> list[Finding]:
    """Protocol findings from the inspector's envelopes (see the module rules)."""
    findings: list[Finding] = []
    requests: dict[tuple[str, str], dict[str, Any]] = {}
    seen_ids: set[tuple[str, str]] = set()
    handle_owner: dict[str, str] = {}
    expired: set[tuple[str, str]] = set()
    generations: dict[tuple[str, str], str] = {}  # (endpoint, id) -> state
    endpoints: list[str] = []

    for env in envelopes:
        ep = env.endpoint
        if ep not in endpoints:
            endpoints.append(ep)
        value = env.value
        if env.direction == "note":
            if isinstance(value, dict) and isinstance(value.get("dropped"), str):
                findings.append(
                    Finding(
                        "dropped-message",
                        f"The runtime dropped a message without an answer: {value['dropped']}.",
                        {"endpoint": ep},
                    )
                )
            continue
        if env.direction == "in":
            kind = value.get("type") if isinstance(value, dict) else None
            if not isinstance(value, dict) or not isinstance(kind, str):
                findings.append(
                    Finding(
                        "ignored-message",
                        "The napplet posted a message that is not an envelope "
                        "(an object with a text type); the runtime ignores it.",
                        {"endpoint": ep},
                    )
                )
                continue
            if kind not in REQUEST_TYPES:
                if kind.startswith("llm."):
                    findings.append(
                        Finding(
                            "ignored-message",
                            f"The napplet posted {kind}, which is not a request type; "
                            "the runtime ignores it.",
                            {"endpoint": ep, "type": kind},
                        )
                    )
                continue
            rid = value.get("id")
            if not isinstance(rid, str):
                continue  # reported by the runtime's note (dropped)
            key = (ep, rid)
            if key in seen_ids:
                findings.append(
                    Finding(
                        "duplicate-id",
                        f"{kind} reused the request id {rid!r}; every request needs a fresh id.",
                        {"endpoint": ep, "id": rid, "type": kind},
                    )
                )
            seen_ids.add(key)
            requests[key] = value
            handle = _handle_of(value)
            if handle is not None:
                if (ep, handle) in expired:
                    findings.append(
                        Finding(
                            "handle-after-expired",
                            f"{kind} {rid!r} used a handle after it was answered "
                            "selection-expired; select again instead.",
                            {"endpoint": ep, "id": rid, "type": kind},
                        )
                    )
                owner = handle_owner.get(handle)
                if owner is not None and owner != ep:
                    findings.append(
                        Finding(
                            "request-after-endpoint-closed",
                            f"{kind} {rid!r} used a handle of an earlier document (endpoint "
                            "closed); after a reload the napplet must select again.",
                            {"endpoint": ep, "id": rid, "type": kind},
                        )
                    )
            if kind == "llm.generate":
                generations[key] = "open"
            if kind == "llm.cancel" and isinstance(value.get("requestId"), str):
                target = (ep, value["requestId"])
                if generations.get(target) == "open":
                    generations[target] = "cancel-sent"
            continue
        # out
        if not isinstance(value, dict) or not isinstance(value.get("type"), str):
            continue
        kind = value["type"]
        rid = value.get("id")
        if not kind.endswith(".result") or not isinstance(rid, str):
            continue
        request = requests.get((ep, rid))
        if kind == "llm.generate.result":
            generations[(ep, rid)] = "done"
        model = value.get("model")
        if isinstance(model, dict) and isinstance(model.get("handle"), str):
            handle_owner.setdefault(model["handle"], ep)
        error = value.get("error")
        if not isinstance(error, dict):
            continue
        code = error.get("code")
        message = error.get("message") if isinstance(error.get("message"), str) else ""
        request_type = kind.removesuffix(".result")
        if code == "invalid-request":
            findings.append(
                Finding(
                    "invalid-request",
                    f"{request_type} {rid!r} was refused as invalid-request: {message}",
                    {"endpoint": ep, "id": rid, "type": request_type, "error": error},
                )
            )
        if code == "selection-expired" and request is not None:
            handle = _handle_of(request)
            if handle is not None:
                expired.add((ep, handle))

    current = endpoints[-1] if endpoints else None
    for (ep, rid), state in generations.items():
        if ep == current and state == "open":
            findings.append(
                Finding(
                    "generation-abandoned",
                    f"Generation {rid!r} never finished and was never cancelled: await its "
                    "result or cancel it.",
                    {"endpoint": ep, "id": rid},
                )
            )
    return findings


def analyse_frame_events(events: list[dict[str, Any]]) -> list[Finding]:
    """Findings from what DevTools saw in the napplet frames (`check_observe._Observer`)."""
    findings: list[Finding] = []
    for event in events:
        kind = event.get("kind")
        raw = event.get("data")
        data: dict[str, Any] = raw if isinstance(raw, dict) else {}
        if kind == "unhandled-llm-error":
            findings.append(
                Finding(
                    "unhandled-llm-error",
                    f"An LlmError ({data.get('code')}) was never handled: {data.get('message')}",
                    dict(data),
                )
            )
        elif kind == "page-error":
            findings.append(Finding("page-error", f"Uncaught: {data.get('message')}", dict(data)))
        elif kind == "console-error":
            findings.append(
                Finding("console-error", f"console.error: {data.get('message')}", dict(data))
            )
        elif kind == "csp":
            findings.append(
                Finding(
                    "network-request",
                    f"The napplet tried to reach {data.get('blockedURI') or 'the network'} "
                    f"(blocked by the CSP directive {data.get('directive')}); napplets have "
                    "no network.",
                    dict(data),
                )
            )
    return findings
