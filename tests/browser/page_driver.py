"""The page driver of tests/conformance_scenarios.py: each step on the real shell page.

`drive(shell, scenario, *args)` runs one scenario (a generator of steps) on
the module's booted `shellpage.ShellPage` (the test build, with the fixture
connections ``fx-*``) and performs each step the way a person and a napplet
do: a napplet is a new tab running ``napplets/probe.html`` (a fresh
endpoint), envelopes are posted from inside its sandboxed frame, the chooser
and consent dialogs are answered with clicks and Esc. Fixture scripts,
provider statistics and the deadline go through the test build's
``window.napllmTest``. Durations are the scenario's own (real seconds).

The page is shared by the module's tests: counts are read as differences,
and the `shell` fixture resets the page (tabs, dialogs, deadline, grants)
after each test. `drive_case(shell, table_scenario, case)` computes a
table's batch once per test run and checks `case`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from shellpage import POLL_MS, ShellPage, wait_deltas

import conformance_scenarios as sc

#: Bound of a wait for a result (ms); long enough for a deadline to pass first.
RESULT_TIMEOUT_MS = 15_000


def perform(shell: ShellPage, step: Any) -> Any:
    """Perform one scenario step on `shell`; returns the step's result."""
    if isinstance(step, sc.Open):
        app = shell.open_napplet()
        if not step.llm:
            app.set_llm(False)
        return app
    if isinstance(step, sc.Post):
        step.app.post(step.envelope)
        return None
    if isinstance(step, sc.Choose):
        if step.connection is not None:
            shell.choose(step.connection.name)
        elif step.escape:
            shell.escape("chooser")
        else:
            shell.cancel_chooser()
        return None
    if isinstance(step, sc.Candidates):
        return shell.candidates()
    if isinstance(step, sc.Consent):
        if step.answer == "allow":
            shell.allow()
        elif step.answer == "remember":
            shell.remember()
        elif step.answer == "deny":
            shell.deny()
        else:
            assert step.answer == "escape", step.answer
            shell.escape("consent")
        return None
    if isinstance(step, sc.AwaitConsent):
        shell.consent()
        return None
    if isinstance(step, sc.DialogsOpen):
        return shell.open_dialogs()
    if isinstance(step, sc.DialogsClosed):
        shell.page.locator("#dialog-host dialog").first.wait_for(state="detached")
        return None
    if isinstance(step, sc.Result):
        return step.app.wait_for(step.rid, step.kind, timeout_ms=RESULT_TIMEOUT_MS)
    if isinstance(step, sc.Results):
        step.app.frame.wait_for_function(
            "([type, n]) => window.probe.envelopes()"
            ".filter((e) => e && e.type === type).length >= n",
            arg=[step.kind, step.count],
            polling=POLL_MS,
        )
        return None
    if isinstance(step, sc.WaitDeltas):
        wait_deltas(step.app, step.rid, step.count)
        return None
    if isinstance(step, sc.Received):
        return step.app.quiet() if step.quiet else step.app.envelopes()
    if isinstance(step, sc.Queue):
        shell.queue(step.connection.cid, step.script)
        return None
    if isinstance(step, sc.Stats):
        return shell.stats(step.connection.cid)
    if isinstance(step, sc.WaitStat):
        shell.page.wait_for_function(
            "([c, k, n]) => JSON.parse(window.napllmTest.stats(c))[k] >= n",
            arg=[step.connection.cid, step.key, step.at_least],
            polling=POLL_MS,
        )
        return None
    if isinstance(step, sc.Account):
        exists = shell.page.locator(f"#account-select option[value='{step.name}']").count()
        if exists:
            shell.switch_account(step.name)
        else:
            shell.add_profile(step.name)
        return None
    if isinstance(step, sc.EditConnection):
        shell.rename_connection(step.connection.cid, step.name)
        return None
    if isinstance(step, sc.RemoveConnection):
        shell.page.evaluate("(c) => window.napllmTest.removeConnection(c)", step.connection.cid)
        return None
    if isinstance(step, sc.RestoreConnection):
        cid = step.connection.cid
        shell.page.evaluate("(c) => window.napllmTest.restoreConnection(c)", cid)
        shell.rename_connection(cid, step.connection.name)
        return None
    if isinstance(step, sc.Deadline):
        shell.set_deadline(step.seconds)
        return None
    raise TypeError(f"unknown step {step!r}")


def drive(shell: ShellPage, scenario: Any, *args: Any) -> Any:
    """Run `scenario(*args)` on `shell`; returns its return value."""
    steps = scenario(*args)
    value: Any = None
    while True:
        try:
            step = steps.send(value)
        except StopIteration as stop:
            return stop.value
        value = perform(shell, step)


_batches: dict[str, Any] = {}


def batch(key: str, compute: Callable[[], Any]) -> Any:
    """`compute()`'s outcome for `key`, computed once per test run (a failure is kept
    and raised again for every later caller, so each case of a table reports it)."""
    if key not in _batches:
        try:
            _batches[key] = compute()
        except Exception as exc:
            _batches[key] = exc
    outcome = _batches[key]
    if isinstance(outcome, Exception):
        raise AssertionError(f"the batch of {key} failed: {outcome!r}") from outcome
    return outcome


def drive_case(shell: ShellPage, table: sc.TableScenario, case: str) -> None:
    """Check `case` on the batch of `table` (played once)."""
    table.check(batch(table.key, lambda: drive(shell, table.batch)), case)
