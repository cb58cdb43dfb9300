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
"""

from __future__ import annotations

import re
from collections.abc import Mapping
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


def _inside_dist(path: object) -> bool:
    return isinstance(path, str) and bool(_DIST_PATH.fullmatch(path)) and ".." not in path


def page_declarations(specs: tuple[EngineSpec, ...] = ENGINE_SPECS) -> list[dict[str, Any]]:
    """Each engine's page declaration (`EngineSpec.page`, plain JSON data), in order.

    What the build writes to dist/engines/engines.json: the storage panel
    reads each engine's `caches`, the service worker its `lazy` folders,
    "Download for offline use" its `worker`. Raises `ValueError` for a
    repeated or reserved kind, a declaration whose `kind` is not its spec's,
    or a worker or folder outside dist/ (module rules).
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
        if not all(_inside_dist(path) for path in paths):
            raise ValueError(f"the page declaration of {kind!r} names a file outside dist/")
        caches = page.get("caches", {})
        if not isinstance(caches, Mapping) or not all(
            isinstance(name, str) and isinstance(label, str) for name, label in caches.items()
        ):
            raise ValueError(f"the caches of {kind!r} are not names and words")
        seen.add(kind)
        out.append(dict(page))
    return out


__all__ = ["ENGINE_SPECS", "RESERVED_KINDS", "page_declarations"]
