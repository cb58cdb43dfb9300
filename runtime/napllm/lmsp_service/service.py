"""The LMSP local model service's state: the engine, the store, tasks, idempotency (LMSP 1.0, 6).

`LmspService` (configured by `ServiceConfig`) runs responses and tasks
through the model worker (`engine.py`), checks requests and outputs in
killable schema workers (`bounded.py`), keeps stored responses
(`store.py`) and replays idempotent requests. The HTTP routes over it are
in `app.py`, whose module docstring gives the rules both follow.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..lmsp import ModelCapabilities, ModelEntry
from .bounded import BoundedCallFailed, BoundedPool, BoundExceeded, PoolBusy
from .engine import Engine
from .grammar import GRAMMAR_TIME_LIMIT_S, GrammarUnavailable, json_grammar, tool_call_grammar
from .jobs import DEFAULT_TEMPERATURE, EngineCrashed, GenerationEnd, GenerationJob, Update
from .output import ModelOutputError, OutputItemAssembler, new_id
from .problems import ProblemError, problem_body
from .prompt import (
    RENDER_TIME_LIMIT_S,
    PromptTooLong,
    TemplateError,
    chat_messages,
    chat_tools,
    render_prompt,
)
from .store import SqliteStore, StoreCorrupt
from .tasks import (
    OUTCOMES,
    BoundedStore,
    Outcome,
    ResponseRun,
    Task,
    outcome_of,
)
from .validation import (
    Checked,
    ModelFacts,
    OutputFacts,
    check_output,
    check_request,
    check_schemas,
    output_as_input,
    parse_body,
)

log = logging.getLogger("napllm.lmsp_service")


def schemas_size(schemas: list[tuple[str, Any]]) -> int:
    """Characters of compact JSON text of every `(what, schema)` pair's schema."""
    return sum(len(json.dumps(schema, separators=(",", ":"))) for _, schema in schemas)


#: Problems of a moment, not of the request: never replayed for an Idempotency-Key.
#: Child processes that evaluate request schemas (checks, grammars, output checks).
SCHEMA_WORKERS = 2
#: Seconds the post-generation check of an output against its schema may take.
OUTPUT_CHECK_TIME_LIMIT_S = 10.0
#: Seconds checking a request's schemas against the metaschema may take.
SCHEMA_CHECK_TIME_LIMIT_S = 5.0
#: Characters of JSON text all of a request's schemas (tool parameters and
#: `response_format`) may have together; larger ones are refused before any
#: schema worker sees them (a 5 MB schema kept a worker busy to its limit).
MAX_SCHEMA_CHARS = 256 * 1024
#: Seconds an output check waits for a free schema worker: the answer was
#: already generated, so it waits longer than a new request would.
OUTPUT_CHECK_QUEUE_WAIT_S = 120.0
#: Modules each schema worker imports when it starts.
_SCHEMA_WORKER_MODULES = (
    "napllm.lmsp_service.grammar",
    "napllm.lmsp_service.validation",
    "napllm.lmsp_service.prompt",
)


@dataclass
class ServiceConfig:
    """Settings of one service instance.

    `retention_s`: seconds a task's events stay readable; `send_timeout_s`:
    seconds one send of a stream may block before the stream is ended (a
    reader that stopped reading); `body_timeout_s`: seconds a request body
    may take to arrive; `max_body_bytes`:
    largest accepted request body; `allow_origins`: exact origins allowed by
    CORS; `max_pending`: generations running or waiting before 503
    `server_busy`; `store_capacity`: stored responses, tasks and idempotency
    records kept (each; oldest evicted first).
    """

    retention_s: float = 600.0
    send_timeout_s: float = 30.0
    body_timeout_s: float = 60.0
    max_body_bytes: int = 8 * 1024 * 1024
    allow_origins: Sequence[str] = ()
    max_pending: int = 64
    store_capacity: int = 1000


@dataclass
class _Idempotent:
    """What an `Idempotency-Key` produced: the first request's fingerprint and outcome."""

    fingerprint: str
    run: ResponseRun | None = None
    task: Task | None = None
    problem: ProblemError | None = None


