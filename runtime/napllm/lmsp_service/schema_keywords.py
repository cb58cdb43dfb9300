"""Which JSON Schema keywords the grammar keeps, and refusing the others (LMSP 1.0, 6.1, 6.5).

A schema is enforced by the grammar that llama-cpp-python's converter,
as completed by schema_grammar.py, builds from it (grammar.py). A keyword
that constrains validity but that the converter drops would let the model
write an answer the schema rejects, and the request would end
`model_output_invalid` after the whole generation. So such a keyword is
refused before generating, naming it.

Rules
- Kept by the grammar (`ENFORCED`): `type`, `properties`, `required`,
  `additionalProperties`, `items`, `prefixItems`, `minItems`, `maxItems`,
  `enum`, `const`, `anyOf`, `allOf`, `$ref`, `$defs`, `definitions`,
  `pattern`, `minLength`, `maxLength`; `minimum`, `maximum`,
  `exclusiveMinimum`, `exclusiveMaximum` of `type: "integer"` given as
  numbers (schema_grammar.py writes the range); also `oneOf` whose
  branches are distinct `const`s (disjoint, so `anyOf`'s grammar is exact).
- Refused (`REFUSED`, and `oneOf` otherwise): keywords that constrain
  validity and that the converter drops: the bounds of any other type
  (`number`: a digit grammar for a real range is not exact and cheap),
  draft 4's boolean `exclusiveMinimum`/`exclusiveMaximum`, `multipleOf`,
  `uniqueItems: true`, `minProperties` above 0, `maxProperties`,
  `contains` and its counts, `not`, `if`/`then`/`else`, `dependentRequired`,
  `dependentSchemas`, `propertyNames`, `patternProperties`,
  `unevaluatedItems`, `unevaluatedProperties`, `$dynamicRef`,
  `$recursiveRef`.
- A kept keyword is kept only where the converter reads it: it handles
  each schema by the first of its branches that applies (`$ref`, then
  `anyOf`/`oneOf`, a `type` list, `const`, `enum`, an object with
  `properties`, an `allOf` object, an array with `items`/`prefixItems`,
  `pattern`, a string `format`, a string with lengths) and drops the
  schema's other keywords. So a constraining keyword beside one that
  takes an earlier branch is refused too (`_dropped_by_branch`): e.g.
  `maxLength` beside `pattern` or under a `type` list, `minItems` without
  `items`, `prefixItems` beside `items`, a sibling of `$ref`.
- Every other keyword is an annotation for validation (JSON Schema
  2020-12: `title`, `description`, `default`, `examples`, `format` (an
  annotation unless a format vocabulary is asserted, which the output
  check does not do), `$comment`, unknown keywords) and passes.
- Only schema positions are inspected (the values of `properties`,
  `$defs`, ..., not the data of `const`, `enum`, `default`, `examples`);
  iterative, no recursion.
"""

from __future__ import annotations

import re
from typing import Any

from .schema_grammar import INTEGER_BOUNDS, SUBSCHEMA_LIST, SUBSCHEMA_MAP, SUBSCHEMA_ONE

ENFORCED = frozenset(
    {
        "type",
        "properties",
        "required",
        "additionalProperties",
        "items",
        "prefixItems",
        "minItems",
        "maxItems",
        "enum",
        "const",
        "anyOf",
        "allOf",
        "$ref",
        "$defs",
        "definitions",
        "pattern",
        "minLength",
        "maxLength",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
    }
)
REFUSED = frozenset(
    {
        "multipleOf",
        "maxProperties",
        "contains",
        "minContains",
        "maxContains",
        "not",
        "if",
        "then",
        "else",
        "dependentRequired",
        "dependentSchemas",
        "propertyNames",
        "patternProperties",
        "unevaluatedItems",
        "unevaluatedProperties",
        "$dynamicRef",
        "$recursiveRef",
    }
)


