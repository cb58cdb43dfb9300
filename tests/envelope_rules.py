"""NAP-LLM rules on the envelopes one endpoint received, shared by every suite.

The core suites read them from the recording transport (tests/unit/napcheck.py)
and the browser suites from what a napplet frame recorded
(tests/browser/shellpage.py); both check the same rules (NAP-LLM, Wire
Protocol; Delta; Error Handling):

- `terminal`: a request id got exactly one terminal result of the matching
  result type, with `error` xor the success payload, and an error is exactly
  `{"code", "message"}` with a known code.
- `check_generation`: `terminal` plus the delta rules: sequence contiguous
  from 0, block indices assigned in start order, every block `start` first,
  `delta`s with text, then at most one `end`, a stable kind, toolCall `start`
  carrying id and name (and only there), no `id` in a delta, nothing after
  the terminal result, and for a completed (`stop` / `toolUse`) result every
  streamed block ended and matching the terminal content at its index.
"""

from __future__ import annotations

import json
from typing import Any

from napllm.errors import ErrorCode

SUCCESS_FIELD = {
    "llm.select.result": "model",
    "llm.describe.result": "model",
    "llm.generate.result": "result",
    "llm.cancel.result": "cancelled",
}
ERROR_CODES = frozenset(c.value for c in ErrorCode)


def code(envelope: dict[str, Any]) -> str | None:
    """The error code of a result envelope, or None for a success."""
    error = envelope.get("error")
    return None if error is None else str(error["code"])


def terminal(envelopes: list[Any], rid: str, kind: str = "llm.generate.result") -> dict[str, Any]:
    """The one `kind` envelope with id `rid`; asserts exactly one and its shape."""
    found = [
        e for e in envelopes if isinstance(e, dict) and e.get("type") == kind and e.get("id") == rid
    ]
    assert len(found) == 1, f"expected one {kind} for {rid}, got {found}"
    envelope: dict[str, Any] = found[0]
    has_error = "error" in envelope
    assert has_error != (SUCCESS_FIELD[kind] in envelope), envelope
    if has_error:
        assert set(envelope) == {"type", "id", "error"}, envelope
        assert set(envelope["error"]) == {"code", "message"}, envelope
        assert envelope["error"]["code"] in ERROR_CODES, envelope
    return envelope


def check_generation(envelopes: list[Any], rid: str) -> dict[str, Any]:
    """Assert the delta and terminal rules for generation `rid`; return its terminal."""
    result = terminal(envelopes, rid)
    end_at = envelopes.index(result)
    deltas = [
        (i, e)
        for i, e in enumerate(envelopes)
        if isinstance(e, dict) and e.get("type") == "llm.delta" and e.get("requestId") == rid
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
            assert event == "end" and "text" not in delta, delta
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
