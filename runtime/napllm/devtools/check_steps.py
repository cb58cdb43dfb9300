"""`napllm-check`'s steps file: one action per step, validated before the browser starts.

The format is in `check`'s module docstring and docs/napplets.md; a bad
file raises `StepsError` with the position (`path: message`).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..jsontext import JsonTextError, read_json


class _Step(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


Selector = Annotated[str, Field(min_length=1, max_length=500)]


class ClickStep(_Step):
    click: Selector


class FillStep(_Step):
    fill: Selector
    text: str


class PressStep(_Step):
    press: Annotated[str, Field(min_length=1, max_length=50)]
    selector: Selector | None = None


class WaitForTextStep(_Step):
    waitForText: Annotated[str, Field(min_length=1)]
    selector: Selector = "body"
    timeoutMs: Annotated[int, Field(ge=1, le=600_000)] | None = None


class ChooserStep(_Step):
    chooser: Literal["allow", "cancel"]
    connection: str | None = None


class ConsentStep(_Step):
    consent: Literal["allow", "deny", "cancel"]
    remember: bool = False


class WaitStep(_Step):
    wait: Annotated[int, Field(ge=0, le=600_000)]


class ReloadStep(_Step):
    reload: Literal[True]


Step = (
    ClickStep
    | FillStep
    | PressStep
    | WaitForTextStep
    | ChooserStep
    | ConsentStep
    | WaitStep
    | ReloadStep
)
_STEP_MODELS: dict[str, type[_Step]] = {
    "click": ClickStep,
    "fill": FillStep,
    "press": PressStep,
    "waitForText": WaitForTextStep,
    "chooser": ChooserStep,
    "consent": ConsentStep,
    "wait": WaitStep,
    "reload": ReloadStep,
}


class StepsError(ValueError):
    """A steps file that cannot be used; the message says where and why."""


def _read(text: str, what: str) -> Any:
    try:
        return read_json(text)
    except JsonTextError as exc:
        position = ""
        try:
            json.loads(text)
        except json.JSONDecodeError as err:
            position = f" at line {err.lineno}, column {err.colno}"
        raise StepsError(f"{what}: {str(exc).rstrip('.')}{position}") from None


def parse_steps(text: str) -> list[Step]:
    """A steps file's JSON text as steps; raises `StepsError` (positioned)."""
    value = _read(text, "steps")
    if not isinstance(value, list):
        raise StepsError("steps: a JSON list of steps")
    steps: list[Step] = []
    for index, raw in enumerate(value):
        if not isinstance(raw, dict):
            raise StepsError(f"steps[{index}]: a step must be a JSON object")
        actions = [key for key in _STEP_MODELS if key in raw]
        if len(actions) != 1:
            raise StepsError(
                f"steps[{index}]: a step needs exactly one of {', '.join(_STEP_MODELS)}"
            )
        try:
            step = _STEP_MODELS[actions[0]].model_validate(raw)
        except ValidationError as exc:
            error = exc.errors(include_input=False, include_url=False)[0]
            loc = ".".join(str(p) for p in error["loc"] if not str(p).startswith(("str", "int")))
            raise StepsError(f"steps[{index}].{loc}: {error['msg']}") from None
        steps.append(step)  # type: ignore[arg-type]
    return steps


def describe_step(step: Step) -> str:
    """A one-line description of a step for reports."""
    return json.dumps(step.model_dump(exclude_none=True), ensure_ascii=False)
