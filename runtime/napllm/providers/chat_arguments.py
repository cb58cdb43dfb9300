"""A tool call's arguments text, received in fragments (LMSP 6.5, OpenAI `tool_calls`).

`ChatStreamToLmsp` (chat_stream.py) appends each `arguments` fragment a
server streams here and asks whether the text is already one whole JSON
value (a server that repeats the call's name starts a new call only then).

Rules
- Work is linear in the text: every fragment is scanned once (brackets
  and strings), and the strict reader (`jsontext.read_json`) runs at most
  once per value, only when the scan sees one top-level value followed by
  nothing but whitespace; its verdict is kept.
- A top-level scalar (no brackets or quotes) is parsed only up to
  `MAX_SCALAR_ARGUMENTS` characters; arguments are objects, so a longer
  scalar is never complete.
"""

from __future__ import annotations

import re

from .chat_fields import is_complete_json

#: Longest top-level scalar (a number or literal, no brackets or quotes)
#: still parsed to see whether it is complete; call arguments are objects.
MAX_SCALAR_ARGUMENTS = 1024
_WHITESPACE = " \t\r\n"
_SPECIAL = re.compile(r'[\\"{}\[\]]')


class ArgumentsText:
    """A tool call's arguments text, appended piece by piece.

    Why not a `str` grown with `+=`: each piece copied the whole text, and
    `complete()` parsed it whole at every fragment that repeated the call's
    name, so 50,000 fragments of 20 characters (1 MB, what a server sends
    in a few MB of SSE) took 85 s of the page's only thread. Pieces are
    joined when the text is read; `complete()` runs the strict reader only
    when a scan kept across pieces (brackets and strings, linear in the
    text) finds one top-level value followed by nothing but whitespace, and
    keeps the reader's verdict until something else than whitespace
    arrives, so every piece is scanned once and parsed at most once.
    """

    def __init__(self) -> None:
        """An empty text."""
        self._pieces: list[str] = []
        self._joined = ""
        self._depth = 0
        self._in_string = False
        self._escape = False
        self._started = ""  # first non-whitespace character: "{", "[", '"' or other
        self._ended = False  # the top-level value has ended
        self._extra = False  # something else than whitespace came after it
        self._length = 0
        self._verdict: bool | None = None  # the reader's, since the value ended

    def __bool__(self) -> bool:
        """Whether any character arrived."""
        return self._length > 0

    def append(self, piece: str) -> None:
        """Add `piece` to the text (linear in `piece`)."""
        if not piece:
            return
        self._pieces.append(piece)
        self._length += len(piece)
        self._scan(piece)

    @property
    def text(self) -> str:
        """The whole text so far."""
        if len(self._pieces) > 1 or (self._pieces and self._pieces[0] is not self._joined):
            self._joined = "".join(self._pieces)
            self._pieces = [self._joined]
        return self._joined

    def complete(self) -> bool:
        """Whether the text is one strict JSON value (`jsontext.read_json`)."""
        if self._extra or not self._started:
            return False
        if self._started not in '{["':
            return self._length <= MAX_SCALAR_ARGUMENTS and is_complete_json(self.text)
        if not self._ended:
            return False
        if self._verdict is None:
            self._verdict = is_complete_json(self.text)
        return self._verdict

    def _scan(self, piece: str) -> None:
        if self._extra:
            return
        pos = 0
        if not self._started:
            rest = piece.lstrip(_WHITESPACE)
            if not rest:
                return
            self._started = rest[0]
            pos = len(piece) - len(rest)
        if self._started not in '{["':
            return  # a scalar: parsed whole by `complete`, within its bound
        if self._escape:  # the previous piece ended in a backslash
            self._escape = False
            pos += 1
        if self._ended:
            self._extra = bool(piece[pos:].strip(_WHITESPACE))
            return
        skip = pos  # a backslash escapes the next character, whatever it is
        for match in _SPECIAL.finditer(piece, pos):
            at = match.start()
            if at < skip:
                continue
            char = match.group()
            if self._in_string:
                if char == "\\":
                    skip = at + 2
                    self._escape = skip > len(piece)
                    continue
                if char != '"':
                    continue
                self._in_string = False
            elif char == '"':
                self._in_string = True
                continue
            elif char in "{[":
                self._depth += 1
                continue
            elif char in "}]":
                self._depth -= 1
            if self._depth <= 0 and not self._in_string:
                self._ended = True
                self._extra = bool(piece[at + 1 :].strip(_WHITESPACE))
                return
