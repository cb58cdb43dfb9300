"""The JavaScript side of dist/: esbuild bundles and the engines' catalogues.

Rules
- Libraries come from node_modules/ (``package-lock.json``) and are bundled by
  esbuild into dist/vendor/; nothing is loaded from a CDN (their wasm files
  are copied next to their bundles).
- An engine's library is what its spec's build declaration says
  (`buildsys.engines.engine_builds`: `bundles`, `vendor`, `catalog`); this
  module adds only the shell's own bundles (`SHELL_BUNDLES`).
- The Prompt API layer is one inline-safe script (no ``</script``, no ``<!--``).
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
from collections.abc import Mapping
from typing import Any

from buildsys import paths
from buildsys.base import BuildError, DistWriter, log, run, sha256_file, stamp_matches, write_stamp
from buildsys.engines import catalog_function, engine_builds

#: The shell's own esbuild bundles (no engine's): (entry file under
#: web/vendor-entry/, output path under dist/). hash-wasm checks downloads.
SHELL_BUNDLES = (("hash-wasm.js", "vendor/hash-wasm/hash-wasm.js"),)

#: The Prompt API layer (the modules of web/prompt-api/, entry index.js, with
#: its JSON Schema validator): bundled into one script and shipped as the text
#: of this module, which the shell's frames.js inlines into the frames of
#: napplets that opt in. The folder itself is not copied to dist/.
PROMPT_API_DIR = "prompt-api"
PROMPT_API_ENTRY = f"{PROMPT_API_DIR}/index.js"
PROMPT_API_MODULE = "js/prompt-api-source.js"
#: The global the bundle defines inside the layer's own function scope.
PROMPT_API_GLOBAL = "napllmPromptApi"


def bundles(builds: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """The esbuild bundles: each engine's declared ones, in order, then `SHELL_BUNDLES`.

    ``builds``: the engines' build declarations (`engine_builds`). Shape:
    ``[(entry file under web/vendor-entry/, output path under dist/)]``.
    """
    declared = [(b["entry"], b["output"]) for build in builds for b in build.get("bundles", ())]
    return [*declared, *SHELL_BUNDLES]


def bundle_js(out: DistWriter, builds: list[dict[str, Any]] | None = None) -> None:
    """Bundle the engines' libraries and the shell's own with esbuild into dist/.

    ESM, minified; the bundles are `bundles` of ``builds`` (default: every
    engine's, `engine_builds`). Each engine's declared ``vendor`` files
    (``{from: path under node_modules/, to: path under dist/}``: a wasm
    build beside its bundle) are copied. Bundling is skipped when the lock,
    the entries and the outputs are unchanged.

    Raises: BuildError when esbuild fails or a declared file is missing.
    """
    builds = engine_builds() if builds is None else builds
    planned = bundles(builds)
    esbuild = paths.NODE_MODULES / ".bin" / "esbuild"
    entries = paths.ROOT / "web" / "vendor-entry"
    digest = hashlib.sha256(sha256_file(paths.ROOT / "package-lock.json").encode())
    for entry, rel in planned:
        if not (entries / entry).is_file():
            raise BuildError(f"bundle entry web/vendor-entry/{entry} is missing")
        digest.update(f"{entry}\0{rel}\0".encode())
        digest.update((entries / entry).read_bytes())
    outputs = [out.claim(rel) for _, rel in planned]
    if not (stamp_matches("esbuild", digest.hexdigest()) and all(p.is_file() for p in outputs)):
        for (entry, rel), dst in zip(planned, outputs, strict=True):
            log(f"esbuild {rel}")
            dst.parent.mkdir(parents=True, exist_ok=True)
            run(
                [
                    *(str(esbuild), str(entries / entry), "--bundle", "--format=esm"),
                    *("--minify", "--target=es2022", "--log-level=warning", f"--outfile={dst}"),
                ]
            )
        write_stamp("esbuild", digest.hexdigest())
    for build in builds:
        for item in build.get("vendor", ()):
            source = paths.NODE_MODULES / item["from"]
            if not source.is_file():
                raise BuildError(f"node_modules/{item['from']} is missing (npm ci)")
            out.copy(source, item["to"])


def bundle_prompt_api(out: DistWriter) -> None:
    """Bundle the Prompt API layer and write it as ``dist/js/prompt-api-source.js``.

    esbuild bundles ``web/prompt-api/index.js``, the modules it imports and
    ``@cfworker/json-schema`` into one minified IIFE (``var napllmPromptApi =
    ...``); the module written exports its text as ``PROMPT_API_SOURCE``. The
    shell places that text in an inline ``<script>`` of a napplet's srcdoc,
    so it must not hold ``</script`` or ``<!--`` (checked here).

    Raises: BuildError when esbuild fails or the bundle could end the script early.
    """
    esbuild = paths.NODE_MODULES / ".bin" / "esbuild"
    paths.BUILD.mkdir(parents=True, exist_ok=True)
    bundle = paths.BUILD / "prompt-api.iife.js"
    run(
        [
            *(str(esbuild), str(paths.WEB / PROMPT_API_ENTRY), "--bundle", "--format=iife"),
            *(f"--global-name={PROMPT_API_GLOBAL}", "--minify", "--target=es2022"),
            *("--charset=ascii", "--log-level=warning", f"--outfile={bundle}"),
        ]
    )
    text = bundle.read_text(encoding="utf-8").strip()
    if re.search(r"</script|<!--", text, re.I):
        raise BuildError("the Prompt API bundle holds '</script' or '<!--'; it cannot be inlined")
    module = (
        "// Generated by build.py from web/prompt-api/ (see index.js there); do not edit.\n"
        f"export const PROMPT_API_SOURCE = {json.dumps(text)};\n"
    )
    out.write_bytes(PROMPT_API_MODULE, module.encode("utf-8"))


#: Reads the named exports of a bundle (argv: its URL, the names as JSON)
#: and prints them as one JSON object.
_READ_EXPORTS = (
    "const lib = await import(process.argv[1]);"
    "const names = JSON.parse(process.argv[2]);"
    "process.stdout.write(JSON.stringify(Object.fromEntries(names.map((n) => [n, lib[n]]))));"
)


def library_exports(kind: str, bundle: Any, names: list[str]) -> dict[str, Any]:
    """The exports ``names`` of ``bundle`` (a Path of dist/), as JSON data, read by node.

    Node imports the bundle once per bundle and list of names (cached in
    build/, stamp ``exports-<kind>``).

    Raises: BuildError when node fails or prints no JSON object.
    """
    cache = paths.BUILD / f"exports-{kind}.json"
    digest = hashlib.sha256(f"{sha256_file(bundle)}\0{json.dumps(names)}".encode()).hexdigest()
    if stamp_matches(f"exports-{kind}", digest) and cache.is_file():
        return json.loads(cache.read_text(encoding="utf-8"))
    result = subprocess.run(
        ["node", "--input-type=module", "-e", _READ_EXPORTS, bundle.as_uri(), json.dumps(names)],
        check=False,
        capture_output=True,
        text=True,
        cwd=paths.ROOT,
    )
    try:
        exports = json.loads(result.stdout) if result.returncode == 0 else None
    except json.JSONDecodeError:
        exports = None
    if not isinstance(exports, dict):
        raise BuildError(f"node could not read {names} of {bundle.name}:\n{result.stderr[-2000:]}")
    paths.BUILD.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps(exports), encoding="utf-8")
    write_stamp(f"exports-{kind}", digest)
    return exports


def write_catalogs(
    out: DistWriter,
    models: Mapping[str, list[dict[str, Any]]],
    builds: list[dict[str, Any]] | None = None,
) -> list[str]:
    """Write each engine's declared catalogue; returns the paths written (under dist/).

    A catalogue (``catalog: {bundle, exports, file, make}`` of a build
    declaration) is JSON the page reads at boot instead of loading a
    library: the function ``make`` of the engine's spec module turns the
    library's ``exports`` (`library_exports` of its ``bundle``) and the
    engine's shipped models (``models[kind]``, `buildsys.models.copy_models`)
    into the data written to ``file``. Run after `bundle_js`.

    Raises: BuildError when node fails or ``make`` refuses the exports (ValueError).
    """
    builds = engine_builds() if builds is None else builds
    written = []
    for build in builds:
        catalog = build.get("catalog")
        if catalog is None:
            continue
        kind = build["kind"]
        exports = library_exports(kind, out.root / catalog["bundle"], list(catalog["exports"]))
        make = catalog_function(kind, catalog["make"])
        try:
            data = make(exports, models.get(kind, []))
        except (ValueError, KeyError) as exc:
            raise BuildError(f"the catalogue of {kind!r}: {exc}") from exc
        out.write_json(catalog["file"], data)
        written.append(catalog["file"])
    return written
