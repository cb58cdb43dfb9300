"""web/js/json.js: the page's one "parse JSON text, else a default" helper.

The module has no DOM dependency, so node runs it as it is: each case
parses a text with an acceptance rule and compares the result (as JSON).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

MODULE = Path(__file__).resolve().parents[2] / "web" / "js" / "json.js"

pytestmark = pytest.mark.skipif(shutil.which("node") is None, reason="needs node")

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
    done = subprocess.run(
        ["node", "--input-type=module", "-e", script, json.dumps(cases)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert json.loads(done.stdout) == [expected for _, _, expected in CASES]
