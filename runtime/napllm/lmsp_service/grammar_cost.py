"""The worst case of a GBNF grammar's parse stacks, before any generation (docs/security.md).

llama.cpp follows a grammar by keeping one parse stack per way the text so
far can be matched; for every sampled token it checks every candidate of
the vocabulary against every stack, and advancing a stack over an accepted
character can fan out into many more. A grammar whose stacks multiply
(`a?a?a?…`, many alternatives that share a prefix) makes every token of
its generation cost seconds, whatever the schema's text looks like. So the
service measures the grammar it built, the way llama.cpp will run it.

Rules
- `parse_gbnf` reads GBNF text (the subset llama.cpp's parser accepts:
  rules, literals, character classes, `.`, rule references, groups,
  alternatives, `*`, `+`, `?`, `{m}`, `{m,}`, `{m,n}`, comments) and
  rewrites groups and repetitions into rules the way llama.cpp's parser
  does (`S?` is `S' ::= S |`, `S*` is `S' ::= S S' |`, `S{m,n}` is `m`
  copies then nested optional rules).
- `worst_case_stacks` expands the start rule's stacks exactly as
  llama.cpp's `llama_grammar_advance_stack` does (identical stacks
  counted once), then walks adversarially: at each character it tries one
  representative of every class of characters that the live stacks'
  terminals tell apart, follows the one that leaves the most live stacks (a state
  already visited is not followed again), and returns the largest number
  of live stacks met.
- Work is bounded: at most `MAX_STEPS` characters, `MAX_OPERATIONS` stack
  operations (a push costs one, plus one per `DEPTH_COST` elements of the
  stack copied) and stacks `MAX_STACK_DEPTH` deep. Reaching more than
  `limit` live stacks stops the walk at once (over the limit); running out
  of steps or operations ends it with the worst count met so far (what
  lies beyond is bounded by the model worker's grammar budgets,
  batching.py).
- Raises `GrammarCostError` for text it cannot read. Pure Python, no
  recursion; written here because it models llama.cpp's own sampler.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..pattern_cost import complement_ranges

#: Characters followed from the start of the grammar at most.
MAX_STEPS = 256
#: Stack pushes and matches the walk may make in all.
MAX_OPERATIONS = 200_000
#: Stack elements copied per operation counted.
DEPTH_COST = 16
#: Deepest parse stack followed.
MAX_STACK_DEPTH = 2_000

_NAME = re.compile(r"[A-Za-z0-9_-]+")
_COUNT = re.compile(r"\{\s*(\d+)\s*(?:(,)\s*(\d*)\s*)?\}", re.ASCII)
_ESCAPES = {"n": 10, "r": 13, "t": 9, "\\": 92, '"': 34, "[": 91, "]": 93, "-": 45, "/": 47}
_MAX_CHAR = 0x10FFFF

# An element: ("c", ((lo, hi), ...)) a character in one of the ranges, or ("r", name).
Element = tuple[str, object]
Position = tuple[int, int, int]  # (rule, alternative, element)
Stack = tuple[Position, ...]


class GrammarCostError(ValueError):
    """The GBNF text cannot be read, or the walk met a stack beyond `MAX_STACK_DEPTH`."""


class Grammar:
    """GBNF rules as llama.cpp holds them: `rules[i]` is a list of alternatives.

    Each alternative is a list of elements (`("c", ranges)` or `("r", i)`);
    `root` is the index of the start rule.
    """

    def __init__(self) -> None:
        self.names: dict[str, int] = {}
        self.rules: list[list[list[Element]] | None] = []
        self.root = -1

    def rule_id(self, name: str) -> int:
        """The index of rule `name`, allocated on first use."""
        if name not in self.names:
            self.names[name] = len(self.rules)
            self.rules.append(None)
        return self.names[name]

    def new_rule(self, alternatives: list[list[Element]]) -> int:
        """A generated rule (groups, repetitions)."""
        self.rules.append(alternatives)
        return len(self.rules) - 1


def _char(text: str, i: int) -> tuple[int, int]:
    """The code point at `text[i]` (escapes decoded) and the index after it."""
    if text[i] != "\\":
        return ord(text[i]), i + 1
    if i + 1 >= len(text):
        raise GrammarCostError("unterminated escape")
    kind = text[i + 1]
    if kind in "xuU":
        width = {"x": 2, "u": 4, "U": 8}[kind]
        digits = text[i + 2 : i + 2 + width]
        if len(digits) != width or not all(c in "0123456789abcdefABCDEF" for c in digits):
            raise GrammarCostError("bad escape")
        return int(digits, 16), i + 2 + width
    # Known escapes, and any other escaped character as itself (the
    # converter writes `\.`; llama.cpp refuses what it does not know anyway).
    return _ESCAPES.get(kind, ord(kind)), i + 2


def _skip(text: str, i: int, newlines: bool) -> int:
    while i < len(text):
        c = text[i]
        if c == "#":
            while i < len(text) and text[i] not in "\r\n":
                i += 1
        elif c in " \t" or (newlines and c in "\r\n"):
            i += 1
        else:
            break
    return i


def _repeat(grammar: Grammar, symbol: list[Element], low: int, high: int | None) -> list[Element]:
    """llama.cpp's rewrite of `symbol{low,high}` (`high` None: unbounded)."""
    out = symbol * low
    if high is None:
        rec = grammar.new_rule([])
        grammar.rules[rec] = [[*symbol, ("r", rec)], []]
        return [*out, ("r", rec)]
    tail: int | None = None
    for _ in range(high - low):
        tail = grammar.new_rule([symbol + ([("r", tail)] if tail is not None else []), []])
    return out + ([("r", tail)] if tail is not None else [])


