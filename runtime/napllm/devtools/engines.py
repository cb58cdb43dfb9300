"""Reaching an engine's host in the page directly, the way the Python port does.

For the browser tests and the benchmarks (CPython only): they call an
engine's page side (web/engines/engine-host.js) without the runtime, with
the declaration of the engine's own spec (`EngineSpec.page`), so no test
repeats what an engine declares.
"""

from __future__ import annotations

import json

from ..providers.engine import EngineSpec
from ..providers.engine_specs import ENGINE_SPECS

#: The specs by kind (the one registry, `providers.engine_specs.ENGINE_SPECS`).
SPECS: dict[str, EngineSpec] = {spec.kind: spec for spec in ENGINE_SPECS}


def engine_host_js(kind: str, folder: str = "./") -> str:
    """A JS expression (a promise) of the engine host of `kind`.

    `folder`: where web/engines/ is, relative to the calling page ("./" for
    the shell page). Raises `KeyError` for an unknown kind.
    """
    declaration = json.dumps(json.dumps(dict(SPECS[kind].page)))
    module = json.dumps(folder + "engines/engine-host.js")
    return f"import({module}).then((m) => m.hostFor({declaration}))"


__all__ = ["SPECS", "engine_host_js"]
