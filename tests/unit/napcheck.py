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
"""

from __future__ import annotations

import json
from typing import Any

from harness import Harness

from napllm.errors import SAFE_MESSAGES, ErrorCode

SUCCESS_FIELD = {
    "llm.select.result": "model",
    "llm.describe.result": "model",
    "llm.generate.result": "result",
    "llm.cancel.result": "cancelled",
}


def terminal(h: Harness, ep: str, rid: str, kind: str = "llm.generate.result") -> dict[str, Any]:
    """The one `kind` envelope with id `rid` sent to `ep`; asserts exactly one."""
    found = [e for e in h.out(ep) if e["type"] == kind and e.get("id") == rid]
    assert len(found) == 1, f"expected one {kind} for {rid}, got {found}"
    envelope = found[0]
    has_error = "error" in envelope
    has_success = SUCCESS_FIELD[kind] in envelope
    assert has_error != has_success, envelope
    if has_error:
        assert set(envelope) == {"type", "id", "error"}, envelope
        assert set(envelope["error"]) == {"code", "message"}, envelope
        assert envelope["error"]["code"] in {c.value for c in ErrorCode}
    return envelope


def code(envelope: dict[str, Any]) -> str | None:
    """The error code of a result envelope, or None for a success."""
    error = envelope.get("error")
    return None if error is None else str(error["code"])


def error_code(h: Harness, ep: str, rid: str, kind: str = "llm.generate.result") -> str | None:
    """`code(terminal(...))`."""
    return code(terminal(h, ep, rid, kind))


def assert_safe_error(envelope: dict[str, Any], expected: ErrorCode) -> None:
    """The envelope is an error of `expected` code with the fixed safe sentence."""
    assert envelope["error"] == {"code": expected.value, "message": SAFE_MESSAGES[expected]}


def check_generation(h: Harness, ep: str, rid: str) -> dict[str, Any]:
    """Assert the delta and terminal rules for generation `rid`; return its terminal."""
    result = terminal(h, ep, rid)
    envelopes = h.out(ep)
    end_at = envelopes.index(result)
    deltas = [
        (i, e)
        for i, e in enumerate(envelopes)
        if e["type"] == "llm.delta" and e["requestId"] == rid
    ]
    assert all(i < end_at for i, _ in deltas), "a delta followed the terminal result"
    assert [e["sequence"] for _, e in deltas] == list(range(len(deltas)))
    blocks: dict[int, dict[str, Any]] = {}
    for _, delta in deltas:
        assert "id" not in delta
        index = delta["blockIndex"]
        event = delta["event"]
        if event == "start":
            assert index not in blocks, f"block {index} started twice"
            assert index == len(blocks), "block indices are assigned in start order"
            is_call = delta["block"] == "toolCall"
            assert ("toolCallId" in delta and "name" in delta) == is_call, delta
            assert "text" not in delta
            blocks[index] = {
                "kind": delta["block"],
                "fragments": [],
                "ended": False,
                "toolCallId": delta.get("toolCallId"),
                "name": delta.get("name"),
            }
            continue
        assert index in blocks, f"{event} before start of block {index}"
        block = blocks[index]
        assert block["kind"] == delta["block"], "block kind changed"
        assert not block["ended"], f"{event} after end of block {index}"
        assert "toolCallId" not in delta and "name" not in delta
        if event == "delta":
            assert isinstance(delta["text"], str)
            block["fragments"].append(delta["text"])
        else:
            assert event == "end"
            assert "text" not in delta
            block["ended"] = True
    if "result" in result and result["result"]["finish"] in ("stop", "toolUse"):
        content = result["result"]["content"]
        assert len(blocks) == len(content) or not deltas
        for index, block in blocks.items():
            assert block["ended"], f"completed block {index} has no end"
            part = content[index]
            assert part["type"] == block["kind"]
            text = "".join(block["fragments"])
            if block["kind"] == "toolCall":
                assert json.loads(text) == part["arguments"]
                assert block["toolCallId"] == part["toolCallId"]
                assert block["name"] == part["name"]
            else:
                assert text == part["text"]
    return result


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
