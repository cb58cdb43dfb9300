"""Which JSON Schema keywords the grammar keeps, and refusing the others (LMSP 1.0, 6.1, 6.5).

A schema is enforced by the grammar llama-cpp-python's converter builds
from it (grammar.py). A keyword that constrains validity but that the
converter drops would let the model write an answer the schema rejects,
and the request would end `model_output_invalid` after the whole
generation. So such a keyword is refused before generating, naming it.

Rules
- Kept by the grammar (`ENFORCED`): `type`, `properties`, `required`,
  `additionalProperties`, `items`, `prefixItems`, `minItems`, `maxItems`,
  `enum`, `const`, `anyOf`, `allOf`, `$ref`, `$defs`, `definitions`,
  `pattern`, `minLength`, `maxLength`; also `oneOf` whose branches are
  distinct `const`s (disjoint, so `anyOf`'s grammar is exact).
- Refused (`REFUSED`, and `oneOf` otherwise): keywords that constrain
  validity and that the converter drops: number bounds and `multipleOf`,
  `uniqueItems: true`, `minProperties` above 0, `maxProperties`,
  `contains` and its counts, `not`, `if`/`then`/`else`, `dependentRequired`,
  `dependentSchemas`, `propertyNames`, `patternProperties`,
  `unevaluatedItems`, `unevaluatedProperties`, `$dynamicRef`,
  `$recursiveRef`.
- Every other keyword is an annotation for validation (JSON Schema
  2020-12: `title`, `description`, `default`, `examples`, `format` (an
  annotation unless a format vocabulary is asserted, which the output
  check does not do), `$comment`, unknown keywords) and passes.
- Only schema positions are inspected (the values of `properties`,
  `$defs`, ..., not the data of `const`, `enum`, `default`, `examples`);
  iterative, no recursion.
"""

from __future__ import annotations

from typing import Any

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
    }
)
REFUSED = frozenset(
    {
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
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
_ONE = frozenset(
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
_LIST = ("allOf", "anyOf", "oneOf", "prefixItems")
_MAP = ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas")


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
        for raw_key, value in node.items():
            key = str(raw_key)
            if key in REFUSED:
                return key
            if key == "uniqueItems" and value is True:
                return key
            if key == "minProperties" and not (isinstance(value, int) and value <= 0):
                return key
            if key == "oneOf" and not _disjoint_consts(value):
                return key
            if key in _ONE:
                stack.append(value)
            elif key in _LIST and isinstance(value, list):
                stack.extend(value)
            elif key in _MAP and isinstance(value, dict):
                stack.extend(value.values())
    return None
