"""napllm-check against the napplet it checks: reports, printing and its file server (no browser).

The browser half (a napplet that replaces the recorder's bindings, forges
envelopes, logs before anything could attach, hangs its frame) is in
tests/browser/test_napllm_check.py.
"""

from __future__ import annotations

import http.client
import json
import os
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from napllm.devtools import analysis, check, check_observe, check_report
from napllm.devtools.analysis import Envelope, Finding, analyse_frame_events
from napllm.devtools.check_observe import Run

HOSTILE_TEXT = (
    "ok\x1b]0;owned\x07\r\nnapllm-check: x.html: no findings\n::error file=a::forged\ud800\u202e"
)


def test_printable_leaves_no_control_character_surrogate_or_newline() -> None:
    text = check_report.printable(HOSTILE_TEXT)
    assert "\n" not in text and "\r" not in text and "\x1b" not in text and "\x07" not in text
    assert "\ud800" not in text and "\u202e" not in text
    assert text.encode("ascii", "strict")  # ASCII here; other letters are kept as they are
    assert check_report.printable("Grüße, 東京") == "Grüße, 東京"


def hostile_run() -> tuple[Run, list[Finding]]:
    run = Run(napplet="napplet\x1b[2J.html")
    run.frame_events.append({"kind": "console-error", "data": {"message": HOSTILE_TEXT}})
    run.frame_events.append({"kind": "page-error", "data": {"message": "\ud800"}})
    run.envelopes.append(Envelope("ep\x07", "in", {"type": "llm.select", "id": "\ud800"}, "{}"))
    run.shell_console.append("error: \x1b[31m")
    run.steps.append({"index": 0, "step": "{}", "ok": False, "error": "\x00\x08"})
    return run, run.conclude()


def test_reports_of_hostile_text_are_written_whole_and_parse(tmp_path: Path) -> None:
    run, findings = hostile_run()
    check_report.write_reports(tmp_path, run, findings)
    raw = (tmp_path / "report.json").read_bytes()
    raw.decode("ascii")  # escaped JSON: no lone surrogate can break the encoding
    report = json.loads(raw)
    assert report["ok"] is False
    for finding in report["findings"]:
        assert "\x1b" not in finding["message"] and "\ud800" not in finding["message"]
    suite = ET.parse(tmp_path / "junit.xml").getroot()  # well-formed XML 1.0
    assert suite.get("failures") == "2"  # console and errors
    assert "\\x1b" in (suite.find("testcase[@name='console']/failure").text or "")
    assert not list(tmp_path.glob(".*.tmp"))


def test_stale_reports_are_removed_before_a_run(tmp_path: Path) -> None:
    for name in check_report.REPORT_FILES:
        (tmp_path / name).write_text("old")
    check_report.clear_reports(tmp_path)
    assert not any((tmp_path / name).exists() for name in check_report.REPORT_FILES)


def test_a_run_that_could_not_start_still_writes_a_report(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "junit.xml").write_text("stale")
    script = tmp_path / "turns.json"
    script.write_text('[{"text": "hi"}]')
    status = check.main([str(tmp_path / "absent.html"), "--script", str(script), "--out", str(out)])
    assert status == 2
    report = json.loads((out / "report.json").read_text())
    assert report["ok"] is False and "no napplet file" in report["error"]
    suite = ET.parse(out / "junit.xml").getroot()
    assert suite.get("failures") == "1"


def test_printed_findings_are_escaped_one_line_each(tmp_path: Path) -> None:
    _, findings = hostile_run()
    lines = check_report.summary_lines(findings, "napplet\x1b[2J.html", tmp_path)
    assert len(lines) == len(findings) + 1
    for line in lines:
        assert "\n" not in line and "\r" not in line and "\x1b" not in line and "\x07" not in line
        assert not line.startswith("::")
    # a forged verdict stays inside its finding's line
    assert [line for line in lines if line.startswith("napllm-check:")] == [lines[-1]]
    assert lines[-1].endswith(f"{len(findings)} finding(s); report in {tmp_path}")


# -- DevTools events (what the observer turns into frame events) -----------------


def test_console_errors_from_devtools() -> None:
    event = check_observe.console_event(
        {
            "type": "error",
            "args": [{"type": "string", "value": "a"}, {"type": "number", "value": 2}],
        }
    )
    assert event == {"kind": "console-error", "data": {"message": "a 2"}}
    assert check_observe.console_event({"type": "log", "args": []}) is None
    long = check_observe.console_event(
        {"type": "error", "args": [{"type": "string", "value": "x" * 9999}]}
    )
    assert long is not None and len(long["data"]["message"]) <= check_observe.MAX_EVENT_TEXT + 1


