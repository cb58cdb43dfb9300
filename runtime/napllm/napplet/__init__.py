"""NAP-LLM for napplets written in Python (runs in the napplet's frame, under Pyodide).

```python
from pydantic import BaseModel
from napllm.napplet import llm, tool

class Person(BaseModel):
    name: str
    age: int

model = await llm.select(json=True)                       # the person chooses
person = await llm.generate("Alice is 30.", response_model=Person)
async for text in llm.stream("Tell me a story."):          # deltas as they come
    print(text, end="")

@tool
def get_weather(city: str) -> str:
    "Current weather in a city."
    return "18 °C and clear"

answer = await llm.run_tools("Weather in Paris?", tools=[get_weather], max_rounds=8)
```

Everything goes through the NAP-LLM envelopes of the frame, checked by the
shell's own code before sending (`outgoing`), with the shell's chooser,
consent and limits. `llm` is the shared `Llm` (client); failures are
`LlmError` subclasses, one per NAP-LLM error code (`errors`). The mapping
to the envelopes is described in docs/napplets.md, "Napplets in Python".
"""

from __future__ import annotations

from ..records import ModelRecord as Model
from .client import Llm
from .errors import (
    ERROR_CLASSES,
    GenerationCancelledError,
    GenerationTimeoutError,
    IncompleteOutputError,
    InvalidRequestError,
    LlmError,
    OutputValidationError,
    ProtocolError,
    ProviderError,
    QuotaExceededError,
    SelectionExpiredError,
    ToolRoundsExceededError,
    UnknownCodeError,
    UnsupportedError,
    UserCancelledError,
)
from .replies import Reply
from .streams import TextStream
from .tools import Tool, run_tools, tool
from .transport import PyodideTransport, Transport

#: The napplet's shared client (its transport is made on first use).
llm = Llm()

__all__ = [
    "ERROR_CLASSES",
    "GenerationCancelledError",
    "GenerationTimeoutError",
    "IncompleteOutputError",
    "InvalidRequestError",
    "Llm",
    "LlmError",
    "Model",
    "OutputValidationError",
    "ProtocolError",
    "ProviderError",
    "PyodideTransport",
    "QuotaExceededError",
    "Reply",
    "SelectionExpiredError",
    "TextStream",
    "Tool",
    "ToolRoundsExceededError",
    "Transport",
    "UnknownCodeError",
    "UnsupportedError",
    "UserCancelledError",
    "llm",
    "run_tools",
    "tool",
]