def parse_gbnf(text: str) -> Grammar:
    """Read GBNF `text` into a `Grammar` whose start rule is `root`.

    Raises `GrammarCostError` for text llama.cpp's parser would refuse
    (unknown syntax, undefined rules, no `root`).
    """
    grammar = Grammar()
    i = _skip(text, 0, True)
    while i < len(text):
        name = _NAME.match(text, i)
        if name is None:
            raise GrammarCostError("expected a rule name")
        i = _skip(text, name.end(), False)
        if not text.startswith("::=", i):
            raise GrammarCostError("expected ::=")
        rule = grammar.rule_id(name.group())
        if grammar.rules[rule] is not None:
            raise GrammarCostError("rule defined twice")
        # Alternatives of the open groups; the outermost is the rule itself.
        groups: list[list[list[Element]]] = [[[]]]
        i = _skip(text, i + 3, False)
        while True:
            if i >= len(text) or text[i] in "\r\n":
                if len(groups) > 1:
                    i = _skip(text, i, True)
                    continue
                break
            alternative = groups[-1][-1]
            c = text[i]
            start = len(alternative)
            if c == '"':
                i += 1
                while i < len(text) and text[i] != '"':
                    point, i = _char(text, i)
                    alternative.append(("c", ((point, point),)))
                if i >= len(text):
                    raise GrammarCostError("unterminated literal")
                i += 1
            elif c == "[":
                i += 1
                negated = text.startswith("^", i)
                i += 1 if negated else 0
                ranges: list[tuple[int, int]] = []
                while i < len(text) and text[i] != "]":
                    first, i = _char(text, i)
                    upper = first
                    if text.startswith("-", i) and i + 1 < len(text) and text[i + 1] != "]":
                        upper, i = _char(text, i + 1)
                    ranges.append((first, upper))
                if i >= len(text):
                    raise GrammarCostError("unterminated class")
                i += 1
                if negated:
                    ranges = list(complement_ranges(ranges))
                alternative.append(("c", tuple(ranges)))
            elif c == ".":
                alternative.append(("c", ((0, _MAX_CHAR),)))
                i += 1
            elif c == "(":
                groups.append([[]])
                i += 1
            elif c == ")":
                if len(groups) == 1:
                    raise GrammarCostError("unbalanced )")
                sub = groups.pop()
                groups[-1][-1].append(("r", grammar.new_rule(sub)))
                i += 1
                alternative = groups[-1][-1]
                start = len(alternative) - 1
            elif c == "|":
                groups[-1].append([])
                i += 1
            elif _NAME.match(text, i):
                ref = _NAME.match(text, i)
                assert ref is not None
                alternative.append(("r", grammar.rule_id(ref.group())))
                i = ref.end()
            else:
                raise GrammarCostError("unexpected character")
            i = _skip(text, i, len(groups) > 1)
            # postfix operators apply to the symbol just read
            while i < len(text) and (text[i] in "*+?" or text[i] == "{"):
                if start >= len(alternative):
                    raise GrammarCostError("operator without a symbol")
                symbol = alternative[start:]
                del alternative[start:]
                if text[i] == "{":
                    count = _COUNT.match(text, i)
                    if count is None:
                        raise GrammarCostError("bad repetition")
                    if max(len(count.group(1)), len(count.group(3) or "")) > 4:
                        raise GrammarCostError("repetition count above the limit")
                    low = int(count.group(1))
                    high: int | None = low
                    if count.group(2):
                        high = int(count.group(3)) if count.group(3) else None
                    i = count.end()
                else:
                    low, high = {"*": (0, None), "+": (1, None), "?": (0, 1)}[text[i]]
                    i += 1
                if high is not None and high < low:
                    raise GrammarCostError("bad repetition")
                alternative.extend(_repeat(grammar, symbol, low, high))
                i = _skip(text, i, len(groups) > 1)
        if len(groups) != 1:
            raise GrammarCostError("unbalanced (")
        grammar.rules[rule] = groups[0]
        i = _skip(text, i, True)
    if any(rules is None for rules in grammar.rules):
        raise GrammarCostError("undefined rule")
    if "root" not in grammar.names:
        raise GrammarCostError("no root rule")
    grammar.root = grammar.names["root"]
    return grammar


