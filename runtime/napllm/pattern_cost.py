"""The worst case of a JSON Schema `pattern` in a grammar-constrained sampler (docs/security.md).

A grammar sampler (llama.cpp's, which the LMSP service and local engines
use) follows a pattern by keeping every way the text so far can be matched
alive at once, and checks each candidate token against each of them. A
pattern whose ways multiply costs every token of its generation that much
more, and one generation's sampling can hold every other one. The text of
the pattern does not show it: `(a?){300}` and `a?a?a?…` (300 copies) are
the same language. So the cost is computed on the pattern's automaton.

Rules
- `pattern_cost` parses an ECMA-262 pattern (the subset JSON Schema
  patterns use: literals, escapes, classes, `.`, groups of every kind,
  alternation, `*`, `+`, `?`, `{n}`, `{n,}`, `{n,m}`, lazy forms; anchors
  and lookarounds match no character) into its position automaton (each
  character-matching atom is a position; `first`, `follow`), counted
  repetitions written out.
- It then walks adversarially: from the first positions, at each step it
  tries one character of every class the live positions' atoms tell apart and
  follows the one whose step does the most work (the positions reached
  through every live position that accepts it, counted with repeats, as a
  sampler expands each of its stacks on its own); a set of positions
  already visited is not followed again.
- `PatternCost.live` is the most positions alive at once, `work` the most
  work of one character. `pattern_is_affordable` answers whether both stay
  within `MAX_LIVE` and `MAX_WORK`, the bounds of the LMSP service's
  grammar check (lmsp_service/grammar.py) scaled to a pattern.
- Bounded: at most `MAX_POSITIONS` positions and `MAX_EDGES` edges (more
  is not affordable), `MAX_STEPS` steps; no recursion. The Prompt API layer's copy of this
  rule is web/prompt-api/regex-bound.js (`patternIsAffordable`); the two
  change together. Pure Python: it runs in Pyodide as well.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

#: Most positions alive at once (ways of matching the text so far).
MAX_LIVE = 64
#: Most positions reached over one character, counted with repeats.
MAX_WORK = 400
#: Largest automaton built (character atoms once repetitions are written out).
MAX_POSITIONS = 4000
#: Largest number of automaton edges (position to following position).
MAX_EDGES = 200_000
#: Characters walked at most.
MAX_STEPS = 256
_MAX_CHAR = 0x10FFFF
_COUNT = re.compile(r"\{(\d+)(,(\d*))?\}", re.ASCII)
_CLASS_ESCAPES = {
    "d": ((48, 57),),
    "w": ((48, 57), (65, 90), (95, 95), (97, 122)),
    "s": ((9, 13), (32, 32), (160, 160), (0x2028, 0x2029), (0xFEFF, 0xFEFF)),
}
_CHAR_ESCAPES = {"n": 10, "r": 13, "t": 9, "f": 12, "v": 11, "0": 0}


class PatternTooCostly(ValueError):
    """The pattern cannot be read, or its automaton is larger than `MAX_POSITIONS`."""


def complement_ranges(ranges: Iterable[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """The code points (0..U+10FFFF) outside inclusive `ranges`, as sorted inclusive ranges.

    Shared by this module's negated classes and the LMSP service's grammar
    cost walk (`lmsp_service.grammar_cost`), whose GBNF has the same `[^...]`.
    """
    out, low = [], 0
    for start, end in sorted(ranges):
        if start > low:
            out.append((low, start - 1))
        low = max(low, end + 1)
    if low <= _MAX_CHAR:
        out.append((low, _MAX_CHAR))
    return tuple(out)


class _Frag:
    """A sub-automaton: its positions' `first`, `last` sets and whether it matches empty."""

    __slots__ = ("first", "last", "nullable")

    def __init__(self, first: list[int], last: list[int], nullable: bool) -> None:
        self.first, self.last, self.nullable = first, last, nullable


