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
    files for "Download for offline use"; absent: not offered), `caches`
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
        paths += [page["offline"]] if "offline" in page else []
        paths += [glob.replace("*", "x") for glob in page.get("precache", ())]
        if not all(_inside_dist(path) for path in paths):
            raise ValueError(f"the page declaration of {kind!r} names a file outside dist/")
        if not _caches_ok(page.get("caches", {})) or not _weights_ok(page.get("weights", [])):
            raise ValueError(f"the caches or weights of {kind!r} are malformed")
        seen.add(kind)
        out.append(dict(page))
    return out


__all__ = ["ENGINE_SPECS", "RESERVED_KINDS", "page_declarations"]
