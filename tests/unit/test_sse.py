"""The incremental SSE parser (WHATWG HTML 9.2.6) on bytes split anywhere."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from napllm.providers.sse import (
    MAX_EVENT_CHARS,
    SseEvent,
    SseEventTooLarge,
    SseParser,
    aiter_sse,
)


def parse(*chunks: bytes) -> list[SseEvent]:
    parser = SseParser()
    events: list[SseEvent] = []
    for chunk in chunks:
        events.extend(parser.feed(chunk))
    events.extend(parser.close())
    return events


def test_basic_event_with_id_and_type() -> None:
    events = parse(b'id: 1\nevent: response.created\ndata: {"a":1}\n\n')
    assert events == [SseEvent(event="response.created", data='{"a":1}', id="1")]


def test_default_event_type_is_message() -> None:
    assert parse(b"data: x\n\n") == [SseEvent(event="message", data="x", id="")]


def test_multiline_data_joined_by_lf() -> None:
    assert parse(b"data: a\ndata: b\ndata:\n\n")[0].data == "a\nb\n"


def test_lf_crlf_cr_mixed() -> None:
    stream = b"data: one\r\n\r\ndata: two\r\rdata: three\n\ndata: four\r\n\n"
    assert [e.data for e in parse(stream)] == ["one", "two", "three", "four"]


def test_cr_at_chunk_end_and_lf_at_next_start_are_one_line_end() -> None:
    # "data: a" CR | LF "data: b" CR LF CR LF: if the split CRLF counted twice
    # an empty line would dispatch "a" alone.
    events = parse(b"data: a\r", b"\ndata: b\r\n\r\n")
    assert [e.data for e in events] == ["a\nb"]


def test_cr_then_empty_chunk_then_lf() -> None:
    events = parse(b"data: a\r", b"", b"\ndata: b\r\n\r\n")
    assert [e.data for e in events] == ["a\nb"]


def test_lone_cr_at_chunk_end_followed_by_other_text() -> None:
    events = parse(b"data: a\r", b"\r", b"data: b\n\n")
    assert [e.data for e in events] == ["a", "b"]


def test_utf8_split_across_chunks() -> None:
    payload = "data: héllo – 漢字 🎉\n\n".encode()
    for cut in range(1, len(payload)):
        events = parse(payload[:cut], payload[cut:])
        assert [e.data for e in events] == ["héllo – 漢字 🎉"], cut


def test_every_byte_its_own_chunk() -> None:
    payload = "id: 7\r\nevent: x\r\ndata: 漢🎉\r\n\r\n".encode()
    events = parse(*[payload[i : i + 1] for i in range(len(payload))])
    assert events == [SseEvent(event="x", data="漢🎉", id="7")]


def test_invalid_utf8_becomes_replacement_character() -> None:
    assert parse(b"data: a\xffb\n\n")[0].data == "a\ufffdb"


def test_leading_bom_is_dropped_once() -> None:
    events = parse(b"\xef\xbb", b"\xbfdata: x\n\n")
    assert events == [SseEvent(event="message", data="x", id="")]
    # a BOM later in the stream is text, and the field name then is not "data"
    assert parse(b"data: x\n\n\xef\xbb\xbfdata: y\n\n") == [
        SseEvent(event="message", data="x", id="")
    ]


def test_comments_are_ignored() -> None:
    events = parse(b": keep-alive\n\n:another\ndata: x\n: inside\n\n")
    assert [e.data for e in events] == ["x"]


def test_retry_sets_reconnection_time_only_with_digits() -> None:
    parser = SseParser()
    events = parser.feed(b"retry: 1500\ndata: a\n\nretry: 15x\ndata: b\n\nretry:\ndata: c\n\n")
    assert [e.retry for e in events] == [1500, 1500, 1500]
    assert parser.retry == 1500
    assert parse(b"retry: \xc2\xb2\ndata: a\n\n")[0].retry is None  # superscript two


def test_empty_data_is_an_event_but_no_data_is_none() -> None:
    events = parse(b"data:\n\nevent: only-type\n\nid: 3\n\ndata\n\n")
    assert [(e.event, e.data) for e in events] == [("message", ""), ("message", "")]
    # the event type of an undispatched event does not leak into the next one
    assert events[1].id == "3"


def test_event_without_id_keeps_the_last_id() -> None:
    events = parse(b"id: 1\ndata: a\n\ndata: b\n\nid: 2\ndata: c\n\nid\ndata: d\n\n")
    assert [e.id for e in events] == ["1", "1", "2", ""]


def test_id_with_nul_is_ignored() -> None:
    events = parse(b"id: 1\ndata: a\n\nid: 2\x003\ndata: b\n\n")
    assert [e.id for e in events] == ["1", "1"]


def test_field_without_colon_and_space_handling() -> None:
    events = parse(b"data:no-space\ndata:  two-spaces\nevent\ndata\n\n")
    assert events[0].data == "no-space\n two-spaces\n"
    assert events[0].event == "message"


def test_unknown_fields_are_ignored() -> None:
    assert parse(b"foo: bar\ndata: x\n\n") == [SseEvent(event="message", data="x", id="")]


def test_final_event_without_blank_line_is_discarded() -> None:
    assert [e.data for e in parse(b"data: a\n\ndata: b\n")] == ["a"]
    assert [e.data for e in parse(b"data: a\n\ndata: b")] == ["a"]


def test_final_line_end_at_close_completes_the_event() -> None:
    # the blank line may be the very last bytes of the body
    assert [e.data for e in parse(b"data: a\n", b"\n")] == ["a"]
    assert [e.data for e in parse(b"data: a\r", b"\r")] == ["a"]


def test_feed_after_close_returns_nothing() -> None:
    parser = SseParser()
    parser.close()
    assert parser.feed(b"data: a\n\n") == []
    assert parser.close() == []


def test_aiter_sse_yields_as_events_complete() -> None:
    async def body() -> AsyncIterator[bytes]:
        yield b"data: a\n"
        yield b"\ndata: b\n\ndata: c"

    async def collect() -> list[str]:
        return [e.data async for e in aiter_sse(body())]

    assert asyncio.run(collect()) == ["a", "b"]


# --------------------------------------------------------------------------
# any chunking of a stream yields the same events

_line_ends = st.sampled_from(["\n", "\r", "\r\n"])
_value = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n\x00"),
    max_size=12,
)


@st.composite
def _streams(draw: st.DrawFn) -> bytes:
    out: list[str] = []
    for _ in range(draw(st.integers(0, 6))):
        for _ in range(draw(st.integers(0, 4))):
            kind = draw(st.sampled_from(["data", "event", "id", "retry", "comment", "other"]))
            if kind == "comment":
                line = ":" + draw(_value)
            elif kind == "retry":
                line = "retry: " + str(draw(st.integers(0, 10_000)))
            elif kind == "other":
                line = "x-field: " + draw(_value)
            else:
                sep = draw(st.sampled_from([":", ": "]))
                line = kind + sep + draw(_value)
            out.append(line + draw(_line_ends))
        out.append(draw(_line_ends))
    if draw(st.booleans()):
        out.append("data: unterminated")
    return "".join(out).encode()


@settings(max_examples=300, deadline=None)
@given(stream=_streams(), data=st.data())
def test_any_chunking_yields_the_same_events(stream: bytes, data: st.DataObject) -> None:
    whole = parse(stream)
    cuts = sorted(
        data.draw(st.lists(st.integers(0, len(stream)), max_size=max(0, min(len(stream), 20))))
    )
    pieces = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
    assert parse(*pieces) == whole
    assert parse(*[stream[i : i + 1] for i in range(len(stream))]) == whole


def test_long_line_in_many_small_chunks() -> None:
    payload = b"id: 9\ndata: " + b"x" * 100_000 + b"\r\n\r\n"
    events = parse(*[payload[i : i + 7] for i in range(0, len(payload), 7)])
    assert events == [SseEvent(event="message", data="x" * 100_000, id="9")]


MIB = 1024 * 1024


@pytest.mark.parametrize(
    ("opening", "piece"),
    [
        (b"data: ", b"x" * MIB),  # one line that never ends
        (b"", b"data: " + b"x" * (MIB - 7) + b"\n"),  # data lines, no blank line
        (b": ", b"x" * MIB),  # a comment that never ends
        (b"data: ", "\u00e9".encode() * (MIB // 2)),  # counted in characters
    ],
    ids=["line", "data-lines", "comment", "two-byte-characters"],
)
def test_an_event_that_never_ends_is_refused_at_the_bound(opening: bytes, piece: bytes) -> None:
    # A hostile server's event used to grow in the page's memory until the
    # deadline; the parser now stops at MAX_EVENT_CHARS and stays closed.
    parser = SseParser()
    parser.feed(opening)
    fed = 0
    with pytest.raises(SseEventTooLarge):
        while fed <= 4 * MAX_EVENT_CHARS:
            parser.feed(piece)
            fed += len(piece)
    assert fed <= MAX_EVENT_CHARS * 2 + len(piece)
    assert isinstance(SseEventTooLarge(), ConnectionError)  # callers treat it as a cut
    assert parser.feed(b"\n\ndata: 1\n\n") == []


def test_an_event_just_under_the_bound_and_many_small_events_pass() -> None:
    big = b"data: " + b"x" * (MAX_EVENT_CHARS - 10) + b"\n\n"
    assert parse(big[:MIB], big[MIB:]) == [SseEvent("message", "x" * (MAX_EVENT_CHARS - 10), "")]
    small = b"data: " + b"y" * 1000 + b"\n\n"
    assert len(parse(small * 20_000)) == 20_000  # 20 MB of events: the bound is per event
