"""One declaration per engine (napllm.providers.engine_specs): the page's
shared code, the service worker and the build loop over the declarations,
and name no engine.

"Names an engine" is read strictly on what a declaration holds: a string
literal that is an engine's kind, one of its own cache names, its worker,
adapter or offline module (by file name), or one of its precache globs or
lazy folders. Comments may explain; code may not list.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from napllm.providers.engine_specs import ENGINE_SPECS, RESERVED_KINDS, page_declarations

ROOT = Path(__file__).resolve().parents[2]

#: Build steps that still know the engines' libraries and built-in models
#: (bundling wllama, web-llm and transformers.js; TinyChat in three formats;
#: WebLLM's catalogue; the test build's WebLLM double): docs/design.md,
#: "Adding an engine", says what they are. Nothing else may join this list.
BUILD_STEPS_NOT_YET_DECLARED = frozenset({"bundles.py", "models.py", "paths.py", "dist.py"})

#: The shared code that must loop over the declarations (docs/design.md, "Adding an engine").
SHARED = [
    *sorted((ROOT / "web" / "js").glob("*.js")),
    ROOT / "web" / "sw-napllm.js",
    *sorted(
        path
        for path in (ROOT / "tools" / "buildsys").glob("*.py")
        if path.name not in BUILD_STEPS_NOT_YET_DECLARED
    ),
]

_STRING = re.compile(r"""(["'`])((?:\\.|(?!\1)[^\\\n])*)\1""")
_LINE_COMMENT = re.compile(r"^\s*(#|//|\*|/\*)")


def engine_names() -> set[str]:
    """Every literal that would name an engine (module doc)."""
    names: set[str] = set()
    for spec, page in zip(ENGINE_SPECS, page_declarations(), strict=True):
        names.add(spec.kind)
        names.update(page.get("caches", {}))
        for key in ("worker", "adapter", "offline"):
            if key in page:
                names.add(str(page[key]).rsplit("/", 1)[-1])
        names.update(page.get("precache", ()))
        names.update(page.get("lazy", ()))
    return names


def literals(path: Path) -> list[tuple[int, str]]:
    """The string literals of a JS or Python file, outside whole-line comments."""
    found: list[tuple[int, str]] = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if _LINE_COMMENT.match(line):
            continue
        found.extend((number, match.group(2)) for match in _STRING.finditer(line))
    return found


def naming(path: Path, names: set[str]) -> list[str]:
    """`path:line: literal` for each literal that names an engine."""
    out = []
    for number, text in literals(path):
        if any(text == name or (len(name) > 4 and name in text) for name in names):
            out.append(f"{path.relative_to(ROOT)}:{number}: {text!r}")
    return out


def test_no_shared_page_service_worker_or_build_file_names_an_engine() -> None:
    names = engine_names()
    assert {"wasm", "webllm", "onnx"} <= names
    found = [hit for path in SHARED for hit in naming(path, names)]
    assert found == []


def test_the_check_sees_a_file_that_lists_an_engine(tmp_path: Path) -> None:
    """The check above can fail: a file like the page's old lists is caught."""
    planted = ROOT / "web" / "js" / "planted-for-the-test.js"
    try:
        planted.write_text(
            'const KINDS = new Set(["wasm"]);\n'
            '// "webllm" in a comment is words\n'
            'const X = { "transformers-cache": 1 };\n'
        )
        hits = naming(planted, engine_names())
    finally:
        planted.unlink()
    assert [hit.split(": ", 1)[0].rsplit(":", 1)[1] for hit in hits] == ["1", "3"]


def test_the_page_engines_import_nothing_of_the_page() -> None:
    """web/engines/ is the engines' side: it never imports web/js/."""
    imports = re.compile(r"""(?:from|import)\s*\(?\s*["']([^"']+)["']""")
    found = []
    for path in sorted((ROOT / "web" / "engines").glob("*.js")):
        for target in imports.findall(path.read_text(encoding="utf-8")):
            if "/js/" in target or target.startswith("../js"):
                found.append(f"{path.name}: {target}")
    assert found == []


def test_each_declared_file_exists_and_every_engine_worker_is_declared() -> None:
    for page in page_declarations():
        for key in ("worker", "adapter", "offline"):
            if key in page:
                assert (ROOT / "web" / page[key]).is_file(), page[key]
    declared = {page.get(k) for page in page_declarations() for k in ("worker", "adapter")}
    for worker in (ROOT / "web" / "engines").glob("*-worker.js"):
        if worker.name.startswith("offline-"):
            continue  # the shared offline module that asks a worker, not a worker
        # Every engine worker is some engine's, or the adapter's own worker.
        name = f"engines/{worker.name}"
        assert name in declared or any(
            (ROOT / "web" / str(a)).read_text().find(worker.name) >= 0 for a in declared if a
        ), name


def declaration(**changes: object) -> dict[str, object]:
    base: dict[str, object] = {"kind": "echo", "worker": "engines/echo-worker.js"}
    return base | changes


@pytest.mark.parametrize(
    "page",
    [
        declaration(worker="../../etc/worker.js"),
        declaration(worker="https://elsewhere.example/w.js"),
        declaration(kind="other"),
        declaration(lazy=["/abs/"]),
        declaration(offline="engines/../../x.js"),
        declaration(caches={"c": "label only"}),
        declaration(caches={"c": {"label": "L", "entry": "folder?"}}),
        declaration(weights=[{"suffix": ".bin"}]),
        declaration(weights=[{"suffix": ".bin", "pattern": "x", "limit": 1}]),
        declaration(weights=[{"pattern": "(", "limit": 1}]),
        declaration(weights=[{"suffix": ".bin", "limit": True}]),
    ],
)
def test_a_malformed_declaration_stops_the_build(page: dict[str, object]) -> None:
    class Spec:
        kind = "echo"

    Spec.page = page  # type: ignore[attr-defined]
    with pytest.raises(ValueError):
        page_declarations((Spec(),))  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", [*sorted(RESERVED_KINDS), "Echo", "wasm"])
def test_an_engine_cannot_take_a_protocol_or_taken_kind(kind: str) -> None:
    class Spec:
        pass

    Spec.kind = kind  # type: ignore[attr-defined]
    Spec.page = {"kind": kind}  # type: ignore[attr-defined]
    specs = (*ENGINE_SPECS, Spec()) if kind == "wasm" else (Spec(),)
    with pytest.raises(ValueError):
        page_declarations(specs)  # type: ignore[arg-type]
