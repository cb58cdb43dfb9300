"""The build of napllm's static shell, one module a step; ``build.py`` is its command line.

Steps, in the order `buildsys.dist.build` runs them:

- `buildsys.installs`: the npm packages from ``package-lock.json``; for
  ``build.py test`` also Debian's Chromium and the pinned CPython packages.
- `buildsys.pyodide`: the pinned wheels from PyPI and Pyodide with a merged lock.
- `buildsys.wheel`: the ``napllm`` wheel for the browser, with Pyodide's bytecode.
- `buildsys.bundles`: the esbuild bundles and the engines' catalogues.
- `buildsys.models`: each engine's built-in model, checked against SHA256SUMS.
- `buildsys.content`: web/ and the napplets with the gallery's index.
- `buildsys.engines`: the engines' declarations (their specs' `page` into
  dist/engines/engines.json; their `build`, which the steps above loop over).
- `buildsys.service_worker`: the app icons and the Workbox service worker.
- `buildsys.dist`: runs the steps into dist/, writes build-info.json, the test
  build dist-test/, and cleans.
- `buildsys.serve` and `buildsys.testrun`: ``build.py serve`` and ``build.py test``.

`buildsys.paths` names every folder; `buildsys.base` holds what the steps
share (`buildsys.base.BuildError`, the stamps, `buildsys.base.DistWriter`).
Serving dist/ and launching Chromium live in `napllm.devtools.headless`
(standard library only), which the tests, the benchmarks and
``napllm-check`` use too; runtime/ goes on ``sys.path`` for it here.
"""

from __future__ import annotations

import sys
from pathlib import Path

_RUNTIME = str(Path(__file__).resolve().parents[2] / "runtime")
if _RUNTIME not in sys.path:
    sys.path.insert(0, _RUNTIME)
