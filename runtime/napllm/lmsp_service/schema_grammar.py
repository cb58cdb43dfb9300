"""JSON Schema to GBNF: llama-cpp-python's converter, completed (LMSP 1.0, 6.1, 6.5).

The keyword table is docs/lmsp.md 2.5.

The service builds its grammars with llama-cpp-python's `SchemaConverter`
(llama_cpp/llama_grammar.py). The version it ships is not enough on its
own, for two reasons this module fixes by subclassing it:

- **Literal escaping.** The converter writes a constant (`const`, `enum`,
  a property name, a pattern's literal text) as the JSON text of the value
  inside a GBNF literal, escaping only `"`, CR and LF. GBNF reads `\\` as an
  escape too, so any JSON escape in that text changed meaning: `{"const":
  "\\u0000"}` became a grammar for a raw NUL character (invalid JSON, the
  request ended 500 `model_output_invalid`), `"a\\\\b"` became `"a\\b"` (a
  backspace), and `"a\\"b"` a grammar the parser cannot read. `_literal`
  escapes every backslash and every character GBNF would not keep as is,
  so the grammar writes exactly the value's JSON text.
- **Integer bounds.** The converter drops `minimum`, `maximum`,
  `exclusiveMinimum` and `exclusiveMaximum` (a TODO in its code), so the
  model could write an integer the schema rejects. For `type: "integer"`
  they are enforced here with a digit grammar of the range
  (`integer_range_rule`), as llama.cpp's own converter does: any range,
  one-sided or two-sided, negative or not. Alternatives of one rule start
  with distinct characters wherever they have the same length, so the
  grammar's parse stacks stay few (grammar_cost.py measures it).

- **Text the output check refuses.** The converter's `char` rule let a
  string hold raw control characters (U+0000 to U+001F) and `\\u`
  escapes of lone surrogates, and its `integral-part` wrote 16 digits
  (integers beyond 2**53, which the service's JSON reader refuses as
  unsafe) and exponents of 16 digits (infinity): a model at temperature 0
  wrote a raw newline into a plain `{"type": "string"}`, and the request
  ended 500 `model_output_invalid`. `_OWN_PRIMITIVES` replaces those rules
  with ones that write only what `jsontext.read_json` accepts.
- **Rule names.** A property named `""` at the top level was visited under
  the name `""`, which the converter turns into `root`: the property's
  rule became the grammar's root. Such a name gets a rule name of its own.

Rules
- An integer range is cut to the safe integers (`-(2**53 - 1)` to
  `2**53 - 1`, `SAFE_INTEGER`, what the service's JSON reader accepts); a
  missing bound is that edge. An integer without bounds is written with
  at most `MAX_INTEGER_DIGITS` digits (a simpler rule, inside that edge).
  A range left empty (its bounds cross, or it lies beyond that edge)
  raises `EmptyRange`.
- Bounds may be any JSON number: `minimum: 1.5` keeps integers from 2 on.
  Booleans (draft 4's `exclusiveMinimum: true`) are not numbers here:
  schema_keywords.py refuses them before conversion.
- `-0` is not written (it equals `0`, which is, when in range).
- Everything else is the converter's own behaviour.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from llama_cpp.llama_grammar import PRIMITIVE_RULES, RESERVED_NAMES, BuiltinRule, SchemaConverter

from .pattern_grammar import pattern_rule

#: Most digits of an integer the grammar writes (`integral-part`): every such
#: integer is a safe integer (below 2**53), as `jsontext.read_json` requires.
MAX_INTEGER_DIGITS = 15
_HEX = "[0-9a-fA-F]"
#: The converter's primitives that could write text the output check refuses,
#: replaced (module rules): a string character is never a raw control
#: character nor an escaped lone surrogate; integers have at most
#: MAX_INTEGER_DIGITS digits; an exponent at most two (no infinity).
_OWN_PRIMITIVES = {
    id(PRIMITIVE_RULES["char"]): BuiltinRule(
        r'[^"\\\x00-\x1F] | "\\" (["\\/bfnrt] | "u" '
        + f"([0-9a-cA-CefEF] {_HEX} {_HEX} {_HEX} | [dD] [0-7] {_HEX} {_HEX}))",
        [],
    ),
    id(PRIMITIVE_RULES["integral-part"]): BuiltinRule(
        f"[0-9] | [1-9] [0-9]{{0,{MAX_INTEGER_DIGITS - 1}}}", []
    ),
    id(PRIMITIVE_RULES["number"]): BuiltinRule(
        '("-"? integral-part) ("." decimal-part)? ([eE] [-+]? [0-9] [0-9]?)? space',
        ["integral-part", "decimal-part"],
    ),
}
#: Largest magnitude of an integer the grammar writes for a bounded range.
SAFE_INTEGER = 2**53 - 1
_EDGE = SAFE_INTEGER
#: The integer bound keywords this module enforces.
INTEGER_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
#: Characters a GBNF literal must escape (everything else is written as is).
_LITERAL_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}


class EmptyRange(ValueError):
    """An integer schema's bounds leave no integer the grammar can write."""