class LmspService:
    """The service state: engine, runs, stores and the request pipeline."""

    def __init__(
        self, engine: Engine, config: ServiceConfig, store: SqliteStore | None = None
    ) -> None:
        """`store`: where stored responses and tasks persist (default: in memory only)."""
        self.engine = engine
        self.config = config
        self.store = store if store is not None else SqliteStore(":memory:")
        self.facts = ModelFacts(
            model_id=engine.model_id, n_ctx=engine.n_ctx, tools=engine.supports_tools
        )
        self.responses: BoundedStore[str, ResponseRun] = BoundedStore(config.store_capacity)
        self.tasks: BoundedStore[str, Task] = BoundedStore(config.store_capacity)
        self.idempotency: BoundedStore[tuple[str, str], _Idempotent] = BoundedStore(
            config.store_capacity
        )
        self.pending = 0
        #: Where schemas meet outside text: killable child processes (bounded.py).
        self.schema_pool = BoundedPool(SCHEMA_WORKERS, preload=_SCHEMA_WORKER_MODULES)
        self._drivers: set[asyncio.Task[None]] = set()

    # -- model listing ------------------------------------------------------

    def model_entry(self) -> ModelEntry:
        """The served model as a `/models` entry (docs/lmsp.md)."""
        tools = self.facts.tools
        return ModelEntry(
            id=self.facts.model_id,
            object="model",
            context_length=self.facts.n_ctx,
            engine="llama.cpp",
            cpu_fast_path=self.engine.fast_path.as_json(),
            capabilities=ModelCapabilities(
                tools=tools,
                structured_output=True,
                conversations=True,
                images=False,
                tool_choice=["auto", "none", "required", "tool"] if tools else [],
            ),
        )

    # -- preparing ------------------------------------------------------------

    async def prepare(self, body: bytes) -> tuple[Checked, list[int], Any]:
        """Parse and check a response request; render and tokenize its prompt.

        Returns the checked request, the prompt token ids and the decoded
        JSON body. Raises `ProblemError` for every defect (section 6.1).
        """
        # Parsing a body of megabytes takes seconds of Python: off the event loop.
        request, raw = await asyncio.to_thread(parse_body, body)
        previous: list[Any] | None = None
        if request.previous_response_id is not None:
            stored = self.find_response(request.previous_response_id)
            if stored is None:
                raise ProblemError("response_not_found")
            if not stored.done.is_set():
                raise ProblemError("invalid_request", "The previous response has not finished.")
            previous = stored.input_context + output_as_input(stored.output)
        checked = await asyncio.to_thread(check_request, request, self.facts, previous)
        if checked.schemas and await asyncio.to_thread(schemas_size, checked.schemas) > (
            MAX_SCHEMA_CHARS
        ):
            raise ProblemError(
                "unsupported_capability",
                "The request's schemas are larger than this service checks (256 KiB).",
            )
        if checked.schemas:
            try:
                failure = await self.schema_pool.call(
                    SCHEMA_CHECK_TIME_LIMIT_S, check_schemas, checked.schemas
                )
            except PoolBusy as exc:
                raise ProblemError("server_busy") from exc
            except (BoundExceeded, BoundedCallFailed, MemoryError, RecursionError) as exc:
                raise ProblemError(
                    "unsupported_capability", "The schema cannot be checked by this service."
                ) from exc
            if failure is not None:
                raise ProblemError("invalid_request", failure)
        try:
            messages = chat_messages(checked.items)
        except ValueError as exc:
            raise ProblemError(
                "unsupported_capability", "The model does not accept images."
            ) from exc
        tools = (
            chat_tools(request.tools) if checked.tool_names is not None and request.tools else None
        )
        checked.grammar = await self._grammar(checked)
        try:
            prompt = await self._render(messages, tools)
            # Tokenizing takes llama.cpp about a minute for 8 MiB on a slow
            # machine; a prompt that cannot fit is refused without it.
            if _utf8_size(prompt) > self.engine.max_prompt_bytes:
                raise ProblemError("context_length_exceeded")
            tokens = await asyncio.to_thread(self.engine.tokenize, prompt)
        except TemplateError as exc:
            raise ProblemError(
                "invalid_request", "The model's chat template rejected this conversation."
            ) from exc
        except EngineCrashed as exc:
            raise ProblemError("model_unavailable") from exc
        if len(tokens) + 1 > self.facts.n_ctx:
            raise ProblemError("context_length_exceeded")
        return checked, tokens, raw

    async def _render(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> str:
        """The prompt text, rendered in a schema worker within `RENDER_TIME_LIMIT_S` (prompt.py).

        Raises `ProblemError`: `context_length_exceeded` for a text longer
        than any prompt that fits, `invalid_request` when the template
        rejects the conversation or cannot render it within its time or
        memory limit, `server_busy` when no schema worker is free.
        """
        try:
            return await self.schema_pool.call(
                RENDER_TIME_LIMIT_S,
                render_prompt,
                self.engine.template,
                messages,
                tools,
                self.engine.max_prompt_bytes,
            )
        except PoolBusy as exc:
            raise ProblemError("server_busy") from exc
        except PromptTooLong as exc:
            raise ProblemError("context_length_exceeded") from exc
        except (BoundExceeded, BoundedCallFailed, MemoryError, RecursionError) as exc:
            raise ProblemError(
                "invalid_request",
                "The model's chat template could not render this conversation within the "
                "service's limits.",
            ) from exc

    async def _grammar(self, checked: Checked) -> str | None:
        """The GBNF text constraining `checked`, built in a schema worker (grammar.py).

        The conversion runs in a killable child process (`bounded.py`)
        within `GRAMMAR_TIME_LIMIT_S`. Raises
        `ProblemError("unsupported_capability")` for a schema beyond the
        limits, one the converter rejects, or one whose conversion takes too
        long or too much memory.
        """
        request = checked.request
        try:
            if checked.forced_tool and request.tools:
                offered = [t for t in request.tools if t.name in (checked.tool_names or [])]
                return await self.schema_pool.call(GRAMMAR_TIME_LIMIT_S, tool_call_grammar, offered)
            if checked.output_schema is not None and checked.tool_names is None:
                return await self.schema_pool.call(
                    GRAMMAR_TIME_LIMIT_S, json_grammar, checked.output_schema
                )
        except PoolBusy as exc:
            raise ProblemError("server_busy") from exc
        except GrammarUnavailable as exc:
            raise ProblemError("unsupported_capability", str(exc)) from exc
        except (
            BoundExceeded,
            BoundedCallFailed,
            MemoryError,
            RecursionError,
        ) as exc:
            raise ProblemError(
                "unsupported_capability", "The schema cannot be enforced by this service."
            ) from exc
        return None

    # -- running ----------------------------------------------------------------

    def start(self, checked: Checked, tokens: list[int], retention_s: float | None) -> ResponseRun:
        """Create the run of a checked request and start generating it."""
        if self.pending >= self.config.max_pending:
            raise ProblemError("server_busy")
        run = ResponseRun(new_id("resp"), self.facts.model_id, retention_s=retention_s)
        run.input_context = list(checked.items)
        run.status = "in_progress"
        run.emit("response.created", {"response_id": run.id, "status": "in_progress"})
        if checked.request.store:
            self.responses.put(run.id, run)
            run.persistent = True
            self._save(run)
        self.pending += 1
        driver = asyncio.create_task(self._drive(run, checked, tokens))
        self._drivers.add(driver)
        driver.add_done_callback(self._drivers.discard)
        return run

    async def _drive(self, run: ResponseRun, checked: Checked, tokens: list[int]) -> None:
        loop = asyncio.get_running_loop()
        updates: asyncio.Queue[Update] = asyncio.Queue()

        def sink(update: Update) -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed during shutdown
                loop.call_soon_threadsafe(updates.put_nowait, update)

        request = checked.request
        assembler = OutputItemAssembler(run.id, run.emit, checked.tool_names)
        run.output = assembler.output
        job = GenerationJob(
            prompt_tokens=tokens,
            max_tokens=request.max_output_tokens,
            temperature=request.temperature
            if request.temperature is not None
            else DEFAULT_TEMPERATURE,
            grammar=checked.grammar,
            min_output_tokens=checked.min_output_tokens,
            cancel=run.cancel_flag,
        )
        output_error: str | None = None
        end = GenerationEnd("error", 0)
        try:
            future = self.engine.submit(job, sink)
            future.add_done_callback(_log_engine_failure)
            while True:
                update = await updates.get()
                if isinstance(update, GenerationEnd):
                    end = update
                    break
                if output_error is None:
                    try:
                        assembler.feed(update.text)
                    except ModelOutputError:
                        output_error = "The model produced a malformed tool call."
                        run.cancel_flag.set()
            usage = {
                "input_tokens": len(tokens),
                "output_tokens": end.output_tokens,
                "total_tokens": len(tokens) + end.output_tokens,
                # Prompt tokens read from a kept KV sequence (prompt reuse).
                "input_tokens_details": {"cached_tokens": end.cached_tokens},
            }
            run.usage = usage
            outcome = outcome_of(end.finish_reason, cancel_requested=run.cancel_flag.is_set())
            if output_error is None and outcome.keeps_output:
                try:
                    assembler.finish(complete=outcome is OUTCOMES["stop"])
                except ModelOutputError:
                    output_error = "The model produced a malformed tool call."
            if output_error is None and outcome is OUTCOMES["stop"]:
                output_error = await self._check_output(checked, assembler)
            if output_error is not None and outcome.problem is None:
                # A failure of the generation itself outranks what its output broke.
                outcome = replace(OUTCOMES["output-invalid"], detail=output_error)
            self._end(run, outcome)
        except asyncio.CancelledError:
            run.cancel_flag.set()  # the service is stopping
            if not run.done.is_set():
                self._end(run, OUTCOMES["interrupted"])
            raise
        except BaseException:
            run.cancel_flag.set()
            if not run.done.is_set():
                self._end(run, OUTCOMES["internal-error"])
            raise
        finally:
            self.pending -= 1
            if run.persistent:
                self._save(run)

    async def _check_output(self, checked: Checked, assembler: OutputItemAssembler) -> str | None:
        """`validation.check_output` in a schema worker, within `OUTPUT_CHECK_TIME_LIMIT_S`.

        A schema `pattern` may backtrack for days on some texts, holding
        Python's GIL the whole time; the check runs in a child process that
        is killed at the deadline (`bounded.py`), and a check that does not
        finish in time fails the response.
        """
        if not checked.forced_tool and checked.output_schema is None:
            return None
        offered = {t.name: t.parameters for t in checked.request.tools or []}
        calls = [(c["name"], c["arguments"]) for c in assembler.function_calls()]
        facts = OutputFacts(
            forced_tool=checked.forced_tool,
            calls=calls,
            tool_schemas={name: offered[name] for name, _ in calls if name in offered},
            output_schema=checked.output_schema,
            message_text=assembler.message_text(),
        )
        try:
            return await self.schema_pool.call(
                OUTPUT_CHECK_TIME_LIMIT_S,
                check_output,
                facts,
                queue_wait_s=OUTPUT_CHECK_QUEUE_WAIT_S,
            )
        except PoolBusy:
            return "The model's output could not be checked: the service is too busy."
        except BoundExceeded:
            return "The model's output could not be checked in time."
        except (BoundedCallFailed, MemoryError, RecursionError):
            return "The model's output could not be checked."

    def _save(self, run: ResponseRun) -> None:
        """Write a stored response or task's run to the store; a store failure is logged."""
        try:
            self.store.save_run(run)
        except (sqlite3.Error, OSError):
            log.exception("could not write a response to the store")

    def find_response(self, response_id: str) -> ResponseRun | None:
        """A stored response (6.2) from memory or the store, or `None`."""
        run = self.responses.get(response_id)
        if run is None:
            try:
                run = self.store.load_run(response_id)
            except (StoreCorrupt, sqlite3.Error):
                log.exception("could not read a stored response")
                return None
            if run is not None:
                self.responses.put(run.id, run)
        return run

    def find_task(self, task_id: str) -> Task | None:
        """A task from memory or the store, or `None`."""
        task = self.tasks.get(task_id)
        if task is None:
            try:
                task = self.store.load_task(task_id)
            except sqlite3.Error:
                log.exception("could not read a stored task")
                return None
            if task is not None:
                self.tasks.put(task.id, task)
        return task

    def add_task(self, task: Task) -> None:
        """Keep a new task in memory and in the store."""
        self.tasks.put(task.id, task)
        task.run.persistent = True
        try:
            self.store.save_task(task)
        except (sqlite3.Error, OSError):
            log.exception("could not write a task to the store")

    @staticmethod
    def _end(run: ResponseRun, outcome: Outcome) -> None:
        """End `run` as its `tasks.OUTCOMES` row says, with the row's problem if it failed."""
        problem = None
        if outcome.problem is not None:
            problem = problem_body(outcome.problem, outcome.detail)
        run.end(outcome, problem)

    async def close(self) -> None:
        """Cancel every generation, wait for the drivers to end (their runs are
        stored as `interrupted`) and close the store."""
        for driver in list(self._drivers):
            driver.cancel()
        await asyncio.gather(*self._drivers, return_exceptions=True)
        self.schema_pool.close()
        self.store.close()


def _utf8_size(text: str) -> int:
    """Bytes of `text` in UTF-8 (what the model worker tokenizes)."""
    return len(text.encode("utf-8", "surrogatepass"))


def _log_engine_failure(future: Any) -> None:
    if future.cancelled():  # dropped from the queue at shutdown
        return
    exc = future.exception()
    if exc is not None:
        log.error("generation failed", exc_info=exc)
