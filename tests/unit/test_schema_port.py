"""The JSON Schema 2020-12 port: jsonschema and jschon agree on shared vectors."""

from __future__ import annotations

import json
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
