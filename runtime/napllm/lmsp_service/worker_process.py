"""The model worker process seen from the service: start, pipe, restart (docs/lmsp.md 9.1, 9.1.1).

Rules
- llama.cpp runs only in the model worker process (worker.py), started
  with `multiprocessing`'s `spawn` method; the service process talks to it
  over one duplex pipe and never calls into llama.cpp, so a crash inside
  it (a segmentation fault on a hostile grammar, an abort, an
  out-of-memory kill) ends the worker only.
- Starting blocks until the worker reports `ready` (after loading the model
  and its self-check) or fails; `START_TIMEOUT_S` bounds the wait. A worker
  that died by a crash signal (`llama_load.CRASH_SIGNALS`) before it was
  ready raises `WorkerCrashed`, any other failure `ValueError`.
- CPU fast path: with `extra_bufts="auto"` (the default) `fall_back` turns
  llama.cpp's CPU extra buffer types off after a crash signal, once for the
  life of the engine; this is logged once and reported by `fast_path`.
  Who is to blame for a crash is the engine's decision (engine.py, "Any
  CPU"). `"on"` and `"off"` force the setting (no fallback).
- `restart` retries with back-off (1 s doubling to 30 s) until a worker is
  ready or `closed` is set; it never gives up on its own.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from .llama_load import ExtraBufts, crash_signal

log = logging.getLogger("napllm.lmsp_service.worker_process")

#: Seconds to wait for a (re)started worker to load the model.
START_TIMEOUT_S = 120.0
#: Seconds between two looks at `closed` while a worker starts.
START_POLL_S = 0.2
#: Seconds a stopping worker may spend finishing its running generations.
STOP_WAIT_S = 5.0


class WorkerCrashed(ValueError):
    """A starting model worker died by a crash signal (`signal`) before it was ready."""

    def __init__(self, message: str, sig: signal.Signals) -> None:
        super().__init__(message)
        self.signal = sig


@dataclass(frozen=True)
class FastPath:
    """What the engine says about llama.cpp's CPU fast path (`/models` extension).

    `setting`: `auto`, `on` or `off` (`--extra-bufts`); `enabled`: whether
    the running worker uses the CPU extra buffer types; `reason`: why they
    are off, in words for a user (`None` while they are on); `cpu`:
    llama.cpp's summary of the CPU features it found.
    """

    setting: ExtraBufts
    enabled: bool
    reason: str | None
    cpu: str

    def as_json(self) -> dict[str, Any]:
        """The JSON object of the `/models` entry's `cpu_fast_path` extension."""
        return {
            "setting": self.setting,
            "enabled": self.enabled,
            "reason": self.reason,
            "cpu": self.cpu,
        }


