"""Structured output: a pydantic model or a JSON Schema as `format: "json"`.

Rules (NAP-LLM, GenerationRequest `format`; Generation: "For `format:
"json"`, concatenate the text parts of a `stop` result in order; the
concatenation MUST parse as a JSON object. This does not validate the
application schema")
- The request asks for `format: "json"`; the application schema is the
  napplet's to check, and this module checks it: the answer of a `stop`
  result is parsed by the runtime's strict JSON reader and validated by the
  pydantic model (`model_validate`) or by the runtime's JSON Schema 2020-12
  validator (`schema.default_validator`). A mismatch raises
  `OutputValidationError`; finish `length` or `refusal` raises
  `IncompleteOutputError`. A wrong object is never returned.
- The schema must have root `"type": "object"` (a JSON answer is an
  object) and be a valid 2020-12 schema within the runtime's subschema
  bound; otherwise `InvalidRequestError` before anything is sent.
- Unless `schema_prompt=False`, the schema is told to the model in a system
  message put before the conversation (NAP-LLM has no schema field; the
  model needs to know the shape). That message is part of the disclosed
  request, like any other.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from ..schema import MAX_SCHEMA_SUBSCHEMAS, count_subschemas, default_validator
from .errors import IncompleteOutputError, InvalidRequestError, OutputValidationError
from .replies import Reply

#: The system message that tells the model the shape (`{schema}` is the JSON text).
SCHEMA_PROMPT = (
    "Answer with one JSON object and nothing else. The object must match this JSON Schema:\n"
    "{schema}"
)


@dataclass(frozen=True)
class Structured:
    """The requested shape of a JSON answer: `schema`, and the pydantic
    `model` it came from (None for a JSON Schema given directly)."""

    schema: dict[str, Any]
    model: type[BaseModel] | None = None

    @classmethod
    def of(
        cls, response_model: type[BaseModel] | None, schema: dict[str, Any] | None
    ) -> Structured | None:
        """The shape from `response_model` or `schema` (at most one); None for neither.

        Raises `TypeError` for both or a non-model `response_model`, and
        `InvalidRequestError` for a schema the module rules refuse.
        """
        if response_model is not None and schema is not None:
            raise TypeError("Give response_model or schema, not both.")
        if response_model is not None:
            if not (isinstance(response_model, type) and issubclass(response_model, BaseModel)):
                raise TypeError("response_model must be a pydantic BaseModel subclass.")
            shape = cls(response_model.model_json_schema(), response_model)
        elif schema is not None:
            shape = cls(dict(schema))
        else:
            return None
        shape._check()
        return shape

    def _check(self) -> None:
        if self.schema.get("type") != "object":
            raise InvalidRequestError('The answer\'s schema needs root "type": "object".')
        if count_subschemas(self.schema) > MAX_SCHEMA_SUBSCHEMAS:
            raise InvalidRequestError(
                f"The answer's schema has more than {MAX_SCHEMA_SUBSCHEMAS} subschemas."
            )
        if not default_validator().check_schema(self.schema):
            raise InvalidRequestError("The answer's schema is not a valid JSON Schema 2020-12.")

    def prompt(self) -> dict[str, Any]:
        """The system message telling the model the schema (module rules)."""
        text = SCHEMA_PROMPT.format(schema=json.dumps(self.schema, ensure_ascii=False))
        return {"role": "system", "content": [{"type": "text", "text": text}]}

    def parse(self, reply: Reply) -> Any:
        """The validated answer: an instance of `model`, or the JSON object.

        Raises `IncompleteOutputError` (finish other than `stop`) or
        `OutputValidationError` (not an object, or not matching the shape).
        """
        if reply.finish != "stop":
            raise IncompleteOutputError(reply)
        try:
            value = reply.json()
        except Exception:
            raise OutputValidationError(
                "The answer is not a JSON object.",
                reply,
                [{"type": "json", "msg": "not an object"}],
            ) from None
        if self.model is not None:
            try:
                return self.model.model_validate(value)
            except ValidationError as exc:
                errors = [dict(e) for e in exc.errors(include_url=False, include_input=False)]
                raise OutputValidationError(
                    f"The answer does not match {self.model.__name__}: "
                    f"{exc.error_count()} validation error(s).",
                    reply,
                    errors,
                ) from None
        if not default_validator().is_valid(self.schema, value):
            raise OutputValidationError(
                "The answer does not match the JSON Schema.",
                reply,
                [{"type": "schema", "msg": "does not match the JSON Schema"}],
            )
        return value
