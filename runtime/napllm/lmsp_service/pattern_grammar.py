"""A JSON Schema `pattern` as the GBNF of a JSON string's contents (LMSP 1.0, 6.1).

The keyword table is docs/lmsp.md 2.5.

llama-cpp-python's converter copies a pattern's text into GBNF almost as
is, which is not the same language: a regex escape such as `\\d` or `\\.`
is not a GBNF escape (llama.cpp refuses the grammar when the generation
starts, and the request ended 500), and every character the pattern
allows is written raw inside the JSON string, so `.` or `[^a]` let the
model write `"` or `\\` or a control character (invalid JSON), and
`a\\\\b` a JSON escape of something else. This module writes the grammar
of the pattern's strings as the JSON text of those strings.

Rules
- A pattern must be anchored, `^...$` (as the converter requires); inside,
  it may use literals, escapes (`\\n`, `\\t`, `\\xHH`, `\\uHHHH`, escaped
  punctuation), classes, `.`, `\\d`, `\\w`, `\\s` and their negations,
  groups (`(...)`, `(?:...)`, `(?<name>...)`), alternation, `*`, `+`, `?`,
  `{n}`, `{n,}`, `{n,m}` and their lazy forms (the same language).
  Anything else (lookarounds, `\\b`, backreferences, other anchors) raises
  `UnsupportedPattern`.
- Each character the pattern allows is written as JSON writes it: `"` as
  `\\"`, `\\` as `\\\\`, a control character as its escape; every other
  character as itself (lone surrogates never). So the grammar's text is
  always a JSON string, and it decodes to a string the pattern matches.
- The grammar may allow fewer strings than the validator (Python's `re`,
  through `jsonschema`), never more: wherever ECMA-262 and Python read a
  pattern differently, the grammar keeps to what both accept or the
  pattern is refused. `.` leaves out U+2028 and U+2029 as ECMA-262 does;
  `\\d`, `\\w`, `\\s` keep to ASCII, and their negations (`\\D`, `\\S`,
  a shorthand in `[^...]`) to the ASCII characters neither reading counts
  in them (Python's `\\s` also holds 0x1C-0x1F). Refused: `\\0` before a digit
  (octal in Python), a `{` that does not start a count (`{,n}` is a count
  in Python), a quantifier after a quantifier (`a*+` is possessive in
  Python), and the class syntax the two part on (module `_class`).
- Classes are read here, strictly; `pattern_cost` reads them leniently,
  for a cost bound only. The walk is iterative; nesting and counts are
  bounded before (grammar.py).
"""

from __future__ import annotations

import re

from ..pattern_cost import complement_ranges

# ASCII digits only: Python reads `{٣}` as text, and llama.cpp reads ASCII counts.
_COUNT = re.compile(r"\{(\d+)(?:(,)(\d*))?\}", re.ASCII)
#: ASCII readings of the shorthand classes (where ECMA-262 and Python agree).
_SHORTHAND = {
    "d": ((0x30, 0x39),),
    "w": ((0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)),
    "s": ((0x09, 0x0D), (0x20, 0x20)),
}
#: Every ASCII character either reading counts in a shorthand (Python's `\\s`
#: also holds the separators 0x1C-0x1F): a negation leaves these out.
_SHORTHAND_WIDE = {**_SHORTHAND, "s": ((0x09, 0x0D), (0x1C, 0x20))}
_SIMPLE_ESCAPES = {"n": 10, "r": 13, "t": 9, "f": 12, "v": 11, "0": 0}
#: Characters `.` does not match (ECMA-262 line terminators).
_DOT = complement_ranges(((10, 10), (13, 13), (0x2028, 0x2029)))
#: JSON's short escapes; other control characters are written `\\u00XX`.
_JSON_ESCAPES = {0x22: '\\"', 0x5C: "\\\\", 0x0A: "\\n", 0x0D: "\\r", 0x09: "\\t"}


class UnsupportedPattern(ValueError):
    """A pattern this module cannot turn into an exact grammar (module rules)."""


Ranges = tuple[tuple[int, int], ...]


def _ascii_complement(ranges: Ranges) -> Ranges:
    """The ASCII characters not in `ranges`."""
    return tuple((low, min(high, 0x7F)) for low, high in complement_ranges(ranges) if low <= 0x7F)


def _gbnf_char(point: int) -> str:
    if chr(point).isalnum() and point < 0x80:
        return chr(point)
    return f"\\x{point:02X}" if point < 0x100 else f"\\U{point:08X}"


def _literal(text: str) -> str:
    return '"' + "".join(_gbnf_char(ord(c)) for c in text) + '"'


def _minus(ranges: Ranges, low: int, high: int) -> list[tuple[int, int]]:
    out = []
    for a, b in ranges:
        if b < low or a > high:
            out.append((a, b))
            continue
        if a < low:
            out.append((a, low - 1))
        if b > high:
            out.append((high + 1, b))
    return out