class _Builder:
    def __init__(self) -> None:
        self.ranges: list[tuple[tuple[int, int], ...]] = []
        self.follow: list[set[int]] = []
        self.edges = 0

    def link(self, sources: list[int], targets: list[int]) -> None:
        """Add an edge from each of `sources` to each of `targets`, within `MAX_EDGES`."""
        self.edges += len(sources) * len(targets)
        if self.edges > MAX_EDGES:
            raise PatternTooCostly("automaton larger than the limit")
        for p in sources:
            self.follow[p].update(targets)

    def atom(self, ranges: tuple[tuple[int, int], ...]) -> _Frag:
        if len(self.ranges) >= MAX_POSITIONS:
            raise PatternTooCostly("automaton larger than the limit")
        self.ranges.append(ranges)
        self.follow.append(set())
        index = len(self.ranges) - 1
        return _Frag([index], [index], False)

    def concat(self, a: _Frag, b: _Frag) -> _Frag:
        self.link(a.last, b.first)
        first = a.first + b.first if a.nullable else a.first
        last = a.last + b.last if b.nullable else b.last
        return _Frag(first, last, a.nullable and b.nullable)

    def copy(self, frag_span: tuple[int, int], frag: _Frag) -> _Frag:
        """A fresh copy of the positions `frag_span` (start, end) that make `frag`."""
        start, end = frag_span
        shift = len(self.ranges) - start
        if len(self.ranges) + end - start > MAX_POSITIONS:
            raise PatternTooCostly("automaton larger than the limit")
        for p in range(start, end):
            self.ranges.append(self.ranges[p])
            self.follow.append({q + shift for q in self.follow[p] if start <= q < end})
            self.edges += len(self.follow[-1])
        if self.edges > MAX_EDGES:
            raise PatternTooCostly("automaton larger than the limit")
        return _Frag([p + shift for p in frag.first], [p + shift for p in frag.last], frag.nullable)

    def repeat(self, span: tuple[int, int], frag: _Frag, low: int, high: int | None) -> _Frag:
        """`frag{low,high}` (`high` None: unbounded), copies written out.

        The optional copies nest as a grammar writes them (`x{0,3}` is
        `(x(x(x)?)?)?`), so a bounded count adds no ambiguity of its own.
        """
        copies = max(low, 1 if high is None else high)
        if copies == 0:
            return _Frag([], [], True)
        parts = [frag] + [self.copy(span, frag) for _ in range(copies - 1)]
        if high is None:  # the last copy loops
            last = parts[-1]
            self.link(last.last, last.first)
            if low == 0:
                return _Frag(last.first, last.last, True)
        tail = _Frag([], [], True)
        for part in reversed(parts[low:]):  # T_j = (c_j T_j+1)?
            joined = self.concat(part, tail)
            tail = _Frag(joined.first, joined.last, True)
        out = _Frag([], [], True)
        for part in parts[:low]:
            out = self.concat(out, part)
        return self.concat(out, tail)


def _escape(source: str, i: int) -> tuple[tuple[tuple[int, int], ...] | None, int]:
    """The ranges of the escape at `source[i]` (a backslash), `None` for an assertion."""
    if i + 1 >= len(source):
        raise PatternTooCostly("unterminated escape")
    c = source[i + 1]
    if c.lower() in _CLASS_ESCAPES:
        ranges = _CLASS_ESCAPES[c.lower()]
        return (complement_ranges(ranges) if c.isupper() else ranges), i + 2
    if c in "bB":
        return None, i + 2
    if c in _CHAR_ESCAPES:
        return ((_CHAR_ESCAPES[c],) * 2,), i + 2
    if c in "xu":
        if c == "u" and source.startswith("{", i + 2):
            end = source.find("}", i + 3)
            digits = source[i + 3 : end] if end != -1 else ""
            nxt = end + 1
        else:
            width = 2 if c == "x" else 4
            digits, nxt = source[i + 2 : i + 2 + width], i + 2 + width
            if len(digits) != width:
                digits = ""
        if digits and all(d in "0123456789abcdefABCDEF" for d in digits) and len(digits) <= 6:
            point = min(int(digits, 16), _MAX_CHAR)
            return ((point, point),), nxt
        return ((ord(c), ord(c)),), i + 2
    if c == "c" and i + 2 < len(source) and source[i + 2].isalpha():
        point = ord(source[i + 2]) % 32
        return ((point, point),), i + 3
    if c in "123456789k":
        raise PatternTooCostly("backreference")
    return ((ord(c), ord(c)),), i + 2