class _Walk:
    """The stack sets of one adversarial walk, with the operations budget."""

    def __init__(self, grammar: Grammar, live_limit: int) -> None:
        self.rules: list[list[list[Element]]] = [r or [] for r in grammar.rules]
        self.live_limit = live_limit
        self.operations = 0
        self.over = False  # `out` passed the live limit

    def element(self, pos: Position) -> Element | None:
        alternative = self.rules[pos[0]][pos[1]]
        return alternative[pos[2]] if pos[2] < len(alternative) else None

    def advance(self, stacks: list[Stack], out: dict[Stack, None]) -> int | None:
        """Expand each of `stacks` until every top is a character (llama.cpp's advance_stack).

        Each stack is expanded on its own, as llama.cpp does; the results
        go to `out` (ordered, identical stacks once). Returns the stacks
        visited (the work), or `None` when the budget runs out or `out`
        passes the live limit (`self.over`).
        """
        work = 0
        for start in stacks:
            todo = [start]
            seen: set[Stack] = set()
            while todo:
                stack = todo.pop()
                if stack in seen:
                    continue
                seen.add(stack)
                work += 1
                self.operations += 1 + len(stack) // DEPTH_COST
                if self.operations > MAX_OPERATIONS:
                    return None
                if len(stack) > MAX_STACK_DEPTH:
                    raise GrammarCostError("parse stack deeper than the limit")
                element = self.element(stack[-1]) if stack else None
                if element is None or element[0] == "c":
                    out[stack] = None
                    if len(out) > self.live_limit:
                        self.over = True
                        return None
                    continue
                top = stack[-1]
                rest = stack[:-1]
                after = (top[0], top[1], top[2] + 1)
                if self.element(after) is not None:
                    rest = (*rest, after)
                rule = element[1]
                assert isinstance(rule, int)
                for index, alternative in enumerate(self.rules[rule]):
                    todo.append((*rest, (rule, index, 0)) if alternative else rest)
        return work


def _matches(ranges: object, point: int) -> bool:
    return any(low <= point <= high for low, high in ranges)  # type: ignore[attr-defined]


@dataclass(frozen=True)
class Cost:
    """The worst case an adversarial walk met (module rules).

    `live`: the most parse stacks alive at once; `work`: the most stacks
    llama.cpp visits advancing over one character (what each candidate
    token's check repeats); `over`: a limit was passed (the walk stopped
    there, so the counts are lower bounds).
    """

    live: int
    work: int
    over: bool


