"""web/napplet-llm.d.ts and web/prompt-api.d.ts: the example napplets type-check
against them, and misuse does not.

The TypeScript compiler comes from npm (the `typescript` devDependency);
each napplet's inline scripts are checked with `checkJs` as they are
written, as a napplet developer's editor would check them.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TYPES = ROOT / "web" / "napplet-llm.d.ts"
PROMPT_API_TYPES = ROOT / "web" / "prompt-api.d.ts"
TSC = ROOT / "node_modules" / "typescript" / "bin" / "tsc"
#: The example napplets written in JavaScript (a Python napplet opts in with
#: `<meta name="napplet-python">` and has no JavaScript to check).
NAPPLETS = sorted(
    p
    for p in (ROOT / "napplets").glob("*/index.html")
    if 'name="napplet-python"' not in p.read_text(encoding="utf-8")
)
INLINE_SCRIPT = re.compile(r"<script>(.*?)</script>", re.DOTALL)

pytestmark = pytest.mark.skipif(
    shutil.which("node") is None or not TSC.is_file(),
    reason="needs node and the typescript devDependency (npm ci)",
)


def typecheck(folder: Path, scripts: dict[str, str]) -> str:
    """Run tsc --checkJs over `scripts` (name -> source) with both type files; its output."""
    files = [str(TYPES), str(PROMPT_API_TYPES)]
    for name, source in scripts.items():
        path = folder / name
        path.write_text(source, encoding="utf-8")
        files.append(str(path))
    config = {
        "compilerOptions": {
            "allowJs": True,
            "checkJs": True,
            "noEmit": True,
            "target": "ES2022",
            "lib": ["ES2022", "DOM", "DOM.Iterable"],
            "moduleDetection": "force",
            "types": [],
        },
        "files": files,
    }
    (folder / "tsconfig.json").write_text(json.dumps(config), encoding="utf-8")
    done = subprocess.run(
        ["node", str(TSC), "-p", str(folder / "tsconfig.json")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    return done.stdout + done.stderr


def test_example_napplets(tmp_path: Path) -> None:
    assert [p.parent.name for p in NAPPLETS] == ["chat", "json", "prompt", "tools"]
    scripts: dict[str, str] = {}
    for html in NAPPLETS:
        found = INLINE_SCRIPT.findall(html.read_text(encoding="utf-8"))
        assert found, f"{html} has no inline script"
        for index, source in enumerate(found):
            scripts[f"{html.parent.name}_{index}.js"] = source
    assert typecheck(tmp_path, scripts) == ""


def test_misuse_is_reported(tmp_path: Path) -> None:
    faulty = """
const llm = window.napplet.llm;
async function main() {
  const model = await llm.select({ json: "yes" });
  llm.generate({ handle: model.handel, messages: [{ role: "robot", content: [] }] });
  const g = llm.generate({ handle: model.handle, messages: [] });
  for await (const d of g.deltas) d.sequnce;
  const r = await g;
  if (r.finish === "done") return;
}
main();
"""
    output = typecheck(tmp_path, {"faulty.js": faulty})
    lines = {int(m) for m in re.findall(r"faulty\.js\((\d+),\d+\): error", output)}
    # 4: json is a boolean; 5: no `handel`, no role "robot"; 7: no `sequnce`;
    # 9: "done" is not a finish
    assert lines == {4, 5, 7, 9}, output
    assert "handel" in output and "sequnce" in output


def test_prompt_api_misuse_is_reported(tmp_path: Path) -> None:
    faulty = """
async function main() {
  const session = await LanguageModel.create({ initialPrompts: [{ role: "bot", content: "" }] });
  const text = await session.prompt("Hi", { responseConstraint: { type: "object" } });
  text.toFixed();
  await session.prompt("Hi", { signl: new AbortController().signal });
  const tools = [{ name: "t", inputSchema: { type: "object" } }];
  await LanguageModel.create({ tools });
  for await (const chunk of session.promptStreaming("Hi")) chunk.toUpperCase();
  session.contextUsage = 3;
  const availability = await LanguageModel.availability();
  if (availability === "ready") return;
}
main();
"""
    output = typecheck(tmp_path, {"faulty.js": faulty})
    lines = {int(m) for m in re.findall(r"faulty\.js\((\d+),\d+\): error", output)}
    # 3: no role "bot"; 5: prompt resolves with a string; 6: no `signl`;
    # 8: a tool needs execute; 10: contextUsage is read-only; 12: no "ready"
    assert lines == {3, 5, 6, 8, 10, 12}, output


def test_shipped_in_dist() -> None:
    for types in (TYPES, PROMPT_API_TYPES):
        dist = ROOT / "dist" / types.name
        if not dist.is_file():
            pytest.skip("dist/ is not built")
        assert dist.read_bytes() == types.read_bytes()
