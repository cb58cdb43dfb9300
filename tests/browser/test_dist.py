"""dist/ works in a real, offline Chromium: Pyodide, our wheels, wllama, web-llm.

Every test runs against dist/ as build.py produces it, served from 127.0.0.1
with COOP/COEP, and fails if any request leaves 127.0.0.1 (``request_log``).
Test-only pages live under ``/_test/`` (see conftest.py), never in dist/.
"""

from __future__ import annotations

import hashlib
import json
import re
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
# The harness's fixture types (conftest.BrowserLog, conftest.BrowserSession).
BrowserLog = Any
BrowserSession = Any

TestPage = Callable[[str, str], str]

#: Generous bounds: a cold Pyodide start takes about 3 s on 2 cores.
LOAD_TIMEOUT_MS = 90_000

PYODIDE_PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>pyodide test</title></head><body>
<script type="module">
import { loadPyodide } from '../pyodide/pyodide.mjs';
window.run = async (how, code) => {
  const errors = [];
  const py = await loadPyodide({ indexURL: new URL('../pyodide/', location.href).href });
  if (how === 'loadPackage') {
    await py.loadPackage('napllm', { errorCallback: (m) => errors.push(m) });
  } else {
    await py.loadPackage('micropip', { errorCallback: (m) => errors.push(m) });
    const micropip = py.pyimport('micropip');
    await micropip.install('napllm');
  }
  const out = await py.runPythonAsync(code);
  return { errors, out };
};
window.ready = true;
</script></body></html>
"""

#: Imports napllm's Pyodide-portable modules, pydantic and jschon, and
#: validates with both; returns a JSON report.
PYTHON_CHECKS = r"""
import importlib, json, pkgutil, sys
import napllm, pydantic, pydantic_core, jschon
from pydantic import BaseModel

failed = {}
imported = []
for info in pkgutil.walk_packages(napllm.__path__, "napllm."):
    if info.name.startswith(("napllm.lmsp_service", "napllm.browser")):
        continue
    try:
        importlib.import_module(info.name)
        imported.append(info.name)
    except Exception as exc:
        failed[info.name] = f"{type(exc).__name__}: {exc}"

class Person(BaseModel):
    name: str
    age: int

person = Person.model_validate({"name": "Alice", "age": "30"})

