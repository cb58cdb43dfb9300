"""``build.py serve``: dist/ on a local port with the shell's headers.

The server is `napllm.devtools.headless.make_server` (cross-origin isolation,
exact MIME types, no caching), the same one the tests, the benchmarks and
``napllm-check`` use.
"""

from __future__ import annotations

from buildsys import paths
from buildsys.base import BuildError
from napllm.devtools.headless import make_server


def serve(host: str, port: int) -> None:
    """Serve dist/ until interrupted, printing its URL."""
    if not (paths.DIST / "build-info.json").is_file():
        raise BuildError("dist/ is not built; run `python build.py` first")
    server = make_server(paths.DIST, host, port)
    shown = f"[{host}]" if ":" in host else host
    print(f"serving dist/ at http://{shown}:{server.server_address[1]}/", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
