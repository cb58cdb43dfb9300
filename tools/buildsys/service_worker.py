"""The offline side of dist/: the app icons and the service worker (Workbox).

Rules
- The precache list is computed by Workbox from dist/ itself
  (`PRECACHE_PATTERNS`); nothing is listed by hand.
- Every build precaches into a cache of its own (`precache_build_id`), and a
  new worker waits until the page asks it to take over.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from buildsys import paths
from buildsys.base import BuildError, DistWriter, log, sha256_file, stamp_matches, write_stamp

#: Files of dist/ the service worker precaches: everything the shell loads to
#: boot, and Python napplets' files (pyodide/napplet-files.json names them);
#: each engine adds the files it declares (`precache`: its bundle, a built-in
#: model it answers with offline; `buildsys.engines`).
PRECACHE_PATTERNS = (
    "index.html",
    "*.{js,css,webmanifest}",
    "js/**/*.js",
    "engines/**/*.js",
    "engines/engines.json",
    "catalogue/*.{js,json}",
    "icons/*.png",
    "napplets/**/*",
    "pyodide/*.{mjs,wasm,zip,json,whl}",
    "vendor/workbox-window/*",
    "vendor/hash-wasm/*",
)
PRECACHE_IGNORES = ("sw.js", "sw-build.js", "sw-napllm.js", "pyodide/pyodide.js")
#: Scripts sw.js imports before Workbox's own code (relative to sw.js):
#: this build's names, then napllm's part of the worker (web/sw-napllm.js).
SW_IMPORTS = ("sw-build.js", "sw-napllm.js")
#: Workbox refuses files above 2 MB by default; the wasm files are ~10 MB.
PRECACHE_MAX_BYTES = 64 * 1024 * 1024
#: Cache Storage name shared with web/js/pwa.js (the Storage section).
MODEL_CACHE = "napllm-models"
ICON_SIZES = (192, 512)

#: Node program run by build_service_worker: workbox-build's generateSW with the
#: JSON options in $NAPLLM_SW_OPTIONS, plus the runtime-caching rules (they are
#: functions, which JSON cannot carry). Prints {"count", "size"} as JSON.
_GENERATE_SW_JS = r"""
const { generateSW } = require("workbox-build");
const opts = JSON.parse(process.env.NAPLLM_SW_OPTIONS);
const caches = JSON.parse(process.env.NAPLLM_SW_CACHES);
generateSW({
  ...opts,
  ignoreURLParametersMatching: [/.*/],
  runtimeCaching: [
    {
      // HEAD requests (wllama asks for a model's size before loading it):
      // answered from the headers of a cached copy, so they work offline.
      // Precache keys carry a revision parameter, hence ignoreSearch for
      // this origin's files; other origins must match exactly.
      urlPattern: ({ request }) => request.method === "HEAD",
      method: "HEAD",
      handler: async ({ request, url }) => {
        const cached =
          (await caches.match(request.url, { ignoreMethod: true })) ||
          (url.origin === self.location.origin
            ? await caches.match(request.url, { ignoreMethod: true, ignoreSearch: true })
            : undefined);
        if (!cached) return fetch(request);
        return new Response(null, { status: cached.status, headers: cached.headers });
      },
    },
    {
      // Models the user adds (any origin) whose engine declares them kept
      // in the model cache (web/sw-napllm.js `inModelCache`): kept until
      // deleted in the Storage section. A built-in model is precached instead.
      urlPattern: ({ url, request }) =>
        request.method === "GET" && self.napllmSw.inModelCache(url.href),
      handler: "CacheFirst",
      options: {
        cacheName: caches.models,
        rangeRequests: true,
        // Stored only once verified (web/sw-napllm.js): a 200 text/html
        // fallback page or a cut-off download never becomes the "model".
        plugins: [
          {
            cacheWillUpdate: async ({ request, response }) =>
              self.napllmSw.verifiedModel(response, self.napllmSw.modelRule(request.url)),
          },
        ],
      },
    },
  ],
}).then(({ count, size, warnings }) => {
  for (const w of warnings) console.error(w);
  process.stdout.write(JSON.stringify({ count, size }));
}, (error) => {
  console.error(String(error && error.stack ? error.stack : error));
  process.exit(1);
});
"""


def _png(size: int) -> bytes:
    """A ``size``x``size`` RGBA PNG of the napllm app icon.

    Drawn here with zlib and struct (a rounded square with a speech-bubble
    dot pattern) so the build needs no imaging library for two icons.
    """
    import struct
    import zlib

    bg, fg = (0x1F, 0x4E, 0x8C, 255), (255, 255, 255, 255)
    radius = size * 0.18
    rows = []
    for y in range(size):
        row = bytearray([0])  # filter type 0 (None) per scanline
        for x in range(size):
            cx, cy = min(x + 0.5, size - x - 0.5), min(y + 0.5, size - y - 0.5)
            outside = (
                cx < radius and cy < radius and (radius - cx) ** 2 + (radius - cy) ** 2 > radius**2
            )
            colour = (0, 0, 0, 0) if outside else bg
            # Three dots across the middle: "a model is answering".
            for i in (-1, 0, 1):
                dx, dy = x + 0.5 - size * (0.5 + 0.22 * i), y + 0.5 - size * 0.5
                if dx * dx + dy * dy <= (size * 0.08) ** 2:
                    colour = fg
            row += bytes(colour)
        rows.append(bytes(row))

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", size, size, 8, 6, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(b"".join(rows), 9))
        + chunk(b"IEND", b"")
    )


def write_icons(out: DistWriter) -> None:
    """Write the manifest's icons to dist/icons/icon-<size>.png (192 and 512 px)."""
    for size in ICON_SIZES:
        rel = f"icons/icon-{size}.png"
        cached = paths.BUILD / "icons" / f"icon-{size}.png"
        if not cached.is_file():
            cached.parent.mkdir(parents=True, exist_ok=True)
            cached.write_bytes(_png(size))
        out.copy(cached, rel)