from jschon import JSON, JSONSchema, create_catalog
create_catalog("2020-12")
schema = JSONSchema({
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}},
    "required": ["name", "age"],
    "additionalProperties": False,
})
json.dumps({
    "platform": sys.platform,
    "python": sys.version.split()[0],
    "pydantic": pydantic.VERSION,
    "pydantic_core": pydantic_core.__version__,
    "core_binary": pydantic_core._pydantic_core.__file__,
    "jschon": jschon.__version__,
    "person": person.model_dump(),
    "schema_ok": schema.evaluate(JSON({"name": "Alice", "age": 30})).valid,
    "schema_bad": schema.evaluate(JSON({"name": "Bob", "age": -1, "x": 1})).valid,
    "imported": imported,
    "failed": failed,
})
"""


#: Modules of the shared contracts, imported by every Pyodide check.
CORE_MODULES = ("napllm.errors", "napllm.lmsp", "napllm.connections", "napllm.providers.base")


def _run_pyodide(page: Any, test_page: TestPage, how: str) -> dict[str, Any]:
    page.goto(test_page("pyodide.html", PYODIDE_PAGE))
    page.wait_for_function("window.ready === true")
    result = page.evaluate("([how, code]) => window.run(how, code)", [how, PYTHON_CHECKS])
    assert result["errors"] == [], result["errors"]
    report: dict[str, Any] = json.loads(result["out"])
    return report


def _assert_python_report(report: dict[str, Any], dist_dir: Path) -> None:
    info = json.loads((dist_dir / "build-info.json").read_text())
    assert report["platform"] == "emscripten"
    assert report["python"].startswith("3.14.")
    assert report["pydantic"] == info["pydantic"]
    assert report["pydantic"].startswith("2.14.")
    assert report["pydantic_core"] == info["pydantic_core"]
    # The compiled core is the WebAssembly build, not a pure-Python stand-in.
    assert report["core_binary"].endswith("wasm32-emscripten.so"), report["core_binary"]
    assert report["person"] == {"name": "Alice", "age": 30}
    assert report["schema_ok"] is True
    assert report["schema_bad"] is False
    for module in CORE_MODULES:
        assert module in report["imported"], report["failed"].get(module)


def test_every_portable_napllm_module_imports_in_pyodide(
    page: Any, request_log: BrowserLog, test_page: TestPage
) -> None:
    """Everything under runtime/napllm except lmsp_service/ and browser/ imports in Pyodide."""
    page.set_default_timeout(LOAD_TIMEOUT_MS)
    report = _run_pyodide(page, test_page, "loadPackage")
    assert report["failed"] == {}
    request_log.assert_local()


def _only_favicon(url: str) -> bool:
    return url.endswith("/favicon.ico")


def test_pyodide_loads_napllm_by_name(
    page: Any, request_log: BrowserLog, test_page: TestPage, dist_dir: Path
) -> None:
    page.set_default_timeout(LOAD_TIMEOUT_MS)
    report = _run_pyodide(page, test_page, "loadPackage")
    _assert_python_report(report, dist_dir)
    assert request_log.errors(ignore=_only_favicon) == []
    wheels = {u.rsplit("/", 1)[-1] for u in request_log.requests if u.endswith(".whl")}
    assert any(w.startswith("napllm-") for w in wheels)
    assert any(w.startswith("pydantic_core-") and "wasm32" in w for w in wheels)
    assert any(w.startswith("jschon-") for w in wheels)
    request_log.assert_local()


def test_micropip_installs_napllm_by_name(
    page: Any, request_log: BrowserLog, test_page: TestPage, dist_dir: Path
) -> None:
    page.set_default_timeout(LOAD_TIMEOUT_MS)
    report = _run_pyodide(page, test_page, "micropip")
    _assert_python_report(report, dist_dir)
    assert request_log.errors(ignore=_only_favicon) == []
    request_log.assert_local()


def test_napplet_manifest_lists_only_pinned_files_with_their_sha256(dist_dir: Path) -> None:
    """What the shell may hand a Python napplet (web/js/python-files.js): Pyodide's
    core files and our pinned wheels, each present with the stated sha256, and a
    lock of exactly those wheels."""
    manifest = json.loads((dist_dir / "pyodide" / "napplet-files.json").read_text(encoding="utf-8"))
    files = manifest["files"]
    for name, digest in files.items():
        assert "/" not in name
        assert hashlib.sha256((dist_dir / "pyodide" / name).read_bytes()).hexdigest() == digest
    packages = manifest["lock"]["packages"]
    assert {"napllm", "micropip", "pydantic", "tabulate"} <= set(packages)
    assert "numpy" not in packages  # in Pyodide's own lock, but not shipped
    wheels = {entry["file_name"] for entry in packages.values()}
    assert wheels == {name for name in files if name.endswith(".whl")}
    assert set(files) - wheels == {
        "pyodide.mjs",
        "pyodide.asm.mjs",
        "pyodide.asm.wasm",
        "python_stdlib.zip",
    }
    for entry in packages.values():
        assert files[entry["file_name"]] == entry["sha256"]
        assert set(entry["depends"]) <= set(packages)


WLLAMA_PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>wllama test</title></head><body>
<script type="module">
import { Wllama, wasmPaths } from '../vendor/wllama/wllama.js';
window.bogus = async () => {
  const w = new Wllama(wasmPaths, { suppressNativeLog: true });
  const blob = new Blob([new TextEncoder().encode('this is not a GGUF file')]);
  await w.loadModel([blob], { n_threads: 1, n_ctx: 128, n_gpu_layers: 0 });
  const info = w.getLoadedContextInfo();
  await w.exit();
  return { success: info.success === true, isolated: self.crossOriginIsolated };
};
window.tinychat = async () => {
  const w = new Wllama(wasmPaths, { suppressNativeLog: true });
  await w.loadModelFromUrl(new URL('../models/tinychat/tiny-chat-q8_0.gguf', location.href).href,
    { n_threads: 1, n_ctx: 512, n_gpu_layers: 0, seed: 0, useCache: false });
  const info = w.getLoadedContextInfo();
  const out = await w.createChatCompletion({
    messages: [{ role: 'user', content: 'Hello!' }],
    temperature: 0, top_k: 1, max_tokens: 32,
  });
  await w.exit();
  return { success: info.success === true, text: out.choices[0].message.content };
};
window.ready = true;
</script></body></html>
"""