def _literal(text: str) -> str:
    """`text` as a GBNF string literal matching exactly `text`."""
    out = []
    for char in text:
        if char in _LITERAL_ESCAPES:
            out.append(_LITERAL_ESCAPES[char])
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            out.append(f"\\x{ord(char):02X}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def _any_digits(count: int) -> str:
    return "" if count == 0 else "[0-9]" if count == 1 else f"[0-9]{{{count}}}"


def _join(*parts: str) -> str:
    return " ".join(part for part in parts if part)


def _at_least(digits: str) -> str:
    """Digit strings of `len(digits)` characters that are >= `digits`."""
    if not digits or set(digits) == {"0"}:
        return _any_digits(len(digits))
    head, rest = int(digits[0]), digits[1:]
    alternatives = [_join(f'"{head}"', _at_least(rest))]
    if head < 9:
        alternatives.append(_join(f"[{head + 1}-9]", _any_digits(len(rest))))
    return alternatives[0] if len(alternatives) == 1 else "(" + " | ".join(alternatives) + ")"


def _at_most(digits: str) -> str:
    """Digit strings of `len(digits)` characters that are <= `digits`."""
    if not digits or set(digits) == {"9"}:
        return _any_digits(len(digits))
    head, rest = int(digits[0]), digits[1:]
    alternatives = [_join(f'"{head}"', _at_most(rest))]
    if head > 0:
        alternatives.insert(0, _join(f"[0-{head - 1}]", _any_digits(len(rest))))
    return alternatives[0] if len(alternatives) == 1 else "(" + " | ".join(alternatives) + ")"


def _same_length(low: str, high: str) -> str:
    """Digit strings from `low` to `high` (as many digits as both, `low <= high`)."""
    same = 0
    while same < len(low) and low[same] == high[same]:
        same += 1
    prefix = f'"{low[:same]}"' if same else ""
    if same == len(low):
        return prefix
    a, b, size = int(low[same]), int(high[same]), len(low) - same - 1
    low_rest, high_rest = low[same + 1 :], high[same + 1 :]
    if set(low_rest) <= {"0"} and set(high_rest) <= {"9"}:
        return _join(prefix, f"[{a}-{b}]", _any_digits(size))
    alternatives = [_join(f'"{a}"', _at_least(low_rest))]
    if b - a > 1:
        alternatives.append(_join(f"[{a + 1}-{b - 1}]", _any_digits(size)))
    alternatives.append(_join(f'"{b}"', _at_most(high_rest)))
    return _join(prefix, "(" + " | ".join(alternatives) + ")")


def _magnitudes(low: int, high: int) -> list[str]:
    """Alternatives for the decimal texts of `low..high` (`0 <= low <= high`), one per length."""
    alternatives = []
    for length in range(len(str(low)), len(str(high)) + 1):
        first = max(low, 10 ** (length - 1) if length > 1 else 0)
        last = min(high, 10**length - 1)
        alternatives.append(_same_length(str(first), str(last)))
    return alternatives


def integer_bounds(schema: dict[str, Any]) -> tuple[int, int]:
    """The smallest and largest integer `schema`'s bounds allow, cut to the grammar's edge.

    Reads the `INTEGER_BOUNDS` keywords (JSON numbers); raises `EmptyRange`
    when no safe integer (`SAFE_INTEGER`) is allowed.
    """
    low, high = -_EDGE, _EDGE
    if "minimum" in schema:
        low = max(low, math.ceil(schema["minimum"]))
    if "exclusiveMinimum" in schema:
        low = max(low, math.floor(schema["exclusiveMinimum"]) + 1)
    if "maximum" in schema:
        high = min(high, math.floor(schema["maximum"]))
    if "exclusiveMaximum" in schema:
        high = min(high, math.ceil(schema["exclusiveMaximum"]) - 1)
    if low > high:
        raise EmptyRange("no integer within the schema's bounds can be written")
    return low, high


def integer_range_rule(low: int, high: int) -> str:
    """GBNF (a rule body, without trailing space) for the decimal integers `low..high`.

    `low <= high`, both within `SAFE_INTEGER`. The text
    has no leading zeros and no `-0`.
    """
    alternatives = []
    if low < 0:
        negative = _magnitudes(max(1, -high), -low)
        inner = negative[0] if len(negative) == 1 else "(" + " | ".join(negative) + ")"
        alternatives.append(f'"-" {inner}')
    if high >= 0:
        alternatives.extend(_magnitudes(max(0, low), high))
    return "(" + " | ".join(alternatives) + ")"


#: Schema positions (JSON Schema 2020-12 applicators), shared with
#: schema_keywords: keywords whose value is one subschema,
SUBSCHEMA_ONE = frozenset(
    {
        "items",
        "additionalProperties",
        "not",
        "if",
        "then",
        "else",
        "contains",
        "propertyNames",
        "unevaluatedItems",
        "unevaluatedProperties",
        "contentSchema",
    }
)
#: a list of them,
SUBSCHEMA_LIST = frozenset({"allOf", "anyOf", "oneOf", "prefixItems"})
#: or a map of them.
SUBSCHEMA_MAP = frozenset(
    {"properties", "$defs", "definitions", "patternProperties", "dependentSchemas"}
)
#: `items` may also be a list (draft 2019 and earlier); the converter reads it.
_LIST = SUBSCHEMA_LIST | {"items"}


def _subschemas(node: dict[str, Any]) -> list[Any]:
    """The subschemas directly under `node` (schema positions only, never data)."""
    out: list[Any] = []
    for key, value in node.items():
        if key in SUBSCHEMA_ONE and isinstance(value, dict):
            out.append(value)
        elif key in _LIST and isinstance(value, list):
            out.extend(value)
        elif key in SUBSCHEMA_MAP and isinstance(value, dict):
            out.extend(value.values())
    return out


def _pointer(document: Any, pointer: str) -> Any:
    """The value at the JSON Pointer `pointer` (RFC 6901, without the `#`) in `document`."""
    target = document
    for raw in pointer.split("/")[1:]:
        part = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(target, dict) and part in target:
            target = target[part]
        elif isinstance(target, list) and part.isdigit() and int(part) < len(target):
            target = target[int(part)]
        else:
            raise ValueError("a $ref points at nothing in the schema")
    return target


def rebase_refs(schema: Any, prefix: str) -> Any:
    """A copy of `schema` whose local `$ref`s (`#/...`) point under `#/<prefix>`.

    For embedding a schema (a tool's parameters) inside a larger document:
    its references stay relative to its own root. Schema positions only.
    """
    copy = json.loads(json.dumps(schema))
    stack = [copy]
    while stack:
        node = stack.pop()
        if not isinstance(node, dict):
            continue
        ref = node.get("$ref")
        if isinstance(ref, str) and (ref == "#" or ref.startswith("#/")):
            node["$ref"] = f"#/{prefix}{ref[1:]}"
        stack.extend(_subschemas(node))
    return copy


class CompletedConverter(SchemaConverter):
    """llama-cpp-python's `SchemaConverter` with exact literals, integer bounds and references.

    References: the converter's own `resolve_refs` rewrote every `$ref`
    key it met, also inside `const`/`enum` data (so the grammar wrote
    changed data), and named a referenced rule by the pointer's last
    segment, so `#/$defs/x` could take the rule of a property `x` (the
    grammar enforced another schema). Here references are read in schema
    positions only, resolved as JSON Pointers, and each gets a rule of its
    own.
    """

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)  # type: ignore[no-untyped-call]
        self._ref_rules: dict[str, str] = {}
        self._depth = 0

    def _add_primitive(self, name: str, rule: Any) -> str:
        own = _OWN_PRIMITIVES.get(id(rule), rule)
        return str(super()._add_primitive(name, own))

    def _format_literal(self, literal: str) -> str:
        return _literal(literal)

    def _visit_pattern(self, pattern: str, name: str) -> str:
        body = '"\\"" ' + pattern_rule(pattern) + ' "\\"" space'
        return str(self._add_rule(name, body))  # type: ignore[no-untyped-call]

    def resolve_refs(self, schema: Any, url: str) -> Any:
        """Record the target of every local `$ref` in `schema` (raises `ValueError` otherwise)."""
        stack = [schema]
        while stack:
            node = stack.pop()
            if not isinstance(node, dict):
                continue
            ref = node.get("$ref")
            if ref is not None:
                if not isinstance(ref, str) or not ref.startswith("#/"):
                    raise ValueError("only local references (#/...) are supported")
                self._refs[ref] = _pointer(schema, ref[1:])
            stack.extend(_subschemas(node))
        return schema

    def _resolve_ref(self, ref: str) -> str:
        if ref in self._ref_rules:
            return self._ref_rules[ref]
        base = "ref" + re.sub(r"[^a-zA-Z0-9-]+", "-", ref[1:])
        name, count = base, 0
        taken = set(self._ref_rules.values())
        while name in self._rules or name in taken or name in RESERVED_NAMES:
            count += 1
            name = f"{base}{count}"
        self._ref_rules[ref] = name  # a recursive reference meets this name
        got = str(self.visit(self._refs[ref], name))
        if got != name:
            self._rules[name] = got
        return name

    def visit(self, schema: dict[str, Any], name: str) -> str:
        """The converter's `visit`, enforcing integer bounds where it would drop them."""
        if not name and self._depth:
            name = "empty-name"  # a property named "": never the root (module rules)
        self._depth += 1
        try:
            return self._visit(schema, name)
        finally:
            self._depth -= 1

    def _visit(self, schema: dict[str, Any], name: str) -> str:
        if (
            isinstance(schema, dict)
            and schema.get("type") == "integer"
            and not any(key in schema for key in ("$ref", "oneOf", "anyOf", "const", "enum"))
            and any(key in schema for key in INTEGER_BOUNDS)
        ):
            low, high = integer_bounds(schema)
            rule_name = name + "-" if name in RESERVED_NAMES else name or "root"
            rule = integer_range_rule(low, high) + " space"
            return str(self._add_rule(rule_name, rule))  # type: ignore[no-untyped-call]
        return str(super().visit(schema, name))  # type: ignore[no-untyped-call]


def schema_to_gbnf(schema: Any) -> str:
    """GBNF text for the JSON Schema `schema` (a parsed JSON value).

    Raises `EmptyRange` (module rules) or whatever the converter raises
    for a schema it cannot express (bare `Exception`, `KeyError`, ...).
    """
    converter = CompletedConverter(
        prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False
    )
    resolved = converter.resolve_refs(json.loads(json.dumps(schema)), "")
    converter.visit(resolved, "")
    return str(converter.format_grammar())  # type: ignore[no-untyped-call]
