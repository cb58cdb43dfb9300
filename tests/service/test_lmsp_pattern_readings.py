"""A `pattern`'s grammar lets the model write only strings the validator accepts.

The service validates a structured answer with `jsonschema`, which reads a
`pattern` with Python's `re`; the grammar that guides the model is written
from the ECMA-262 reading (pattern_grammar.py). Wherever the two readings
differ, the grammar must keep to what both accept, or the service must
refuse the pattern before generating: otherwise the model writes what the
grammar allows and the request ends 500 `model_output_invalid` after the
whole generation (docs/security.md, "Schema data the grammar writes
differently"). Each test walks the grammar at random over an alphabet of
the characters where the readings part (ASCII separators 0x1C-0x1F,
non-ASCII digits and letters, line separators, braces, JSON escapes) and
checks every text it can write against Python's `re`.
"""

from __future__ import annotations

import json
import random
import re
import warnings

import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")

from tests.service.grammar_accept import grammar_accepts, grammar_samples

from napllm.lmsp_service.grammar import GrammarUnavailable, json_grammar

#: The JSON text a grammar may write: quotes, escapes and their hex digits,
#: and the characters whose readings differ between ECMA-262 and Python.
ALPHABET = (
    '"\\/ubfnrt0123456789abcdefABCDEFxyz_-.,{}*+?|()[]^$ '
    "\u00a0\u00e9\u0663\u0966\u2028\u3000\x1c\x01\u00b2"
)


def python_accepts(pattern: str, value: str) -> bool:
    return re.search(pattern, value) is not None


def python_compiles(pattern: str) -> bool:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            re.compile(pattern)
    except re.error:
        return False
    return True


def written_strings(pattern: str, rng: random.Random, count: int = 40) -> list[str] | None:
    """The strings the pattern's grammar wrote on `count` walks, or None when refused."""
    try:
        gbnf = json_grammar({"type": "string", "pattern": pattern})
    except GrammarUnavailable:
        return None
    return [json.loads(text) for text in grammar_samples(gbnf, ALPHABET, count, rng)]


#: Patterns whose grammar must be written (not refused), each with a string
#: the grammar must be able to write: the readings agree on these.
KEPT = {
    "^\\S$": "a",
    "^\\S{2}$": "a!",
    "^[^\\s]$": "a",
    "^[^\\d]$": "a",
    "^\\D\\W$": "a-",
    "^.$": "\u00e9",
    "^[^a]$": '"',
    "^\\s$": " ",
    "^[\\d\\s]$": "7",
    "^[a-]$": "-",
    "^[-a]$": "a",
    "^\\x41\\u00e9$": "A\u00e9",
    "^a|b$": "b",
    "^(ab|c)d$": "abd",
    "^\\{\\}$": "{}",
    "^a{2,}$": "aaa",
    "^a*?b$": "aab",
    "^[\\]\\-]$": "]",
    "^[\\0-\\x1f]$": "\x1c",
    "^\\0$": "\x00",
}


@pytest.mark.parametrize("pattern", sorted(KEPT))
def test_a_pattern_both_readings_agree_on_is_written_and_keeps_to_python(pattern: str) -> None:
    rng = random.Random(pattern)
    gbnf = json_grammar({"type": "string", "pattern": pattern})
    assert grammar_accepts(gbnf, json.dumps(KEPT[pattern], ensure_ascii=False)), KEPT[pattern]
    written = [json.loads(t) for t in grammar_samples(gbnf, ALPHABET, 60, rng)]
    assert written
    for value in written:
        assert python_accepts(pattern, value), (pattern, value)


#: Patterns Python reads otherwise than ECMA-262 in a way the grammar cannot
#: follow, each with a string (or None) the grammar used to let the model
#: write and Python rejects: each must be refused or keep to Python's reading.
PARTED: dict[str, str | None] = {
    "^\\S$": "\x1c",  # Python's \s holds 0x1C-0x1F
    "^[^\\s]$": "\x1d",
    "^[^\\d]$": "\u0663",  # Python's \d holds every decimal digit
    "^[^\\w]$": "\u00e9",  # and \w every letter
    "^[^\\d\\s]{2}$": "\x1c\u0663",
    "^\\01$": "\x001",  # octal in Python, NUL then "1" in ECMA-262
    "^[\\01]$": "\x00",
    "^a{,3}$": "a{,3}",  # {0,3} in Python, literal text in ECMA-262
    "^a{,}$": "a{,}",
    "^a*+a$": "a",  # possessive in Python
    "^a++$": None,
    "^(ab)?+b$": "abababb",
    "^a{2}+$": "aaaa",
    "^a{1,2}+a$": "aa",
    "^[]a]$": None,  # "]" first: a member in Python, an empty class in ECMA-262
    "^[^]a]$": "ca]",
    "^[\\w-z]$": None,
    "^a{\u0663}$": "aaa",  # a count of ASCII digits only in Python: `{٣}` is text
    "^a{1,\uff12}$": "aa",
    "^x{$": None,
    "^a}{$": None,
}


@pytest.mark.parametrize("pattern", sorted(PARTED))
def test_a_pattern_python_reads_otherwise_is_refused_or_kept_to_pythons_reading(
    pattern: str,
) -> None:
    if not python_compiles(pattern):
        pytest.skip("the service refuses the schema before the grammar (invalid pattern)")
    try:
        gbnf = json_grammar({"type": "string", "pattern": pattern})
    except GrammarUnavailable:
        return
    witness = PARTED[pattern]
    if witness is not None:
        assert not python_accepts(pattern, witness)  # the table itself is right
        for text in (json.dumps(witness), json.dumps(witness, ensure_ascii=False)):
            assert not grammar_accepts(gbnf, text), text
    for text in grammar_samples(gbnf, ALPHABET, 80, random.Random(pattern)):
        assert python_accepts(pattern, json.loads(text)), (pattern, text)


PIECES = [
    "a", "b", "1", "\\d", "\\D", "\\s", "\\S", "\\w", "\\W", ".", "[^a]", "[a-c]", "[^\\d]",
    "[\\s]", "[^\\s\\w]", "\\0", "\\x1c", "{", "}", "*", "+", "?", "{2}", "{,2}", "{1,}",
    "(", ")", "(?:", "|", "]", "-", "\\{", "[]", "[^]",
]  # fmt: skip


def test_random_patterns_from_parted_pieces_never_write_what_python_rejects() -> None:
    rng = random.Random(5)
    kept = 0
    for _ in range(250):
        pattern = "^" + "".join(rng.choice(PIECES) for _ in range(rng.randint(1, 6))) + "$"
        if not python_compiles(pattern):
            continue
        written = written_strings(pattern, rng, 12)
        if written is None:
            continue
        kept += 1
        for value in written:
            assert python_accepts(pattern, value), (pattern, value)
    assert kept >= 40  # the check is not passed by refusing every pattern
