"""Observation checks shared by the NAP-LLM conformance and shell tests.

Each check reads what the recording transport of `harness.Harness` saw and
asserts a rule of NAP-LLM (Wire Protocol; Delta; Error Handling):

- `terminal`: a request id got exactly one terminal result of the matching
  result type, and (for results) `error` xor the success payload.
- `check_generation`: `terminal` plus the delta rules: sequence contiguous
  from 0, every block `start` first, `delta`s, then at most one `end`, stable
  kind, toolCall `start` carrying id and name, nothing after the terminal
  result, and for a completed (`stop` / `toolUse`) result every block ended
  and matching the terminal content at its `blockIndex`.
- `assert_not_leaked`: no envelope of any endpoint contains a secret.

And the two steps most of those tests start with: `ready` (a harness with
one connection, one endpoint and a live handle) and `run` (one generate,
settled, its terminal result checked).
"""

from __future__ import annotations

import json
from typing import Any

from harness import Harness

import envelope_rules
from napllm.connection_records import Capabilities
from napllm.errors import SAFE_MESSAGES, ErrorCode
from napllm.shell import ShellPolicy


def terminal(h: Harness, ep: str, rid: str, kind: str = "llm.generate.result") -> dict[str, Any]:
    """The one `kind` envelope with id `rid` sent to `ep` (`envelope_rules.terminal`)."""
    return envelope_rules.terminal(h.out(ep), rid, kind)


code = envelope_rules.code


def error_code(h: Harness, ep: str, rid: str, kind: str = "llm.generate.result") -> str | None:
    """`code(terminal(...))`."""
    return code(terminal(h, ep, rid, kind))


def assert_safe_error(envelope: dict[str, Any], expected: ErrorCode) -> None:
    """The envelope is an error of `expected` code with the fixed safe sentence."""
    assert envelope["error"] == {"code": expected.value, "message": SAFE_MESSAGES[expected]}


def check_generation(h: Harness, ep: str, rid: str) -> dict[str, Any]:
    """The delta and terminal rules for `rid` (`envelope_rules.check_generation`)."""
    return envelope_rules.check_generation(h.out(ep), rid)


def delta_blocks(h: Harness, ep: str, rid: str) -> dict[int, list[dict[str, Any]]]:
    """The deltas of `rid`, grouped by blockIndex, in order."""
    grouped: dict[int, list[dict[str, Any]]] = {}
    for delta in h.deltas(ep, rid):
        grouped.setdefault(delta["blockIndex"], []).append(delta)
    return grouped


def everything_sent(h: Harness) -> str:
    """Every envelope sent to any endpoint, as one JSON text."""
    return json.dumps(h.transport.sent, ensure_ascii=False)


def assert_not_leaked(h: Harness, *secrets: str) -> None:
    """No envelope of any endpoint contains any of `secrets`."""
    sent = everything_sent(h)
    for secret in secrets:
        assert secret not in sent, f"{secret!r} reached an endpoint"


async def ready(caps: Capabilities | None = None, **policy: Any) -> tuple[Harness, Any, str, str]:
    """A harness with one connection, one endpoint and a live handle.

    Returns `(harness, fixture provider, endpoint id, handle)`; `policy`
    overrides `ShellPolicy` fields (deltas are sent without coalescing).
    """
    h = Harness(policy=ShellPolicy(delta_interval_s=0.0, **policy))
    fx = h.connect(caps=caps) if caps is not None else h.connect()
    ep = h.endpoint()
    handle = await h.select(ep)
    return h, fx, ep, handle


async def run(h: Harness, ep: str, envelope: dict[str, Any]) -> dict[str, Any]:
    """Send one generate, settle, and return its checked terminal result."""
    h.send(ep, envelope)
    await h.settle()
    return check_generation(h, ep, envelope["id"])
