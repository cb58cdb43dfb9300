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
- A kept keyword is kept only as far as the converter reads it:
  `type` beside `$ref`, `anyOf`/`oneOf`, `const` or `enum` (which the
  converter follows instead) only where it says nothing more (each
  branch's own `type` is the same; each value is of that type);
  `oneOf` and `anyOf` not side by side (it reads one); `required` only
  of names in `properties` (it writes no other property); `allOf` only
  of plain object branches (`properties`, `required`, `type: "object"`
  and annotations, each name in one branch only: it merges their
  properties and reads nothing else).
- A `$ref` is `#` or a JSON Pointer through schema positions (`#/$defs/x`,
  `#/properties/a/items`, ...) without percent-encoding: a pointer into
  data (`#/$defs/x/const`) would make data a schema that no check saw.
  `$id` only at the root (a base URI that changes would resolve
  references elsewhere than the converter does).
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


_JSON_TYPES: dict[str, Any] = {
    "null": lambda v: v is None,
    "boolean": lambda v: isinstance(v, bool),
    "string": lambda v: isinstance(v, str),
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "integer": lambda v: (
        (isinstance(v, int) and not isinstance(v, bool))
        or (isinstance(v, float) and v.is_integer())
    ),
}
#: What an `allOf` branch may hold: the converter merges `properties` only.
_ALLOF_BRANCH_KEYS = frozenset(
    {"properties", "required", "type", "title", "description", "$comment", "examples", "default"}
)


def _type_says_more(node: dict[str, Any]) -> bool:
    """Whether `node`'s `type` constrains more than the branch the converter takes."""
    kind = node["type"]
    if "$ref" in node:
        return True
    for key in ("oneOf", "anyOf"):
        if key in node:
            branches = node[key]
            return not isinstance(branches, list) or any(
                not isinstance(b, dict)
                or (b.get("type") != kind and not ("const" in b and _of_type(b["const"], kind)))
                for b in branches
            )
    if isinstance(kind, list):
        return False  # its own branch: a `const` or `enum` beside it is refused as dropped
    if "const" in node:
        return not _of_type(node["const"], kind)
    if "enum" in node:
        values = node["enum"]
        return not isinstance(values, list) or not all(_of_type(v, kind) for v in values)
    return False


def _of_type(value: Any, kind: Any) -> bool:
    check = _JSON_TYPES.get(kind) if isinstance(kind, str) else None
    return bool(check and check(value))


def _allof_is_plain(branches: Any) -> bool:
    """Whether every `allOf` branch is one the converter merges exactly (module rules)."""
    if not isinstance(branches, list):
        return False
    names: set[str] = set()
    for branch in branches:
        if not isinstance(branch, dict) or not set(branch) <= _ALLOF_BRANCH_KEYS:
            return False
        if branch.get("type", "object") != "object":
            return False
        properties = branch.get("properties", {})
        required = branch.get("required", [])
        if not isinstance(properties, dict) or not isinstance(required, list):
            return False
        if not set(map(str, required)) <= set(properties) or names & set(properties):
            return False
        names |= set(properties)
    return True


def _pointer_is_schema(ref: str) -> bool:
    """Whether a `$ref` is `#` or a pointer through schema positions only (module rules)."""
    if ref == "#":
        return True
    if not ref.startswith("#/") or "%" in ref:
        return False
    parts = ref[2:].split("/")
    i = 0
    while i < len(parts):
        key = parts[i]
        named = i + 1 < len(parts)  # a name or an index follows
        indexed = named and parts[i + 1].isdigit()
        if (key in SUBSCHEMA_MAP and named) or (key in SUBSCHEMA_LIST | {"items"} and indexed):
            i += 2
        elif key in SUBSCHEMA_ONE:
            i += 1
        else:
            return False
    return True


def _reads_less(node: dict[str, Any], root: bool) -> str | None:
    """A kept keyword of `node` that its converter branch reads only in part (module rules)."""
    keeps = _branch_keeps(node)
    if "type" in node and _type_says_more(node):
        return "type"
    if "oneOf" in node and "anyOf" in node:
        return "anyOf"
    if "required" in node and "required" in keeps:
        properties = node.get("properties", {})
        required = node["required"]
        if not isinstance(required, list) or not isinstance(properties, dict):
            return "required"
        if not set(map(str, required)) <= set(properties):
            return "required"
    if "allOf" in keeps and not _allof_is_plain(node["allOf"]):
        return "allOf"
    ref = node.get("$ref")
    if ref is not None and (not isinstance(ref, str) or not _pointer_is_schema(ref)):
        return "$ref"
    if "$id" in node and not root:
        return "$id"
    return None


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
        dropped = _dropped_by_branch(node) or _reads_less(node, node is schema)
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
