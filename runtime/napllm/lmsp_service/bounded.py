"""Work on outside input in child processes that are killed at a deadline (docs/security.md).

Why processes: a request's JSON Schema is outside input, and evaluating it
can take any time. Python's `re` matcher backtracks and holds the GIL for
the whole match (`"(?:.|.)*\\x00"` on 40 characters runs for about a day),
and a schema's `anyOf`/`$ref` graph or `uniqueItems` can make a validator
or the schema-to-grammar converter run exponentially long or grow without
bound. On a thread such work can neither be stopped nor kept from starving
the event loop (a match in C never gives the GIL back). A child process
can be killed, so every such evaluation in the service (schema checks,
grammar conversion, the post-generation output check) runs here.

Rules
- `BoundedPool(size)` keeps up to `size` spawned child processes (spawn,
  never fork: the HTTP process runs threads). A call waits at most
  `queue_wait_s` for a free child (`PoolBusy` past it), then at most its
  time limit for the answer; past that, `BoundExceeded` is raised and the
  child is killed (SIGKILL) and replaced at once. The limit counts from
  the moment a started child took the call: a replacement's start-up
  (at most `STARTUP_LIMIT_S`) is not charged to the call.
- Each child's address space is capped (`RLIMIT_AS`,
  `memory_limit_bytes`), so a call that tries to grow without bound ends
  with `MemoryError` in the child, raised again in the caller.
- An exception raised by the called function is raised in the caller (as
  itself when it pickles). A child that dies, or whose answer cannot be
  read, gives `BoundedCallFailed`; the child is replaced.
- The function and its arguments must pickle; the function must be a
  module-level function of an importable module.

Own code rather than `concurrent.futures.ProcessPoolExecutor`: the pool
offers no way to kill the one process running a call that overran, and
its whole pool breaks when a child dies.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import multiprocessing
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any, TypeVar

T = TypeVar("T")

#: Default address-space cap of one child, in bytes.
DEFAULT_MEMORY_LIMIT_BYTES = 2 * 1024**3
#: Seconds a child may take to start (import its modules) before it is replaced.
STARTUP_LIMIT_S = 60.0
#: Default seconds a call waits for a free child.
QUEUE_WAIT_S = 30.0


class BoundExceeded(Exception):
    """A bounded call did not get a child or its answer within its time limit."""


class PoolBusy(BoundExceeded):
    """No child became free within the call's queue wait (every child was busy)."""


class BoundedCallFailed(Exception):
    """The child running a bounded call died or sent an unreadable answer."""


def _serve(conn: Connection, memory_limit_bytes: int | None, preload: Sequence[str]) -> None:
    """The child's loop: receive `(function, args)`, send `("ok", result)` or `("raised", exc)`."""
    if memory_limit_bytes is not None:
        import resource

        with contextlib.suppress(ValueError, OSError):  # a platform without RLIMIT_AS
            resource.setrlimit(resource.RLIMIT_AS, (memory_limit_bytes, memory_limit_bytes))
    for name in preload:
        importlib.import_module(name)
    conn.send(("ready", None))
    while True:
        try:
            function, args = conn.recv()
        except (EOFError, OSError):
            return  # the parent went away
        try:
            answer: tuple[str, Any] = ("ok", function(*args))
        except BaseException as exc:  # MemoryError and RecursionError included
            answer = ("raised", exc)
        try:
            conn.send(answer)
        except Exception:  # an unpicklable result or exception
            conn.send(("failed", type(answer[1]).__name__))


@dataclass
class _Child:
    process: Any = None
    conn: Connection | None = None
    ready: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)


