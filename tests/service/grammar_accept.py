"""Whether a GBNF grammar accepts a text, the way llama.cpp's grammar sampler follows it.

Built on grammar_cost.py's model of llama.cpp's parse stacks (`parse_gbnf`,
`_Walk.advance`, the same expansion as `llama_grammar_advance_stack`): the
text is accepted when, after its last character, one parse stack is empty
(the grammar may end there). Test code: it lets a test show that a schema's
grammar lets through the texts the schema allows and stops the others,
without a model.
"""

from __future__ import annotations

import random

from napllm.lmsp_service.grammar_cost import Stack, _matches, _Walk, parse_gbnf


def _start(gbnf: str) -> tuple[_Walk, dict[Stack, None]]:
    """The walk over `gbnf` (root rule `root`) and its parse stacks before any character."""
    grammar = parse_gbnf(gbnf)
    walk = _Walk(grammar, live_limit=10**9)
    roots: list[Stack] = [
        ((grammar.root, index, 0),) if alternative else ()
        for index, alternative in enumerate(walk.rules[grammar.root])
    ]
    current: dict[Stack, None] = {}
    walk.advance(roots, current)
    return walk, current


def _step(walk: _Walk, current: dict[Stack, None], char: str) -> dict[Stack, None]:
    """The parse stacks after `char` (empty when the grammar does not allow it there)."""
    moved: list[Stack] = []
    for stack in current:
        if not stack:
            continue
        element = walk.element(stack[-1])
        assert element is not None
        if _matches(element[1], ord(char)):
            top = stack[-1]
            after = (top[0], top[1], top[2] + 1)
            moved.append(stack[:-1] + ((after,) if walk.element(after) is not None else ()))
    out: dict[Stack, None] = {}
    walk.advance(moved, out)
    return out


def grammar_accepts(gbnf: str, text: str) -> bool:
    """Whether `gbnf` (root rule `root`) matches all of `text`."""
    walk, current = _start(gbnf)
    for char in text:
        current = _step(walk, current, char)
        if not current:
            return False
    return () in current


def grammar_samples(
    gbnf: str, alphabet: str, count: int, rng: random.Random, max_chars: int = 24
) -> list[str]:
    """Up to `count` random texts over `alphabet` that `gbnf` accepts whole.

    Each text is a random walk through the grammar: at every step the next
    character is drawn from the characters of `alphabet` the grammar allows
    there, and the walk ends, where the grammar may end, with probability
    1/4 (or when nothing more is allowed, or after `max_chars`). A test
    uses the texts to show that everything the grammar lets a model write
    is accepted by another reader (the validator), without a model.
    """
    walk, start = _start(gbnf)
    texts = []
    for _ in range(count):
        current, text = start, ""
        while len(text) < max_chars:
            if () in current and rng.random() < 0.25:
                break
            options = [(c, after) for c in alphabet if (after := _step(walk, current, c))]
            if not options:
                break
            char, current = rng.choice(options)
            text += char
        if () in current:
            texts.append(text)
    return texts
