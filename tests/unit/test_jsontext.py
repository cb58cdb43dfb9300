"""The strict JSON reader (napllm.jsontext): RFC 8259 only, limits before recursion."""

from __future__ import annotations

import pytest

from napllm.jsontext import (
    MAX_SAFE_INTEGER,
    JsonTextError,
    nesting_depth,
    read_json,
    read_json_object,
)


@pytest.mark.parametrize(
    "text",
    [
        '{"x":NaN}',
        '{"x":-Infinity}',
        '{"x":Infinity}',
        '{"x":1e400}',
        '{"x":-1e400}',
        '{"a":1,"a":2}',
        '"\\ud83d"',
        '{"k\\udc00":1}',
        "9007199254740992",
        "-9007199254740992",
        "1 2",
        "",
        "[" * 10_000,
        "[" * 10_000 + "]" * 10_000,
        '{"d":' + "[" * 49 + "1" + "]" * 49 + "}",
        '{"a":"unterminated',
        "[}",
    ],
)
def test_refused(text: str) -> None:
    with pytest.raises(JsonTextError):
        read_json(text)


def test_values_and_unicode() -> None:
    assert read_json('{"a":[1,2,{"b":"[[{"}]}') == {"a": [1, 2, {"b": "[[{"}]}
    assert read_json('"\\ud83d\\ude00"') == "\U0001f600"
    assert read_json(str(MAX_SAFE_INTEGER)) == MAX_SAFE_INTEGER
    assert read_json("-1.5e10") == -1.5e10
    assert read_json(b'{"t":"\xc3\xa9"}') == {"t": "é"}


def test_raw_lone_surrogate_in_str_refused() -> None:
    with pytest.raises(JsonTextError):
        read_json('"a\ud83d"')


def test_invalid_utf8_bytes_refused() -> None:
    with pytest.raises(JsonTextError):
        read_json(b'"\xff"')


def test_limits() -> None:
    assert read_json("[" * 40 + "]" * 40, max_depth=40) == read_json("[" * 40 + "]" * 40)
    with pytest.raises(JsonTextError):
        read_json("[" * 41 + "]" * 41, max_depth=40)
    with pytest.raises(JsonTextError):
        read_json('"' + "x" * 100 + '"', max_chars=50)


def test_depth_ignores_brackets_in_strings() -> None:
    assert nesting_depth('{"a":"[[[[","b":["]"]}', 10) == 2
    assert nesting_depth("7", 10) == 0


def test_object_only() -> None:
    assert read_json_object('{"a":1}') == {"a": 1}
    with pytest.raises(JsonTextError):
        read_json_object("[1]")


def test_messages_never_quote_the_text() -> None:
    canary = "SECRET-CANARY"
    for text in (f'{{"{canary}":NaN}}', f'{{"{canary}":1,"{canary}":2}}', canary):
        with pytest.raises(JsonTextError) as info:
            read_json(text)
        assert canary not in str(info.value)


def test_stream_payloads_keep_lone_surrogates_and_every_other_rule() -> None:
    from napllm.jsontext import read_stream_payload

    assert read_stream_payload('{"delta":"\\ud83d"}') == {"delta": "\ud83d"}
    assert read_stream_payload('{"delta":"\\ud83d\\ude00"}') == {"delta": "\U0001f600"}
    for text in ('{"x":NaN}', '{"x":1e400}', '{"a":1,"a":2}', "[" * 10_000 + "]" * 10_000):
        with pytest.raises(JsonTextError):
            read_stream_payload(text)