def test_exceptions_from_devtools() -> None:
    rejection = {
        "exceptionDetails": {
            "text": "Uncaught (in promise)",
            "exception": {"className": "Error", "description": "Error: boom\n    at x"},
        }
    }
    assert check_observe.exception_event(rejection) == {
        "kind": "page-error",
        "data": {"message": "unhandled rejection: Error: boom"},
    }
    llm = {
        "exceptionDetails": {
            "text": "Uncaught (in promise)",
            "exception": {
                "className": "LlmError",
                "description": "LlmError: The user cancelled.\n    at y",
                "objectId": "1.2.3",
            },
        }
    }
    event = check_observe.exception_event(llm)
    assert event["kind"] == "unhandled-llm-error"
    assert (
        event["data"]["message"] == "The user cancelled." and event["data"]["objectId"] == "1.2.3"
    )
    thrown_string = {
        "exceptionDetails": {"text": "Uncaught", "exception": {"type": "string", "value": "s"}}
    }
    assert check_observe.exception_event(thrown_string)["data"]["message"] == "s"


def test_uncaught_python_exceptions_are_named_by_their_exception() -> None:
    """A Python napplet's uncaught exception (a Pyodide PythonError) reads like its JS twin's."""

    def rejection(last: str) -> dict:
        description = (
            "PythonError: Traceback (most recent call last):\n"
            '  File "<exec>", line 22, in go\n'
            "    raise thing\n"
            f"{last}\n"
            "    at new_error (blob:x/1:1)\n"
            "    at wrapper (blob:x/1:2)"
        )
        exception = {"className": "z", "description": description}  # Pyodide minifies it
        return {"exceptionDetails": {"text": "Uncaught (in promise)", "exception": exception}}

    assert check_observe.exception_event(rejection("RuntimeError: gone")) == {
        "kind": "page-error",
        "data": {"message": "unhandled rejection: PythonError: RuntimeError: gone"},
    }
    cancelled = "napllm.napplet.errors.UserCancelledError: user-cancelled: The user cancelled."
    assert check_observe.exception_event(rejection(cancelled)) == {
        "kind": "unhandled-llm-error",
        "data": {"code": "user-cancelled", "message": "The user cancelled."},
    }
    # Not a traceback: the first line, as for any error.
    odd = {
        "exceptionDetails": {
            "text": "Uncaught",
            "exception": {"className": "PythonError", "description": "PythonError: odd\n  x"},
        }
    }
    assert check_observe.exception_event(odd)["data"]["message"] == "PythonError: odd"
    assert check_observe.python_raised("PythonError: Traceback (most recent call last):") is None


def test_csp_violations_from_the_devtools_log() -> None:
    entry = {
        "entry": {
            "source": "security",
            "level": "error",
            "text": "Connecting to 'http://203.0.113.7/x' violates the following Content Security "
            "Policy directive: \"default-src 'none'\". The action has been blocked.",
        }
    }
    event = check_observe.log_event(entry)
    assert event is not None
    assert event["data"]["blockedURI"] == "http://203.0.113.7/x"
    assert event["data"]["directive"] == "default-src 'none'"
    findings = analyse_frame_events([event])
    assert findings[0].kind == "network-request"
    assert check_observe.log_event({"entry": {"source": "javascript", "text": "x"}}) is None


# -- the file server -------------------------------------------------------------


@pytest.fixture
def served(tmp_path: Path) -> Any:
    dist = tmp_path / "dist"
    dist.mkdir()
    (dist / "index.html").write_text("shell")
    folder = tmp_path / "napplets"
    folder.mkdir()
    (folder / "app.html").write_text("napplet")
    (folder / "secret.txt").write_text("private notes")
    (tmp_path / "outside.txt").write_text("outside")
    server = check.serve(dist, folder / "app.html")
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def get(port: int, path: str, host: str | None = None) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    headers = {"Host": host if host is not None else f"127.0.0.1:{port}"}
    conn.request("GET", path, headers=headers)
    answer = conn.getresponse()
    return answer.status, answer.read()


def test_the_server_serves_the_napplet_file_and_the_shell_only(served: int) -> None:
    assert get(served, "/_napplet/app.html") == (200, b"napplet")
    assert get(served, "/index.html") == (200, b"shell")
    for path in (
        "/_napplet/secret.txt",
        "/_napplet/",
        "/_napplet/../outside.txt",
        "/_napplet/%2e%2e/outside.txt",
        "/../outside.txt",
    ):
        status, body = get(served, path)
        assert status == 404, path
        assert b"private" not in body and b"outside" not in body


@pytest.mark.parametrize("host", ["evil.example", "localhost:1", "127.0.0.1", "evil.example:80"])
def test_the_server_answers_only_its_own_host(served: int, host: str) -> None:
    status, body = get(served, "/_napplet/app.html", host)
    assert status == 421
    assert b"napplet" not in body


def test_reports_are_replaced_atomically(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run, findings = hostile_run()
    check_report.write_reports(tmp_path, run, findings)
    before = (tmp_path / "report.json").read_bytes()

    def broken_replace(src: Any, dst: Any) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError):
        check_report.write_reports(tmp_path, Run(napplet="other"), [])
    assert (tmp_path / "report.json").read_bytes() == before  # never half written
    assert not list(tmp_path.glob(".*.tmp"))


