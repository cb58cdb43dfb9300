"""The napplet of docs/napplets.md's walkthrough type-checks against web/napplet-llm.d.ts,
and the script and steps the doc includes are valid for the scripted connection
and napllm-check (the run itself is tests/browser/test_napllm_check.py)."""

from __future__ import annotations

from pathlib import Path

from test_napplet_types import INLINE_SCRIPT, pytestmark, typecheck

from napllm.devtools.check_steps import parse_steps
from napllm.providers.scripted import parse_script

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "docs" / "examples" / "hello"

__all__ = ["pytestmark"]


def test_docs_napplet_type_checks(tmp_path: Path) -> None:
    found = INLINE_SCRIPT.findall((EXAMPLE / "hello.html").read_text(encoding="utf-8"))
    assert len(found) == 1
    assert typecheck(tmp_path, {"hello.js": found[0]}) == ""


def test_docs_script_and_steps_are_valid() -> None:
    script = parse_script((EXAMPLE / "turns.json").read_text(encoding="utf-8"))
    assert len(script.turns) == 2
    steps = parse_steps((EXAMPLE / "steps.json").read_text(encoding="utf-8"))
    assert len(steps) == 9


def test_ci_workflow_example_runs_napllm_check() -> None:
    yaml = __import__("pytest").importorskip("yaml")
    workflow = yaml.safe_load((ROOT / "docs" / "napllm-check.yml").read_text(encoding="utf-8"))
    steps = workflow["jobs"]["napllm-check"]["steps"]
    commands = " ".join(str(step.get("run", "")) for step in steps)
    for part in ("napllm-check", "--script", "--steps", "--dist", "build.py", "chromium"):
        assert part in commands
    uploads = [s for s in steps if str(s.get("uses", "")).startswith("actions/upload-artifact")]
    assert uploads and uploads[0]["with"]["path"].startswith("napllm-check-out")
    assert "napllm-check.yml" in (ROOT / "docs" / "napplets.md").read_text(encoding="utf-8")
