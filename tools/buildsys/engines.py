"""The engines' declarations in dist/: what the page and the service worker read.

Rules
- Every engine is declared once, by its spec (`napllm.providers.engine_specs`):
  this step writes the declarations (`page_declarations`, in the registry's
  order) to dist/engines/engines.json for the page (the storage panel's
  engine caches, "Download for offline use"), and hands the service
  worker's part (`service_worker_part`: precache globs, lazy folders,
  weights rules) to `buildsys.service_worker`. Nothing in the build names
  an engine.
- A malformed declaration stops the build (`BuildError`).
"""

from __future__ import annotations

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
    "engine_declarations",
    "service_worker_part",
    "write_engine_declarations",
]