class WorkerProcess:
    """One model worker at a time: its process, its pipe and the fast-path setting.

    `target` is the process's entry point, called as `(conn, model_path,
    n_ctx, n_threads, extra_bufts, slots)` (`worker.worker_main`; tests
    give a wrapper of it that really crashes); `n_ctx` 0 means the model's
    trained context. Raises `ValueError` for an unknown `extra_bufts`.
    `info` is the last `ready` message's dict (worker.py); `closed` is set
    when the engine closes (it stops `restart`).
    """

    def __init__(
        self,
        target: Callable[..., None],
        model_path: str,
        n_ctx: int,
        n_threads: int | None,
        slots: int,
        extra_bufts: ExtraBufts,
    ) -> None:
        if extra_bufts not in ("auto", "on", "off"):
            raise ValueError("extra_bufts must be auto, on or off")
        self._target = target
        self._args = (model_path, n_ctx, n_threads)
        self._slots = slots
        self.setting: ExtraBufts = extra_bufts
        #: Whether the next worker starts with the CPU extra buffer types on.
        self.extra_bufts = extra_bufts != "off"
        self._reason: str | None = (
            "turned off by the service's --extra-bufts off option" if extra_bufts == "off" else None
        )
        self._mp = multiprocessing.get_context("spawn")
        self._lock = threading.Lock()  # guards `info`
        self._send_lock = threading.Lock()  # guards the pipe and the process
        self.info: dict[str, Any] = {}
        self.closed = False
        #: Seconds `stop` waits for the running generations before it kills the worker.
        self.stop_wait_s = STOP_WAIT_S
        self._process: Any = None
        self._conn: Connection | None = None

    @property
    def fast_path(self) -> FastPath:
        """The state of llama.cpp's CPU fast path (extra buffer types) right now."""
        with self._lock:
            info = self.info
        return FastPath(
            setting=self.setting,
            enabled=bool(info.get("extra_bufts", self.extra_bufts)),
            reason=self._reason,
            cpu=str(info.get("cpu_features", "")).strip(),
        )

    @property
    def pid(self) -> int | None:
        """The running worker's process id (`None` between workers)."""
        process = self._process
        return None if process is None else int(process.pid)

    def start(self) -> dict[str, Any]:
        """Start the first worker, falling back once if it crashes (module rules).

        Returns its `ready` info. Raises `WorkerCrashed` or `ValueError`.
        """
        try:
            return self._spawn()
        except WorkerCrashed as exc:
            if not self.fall_back(exc.signal, "while it loaded and checked the model"):
                raise
            return self._spawn()

    def fast_path_suspect(self, exitcode: int | None) -> bool:
        """Whether a worker that ended with `exitcode` may have died of the fast path.

        True for a crash signal while the fast path is on in `auto` mode.
        """
        return crash_signal(exitcode) is not None and self.setting == "auto" and self.extra_bufts

    def fall_back(self, sig: signal.Signals, when: str) -> bool:
        """Turn the CPU extra buffer types off after a crash, if the setting allows it.

        Returns whether the next worker will start with them off (only in
        `auto` mode, and only the first time). Logged once.
        """
        if self.setting != "auto" or not self.extra_bufts:
            return False
        self.extra_bufts = False
        reason = (
            f"the model worker crashed ({sig.name}) {when} with llama.cpp's CPU fast path "
            "(extra buffer types such as AMX or repacked weights) on; it runs without it now "
            "(same answers, somewhat slower; --extra-bufts on forces it)"
        )
        self._reason = reason
        log.warning("%s", reason)
        return True

    def restart(self, when: str) -> None:
        """Start a new worker after a crash; retry with back-off until one is ready or `closed`.

        `when` says when a crash of a starting worker happened, for
        `fall_back`'s reason.
        """
        delay = 1.0
        while not self.closed:
            try:
                self._spawn()
                return
            except WorkerCrashed as exc:
                if self.fall_back(exc.signal, when):
                    continue
                log.exception("could not restart the model worker; retrying")
            except ValueError:
                if self.closed:
                    return  # closed while it started: nothing to restart
                log.exception("could not restart the model worker; retrying")
            time.sleep(delay)
            delay = min(delay * 2, 30.0)

    def _spawn(self) -> dict[str, Any]:
        """Start a worker and wait for its `ready` message.

        Raises `WorkerCrashed` (a `ValueError`) when the worker died by a
        crash signal before it was ready, `ValueError` for other failures.
        """
        parent, child = self._mp.Pipe(duplex=True)
        process = self._mp.Process(
            target=self._target,
            args=(child, *self._args, self.extra_bufts, self._slots),
            name="napllm-lmsp-model",
            daemon=True,
        )
        process.start()
        child.close()
        try:
            # In slices, so that closing the service stops a start at once.
            deadline = time.monotonic() + START_TIMEOUT_S
            while not parent.poll(START_POLL_S):
                if self.closed:
                    raise ValueError("the service closed while the model worker started")
                if time.monotonic() > deadline:
                    raise ValueError("the model worker did not start in time")
            message = parent.recv()
        except (EOFError, OSError) as exc:
            process.join(5)
            parent.close()
            sig = crash_signal(process.exitcode)
            if sig is not None:
                raise WorkerCrashed(
                    f"the model worker crashed ({sig.name}) while loading the model", sig
                ) from exc
            raise ValueError("the model worker exited while loading the model") from exc
        except ValueError:
            process.kill()
            process.join(5)
            parent.close()
            raise
        if message[0] != "ready":
            process.join(5)
            parent.close()
            raise ValueError(str(message[1]))
        info = dict(message[1])
        with self._lock:
            self.info = info
        with self._send_lock:  # as `reap` and `send` read them
            if self.closed:  # closed while it loaded: it must not outlive the service
                process.kill()
                process.join(5)
                parent.close()
                raise ValueError("the service closed while the model worker started")
            self._process = process
            self._conn = parent
        return info

    def send(self, message: tuple[Any, ...]) -> None:
        """Send `message` to the worker (worker.py protocol); `OSError` when there is none."""
        with self._send_lock:
            if self._conn is None:
                raise OSError("no model worker")
            self._conn.send(message)

    def recv(self) -> tuple[Any, ...]:
        """The worker's next message (blocking); `EOFError` or `OSError` when it is gone."""
        conn = self._conn
        if conn is None:
            raise OSError("no model worker")
        message: tuple[Any, ...] = conn.recv()
        return message

    def reap(self) -> int | None:
        """Forget a dead worker: wait for it (at most 5 s), close the pipe, return its exit code."""
        process = self._process
        code = None
        if process is not None:
            process.join(5)
            code = process.exitcode
        with self._send_lock:
            if self._conn is not None:
                self._conn.close()
            self._conn = None
            self._process = None
        return code

    def kill(self) -> None:
        """Kill the running worker, if any (the engine sees the closed pipe and restarts it)."""
        process = self._process
        if process is not None and process.is_alive():
            process.kill()

    def stop(self) -> None:
        """Set `closed` and stop the worker after its running generations (kill past `stop_wait_s`).

        The pipe stays open, so the engine still reads what the worker sent
        before it ended; `reap` closes it.
        """
        self.closed = True
        with contextlib.suppress(OSError):
            self.send(("stop",))
        process = self._process
        if process is not None:
            process.join(self.stop_wait_s)
            if process.is_alive():
                process.kill()
                process.join(5)