def test_wllama_bundle_boots_and_reports_a_failed_load(
    page: Any, request_log: BrowserLog, test_page: TestPage
) -> None:
    page.set_default_timeout(LOAD_TIMEOUT_MS)
    page.goto(test_page("wllama.html", WLLAMA_PAGE))
    page.wait_for_function("window.ready === true")
    result = page.evaluate("window.bogus()")
    # loadModel() resolves even when llama.cpp rejects the file: only the
    # context info tells, and it must say so.
    assert result == {"success": False, "isolated": True}
    assert any(u.endswith("/vendor/wllama/wllama.wasm") for u in request_log.requests)
    request_log.assert_local()


def test_wllama_runs_the_tinychat_model_from_dist(
    page: Any, request_log: BrowserLog, test_page: TestPage
) -> None:
    page.set_default_timeout(LOAD_TIMEOUT_MS)
    page.goto(test_page("wllama.html", WLLAMA_PAGE))
    page.wait_for_function("window.ready === true")
    result = page.evaluate("window.tinychat()")
    assert result == {"success": True, "text": "Hello! How can I help you today?"}
    request_log.assert_local()


WEBLLM_PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>web-llm test</title></head><body>
<script type="module">
import * as webllm from '../vendor/web-llm/web-llm.js';
window.probe = async () => {
  const engine = new webllm.MLCEngine();
  const models = webllm.prebuiltAppConfig.model_list.length;
  try {
    return { vendor: await engine.getGPUVendor(), models };
  } catch (e) {
    return { error: String((e && e.message) || e), models };
  }
};
window.ready = true;
</script></body></html>
"""


def test_webllm_bundle_imports_and_detects_no_gpu(
    page: Any, request_log: BrowserLog, test_page: TestPage
) -> None:
    page.set_default_timeout(LOAD_TIMEOUT_MS)
    page.goto(test_page("webllm.html", WEBLLM_PAGE))
    page.wait_for_function("window.ready === true")
    result = page.evaluate("window.probe()")
    assert result["models"] > 0
    assert "vendor" not in result
    assert "compatible GPU" in result["error"]
    request_log.assert_local()


@pytest.mark.webgpu
def test_webllm_bundle_finds_a_webgpu_adapter(
    webgpu_session: BrowserSession, test_page: TestPage
) -> None:
    page = webgpu_session.page
    page.set_default_timeout(LOAD_TIMEOUT_MS)
    page.goto(test_page("webllm.html", WEBLLM_PAGE))
    page.wait_for_function("window.ready === true")
    result = page.evaluate("window.probe()")
    assert "error" not in result, result
    assert isinstance(result["vendor"], str)
    webgpu_session.log.assert_local()


# --------------------------------------------------------------------------- static checks

#: URIs that are identifiers, not fetched resources (XML namespaces, JSON Schema dialects).
#: Identifiers, never fetched: namespaces, the loopback host, and names under the
#: reserved `.invalid` TLD (RFC 6761: never resolves), such as the Python
#: napplets' virtual base (web/js/python-loader.js `PYTHON_BASE`).
IDENTIFIER_URIS = re.compile(
    r"https?://(www\.w3\.org/|json-schema\.org/)|http://(127\.0\.0\.1|localhost)[:/]"
    r"|https://[a-z0-9.-]+\.invalid/"
)
ABSOLUTE_URL = re.compile(r"(?:https?:)?//[A-Za-z0-9.-]+\.[A-Za-z]{2,}|https?://")
ROOT_RELATIVE = [
    re.compile(r"""\b(?:src|href|action|poster|data)\s*=\s*["']/(?!/)"""),
    re.compile(r"""\b(?:from|import)\s*\(?\s*["']/(?!/)"""),
    re.compile(r"""\b(?:fetch|new\s+URL|new\s+Worker|importScripts)\s*\(\s*["'`]/(?!/)"""),
]


