"""The Hermes `<tool_call>` scanner and parser (`napllm.toolcall_text`) on the shared table."""

from __future__ import annotations

import pytest

from napllm.toolcall_text import (
    MalformedToolCall,
    ToolCallScanner,
    ToolCallText,
    held_prefix_length,
    parse_tool_call,
)
from toolcall_cases import MALFORMED, TOOL_NAMES, UNKNOWN_TOOL, WELL_FORMED, block


@pytest.mark.parametrize(("body", "name", "arguments"), [c[1:] for c in WELL_FORMED],
                         ids=[c[0] for c in WELL_FORMED])  # fmt: skip
def test_well_formed_calls(body: str, name: str, arguments: str) -> None:
    assert parse_tool_call(body) == ToolCallText(name, arguments)
    assert parse_tool_call(body, TOOL_NAMES) == ToolCallText(name, arguments)


@pytest.mark.parametrize(("body", "reason"), [c[1:] for c in MALFORMED],
                         ids=[c[0] for c in MALFORMED])  # fmt: skip
def test_malformed_calls_give_a_fixed_reason(body: str, reason: str) -> None:
    with pytest.raises(MalformedToolCall) as caught:
        parse_tool_call(body, TOOL_NAMES)
    assert str(caught.value) == reason


def test_unknown_tool_is_malformed_only_against_the_offered_names() -> None:
    body, reason = UNKNOWN_TOOL
    assert parse_tool_call(body).name == "launch"
    with pytest.raises(MalformedToolCall, match=reason):
        parse_tool_call(body, TOOL_NAMES)


def test_held_prefix_length() -> None:
    assert held_prefix_length("abc <tool_") == len("<tool_")
    assert held_prefix_length("abc <") == 1
    assert held_prefix_length("abc") == 0
    assert held_prefix_length("<tool_call>") == 0  # a whole tag is not a prefix


def scan(pieces: list[str]) -> tuple[list[tuple[str, str]], str | None]:
    scanner = ToolCallScanner()
    out: list[tuple[str, str]] = []
    for piece in pieces:
        out.extend(scanner.feed(piece))
    rest, open_body = scanner.finish()
    out.extend(rest)
    return out, open_body


def joined(pieces: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Adjacent text pieces merged (the split depends on where chunks end)."""
    merged: list[tuple[str, str]] = []
    for kind, text in pieces:
        if kind == "text" and merged and merged[-1][0] == "text":
            merged[-1] = ("text", merged[-1][1] + text)
        else:
            merged.append((kind, text))
    return merged


def test_scanner_gives_the_same_pieces_however_the_text_is_split() -> None:
    body = '{"name": "get_weather", "arguments": {"city": "</tool"}}'
    text = "Let me check <tool <tool_call>" + body + "</tool_call> done <tool_"
    expected = [
        ("text", "Let me check <tool "),
        ("open", ""),
        ("call", body),
        ("text", " done <tool_"),
    ]
    for size in range(1, len(text) + 1):
        chunks = [text[i : i + size] for i in range(0, len(text), size)]
        pieces, open_body = scan(chunks)
        assert joined(pieces) == expected, size
        assert open_body is None


def test_scanner_returns_an_open_block_at_the_end() -> None:
    for size in (1, 4, 100):
        text = "<tool_call>" + '{"name": "get_weather"}</tool_ca'
        pieces, open_body = scan([text[i : i + size] for i in range(0, len(text), size)])
        assert pieces == [("open", "")]
        assert open_body == '{"name": "get_weather"}</tool_ca'


def test_every_table_body_survives_the_scanner() -> None:
    for _, body, _, _ in WELL_FORMED:
        pieces, _ = scan([block(body)])
        assert pieces == [("open", ""), ("call", f"\n{body}\n")]
