"""NAP-LLM conformance scenarios, written once and run by two drivers.

A scenario is a plain generator function: it yields *steps* (the frozen
dataclasses below: plain data saying what to do or read) and receives each
step's result back from `yield`; what it returns (or raises) is the test's
outcome. It never touches a shell itself, so the same scenario runs

- under CPython against `napllm.shell.Shell` (tests/unit/harness_driver.py,
  async: each step is awaited against `harness.Harness`), and
- in Chromium against the real page with the runtime in Pyodide
  (tests/browser/page_driver.py, sync Playwright: dialogs answered with
  clicks and Esc, envelopes posted from inside the probe napplet's frame).

tests/unit/test_conformance_core.py and tests/browser/test_conformance.py
each define every `test_llm_cNN_*` test under the same name and with the
same parametrization (tests/unit/test_conformance_tables.py checks it); a
shared test is one line handing the scenario of the same name (without
`test_`) to its driver.

Connections: both drivers offer the same six fixture connections
(`FULL` .. `PAID`: the page's test build has them, tests/hooks/; the
CPython driver adds the same to its registry), each backed by a
`FixtureProvider` that a scenario scripts with `Queue`.

Time: durations in scenarios (`Stall` steps in scripts, `Deadline`) are the
page's; the CPython driver runs them `harness_driver.TIME_SCALE` times
shorter, since it has no frames, dialogs or delta coalescing to wait for.

Case tables (tests/conformance_cases.py) run as one batch per table
(`TableScenario`): the batch plays every case through one napplet and
returns its outcome as data; each parametrized test then checks its own
case (`check`). Each driver plays a table's batch once per test run.

Driver-specific tests (written out in the test modules, not here), and why:
- LLM-C01 absent domain (both): the page's proof is the frame's own
  namespace (no `window.napplet.llm`) and its untouched content; the core's
  is the observer's drop records.
- LLM-C01 binding and LLM-C08 LLM access revoked (page only): they drive
  `window.napplet.llm` and the tab's LLM switch, which only the page has;
  likewise the binding's MUST E2 test.
- LLM-C08 endpoint closed during consent (both): the core asserts that the
  closed endpoint receives nothing more, which the page cannot observe
  once its frame is gone; the page closes the tab with its button.
- LLM-C08 a pick on a chooser list that changed (both): the core scripts a
  chooser that answers with a stale revision; the page holds the list's
  refresh back and clicks the old list.
- LLM-C09 streamed deltas and the cancel/completion race (both): the page
  coalesces deltas and races wall-clock delays, while the core counts
  exact deltas and every event-loop interleaving.
- LLM-C11 (both): the developer log is `caplog` in the core and the page's
  console in the browser.
- LLM-C23 (both): the core reads the `Disclosure` handed to the consent
  port, the page the text of the consent dialog a person sees.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

import conformance_cases as cases
from conformance_cases import (
    CALL,
    CALL_2,
    CREATED,
    FORCED,
    HISTORY,
    IMAGE_RESULT,
    OTHER_TOOL,
    PNG,
    THINKING_HISTORY,
    assistant,
    interleaved_calls,
    result_msg,
    truncated_parallel_turn,
)
from envelope_rules import check_generation, code, terminal
from fixtures import WEATHER_TOOL, user
from napllm.errors import SAFE_MESSAGES, ErrorCode
from napllm.lmsp import LmspEvent
from napllm.providers.fixture import (
    Fail,
    Stall,
    call_events,
    completed,
    incomplete,
    text_events,
    text_script,
    tool_call_script,
)

# -- connections ---------------------------------------------------------------


@dataclass(frozen=True)
class Fixture:
    """A fixture connection both drivers offer: id, chooser name, model."""

    cid: str
    name: str
    model: str


FULL = Fixture("fx-full", "Fixture (all capabilities)", "fixture-full")
TEXT = Fixture("fx-text", "Fixture (text only)", "fixture-text")
JSON_ONLY = Fixture("fx-json", "Fixture (JSON only)", "fixture-json")
AUTO = Fixture("fx-auto", "Fixture (tools, auto/none)", "fixture-auto")
REASONING = Fixture("fx-reasoning", "Fixture (opaque reasoning)", "fixture-reasoning")
PAID = Fixture("fx-paid", "Fixture (may charge)", "fixture-paid")


# -- steps -----------------------------------------------------------------------


@dataclass(frozen=True)
class Open:
    """Open a napplet (a fresh endpoint); with `llm=False` without the llm domain.
    Result: the driver's napplet (opaque to scenarios)."""

    llm: bool = True


@dataclass(frozen=True)
class Post:
    """`app` sends `envelope` to the shell. Result: None."""

    app: Any
    envelope: dict[str, Any]


@dataclass(frozen=True)
class Choose:
    """Answer the open chooser: pick `connection`, or decline (None; with
    `escape`, by Esc instead of the Cancel button). Result: None."""

    connection: Fixture | None
    escape: bool = False


@dataclass(frozen=True)
class Candidates:
    """Read the open chooser without answering it. Result: the names offered."""


@dataclass(frozen=True)
class Consent:
    """Answer the open consent dialog: "allow", "remember" (allow with the
    standing grant), "deny" or "escape". Result: None."""

    answer: str = "allow"


@dataclass(frozen=True)
class AwaitConsent:
    """Wait until a consent dialog is open, without answering it. Result: None."""


@dataclass(frozen=True)
class DialogsOpen:
    """Result: how many chooser/consent dialogs are open (unanswered) now."""


@dataclass(frozen=True)
class DialogsClosed:
    """Wait until no chooser/consent dialog is open (one withdrawn by the
    shell is gone). Result: None."""


@dataclass(frozen=True)
class Result:
    """Wait for the `kind` result of request `rid` at `app`. Result: that
    envelope (checked: exactly one so far, well formed)."""

    app: Any
    rid: str
    kind: str = "llm.generate.result"


@dataclass(frozen=True)
class Results:
    """Wait until `app` holds at least `count` `kind` results (any id). Result: None."""

    app: Any
    count: int
    kind: str = "llm.generate.result"


@dataclass(frozen=True)
class WaitDeltas:
    """Wait until `app` received at least `count` deltas of `rid`. Result: None."""

    app: Any
    rid: str
    count: int = 1


@dataclass(frozen=True)
class Received:
    """Everything `app` received, in order; with `quiet`, read once late
    messages had time to arrive (to observe that nothing more comes).
    Result: list of envelopes."""

    app: Any
    quiet: bool = True


@dataclass(frozen=True)
class Queue:
    """Script the next submission to fixture `connection` (LMSP events and
    fixture steps). Result: None."""

    connection: Fixture
    script: list[Any]


@dataclass(frozen=True)
class Stats:
    """Result: `{"submissions": n, "closedEarly": n, "requests": [LMSP request
    JSON, ...]}` of fixture `connection` so far."""

    connection: Fixture


@dataclass(frozen=True)
class WaitStat:
    """Wait until fixture `connection`'s statistic `key` ("submissions",
    "closedEarly") is at least `at_least`. Result: None."""

    connection: Fixture
    key: str
    at_least: int