def _escapes(ranges: Ranges) -> str | None:
    """GBNF for the JSON escapes of the characters of `ranges` that need one, if any."""

    def has(point: int) -> bool:
        return any(low <= point <= high for low, high in ranges)

    short = "".join(_gbnf_char(ord(_JSON_ESCAPES[p][1])) for p in sorted(_JSON_ESCAPES) if has(p))
    after = [f"[{short}]"] if short else []
    controls = [p for p in range(0x20) if p not in _JSON_ESCAPES and has(p)]
    if len(controls) == 0x20 - 3:
        after.append('"u00" ("0" [0-8bcef] | "1" [0-9a-f])')
    else:
        after.extend(_literal(f"u{p:04x}") for p in controls)
    if not after:
        return None
    return '"\\x5C" ' + (after[0] if len(after) == 1 else "(" + " | ".join(after) + ")")


def chars_rule(ranges: Ranges) -> str:
    """GBNF for one character of `ranges` as JSON writes it inside a string.

    Raises `UnsupportedPattern` when no character is left.
    """
    safe: Ranges = tuple(ranges)
    for low, high in ((0x00, 0x1F), (0x22, 0x22), (0x5C, 0x5C), (0xD800, 0xDFFF)):
        safe = tuple(_minus(safe, low, high))
    alternatives = []
    if safe:
        if len(safe) == 1 and safe[0][0] == safe[0][1]:
            alternatives.append(_literal(chr(safe[0][0])))
        else:
            body = "".join(
                _gbnf_char(a) if a == b else f"{_gbnf_char(a)}-{_gbnf_char(b)}" for a, b in safe
            )
            alternatives.append(f"[{body}]")
    escapes = _escapes(ranges)
    if escapes:
        alternatives.append(escapes)
    if not alternatives:
        raise UnsupportedPattern("a part that matches no character")
    return alternatives[0] if len(alternatives) == 1 else "(" + " | ".join(alternatives) + ")"


def _escape(source: str, i: int) -> tuple[Ranges | str, int]:
    """The escape at `source[i]` (a backslash) and the index after it.

    Returns a shorthand's letter (`d`, `w`, `s`, `D`, `W`, `S`) or the
    escaped character's ranges. Escapes the two readings part on are
    refused: `\\0` before a digit (an octal escape in Python), letters other
    than the ones listed (`\\b`, backreferences, `\\k`, `\\p`, `\\c`, Python's
    `\\a` and `\\N`), `\\u{...}`.
    """
    if i + 1 >= len(source):
        raise UnsupportedPattern("a lone backslash at its end")
    c = source[i + 1]
    if c.lower() in _SHORTHAND:
        return c, i + 2
    if c == "0" and source[i + 2 : i + 3].isdigit():
        raise UnsupportedPattern("an octal escape (\\0 before a digit)")
    if c in _SIMPLE_ESCAPES:
        point = _SIMPLE_ESCAPES[c]
        return ((point, point),), i + 2
    if c in "xu":
        width = 2 if c == "x" else 4
        digits = source[i + 2 : i + 2 + width]
        if len(digits) != width or not all(d in "0123456789abcdefABCDEF" for d in digits):
            raise UnsupportedPattern("a malformed escape")
        point = int(digits, 16)
        return ((point, point),), i + 2 + width
    if c.isalnum():  # \b, \B, backreferences, \k, \p, \c: not a character of its own
        raise UnsupportedPattern("an assertion, backreference or property escape")
    return ((ord(c), ord(c)),), i + 2


def _shorthand(letter: str) -> Ranges:
    """The characters of a shorthand outside a class: ASCII, where both readings agree."""
    if letter.islower():
        return _SHORTHAND[letter]
    return _ascii_complement(_SHORTHAND_WIDE[letter.lower()])


