"""Which free KV sequence a prompt takes (lmsp_service/prompt_cache.py), without a model."""

from __future__ import annotations

import pytest

from napllm.lmsp_service.prompt_cache import MIN_REUSE_TOKENS, KeptPrefixes, common_prefix, runs

SYSTEM = list(range(100, 100 + 2 * MIN_REUSE_TOKENS))  # a shared system prompt's ids


def test_common_prefix_compares_ids_up_to_the_limit() -> None:
    assert common_prefix([1, 2, 3], [1, 2, 4], 10) == 2
    assert common_prefix([1, 2, 3], [1, 2, 3], 2) == 2
    assert common_prefix([], [1], 10) == 0


def test_a_prompt_takes_the_free_sequence_with_the_longest_shared_prefix() -> None:
    keeper = KeptPrefixes(3)
    for _ in range(3):
        keeper.take([1], reuse=True)
    keeper.give_back(0, [*SYSTEM, 1, 2])
    keeper.give_back(1, [*SYSTEM, 5, 6, 7, 8])
    keeper.give_back(2, [9] * 40)
    assert keeper.take([*SYSTEM, 5, 6, 7, 0], reuse=True) == (1, len(SYSTEM) + 3)


def test_the_last_prompt_token_is_never_reused() -> None:
    keeper = KeptPrefixes(1)
    keeper.take([1], reuse=True)
    keeper.give_back(0, [*SYSTEM, 1, 2, 3])
    assert keeper.take(SYSTEM, reuse=True) == (0, len(SYSTEM) - 1)


def test_a_taken_sequence_is_never_offered_and_a_short_match_is_not_reused() -> None:
    keeper = KeptPrefixes(2)
    seq, _ = keeper.take([1], reuse=True)
    keeper.give_back(seq, SYSTEM)
    taken, shared = keeper.take([*SYSTEM, 1], reuse=True)
    assert (taken, shared) == (seq, len(SYSTEM))
    # The only free sequence now is the other one, which holds nothing.
    other, shared = keeper.take([*SYSTEM, 1], reuse=True)
    assert (other, shared) == (1 - seq, 0)
    assert not keeper.has_free
    keeper.give_back(other, [*SYSTEM[: MIN_REUSE_TOKENS - 1], 7, 7, 7])
    assert keeper.take([*SYSTEM, 1], reuse=True) == (other, 0)  # below MIN_REUSE_TOKENS


def test_without_reuse_the_least_recently_freed_sequence_is_taken_cleared() -> None:
    keeper = KeptPrefixes(2)
    keeper.take([1], reuse=True)
    keeper.take([1], reuse=True)
    keeper.give_back(1, SYSTEM)
    keeper.give_back(0, SYSTEM)
    assert keeper.take([*SYSTEM, 1], reuse=False) == (1, 0)
    assert keeper.kept_tokens(0) == len(SYSTEM)


def test_runs_counts_runs_of_consecutive_ids() -> None:
    assert runs(set()) == 0
    assert runs({0, 1, 2}) == 1
    assert runs({0, 1, 3}) == 2
    assert runs({0, 2}) == 2


def test_among_equal_prefixes_the_sequence_next_to_the_taken_ones_wins() -> None:
    # Taken: 0 and 1; free, least recently freed first: 3, then 2. Both hold
    # the same prompt. Sequence 3 would leave a gap (ids 0, 1, 3: two
    # decoding passes a step), so 2 is taken although freed later.
    keeper = KeptPrefixes(4)
    for _ in range(4):
        keeper.take([1], reuse=True)
    keeper.give_back(3, [*SYSTEM, 1])
    keeper.give_back(2, [*SYSTEM, 1])
    assert keeper.take([*SYSTEM, 1, 2], reuse=True) == (2, len(SYSTEM) + 1)


def test_a_longer_prefix_still_wins_over_a_gap() -> None:
    keeper = KeptPrefixes(4)
    for _ in range(4):
        keeper.take([1], reuse=True)
    keeper.give_back(3, [*SYSTEM, 1, 2, 3])
    keeper.give_back(2, [*SYSTEM, 1])
    assert keeper.take([*SYSTEM, 1, 2, 3, 4], reuse=True) == (3, len(SYSTEM) + 3)


def test_without_a_match_a_sequence_holding_nothing_is_taken_before_a_kept_one() -> None:
    keeper = KeptPrefixes(4)
    for _ in range(4):
        keeper.take([1], reuse=True)
    keeper.give_back(2, SYSTEM)  # least recently freed, holds a conversation
    keeper.give_back(3, [])
    keeper.give_back(1, [])
    # 1 and 3 hold nothing; with 0 taken, 1 keeps the ids in one run.
    assert keeper.take([7] * 20, reuse=True) == (1, 0)
    assert keeper.kept_tokens(2) == len(SYSTEM)


def test_a_sequence_is_never_freed_twice_and_none_is_taken_when_all_are() -> None:
    keeper = KeptPrefixes(1)
    seq, _ = keeper.take([1], reuse=True)
    with pytest.raises(IndexError):
        keeper.take([1], reuse=True)
    keeper.give_back(seq, [])
    with pytest.raises(ValueError):
        keeper.give_back(seq, [])  # before, the sequence was listed free twice
    assert keeper.take([1], reuse=True) == (seq, 0)
    assert not keeper.has_free