@dataclass(frozen=True)
class Deadline:
    """Set the generation deadline (seconds, consent wait included) for
    generations started afterwards. Result: None."""

    seconds: float


@dataclass(frozen=True)
class Account:
    """Switch the user account (profile) to `name`, creating it if needed
    (a person creates a profile before a dialog makes the page modal).
    Result: None."""

    name: str


@dataclass(frozen=True)
class EditConnection:
    """Rename fixture `connection` (a new revision: its handles expire). Result: None."""

    connection: Fixture
    name: str


@dataclass(frozen=True)
class RemoveConnection:
    """Remove fixture `connection` from the registry. Result: None."""

    connection: Fixture


@dataclass(frozen=True)
class RestoreConnection:
    """Put fixture `connection` back as it was first (after a removal or a
    rename; a no-op otherwise). Result: None."""

    connection: Fixture


Scenario = Generator[Any, Any, Any]


# -- observations ----------------------------------------------------------------


def safe(envelope: dict[str, Any], expected: ErrorCode) -> None:
    """The envelope is an error of `expected` code with the runtime's fixed sentence."""
    assert envelope.get("error") == {"code": expected.value, "message": SAFE_MESSAGES[expected]}, (
        envelope
    )


def deltas_of(envelopes: list[Any], rid: str) -> list[dict[str, Any]]:
    """The `llm.delta` envelopes of generation `rid`, in arrival order."""
    return [
        e
        for e in envelopes
        if isinstance(e, dict) and e.get("type") == "llm.delta" and e.get("requestId") == rid
    ]


def results_of(envelopes: list[Any], rid: str) -> list[dict[str, Any]]:
    """Every `llm.generate.result` of id `rid`, in order."""
    return [
        e
        for e in envelopes
        if isinstance(e, dict) and e.get("type") == "llm.generate.result" and e.get("id") == rid
    ]