def _class(source: str, i: int) -> tuple[Ranges, int]:
    """The characters of the class at `source[i]` (`[`), and the index after it.

    Read here, strictly, rather than by `pattern_cost`'s lenient reading
    (which only has to bound a cost): every class syntax on which ECMA-262
    and Python's `re` part is refused (a `]` first, a `[` or a doubled set
    operator `&&`, `--`, `~~`, `||` inside, a shorthand at either end of a
    range, `\\D`, `\\W`, `\\S`, `\\b`). A shorthand in a negated class keeps the
    class to ASCII, minus what either reading counts in the shorthand.
    """
    i += 1
    negated = source.startswith("^", i)
    i += 1 if negated else 0
    if source.startswith("]", i):
        raise UnsupportedPattern("a class that starts with ]")
    members: list[tuple[int, int]] = []
    shorthands: list[str] = []

    def one(at: int) -> tuple[Ranges | str, int]:
        if at >= len(source):
            raise UnsupportedPattern("an unterminated class")
        if source[at] == "\\":
            item, after = _escape(source, at)
            if isinstance(item, str) and item.isupper():
                raise UnsupportedPattern("a negated shorthand inside a class")
            return item, after
        if source[at] == "[" or source[at : at + 2] in ("&&", "--", "~~", "||"):
            raise UnsupportedPattern("a nested class or set operation inside a class")
        return ((ord(source[at]), ord(source[at])),), at + 1

    while True:
        if i >= len(source):
            raise UnsupportedPattern("an unterminated class")
        if source[i] == "]":
            break
        item, i = one(i)
        if source.startswith("-", i) and not source.startswith("-]", i):
            upper, i = one(i + 1)
            if isinstance(item, str) or isinstance(upper, str):
                raise UnsupportedPattern("a shorthand at the end of a range")
            low, high = item[0][0], upper[0][0]
            if low > high:
                raise UnsupportedPattern("a range out of order")
            members.append((low, high))
        elif isinstance(item, str):
            shorthands.append(item)
        else:
            members.extend(item)
    end = i + 1
    if not negated:
        return tuple(members) + tuple(r for s in shorthands for r in _SHORTHAND[s]), end
    if not shorthands:
        return complement_ranges(tuple(members)), end
    wide = tuple(members) + tuple(r for s in shorthands for r in _SHORTHAND_WIDE[s])
    return _ascii_complement(wide), end


def pattern_rule(pattern: str) -> str:
    """GBNF (a rule body) for the contents of a JSON string matching `pattern` (module rules).

    Raises `UnsupportedPattern`.
    """
    dollar_escaped = len(pattern) - len(pattern[:-1].rstrip("\\")) - 1
    if not (pattern.startswith("^") and pattern.endswith("$")) or dollar_escaped % 2:
        raise UnsupportedPattern("no anchors (it must be ^...$)")
    source = pattern[1:-1]
    # Each frame: the alternatives of one group, each a list of GBNF items.
    frames: list[list[list[str]]] = [[[]]]
    quantified = False  # the last item read was a quantifier
    i = 0
    while i < len(source):
        c = source[i]
        items = frames[-1][-1]
        after_quantifier, quantified = quantified, False
        if c == "(":
            if source.startswith("(?:", i):
                i += 3
            elif source.startswith("(?<", i) and source[i + 3 : i + 4] not in ("=", "!"):
                close = source.find(">", i)
                if close == -1:
                    raise UnsupportedPattern("an unterminated group name")
                i = close + 1
            elif source.startswith("(?", i):
                raise UnsupportedPattern("a lookaround")
            else:
                i += 1
            frames.append([[]])
            continue
        if c == ")":
            if len(frames) == 1:
                raise UnsupportedPattern("an unbalanced parenthesis")
            group = frames.pop()
            body = " | ".join(" ".join(a) if a else '""' for a in group)
            frames[-1][-1].append(f"({body})")
            i += 1
            continue
        if c == "|":
            frames[-1].append([])
            i += 1
            continue
        count = _COUNT.match(source, i) if c == "{" else None
        if c == "{" and count is None:
            # `{,n}` is a count in Python and text in ECMA-262.
            raise UnsupportedPattern("a brace that is not a repetition count (write \\{)")
        if c in "*+?" or count is not None:
            if after_quantifier:
                # `a*+` is possessive in Python, an error in ECMA-262.
                raise UnsupportedPattern("a quantifier after a quantifier")
            if not items or items[-1] in ("", '""'):
                raise UnsupportedPattern("a quantifier with nothing to repeat")
            if count is not None:
                low, comma, high = count.group(1), count.group(2), count.group(3)
                if high and int(low) > int(high):
                    raise UnsupportedPattern("a repetition count out of order")
                suffix = f"{{{int(low)}}}" if comma is None else f"{{{int(low)},{high}}}"
                i = count.end()
            else:
                suffix = c
                i += 1
            items[-1] = f"({items[-1]}){suffix}"
            if source.startswith("?", i):
                i += 1  # lazy: the same language
            quantified = True
            continue
        if c in "^$":
            raise UnsupportedPattern("an anchor inside the pattern")
        if c == ".":
            ranges, i = _DOT, i + 1
        elif c == "[":
            ranges, i = _class(source, i)
        elif c == "\\":
            item, i = _escape(source, i)
            ranges = _shorthand(item) if isinstance(item, str) else item
        else:
            ranges, i = ((ord(c), ord(c)),), i + 1
        items.append(chars_rule(ranges))
    if len(frames) != 1:
        raise UnsupportedPattern("an unbalanced parenthesis")
    top = frames[0]
    if len(top) == 1:
        return " ".join(top[0]) if top[0] else '""'
    return "(" + " | ".join(" ".join(a) if a else '""' for a in top) + ")"