def authored_dist_files(dist_dir: Path) -> list[Path]:
    """dist/ files that come from this repository's web/ and napplets/ and build.py."""
    files: list[Path] = []
    web = ROOT / "web"
    if web.is_dir():
        for src in web.rglob("*"):
            rel = src.relative_to(web)
            if src.is_file() and rel.parts[0] != "vendor-entry":
                files.append(dist_dir / rel)
    napplets = ROOT / "napplets"
    if napplets.is_dir():
        files += [dist_dir / "napplets" / p.relative_to(napplets) for p in napplets.rglob("*")]
    files += [
        dist_dir / "napplets" / "index.json",
        dist_dir / "build-info.json",
    ]
    text_types = {".html", ".js", ".mjs", ".css", ".json", ".webmanifest", ".svg", ".txt"}
    return [p for p in files if p.is_file() and p.suffix in text_types]


#: Example text shown to the user in a form field is not a URL the page uses.
PLACEHOLDER = re.compile(r"""\bplaceholder\s*=\s*(?:"[^"]*"|'[^']*')""")


def url_problems(text: str) -> list[str]:
    """Absolute or root-relative URLs in a text file (identifier URIs and placeholders excepted)."""
    text = PLACEHOLDER.sub("placeholder=''", text)
    problems = []
    for match in ABSOLUTE_URL.finditer(text):
        if not IDENTIFIER_URIS.match(text, match.start()):
            problems.append(text[match.start() : match.start() + 60])
    for pattern in ROOT_RELATIVE:
        problems += [text[m.start() : m.start() + 60] for m in pattern.finditer(text)]
    return problems


def test_url_checker_catches_absolute_and_root_urls() -> None:
    assert url_problems('<script src="https://cdn.example.com/x.js">') != []
    assert url_problems("import x from '/vendor/x.js'") != []
    assert url_problems("fetch('/models/a.gguf')") != []
    assert url_problems('<a href="//evil.example.org/">') != []
    assert url_problems('<img src="img/a.png"><script src="./a.js">') == []
    assert url_problems('<svg xmlns="http://www.w3.org/2000/svg">') == []
    assert url_problems("const base = 'http://127.0.0.1:11435/';") == []
    assert url_problems('<input type="url" placeholder="https://…/model.gguf">') == []
    assert url_problems('const PYTHON_BASE = "https://pyodide.napllm.invalid/";') == []
    assert url_problems('fetch("https://pyodide.napllm.invalid.example.com/x")') != []
    assert url_problems('<input placeholder="x"><img src="https://a.example.com/i.png">') != []


#: Data that names files of other hosts on purpose (the model catalogue's
#: download URLs, checked by tests/unit/test_catalogue_data.py): not URLs of the shell.
OTHER_HOSTS_DATA = frozenset({"catalogue/models.json"})


def test_authored_dist_files_use_only_relative_urls(dist_dir: Path) -> None:
    files = authored_dist_files(dist_dir)
    assert dist_dir / "build-info.json" in files
    problems = {}
    for path in files:
        if path.relative_to(dist_dir).as_posix() in OTHER_HOSTS_DATA:
            continue
        found = url_problems(path.read_text(encoding="utf-8", errors="replace"))
        if found:
            problems[str(path.relative_to(dist_dir))] = found
    assert problems == {}


def test_build_info_describes_dist(dist_dir: Path) -> None:
    info = json.loads((dist_dir / "build-info.json").read_text())
    assert info["pyodide"] == "314.0.7"
    assert info["pydantic"].startswith("2.14.")
    assert info["wllama"].startswith("3.13.")
    assert info["web-llm"] == "0.2.86"
    for rel, size in info["files"].items():
        assert (dist_dir / rel).stat().st_size == size, rel
    assert info["total_bytes"] == sum(info["files"].values())
    index = json.loads((dist_dir / "napplets" / "index.json").read_text())
    for entry in index:
        assert set(entry) == {"name", "title", "description", "icon", "path"}
        assert (dist_dir / entry["path"]).is_file()
        # Every shipped napplet describes itself and has an inline icon.
        assert entry["description"]
        assert entry["icon"].startswith("data:image/svg+xml,")