def test_the_shortcuts_keep_every_rule() -> None:
    """Texts with few brackets skip the depth scan, texts without a 16-digit run the
    per-integer check: the verdicts are the same as the full checks'."""
    # Few brackets, unbalanced: still not JSON.
    for text in ("[", "{]", '{"a":[1,2}', "]"):
        with pytest.raises(JsonTextError):
            read_json(text)
    # Many siblings (more brackets than the depth limit), shallow: read.
    wide = "[" + ",".join(["[]"] * 100) + "]"
    assert read_json(wide, max_depth=2) == [[]] * 100
    # Deep only through many brackets: refused; its bracket count decides nothing.
    with pytest.raises(JsonTextError):
        read_json("[" * 3 + "]" * 3, max_depth=2)
    # Integers: 15 digits never need the check; 16 may be safe or not.
    assert read_json("[999999999999999,-999999999999999]") == [
        999_999_999_999_999,
        -999_999_999_999_999,
    ]
    assert read_json("9007199254740991") == MAX_SAFE_INTEGER
    for text in ("9999999999999999", '{"n":[1,-9007199254740993]}', "12345678901234567890"):
        with pytest.raises(JsonTextError):
            read_json(text)
    # A long digit run inside a string turns the check on without changing the answer.
    assert read_json('{"s":"12345678901234567890","n":7}') == {"s": "12345678901234567890", "n": 7}


def _full_checks(text: str, max_depth: int) -> object:
    """The reader as it was before its shortcuts: depth scan and integer check always."""
    import json

    from napllm import jsontext

    if jsontext.nesting_depth(text, max_depth) > max_depth:
        raise JsonTextError("deep")
    try:
        value = json.loads(
            text,
            parse_constant=jsontext._no_constant,
            parse_float=jsontext._finite_float,
            parse_int=jsontext._safe_int,
            object_pairs_hook=jsontext._unique_keys,
        )
    except JsonTextError:
        raise
    except (ValueError, RecursionError):
        raise JsonTextError("not JSON") from None
    jsontext._check_text(value)
    return value


def _verdict(reader: object, text: str, max_depth: int) -> tuple[str, object]:
    try:
        return ("value", reader(text, max_depth))  # type: ignore[operator]
    except JsonTextError:
        return ("refused", None)


# Pieces a hostile text is made of: Unicode digits (Arabic-Indic, fullwidth,
# superscript), exponents, escapes of brackets and quotes, brackets inside
# strings, long and signed integers, and unbalanced brackets.
_PIECES = [
    "[",
    "]",
    "{",
    "}",
    ",",
    ":",
    '"',
    "\\",
    '\\"',
    "\\u005b",
    "\\u007b",
    "\\\\",
    " ",
    "0",
    "1",
    "-",
    "+",
    ".",
    "e",
    "E",
    "e+400",
    "E-400",
    "1e400",
    "-0",
    "00",
    "\u0661\u0662",
    "\uff11\uff12",
    "\u00b2",
    "\u0663" * 16,
    "9007199254740991",
    "9007199254740992",
    "-9007199254740993",
    "1234567890123456",
    "123456789012345",
    "12345678901234567890",
    "1.5",
    '"a"',
    '"k":',
    "true",
    "null",
    "NaN",
    "Infinity",
    '"[[[["',
    '"{{"',
    "\ud800",
    '"\\ud83d"',
]


def test_the_shortcuts_give_the_full_checks_verdict_on_hostile_texts() -> None:
    """Thousands of texts built from hostile pieces (and well-formed ones of every
    depth up to one past the limit): the reader with its shortcuts reads or refuses
    each exactly as the full checks do."""
    import random

    rng = random.Random(20261201)
    texts: list[str] = []
    for depth in range(0, 6):
        for inner in ("0", "1234567890123456789", "[]", '"]]]]"', "12345678901234567"):
            texts.append("[" * depth + inner + "]" * depth)
            texts.append('{"a":' * depth + inner + "}" * depth)
            texts.append("[" * depth + inner + "]" * (depth - 1))
    for _ in range(4000):
        texts.append("".join(rng.choice(_PIECES) for _ in range(rng.randint(1, 12))))
        body = ",".join(rng.choice(_PIECES[13:]) for _ in range(rng.randint(1, 6)))
        texts.append("[" * rng.randint(0, 5) + body + "]" * rng.randint(0, 5))
    accepted = 0
    for text in texts:
        for max_depth in (0, 1, 2, 3, 4):
            got = _verdict(lambda t, d: read_json(t, max_depth=d), text, max_depth)
            assert got == _verdict(_full_checks, text, max_depth), (text, max_depth)
            accepted += got[0] == "value"
    assert accepted > 500  # the corpus reaches both verdicts
