"""The engine registry: every engine that runs inside the page, one line each.

Rules (docs/design.md, "Adding an engine")
- `ENGINE_SPECS` is the one list of engines; everything that lists engines
  imports it: the page's providers (`browser.engines`), the connection
  kinds (`kinds.py` builds the engine rows of the form and their routes from
  each spec's `form` and `route`), the test and benchmark tools
  (`devtools.engines`), the build (`page_declarations`, written to
  dist/engines/engines.json for the page and the service worker).
- The order is the order of the kinds in the connections form and of the
  built-in connections.
- An engine's kind is a lower-case name, unique, and not one of the
  protocol kinds (`lmsp`, `openai`, `scripted`, `fixture`); its declared
  worker (or adapter) and lazy folders are paths inside dist/ (`engines/...`, no `..`):
  `page_declarations` raises `ValueError` otherwise, so a build stops.
- What the build makes of an engine is its spec's `build` declaration
  (`build_declarations`): its library's bundles and files, its built-in
  model, its test hooks, all paths checked the same way; what cannot be
  data (a catalogue made from the library's exports) is a function of the
  spec's own module, named in the declaration (`build_function`), so the
  build imports no engine and the function sits beside the records it makes.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Mapping
from typing import Any

from .engine import EngineSpec
from .engine_onnx import ONNX
from .engine_wasm import WASM
from .engine_webllm import WEBLLM

#: Every engine of the page (module rules).
ENGINE_SPECS: tuple[EngineSpec, ...] = (WASM, WEBLLM, ONNX)

#: Kinds an engine may not take: the protocol kinds and the test build's.
RESERVED_KINDS = frozenset({"lmsp", "openai", "scripted", "fixture"})
_KIND = re.compile(r"[a-z][a-z0-9-]{0,31}")
_DIST_PATH = re.compile(r"(?:[A-Za-z0-9_.-]+/)*[A-Za-z0-9_.-]+/?")
#: A file of a folder of the repository (models/, node_modules/, web/vendor-entry/).
_SOURCE_PATH = re.compile(r"(?:[@A-Za-z0-9_.-]+/)*[A-Za-z0-9_.-]+")
_PACKAGE = re.compile(r"(?:@[a-z0-9][a-z0-9._-]*/)?[a-z0-9][a-z0-9._-]*")
_NAME = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]*")
#: The keys of a build declaration (`EngineSpec.build`).
BUILD_KEYS = frozenset({"bundles", "packages", "vendor", "models", "catalog", "test"})


def _inside_dist(path: object) -> bool:
    return isinstance(path, str) and bool(_DIST_PATH.fullmatch(path)) and ".." not in path


def _caches_ok(caches: object) -> bool:
    """`{name: {label, entry?: "file", trim?}}`: Cache Storage names and words."""
    if not isinstance(caches, Mapping):
        return False
    for name, cache in caches.items():
        if not (isinstance(name, str) and isinstance(cache, Mapping)):
            return False
        if not isinstance(cache.get("label"), str) or cache.get("entry", "file") != "file":
            return False
        if not isinstance(cache.get("trim", ""), str):
            return False
    return True


def _weights_ok(weights: object) -> bool:
    """`[{suffix | pattern, limit, magic?, modelCache?}]` (module rules of `page_declarations`)."""
    if not isinstance(weights, list):
        return False
    for rule in weights:
        if not isinstance(rule, Mapping) or ("suffix" in rule) == ("pattern" in rule):
            return False
        limit = rule.get("limit")
        if not (isinstance(limit, int) and not isinstance(limit, bool) and limit > 0):
            return False
        if "pattern" in rule:
            try:
                re.compile(str(rule["pattern"]))
            except re.error:
                return False
        if not isinstance(rule.get("suffix", rule.get("pattern")), str):
            return False
        magic = rule.get("magic", "")
        if not (isinstance(magic, str) and magic.isascii() and len(magic) <= 16):
            return False
        if not isinstance(rule.get("modelCache", False), bool):
            return False
    return True


def page_declarations(specs: tuple[EngineSpec, ...] = ENGINE_SPECS) -> list[dict[str, Any]]:
    """Each engine's page declaration (`EngineSpec.page`, plain JSON data), in order.

    What the build writes to dist/engines/engines.json (and the service
    worker's part to dist/sw-build.js): beyond what the engine host reads,
    `offline` (the page module under engines/ that lists a connection's
    files for "Download for offline use"; absent: not offered),
    `leftovers` (the page module under engines/ that lists and deletes
    model files an older build let the engine's library keep in storage of
    its own: `list(verified)`, `remove(name)`; absent: none), `caches`
    (the engine's own Cache Storage names: `{name: {label, entry?: "file",
    trim?}}`, the storage panel's words and how it groups their files into
    models), `precache` (globs of dist/ the service worker precaches),
    `lazy` (folders of dist/ it keeps once first fetched) and `weights`
    (`[{suffix | pattern, limit, magic?, modelCache?}]`: model weight files,
    by name ending or regular expression, their byte ceiling, the bytes they
    must start with, and whether the service worker keeps them, from any
    origin, in its model cache). Raises `ValueError` for a repeated or
    reserved kind, a declaration whose `kind` is not its spec's, a file
    outside dist/, or malformed caches or weights (a pattern that does not
    compile included).
    """
    seen: set[str] = set()
    out: list[dict[str, Any]] = []
    for spec in specs:
        page: Mapping[str, Any] = spec.page
        kind = spec.kind
        if not _KIND.fullmatch(kind) or kind in RESERVED_KINDS or kind in seen:
            raise ValueError(f"engine kind {kind!r} is reserved, repeated or not a plain name")
        if page.get("kind") != kind:
            raise ValueError(f"the page declaration of {kind!r} names another kind")
        paths = [page[key] for key in ("worker", "adapter") if key in page]
        paths += list(page.get("lazy", ()))
        paths += [page[key] for key in ("offline", "leftovers") if key in page]
        paths += [glob.replace("*", "x") for glob in page.get("precache", ())]
        if not all(_inside_dist(path) for path in paths):
            raise ValueError(f"the page declaration of {kind!r} names a file outside dist/")
        if not _caches_ok(page.get("caches", {})) or not _weights_ok(page.get("weights", [])):
            raise ValueError(f"the caches or weights of {kind!r} are malformed")
        seen.add(kind)
        out.append(dict(page))
    return out


def _source(path: object) -> bool:
    return isinstance(path, str) and bool(_SOURCE_PATH.fullmatch(path)) and ".." not in path


def _file(path: object) -> bool:
    """A file of dist/ (not a folder)."""
    return _inside_dist(path) and not str(path).endswith("/")


def _records(value: object, keys: tuple[str, ...]) -> bool:
    """A list of mappings with exactly `keys`."""
    return isinstance(value, list) and all(
        isinstance(item, Mapping) and set(item) == set(keys) for item in value
    )


def build_function(spec: EngineSpec, name: str) -> Callable[..., Any]:
    """The function `name` of `spec`'s own module (a build declaration's `make`).

    Raises `ValueError` when the module has no function of that name.
    """
    module = sys.modules.get(type(spec).__module__)
    function = getattr(module, name, None) if _NAME.fullmatch(name) else None
    if not callable(function):
        raise ValueError(f"the build of {spec.kind!r} names no function {name!r} of its module")
    return function


def _build_paths(kind: str, build: Mapping[str, Any]) -> list[str]:
    """The paths of dist/ (and dist-test/) `build` adds; `ValueError` when malformed.

    A test hook's replaced file is not added: it is one of dist/.
    """
    if not set(build) <= BUILD_KEYS:
        raise ValueError(
            f"the build of {kind!r} has unknown keys {sorted(set(build) - BUILD_KEYS)}"
        )
    bundles, vendor = build.get("bundles", []), build.get("vendor", [])
    models, test = build.get("models", []), build.get("test", {})
    packages = build.get("packages", [])
    shapes_ok = (
        _records(bundles, ("entry", "output"))
        and _records(vendor, ("from", "to"))
        and _records(models, ("source", "dest", "files"))
        and isinstance(packages, list)
        and all(isinstance(p, str) and _PACKAGE.fullmatch(p) for p in packages)
        and isinstance(test, Mapping)
        and set(test) <= {"replace", "add"}
    )
    if not shapes_ok:
        raise ValueError(f"the bundles, files, models or packages of {kind!r} are malformed")
    sources = [b["entry"] for b in bundles] + [v["from"] for v in vendor]
    sources += [m["source"] for m in models]
    written = [b["output"] for b in bundles] + [v["to"] for v in vendor]
    for model in models:
        files = model["files"]
        if not (isinstance(files, list) and files and all(_source(f) for f in files)):
            raise ValueError(f"the model files of {kind!r} are not files of its folder")
        written += [f"{model['dest']}/{name}" for name in files]
    replace, add = test.get("replace", {}), test.get("add", {})
    if not (isinstance(replace, Mapping) and isinstance(add, Mapping)):
        raise ValueError(f"the test hooks of {kind!r} are malformed")
    hooks = list(add.values())
    for hook in replace.values():
        if not (isinstance(hook, Mapping) and {"hook"} <= set(hook) <= {"hook", "product"}):
            raise ValueError(f"the test hooks of {kind!r} are malformed")
        hooks.append(hook["hook"])
        written += [hook["product"]] if "product" in hook else []
    written += list(add)
    if not all(_source(path) and "/" not in str(path) for path in hooks):
        raise ValueError(f"a test hook of {kind!r} is not a file of tests/hooks/")
    if not all(_source(path) for path in sources) or not all(
        _file(path) for path in [*written, *replace]
    ):
        raise ValueError(f"the build of {kind!r} names a file outside its folder or dist/")
    return written


def _catalog_ok(spec: EngineSpec, build: Mapping[str, Any]) -> list[str]:
    """The catalogue's file in dist/, checked (`build_declarations`)."""
    if "catalog" not in build:
        return []
    catalog = build["catalog"]
    outputs = {b["output"] for b in build.get("bundles", [])}
    exports = catalog.get("exports") if isinstance(catalog, Mapping) else None
    if not (
        isinstance(catalog, Mapping)
        and set(catalog) == {"bundle", "exports", "file", "make"}
        and catalog["bundle"] in outputs
        and isinstance(exports, list)
        and all(isinstance(name, str) and _NAME.fullmatch(name) for name in exports)
        and _file(catalog["file"])
        and isinstance(catalog["make"], str)
    ):
        raise ValueError(f"the catalogue of {spec.kind!r} is malformed or reads no bundle of it")
    build_function(spec, catalog["make"])
    return [catalog["file"]]


def build_declarations(specs: tuple[EngineSpec, ...] = ENGINE_SPECS) -> list[dict[str, Any]]:
    """Each engine's build declaration (`EngineSpec.build`) with its `kind`, in order.

    Shape: `{kind, bundles?: [{entry, output}], packages?: [npm name],
    vendor?: [{from, to}], models?: [{source, dest, files: [name]}],
    catalog?: {bundle, exports: [name], file, make}, test?: {replace?:
    {dist path: {hook, product?}}, add?: {dist path: hook}}}`: `entry` is a
    file of web/vendor-entry/, `from` of node_modules/, `source` a folder of
    models/ (its `files` listed in its SHA256SUMS), `hook` a file of
    tests/hooks/; `output`, `to`, `dest`, `file` and the test build's paths
    are paths of dist/ (dist-test/). `catalog.bundle` is one of the
    engine's bundles and `make` a function of the spec's module
    (`build_function`). Raises `ValueError` for an unknown key, a path with
    `..`, an absolute path or a URL, a malformed entry, a `make` the module
    lacks, or a file of dist/ that two declarations (or one, twice) write.
    """
    seen: set[str] = set()
    out: list[dict[str, Any]] = []
    for spec in specs:
        build: Mapping[str, Any] = spec.build
        written = _build_paths(spec.kind, build) + _catalog_ok(spec, build)
        for rel in written:
            if rel in seen:
                raise ValueError(f"the build of {spec.kind!r} writes {rel!r} twice")
            seen.add(rel)
        out.append({"kind": spec.kind, **build})
    return out


__all__ = [
    "BUILD_KEYS",
    "ENGINE_SPECS",
    "RESERVED_KINDS",
    "build_declarations",
    "build_function",
    "page_declarations",
]
