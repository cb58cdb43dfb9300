"""`napllm-check` end to end: the example napplets pass clean, each deliberately
faulty napplet (napplets/check/) is reported with its violation, and the
docs' walkthrough (docs/examples/hello/) passes as written in docs/napplets.md.

Each check runs the command in a subprocess, against this checkout's built
dist/, with Debian's Chromium; it boots the real shell, so each run takes a
while.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
FAULTY = Path(__file__).resolve().parent / "napplets" / "check"
CHROMIUM = os.environ.get("NAPLLM_CHROMIUM", "/usr/bin/chromium")


def check(
    dist_dir: Path, tmp_path: Path, napplet: Path, script: Any, steps: Any, *options: str
) -> tuple[int, dict[str, Any], str]:
    """Run napllm-check with command-line `options`; returns (exit status, report.json, output)."""
    script_file = tmp_path / "turns.json"
    steps_file = tmp_path / "steps.json"
    script_file.write_text(script if isinstance(script, str) else json.dumps(script))
    steps_file.write_text(json.dumps(steps))
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "runtime")}
    done = subprocess.run(
        [
            *(sys.executable, "-m", "napllm.devtools.check", str(napplet)),
            *("--script", str(script_file), "--steps", str(steps_file)),
            *("--dist", str(dist_dir), "--out", str(out), "--chromium", CHROMIUM),
            *options,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=400,
        check=False,
    )
    output = done.stdout + done.stderr
    report = json.loads((out / "report.json").read_text()) if (out / "report.json").exists() else {}
    if report.get("screenshot"):  # a napplet that hangs its frame can stop the screenshot
        assert (out / "screenshot.png").stat().st_size > 0
    if report:
        suite = ET.parse(out / "junit.xml").getroot()
        assert suite.tag == "testsuite"
        assert int(suite.get("failures", "0")) == len({f["category"] for f in report["findings"]})
    return done.returncode, report, output


def kinds(report: dict[str, Any]) -> set[str]:
    return {f["kind"] for f in report.get("findings", [])}


def choose_and_allow(prompt: str | None = None, remember: bool = False) -> list[dict[str, Any]]:
    steps: list[dict[str, Any]] = [
        {"click": "#choose"},
        {"chooser": "allow"},
        {"waitForText": "napllm-check script", "selector": "#model"},
    ]
    if prompt is not None:
        steps.append({"fill": "#prompt", "text": prompt})
    steps += [{"click": "#send"}, {"consent": "allow", "remember": remember}]
    return steps


# --------------------------------------------------------------------------- examples: clean


def test_chat_example_is_clean(dist_dir: Path, tmp_path: Path) -> None:
    script = [{"text": ["Hello", " from", " the script!"], "delayMs": 10}]
    steps = [
        *choose_and_allow("Hi"),
        {"waitForText": "Hello from the script!", "selector": "#history"},
    ]
    status, report, output = check(
        dist_dir, tmp_path, ROOT / "napplets/chat/index.html", script, steps
    )
    assert status == 0, output
    assert report["ok"] is True
    types = [e["envelope"]["type"] for e in report["envelopes"] if e["envelope"]]
    assert "llm.generate" in types and "llm.generate.result" in types
    assert "llm.delta" in types  # streamed through the provider path


def test_json_example_is_clean(dist_dir: Path, tmp_path: Path) -> None:
    script = [{"json": {"title": "Dune", "author": "Frank Herbert", "year": 1965}}]
    steps = [*choose_and_allow(), {"waitForText": "Frank Herbert", "selector": "#result"}]
    status, report, output = check(
        dist_dir, tmp_path, ROOT / "napplets/json/index.html", script, steps
    )
    assert status == 0, output
    requests = [e["envelope"] for e in report["envelopes"] if e["direction"] == "in"]
    assert any(
        r["request"].get("format") == "json" for r in requests if r["type"] == "llm.generate"
    )


def test_tools_example_is_clean(dist_dir: Path, tmp_path: Path) -> None:
    script = [
        {"toolCalls": [{"name": "get_weather", "arguments": {"city": "Berlin"}}]},
        {"text": "It is mild in Berlin."},
    ]
    steps = [
        *choose_and_allow("Weather in Berlin?", remember=True),
        {"waitForText": "It is mild in Berlin.", "selector": "#answer"},
    ]
    status, report, output = check(
        dist_dir, tmp_path, ROOT / "napplets/tools/index.html", script, steps
    )
    assert status == 0, output
    results = [
        e["envelope"]
        for e in report["envelopes"]
        if e["envelope"] and e["envelope"].get("type") == "llm.generate.result"
    ]
    assert [r["result"]["finish"] for r in results] == ["toolUse", "stop"]


# --------------------------------------------------------------------------- faulty napplets

GO = [{"click": "#go"}]
CHOOSE = [*GO, {"chooser": "allow"}]
TEXT = {"turns": [{"text": "ok"}], "repeat": True}


@pytest.mark.parametrize(
    ("name", "script", "steps", "expected"),
    [
        ("invalid-request.html", TEXT, [*CHOOSE, {"waitForText": "refused"}], "invalid-request"),
        (
            "unhandled-error.html",
            TEXT,
            [*GO, {"chooser": "cancel"}, {"wait": 300}],
            "unhandled-llm-error",
        ),
        ("network.html", TEXT, [*GO, {"wait": 500}], "network-request"),
        ("network.html", TEXT, [*GO, {"wait": 500}], "console-error"),
        (
            "abandoned.html",
            [{"stall": True}],
            [*CHOOSE, {"consent": "allow"}, {"waitForText": "started"}, {"wait": 300}],
            "generation-abandoned",
        ),
        ("expired.html", TEXT, [*GO, {"waitForText": "attempt 2"}], "handle-after-expired"),
        (
            "stale-handle.html",
            TEXT,
            [*CHOOSE, {"waitForText": "after reload"}],
            "request-after-endpoint-closed",
        ),
        ("raw-messages.html", TEXT, [*GO, {"wait": 500}], "duplicate-id"),
        ("raw-messages.html", TEXT, [*GO, {"wait": 500}], "ignored-message"),
        ("raw-messages-own-window.html", TEXT, [*GO, {"wait": 500}], "duplicate-id"),
        (
            "expired.html",
            TEXT,
            [*GO, {"waitForText": "never shown", "timeoutMs": 500}],
            "step-failed",
        ),
    ],
)
def test_faulty_napplet_is_reported(
    dist_dir: Path, tmp_path: Path, name: str, script: Any, steps: Any, expected: str
) -> None:
    status, report, output = check(dist_dir, tmp_path, FAULTY / name, script, steps)
    assert status == 1, output
    assert expected in kinds(report), output
    assert report["ok"] is False
    assert expected in output


def test_a_napplet_cannot_forge_or_silence_its_report(dist_dir: Path, tmp_path: Path) -> None:
    steps = [*CHOOSE, {"consent": "allow"}, {"waitForText": "started"}, {"wait": 500}]
    status, report, output = check(
        dist_dir, tmp_path, FAULTY / "forger.html", [{"stall": True}], steps
    )
    assert status == 1, output
    found = kinds(report)
    assert {"console-error", "network-request", "generation-abandoned"} <= found, output
    messages = [f["message"] for f in report["findings"] if f["kind"] == "console-error"]
    assert any("first-run error" in m for m in messages), messages
    assert all(e["endpoint"] != "forged" for e in report["envelopes"])


def test_a_violation_cannot_be_pushed_out_of_the_inspector(dist_dir: Path, tmp_path: Path) -> None:
    """A reused id followed at once by more valid requests than the inspector keeps is reported.

    The envelopes the check analyses must not depend on what the shell's
    inspector still holds (or has drawn) when the napplet floods it.
    """
    steps = [*CHOOSE, {"waitForText": "posted"}, {"wait": 800}]
    status, report, output = check(
        dist_dir, tmp_path, FAULTY / "evicts-its-violation.html", TEXT, steps
    )
    assert status == 1, output
    assert "duplicate-id" in kinds(report), output


def test_a_napplet_the_shell_stops_is_reported(dist_dir: Path, tmp_path: Path) -> None:
    """A napplet the shell stops (here: its frame leaves the sandboxed page;
    flooding and reloading too often end the same way) is not clean."""
    status, report, output = check(
        dist_dir, tmp_path, FAULTY / "leaves-sandbox.html", TEXT, [{"click": "#go"}, {"wait": 5000}]
    )
    assert status == 1, output
    assert "napplet-stopped" in kinds(report), output
    assert report["ok"] is False


def test_control_text_is_escaped_everywhere(dist_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "junit.xml").write_text("stale")
    status, report, output = check(
        dist_dir, tmp_path, FAULTY / "control-text.html", TEXT, [{"wait": 300}]
    )
    assert status == 1, output
    assert "\x1b" not in output and "\r" not in output and "\x07" not in output
    lines = output.splitlines()
    assert not any(line.startswith("::") for line in lines)
    assert [
        line for line in lines if "no findings" in line and line.startswith("napllm-check:")
    ] == []
    messages = [f["message"] for f in report["findings"] if f["kind"] == "console-error"]
    assert any("\\ud800" in m for m in messages), messages
    (out / "report.json").read_bytes().decode("ascii")


def test_a_napplet_that_never_yields_still_gets_a_report(dist_dir: Path, tmp_path: Path) -> None:
    # A shorter step bound than the default 15 s: every bound here is waited out.
    status, report, output = check(
        dist_dir,
        tmp_path,
        FAULTY / "spinner.html",
        TEXT,
        [{"click": "#go"}],
        "--timeout-ms",
        "6000",
    )
    assert status == 1, output
    assert "napplet-unresponsive" in kinds(report), output
    assert report["ok"] is False


def test_bad_script_is_refused_before_the_browser_starts(tmp_path: Path) -> None:
    (tmp_path / "turns.json").write_text('[{"text": "a", "delay": 5}]')
    done = subprocess.run(
        [
            *(sys.executable, "-m", "napllm.devtools.check", str(FAULTY / "expired.html")),
            *("--script", str(tmp_path / "turns.json"), "--out", str(tmp_path / "out")),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT / "runtime")},
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "turns[0].delay: Extra inputs are not permitted" in done.stderr


# --------------------------------------------------------------------------- the docs' walkthrough


def test_docs_walkthrough_passes(dist_dir: Path, tmp_path: Path) -> None:
    """docs/napplets.md includes these files; the check it shows must pass."""
    example = ROOT / "docs/examples/hello"
    doc = (ROOT / "docs/napplets.md").read_text()
    for name in ("hello.html", "turns.json", "steps.json"):
        assert f"examples/hello/{name}" in doc
    status, report, output = check(
        dist_dir,
        tmp_path,
        example / "hello.html",
        (example / "turns.json").read_text(),
        json.loads((example / "steps.json").read_text()),
    )
    assert status == 0, output
    assert report["ok"] is True


# --------------------------------------------------------------------------- Python napplets
# Each check of a Python napplet boots Pyodide in its frame: two in all.

LEAKY_STEPS = [*CHOOSE, {"consent": "allow"}, {"waitForText": "started"}, {"wait": 300}]
LEAKS = {"network-request", "console-error", "generation-abandoned", "page-error"}


def test_python_extract_example_is_clean(dist_dir: Path, tmp_path: Path) -> None:
    """The check waits for Pyodide to boot and the napplet's scripts to run, then drives it."""
    rows = [{"name": "Alice", "age": 30, "city": "Paris"}, {"name": "Bob", "age": 41, "city": None}]
    steps = [
        {"click": "#extract"},
        {"chooser": "allow"},
        {"consent": "allow"},
        {"waitForText": "2 row(s).", "selector": "#status"},
    ]
    status, report, output = check(
        dist_dir, tmp_path, ROOT / "napplets/extract/index.html", [{"json": {"rows": rows}}], steps
    )
    assert status == 0, output
    assert report["ok"] is True
    types = [e["envelope"]["type"] for e in report["envelopes"] if e["envelope"]]
    assert "llm.generate" in types and "llm.generate.result" in types


def test_a_leaky_python_napplet_is_reported_like_its_javascript_twin(
    dist_dir: Path, tmp_path: Path
) -> None:
    """Python and JavaScript napplets doing the same wrong things get the same findings."""
    found = {}
    for name in ("leaky.html", "leaky-python.html"):
        (tmp_path / name).mkdir()
        status, report, output = check(
            dist_dir, tmp_path / name, FAULTY / name, [{"stall": True}], LEAKY_STEPS
        )
        assert status == 1, output
        found[name] = report
    assert kinds(found["leaky.html"]) == LEAKS, found["leaky.html"]["findings"]
    assert kinds(found["leaky-python.html"]) == LEAKS, found["leaky-python.html"]["findings"]
    errors = [f["message"] for f in found["leaky-python.html"]["findings"]]
    assert any("RuntimeError: the tracker is gone" in m for m in errors), errors
