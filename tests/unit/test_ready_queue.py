"""The page loop's ready callbacks in batches (napllm.browser.loop.ReadyQueue).

Driven here with a stand-in for the browser: lists of scheduled microtasks
and tasks that the test runs by hand, and a clock it moves.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable, Iterator

import pytest

from napllm.browser.loop import ReadyQueue


class Browser:
    """Microtasks and tasks scheduled by a `ReadyQueue`, run by the test."""

    def __init__(self) -> None:
        self.microtasks: list[Callable[[], None]] = []
        self.tasks: list[Callable[[], None]] = []
        self.now = 0.0
        self.entered = 0

    def queue(self, loop: asyncio.AbstractEventLoop, budget_s: float = 1.0) -> ReadyQueue:
        def enter() -> None:
            self.entered += 1

        return ReadyQueue(
            loop,
            self.microtasks.append,
            self.tasks.append,
            clock=lambda: self.now,
            enter=enter,
            budget_s=budget_s,
        )

    def run_microtasks(self) -> None:
        while self.microtasks:
            self.microtasks.pop(0)()

    def run_task(self) -> None:
        self.tasks.pop(0)()
        self.run_microtasks()


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def test_callbacks_run_in_order_in_one_microtask(loop: asyncio.AbstractEventLoop) -> None:
    browser = Browser()
    queue = browser.queue(loop)
    ran: list[object] = []
    for i in range(5):
        queue.call_soon(ran.append, i)
    # One drain is scheduled however many callbacks wait; nothing ran yet.
    assert len(browser.microtasks) == 1
    assert ran == []
    browser.run_microtasks()
    assert ran == [0, 1, 2, 3, 4]
    assert queue.passes == 1 and browser.entered == 1
    assert browser.tasks == []
    # Once drained, the next callback schedules a new pass.
    queue.call_soon(ran.append, 5)
    assert len(browser.microtasks) == 1
    browser.run_microtasks()
    assert ran[-1] == 5 and queue.passes == 2


def test_callbacks_made_ready_during_a_pass_run_in_it(loop: asyncio.AbstractEventLoop) -> None:
    browser = Browser()
    queue = browser.queue(loop)
    ran: list[int] = []

    def chain(n: int) -> None:
        ran.append(n)
        if n < 10:
            queue.call_soon(chain, n + 1)

    queue.call_soon(chain, 0)
    browser.run_microtasks()
    assert ran == list(range(11))
    assert queue.passes == 1


def test_a_spent_budget_continues_in_a_new_task(loop: asyncio.AbstractEventLoop) -> None:
    browser = Browser()
    queue = browser.queue(loop, budget_s=0.004)
    ran: list[int] = []

    def slow(n: int) -> None:
        ran.append(n)
        browser.now += 0.003  # each callback takes 3 ms

    for i in range(4):
        queue.call_soon(slow, i)
    browser.run_microtasks()
    # 3 ms, then 6 ms >= 4 ms: the pass stops after the second callback.
    assert ran == [0, 1]
    assert len(browser.tasks) == 1 and browser.microtasks == []
    # A callback queued meanwhile waits for the scheduled pass (no second one).
    queue.call_soon(slow, 4)
    assert browser.microtasks == []
    browser.run_task()
    assert ran == [0, 1, 2, 3]
    browser.run_task()
    assert ran == [0, 1, 2, 3, 4]
    assert browser.tasks == [] and len(queue) == 0


def test_cancelled_handles_are_skipped_and_contexts_kept(loop: asyncio.AbstractEventLoop) -> None:
    browser = Browser()
    queue = browser.queue(loop)
    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="none")
    seen: list[str] = []
    context = contextvars.copy_context()
    context.run(var.set, "mine")
    skipped = queue.call_soon(seen.append, "cancelled")
    queue.call_soon(lambda: seen.append(var.get()), context=context)
    queue.call_soon(lambda: seen.append(var.get()))
    skipped.cancel()
    browser.run_microtasks()
    assert seen == ["mine", "none"]


def test_an_exception_goes_to_the_loop_and_the_rest_still_runs(
    loop: asyncio.AbstractEventLoop,
) -> None:
    browser = Browser()
    queue = browser.queue(loop)
    reported: list[BaseException] = []
    loop.set_exception_handler(lambda _loop, ctx: reported.append(ctx["exception"]))
    ran: list[int] = []

    def boom() -> None:
        raise ValueError("callback failed")

    queue.call_soon(boom)
    queue.call_soon(ran.append, 1)
    browser.run_microtasks()
    assert ran == [1]
    assert [type(e) for e in reported] == [ValueError]


def test_system_exit_propagates_and_later_callbacks_run_later(
    loop: asyncio.AbstractEventLoop,
) -> None:
    browser = Browser()
    queue = browser.queue(loop)
    ran: list[int] = []

    def leave() -> None:
        raise SystemExit(3)

    queue.call_soon(leave)
    queue.call_soon(ran.append, 1)
    with pytest.raises(SystemExit):
        browser.run_microtasks()
    assert ran == []
    browser.run_task()
    assert ran == [1]


def test_asyncio_tasks_and_futures_run_through_the_queue(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """Installed as `call_soon` (as `install` does on Pyodide's loop), a task that
    awaits a future resolved from outside finishes in the pass that follows."""
    browser = Browser()
    queue = browser.queue(loop)
    loop.call_soon = queue.call_soon  # type: ignore[method-assign]
    asyncio.events._set_running_loop(loop)
    try:
        future = loop.create_future()
        order: list[str] = []

        async def work() -> str:
            order.append("started")
            value = await future
            order.append(f"got {value}")
            await asyncio.sleep(0)
            return "done"

        task = loop.create_task(work())
        browser.run_microtasks()
        assert order == ["started"]
        future.set_result(7)  # as Pyodide does when a JS promise settles
        browser.run_microtasks()
        assert order == ["started", "got 7"]
        assert task.done() and task.result() == "done"
    finally:
        asyncio.events._set_running_loop(None)


def test_a_pass_that_fails_before_its_first_callback_does_not_stop_the_queue(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """Whatever leaves a pass early, the queue is drained again later (never stuck)."""
    ran: list[int] = []
    failures = [RuntimeError("enter failed")]

    def enter() -> None:
        if failures:
            raise failures.pop()

    browser = Browser()
    queue = ReadyQueue(
        loop,
        browser.microtasks.append,
        browser.tasks.append,
        clock=lambda: browser.now,
        enter=enter,
    )
    queue.call_soon(ran.append, 1)
    with pytest.raises(RuntimeError):
        browser.run_microtasks()
    # The waiting callback still runs, and new ones schedule passes again.
    while browser.tasks:
        browser.run_task()
    queue.call_soon(ran.append, 2)
    browser.run_microtasks()
    while browser.tasks:
        browser.run_task()
    assert ran == [1, 2]


def test_an_exception_after_the_last_callback_leaves_the_queue_ready_for_more(
    loop: asyncio.AbstractEventLoop,
) -> None:
    browser = Browser()
    queue = browser.queue(loop)
    ran: list[int] = []

    def leave() -> None:
        raise SystemExit(3)

    queue.call_soon(leave)
    with pytest.raises(SystemExit):
        browser.run_microtasks()
    assert browser.tasks == []
    queue.call_soon(ran.append, 1)
    browser.run_microtasks()
    assert ran == [1]


def test_a_scheduler_that_fails_does_not_stop_the_queue(loop: asyncio.AbstractEventLoop) -> None:
    """A new task that cannot be scheduled: the next `call_soon` starts a pass."""
    browser = Browser()
    ran: list[int] = []

    def no_task(_fn: Callable[[], None]) -> None:
        raise RuntimeError("no task")

    queue = ReadyQueue(
        loop, browser.microtasks.append, no_task, clock=lambda: browser.now, budget_s=0.0
    )

    def tick(i: int) -> None:
        ran.append(i)
        browser.now += 1.0

    queue.call_soon(tick, 1)
    queue.call_soon(tick, 2)
    with pytest.raises(RuntimeError):
        browser.run_microtasks()
    assert ran == [1]
    queue.call_soon(tick, 3)
    with pytest.raises(RuntimeError):
        browser.run_microtasks()
    assert ran == [1, 2]