def items(request: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    """The input items of an LMSP request (JSON) of one `type`."""
    return [i for i in request["input"] if i["type"] == kind]


def generate(rid: str, handle: str, *messages: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """An `llm.generate` envelope (default message: one user text)."""
    request = {"handle": handle, "messages": list(messages) or [user("Hello!")], **fields}
    return {"type": "llm.generate", "id": rid, "request": request}


# -- building blocks (use with `yield from`) ------------------------------------


def submissions(connection: Fixture = FULL) -> Scenario:
    """Provider submissions to `connection` so far."""
    stats = yield Stats(connection)
    return int(stats["submissions"])


def last_request(connection: Fixture = FULL) -> Scenario:
    """The LMSP request (JSON) of the latest submission to `connection`."""
    stats = yield Stats(connection)
    return stats["requests"][-1]


def select(app: Any, connection: Fixture, rid: str = "s1", **requirements: Any) -> Scenario:
    """`llm.select` answered by picking `connection`; returns the handle."""
    envelope: dict[str, Any] = {"type": "llm.select", "id": rid}
    if requirements:
        envelope["requirements"] = requirements
    yield Post(app, envelope)
    yield Choose(connection)
    result = yield Result(app, rid, "llm.select.result")
    assert "model" in result, result
    return result["model"]["handle"]


def ready(connection: Fixture = FULL) -> Scenario:
    """A fresh napplet with a live handle for `connection`: `(app, handle)`."""
    app = yield Open()
    handle = yield from select(app, connection)
    return app, handle


def run(app: Any, envelope: dict[str, Any], consent: str | None = "allow") -> Scenario:
    """Send a generate, answer consent (unless None), return its checked terminal."""
    yield Post(app, envelope)
    if consent is not None:
        yield Consent(consent)
    yield Result(app, envelope["id"])
    received = yield Received(app)
    return check_generation(received, envelope["id"])


def played(
    table: dict[str, Any],
    scene: Callable[[str, str, Any], tuple[list[Any], dict[str, Any]]],
    connection: Fixture = FULL,
) -> Scenario:
    """Play each case of a provider table in turn through one napplet.

    `scene(rid, handle, value)` returns `(script, envelope)`: the fixture
    script queued for the case and the generate sent. The first consent is
    answered "remember", so the others need no dialog. Returns `{"results":
    {case: terminal}, "deltas": {case: [delta]}, "requests": {case: LMSP
    request}, "envelopes": everything received}`.
    """
    app, handle = yield from ready(connection)
    results: dict[str, Any] = {}
    requests: dict[str, Any] = {}
    rids: dict[str, str] = {}
    for index, (case, value) in enumerate(sorted(table.items())):
        rid = f"g{index}"
        script, envelope = scene(rid, handle, value)
        yield Queue(connection, script)
        yield Post(app, envelope)
        if index == 0:
            yield Consent("remember")
        results[case] = yield Result(app, rid)
        requests[case] = yield from last_request(connection)
        rids[case] = rid
    envelopes = yield Received(app)
    for rid in rids.values():
        check_generation(envelopes, rid)
    return {
        "results": results,
        "requests": requests,
        "deltas": {case: deltas_of(envelopes, rid) for case, rid in rids.items()},
        "envelopes": envelopes,
    }


def rejections(
    connection: Fixture, envelopes: Callable[[str], dict[str, dict[str, Any]]]
) -> Scenario:
    """Post every envelope of a table at once from one napplet; collect each answer.

    `envelopes(handle)` maps case -> envelope (distinct ids). Returns
    `{"answers": {case: result}, "dialogs": n, "submitted": n}`: the dialogs
    open and the provider submissions made once all were answered.
    """
    app, handle = yield from ready(connection)
    table = envelopes(handle)
    before = yield from submissions(connection)
    for envelope in table.values():
        yield Post(app, envelope)
    answers = {}
    for case, envelope in table.items():
        answers[case] = yield Result(app, envelope["id"], envelope["type"] + ".result")
    seen = yield Received(app)
    for envelope in table.values():
        terminal(seen, envelope["id"], envelope["type"] + ".result")
    dialogs = yield DialogsOpen()
    after = yield from submissions(connection)
    return {"answers": answers, "dialogs": dialogs, "submitted": after - before}


def assert_rejected(outcome: dict[str, Any], case: str, expected: str) -> None:
    """`case` got `expected` and its table caused no dialog and no submission."""
    answer = outcome["answers"][case]
    assert code(answer) == expected, (case, answer)
    assert outcome["dialogs"] == 0 and outcome["submitted"] == 0


def rejected(app: Any, envelope: dict[str, Any], expected: str, connection: Fixture) -> Scenario:
    """One envelope gets `expected` with no consent dialog and no provider submission."""
    before = yield from submissions(connection)
    yield Post(app, envelope)
    answer = yield Result(app, envelope["id"], envelope["type"] + ".result")
    assert code(answer) == expected, answer
    assert (yield DialogsOpen()) == 0
    assert (yield from submissions(connection)) == before


def with_fields(handle: str, table: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """One generate per case: a valid request with the case's fields merged in."""
    out = {}
    for index, (case, fields) in enumerate(sorted(table.items())):
        envelope = generate(f"g{index}", handle)
        envelope["request"].update(fields)
        out[case] = envelope
    return out


@dataclass(frozen=True)
class TableScenario:
    """A case table played as one batch (`batch()`, a scenario whose return
    value is the outcome), then checked per case (`check(outcome, case)`)."""

    key: str
    batch: Callable[[], Scenario]
    check: Callable[[dict[str, Any], str], None]


# --------------------------------------------------------------------------
# LLM-C01: select, describe, generate


def llm_c01_select_describe_generate_correlate() -> Scenario:
    app = yield Open()
    # no `shell` handshake: the first message is llm.select
    yield Post(app, {"type": "llm.select", "id": "s1", "requirements": {"json": True}})
    offered = yield Candidates()
    assert JSON_ONLY.name in offered and TEXT.name not in offered
    yield Choose(FULL)
    model = (yield Result(app, "s1", "llm.select.result"))["model"]
    assert model["model"] == FULL.model and model["json"] is True
    assert set(model) == {
        "handle",
        "name",
        "model",
        "route",
        "images",
        "json",
        "tools",
        "toolChoiceModes",
    }
    yield Post(app, {"type": "llm.describe", "id": "d1", "handle": model["handle"]})
    assert (yield Result(app, "d1", "llm.describe.result"))["model"] == model
    before = yield from submissions()
    yield Queue(FULL, text_script(['{"greeting"', ':"Hello"}']))
    result = yield from run(app, generate("g1", model["handle"], format="json", maxTokens=128))
    assert result["result"]["finish"] == "stop"
    assert json.loads(result["result"]["content"][0]["text"]) == {"greeting": "Hello"}
    assert (yield from submissions()) == before + 1
    request = yield from last_request()
    assert request["model"] == FULL.model and request["max_output_tokens"] == 128
    ids = [e.get("id", e.get("requestId")) for e in (yield Received(app, quiet=False))]
    assert ids[:2] == ["s1", "d1"] and set(ids[2:]) == {"g1"}


def llm_c01_domain_absence_does_not_affect_other_endpoints() -> Scenario:
    plain = yield Open(llm=False)
    with_llm = yield Open()
    yield Post(plain, {"type": "llm.select", "id": "s1"})
    # the other napplet's llm domain still works
    handle = yield from select(with_llm, FULL)
    assert handle
    # the napplet without the domain gets its answer, and nothing of the other's
    received = yield Received(plain)
    assert [(e["type"], e["id"], e["error"]["code"]) for e in received] == [
        ("llm.select.result", "s1", "unsupported")
    ]
    assert (yield DialogsOpen()) == 0


# --------------------------------------------------------------------------
# LLM-C02: malformed record, base64, enum or explicit null -> invalid-request


def _envelopes(table: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {case: {**e, "id": f"e{i}"} for i, (case, e) in enumerate(sorted(table.items()))}


llm_c02_malformed_request_is_invalid_without_generation = TableScenario(
    "MALFORMED_REQUESTS",
    lambda: rejections(FULL, lambda h: with_fields(h, cases.MALFORMED_REQUESTS)),
    lambda outcome, case: assert_rejected(outcome, case, "invalid-request"),
)

llm_c02_malformed_envelope_is_invalid = TableScenario(
    "MALFORMED_ENVELOPES",
    lambda: rejections(FULL, lambda _h: _envelopes(cases.MALFORMED_ENVELOPES)),
    lambda outcome, case: assert_rejected(outcome, case, "invalid-request"),
)


# --------------------------------------------------------------------------
# LLM-C03: unsupported images/JSON/tools/exact model or provider input


def _unmet(_handle: str) -> dict[str, dict[str, Any]]:
    # pinned to the text-only fixture's model, so only the case's requirement decides
    return {
        case: {
            "type": "llm.select",
            "id": f"u{index}",
            "requirements": {"model": TEXT.model, **requirements},
        }
        for index, (case, requirements) in enumerate(sorted(cases.UNMET_REQUIREMENTS.items()))
    }


llm_c03_select_unmet_requirement_is_unsupported = TableScenario(
    "UNMET_REQUIREMENTS",
    lambda: rejections(TEXT, _unmet),
    lambda outcome, case: assert_rejected(outcome, case, "unsupported"),
)

llm_c03_generate_unsupported_input_before_submission = TableScenario(
    "UNSUPPORTED_INPUTS",
    lambda: rejections(TEXT, lambda h: with_fields(h, cases.UNSUPPORTED_INPUTS)),
    lambda outcome, case: assert_rejected(outcome, case, "unsupported"),
)


def llm_c03_select_offers_only_exact_model_no_substitution() -> Scenario:
    app = yield Open()
    yield Post(app, {"type": "llm.select", "id": "s1", "requirements": {"model": JSON_ONLY.model}})
    assert (yield Candidates()) == [JSON_ONLY.name]
    yield Choose(JSON_ONLY)
    assert (yield Result(app, "s1", "llm.select.result"))["model"]["model"] == JSON_ONLY.model
    yield Post(app, {"type": "llm.select", "id": "s2", "requirements": {"tools": True}})
    offered = yield Candidates()
    assert TEXT.name not in offered and JSON_ONLY.name not in offered and FULL.name in offered
    yield Choose(None)
    assert code((yield Result(app, "s2", "llm.select.result"))) == "user-cancelled"


def llm_c03_temperature_out_of_range_is_unsupported() -> Scenario:
    app, handle = yield from ready()  # the fixture accepts temperature 0..2
    before = yield from submissions()
    yield Post(app, generate("g1", handle, temperature=2.5))
    assert code((yield Result(app, "g1"))) == "unsupported"
    assert (yield DialogsOpen()) == 0 and (yield from submissions()) == before
    yield Queue(FULL, text_script("ok"))
    result = yield from run(app, generate("g2", handle, temperature=2.0))
    assert "result" in result and (yield from last_request())["temperature"] == 2.0


# --------------------------------------------------------------------------
# LLM-C04: decline consent after selecting a valid model


def llm_c04_declined_consent_is_user_cancelled_without_generation() -> Scenario:
    app, handle = yield from ready()
    before = yield from submissions()
    yield Post(app, generate("g1", handle))
    yield Consent("deny")
    safe((yield Result(app, "g1")), ErrorCode.USER_CANCELLED)
    # Esc in the consent dialog denies too
    yield Post(app, generate("g2", handle))
    yield Consent("escape")
    safe((yield Result(app, "g2")), ErrorCode.USER_CANCELLED)
    assert (yield from submissions()) == before
    received = yield Received(app)
    assert deltas_of(received, "g1") == [] and deltas_of(received, "g2") == []


def llm_c04_declined_selection_is_user_cancelled() -> Scenario:
    app = yield Open()
    before = yield from submissions()
    yield Post(app, {"type": "llm.select", "id": "s1"})
    yield Choose(None)
    assert code((yield Result(app, "s1", "llm.select.result"))) == "user-cancelled"
    yield Post(app, {"type": "llm.select", "id": "s2"})
    yield Choose(None, escape=True)
    assert code((yield Result(app, "s2", "llm.select.result"))) == "user-cancelled"
    assert (yield from submissions()) == before


# --------------------------------------------------------------------------
# LLM-C05: two endpoints reuse ids and attempt each other's handles/cancel


def llm_c05_foreign_handles_rejected_and_ids_scoped() -> Scenario:
    alpha, handle_a = yield from ready()
    beta, handle_b = yield from ready()
    assert handle_a != handle_b
    before = yield from submissions()
    yield Post(beta, {"type": "llm.describe", "id": "d1", "handle": handle_a})
    yield Post(beta, generate("g1", handle_a, user("beta steals")))
    assert code((yield Result(beta, "d1", "llm.describe.result"))) == "selection-expired"
    assert code((yield Result(beta, "g1"))) == "selection-expired"
    assert (yield DialogsOpen()) == 0 and (yield from submissions()) == before
    # the same ids on each endpoint are independent
    yield Post(alpha, generate("g2", handle_a, user("alpha words")))
    yield Consent("allow")
    yield Post(beta, generate("g2", handle_b, user("beta words")))
    yield Consent("allow")
    yield Result(alpha, "g2")
    yield Result(beta, "g2")
    result_a = json.dumps(check_generation((yield Received(alpha)), "g2"))
    beta_received = yield Received(beta, quiet=False)
    result_b = json.dumps(check_generation(beta_received, "g2"))
    assert "alpha" in result_a and "beta" not in result_a
    assert "beta" in result_b and "alpha" not in result_b
    assert "alpha" not in json.dumps(beta_received)
    assert (yield from submissions()) == before + 2


def llm_c05_foreign_cancel_is_false_and_original_continues() -> Scenario:
    alpha, handle_a = yield from ready()
    beta, _ = yield from ready()
    yield Queue(FULL, [CREATED, *text_events(["alpha ", "done"]), Stall(0.5), completed()])
    yield Post(alpha, generate("g1", handle_a, user("alpha secret prompt")))
    yield Consent("allow")
    yield WaitDeltas(alpha, "g1")
    yield Post(beta, {"type": "llm.cancel", "id": "c1", "requestId": "g1"})
    assert (yield Result(beta, "c1", "llm.cancel.result"))["cancelled"] is False
    assert (yield Result(alpha, "g1"))["result"]["finish"] == "stop"
    alpha_received = yield Received(alpha)
    check_generation(alpha_received, "g1")
    # nothing of alpha's generation reached beta, nothing of beta's cancel reached alpha
    beta_received = yield Received(beta, quiet=False)
    assert [e["type"] for e in beta_received] == ["llm.select.result", "llm.cancel.result"]
    assert "alpha" not in json.dumps(beta_received)
    assert not any(e.get("id") == "c1" for e in alpha_received)


def llm_c05_same_id_on_two_endpoints_cancels_only_own() -> Scenario:
    alpha, handle_a = yield from ready()
    beta, handle_b = yield from ready()
    yield Queue(FULL, [CREATED, *text_events("alpha text"), Stall(0.5), completed()])
    yield Post(alpha, generate("g1", handle_a))
    yield Consent("allow")
    yield WaitDeltas(alpha, "g1")
    yield Queue(FULL, [CREATED, *text_events("beta text"), Stall(None), completed()])
    yield Post(beta, generate("g1", handle_b))
    yield Consent("allow")
    yield WaitDeltas(beta, "g1")
    yield Post(beta, {"type": "llm.cancel", "id": "c1", "requestId": "g1"})
    assert (yield Result(beta, "c1", "llm.cancel.result"))["cancelled"] is True
    safe((yield Result(beta, "g1")), ErrorCode.CANCELLED)
    result = yield Result(alpha, "g1")
    assert result["result"]["content"] == [{"type": "text", "text": "alpha text"}]
    alpha_received = yield Received(alpha)
    beta_received = yield Received(beta, quiet=False)
    check_generation(alpha_received, "g1")
    check_generation(beta_received, "g1")
    assert "beta" not in json.dumps(alpha_received)
    assert "alpha" not in json.dumps(beta_received)


# --------------------------------------------------------------------------
# LLM-C06: duplicate an active generation id


def llm_c06_duplicate_active_id_during_provider_run() -> Scenario:
    app, handle = yield from ready()
    before = yield from submissions()
    yield Queue(FULL, [CREATED, *text_events("first"), Stall(0.5), completed()])
    yield Post(app, generate("g1", handle, user("one")))
    yield Consent("allow")
    yield WaitDeltas(app, "g1")
    yield Post(app, generate("g1", handle, user("two")))
    yield Results(app, 2)
    results = results_of((yield Received(app, quiet=False)), "g1")
    assert [code(r) for r in results] == ["invalid-request", None]
    assert results[1]["result"]["content"] == [{"type": "text", "text": "first"}]
    assert (yield from submissions()) == before + 1 and (yield DialogsOpen()) == 0


def llm_c06_duplicate_active_id_during_consent() -> Scenario:
    app, handle = yield from ready()
    before = yield from submissions()
    yield Post(app, generate("g1", handle))
    yield AwaitConsent()
    yield Post(app, generate("g1", handle))
    assert code((yield Result(app, "g1"))) == "invalid-request"
    assert (yield DialogsOpen()) == 1
    yield Queue(FULL, text_script("ok"))
    yield Consent("allow")
    yield Results(app, 2)
    received = yield Received(app, quiet=False)
    assert [code(r) for r in results_of(received, "g1")] == ["invalid-request", None]
    assert (yield from submissions()) == before + 1


def llm_c06_finished_id_may_be_reused() -> Scenario:
    app, handle = yield from ready()
    before = yield from submissions()
    yield Queue(FULL, text_script("first"))
    yield Queue(FULL, text_script("second"))
    yield Post(app, generate("g1", handle))
    yield Consent("remember")
    yield Result(app, "g1")
    yield Post(app, generate("g1", handle))
    yield Results(app, 2)
    # two generations under one id, each answered by its own script
    results = results_of((yield Received(app, quiet=False)), "g1")
    assert [r["result"]["content"][0]["text"] for r in results] == ["first", "second"]
    assert (yield from submissions()) == before + 2


# --------------------------------------------------------------------------
# LLM-C07: cancel or time out during consent, cancel a stalled provider


def llm_c07_cancel_during_consent_prevents_submission() -> Scenario:
    app, handle = yield from ready()
    before = yield from submissions()
    yield Post(app, generate("g1", handle))
    yield AwaitConsent()
    yield Post(app, {"type": "llm.cancel", "id": "c1", "requestId": "g1"})
    assert (yield Result(app, "c1", "llm.cancel.result"))["cancelled"] is True
    safe((yield Result(app, "g1")), ErrorCode.CANCELLED)
    # the pending consent is withdrawn: no dialog, no later submission
    yield DialogsClosed()
    received = yield Received(app, quiet=False)
    assert len(results_of(received, "g1")) == 1 and (yield from submissions()) == before


def llm_c07_timeout_during_consent_prevents_submission() -> Scenario:
    app, handle = yield from ready()
    before = yield from submissions()
    yield Deadline(0.8)
    yield Post(app, generate("g1", handle))
    yield AwaitConsent()
    safe((yield Result(app, "g1")), ErrorCode.TIMEOUT)
    yield DialogsClosed()
    received = yield Received(app, quiet=False)
    assert len(results_of(received, "g1")) == 1 and (yield from submissions()) == before


def llm_c07_cancel_stalled_provider_settles_and_suppresses_late_output() -> Scenario:
    app, handle = yield from ready()
    stats = yield Stats(FULL)
    yield Queue(
        FULL, [CREATED, *text_events(["early "]), Stall(None), *text_events("late"), completed()]
    )
    yield Post(app, generate("g1", handle))
    yield Consent("allow")
    yield WaitDeltas(app, "g1", 2)
    yield Post(app, {"type": "llm.cancel", "id": "c1", "requestId": "g1"})
    assert (yield Result(app, "c1", "llm.cancel.result"))["cancelled"] is True
    safe((yield Result(app, "g1")), ErrorCode.CANCELLED)
    envelopes = yield Received(app)
    check_generation(envelopes, "g1")
    assert "late" not in json.dumps(envelopes)
    after = yield Stats(FULL)
    assert after["submissions"] == stats["submissions"] + 1
    assert after["closedEarly"] == stats["closedEarly"] + 1


def llm_c07_timeout_stalled_provider() -> Scenario:
    app, handle = yield from ready()
    stats = yield Stats(FULL)
    yield Queue(FULL, [CREATED, *text_events("early"), Stall(None), completed()])
    yield Post(app, generate("g1", handle))
    yield Consent("allow")
    yield WaitDeltas(app, "g1")
    # Applies to generations started afterwards; longer than the time the
    # page keeps Allow disabled after the dialog appears (web/js/dialogs.js).
    yield Deadline(2.0)
    yield Post(app, {"type": "llm.cancel", "id": "c0", "requestId": "g1"})
    safe((yield Result(app, "g1")), ErrorCode.CANCELLED)
    yield Queue(FULL, [CREATED, *text_events("early"), Stall(None), completed()])
    yield Post(app, generate("g2", handle))
    yield Consent("allow")
    safe((yield Result(app, "g2")), ErrorCode.TIMEOUT)
    check_generation((yield Received(app)), "g2")
    after = yield Stats(FULL)
    assert after["submissions"] == stats["submissions"] + 2
    assert after["closedEarly"] == stats["closedEarly"] + 2


def llm_c07_timeout_with_slow_but_finite_provider_discards_late_output() -> Scenario:
    app, handle = yield from ready()
    # a standing grant first, so that the deadline races the provider, not the dialog
    yield Queue(FULL, text_script("granted"))
    yield Post(app, generate("g0", handle))
    yield Consent("remember")
    yield Result(app, "g0")
    stats = yield Stats(FULL)
    yield Deadline(0.3)
    yield Queue(FULL, [CREATED, Stall(1.0), *text_events("late"), completed()])
    yield Post(app, generate("g1", handle))
    safe((yield Result(app, "g1")), ErrorCode.TIMEOUT)
    # the provider's stream is closed once the deadline settled the generation
    yield WaitStat(FULL, "closedEarly", stats["closedEarly"] + 1)
    envelopes = yield Received(app)
    check_generation(envelopes, "g1")
    assert deltas_of(envelopes, "g1") == [] and "late" not in json.dumps(envelopes)
    assert (yield from submissions()) == stats["submissions"] + 1


def llm_c07_revalidation_after_consent_refuses_edited_connection() -> Scenario:
    app, handle = yield from ready(JSON_ONLY)
    before = yield from submissions(JSON_ONLY)
    yield Post(app, generate("g1", handle))
    yield AwaitConsent()
    yield EditConnection(JSON_ONLY, "Fixture (JSON only, renamed)")
    try:
        assert code((yield Result(app, "g1"))) == "selection-expired"
        yield DialogsClosed()
        yield Post(app, {"type": "llm.describe", "id": "d1", "handle": handle})
        assert code((yield Result(app, "d1", "llm.describe.result"))) == "selection-expired"
    finally:
        yield RestoreConnection(JSON_ONLY)
    assert (yield from submissions(JSON_ONLY)) == before


# --------------------------------------------------------------------------
# LLM-C08: switch account or change the connection during consent or generation


def llm_c08_account_switch_during_consent() -> Scenario:
    yield Account("Second")  # before selecting: a switch invalidates handles
    yield Account("Default")
    app, handle = yield from ready()
    before = yield from submissions()
    yield Post(app, generate("g1", handle))
    yield AwaitConsent()
    yield Account("Second")
    safe((yield Result(app, "g1")), ErrorCode.CANCELLED)
    yield DialogsClosed()
    yield Post(app, {"type": "llm.describe", "id": "d1", "handle": handle})
    yield Post(app, generate("g2", handle))
    assert code((yield Result(app, "d1", "llm.describe.result"))) == "selection-expired"
    assert code((yield Result(app, "g2"))) == "selection-expired"
    assert (yield from submissions()) == before and (yield DialogsOpen()) == 0


def llm_c08_account_switch_during_generation_and_select() -> Scenario:
    yield Account("Third")  # before selecting: a switch invalidates handles
    yield Account("Default")
    app, handle = yield from ready()
    stats = yield Stats(FULL)
    yield Queue(FULL, [CREATED, *text_events("first account"), Stall(None), completed()])
    yield Post(app, generate("g1", handle))
    yield Consent("allow")
    yield WaitDeltas(app, "g1")
    yield Post(app, {"type": "llm.select", "id": "s2"})
    yield Candidates()  # the chooser is open
    yield Account("Third")
    safe((yield Result(app, "g1")), ErrorCode.CANCELLED)
    assert code((yield Result(app, "s2", "llm.select.result"))) == "cancelled"
    yield DialogsClosed()
    check_generation((yield Received(app)), "g1")
    assert (yield Stats(FULL))["closedEarly"] == stats["closedEarly"] + 1
    # a fresh selection under the new account is a new handle; nothing of the
    # old account's generation is delivered afterwards
    fresh = yield from select(app, FULL, rid="s3")
    assert fresh != handle
    assert "first account" not in json.dumps((yield Received(app, quiet=False))[-1])


def llm_c08_connection_changed_during_consent(change: str) -> Scenario:
    app, handle = yield from ready(PAID)
    before = yield from submissions(PAID)
    yield Post(app, generate("g1", handle))
    yield AwaitConsent()
    try:
        if change == "edit":
            yield EditConnection(PAID, "Fixture (replacement)")
        else:
            yield RemoveConnection(PAID)
        assert code((yield Result(app, "g1"))) == "selection-expired"
        yield DialogsClosed()
        yield Post(app, {"type": "llm.describe", "id": "d1", "handle": handle})
        assert code((yield Result(app, "d1", "llm.describe.result"))) == "selection-expired"
        # a new select offers the changed connection under its new name only, or not at all
        yield Post(app, {"type": "llm.select", "id": "s2", "requirements": {"model": PAID.model}})
        if change == "edit":
            assert (yield Candidates()) == ["Fixture (replacement)"]
            yield Choose(None)
        else:
            assert code((yield Result(app, "s2", "llm.select.result"))) == "unsupported"
    finally:
        yield RestoreConnection(PAID)
    assert (yield from submissions(PAID)) == before


def llm_c08_connection_removed_during_generation_cancels() -> Scenario:
    app, handle = yield from ready(PAID)
    stats = yield Stats(PAID)
    yield Queue(PAID, [CREATED, *text_events("partial"), Stall(None), completed()])
    yield Post(app, generate("g1", handle))
    yield Consent("allow")
    yield WaitDeltas(app, "g1")
    try:
        yield RemoveConnection(PAID)
        safe((yield Result(app, "g1")), ErrorCode.CANCELLED)
        check_generation((yield Received(app)), "g1")
    finally:
        yield RestoreConnection(PAID)
    assert (yield Stats(PAID))["closedEarly"] == stats["closedEarly"] + 1


# --------------------------------------------------------------------------
# LLM-C09: buffered responses; completion wins over a late cancel


def llm_c09_buffered_provider_output() -> Scenario:
    app, handle = yield from ready()
    done = text_events("all at once")[-1]  # the whole message item at once, no text deltas
    yield Queue(FULL, [CREATED, done, completed()])
    result = yield from run(app, generate("g1", handle))
    assert result["result"]["content"] == [{"type": "text", "text": "all at once"}]


def llm_c09_completion_wins_then_cancel_is_false() -> Scenario:
    app, handle = yield from ready()
    yield Queue(FULL, text_script("done"))
    yield from run(app, generate("g1", handle))
    yield Post(app, {"type": "llm.cancel", "id": "c1", "requestId": "g1"})
    assert (yield Result(app, "c1", "llm.cancel.result"))["cancelled"] is False
    assert code(terminal((yield Received(app, quiet=False)), "g1")) is None


# --------------------------------------------------------------------------
# LLM-C10: limit/refusal, missing finish marker, invalid JSON-object output


def llm_c10_length_is_partial() -> Scenario:
    app, handle = yield from ready()
    yield Queue(
        FULL, [CREATED, *text_events(["Incomplete ", "answer"]), incomplete("max_output_tokens")]
    )
    result = yield from run(app, generate("g1", handle, maxTokens=3))
    assert result["result"] == {
        "content": [{"type": "text", "text": "Incomplete answer"}],
        "finish": "length",
        "usage": {"inputTokens": 12, "outputTokens": 3},
    }
    assert (yield from last_request())["max_output_tokens"] == 3


def llm_c10_refusal_is_partial() -> Scenario:
    app, handle = yield from ready()
    yield Queue(FULL, [CREATED, *text_events("I can"), incomplete("content_filter")])
    assert (yield from run(app, generate("g1", handle)))["result"]["finish"] == "refusal"


def llm_c10_length_with_json_format_is_not_validated_as_complete() -> Scenario:
    app, handle = yield from ready()
    yield Queue(FULL, [CREATED, *text_events('{"a": '), incomplete("max_output_tokens")])
    result = yield from run(app, generate("g1", handle, format="json"))
    assert result["result"]["finish"] == "length"


def _missing_completion(outcome: dict[str, Any], case: str) -> None:
    safe(outcome["results"][case], ErrorCode.PROVIDER_ERROR)


llm_c10_missing_completion_marker_is_provider_error = TableScenario(
    "MISSING_COMPLETION",
    lambda: played(cases.MISSING_COMPLETION, lambda rid, h, script: (script, generate(rid, h))),
    _missing_completion,
)


def _json_not_object(outcome: dict[str, Any], case: str) -> None:
    result = outcome["results"][case]
    safe(result, ErrorCode.PROVIDER_ERROR)
    assert cases.JSON_NOT_OBJECT[case] not in json.dumps(result)


llm_c10_json_format_needs_an_object = TableScenario(
    "JSON_NOT_OBJECT",
    lambda: played(
        cases.JSON_NOT_OBJECT,
        lambda rid, h, text: (text_script(text), generate(rid, h, format="json")),
    ),
    _json_not_object,
)


# --------------------------------------------------------------------------
# LLM-C12: multiple toolCall parts; the next request omits one result


def _missing_parallel(handle: str) -> dict[str, dict[str, Any]]:
    return {
        name: generate(f"g{i}", handle, *messages, tools=[WEATHER_TOOL])
        for i, (name, messages) in enumerate(sorted(cases.MISSING_PARALLEL_RESULTS.items()))
    }


llm_c12_missing_result_of_parallel_calls_is_invalid = TableScenario(
    "MISSING_PARALLEL_RESULTS",
    lambda: rejections(FULL, _missing_parallel),
    lambda outcome, case: assert_rejected(outcome, case, "invalid-request"),
)


def llm_c12_all_results_in_any_order_are_accepted() -> Scenario:
    app, handle = yield from ready()
    before = yield from submissions()
    messages = [
        user("weather in B and P?"),
        assistant(CALL, CALL_2),
        result_msg("call_2", "sunny"),
        result_msg("call_1", "rain"),
    ]
    yield Queue(FULL, text_script("Rain in B, sun in P."))
    result = yield from run(app, generate("g1", handle, *messages, tools=[WEATHER_TOOL]))
    assert result["result"]["finish"] == "stop"
    assert (yield from submissions()) == before + 1
    outputs = items((yield from last_request()), "function_call_output")
    assert [(o["call_id"], o["output"]) for o in outputs] == [
        ("call_2", "sunny"),
        ("call_1", "rain"),
    ]


# --------------------------------------------------------------------------
# LLM-C13: toolChoice forcing a named tool; the provider ignores it


def _ignored_forced(outcome: dict[str, Any], case: str) -> None:
    safe(outcome["results"][case], ErrorCode.PROVIDER_ERROR)
    assert outcome["requests"][case]["tool_choice"] == {"type": "function", "name": "get_weather"}


llm_c13_ignored_forced_tool_is_provider_error = TableScenario(
    "IGNORED_FORCED",
    lambda: played(
        cases.IGNORED_FORCED,
        lambda rid, h, script: (
            script,
            generate(rid, h, tools=[WEATHER_TOOL, OTHER_TOOL], toolChoice=FORCED),
        ),
    ),
    _ignored_forced,
)


def llm_c13_forced_tool_obeyed() -> Scenario:
    app, handle = yield from ready()
    yield Queue(FULL, tool_call_script([("get_weather", {"city": "B"}, "c1")]))
    envelope = generate("g1", handle, tools=[WEATHER_TOOL, OTHER_TOOL], toolChoice=FORCED)
    assert (yield from run(app, envelope))["result"]["finish"] == "toolUse"


def _violated_mode(outcome: dict[str, Any], choice: str) -> None:
    safe(outcome["results"][choice], ErrorCode.PROVIDER_ERROR)
    assert outcome["requests"][choice]["tool_choice"] == choice


llm_c13_violated_mode_is_provider_error = TableScenario(
    "VIOLATED_MODES",
    lambda: played(
        {mode: (mode, script) for mode, script in cases.VIOLATED_MODES.items()},
        lambda rid, h, value: (
            value[1],
            generate(rid, h, tools=[WEATHER_TOOL], toolChoice=value[0]),
        ),
    ),
    _violated_mode,
)


# --------------------------------------------------------------------------
# LLM-C14: the provider returns no tool call id


def llm_c14_synthesized_call_id_is_stable_and_round_trips(delivery: str) -> Scenario:
    app, handle = yield from ready()
    before = yield from submissions()
    stream_arguments = cases.ARGUMENT_DELIVERY[delivery]
    yield Queue(
        FULL,
        tool_call_script([("get_weather", {"city": "B"}, None)], stream_arguments=stream_arguments),
    )
    result = yield from run(app, generate("g1", handle, user("w?"), tools=[WEATHER_TOOL]))
    assert result["result"]["finish"] == "toolUse"
    call = result["result"]["content"][0]
    call_id = call["toolCallId"]
    assert call_id
    start = deltas_of((yield Received(app, quiet=False)), "g1")[0]
    assert start["event"] == "start" and start["toolCallId"] == call_id
    history = [user("w?"), assistant(call), result_msg(call_id, "18 C")]
    yield Queue(FULL, text_script("It is 18 C."))
    second = yield from run(app, generate("g2", handle, *history, tools=[WEATHER_TOOL]))
    assert second["result"]["finish"] == "stop"
    request = yield from last_request()
    assert [c["call_id"] for c in items(request, "function_call")] == [call_id]
    assert [o["call_id"] for o in items(request, "function_call_output")] == [call_id]
    assert (yield from submissions()) == before + 2


def llm_c14_empty_provider_id_is_synthesized() -> Scenario:
    app, handle = yield from ready()
    yield Queue(FULL, tool_call_script([("get_weather", {"city": "B"}, "")]))
    result = yield from run(app, generate("g1", handle, tools=[WEATHER_TOOL]))
    assert result["result"]["content"][0]["toolCallId"] != ""


def llm_c14_parallel_calls_without_ids_get_distinct_ids() -> Scenario:
    app, handle = yield from ready()
    yield Queue(FULL, tool_call_script([("get_weather", {"city": "B"}, None)] * 2))
    result = yield from run(app, generate("g1", handle, tools=[WEATHER_TOOL]))
    ids = [p["toolCallId"] for p in result["result"]["content"]]
    assert len(ids) == 2 and len(set(ids)) == 2


# --------------------------------------------------------------------------
# LLM-C15: completed calls under different stop labels; truncated parallel turn


def _labelled(rid: str, handle: str, label: str | None) -> tuple[list[Any], dict[str, Any]]:
    final = completed()
    if label is not None:
        final = LmspEvent(event=final.event, data={**final.data, "stop_reason": label})
    script = [*tool_call_script([("get_weather", {"city": "B"}, "c1")])[:-1], final]
    return script, generate(rid, handle, tools=[WEATHER_TOOL])


llm_c15_completed_calls_normalize_to_tool_use = TableScenario(
    "STOP_LABELS",
    lambda: played(cases.STOP_LABELS, _labelled),
    lambda outcome, case: _finish_is(outcome, case, "toolUse"),
)


def _finish_is(outcome: dict[str, Any], case: str, finish: str) -> None:
    assert outcome["results"][case]["result"]["finish"] == finish


def llm_c15_text_and_call_turn_is_tool_use() -> Scenario:
    app, handle = yield from ready()
    yield Queue(
        FULL,
        [
            CREATED,
            *text_events("Let me check.", output_index=0),
            *call_events(
                "get_weather", {"city": "B"}, output_index=1, fragments=['{"ci', 'ty":"B"}']
            ),
            completed(),
        ],
    )
    result = yield from run(app, generate("g1", handle, tools=[WEATHER_TOOL]))
    assert result["result"]["finish"] == "toolUse"
    assert [p["type"] for p in result["result"]["content"]] == ["text", "toolCall"]


def _truncated(outcome: dict[str, Any], reason: str) -> None:
    result = outcome["results"][reason]
    assert result["result"]["finish"] == cases.TRUNCATED_TURNS[reason]
    assert result["result"]["content"] == [{"type": "text", "text": "Checking both."}]
    # the provisional call blocks were streamed but are not executable content
    assert "toolCall" in {d["block"] for d in outcome["deltas"][reason]}


llm_c15_truncated_parallel_turn_keeps_finish_without_calls = TableScenario(
    "TRUNCATED_TURNS",
    lambda: played(
        {r: r for r in cases.TRUNCATED_TURNS},
        lambda rid, h, r: (truncated_parallel_turn(r), generate(rid, h, tools=[WEATHER_TOOL])),
    ),
    _truncated,
)


# --------------------------------------------------------------------------
# LLM-C16: malformed / non-object arguments; unknown tool name


def _invalid_call(outcome: dict[str, Any], case: str) -> None:
    result = outcome["results"][case]
    safe(result, ErrorCode.PROVIDER_ERROR)
    assert cases.INVALID_CALLS[case][1] not in json.dumps(result)


llm_c16_invalid_completed_call_is_provider_error = TableScenario(
    "INVALID_CALLS",
    lambda: played(
        cases.INVALID_CALLS,
        lambda rid, h, call: (
            tool_call_script([(call[0], call[1], "c1")], stream_arguments=False),
            generate(rid, h, tools=[WEATHER_TOOL]),
        ),
    ),
    _invalid_call,
)


# --------------------------------------------------------------------------
# LLM-C17: replayed thinking; connection requires opaque reasoning state


def llm_c17_thinking_omitted_from_provider_input() -> Scenario:
    app, handle = yield from ready()
    yield Queue(FULL, text_script("6"))
    result = yield from run(app, generate("g1", handle, *THINKING_HISTORY))
    assert result["result"]["finish"] == "stop"
    request = yield from last_request()
    assert "PRIVATE-CHAIN" not in json.dumps(request)
    replies = [i for i in items(request, "message") if i["role"] == "assistant"]
    assert [[c["text"] for c in i["content"]] for i in replies] == [["4"]]


def llm_c17_required_reasoning_state_is_unsupported() -> Scenario:
    app, handle = yield from ready(REASONING)
    envelope = generate("g1", handle, *THINKING_HISTORY)
    yield from rejected(app, envelope, "unsupported", REASONING)
    # the same connection without replayed thinking works
    before = yield from submissions(REASONING)
    yield Queue(REASONING, text_script("fine"))
    assert (yield from run(app, generate("g2", handle)))["result"]["finish"] == "stop"
    assert (yield from submissions(REASONING)) == before + 1


def llm_c17_thinking_in_user_message_is_invalid() -> Scenario:
    app, handle = yield from ready()
    messages = [{"role": "user", "content": [{"type": "thinking", "text": "x"}]}]
    yield from rejected(app, generate("g1", handle, *messages), "invalid-request", FULL)


# --------------------------------------------------------------------------
# LLM-C18: stream interleaved tool-call blocks


def llm_c18_interleaved_tool_call_blocks() -> Scenario:
    app, handle = yield from ready()
    before = yield from submissions()
    yield Queue(FULL, interleaved_calls(0.03))
    result = yield from run(app, generate("g1", handle, tools=[WEATHER_TOOL]))
    assert result["result"]["finish"] == "toolUse"
    assert [(p["toolCallId"], p["arguments"]) for p in result["result"]["content"]] == [
        ("ca", {"city": "Berlin"}),
        ("cb", {"city": "Paris"}),
    ]
    deltas = deltas_of((yield Received(app, quiet=False)), "g1")
    for index, call_id in ((0, "ca"), (1, "cb")):
        events = [d for d in deltas if d["blockIndex"] == index]
        assert events[0]["event"] == "start"
        assert (events[0]["toolCallId"], events[0]["name"]) == (call_id, "get_weather")
        assert events[-1]["event"] == "end"
        assert {e["event"] for e in events[1:-1]} == {"delta"}
    order = [d["blockIndex"] for d in deltas]
    assert order != sorted(order), "the blocks interleave on the wire"
    # the runtime executes nothing: one submission, no further requests
    stats = yield Stats(FULL)
    assert stats["submissions"] == before + 1 and len(stats["requests"]) == before + 1


def llm_c18_provisional_block_then_failure_is_not_executable() -> Scenario:
    app, handle = yield from ready()
    yield Queue(FULL, [*interleaved_calls(0.03)[:-3], Fail(detail="stream reset")])
    result = yield from run(app, generate("g1", handle, tools=[WEATHER_TOOL]))
    safe(result, ErrorCode.PROVIDER_ERROR)
    deltas = deltas_of((yield Received(app, quiet=False)), "g1")
    assert any(d["block"] == "toolCall" for d in deltas)


# --------------------------------------------------------------------------
# LLM-C19: an unlisted tool-choice mode


def _unlisted() -> Scenario:
    app = yield Open()
    yield Post(app, {"type": "llm.select", "id": "s1", "requirements": {"tools": True}})
    yield Choose(AUTO)
    model = (yield Result(app, "s1", "llm.select.result"))["model"]
    assert model["toolChoiceModes"] == ["auto", "none"]
    outcome = yield from rejections(
        AUTO,
        lambda h: {
            case: generate(f"g{i}", h, tools=[WEATHER_TOOL], toolChoice=choice)
            for i, (case, choice) in enumerate(sorted(cases.UNLISTED_MODES.items()))
        },
    )
    return outcome


llm_c19_unlisted_mode_is_unsupported = TableScenario(
    "UNLISTED_MODES",
    _unlisted,
    lambda outcome, case: assert_rejected(outcome, case, "unsupported"),
)


def llm_c19_listed_modes_pass_through_unchanged() -> Scenario:
    app, handle = yield from ready(AUTO)
    for rid, mode in (("g1", "auto"), ("g2", "none")):
        yield Queue(AUTO, text_script("ok"))
        yield from run(app, generate(rid, handle, tools=[WEATHER_TOOL], toolChoice=mode))
        assert (yield from last_request(AUTO))["tool_choice"] == mode


# --------------------------------------------------------------------------
# LLM-C20: invalid tool definitions and choices


llm_c20_invalid_tools_and_limits = TableScenario(
    "INVALID_TOOLS",
    lambda: rejections(FULL, lambda h: with_fields(h, cases.INVALID_TOOLS)),
    lambda outcome, case: assert_rejected(outcome, case, "invalid-request"),
)


def llm_c20_schema_keywords_are_not_unknown_fields() -> Scenario:
    app, handle = yield from ready()
    before = yield from submissions()
    yield Queue(FULL, text_script("ok"))
    result = yield from run(app, generate("g1", handle, tools=[cases.SCHEMA_KEYWORDS_TOOL]))
    assert "result" in result and (yield from submissions()) == before + 1


# --------------------------------------------------------------------------
# LLM-C21: misplaced/duplicate/orphaned results; history without current tools


def _invalid_histories(handle: str) -> dict[str, dict[str, Any]]:
    return {
        name: generate(f"g{i}", handle, *messages, tools=[WEATHER_TOOL])
        for i, (name, messages) in enumerate(sorted(cases.INVALID_HISTORIES.items()))
    }


llm_c21_invalid_histories_rejected = TableScenario(
    "INVALID_HISTORIES",
    lambda: rejections(FULL, _invalid_histories),
    lambda outcome, case: assert_rejected(outcome, case, "invalid-request"),
)


def llm_c21_history_without_current_tools_accepted() -> Scenario:
    app, handle = yield from ready()
    yield Queue(FULL, text_script("It was 18 C."))
    assert (yield from run(app, generate("g1", handle, *HISTORY)))["result"]["finish"] == "stop"
    request = yield from last_request()
    assert "tools" not in request and "tool_choice" not in request
    assert [i["type"] for i in request["input"]] == [
        "message",
        "function_call",
        "function_call_output",
        "message",
    ]


def llm_c21_no_new_calls_without_current_tools() -> Scenario:
    app, handle = yield from ready()
    yield Queue(FULL, tool_call_script([("get_weather", {"city": "B"}, "c2")]))
    safe((yield from run(app, generate("g1", handle, *HISTORY))), ErrorCode.PROVIDER_ERROR)


def llm_c21_history_on_connection_without_tools_is_unsupported() -> Scenario:
    app, handle = yield from ready(TEXT)
    yield from rejected(app, generate("g1", handle, *HISTORY), "unsupported", TEXT)


# --------------------------------------------------------------------------
# LLM-C22: image tool result; error result with no provider-native flag


def llm_c22_image_in_tool_result_unsupported_before_submission() -> Scenario:
    app, handle = yield from ready(AUTO)  # images: no
    envelope = generate("g1", handle, *IMAGE_RESULT, tools=[WEATHER_TOOL])
    yield from rejected(app, envelope, "unsupported", AUTO)


def llm_c22_image_in_tool_result_accepted_where_supported() -> Scenario:
    app, handle = yield from ready()
    yield Queue(FULL, text_script("I see it."))
    result = yield from run(app, generate("g1", handle, *IMAGE_RESULT, tools=[WEATHER_TOOL]))
    assert "result" in result
    (output,) = items((yield from last_request()), "function_call_output")
    assert PNG in json.dumps(output)


def _error_flag(flag: bool) -> Scenario:
    """The tool output the provider got for a result "service unreachable" flagged `flag`."""
    app, handle = yield from ready()
    messages = [
        user("weather?"),
        assistant(CALL),
        result_msg("call_1", "service unreachable", isError=flag),
    ]
    yield Queue(FULL, text_script("Sorry."))
    yield from run(app, generate("g1", handle, *messages, tools=[WEATHER_TOOL]))
    (output,) = items((yield from last_request()), "function_call_output")
    return output["output"]


def llm_c22_error_flag_maps_to_prefix() -> Scenario:
    assert (yield from _error_flag(True)) == "Tool execution failed.\nservice unreachable"


def llm_c22_error_flag_false_has_no_prefix() -> Scenario:
    assert (yield from _error_flag(False)) == "service unreachable"