def _class(source: str, i: int) -> tuple[tuple[tuple[int, int], ...], int]:
    """The ranges of the class starting at `source[i]` (`[`) and the index after it."""
    i += 1
    negated = source.startswith("^", i)
    i += 1 if negated else 0
    ranges: list[tuple[int, int]] = []
    while i < len(source) and source[i] != "]":
        if source[i] == "\\":
            got, i = _escape(source, i)
            item = got if got is not None else ((8, 8),)  # \b in a class: backspace
        else:
            item = ((ord(source[i]), ord(source[i])),)
            i += 1
        if (
            len(item) == 1
            and item[0][0] == item[0][1]
            and source.startswith("-", i)
            and i + 1 < len(source)
            and source[i + 1] != "]"
        ):
            if source[i + 1] == "\\":
                upper, i = _escape(source, i + 1)
            else:
                upper, i = ((ord(source[i + 1]),) * 2,), i + 2
            if upper is None or len(upper) != 1 or upper[0][0] != upper[0][1]:
                ranges += [*item, (45, 45), *(upper or ())]
            else:
                ranges.append((min(item[0][0], upper[0][0]), max(item[0][0], upper[0][0])))
            continue
        ranges += list(item)
    if i >= len(source):
        raise PatternTooCostly("unterminated class")
    result = tuple(ranges)
    return (complement_ranges(result) if negated else result), i + 1


class _Frame:
    """An open group: its alternatives, the sequence so far and its pending last atom."""

    def __init__(self, start: int, look: bool = False) -> None:
        self.alternatives: list[_Frag] = []
        self.seq = _Frag([], [], True)
        self.last: tuple[tuple[int, int], _Frag] | None = None  # (span, fragment)
        self.start = start  # the group's first position
        self.look = look  # a lookaround: matches no character

    def push(self, b: _Builder, frag: _Frag, span: tuple[int, int]) -> None:
        if self.last is not None:
            self.seq = b.concat(self.seq, self.last[1])
        self.last = (span, frag)

    def close(self, b: _Builder) -> None:
        seq = self.seq if self.last is None else b.concat(self.seq, self.last[1])
        self.alternatives.append(seq)
        self.seq, self.last = _Frag([], [], True), None

    def union(self) -> _Frag:
        alts = self.alternatives
        return _Frag(
            [p for a in alts for p in a.first],
            [p for a in alts for p in a.last],
            any(a.nullable for a in alts),
        )


