"""The engines' declarations: what the page, the service worker and the build read.

Rules
- Every engine is declared once, by its spec (`napllm.providers.engine_specs`):
  this step writes the declarations (`page_declarations`, in the registry's
  order) to dist/engines/engines.json for the page (the storage panel's
  engine caches, "Download for offline use"), and hands the service
  worker's part (`service_worker_part`: precache globs, lazy folders,
  weights rules) to `buildsys.service_worker`.
- The other steps read each spec's build declaration (`engine_builds`,
  `build_declarations`): `buildsys.bundles` bundles and copies its library,
  `buildsys.models` copies its built-in model, `buildsys.dist` puts its test
  hooks into dist-test/. A step that cannot be data (a catalogue made from a
  library's exports) is a function of the spec's module, which the
  declaration names (`catalog_function`). Nothing in the build names an engine.
- A malformed declaration stops the build (`BuildError`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from buildsys.base import BuildError, DistWriter

#: Where the page reads the declarations (relative to dist/).
DECLARATIONS = "engines/engines.json"


def engine_declarations() -> list[dict[str, Any]]:
    """Every engine's page declaration (`engine_specs.page_declarations`).

    Raises: BuildError for a malformed declaration.
    """
    from napllm.providers.engine_specs import page_declarations

    try:
        return page_declarations()
    except ValueError as exc:
        raise BuildError(f"engine declarations: {exc}") from exc


def engine_builds() -> list[dict[str, Any]]:
    """Every engine's build declaration, with its `kind` (`engine_specs.build_declarations`).

    Raises: BuildError for a malformed declaration.
    """
    from napllm.providers.engine_specs import build_declarations

    try:
        return build_declarations()
    except ValueError as exc:
        raise BuildError(f"engine build declarations: {exc}") from exc


def catalog_function(kind: str, name: str) -> Callable[..., Any]:
    """The function `name` of the module of the spec of `kind` (a catalogue's `make`).

    Raises: BuildError when no engine has that kind or its module no such function.
    """
    from napllm.providers.engine_specs import ENGINE_SPECS, build_function

    for spec in ENGINE_SPECS:
        if spec.kind == kind:
            try:
                return build_function(spec, name)
            except ValueError as exc:
                raise BuildError(f"engine build declarations: {exc}") from exc
    raise BuildError(f"no engine of kind {kind!r}")


def write_engine_declarations(out: DistWriter) -> list[dict[str, Any]]:
    """Write dist/engines/engines.json; returns the declarations written."""
    declarations = engine_declarations()
    out.write_json(DECLARATIONS, declarations)
    return declarations


def service_worker_part(declarations: list[dict[str, Any]]) -> dict[str, Any]:
    """The service worker's part: `{precache: [globs], lazy: [folders], weights: [rules]}`."""
    return {
        "precache": [glob for d in declarations for glob in d.get("precache", ())],
        "lazy": [folder for d in declarations for folder in d.get("lazy", ())],
        "weights": [rule for d in declarations for rule in d.get("weights", ())],
    }


__all__ = [
    "DECLARATIONS",
    "catalog_function",
    "engine_builds",
    "engine_declarations",
    "service_worker_part",
    "write_engine_declarations",
]