def test_request_log_sees_requests_that_leave_127_0_0_1(
    page: Any, request_log: BrowserLog, test_page: TestPage
) -> None:
    page.goto(test_page("leak.html", "<!doctype html><title>leak</title>"))
    page.evaluate("fetch('http://example.com/leak').catch(() => null)")
    for _ in range(250):  # the requestfailed event may trail the rejected fetch
        if request_log.failed:
            break
        page.wait_for_timeout(20)
    assert request_log.external() == ["http://example.com/leak"]
    # The host resolver rules stopped it inside Chromium.
    assert any(u == "http://example.com/leak" for u, _ in request_log.failed)
    request_log.requests.clear()  # checked above; keep the teardown check for the rest


# --------------------------------------------------------------------------- server and lock


def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req) as resp:
            return resp.status, resp.headers
    except urllib.error.HTTPError as err:
        return err.code, err.headers


def test_server_sends_isolation_headers_and_exact_mime_types(
    dist_url: str, dist_dir: Path, test_pages_dir: Path
) -> None:
    (test_pages_dir / "app.webmanifest").write_text("{}")
    napllm_wheel = next((dist_dir / "pyodide").glob("napllm-*.whl")).name
    expected = {
        "pyodide/pyodide.asm.wasm": "application/wasm",
        "pyodide/pyodide.mjs": "text/javascript",
        "vendor/wllama/wllama.js": "text/javascript",
        "build-info.json": "application/json",
        f"pyodide/{napllm_wheel}": "application/octet-stream",
        "_test/app.webmanifest": "application/manifest+json",
    }
    for rel, mime in expected.items():
        status, headers = _get(dist_url + rel)
        assert status == 200, rel
        assert headers["Content-Type"] == mime, rel
        assert headers["Cross-Origin-Opener-Policy"] == "same-origin"
        assert headers["Cross-Origin-Embedder-Policy"] == "require-corp"
        assert headers["Cross-Origin-Resource-Policy"] == "same-origin"
        assert headers["Cache-Control"] == "no-cache"
    # no-cache means revalidate: an unchanged file answers 304.
    _, headers = _get(dist_url + "build-info.json")
    status, _ = _get(dist_url + "build-info.json", {"If-Modified-Since": headers["Last-Modified"]})
    assert status == 304
    assert _get(dist_url + "no-such-file.js")[0] == 404
    # /_test/ cannot reach outside its folder.
    assert _get(dist_url + "_test/../build-info.json")[0] == 404
    assert _get(dist_url + "_test/%2e%2e/%2e%2e/etc/passwd")[0] == 404
    assert _get(dist_url + "../../etc/passwd")[0] == 404


def test_merged_lock_resolves_our_packages_from_dist(dist_dir: Path) -> None:
    lock = json.loads((dist_dir / "pyodide" / "pyodide-lock.json").read_text())
    packages = lock["packages"]
    ours = json.loads((dist_dir / "build-info.json").read_text())["packages"]
    assert set(ours) >= {"napllm", "pydantic", "pydantic-core", "jschon", "rfc3986", "micropip"}
    for name, version in ours.items():
        entry = packages[name]
        assert entry["version"] == version
        wheel = dist_dir / "pyodide" / entry["file_name"]
        assert hashlib.sha256(wheel.read_bytes()).hexdigest() == entry["sha256"], name
        for dep in entry["depends"]:
            assert dep in ours, f"{name} needs {dep}, which dist/ does not ship"
    assert set(packages["napllm"]["depends"]) == {"pydantic", "jschon"}
    assert packages["pydantic-core"]["file_name"].endswith("pyemscripten_2026_0_wasm32.whl")
    assert lock["info"]["python"].startswith("3.14.")
