"""The repository's own map stays true: docstrings name things that exist and
nothing refers to a design file outside the repository (docs/design.md, "Style").

- Every backticked dotted name in a runtime docstring whose first part is a
  napllm module (`translate.GenerationAssembler`,
  `providers.chat_stream.ChatStreamToLmsp`, `napllm.kinds.KINDS`) must
  resolve to a module, a top-level name of that module, or a member of one
  of its classes. Modules are read as source (AST),
  so the page-only modules (`napllm.browser.*`) are checked without a browser.
- docs/design.md and the README are held to the same rule.
- No tracked text file cites the design notes that lived outside the
  repository; docs/design.md is the map.
"""

from __future__ import annotations

import ast
import re
import subprocess
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "runtime" / "napllm"

#: A backticked dotted name: `a.b`, `a.b.c`, optionally called: `a.b()`.
DOTTED = re.compile(r"`([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(?:\(\))?`")
#: File names written in backticks (`streams.js`, `lmsp.md`) are not names.
FILE_SUFFIXES = {
    "py",
    "js",
    "ts",
    "md",
    "json",
    "html",
    "css",
    "gguf",
    "onnx",
    "txt",
    "toml",
    "yml",
}


def module_files() -> dict[str, Path]:
    """Dotted module name (without `napllm.`) -> its source file."""
    found: dict[str, Path] = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


MODULES = module_files()


@cache
def names_of(module: str) -> frozenset[str]:
    """Names a module defines: top-level names and `Class.member` pairs."""
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    names: set[str] = set()

    def targets(node: ast.stmt) -> list[str]:
        if isinstance(node, ast.Assign):
            return [t.id for t in node.targets if isinstance(t, ast.Name)]
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            return [node.target.id]
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            return [node.name]
        if isinstance(node, ast.Import | ast.ImportFrom):
            return [(a.asname or a.name).split(".")[0] for a in node.names]
        return []

    for node in ast.walk(tree):
        if isinstance(node, ast.If | ast.Try):
            for child in node.body:
                names.update(targets(child))
    for node in tree.body:
        names.update(targets(node))
        if isinstance(node, ast.ClassDef):
            for member in node.body:
                names.update(f"{node.name}.{n}" for n in targets(member))
                if isinstance(member, ast.FunctionDef) and member.name == "__init__":
                    for sub in ast.walk(member):
                        if (
                            isinstance(sub, ast.Attribute)
                            and isinstance(sub.value, ast.Name)
                            and sub.value.id == "self"
                            and isinstance(sub.ctx, ast.Store)
                        ):
                            names.add(f"{node.name}.{sub.attr}")
    return frozenset(names)


def candidates(head: str, here: str) -> list[str]:
    """Modules a reference's first part may name, nearest first."""
    if head == "napllm":
        return [""]
    package = here.rsplit(".", 1)[0] if "." in here else ""
    found = []
    for prefix in (package, ""):
        name = f"{prefix}.{head}" if prefix else head
        if name in MODULES:
            found.append(name)
    found.extend(m for m in MODULES if m.rsplit(".", 1)[-1] == head and m not in found)
    return found


def resolves(reference: str, here: str) -> bool | None:
    """Whether `reference` names something that exists (None: not a napllm reference)."""
    parts = reference.split(".")
    if parts[-1] in FILE_SUFFIXES:
        return None
    heads = candidates(parts[0], here)
    if not heads:
        return None
    for module in heads:
        rest = parts[1:]
        # Walk down submodules first: `providers.chat_stream.ChatStreamToLmsp`.
        while rest and (f"{module}.{rest[0]}" if module else rest[0]) in MODULES:
            module = f"{module}.{rest[0]}" if module else rest[0]
            rest = rest[1:]
        if not rest:
            return True
        if module not in MODULES:
            continue
        defined = names_of(module)
        if ".".join(rest[:2]) in defined or (len(rest) == 1 and rest[0] in defined):
            return True
    return False


def docstrings(path: Path) -> list[tuple[int, str]]:
    """(line, text) of the module's, its classes' and its functions' docstrings."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            text = ast.get_docstring(node, clean=False)
            if text:
                line = node.body[0].lineno
                found.append((line, text))
    return found


def unknown_references() -> list[str]:
    """`file:line: reference` for every reference that names nothing."""
    bad = []
    for module, path in sorted(MODULES.items()):
        for line, text in docstrings(path):
            for match in DOTTED.finditer(text):
                if resolves(match.group(1), module) is False:
                    shown = path.relative_to(ROOT)
                    bad.append(f"{shown}:{line}: `{match.group(1)}`")
    return bad


def test_every_backticked_module_name_in_runtime_docstrings_exists() -> None:
    assert unknown_references() == []


@pytest.mark.parametrize("document", ["docs/design.md", "README.md"])
def test_every_backticked_module_name_in_the_design_map_exists(document: str) -> None:
    text = (ROOT / document).read_text(encoding="utf-8")
    bad = [m.group(1) for m in DOTTED.finditer(text) if resolves(m.group(1), "") is False]
    assert bad == []


@pytest.mark.parametrize(
    ("reference", "here", "expected"),
    [
        ("translate.GenerationAssembler", "providers.base", True),
        ("translate.LmspToNap", "providers.base", False),
        ("providers.chat_stream.ChatStreamToLmsp", "shell", True),
        ("chat_stream.ChatStreamToLmsp.finish", "providers.engine", True),
        ("chat_stream.ChatStreamToLmsp.result", "providers.engine", False),
        ("napllm.kinds.KINDS", "shell", True),
        ("json.dumps", "shell", None),
        ("streams.js", "browser.engines", None),
    ],
)
def test_the_resolver_tells_names_that_exist_from_names_that_do_not(
    reference: str, here: str, expected: bool | None
) -> None:
    assert resolves(reference, here) is expected


#: Names of the design notes kept outside the repository (split so that
#: this file does not match itself).
OUTSIDE = re.compile(
    "|".join(["DES" + r"IGN\.md", "pit" + r"falls(\.md)?\b", "shared/" + "research"])
)


def tracked_text_files() -> list[Path]:
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
        ).stdout.decode()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [ROOT / name for name in listed.split("\0") if name and (ROOT / name).is_file()]


def test_nothing_refers_to_design_notes_outside_the_repository() -> None:
    offenders = []
    for path in tracked_text_files():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if OUTSIDE.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{number}")
    assert offenders == []


def test_the_design_map_exists_and_names_the_sections_the_code_cites() -> None:
    design = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")
    cited: set[str] = set()
    for path in tracked_text_files():
        if path.suffix not in {".py", ".js", ".md"}:
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        for match in re.finditer(r'docs/design\.md,?\s+((?:"[^"]+"(?:,\s*|\s+and\s+)?)+)', text):
            cited.update(" ".join(c.split()) for c in re.findall(r'"([^"]+)"', match.group(1)))
    headings = {h.strip() for h in re.findall(r"^#+\s+(.+)$", design, flags=re.M)}
    missing = sorted(c for c in cited if c not in headings)
    assert missing == []
