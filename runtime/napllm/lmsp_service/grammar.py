"""Bounded llama.cpp grammars from request schemas (LMSP 1.0, 6.1, 6.5; docs/lmsp.md).

A request's JSON Schema (`response_format: json_schema`, or a forced tool
call's `parameters`) is napplet-controlled text that ends up in two places
that do not defend themselves: llama-cpp-python's JSON-Schema-to-GBNF
converter (completed in schema_grammar.py; pure Python, whose output grows
with every repetition count:
`maxLength: N` becomes N nested optional groups, `pattern: "a{N}"` N copies)
and llama.cpp's GBNF parser (native code, recursive: a few thousand nested
groups overflow its stack and kill the process).

Rules
- Before conversion, a keyword that constrains validity but that the
  converter drops (`schema_keywords.unenforced_keyword`: number bounds,
  `not`, `uniqueItems`, ...) is refused, naming it: it would otherwise be
  generated and then rejected as `model_output_invalid`.
- Before conversion, every repetition bound in the schema is checked:
  `minLength`/`maxLength`/`minItems`/`maxItems`/`minProperties`/
  `maxProperties`/`minContains`/`maxContains` and every `{n}`, `{n,}`,
  `{n,m}` count in a `pattern` must be at most `MAX_REPETITION`, and a
  `pattern` must not repeat a group that holds a quantifier or an
  alternation (`pattern_is_unambiguous`: the cost of every sampled token
  grows with the ways such a group can match), nor be too ambiguous for a
  grammar sampler (`pattern_cost.pattern_is_affordable`: written-out
  repetition such as `a?a?a?…`, overlapping alternatives).
- The converter's output must be at most `MAX_GRAMMAR_CHARS` characters,
  and its groups nested at most `MAX_GRAMMAR_NESTING` deep (counted
  iteratively, outside string literals and character classes).
- The grammar's worst case is measured before it is used
  (grammar_cost.py): a grammar in which an adversarial text keeps more
  than `MAX_LIVE_STACKS` parse stacks alive at once (`a?a?a?…` written
  out, many alternatives sharing a prefix) is refused, whatever the
  schema's text looks like; the pattern rules above are the cheap early
  refusal of the same kind.
- A grammar with a rule that matches only the empty text (`enum: []`,
  `anyOf: []`, `type: []` anywhere in the schema: no value satisfies that
  part) is refused: the model could write nothing where a value must be.
- A schema beyond a limit, or one the converter rejects, is
  `GrammarUnavailable`, whose message is a safe sentence naming the
  reason; the service answers it with 400 `unsupported_capability`
  carrying that sentence, before any generation starts.
- The functions here are synchronous and CPU-bound: the service runs them
  off the event loop under a time limit (`GRAMMAR_TIME_LIMIT_S`).

The limit checks are written here because they are specific to how this
converter and parser expand schemas; no library bounds them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from ..lmsp import FunctionTool
from ..pattern_cost import pattern_is_affordable
from .grammar_cost import GrammarCostError, left_recursive, parse_gbnf, worst_case
from .pattern_grammar import UnsupportedPattern
from .schema_grammar import EmptyRange, rebase_refs, schema_to_gbnf
from .schema_keywords import unenforced_keyword

#: Largest repetition bound (a length, item or property count, a pattern count).
MAX_REPETITION = 500
#: Largest grammar text, in characters.
MAX_GRAMMAR_CHARS = 256 * 1024
#: Deepest nesting of parenthesised groups in the grammar text.
MAX_GRAMMAR_NESTING = 600
#: Most parse stacks llama.cpp may keep alive at once for a grammar (grammar_cost.py).
MAX_LIVE_STACKS = 256
#: Most stacks llama.cpp may visit advancing over one character (grammar_cost.py).
MAX_CHAR_WORK = 400
#: Seconds a grammar may take to build before the request is refused.
GRAMMAR_TIME_LIMIT_S = 5.0

_BOUND_KEYWORDS = frozenset(
    {
        "minLength",
        "maxLength",
        "minItems",
        "maxItems",
        "minProperties",
        "maxProperties",
        "minContains",
        "maxContains",
    }
)
#: Lower and upper repetition bounds that must not cross.
_RANGES = (("minLength", "maxLength"), ("minItems", "maxItems"))
_COUNT = re.compile(r"\{\s*(\d+)\s*(?:,\s*(\d*)\s*)?\}", re.ASCII)
_RULE_NAME = re.compile(r"(?<![\w-])root(?![\w-])")
#: GBNF literals and character classes (a rule name inside them is text).
_LITERALS = re.compile(r'"(?:[^"\\]|\\.)*"|\[(?:[^\]\\]|\\.)*\]')
#: A rule that matches only the empty text (`x ::= `).
_EMPTY_RULE = re.compile(r"^[\w-]+ ::=[ \t]*$", re.MULTILINE)


class GrammarUnavailable(Exception):
    """A JSON Schema cannot be turned into a llama.cpp grammar within the limits.

    `str(exc)` is a sentence for the client naming the reason (no request data).
    """


def check_grammar_cost(gbnf: str) -> None:
    """Refuse GBNF text whose worst case passes `MAX_LIVE_STACKS` or `MAX_CHAR_WORK`.

    Raises `GrammarUnavailable` (grammar_cost.py measures it; text it cannot
    read is refused too).
    """
    try:
        grammar = parse_gbnf(gbnf)
        if left_recursive(grammar):
            raise GrammarUnavailable(
                "The schema refers to itself before any value is written (a $ref loop), "
                "which cannot be enforced as a grammar."
            )
        cost = worst_case(grammar, MAX_LIVE_STACKS, MAX_CHAR_WORK)
    except GrammarCostError as exc:
        raise GrammarUnavailable(
            "The schema's grammar cannot be analysed within the limits."
        ) from exc
    if cost.over:
        raise GrammarUnavailable(
            "The schema is too ambiguous to enforce: its grammar can match the same text in "
            "too many ways at once (written-out or overlapping repetition, or alternatives "
            "that share a prefix)."
        )


def _count_too_large(digits: str) -> bool:
    return len(digits) > 6 or int(digits) > MAX_REPETITION


#: Keywords whose subschemas the converter does not turn into grammar rules.
_NOT_GRAMMAR = frozenset({"not", "if", "patternProperties"})
_COUNT_AT = re.compile(r"\{(\d+)(,(\d*))?\}", re.ASCII)


def pattern_is_unambiguous(source: str) -> bool:
    """Whether a `pattern` is free of repeated ambiguous groups (module rules).

    The Prompt API layer's `regexIsBounded` (web/prompt-api/regex-bound.js), in Python:
    false for a group that holds a quantifier or an alternation and is
    itself repeated (`*`, `+`, `{n}` with n > 1, `{n,}`, `{n,m}` with
    m > 1: `(a?){500}`, `(a|b)*`; an optional group such as `(ab+)?` is
    fine), for a backreference, and for an unbalanced or unterminated
    source. llama.cpp's grammar keeps one parse stack per way the text so
    far can be matched and checks every candidate token against each, so
    such a group multiplies the work of every sampled token (measured:
    `(a?){300}` held a generation past 30 s and stalled every other one).
    A conservative syntactic check written here because the same rule is
    the page's, and no library answers it for llama.cpp's grammar.
    """
    stack = [False]  # per open group: whether it holds a quantifier or an alternation
    last_group_risky = False
    after_atom = False
    i, size = 0, len(source)
    while i < size:
        char = source[i]
        if char == "\\":
            if i + 1 >= size or source[i + 1] in "123456789k":
                return False
            i += 2
            after_atom, last_group_risky = True, False
            continue
        if char == "[":
            i += 1
            if i < size and source[i] == "^":
                i += 1
            if i < size and source[i] == "]":
                i += 1
            while i < size and source[i] != "]":
                i += 2 if source[i] == "\\" else 1
            if i >= size:
                return False
            i += 1
            after_atom, last_group_risky = True, False
            continue
        if char == "(":
            stack.append(False)
            if source.startswith("?", i + 1):
                i += 1
                if source.startswith("<", i + 1) and source[i + 2 : i + 3] not in ("=", "!"):
                    end = source.find(">", i)
                    if end == -1:
                        return False
                    i = end
                else:
                    i += 2 if source.startswith("<", i + 1) else 1
            i += 1
            after_atom = False
            continue
        if char == ")":
            if len(stack) == 1:
                return False
            risky = stack.pop()
            last_group_risky = risky
            stack[-1] = stack[-1] or risky
            after_atom = True
            i += 1
            continue
        if char == "|":
            stack[-1] = True
            after_atom, last_group_risky = False, False
            i += 1
            continue
        counted = _COUNT_AT.match(source, i) if char == "{" else None
        if after_atom and (char in "*+?" or counted is not None):
            if counted is not None:
                low, comma, high = counted.group(1), counted.group(2), counted.group(3)
                repeats = int(low) > 1 if comma is None else high == "" or int(high) > 1
            else:
                repeats = char != "?"
            if last_group_risky and repeats:
                return False
            stack[-1] = True
            i = counted.end() if counted is not None else i + 1
            if source.startswith("?", i):
                i += 1  # lazy
            after_atom, last_group_risky = False, False
            continue
        after_atom, last_group_risky = True, False
        i += 1
    return len(stack) == 1


def check_schema_bounds(schema: Any) -> None:
    """Refuse repetition bounds above `MAX_REPETITION` anywhere in `schema`, and
    ambiguous `pattern`s (`pattern_is_unambiguous`) where the grammar follows them.

    A `pattern` under `not`, `if` or `patternProperties` is not turned into
    grammar rules (the service checks it against the output instead, in a
    killable worker), so only its counts are checked. Walks the schema
    iteratively (no recursion). Raises `GrammarUnavailable`.
    """
    stack: list[tuple[Any, bool]] = [(schema, True)]
    while stack:
        node, enforced = stack.pop()
        if isinstance(node, dict):
            for low_key, high_key in _RANGES:
                low, high = node.get(low_key, 0), node.get(high_key)
                if (
                    isinstance(low, int | float)
                    and isinstance(high, int | float)
                    and not isinstance(low, bool)
                    and not isinstance(high, bool)
                    and low > high
                ):
                    raise GrammarUnavailable(
                        f"The schema's {low_key} is above its {high_key}: no value satisfies it."
                    )
            for key, value in node.items():
                if key in _BOUND_KEYWORDS and isinstance(value, int | float):
                    if not isinstance(value, bool) and value > MAX_REPETITION:
                        raise GrammarUnavailable(
                            f"The schema has a repetition bound above {MAX_REPETITION}."
                        )
                elif key == "pattern" and isinstance(value, str):
                    for low, high in _COUNT.findall(value):
                        if _count_too_large(low) or (high and _count_too_large(high)):
                            raise GrammarUnavailable(
                                f"A pattern has a repetition count above {MAX_REPETITION}."
                            )
                    if enforced and not pattern_is_unambiguous(value):
                        raise GrammarUnavailable(
                            "A pattern repeats a group that holds a quantifier or an alternation."
                        )
                    if enforced and not pattern_is_affordable(value):
                        raise GrammarUnavailable(
                            "A pattern is too ambiguous to enforce: it can match the same text "
                            "in too many ways at once (written-out or overlapping repetition)."
                        )
                stack.append((value, enforced and key not in _NOT_GRAMMAR))
        elif isinstance(node, list):
            stack.extend((item, enforced) for item in node)


def grammar_nesting(gbnf: str) -> int:
    """The deepest nesting of `(` groups in GBNF text (literals and classes skipped)."""
    depth = deepest = 0
    i, size = 0, len(gbnf)
    while i < size:
        char = gbnf[i]
        if char in '"[':
            close = '"' if char == '"' else "]"
            i += 1
            while i < size and gbnf[i] != close:
                i += 2 if gbnf[i] == "\\" else 1
        elif char == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif char == ")":
            depth -= 1
        i += 1
    return deepest


def _convert(schema: Any) -> str:
    check_schema_bounds(schema)
    keyword = unenforced_keyword(schema)
    if keyword is not None:
        raise GrammarUnavailable(
            f"The schema uses the keyword {keyword}, which this service cannot enforce "
            "while generating."
        )
    try:
        gbnf = schema_to_gbnf(schema)
    except EmptyRange as exc:
        raise GrammarUnavailable(
            "The schema's integer bounds (minimum, maximum, exclusiveMinimum, exclusiveMaximum) "
            "leave no safe integer (of magnitude below 2**53)."
        ) from exc
    except UnsupportedPattern as exc:
        raise GrammarUnavailable(
            f"The schema uses the keyword pattern with {exc}, which this service cannot "
            "enforce while generating."
        ) from exc
    except Exception as exc:  # the converter raises bare Exceptions, KeyErrors, ...
        raise GrammarUnavailable("The schema cannot be expressed as a grammar.") from exc
    if len(gbnf) > MAX_GRAMMAR_CHARS:
        raise GrammarUnavailable("The schema's grammar is larger than the limit.")
    if grammar_nesting(gbnf) > MAX_GRAMMAR_NESTING:
        raise GrammarUnavailable("The schema's grammar is nested deeper than the limit.")
    if _EMPTY_RULE.search(gbnf):
        # `enum: []`, `anyOf: []`, `type: []`: no value is valid, and the
        # converter writes an empty rule that lets the model write nothing
        # where the value must be (invalid JSON, or no output at all).
        raise GrammarUnavailable("The schema has a part that no value can satisfy.")
    check_grammar_cost(gbnf)
    return gbnf


def json_grammar(schema: dict[str, Any]) -> str:
    """GBNF text accepting JSON text valid for `schema` (structured output, 6.1).

    Raises `GrammarUnavailable` when the schema is beyond the limits or the
    converter cannot express it.
    """
    return _convert(schema)


#: Keywords that make a schema describe something other than an object.
_NOT_OBJECT = frozenset(
    {"const", "enum", "$ref", "anyOf", "oneOf", "items", "prefixItems", "pattern", "format"}
)


def _is_object_schema(parameters: Any) -> bool:
    """Whether a tool's `parameters` describe a JSON object (the only arguments a call has)."""
    if not isinstance(parameters, dict):
        return False
    kind = parameters.get("type")
    if kind is not None:
        return bool(kind == "object" or kind == ["object"])
    return not (_NOT_OBJECT & set(parameters))


