"""`napllm-check`'s reports: `report.json`, `junit.xml`, the summary lines.

Every text printed or written goes through `printable` (no control
characters, no lone surrogates); files are written to a temporary file and
renamed (`write_reports`).
"""

from __future__ import annotations

import json
import os
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from .analysis import CATEGORIES, Finding
from .check_observe import Run

#: Characters never written raw to a terminal, a CI log or a report: C0 and
#: C1 controls (ESC, CR, BEL, newlines), DEL, line and paragraph separators,
#: bidirectional overrides and lone UTF-16 surrogates.
_UNPRINTABLE = re.compile(
    "[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ufeff\ud800-\udfff]"
)
REPORT_FILES = ("report.json", "junit.xml", "screenshot.png")


def printable(text: str) -> str:
    """`text` with every character of `_UNPRINTABLE` written as `\\xNN` / `\\uNNNN`.

    The result is one line that a terminal, a CI log (which reads lines
    starting with `::` as commands) and XML 1.0 all take as plain text.
    """

    def escape(match: re.Match[str]) -> str:
        code = ord(match.group())
        return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"

    return _UNPRINTABLE.sub(escape, text)


def _printable_json(value: Any) -> Any:
    """`value` with `printable` applied to every string (keys included)."""
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, list):
        return [_printable_json(v) for v in value]
    if isinstance(value, dict):
        return {printable(str(k)): _printable_json(v) for k, v in value.items()}
    return value


def report_json(run: Run, findings: list[Finding], error: str | None = None) -> dict[str, Any]:
    """The JSON report: verdict, findings, steps, envelopes, shell console errors.

    `error`: why the check could not run (then `ok` is false). Envelopes are
    kept as recorded (JSON escapes them); every other text is `printable`.
    """
    report: dict[str, Any] = {
        "napplet": printable(run.napplet),
        "ok": not findings and error is None,
        "findings": _printable_json([f.to_json() for f in findings]),
        "steps": _printable_json(run.steps),
        "envelopes": [
            {
                "endpoint": printable(e.endpoint),
                "direction": printable(e.direction),
                "envelope": e.value,
            }
            for e in list(run.envelopes)
        ],
        "shellConsoleErrors": _printable_json(list(run.shell_console)),
        "screenshot": run.screenshot,
    }
    if error is not None:
        report["error"] = printable(error)
    return report


def junit_xml(run: Run, findings: list[Finding]) -> str:
    """JUnit XML: one test case per category (steps, protocol, errors, console, network).

    Every text is `printable`, so the document is well-formed XML 1.0.
    """
    categories = ("steps", "protocol", "errors", "console", "network")
    suite = ET.Element(
        "testsuite",
        name="napllm-check",
        tests=str(len(categories)),
        failures=str(len({CATEGORIES.get(f.kind, "other") for f in findings})),
    )
    for category in categories:
        case = ET.SubElement(
            suite,
            "testcase",
            classname=printable(f"napllm-check.{Path(run.napplet).name}"),
            name=category,
        )
        mine = [f for f in findings if CATEGORIES.get(f.kind, "other") == category]
        if mine:
            failure = ET.SubElement(
                case, "failure", message=f"{len(mine)} finding(s)", type=printable(mine[0].kind)
            )
            failure.text = "\n".join(f"[{printable(f.kind)}] {printable(f.message)}" for f in mine)
    return ET.tostring(suite, encoding="unicode", xml_declaration=True)


def summary_lines(findings: list[Finding], napplet_name: str, out: Path) -> list[str]:
    """What the command prints: one escaped line per finding, then the verdict line."""
    lines = [f"[{printable(f.kind)}] {printable(f.message)}" for f in findings]
    verdict = "no findings" if not findings else f"{len(findings)} finding(s)"
    lines.append(
        f"napllm-check: {printable(napplet_name)}: {verdict}; report in {printable(str(out))}"
    )
    return lines


def _write_atomic(path: Path, text: str) -> None:
    """Write `text` (UTF-8) to `path` through a temporary file and a rename."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        temporary.write_text(text, encoding="utf-8")
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def clear_reports(out: Path) -> None:
    """Remove the report files an earlier run left in `out`."""
    for name in REPORT_FILES:
        (out / name).unlink(missing_ok=True)


def write_reports(out: Path, run: Run, findings: list[Finding], error: str | None = None) -> None:
    """Write `report.json` (ASCII JSON) and `junit.xml` into `out`, each atomically."""
    out.mkdir(parents=True, exist_ok=True)
    report = report_json(run, findings, error)
    _write_atomic(out / "report.json", json.dumps(report, indent=2, ensure_ascii=True))
    if error is not None:
        findings = [Finding("check-aborted", error)]
    _write_atomic(out / "junit.xml", junit_xml(run, findings))