def _disjoint_consts(branches: Any) -> bool:
    """Whether a `oneOf` list holds only `{"const": ...}` branches with distinct values."""
    if not isinstance(branches, list) or not branches:
        return False
    seen: list[Any] = []
    for branch in branches:
        if not isinstance(branch, dict) or "const" not in branch:
            return False
        if any(
            key in ENFORCED or key in REFUSED or key == "oneOf" for key in branch if key != "const"
        ):
            return False
        value = branch["const"]
        if any(value == other and type(value) is type(other) for other in seen):
            return False
        seen.append(value)
    return True


#: String formats the converter writes with a rule of its own.
_OWN_RULE_FORMAT = re.compile(r"^(uuid[1-5]?|date|time|date-time)$")
#: Bounds kept for `type: "integer"` only, and only as JSON numbers (schema_grammar.py).
_INTEGER_BOUNDS = frozenset(INTEGER_BOUNDS)
#: Kept wherever they appear (`type` picks the branch; `$defs` hold no constraint).
_ALWAYS = frozenset({"type", "$defs", "definitions"})


def _branch_keeps(node: dict[str, Any]) -> frozenset[str]:
    """The kept keywords the converter reads in `node`'s branch (module rules)."""
    kind = node.get("type")
    if "$ref" in node:
        return frozenset({"$ref"})
    if "oneOf" in node or "anyOf" in node:
        return frozenset({"oneOf", "anyOf"})
    if isinstance(kind, list):
        return frozenset()
    if "const" in node:
        return frozenset({"const"})
    if "enum" in node:
        return frozenset({"enum"})
    extra = node.get("additionalProperties", True)
    if kind in (None, "object") and ("properties" in node or extra is not True):
        return frozenset({"properties", "required", "additionalProperties"})
    if kind in (None, "object") and "allOf" in node:
        return frozenset({"allOf"})
    if kind in (None, "array") and ("items" in node or "prefixItems" in node):
        if node.get("items"):
            if isinstance(node["items"], list):
                return frozenset({"items"})
            return frozenset({"items", "minItems", "maxItems"})
        return frozenset({"prefixItems", "items"})
    if kind in (None, "string") and "pattern" in node:
        return frozenset({"pattern"})
    if kind in (None, "string") and _OWN_RULE_FORMAT.match(str(node.get("format", ""))):
        return frozenset()  # these formats take the converter's own rule, lengths dropped
    if kind == "string":
        return frozenset({"minLength", "maxLength"})
    if kind == "integer":
        return _INTEGER_BOUNDS  # schema_grammar.py writes the range's digits
    return frozenset()


def _dropped_by_branch(node: dict[str, Any]) -> str | None:
    """A kept keyword of `node` that its converter branch does not read, if any."""
    keeps = _branch_keeps(node)
    for raw_key in node:
        key = str(raw_key)
        if key in ENFORCED and key not in _ALWAYS and key not in keeps:
            return key
    return None


def unenforced_keyword(schema: Any) -> str | None:
    """The first keyword of `schema` that constrains validity but is not kept by the grammar.

    Returns the keyword's name (a fixed JSON Schema word, safe to show) or
    `None` when every keyword is enforced or an annotation (module rules).
    """
    stack: list[Any] = [schema]
    while stack:
        node = stack.pop()
        if not isinstance(node, dict):
            continue
        dropped = _dropped_by_branch(node)
        for raw_key, value in node.items():
            key = str(raw_key)
            if key in REFUSED:
                return key
            if key in _INTEGER_BOUNDS and (
                isinstance(value, bool) or not isinstance(value, int | float)
            ):
                return key  # draft 4's boolean `exclusiveMinimum`: not a bound the grammar reads
            if key == "uniqueItems" and value is True:
                return key
            if key == "minProperties" and not (isinstance(value, int) and value <= 0):
                return key
            if key == "oneOf" and not _disjoint_consts(value):
                return key
            if key in SUBSCHEMA_ONE:
                stack.append(value)
            elif key in SUBSCHEMA_LIST and isinstance(value, list):
                stack.extend(value)
            elif key in SUBSCHEMA_MAP and isinstance(value, dict):
                stack.extend(value.values())
        if dropped is not None:
            return dropped
    return None
