"""web/js/json.js: the page's one "parse JSON text, else a default" helper.

The module has no DOM dependency, so node runs it as it is: each case
parses a text with an acceptance rule and compares the result (as JSON).
"""

from __future__ import annotations

import json
from pathlib import Path

from nodejs import needs_node, run_module

MODULE = Path(__file__).resolve().parents[2] / "web" / "js" / "json.js"

pytestmark = needs_node

SCRIPT = """
import { isObject, isObjectOrArray, parseJsonOr } from %s;
const rules = { any: undefined, isObject, isObjectOrArray, isArray: Array.isArray };
const out = JSON.parse(process.argv[1]).map(([text, rule]) =>
  parseJsonOr(text, "FALLBACK", rules[rule]));
process.stdout.write(JSON.stringify(out));
"""

CASES: list[tuple[object, str, object]] = [
    ('{"a": 1}', "isObject", {"a": 1}),
    ("[1, 2]", "isObject", "FALLBACK"),
    ("null", "isObject", "FALLBACK"),
    ("[1, 2]", "isArray", [1, 2]),
    ('{"a": 1}', "isArray", "FALLBACK"),
    ("[1]", "isObjectOrArray", [1]),
    ('"text"', "isObjectOrArray", "FALLBACK"),
    ("not json", "any", "FALLBACK"),
    ("", "any", "FALLBACK"),
    ('{"a": 1', "any", "FALLBACK"),
    ("42", "any", 42),
    ("null", "any", None),
]


def test_parse_json_or_returns_the_value_or_the_fallback() -> None:
    script = SCRIPT % json.dumps(MODULE.as_uri())
    cases = [[text, rule] for text, rule, _ in CASES]
    assert run_module(script, json.dumps(cases)) == [expected for _, _, expected in CASES]
