"""The runtime's shape, read from its source with `ast` (docs/design.md, the map).

Checked: no import cycle in `runtime/napllm`; no import from a lower layer
to a higher one (records <- providers <- rules <- shell <- the programs:
browser, devtools, napplet, lmsp_service); the result-assembly files import
each other one way only; no comparison of a connection's kind with a kind's
name outside the kinds' own classes (`providers/connection_kinds.py`).
Imports inside functions count like the others.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

from napllm.kinds import FIXTURE_KIND, FORM_KINDS

RUNTIME = Path(__file__).resolve().parents[2] / "runtime"
PACKAGE = RUNTIME / "napllm"

#: Each module (or package prefix) and its layer; a module imports only from
#: its own layer or lower ones.
LAYERS: dict[str, int] = {
    # records: plain data and the checks of what comes in
    **dict.fromkeys(
        (
            "napllm",
            "napllm.errors",
            "napllm.jsontext",
            "napllm.pattern_cost",
            "napllm.schema",
            "napllm.connection_records",
            "napllm.records",
            "napllm.lmsp",
            "napllm.toolcall_text",
            "napllm.lifecycle",
            "napllm.wire",
            "napllm.conversation",
            "napllm.intake",
        ),
        0,
    ),
    # providers: the ways to reach a model, and looking for servers
    "napllm.providers": 1,
    # the connection kinds' table and the form's specs: an engine's row is its
    # spec's data (providers.engine_specs), so they sit beside the providers
    "napllm.kinds": 1,
    "napllm.connections": 1,
    "napllm.discovery": 1,
    # rules: the shell's ports, result assembly, generations and selects
    **dict.fromkeys(
        (
            "napllm.shell_ports",
            "napllm.grants",
            "napllm.streaming",
            "napllm.output_order",
            "napllm.output_result",
            "napllm.translate",
            "napllm.generations",
            "napllm.selections",
        ),
        2,
    ),
    "napllm.shell": 3,
    # the programs around the shell
    "napllm.browser": 4,
    "napllm.devtools": 4,
    "napllm.napplet": 4,
    "napllm.lmsp_service": 4,
}
LAYER_NAMES = ("records", "providers", "rules", "shell", "programs")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(RUNTIME).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imported(name: str, path: Path) -> set[str]:
    """The napllm modules `name` imports (a name imported from a package that is
    itself a module counts as that module)."""
    known = modules()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            targets = [source]
            targets += [f"{source}.{a.name}" for a in node.names if f"{source}.{a.name}" in known]
        else:
            continue
        found.update(t for t in targets if t in known and t != name)
    return found


@cache
def graph() -> dict[str, frozenset[str]]:
    return {name: frozenset(imported(name, path)) for name, path in modules().items()}


def layer(name: str) -> int:
    best = max((p for p in LAYERS if name == p or name.startswith(p + ".")), key=len)
    return LAYERS[best]


def test_every_module_has_a_layer() -> None:
    for name in modules():
        assert any(name == p or name.startswith(p + ".") for p in LAYERS), name


def test_no_import_runs_up_a_layer() -> None:
    upward = [
        f"{name} ({LAYER_NAMES[layer(name)]}) imports {dep} ({LAYER_NAMES[layer(dep)]})"
        for name, deps in graph().items()
        for dep in deps
        if layer(dep) > layer(name)
    ]
    assert upward == []


def test_no_import_cycle() -> None:
    edges = graph()
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for dep in sorted(edges[node]):
            if state.get(dep) == 1:
                cycles.append([*trail[trail.index(dep) :], dep])
            elif dep not in state:
                visit(dep, [*trail, dep])
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    assert cycles == []


def test_result_assembly_files_import_each_other_one_way() -> None:
    files = ("napllm.output_order", "napllm.output_result", "napllm.translate")
    edges = graph()
    both = [(a, b) for a in files for b in files if a < b and b in edges[a] and a in edges[b]]
    assert both == []
    # The order hands a settled record on; it never calls back into the result.
    assert not {"napllm.output_result", "napllm.translate"} & edges["napllm.output_order"]


KIND_NAMES = frozenset((*FORM_KINDS, FIXTURE_KIND))
#: The kinds' own classes: the one place a kind may be named in a comparison.
KIND_CLASSES = {"napllm.providers.connection_kinds"}


def _names_kind(node: ast.expr) -> bool:
    if isinstance(node, ast.Attribute):
        return node.attr == "kind"
    return isinstance(node, ast.Name) and node.id == "kind"


def _kind_literal(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant):
        return node.value in KIND_NAMES
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_kind_literal(e) for e in node.elts)
    return False


def kind_comparisons(source: str) -> list[int]:
    """Lines comparing a `kind` (name or attribute) with a connection kind's name."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(map(_names_kind, sides)) and any(map(_kind_literal, sides)):
                lines.append(node.lineno)
    return lines


def test_the_scan_finds_a_kind_chain() -> None:
    chain = (
        "if connection.kind == 'lmsp':\n    pass\n"
        "elif kind in ('wasm', 'onnx'):\n    pass\n"
        "if item.kind == 'message':\n    pass\n"
    )
    assert kind_comparisons(chain) == [1, 3]


def test_no_connection_kind_chain_outside_the_kinds_classes() -> None:
    found = [
        f"{name}:{line}"
        for name, path in sorted(modules().items())
        if name not in KIND_CLASSES
        for line in kind_comparisons(path.read_text(encoding="utf-8"))
    ]
    assert found == []
