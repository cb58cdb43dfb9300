"""Conversation rules between records (NAP-LLM, Message and Tool).

Rules, each violation `invalid-request` (NAP-LLM, Message: "Invalid
placements MUST produce `invalid-request`"):
- `toolCall` and `thinking` parts appear only in assistant messages.
- `isError` appears only on toolResult messages.
- toolResult content is only `text` and `image` parts.
- A toolResult answers exactly one call of the *immediately preceding*
  assistant turn. The results follow that assistant message directly, one
  per call, in any order, before any other message: missing, duplicate,
  orphaned (no preceding call, or a call of an earlier turn) and
  name-mismatched results are rejected.
- Call ids are unique across the supplied conversation.
- Every call of an assistant turn is answered, including the last turn of
  the conversation (a replayed toolUse turn without its results is a
  missing result).
- An explicit `toolChoice` needs a non-empty `tools`; a forced name appears
  in `tools` (NAP-LLM, Tool).
- Historical calls and results are accepted without current `tools`
  (NAP-LLM, Tool: "Historical calls and results MAY be supplied without
  current `tools`").
"""

from __future__ import annotations

from .errors import invalid
from .records import GenerationRequest, Message, ToolCallPart, ToolChoice


def validate_conversation(request: GenerationRequest) -> None:
    """Check placement, adjacency and tool-choice rules of a parsed request.

    Raises `NapError(invalid-request)` naming the first violated rule and the
    message index; returns None when the conversation is well formed.
    """
    _check_tool_choice(request)
    _check_placements(request.messages)
    _check_results(request.messages)


def _check_tool_choice(request: GenerationRequest) -> None:
    tools = request.active_tools
    if request.toolChoice is not None and not tools:
        raise invalid("An explicit toolChoice needs a non-empty tools list.")
    if isinstance(request.toolChoice, ToolChoice) and request.toolChoice.name not in {
        tool.name for tool in tools
    }:
        raise invalid("The forced tool name is not in tools.")


def _check_placements(messages: list[Message]) -> None:
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if message.isError is not None and message.role != "toolResult":
            raise invalid(f"Invalid {where}: isError is only permitted on toolResult.")
        for part in message.content:
            if part.type in ("toolCall", "thinking") and message.role != "assistant":
                raise invalid(
                    f"Invalid {where}: {part.type} parts are only permitted in assistant messages."
                )
            if message.role == "toolResult" and part.type not in ("text", "image"):
                raise invalid(f"Invalid {where}: toolResult content permits only text and image.")


def _check_results(messages: list[Message]) -> None:
    seen_ids: set[str] = set()
    pending: dict[str, str] = {}  # call id -> tool name, of the turn being answered
    answering = False  # inside the run of results right after an assistant turn
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if message.role == "toolResult":
            call_id = message.toolCallId
            assert call_id is not None  # records.Message guarantees it
            if not answering or call_id not in pending:
                if call_id in seen_ids and answering:
                    raise invalid(f"Invalid {where}: duplicate result for a tool call.")
                raise invalid(
                    f"Invalid {where}: orphaned toolResult; it must answer a call of the "
                    "immediately preceding assistant message."
                )
            if pending[call_id] != message.toolName:
                raise invalid(f"Invalid {where}: toolName does not match the call's name.")
            del pending[call_id]
            continue
        if pending:
            raise invalid(
                f"Invalid {where}: a tool call of the preceding assistant message has no result."
            )
        answering = False
        if message.role == "assistant":
            calls = [p for p in message.content if isinstance(p, ToolCallPart)]
            for call in calls:
                if call.toolCallId in seen_ids:
                    raise invalid(f"Invalid {where}: tool call ids must be unique.")
                seen_ids.add(call.toolCallId)
                pending[call.toolCallId] = call.name
            answering = bool(calls)
    if pending:
        raise invalid("Invalid messages: a tool call has no result.")
