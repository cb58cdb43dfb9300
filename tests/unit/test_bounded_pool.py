"""The killable child processes the LMSP service evaluates schemas in (lmsp_service/bounded.py)."""

from __future__ import annotations

import asyncio
import os
import re
import time

import pytest

from napllm.lmsp_service.bounded import BoundedCallFailed, BoundedPool, BoundExceeded, PoolBusy

#: Python's backtracking `re` takes about 2**n steps on n characters with this pattern.
HOSTILE_PATTERN = "(?:.|.)*\\x00"


async def _max_loop_gap(stop: asyncio.Event) -> float:
    """The longest time the event loop did not run this task, until `stop` (seconds)."""
    worst = 0.0
    last = time.monotonic()
    while not stop.is_set():
        await asyncio.sleep(0.01)
        now = time.monotonic()
        worst = max(worst, now - last)
        last = now
    return worst


async def test_a_backtracking_match_is_killed_at_the_deadline_and_the_loop_keeps_running() -> None:
    pool = BoundedPool(1, preload=("re",))
    pool.start()
    try:
        assert await pool.call(30, re.findall, "a+", "caab") == ["aa"]  # warm
        stop = asyncio.Event()
        ticker = asyncio.create_task(_max_loop_gap(stop))
        started = time.monotonic()
        with pytest.raises(BoundExceeded):
            # 2**60 steps: longer than any test run, unless it is killed.
            await pool.call(1.0, re.search, HOSTILE_PATTERN, "a" * 60)
        elapsed = time.monotonic() - started
        stop.set()
        gap = await ticker
        assert elapsed < 3.0, elapsed
        assert gap < 0.5, gap
        assert pool.killed == 1
        # The killed child was replaced: the next call is answered.
        assert await pool.call(30, re.findall, "x+", "xxx") == ["xxx"]
    finally:
        pool.close()


async def test_exceptions_come_back_and_a_dead_child_is_replaced() -> None:
    pool = BoundedPool(1)
    try:
        with pytest.raises(ValueError):
            await pool.call(30, int, "not a number")
        with pytest.raises(BoundedCallFailed):
            await pool.call(30, os._exit, 3)
        assert await pool.call(30, int, "41") == 41
    finally:
        pool.close()


async def test_a_replacements_start_up_is_not_charged_to_the_next_call() -> None:
    # A child whose modules take long to import still gets its call's whole limit.
    pool = BoundedPool(1, preload=("jsonschema", "pydantic", "napllm.schema", "napllm.lmsp"))
    try:
        assert await pool.call(0.5, len, "abc") == 3
    finally:
        pool.close()


async def test_a_call_that_grows_without_bound_ends_with_memory_error() -> None:
    pool = BoundedPool(1, memory_limit_bytes=512 * 1024**2)
    try:
        with pytest.raises(MemoryError):
            await pool.call(30, bytearray, 4 * 1024**3)
        assert await pool.call(30, len, "abc") == 3
    finally:
        pool.close()


async def test_waiting_for_a_busy_child_is_bounded_and_a_caller_leaving_frees_nothing_early() -> (
    None
):
    pool = BoundedPool(1)
    try:
        await pool.call(30, len, "")  # started
        busy = asyncio.create_task(pool.call(1.5, re.search, HOSTILE_PATTERN, "a" * 60))
        await asyncio.sleep(0.2)
        with pytest.raises(PoolBusy):
            await pool.call(30, len, "x", queue_wait_s=0.3)  # no child free within 0.3 s
        busy.cancel()  # the caller leaves; the child is still busy until its deadline
        with pytest.raises(asyncio.CancelledError):
            await busy
        started = time.monotonic()
        assert await pool.call(30, len, "xy") == 2
        assert time.monotonic() - started > 0.5  # it waited for the deadline's kill
    finally:
        pool.close()