def worst_case(grammar: Grammar, live_limit: int, work_limit: int) -> Cost:
    """Walk `grammar` adversarially and report its worst `Cost` (module rules).

    The walk stops as soon as more than `live_limit` stacks are alive or
    one character's advance visits more than `work_limit` stacks (`over`).
    Raises `GrammarCostError` for a stack deeper than `MAX_STACK_DEPTH`.
    """
    walk = _Walk(grammar, live_limit)
    current: dict[Stack, None] = {}
    # An empty alternative of the start rule is an empty (complete) stack,
    # as in llama.cpp's grammar init (`root ::= ` is `{"enum": []}`'s grammar).
    roots: list[Stack] = [
        ((grammar.root, a, 0),) if alternative else ()
        for a, alternative in enumerate(walk.rules[grammar.root])
    ]
    first = walk.advance(roots, current)
    if first is None:
        return Cost(len(current), 0, walk.over)
    live, work = len(current), 0
    visited = {frozenset(current)}
    for _ in range(MAX_STEPS):
        # Stacks whose terminals accept the same characters lead to the same next set.
        stacks = [s for s in current if s]
        groups: dict[object, list[int]] = {}
        for index, stack in enumerate(stacks):
            element = walk.element(stack[-1])
            assert element is not None
            groups.setdefault(element[1], []).append(index)
        # One character per class that these terminals tell apart.
        cuts = {0}
        for ranges in groups:
            for low, high in ranges:  # type: ignore[attr-defined]
                cuts.add(low)
                if high < _MAX_CHAR:
                    cuts.add(high + 1)
        walk.operations += len(cuts) * len(groups) // DEPTH_COST
        by_matching: dict[tuple[int, ...], None] = {}
        for point in sorted(cuts):
            matching = tuple(
                i for ranges, members in groups.items() if _matches(ranges, point) for i in members
            )
            if matching:
                by_matching[matching] = None
        best: tuple[int, int, dict[Stack, None]] | None = None
        for matching in by_matching:
            moved: list[Stack] = []
            for i in matching:
                stack = stacks[i]
                top = stack[-1]
                after = (top[0], top[1], top[2] + 1)
                moved.append(stack[:-1] + ((after,) if walk.element(after) is not None else ()))
            nxt: dict[Stack, None] = {}
            step_work = walk.advance(moved, nxt)
            if step_work is None:
                return Cost(max(live, len(nxt)), work, walk.over)
            work = max(work, step_work)
            if work > work_limit:
                return Cost(live, work, True)
            key = frozenset(nxt)
            if key not in visited and (best is None or (step_work, len(nxt)) > best[:2]):
                best = (step_work, len(nxt), nxt)
        if best is None:
            break
        current = best[2]
        visited.add(frozenset(current))
        live = max(live, len(current))
    return Cost(live, work, False)


def left_recursive(grammar: Grammar) -> bool:
    """Whether a rule of `grammar` can reach itself before reading a character.

    llama.cpp refuses such a grammar when its sampler is made
    (`llama_grammar_detect_left_recursion`), so a schema whose references
    loop without any text between (`a: {"$ref": a}`, `a: {"anyOf": [a,
    ...]}`) failed only once its generation started. Same rule here:
    a rule's left edges go to the rules its alternatives start with, past
    every rule that can match the empty text; a cycle of left edges is
    left recursion. Iterative (fixpoint, then Kahn's algorithm).
    """
    rules = [r or [] for r in grammar.rules]
    nullable = [False] * len(rules)
    changed = True
    while changed:
        changed = False
        for index, alternatives in enumerate(rules):
            if nullable[index]:
                continue
            if any(
                all(kind == "r" and nullable[int(ref)] for kind, ref in alternative)  # type: ignore[call-overload]
                for alternative in alternatives
            ):
                nullable[index] = changed = True
    edges: list[set[int]] = [set() for _ in rules]
    for index, alternatives in enumerate(rules):
        for alternative in alternatives:
            for kind, ref in alternative:
                if kind != "r":
                    break
                edges[index].add(int(ref))  # type: ignore[call-overload]
                if not nullable[int(ref)]:  # type: ignore[call-overload]
                    break
    incoming = [0] * len(rules)
    for targets in edges:
        for target in targets:
            incoming[target] += 1
    ready = [index for index, count in enumerate(incoming) if count == 0]
    removed = 0
    while ready:
        index = ready.pop()
        removed += 1
        for target in edges[index]:
            incoming[target] -= 1
            if incoming[target] == 0:
                ready.append(target)
    return removed < len(rules)