def tool_call_grammar(tools: Sequence[FunctionTool]) -> str:
    """GBNF text forcing exactly one `<tool_call>` block calling one of `tools` (6.5).

    The block holds `{"name": <tool name>, "arguments": <object valid for the
    tool's parameters>}`. Raises `GrammarUnavailable` when a tool's
    parameters are beyond the limits or cannot be expressed as a grammar.
    """
    for tool in tools:
        if not _is_object_schema(tool.parameters):
            raise GrammarUnavailable(
                "A tool's parameters must be an object schema: a tool call's arguments are "
                "a JSON object."
            )
    # Each tool's `#/...` references stay relative to its own parameters.
    at = (
        ["properties/arguments"]
        if len(tools) == 1
        else [f"anyOf/{i}/properties/arguments" for i in range(len(tools))]
    )
    variants = [
        {
            "type": "object",
            "properties": {
                "name": {"const": tool.name},
                "arguments": rebase_refs(tool.parameters, where),
            },
            "required": ["name", "arguments"],
        }
        for tool, where in zip(tools, at, strict=True)
    ]
    schema = variants[0] if len(variants) == 1 else {"anyOf": variants}
    gbnf = _convert(schema)
    rules = []
    for line in gbnf.splitlines():
        if line.startswith("root ::="):
            line = "tool-call-json ::=" + line[len("root ::=") :]
        elif line.startswith("tool-call-json ::="):
            raise GrammarUnavailable("The schema's grammar cannot be wrapped as a tool call.")
        rules.append(line)
    if any(_RULE_NAME.search(_LITERALS.sub("", rule)) for rule in rules):
        raise GrammarUnavailable("A recursive tool schema cannot be enforced.")
    rules.append('root ::= "<tool_call>\\n" tool-call-json "\\n</tool_call>"')
    return "\n".join(rules)
