"""The OpenAI chat-completions mapping, by its parts (kept as one import place).

- `chat_request`: an LMSP request -> a chat-completions body (`lmsp_to_chat`).
- `chat_stream`: chat-completion chunks -> LMSP events (`ChatStreamToLmsp`,
  `chat_response_to_lmsp`); `chat_fields`: `usage_to_lmsp` and the fields both read.
- `napllm.toolcall_text`: Hermes `<tool_call>` text in the content.

New code imports from those modules; these names stay importable here.
"""

from __future__ import annotations

from .chat_fields import usage_to_lmsp
from .chat_request import ResponseFormatStyle, lmsp_to_chat
from .chat_stream import ChatStreamToLmsp, chat_response_to_lmsp

__all__ = [
    "ChatStreamToLmsp",
    "ResponseFormatStyle",
    "chat_response_to_lmsp",
    "lmsp_to_chat",
    "usage_to_lmsp",
]