def wire(value: Any) -> str:
    """The shell's wireJson of a napplet's message (what the inspector announces for "in")."""
    return json.dumps({"json": json.dumps(value)})


def test_identical_envelopes_are_each_recorded_and_checked() -> None:
    """Two identical envelopes (same text, same millisecond) are two envelopes: a reused id."""
    run = Run(napplet="n.html")
    dup = wire({"type": "llm.describe", "id": "dup", "handle": "h"})
    run.take(["entry", 1, "ep-1", "in", dup])
    run.take(["entry", 2, "ep-1", "in", dup])
    assert [e.value for e in run.envelopes] == [json.loads(json.loads(dup)["json"])] * 2
    assert "duplicate-id" in {f.kind for f in run.conclude()}


def test_a_missing_or_repeated_number_is_an_inspector_gap() -> None:
    run = Run(napplet="n.html")
    run.take(["entry", 1, "ep-1", "out", '{"type":"llm.describe.result","id":"a"}'])
    run.take(["entry", 4, "ep-1", "out", '{"type":"llm.describe.result","id":"b"}'])
    run.take(["entry", 4, "ep-1", "out", '{"type":"llm.describe.result","id":"b"}'])
    run.take("not a list")
    gaps = [f for f in run.conclude() if f.kind == "inspector-gap"]
    assert [(f.detail["first"], f.detail["last"]) for f in gaps] == [(2, 3), (4, 4), (5, 5)]
    assert all(analysis.CATEGORIES[f.kind] == "protocol" for f in gaps)


def test_the_checks_own_bound_is_a_finding_not_a_silent_drop(monkeypatch: Any) -> None:
    monkeypatch.setattr(check_observe, "MAX_RECORDED_ENVELOPES", 3)
    run = Run(napplet="n.html")
    for serial in range(1, 6):
        run.take(["entry", serial, "ep-1", "out", "{}"])
    assert len(run.envelopes) == 3
    limits = [f for f in run.conclude() if f.kind == "envelope-limit"]
    assert [f.detail for f in limits] == [{"serial": 4}]
    # The page's own script stops at the bound and says so once.
    other = Run(napplet="n.html")
    other.take(["entry", 1, "ep-1", "out", "{}"])
    other.take(["limit", 2])
    assert [f.detail for f in other.conclude() if f.kind == "envelope-limit"] == [{"serial": 2}]


def test_envelope_text_that_is_not_json_or_too_deep_is_kept_without_a_value() -> None:
    run = Run(napplet="n.html")
    run.take(["entry", 1, "ep-1", "in", "[" * 100_000])
    run.take(["entry", 2, "ep-1", "in", json.dumps({"json": "[" * 100_000})])
    run.take(["entry", 3, "ep-1", "in", json.dumps({"unclonable": True, "type": "x", "id": "1"})])
    assert [e.value for e in run.envelopes] == [
        None,
        None,
        {"unclonable": True, "type": "x", "id": "1"},
    ]


def test_each_stop_the_shell_shows_is_a_finding() -> None:
    run = Run(napplet="n.html")
    run.take(["stopped", "Napplet \u201cx\u201d sent too many messages and was stopped."])
    run.take(["stopped", 5])
    for _ in range(check_observe.MAX_STOPS_KEPT + 5):
        run.take(["stopped", "again"])
    stops = [f for f in run.conclude() if f.kind == "napplet-stopped"]
    assert len(stops) == check_observe.MAX_STOPS_KEPT
    assert "too many messages" in stops[0].message
    assert analysis.CATEGORIES["napplet-stopped"] == "protocol"


def test_a_flood_of_console_errors_is_counted_not_kept_and_cannot_hide_another_kind() -> None:
    # Every DevTools event was kept: a napplet calling console.error in a
    # loop grew the checker's memory without bound.
    run = Run(napplet="n.html")
    observer = object.__new__(check_observe._Observer)  # only its handlers are used
    observer.run = run
    observer._pending_codes = []
    error = {"type": "error", "args": [{"type": "string", "value": "x" * 5000}]}
    flood = 20 * check_observe.MAX_FRAME_EVENTS_PER_KIND
    for _ in range(flood):
        observer._frame_console(error)
    observer._record({"kind": "page-error", "data": {"message": "late"}}, None)
    assert len(run.frame_events) == check_observe.MAX_FRAME_EVENTS_PER_KIND + 1
    findings = run.conclude()
    [limit] = [f for f in findings if f.kind == "event-limit"]
    assert limit.detail == {"kind": "console-error", "count": flood}
    assert analysis.CATEGORIES["event-limit"] == "errors"
    assert [f.message for f in findings if f.kind == "page-error"] == ["Uncaught: late"]
