"""napllm-check without a browser: the findings drawn from recorded envelopes and
frame events, the steps file's errors, and the JUnit/JSON reports."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Any

import pytest

from napllm.devtools.analysis import Envelope, analyse_envelopes, analyse_frame_events
from napllm.devtools.check_observe import Run
from napllm.devtools.check_report import junit_xml, report_json
from napllm.devtools.check_steps import ChooserStep, ConsentStep, StepsError, parse_steps

MODEL = {"handle": "h1", "name": "S", "model": "scripted", "route": "r"}


def inn(value: Any, ep: str = "ep-1") -> Envelope:
    return Envelope(ep, "in", value)


def out(value: Any, ep: str = "ep-1") -> Envelope:
    return Envelope(ep, "out", value)


def gen(rid: str, handle: str = "h1") -> dict[str, Any]:
    return {"type": "llm.generate", "id": rid, "request": {"handle": handle, "messages": []}}


def kinds(envelopes: list[Envelope]) -> list[str]:
    return [f.kind for f in analyse_envelopes(envelopes)]


def test_a_clean_exchange_has_no_findings() -> None:
    assert (
        kinds(
            [
                inn({"type": "llm.select", "id": "s1"}),
                out({"type": "llm.select.result", "id": "s1", "model": MODEL}),
                inn(gen("g1")),
                out({"type": "llm.delta", "requestId": "g1", "sequence": 0}),
                out({"type": "llm.generate.result", "id": "g1", "result": {"content": []}}),
                inn(gen("g2")),
                inn({"type": "llm.cancel", "id": "c1", "requestId": "g2"}),
                out({"type": "llm.generate.result", "id": "g2", "error": {"code": "cancelled"}}),
                out({"type": "llm.cancel.result", "id": "c1", "cancelled": True}),
            ]
        )
        == []
    )


def test_invalid_request_names_the_request_and_quotes_the_runtime() -> None:
    error = {"code": "invalid-request", "message": "messages must be a list."}
    found = analyse_envelopes(
        [inn(gen("g1")), out({"type": "llm.generate.result", "id": "g1", "error": error})]
    )
    assert [f.kind for f in found] == ["invalid-request"]
    assert "llm.generate 'g1'" in found[0].message
    assert "messages must be a list." in found[0].message


def test_dropped_ignored_and_duplicate_messages() -> None:
    assert kinds([Envelope("ep-1", "note", {"dropped": "no usable id"})]) == ["dropped-message"]
    assert kinds([inn([1, 2])]) == ["ignored-message"]
    assert kinds([inn({"type": "llm.hello"})]) == ["ignored-message"]
    assert kinds([inn({"type": "other.domain"})]) == []
    describe = {"type": "llm.describe", "id": "d1", "handle": "h1"}
    assert kinds([inn(describe), inn(describe)]) == ["duplicate-id"]
    # The same id on another endpoint (a new document) is not a duplicate.
    assert kinds([inn(describe), inn(describe, "ep-2")]) == []


def test_handle_used_after_selection_expired() -> None:
    expired = {"code": "selection-expired", "message": "Select again."}
    envelopes = [
        inn({"type": "llm.describe", "id": "d1", "handle": "h9"}),
        out({"type": "llm.describe.result", "id": "d1", "error": expired}),
        inn(gen("g1", "h9")),
    ]
    assert kinds(envelopes) == ["handle-after-expired", "generation-abandoned"]


def test_handle_of_an_earlier_endpoint() -> None:
    envelopes = [
        inn({"type": "llm.select", "id": "s1"}),
        out({"type": "llm.select.result", "id": "s1", "model": MODEL}),
        inn({"type": "llm.describe", "id": "d1", "handle": "h1"}, "ep-2"),
    ]
    assert kinds(envelopes) == ["request-after-endpoint-closed"]


def test_abandoned_generations_of_the_current_document_only() -> None:
    # ep-1's open generation ended with its document (the shell cancels it).
    envelopes = [inn(gen("g1")), inn(gen("g2"), "ep-2")]
    found = analyse_envelopes(envelopes)
    assert [(f.kind, f.detail["id"]) for f in found] == [("generation-abandoned", "g2")]


def test_frame_events() -> None:
    found = analyse_frame_events(
        [
            {"kind": "unhandled-llm-error", "data": {"code": "user-cancelled", "message": "m"}},
            {"kind": "page-error", "data": {"message": "TypeError: x"}},
            {"kind": "console-error", "data": {"message": "boom"}},
            {"kind": "csp", "data": {"blockedURI": "http://203.0.113.7/", "directive": "connect"}},
            {"kind": "something-else", "data": None},
        ]
    )
    assert [f.kind for f in found] == [
        "unhandled-llm-error",
        "page-error",
        "console-error",
        "network-request",
    ]
    assert "user-cancelled" in found[0].message


def test_steps_parse() -> None:
    steps = parse_steps('[{"chooser": "allow"}, {"consent": "deny"}, {"wait": 10}]')
    assert isinstance(steps[0], ChooserStep)
    assert isinstance(steps[1], ConsentStep) and steps[1].consent == "deny"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"click": "#a"}', "steps: a JSON list of steps"),
        ("[1]", "steps[0]: a step must be a JSON object"),
        ('[{"click": "#a", "wait": 1}]', "steps[0]: a step needs exactly one of"),
        ('[{"tap": "#a"}]', "steps[0]: a step needs exactly one of"),
        ('[{"consent": "maybe"}]', "steps[0].consent: Input should be"),
        ('[{"fill": "#a"}]', "steps[0].text: Field required"),
        ('[{"wait": -1}]', "steps[0].wait: Input should be greater than or equal to 0"),
        ('[{"click": "#a"}\n{"wait": 1}]', "at line 2, column 1"),
    ],
)
def test_bad_steps_say_where(text: str, message: str) -> None:
    with pytest.raises(StepsError) as caught:
        parse_steps(text)
    assert message in str(caught.value)


def test_reports() -> None:
    run = Run(napplet="x/napplet.html", envelopes=[inn([1])])
    run.frame_events.append({"kind": "console-error", "data": {"message": "boom"}})
    findings = run.conclude()
    report = report_json(run, findings)
    assert report["ok"] is False
    assert {f["category"] for f in report["findings"]} == {"protocol", "console"}
    suite = ET.fromstring(junit_xml(run, findings))
    assert suite.get("tests") == "5" and suite.get("failures") == "2"
    failed = {case.get("name") for case in suite if case.find("failure") is not None}
    assert failed == {"protocol", "console"}
    clean = Run(napplet="ok.html")
    assert ET.fromstring(junit_xml(clean, [])).get("failures") == "0"
