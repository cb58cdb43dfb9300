"""The JSON Schema 2020-12 port (NAP-LLM, Tool: `parameters`).

Rules
- Tool `parameters` must be a valid JSON Schema draft 2020-12 document
  whose root has `"type": "object"`; a malformed schema is
  `invalid-request` (NAP-LLM, Tool).
- Checking goes through one small port, `SchemaValidator`, so that each
  environment uses a well-kept validator that loads there: `jsonschema`
  under CPython, `jschon` (pure Python) in Pyodide, where `jsonschema`
  cannot load because `rpds-py` has no WebAssembly wheel. Shared test
  vectors (tests/unit/test_schema_port.py) prove both agree.
- Dialect: a tool schema is a JSON Schema 2020-12 document. `$schema` may
  appear only at the document's root, and only as
  `https://json-schema.org/draft/2020-12/schema` (exactly; no fragment).
  Any other value (draft-07, 2019-09, the URI with `#`, anything else) and
  `$schema` inside a subschema make the schema invalid (`invalid-request`):
  the same rule in both validators (`uses_other_dialect`), because
  jsonschema's `Draft202012Validator` ignores `$schema` while jschon
  follows it, and a provider may read a declared draft-07 schema by
  draft-07's rules. The shared vectors (tests/unit/schema_vectors.json,
  also run in Pyodide) pin it.
- The port answers two questions: is a schema valid (`check_schema`), and
  does an instance satisfy it (`is_valid`, used for `format: json` checks
  by the LMSP service and tests). It never raises for bad input: it
  returns a boolean.
"""

from __future__ import annotations

import functools
import json
from collections import OrderedDict
from typing import Any, Protocol

from .pattern_cost import pattern_is_affordable

DIALECT = "https://json-schema.org/draft/2020-12/schema"
#: How many schema verdicts `JschonValidator` keeps (by canonical JSON text).
CHECKED_SCHEMAS_KEPT = 64

# 2020-12 keywords whose value is a schema, a list of schemas, or a map of schemas
_ONE = frozenset(
    {
        "additionalProperties",
        "contains",
        "else",
        "if",
        "items",
        "not",
        "propertyNames",
        "then",
        "unevaluatedItems",
        "unevaluatedProperties",
        "contentSchema",
    }
)
_LIST = frozenset({"allOf", "anyOf", "oneOf", "prefixItems"})
_MAP = frozenset({"$defs", "properties", "patternProperties", "dependentSchemas"})


def _subschemas(node: Any) -> list[Any]:
    """The schemas directly under `node`'s 2020-12 applicator keywords."""
    found: list[Any] = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key in _ONE:
                found.append(value)
            elif key in _LIST and isinstance(value, list):
                found.extend(value)
            elif key in _MAP and isinstance(value, dict):
                found.extend(value.values())
    return found


def uses_other_dialect(schema: Any) -> bool:
    """Whether `schema` declares a dialect other than 2020-12 (module rules).

    True when the root's `$schema` is present and not exactly `DIALECT`, or
    when any subschema (reached through the 2020-12 applicator keywords,
    iteratively) carries `$schema` at all.
    """
    if not isinstance(schema, dict):
        return False
    if "$schema" in schema and schema["$schema"] != DIALECT:
        return True
    stack = _subschemas(schema)
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if "$schema" in node:
                return True
            stack.extend(_subschemas(node))
    return False


#: Most subschemas (the root and every schema under an applicator keyword)
#: one request's tool schemas may hold together. The page checks each
#: against the 2020-12 metaschema with jschon on its only thread, before
#: consent, at about 10 ms a subschema (measured: a schema of 1,000
#: properties took 10 s); this bounds that work to about a second or two.
MAX_SCHEMA_SUBSCHEMAS = 128


def count_subschemas(schema: Any, limit: int = MAX_SCHEMA_SUBSCHEMAS) -> int:
    """The subschemas of `schema`, counted up to `limit + 1` (then it stops).

    Counts the root and every schema reached through the 2020-12 applicator
    keywords (the walk of `uses_other_dialect`); iterative, so a deep
    document costs no recursion. Never raises.
    """
    stack: list[Any] = [schema]
    count = 0
    while stack and count <= limit:
        count += 1
        stack.extend(_subschemas(stack.pop()))
    return count


def has_costly_pattern(schema: Any) -> bool:
    """Whether any `pattern` of `schema`'s subschemas is too ambiguous for a grammar sampler.

    Walks the subschemas as `count_subschemas` does (callers bound their
    number first) and applies `pattern_cost.pattern_is_affordable` to each
    string `pattern` (docs/security.md, "grammar cost"). Never raises.
    """
    stack: list[Any] = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            pattern = node.get("pattern")
            if isinstance(pattern, str) and not pattern_is_affordable(pattern):
                return True
        stack.extend(_subschemas(node))
    return False