def _automaton(source: str) -> tuple[_Builder, _Frag]:
    """Parse `source` into the position automaton (module rules). Iterative."""
    b = _Builder()
    stack = [_Frame(0)]
    i, size = 0, len(source)
    while i < size:
        c = source[i]
        frame = stack[-1]
        if c == "(":
            opened = _Frame(len(b.ranges))
            stack.append(opened)
            if source.startswith("?", i + 1):
                if source.startswith("<", i + 2) and source[i + 3 : i + 4] not in ("=", "!"):
                    end = source.find(">", i)
                    if end == -1:
                        raise PatternTooCostly("unterminated group name")
                    i = end + 1
                    continue
                kind = source[i + 2 : i + 3]
                opened.look = kind in ("=", "!", "<")
                i += 4 if kind == "<" else 3
                continue
            i += 1
            continue
        if c in "|)":
            frame.close(b)
            i += 1
            if c == "|":
                continue
            if len(stack) == 1:
                raise PatternTooCostly("unbalanced )")
            stack.pop()
            group = _Frag([], [], True) if frame.look else frame.union()
            stack[-1].push(b, group, (frame.start, len(b.ranges)))
            continue
        if c in "*+?{":
            low, high, nxt = 0, None, i + 1
            if c == "+":
                low = 1
            elif c == "?":
                high = 1
            elif c == "{":
                count = _COUNT.match(source, i)
                if count is None:
                    frame.push(b, *_literal(b, c))  # a literal brace
                    i += 1
                    continue
                if len(count.group(1)) > 6 or len(count.group(3) or "") > 6:
                    raise PatternTooCostly("repetition count too large")
                low = int(count.group(1))
                if count.group(2) is None:
                    high = low
                else:
                    high = int(count.group(3)) if count.group(3) else None
                nxt = count.end()
            if frame.last is None:
                raise PatternTooCostly("quantifier without an atom")
            if high is not None and high < low:
                raise PatternTooCostly("bad repetition")
            span, frag = frame.last
            repeated = b.repeat(span, frag, low, high)
            frame.last = ((span[0], len(b.ranges)), repeated)
            i = nxt + (1 if source.startswith("?", nxt) else 0)
            continue
        start = len(b.ranges)
        if c == "[":
            ranges, i = _class(source, i)
            frame.push(b, b.atom(ranges), (start, start + 1))
        elif c == "\\":
            found, i = _escape(source, i)
            if found is None:
                frame.push(b, _Frag([], [], True), (start, start))
            else:
                frame.push(b, b.atom(found), (start, start + 1))
        elif c in "^$":
            frame.push(b, _Frag([], [], True), (start, start))
            i += 1
        elif c == ".":
            any_but_newline = complement_ranges(((10, 10), (13, 13), (0x2028, 0x2029)))
            frame.push(b, b.atom(any_but_newline), (start, start + 1))
            i += 1
        else:
            frame.push(b, *_literal(b, c))
            i += 1
    if len(stack) != 1:
        raise PatternTooCostly("unbalanced (")
    stack[0].close(b)
    return b, stack[0].union()


def _literal(b: _Builder, c: str) -> tuple[_Frag, tuple[int, int]]:
    start = len(b.ranges)
    return b.atom(((ord(c), ord(c)),)), (start, start + 1)


@dataclass(frozen=True)
class PatternCost:
    """What the adversarial walk met: `live` positions at once, `work` of one character."""

    live: int
    work: int


def pattern_cost(source: str) -> PatternCost:
    """The worst case of `source` for a grammar sampler (module rules).

    Raises `PatternTooCostly` for a pattern it cannot read (also a
    backreference) or whose automaton passes `MAX_POSITIONS`.
    """
    b, whole = _automaton(source)
    current = frozenset(whole.first)
    live, work = len(current), 0
    visited = {current}
    for _ in range(MAX_STEPS):
        if live > MAX_LIVE:
            break
        # One character per class that the live positions tell apart.
        cuts = {0}
        for position in current:
            for low, high in b.ranges[position]:
                cuts.add(low)
                if high < _MAX_CHAR:
                    cuts.add(high + 1)
        by_matching: dict[frozenset[int], None] = {}
        for point in sorted(cuts):
            matching = frozenset(
                p for p in current if any(lo <= point <= hi for lo, hi in b.ranges[p])
            )
            if matching:
                by_matching[matching] = None
        best: tuple[int, int, frozenset[int]] | None = None
        for matching in by_matching:
            step_work = sum(len(b.follow[p]) for p in matching)
            nxt = frozenset(q for p in matching for q in b.follow[p])
            work = max(work, step_work)
            live = max(live, len(nxt))
            if nxt not in visited and (best is None or (step_work, len(nxt)) > best[:2]):
                best = (step_work, len(nxt), nxt)
        if best is None or work > MAX_WORK or live > MAX_LIVE:
            break
        current = best[2]
        visited.add(current)
    return PatternCost(live, work)


def pattern_is_affordable(source: str) -> bool:
    """Whether `source` stays within `MAX_LIVE` and `MAX_WORK` (module rules); false
    for a pattern that cannot be read or is too large."""
    try:
        cost = pattern_cost(source)
    except (PatternTooCostly, RecursionError):
        return False
    return cost.live <= MAX_LIVE and cost.work <= MAX_WORK
