"""Ready callbacks of the page's asyncio loop, run in batches.

Why this exists (and is ours): Pyodide's `WebLoop` turns every
`call_soon` of the loop into a browser task of its own (a `MessageChannel`
message), each with a fresh one-shot JS proxy and its own JS-to-Python
call. asyncio calls `call_soon` for every task step and every finished
future, so one `generate` request on the page made about 13 such tasks,
and each one also let the browser run other tasks in between (measured by
`bench/bench_wasm.py`: about 33 main-thread tasks per short request). The
shell's per-request cost in Pyodide was dominated by that scheduling, not
by the protocol work.

`ReadyQueue` keeps asyncio's rules for ready callbacks (first in, first
out; a cancelled handle is skipped; each runs in its own context; timers
and `call_later` stay Pyodide's) and changes only *when* they run: the
queue is drained in one pass from a microtask, that is, at the end of the
browser task that made a callback ready (the message from a napplet, the
engine worker's batch). A pass stops after `budget_s` of work and goes on
in a new browser task, so a long run of ready work never holds the page
for more than about that long (input, rendering and other napplets'
messages run in between).

Installed by `napllm.browser.app.start` on Pyodide's loop (`install`).
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections import deque
from collections.abc import Callable
from typing import Any

#: Work (seconds) a drain pass may do before the rest waits for a new task.
DRAIN_BUDGET_S = 0.004


class ReadyQueue:
    """The ready callbacks of `loop`, drained from a microtask in batches.

    `schedule_microtask(fn)` and `schedule_task(fn)` arrange for `fn()` to
    be called once, at the next microtask checkpoint or in a new browser
    task (in the page: `queueMicrotask` and a `MessageChannel`). `clock` is
    monotonic, in seconds. `enter()` runs before each pass (Pyodide's loop
    re-registers itself as the running loop there).
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        schedule_microtask: Callable[[Callable[[], None]], None],
        schedule_task: Callable[[Callable[[], None]], None],
        *,
        clock: Callable[[], float] = time.monotonic,
        enter: Callable[[], None] = lambda: None,
        budget_s: float = DRAIN_BUDGET_S,
    ) -> None:
        self._loop = loop
        self._schedule_microtask = schedule_microtask
        self._schedule_task = schedule_task
        self._clock = clock
        self._enter = enter
        self._budget_s = budget_s
        self._ready: deque[asyncio.Handle] = deque()
        self._scheduled = False
        #: drain passes run so far (for the benchmark's and tests' figures)
        self.passes = 0

    def __len__(self) -> int:
        return len(self._ready)

    def call_soon(
        self,
        callback: Callable[..., Any],
        *args: Any,
        context: contextvars.Context | None = None,
    ) -> asyncio.Handle:
        """The loop's `call_soon`: queue `callback(*args)`; returns its handle."""
        handle = asyncio.Handle(callback, args, self._loop, context=context)
        self._ready.append(handle)
        if not self._scheduled:
            self._scheduled = True
            self._schedule_microtask(self.drain)
        return handle

    def drain(self) -> None:
        """Run ready callbacks, in order, until none is left or the budget is spent.

        Callbacks made ready during the pass run in it too. When the budget
        is spent, the rest runs in a new browser task. `SystemExit` and
        `KeyboardInterrupt` from a callback propagate (asyncio's rule), and
        the callbacks after it still run later; so does anything raised by
        `enter` or `clock`: whatever leaves a pass early, the queue is never
        left marked as scheduled with no pass to come (which would stop
        every later callback of the page).
        """
        self.passes += 1
        ready = self._ready
        try:
            self._enter()
            deadline = self._clock() + self._budget_s
            while ready:
                handle = ready.popleft()
                if not handle.cancelled():
                    handle._run()
                if ready and self._clock() >= deadline:
                    self._schedule_task(self.drain)
                    return
        except BaseException:
            # SystemExit and KeyboardInterrupt from Handle._run, or a failure
            # of `enter`, `clock` or the scheduler: the rest runs later. If
            # no task can be scheduled either, the next `call_soon` starts a
            # pass (the flag is never left set with no pass to come).
            self._scheduled = False
            if ready:
                try:
                    self._schedule_task(self.drain)
                    self._scheduled = True
                except Exception:
                    pass
            raise
        self._scheduled = False


def install(loop: Any) -> ReadyQueue:
    """Make `loop` (Pyodide's `WebLoop`) run its ready callbacks through a `ReadyQueue`.

    Replaces `call_soon` and `call_soon_threadsafe` on this loop object
    (asyncio's tasks and futures look them up there); timers are left to
    the loop. Pyodide only.
    """
    existing = getattr(loop, "_napllm_ready_queue", None)
    if isinstance(existing, ReadyQueue):
        return existing
    from js import MessageChannel, queueMicrotask  # type: ignore[import-not-found]
    from pyodide.ffi import create_proxy  # type: ignore[import-not-found]

    channel = MessageChannel.new()
    pending: list[Callable[[], None]] = []

    def on_task(_event: Any = None) -> None:
        if pending:
            pending.pop(0)()

    def on_microtask() -> None:
        queue.drain()

    # Two proxies for the page's lifetime, instead of one per callback.
    channel.port1.onmessage = create_proxy(on_task)
    microtask = create_proxy(on_microtask)

    def schedule_task(fn: Callable[[], None]) -> None:
        pending.append(fn)
        channel.port2.postMessage(None)

    def enter() -> None:
        for name in ("_install_running_loop", "_install_asyncgen_hooks"):
            method = getattr(loop, name, None)
            if method is not None:
                method()

    queue = ReadyQueue(
        loop,
        lambda _fn: queueMicrotask(microtask),
        schedule_task,
        clock=time.monotonic,
        enter=enter,
    )
    loop.call_soon = queue.call_soon
    loop.call_soon_threadsafe = queue.call_soon
    loop._napllm_ready_queue = queue
    return queue