def precache_build_id(out: DistWriter, exclude: set[Path]) -> str:
    """A 16-hex-digit id of dist/'s content: changes whenever any file changes.

    Hashes every written file's relative path and sha256 (``exclude`` left
    out). Used as the service worker's cache id, so every build precaches
    into a cache of its own (web/sw-napllm.js).
    """
    digest = hashlib.sha256()
    for path in sorted(out.written):
        if path.is_file() and path not in exclude and path.name != "build-info.json":
            digest.update(
                f"{path.relative_to(out.root).as_posix()}\0{sha256_file(path)}\0".encode()
            )
    return digest.hexdigest()[:16]


def build_service_worker(out: DistWriter, engines: dict[str, Any]) -> dict[str, Any]:
    """Generate dist/sw.js with workbox-build (``generateSW``) and copy workbox-window.

    The precache manifest (URL + revision of every file matched by
    ``PRECACHE_PATTERNS``) is computed by Workbox from dist/ itself; nothing
    is listed by hand. All precache URLs are relative to sw.js, whose scope is
    its own folder, so the shell works offline at any sub-path. The worker
    waits: ``skipWaiting`` happens only when the page posts
    ``{"type": "SKIP_WAITING"}`` (web/js/pwa.js, after the user clicks
    Reload); it claims open pages on activation so the first visit is
    controlled without a reload. Each build precaches into a cache named
    after :func:`precache_build_id`; web/sw-napllm.js (imported first, with
    the generated dist/sw-build.js) keeps serving tabs of an earlier build
    from that build's cache until they reload, and verifies model files
    before they are cached. ``engines``: the engines' part
    (``buildsys.engines.service_worker_part``): their precache globs join
    ``PRECACHE_PATTERNS``, their lazy folders and weights rules go into
    sw-build.js for web/sw-napllm.js. Skipped when no precached file changed.

    Returns: ``{"count", "size"}`` of the precache (files, bytes).
    Raises: BuildError when Node or workbox-build fails.
    """
    write_icons(out)
    out.copy(
        paths.NODE_MODULES / "workbox-window" / "build" / "workbox-window.prod.mjs",
        "vendor/workbox-window/workbox-window.prod.mjs",
    )
    sw = out.claim("sw.js")
    # Workbox lists what is in dist/: a file an earlier build left (a removed
    # web/ file) goes first, or the precache would name a file that is gone
    # and the service worker's install would fail. Only the build's record,
    # written after this step, is not written yet.
    out.prune(keep=frozenset({out.root / "build-info.json"}))
    build_id = precache_build_id(out, exclude={sw, out.root / "sw-build.js"})
    cache_id = f"napllm-{build_id}"
    build_names = {
        "id": build_id,
        "cacheId": cache_id,
        "lazy": list(engines["lazy"]),
        "weights": list(engines["weights"]),
    }
    out.write_bytes(
        "sw-build.js",
        (
            "// Written by build.py: this build's names and the engines' declarations"
            " for web/sw-napllm.js.\n"
            f"self.NAPLLM_BUILD = {json.dumps(build_names)};\n"
        ).encode(),
    )
    options = {
        "globDirectory": str(out.root),
        "globPatterns": [*PRECACHE_PATTERNS, *engines["precache"]],
        "globIgnores": list(PRECACHE_IGNORES),
        "swDest": str(sw),
        "maximumFileSizeToCacheInBytes": PRECACHE_MAX_BYTES,
        "directoryIndex": "index.html",
        # Each build precaches into its own cache; web/sw-napllm.js deletes
        # an earlier build's cache once no open tab runs that build.
        "cacheId": cache_id,
        "cleanupOutdatedCaches": False,
        "clientsClaim": True,
        "skipWaiting": False,
        "importScripts": list(SW_IMPORTS),
        "inlineWorkboxRuntime": True,
        "mode": "production",
        "sourcemap": False,
    }
    caches = {"models": MODEL_CACHE}
    digest = hashlib.sha256(_GENERATE_SW_JS.encode() + json.dumps([options, caches]).encode())
    digest.update(sha256_file(paths.ROOT / "package-lock.json").encode())
    for path in sorted(out.written):
        if path.is_file() and path != sw:
            stat = path.stat()
            digest.update(
                f"{path.relative_to(out.root)}\0{stat.st_size}\0{stat.st_mtime_ns}\0".encode()
            )
    stamp = paths.BUILD / "stamps" / "sw-result.json"
    if stamp_matches("sw", digest.hexdigest()) and sw.is_file() and stamp.is_file():
        cached: dict[str, Any] = json.loads(stamp.read_text(encoding="utf-8"))
        return cached
    if shutil.which("node") is None:
        raise BuildError("node is not installed (Node 20 or newer is required)")
    log("workbox generateSW sw.js")
    env = dict(
        os.environ, NAPLLM_SW_OPTIONS=json.dumps(options), NAPLLM_SW_CACHES=json.dumps(caches)
    )
    proc = subprocess.run(
        ["node", "-e", _GENERATE_SW_JS],
        cwd=paths.ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise BuildError(f"workbox generateSW failed:\n{(proc.stdout + proc.stderr)[-4000:]}")
    result: dict[str, Any] = json.loads(proc.stdout)
    stamp.parent.mkdir(parents=True, exist_ok=True)
    stamp.write_text(json.dumps(result), encoding="utf-8")
    write_stamp("sw", digest.hexdigest())
    return result
