"""One declaration per engine (napllm.providers.engine_specs): the page's
shared code, the service worker and the build loop over the declarations,
and name no engine.

"Names an engine" is read strictly on what a declaration holds: a string
literal that is an engine's kind, one of its own cache names, its worker,
adapter or offline module (by file name), one of its precache globs or
lazy folders, or what its build declaration names (a bundle's entry or
output, a file copied from node_modules/, its model's folder in dist/, its
catalogue, its test hooks). Comments may explain; code may not list.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from napllm.providers.engine_specs import (
    ENGINE_SPECS,
    RESERVED_KINDS,
    build_declarations,
    page_declarations,
)

ROOT = Path(__file__).resolve().parents[2]

#: The shared code that must loop over the declarations (docs/design.md, "Adding an engine").
SHARED = [
    *sorted((ROOT / "web" / "js").glob("*.js")),
    ROOT / "web" / "sw-napllm.js",
    *sorted((ROOT / "tools" / "buildsys").glob("*.py")),
]

_STRING = re.compile(r"""(["'`])((?:\\.|(?!\1)[^\\\n])*)\1""")
_LINE_COMMENT = re.compile(r"^\s*(#|//|\*|/\*)")


def engine_names() -> set[str]:
    """Every literal that would name an engine (module doc)."""
    names: set[str] = set()
    for spec, page in zip(ENGINE_SPECS, page_declarations(), strict=True):
        names.add(spec.kind)
        names.update(page.get("caches", {}))
        for key in ("worker", "adapter", "offline", "leftovers"):
            if key in page:
                names.add(str(page[key]).rsplit("/", 1)[-1])
        names.update(page.get("precache", ()))
        names.update(page.get("lazy", ()))
    return names


def build_names() -> set[str]:
    """What the engines' build declarations name (module doc), for the build's own files."""
    names: set[str] = set()
    for build in build_declarations():
        names.update(item for b in build.get("bundles", ()) for item in b.values())
        names.update(item for v in build.get("vendor", ()) for item in v.values())
        names.update(model["dest"] for model in build.get("models", ()))
        names.update([build["catalog"]["file"]] if "catalog" in build else [])
        test = build.get("test", {})
        for rel, hook in test.get("replace", {}).items():
            names.update([rel, hook["hook"], *([hook["product"]] if "product" in hook else [])])
        for rel, name in test.get("add", {}).items():
            names.update([rel, name])
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


def test_no_shared_file_names_an_engines_library_model_or_test_hook() -> None:
    """The build's steps read bundles, vendor files, models, the catalogue and
    the test hooks from the build declarations (`build_declarations`); the
    page's shared code reaches an engine's library only through a module the
    engine declares (a storage leftover module, `leftovers`)."""
    names = engine_names() | build_names()
    assert {"vendor/web-llm/web-llm.js", "models/tinychat-onnx", "webllm-factory.js"} <= names
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
        for key in ("worker", "adapter", "offline", "leftovers"):
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


def test_each_build_declaration_names_files_that_exist() -> None:
    """Entries, model files (listed in their SHA256SUMS) and test hooks are in the repository."""
    for build in build_declarations():
        for bundle in build.get("bundles", ()):
            assert (ROOT / "web" / "vendor-entry" / bundle["entry"]).is_file(), bundle
        for model in build.get("models", ()):
            folder = ROOT / "models" / model["source"]
            listed = (folder / "SHA256SUMS").read_text(encoding="utf-8")
            for name in model["files"]:
                assert (folder / name).is_file() and f" {name}\n" in listed, name
        test = build.get("test", {})
        hooks = [hook["hook"] for hook in test.get("replace", {}).values()]
        for name in [*hooks, *test.get("add", {}).values()]:
            assert (ROOT / "tests" / "hooks" / name).is_file(), name


def build_spec(build: dict[str, object], kind: str = "echo") -> object:
    """A spec of `kind` (its module: this one) with the build declaration `build`."""

    class Spec:
        pass

    Spec.kind = kind  # type: ignore[attr-defined]
    Spec.build = build  # type: ignore[attr-defined]
    return Spec()


def make_catalog(exports: object, models: object) -> dict[str, object]:
    """A catalogue function of this module, for `build_spec`'s `make`."""
    return {"exports": exports, "models": models}


GOOD_BUILD: dict[str, object] = {
    "bundles": [{"entry": "echo.js", "output": "vendor/echo/echo.js"}],
    "packages": ["@scope/echo", "echo-runtime"],
    "vendor": [{"from": "@scope/echo/dist/echo.wasm", "to": "vendor/echo/echo.wasm"}],
    "models": [{"source": "echo", "dest": "models/echo", "files": ["weights/model.bin"]}],
    "catalog": {
        "bundle": "vendor/echo/echo.js",
        "exports": ["catalog"],
        "file": "vendor/echo/catalog.json",
        "make": "make_catalog",
    },
    "test": {
        "replace": {"engines/echo.js": {"hook": "echo.js", "product": "engines/echo.product.js"}},
        "add": {"testhooks/echo-double.js": "echo-double.js"},
    },
}


def test_a_well_formed_build_declaration_is_read_as_it_is() -> None:
    assert build_declarations((build_spec(GOOD_BUILD),)) == [{"kind": "echo", **GOOD_BUILD}]  # type: ignore[arg-type]
    # An engine without a library or a model declares nothing.
    assert build_declarations((build_spec({}),)) == [{"kind": "echo"}]  # type: ignore[arg-type]
    assert [b["kind"] for b in build_declarations()] == [s.kind for s in ENGINE_SPECS]


def changed(key: str, value: object) -> dict[str, object]:
    return GOOD_BUILD | {key: value}


@pytest.mark.parametrize(
    "build",
    [
        changed("bundles", [{"entry": "echo.js", "output": "../vendor/echo.js"}]),
        changed("bundles", [{"entry": "../../etc/echo.js", "output": "vendor/echo/echo.js"}]),
        changed("bundles", [{"entry": "echo.js", "output": "/abs/echo.js"}]),
        changed("bundles", [{"entry": "echo.js"}]),
        changed("vendor", [{"from": "echo/../../secret", "to": "vendor/echo/x"}]),
        changed("vendor", [{"from": "echo/x.wasm", "to": "https://cdn.example/x.wasm"}]),
        changed("vendor", [{"from": "echo/x.wasm", "to": "vendor/echo/"}]),
        changed("models", [{"source": "echo", "dest": "models/echo", "files": ["../SHA256SUMS"]}]),
        changed("models", [{"source": "echo", "dest": "../models", "files": ["a.bin"]}]),
        changed("models", [{"source": "/echo", "dest": "models/echo", "files": ["a.bin"]}]),
        changed("models", [{"source": "echo", "dest": "models/echo", "files": []}]),
        changed("packages", ["Not A Package"]),
        changed("catalog", {**GOOD_BUILD["catalog"], "make": "no_such_function"}),  # type: ignore[dict-item]
        changed("catalog", {**GOOD_BUILD["catalog"], "make": "os.system"}),  # type: ignore[dict-item]
        changed("catalog", {**GOOD_BUILD["catalog"], "bundle": "vendor/other.js"}),  # type: ignore[dict-item]
        changed("catalog", {**GOOD_BUILD["catalog"], "file": "../catalog.json"}),  # type: ignore[dict-item]
        changed("catalog", {**GOOD_BUILD["catalog"], "exports": ["a-b"]}),  # type: ignore[dict-item]
        changed("test", {"replace": {"engines/echo.js": {"hook": "../../echo.js"}}}),
        changed("test", {"replace": {"../index.html": {"hook": "echo.js"}}}),
        changed("test", {"add": {"testhooks/x.js": "hooks/x.js"}}),
        changed("test", {"remove": {}}),
        changed("scripts", ["postinstall"]),
        # two entries of one engine write the same file of dist/
        changed("vendor", [{"from": "echo/a.js", "to": "vendor/echo/echo.js"}]),
    ],
)
def test_a_malformed_build_declaration_stops_the_build(build: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        build_declarations((build_spec(build),))  # type: ignore[arg-type]


def test_two_engines_cannot_write_the_same_file_of_dist() -> None:
    other = {"models": [{"source": "other", "dest": "models/echo", "files": ["weights/model.bin"]}]}
    with pytest.raises(ValueError, match="twice"):
        build_declarations((build_spec(GOOD_BUILD), build_spec(other, "other")))  # type: ignore[arg-type]
