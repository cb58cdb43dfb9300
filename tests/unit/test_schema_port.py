"""The JSON Schema 2020-12 port: jsonschema and jschon agree on shared vectors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from napllm.schema import JschonValidator, JsonschemaValidator, SchemaValidator

VECTORS = json.loads((Path(__file__).parent / "schema_vectors.json").read_text())
VALIDATORS: list[SchemaValidator] = [JsonschemaValidator(), JschonValidator()]


@pytest.mark.parametrize("validator", VALIDATORS, ids=lambda v: v.name)
@pytest.mark.parametrize("case", VECTORS["schemas"], ids=lambda c: c["name"])
def test_schema_validity_vectors(validator: SchemaValidator, case: dict[str, Any]) -> None:
    assert validator.check_schema(case["schema"]) is case["valid"]


@pytest.mark.parametrize("validator", VALIDATORS, ids=lambda v: v.name)
@pytest.mark.parametrize("case", VECTORS["instances"], ids=lambda c: json.dumps(c["instance"]))
def test_instance_vectors(validator: SchemaValidator, case: dict[str, Any]) -> None:
    assert validator.is_valid(case["schema"], case["instance"]) is case["valid"]


@pytest.mark.parametrize("validator", VALIDATORS, ids=lambda v: v.name)
@pytest.mark.parametrize("junk", [None, 3, "object", [], {"type": object()}])
def test_junk_never_raises(validator: SchemaValidator, junk: Any) -> None:
    assert validator.check_schema(junk) is False


def test_the_jschon_validator_loads_jschon_on_first_use_only() -> None:
    code = (
        "import sys\n"
        "from napllm.schema import JschonValidator\n"
        "v = JschonValidator()\n"
        "before = 'jschon' in sys.modules\n"
        "ok = v.check_schema({'type': 'object'}) and not v.is_valid({'type': 'integer'}, 'x')\n"
        "print(before, ok, 'jschon' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "runtime")},
    ).stdout.split()
    assert out == ["False", "True", "True"]
