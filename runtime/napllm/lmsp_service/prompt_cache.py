"""Prompt reuse across requests: which free KV sequence a new prompt takes (docs/lmsp.md 9.5).

A sequence whose generation ended keeps its KV state, and `KeptPrefixes`
remembers the exact token ids that state holds (the prompt and the
generated tokens that were decoded, in order). A new prompt takes the free
sequence whose kept ids share the longest exact prefix with it; the model
worker then removes the KV cells past that prefix and decodes only the
rest (batching.py).

Rules
- Token ids, never text, are compared: two prompts share a KV prefix only
  when their first `n` ids are equal, so a conversation never reads
  another's history (a different system prompt or first message diverges
  at its first differing id, and nothing past it is kept).
- Only free sequences are candidates: a sequence a generation holds is
  never reused (the batching loop frees a sequence only when its
  generation ended, and the keeper forgets it while it is taken).
- At most `len(prompt) - 1` ids are reused, so the last prompt token is
  always decoded again: its logits are the first token's distribution.
- A shared prefix shorter than `MIN_REUSE_TOKENS` is not worth a sequence
  that may hold a longer conversation: a free sequence that holds nothing
  is taken instead, else the least recently freed one, and it is cleared.
- Among equal choices (free sequences sharing the same prefix, or free
  sequences that hold nothing), the one that keeps the taken sequence ids
  in fewest runs of consecutive ids wins, then the least recently freed:
  llama.cpp decodes sequences with cells of their own in one pass per run
  of consecutive ids (batching.py), so a gap costs a pass over the weights.
  A sequence holding a conversation is never given up for this.
- The state lives in the model worker's memory only: a crash or restart of
  the worker starts with nothing kept (a new worker, a new keeper).
"""

from __future__ import annotations

from collections.abc import Sequence

#: Shared ids below which a prompt takes the least recently freed sequence instead.
MIN_REUSE_TOKENS = 8


def common_prefix(kept: Sequence[int], prompt: Sequence[int], limit: int) -> int:
    """Length of the longest equal prefix of `kept` and `prompt`, at most `limit` ids."""
    n = min(len(kept), len(prompt), limit)
    i = 0
    while i < n and kept[i] == prompt[i]:
        i += 1
    return i


def runs(ids: set[int]) -> int:
    """How many runs of consecutive integers `ids` falls into ({0, 1, 3}: 2)."""
    return sum(1 for i in ids if i - 1 not in ids)


class KeptPrefixes:
    """The free KV sequences of one context and the token ids each one still holds.

    `slots`: sequences 0..slots-1, all free and empty at first. `take`
    gives a free sequence to a prompt (and how many of its ids are already
    in that sequence's KV cells); `give_back` returns a sequence with the
    ids its KV cells hold (an empty list when they were cleared). Not
    thread-safe: the batching loop's thread calls both.
    """

    def __init__(self, slots: int) -> None:
        self._free: list[int] = list(range(slots))  # least recently freed first
        self._kept: dict[int, list[int]] = {}
        self._taken: set[int] = set()

    @property
    def has_free(self) -> bool:
        """Whether a sequence is free."""
        return bool(self._free)

    def take(self, prompt: Sequence[int], reuse: bool) -> tuple[int, int]:
        """A free sequence for `prompt` and the number of its leading ids to reuse.

        Returns `(seq, shared)`: the caller must remove the KV cells of
        `seq` from position `shared` on before decoding `prompt[shared:]`.
        `shared` is 0 when `reuse` is false or no free sequence shares at
        least `MIN_REUSE_TOKENS` ids; it is never `len(prompt)` (module
        rules). Raises `IndexError` when no sequence is free.
        """
        if not self._free:
            raise IndexError("no free sequence")
        shared = 0
        lengths: dict[int, int] = {}
        if reuse:
            lengths = {
                seq: common_prefix(self._kept.get(seq, ()), prompt, len(prompt) - 1)
                for seq in self._free
            }
            shared = max(lengths.values(), default=0)
        if shared >= MIN_REUSE_TOKENS:
            choices = [seq for seq in self._free if lengths[seq] == shared]
        else:
            shared = 0
            # Nothing to reuse: a sequence holding nothing, else the least recently freed.
            choices = [seq for seq in self._free if seq not in self._kept] or self._free[:1]
        best = min(choices, key=lambda seq: runs(self._taken | {seq}))  # stable: LRU on ties
        self._free.remove(best)
        self._kept.pop(best, None)
        self._taken.add(best)
        return best, shared

    def give_back(self, seq: int, held: list[int]) -> None:
        """Free `seq`, whose KV cells hold exactly the ids `held` (positions 0..len-1).

        Raises `ValueError` for a sequence that is not taken (freed twice,
        or never handed out): it would be handed out twice.
        """
        if seq not in self._taken:
            raise ValueError("a sequence given back that is not taken")
        if held:
            self._kept[seq] = held
        self._taken.remove(seq)
        self._free.append(seq)

    def kept_tokens(self, seq: int) -> int:
        """Ids kept for free sequence `seq` (0 when none); for tests and statistics."""
        return len(self._kept.get(seq, ()))