class SchemaValidator(Protocol):
    """A JSON Schema draft 2020-12 validator."""

    name: str

    def check_schema(self, schema: Any) -> bool:
        """Whether `schema` is a valid 2020-12 schema (against the metaschema)."""
        ...

    def is_valid(self, schema: Any, instance: Any) -> bool:
        """Whether `instance` satisfies `schema` (a schema already checked)."""
        ...


class JsonschemaValidator:
    """`jsonschema`'s `Draft202012Validator` (CPython)."""

    name = "jsonschema"

    def __init__(self) -> None:
        import jsonschema

        self._cls = jsonschema.Draft202012Validator
        self._error = jsonschema.SchemaError

    def check_schema(self, schema: Any) -> bool:
        """Metaschema check, then every `$ref` must resolve inside the document.

        `check_schema` alone accepts a dangling `$ref`; jschon rejects it, and
        a tool schema the provider cannot resolve is malformed, so both
        validators agree on rejecting it.
        """
        if uses_other_dialect(schema):
            return False
        try:
            self._cls.check_schema(schema)
            if isinstance(schema, dict):
                from referencing import Registry
                from referencing.jsonschema import DRAFT202012

                resource = DRAFT202012.create_resource(schema)
                resolver = (
                    Registry()
                    .with_resource("urn:napllm:tool", resource)
                    .resolver(base_uri="urn:napllm:tool")
                )
                for ref in _refs(schema):
                    resolver.lookup(ref)
        except self._error:
            return False
        except Exception:  # unresolvable refs, pathological schemas: never crash
            return False
        return True

    def is_valid(self, schema: Any, instance: Any) -> bool:
        """Validate `instance`; any validator failure counts as invalid."""
        try:
            return bool(self._cls(schema).is_valid(instance))
        except Exception:
            return False


class JschonValidator:
    """`jschon` with the 2020-12 metaschema (pure Python; runs in Pyodide).

    jschon is imported and its catalogue built on the first check, not when
    the validator is made: in the browser that is about a second of Python
    work, which would otherwise delay every start of the shell although most
    requests carry no JSON schema.
    """

    name = "jschon"

    def __init__(self) -> None:
        self._verdicts: OrderedDict[str, bool] = OrderedDict()

    def _schema(self, schema: Any) -> Any:
        import jschon

        _jschon_catalog()
        return jschon.JSONSchema(_plain(schema), metaschema_uri=jschon.URI(DIALECT))

    def check_schema(self, schema: Any) -> bool:
        """Metaschema check, then reference resolution (an unresolvable `$ref` is invalid).

        Verdicts are kept by the schema's canonical JSON text (the last
        `CHECKED_SCHEMAS_KEPT`): a napplet sends the same tools with every
        request, and jschon's check costs about 10 ms a subschema.
        """
        if not isinstance(schema, dict | bool) or uses_other_dialect(schema):
            return False
        try:
            key = json.dumps(schema, sort_keys=True, ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError, RecursionError):
            return False
        known = self._verdicts.get(key)
        if known is not None:
            self._verdicts.move_to_end(key)
            return known
        try:
            verdict = bool(self._schema(schema).validate().valid)
        except Exception:
            verdict = False
        self._verdicts[key] = verdict
        while len(self._verdicts) > CHECKED_SCHEMAS_KEPT:
            self._verdicts.popitem(last=False)
        return verdict

    def is_valid(self, schema: Any, instance: Any) -> bool:
        """Validate `instance`; any validator failure counts as invalid."""
        try:
            import jschon

            result = self._schema(schema).evaluate(jschon.JSON(_plain(instance)))
            return bool(result.valid)
        except Exception:
            return False


@functools.cache
def _jschon_catalog() -> Any:
    import jschon

    return jschon.create_catalog("2020-12")


def _refs(node: Any) -> list[str]:
    """Every string `$ref` in a schema document, depth first."""
    found: list[str] = []
    stack = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, dict):
            ref = current.get("$ref")
            if isinstance(ref, str):
                found.append(ref)
            stack.extend(current.values())
        elif isinstance(current, list):
            stack.extend(current)
    return found


def _plain(value: Any) -> Any:
    """A deep copy through JSON, so validators never share caller objects."""
    return json.loads(json.dumps(value))


_default: SchemaValidator | None = None


def default_validator() -> SchemaValidator:
    """The validator for this environment: jsonschema if importable, else jschon."""
    global _default
    if _default is None:
        try:
            _default = JsonschemaValidator()
        except ImportError:
            _default = JschonValidator()
    return _default


def set_default_validator(validator: SchemaValidator) -> None:
    """Choose the validator explicitly (the browser edge and tests do)."""
    global _default
    _default = validator