class BoundedPool:
    """Child processes that run calls under a time limit (module docstring).

    `size`: children at most (each started on first use, or by `start`);
    `memory_limit_bytes`: address-space cap of each child (`None`: none);
    `preload`: module names each child imports when it starts, so that a
    call does not pay for them.
    """

    def __init__(
        self,
        size: int,
        memory_limit_bytes: int | None = DEFAULT_MEMORY_LIMIT_BYTES,
        preload: Sequence[str] = (),
    ) -> None:
        self._context = multiprocessing.get_context("spawn")
        self._memory_limit = memory_limit_bytes
        self._preload = tuple(preload)
        self._children = [_Child() for _ in range(size)]
        self._free: asyncio.Queue[_Child] | None = None
        self._closed = False
        #: Children killed for overrunning their time limit (for tests and logs).
        self.killed = 0

    def start(self) -> None:
        """Start every child now (each imports `preload`); safe to call again."""
        for child in self._children:
            with child.lock:
                self._ensure(child)

    async def call(
        self,
        time_limit_s: float,
        function: Callable[..., T],
        *args: Any,
        queue_wait_s: float = QUEUE_WAIT_S,
    ) -> T:
        """`function(*args)` in a child, answered within `time_limit_s` seconds.

        Raises `PoolBusy` (no child free within `queue_wait_s`),
        `BoundExceeded` (no answer in time: the child is then killed),
        `BoundedCallFailed` (the child died or could not start), or whatever
        `function` raised.
        """
        if self._free is None:
            self._free = asyncio.Queue()
            for child in self._children:
                self._free.put_nowait(child)
        free = self._free
        try:
            child = await asyncio.wait_for(free.get(), queue_wait_s)
        except TimeoutError:
            raise PoolBusy("no free child within the queue wait") from None
        work = asyncio.ensure_future(
            asyncio.to_thread(self._round_trip, child, time_limit_s, function, args)
        )

        def give_back(done: asyncio.Future[Any]) -> None:
            free.put_nowait(child)
            if not done.cancelled():
                done.exception()  # retrieved, so an abandoned failure is not logged

        # The child is free again only when its thread ends (at the latest at
        # the deadline, when the child is killed), even if the caller left.
        work.add_done_callback(give_back)
        status, value = await asyncio.shield(work)
        if status == "ok":
            return value  # type: ignore[no-any-return]
        if status == "raised" and isinstance(value, BaseException):
            raise value
        raise BoundedCallFailed(f"the call failed in the child ({value})")

    def _ensure(self, child: _Child) -> None:
        if child.process is not None and child.process.is_alive():
            return
        self._discard(child)
        if self._closed:
            raise BoundedCallFailed("the pool is closed")
        parent_end, child_end = self._context.Pipe()
        process = self._context.Process(
            target=_serve,
            args=(child_end, self._memory_limit, self._preload),
            name="napllm-bounded",
            daemon=True,
        )
        process.start()
        child_end.close()
        child.process, child.conn, child.ready = process, parent_end, False

    def _discard(self, child: _Child) -> None:
        if child.process is not None:
            with contextlib.suppress(Exception):
                child.process.kill()
                child.process.join(5)
            with contextlib.suppress(Exception):
                child.process.close()
        if child.conn is not None:
            with contextlib.suppress(Exception):
                child.conn.close()
        child.process = child.conn = None
        child.ready = False

    def _round_trip(
        self,
        child: _Child,
        time_limit_s: float,
        function: Callable[..., Any],
        args: tuple[Any, ...],
    ) -> tuple[str, Any]:
        with child.lock:
            self._ensure(child)
            conn = child.conn
            assert conn is not None
            try:
                if not child.ready:
                    if not conn.poll(STARTUP_LIMIT_S) or conn.recv() != ("ready", None):
                        self._discard(child)
                        raise BoundedCallFailed("the child did not start")
                    child.ready = True
                deadline = time.monotonic() + time_limit_s
                conn.send((function, args))
                if not conn.poll(max(0.0, deadline - time.monotonic())):
                    self.killed += 1
                    self._discard(child)
                    with contextlib.suppress(BoundedCallFailed):
                        self._ensure(child)  # the next call finds a child already started
                    raise BoundExceeded("no answer within the time limit")
                answer = conn.recv()
            except (EOFError, OSError) as exc:
                self._discard(child)
                raise BoundedCallFailed("the child ended during the call") from exc
            if not (isinstance(answer, tuple) and len(answer) == 2):
                self._discard(child)
                raise BoundedCallFailed("the child sent an unreadable answer")
            return answer

    def close(self) -> None:
        """Kill every child; later calls fail with `BoundedCallFailed`."""
        self._closed = True
        for child in self._children:
            # A round trip in progress holds the lock until its deadline;
            # killing without it ends that round trip at once.
            self._discard(child)
