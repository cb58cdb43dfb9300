"""build.py's own logic, without npm, PyPI or a browser.

Covers the pieces whose mistakes would break dist/ silently: lock entries made
from wheel metadata (dependencies, extras, markers, imports, hashes), the
napplet index, SHA256SUMS parsing, incremental copying and pruning, and the
development server's headers.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
import threading
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load_build() -> ModuleType:
    spec = importlib.util.spec_from_file_location("napllm_build", ROOT / "build.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


build = sys.modules.get("napllm_build") or _load_build()
# The steps, importable once build.py put tools/ on sys.path.
from buildsys import base, content, models, paths, pyodide, wheel  # noqa: E402
from buildsys.bundles import bundle_prompt_api  # noqa: E402
from buildsys.dist import build_test_dist  # noqa: E402
from buildsys.wheel import add_bytecode  # noqa: E402

from napllm.devtools.headless import make_server  # noqa: E402


def _wheel(path: Path, name: str, version: str, requires: list[str], files: list[str]) -> Path:
    dist_info = f"{name.replace('-', '_')}-{version}.dist-info"
    meta = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    meta += [f"Requires-Dist: {r}" for r in requires]
    with zipfile.ZipFile(path, "w") as zf:
        for f in files:
            zf.writestr(f, "")
        zf.writestr(f"{dist_info}/METADATA", "\n".join(meta) + "\n")
        zf.writestr(f"{dist_info}/RECORD", "")
    return path


def test_lock_entry_takes_dependencies_from_metadata_without_extras(tmp_path: Path) -> None:
    wheel = _wheel(
        tmp_path / "Demo_Pkg-1.2.3-py3-none-any.whl",
        "Demo_Pkg",
        "1.2.3",
        [
            "Pydantic_Core==2.50.5",
            "typing.extensions>=4.16",
            "email-validator>=2.0.0; extra == 'email'",
            "tzdata; (platform_system == 'Windows') and extra == 'timezone'",
            'old-backport; python_version < "3.8"',
            'emscripten-only; sys_platform == "emscripten"',
            "annotated-types[extra1] >=0.6",
        ],
        ["demo_pkg/__init__.py", "demo_single.py", "Demo_Pkg-1.2.3.data/scripts/x"],
    )
    entry = pyodide.wheel_lock_entry(wheel)
    assert entry["name"] == "demo-pkg"
    assert entry["version"] == "1.2.3"
    assert entry["file_name"] == wheel.name
    assert entry["sha256"] == hashlib.sha256(wheel.read_bytes()).hexdigest()
    assert entry["depends"] == [
        "annotated-types",
        "emscripten-only",
        "pydantic-core",
        "typing-extensions",
    ]
    assert entry["imports"] == ["demo_pkg", "demo_single"]
    assert entry["package_type"] == "package"
    assert entry["install_dir"] == "site"


def test_napplet_titles_are_read_from_the_page(tmp_path: Path) -> None:
    page = tmp_path / "index.html"
    page.write_text("<html><head><title>\n  Weather   agent </title></head><title>x</title>")
    assert content.html_title(page) == "Weather agent"
    page.write_text("<p>no title</p>")
    assert content.html_title(page) == ""
    page.write_text("<title>Caf&eacute; &amp; more")
    assert content.html_title(page) == "Café & more"


def test_napplet_cards_take_title_description_and_icon_from_the_page(tmp_path: Path) -> None:
    folder = tmp_path / "demo"
    folder.mkdir()
    (folder / "icon.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"0" * 100)
    (folder / "index.html").write_text(
        "<!doctype html><head><title> Demo\n app </title>"
        '<META NAME="Description" CONTENT="Does &amp; shows\n things">'
        '<meta name="description" content="second">'
        '<link rel="shortcut icon" href="icon.png"><link rel="icon" href="other.png">'
    )
    assert content.napplet_card(folder) == {
        "name": "demo",
        "title": "Demo app",
        "description": "Does & shows things",
        "icon": "napplets/demo/icon.png",
        "path": "napplets/demo/index.html",
    }
    (folder / "index.html").write_text("<p>nothing</p>")
    card = content.napplet_card(folder)
    assert (card["title"], card["description"], card["icon"]) == ("demo", "", "")


def test_napplet_cards_keep_hostile_pages_to_bounded_text_and_safe_icons(tmp_path: Path) -> None:
    folder = tmp_path / "evil"
    folder.mkdir()
    (tmp_path / "secret.png").write_bytes(b"x")
    (folder / "big.png").write_bytes(b"x" * (content.CARD_ICON_FILE_MAX + 1))
    (folder / "script.js").write_text("alert(1)")
    (folder / "link.png").symlink_to(tmp_path / "secret.png")
    page = folder / "index.html"

    def card(head: str) -> dict[str, str]:
        page.write_text(head)
        result: dict[str, str] = content.napplet_card(folder)
        return result

    hostile = "<title>&lt;img src=x onerror=alert(1)&gt;\u202e\x07" + "A" * 200 + "</title>"
    title = card(hostile)["title"]
    assert title.startswith("<img src=x onerror=alert(1)> A")  # text, shown with textContent
    assert len(title) == content.CARD_TITLE_MAX and title.endswith("…")
    assert "\u202e" not in title and "\x07" not in title
    hidden = "\u061c\u2060\u2064\ufeff\ufff9\U000e0041"
    sneaky = card(f"<title>Chat{hidden}Bot</title>")["title"]
    assert sneaky == "Chat Bot"
    desc = card('<meta name="description" content="' + "word " * 100 + '">')["description"]
    assert len(desc) <= content.CARD_DESCRIPTION_MAX
    for href in (
        "https://example.com/i.png",
        "//example.com/i.png",
        "/etc/passwd.png",
        "../secret.png",
        "link.png",
        "big.png",
        "script.js",
        "icon.png?x=1",
        "missing.png",
        "javascript:alert(1)",
        "data:text/html,<script>alert(1)</script>",
        "data:image/svg+xml,<svg onload=alert(1)>",
        "data:image/png;base64," + "A" * content.CARD_ICON_DATA_MAX,
    ):
        assert card(f'<link rel="icon" href="{href}">')["icon"] == "", href
    ok = "data:image/png;base64,iVBORw0KGgo="
    assert card(f'<link rel="icon" href="{ok}">')["icon"] == ok


def test_sha256sums_parser_accepts_both_sha256sum_modes(tmp_path: Path) -> None:
    sums = tmp_path / "SHA256SUMS"
    a, b = "a" * 64, "B" * 64
    sums.write_text(f"{a}  model.gguf\n{b} *binary.bin\nnot a line\n\n")
    assert models.read_sha256sums(sums) == {"model.gguf": a, "binary.bin": "b" * 64}


def test_dist_writer_copies_only_changes_and_prunes_the_rest(tmp_path: Path) -> None:
    src, dist = tmp_path / "src.txt", tmp_path / "dist"
    src.write_text("one")
    (dist / "old" / "deep").mkdir(parents=True)
    (dist / "old" / "deep" / "stale.js").write_text("stale")
    writer = base.DistWriter(dist)
    copied = writer.copy(src, "a/b.txt")
    writer.write_json("info.json", {"x": 1})
    assert writer.prune() == 1
    assert not (dist / "old").exists()
    assert copied.read_text() == "one"
    assert json.loads((dist / "info.json").read_text()) == {"x": 1}

    # Same size, changed content within the same second: still copied again.
    before = copied.stat().st_mtime_ns
    src.write_text("two")
    time.sleep(0.01)
    src.touch()
    assert src.stat().st_mtime_ns != before
    base.DistWriter(dist).copy(src, "a/b.txt")
    assert copied.read_text() == "two"

    # Unchanged content is not rewritten.
    mtime = (dist / "info.json").stat().st_mtime_ns
    base.DistWriter(dist).write_json("info.json", {"x": 1})
    assert (dist / "info.json").stat().st_mtime_ns == mtime


def test_the_precache_never_lists_a_file_an_earlier_build_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A web/ file removed since the last build was still listed by Workbox (it
    globbed dist/ before the prune), so the service worker's install failed."""
    from buildsys import service_worker

    dist = tmp_path / "dist"
    (dist / "engines").mkdir(parents=True)
    (dist / "engines" / "removed-engine.js").write_text("// left by an earlier build")
    (dist / "build-info.json").write_text("{}")
    monkeypatch.setattr(paths, "BUILD", tmp_path / "build")
    monkeypatch.setattr(paths, "STAMPS", tmp_path / "build" / "stamps")
    out = base.DistWriter(dist)
    out.write_bytes("index.html", b"<!doctype html>")
    out.write_bytes("engines/engine-host.js", b"export {};")
    service_worker.build_service_worker(out, {"precache": [], "lazy": [], "weights": []})
    sw = (dist / "sw.js").read_text()
    assert "engines/engine-host.js" in sw
    assert "removed-engine.js" not in sw
    assert not (dist / "engines" / "removed-engine.js").exists()
    assert (dist / "build-info.json").is_file()  # written after this step


def test_the_service_worker_takes_each_engine_from_its_declaration(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The precache, the lazy folders and the weights rules come from the specs
    (`engine_specs.page_declarations`), not from lists in the build."""
    import re

    from buildsys import engines, service_worker

    dist = tmp_path / "dist"
    dist.mkdir()
    monkeypatch.setattr(paths, "BUILD", tmp_path / "build")
    monkeypatch.setattr(paths, "STAMPS", tmp_path / "build" / "stamps")
    out = base.DistWriter(dist)
    out.write_bytes("index.html", b"<!doctype html>")
    declared = engines.write_engine_declarations(out)
    part = engines.service_worker_part(declared)
    for glob in part["precache"]:
        out.write_bytes(glob.replace("*", "declared.js"), b"export {};")
    out.write_bytes("vendor/undeclared/x.js", b"export {};")
    service_worker.build_service_worker(out, part)
    sw = (dist / "sw.js").read_text()
    assert part["precache"] and all(g.replace("*", "declared.js") in sw for g in part["precache"])
    assert "vendor/undeclared/x.js" not in sw
    names = json.loads(
        re.search(r"NAPLLM_BUILD = (\{.*\});", (dist / "sw-build.js").read_text()).group(1)  # type: ignore[union-attr]
    )
    assert names["lazy"] == part["lazy"] and names["weights"] == part["weights"]
    assert json.loads((dist / engines.DECLARATIONS).read_text()) == declared


@pytest.fixture
def served(tmp_path: Path) -> Iterator[str]:
    (tmp_path / "a.wasm").write_bytes(b"\0asm")
    (tmp_path / "m.mjs").write_text("export {}")
    (tmp_path / "app.webmanifest").write_text("{}")
    server = make_server(tmp_path, quiet=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


def test_dev_server_headers(served: str) -> None:
    for name, mime in [
        ("a.wasm", "application/wasm"),
        ("m.mjs", "text/javascript"),
        ("app.webmanifest", "application/manifest+json"),
    ]:
        with urllib.request.urlopen(served + name) as resp:
            assert resp.headers["Content-Type"] == mime
            assert resp.headers["Cross-Origin-Opener-Policy"] == "same-origin"
            assert resp.headers["Cross-Origin-Embedder-Policy"] == "require-corp"
            assert resp.headers["Cross-Origin-Resource-Policy"] == "same-origin"
            assert resp.headers["Cache-Control"] == "no-cache"


def test_main_reports_a_failed_build_without_a_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def fail(**_: object) -> None:
        raise build.BuildError("npm is not installed")

    monkeypatch.setattr(build, "build", fail)
    assert build.main([]) == 1
    assert "build failed: npm is not installed" in capsys.readouterr().err


def test_overlay_folders_are_served_and_contained(tmp_path: Path) -> None:
    dist, pages = tmp_path / "dist", tmp_path / "pages"
    dist.mkdir()
    pages.mkdir()
    (dist / "secret.txt").write_text("dist file")
    (pages / "page.html").write_text("<title>t</title>")
    server = make_server(dist, quiet=True, overlays={"/_t/": pages})
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"

    def status(path: str) -> int:
        try:
            with urllib.request.urlopen(base + path) as resp:
                return int(resp.status)
        except urllib.error.HTTPError as err:
            return err.code

    try:
        assert status("/_t/page.html") == 200
        assert status("/secret.txt") == 200
        assert status("/_t/secret.txt") == 404
        assert status("/_t/../secret.txt") == 404
        assert status("/_t/%2e%2e/secret.txt") == 404
        assert status("/page.html") == 404
    finally:
        server.shutdown()
        server.server_close()


def test_test_build_links_dist_and_adds_only_the_hooks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dist, out, hooks = tmp_path / "dist", tmp_path / "dist-test", tmp_path / "hooks"
    for rel, text in {
        "build-info.json": "{}",
        "index.html": "<!doctype html>",
        "js/boot-runtime.js": "product boot",
        "engines/webllm-engine.js": "product engine",
        "vendor/web-llm/web-llm.js": "product bundle",
        "engines/limits.js": "product ceilings",
        "catalogue/source.js": "product catalogue source",
    }.items():
        (dist / rel).parent.mkdir(parents=True, exist_ok=True)
        (dist / rel).write_text(text)
    hooks.mkdir()
    names = (
        "boot-runtime.js",
        "webllm-engine.js",
        "web-llm.js",
        "webllm-factory.js",
        "engine-limits.js",
        "catalogue-source.js",
    )
    for name in (*names, "napllm_testhooks.py"):
        (hooks / name).write_text(f"hook {name}")
    (out / "stale").mkdir(parents=True)
    (out / "stale" / "old.js").write_text("old")
    monkeypatch.setattr(paths, "DIST", dist)
    monkeypatch.setattr(paths, "DIST_TEST", out)
    monkeypatch.setattr(paths, "TEST_HOOKS", hooks)
    monkeypatch.setattr(paths, "BUILD", tmp_path / "cache")

    assert build_test_dist() == out
    assert (out / "index.html").samefile(dist / "index.html")
    assert (out / "js/boot-runtime.js").read_text() == "hook boot-runtime.js"
    assert (out / "engines/webllm-engine.product.js").read_text() == "product engine"
    assert (out / "vendor/web-llm/web-llm.product.js").read_text() == "product bundle"
    assert (out / "vendor/web-llm/web-llm.js").read_text() == "hook web-llm.js"
    assert (out / "engines/limits.js").read_text() == "hook engine-limits.js"
    assert (out / "catalogue/source.js").read_text() == "hook catalogue-source.js"
    assert (out / "catalogue/source.product.js").read_text() == "product catalogue source"
    assert (out / "testhooks/napllm_testhooks.py").is_file()
    assert not (out / "stale").exists()
    # dist/ itself is untouched.
    assert (dist / "js/boot-runtime.js").read_text() == "product boot"
    assert sorted(p.name for p in dist.rglob("*") if p.is_file()) == sorted(
        [
            "build-info.json",
            "index.html",
            "boot-runtime.js",
            "webllm-engine.js",
            "web-llm.js",
            "limits.js",
            "source.js",
        ]
    )
    # A changed dist/ file (replaced, as DistWriter does) is linked again.
    (dist / "index.html").unlink()
    (dist / "index.html").write_text("new")
    build_test_dist()
    assert (out / "index.html").read_text() == "new"


def test_test_build_needs_a_built_dist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(paths, "DIST", tmp_path / "none")
    with pytest.raises(build.BuildError, match="not built"):
        build_test_dist()


def test_the_browser_wheel_carries_only_what_runs_in_the_browser() -> None:
    sources = [path.relative_to(ROOT).as_posix() for path in wheel.napllm_sources()]
    assert not [name for name in sources if name.startswith("runtime/napllm/lmsp_service/")]
    assert not [name for name in sources if name.startswith("runtime/napllm/devtools/")]
    assert "runtime/napllm/toolcall_text.py" in sources  # shared with the service, runs in both
    assert "runtime/napllm/browser/app.py" in sources
    assert "pyproject.toml" in sources
    # The httpx port runs only under CPython; the README is no part of the wheel.
    assert "runtime/napllm/providers/http_httpx.py" not in sources
    assert "runtime/napllm/providers/lmsp_client.py" in sources
    assert "README.md" not in sources


@pytest.mark.skipif(
    not (paths.NODE_MODULES / "pyodide" / "pyodide.js").is_file(), reason="no Pyodide in node"
)
def test_the_napllm_wheel_gets_bytecode_compiled_by_pyodide(tmp_path: Path) -> None:
    wheel = _wheel(
        tmp_path / "demo-1.0-py3-none-any.whl",
        "demo",
        "1.0",
        [],
        ["demo/__init__.py", "demo/sub/mod.py"],
    )
    with zipfile.ZipFile(wheel, "a") as zf:
        zf.writestr(
            "demo/extra.py",
            '"""MODULE-DOC"""\n'
            "class A:\n"
            '    """CLASS-DOC"""\n'
            "    def f(self):\n"
            '        """ONLY-DOC"""\n'
            "VALUE = 'KEPT-STRING'\n",
        )
    add_bytecode(wheel)
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        pycs = sorted(n for n in names if n.endswith(".pyc"))
        record = zf.read("demo-1.0.dist-info/RECORD").decode()
        data = zf.read(next(n for n in pycs if "extra" in n))
    # One unchecked-hash pyc per module, for Pyodide's Python (3.14), listed in RECORD.
    assert [n.rsplit("/", 1)[0] for n in pycs] == [
        "demo/__pycache__",
        "demo/__pycache__",
        "demo/sub/__pycache__",
    ]
    assert all(n.endswith(".cpython-314.pyc") for n in pycs)
    assert int.from_bytes(data[4:8], "little") == 0b01  # hash-based, not checked
    assert all(f"{n},," in record for n in pycs)
    # The sources stay; the bytecode leaves docstrings out (a body that was
    # only a docstring compiles to `pass`) and keeps every other constant.
    assert {"demo/__init__.py", "demo/sub/mod.py", "demo/extra.py"} <= set(names)
    assert b"KEPT-STRING" in data
    assert not [doc for doc in (b"MODULE-DOC", b"CLASS-DOC", b"ONLY-DOC") if doc in data]


def test_napplet_copy_never_follows_links_out_of_the_napplet(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A napplet folder's links (to a file, a folder, or the folder itself) are not published."""
    outside = tmp_path / "home"
    (outside / ".ssh").mkdir(parents=True)
    (outside / ".ssh" / "id_rsa").write_text("PRIVATE KEY")
    napplets = tmp_path / "napplets"
    good = napplets / "good"
    good.mkdir(parents=True)
    (good / "index.html").write_text("<title>Good</title>")
    (good / "app.js").write_text("ok")
    (good / "key.txt").symlink_to(outside / ".ssh" / "id_rsa")
    (good / "ssh").symlink_to(outside / ".ssh")
    (outside / "index.html").write_text("<title>Linked</title>")
    (napplets / "linked").symlink_to(outside)
    monkeypatch.setattr(paths, "NAPPLETS", napplets)
    dist = tmp_path / "dist"
    index = content.copy_napplets(base.DistWriter(dist))
    assert [card["name"] for card in index] == ["good"]
    copied = sorted(p.relative_to(dist).as_posix() for p in dist.rglob("*") if p.is_file())
    assert copied == ["napplets/good/app.js", "napplets/good/index.html", "napplets/index.json"]
    assert all("PRIVATE KEY" not in p.read_text() for p in dist.rglob("*") if p.is_file())


def test_the_prompt_api_layer_ships_bundled_as_inline_text(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not (paths.NODE_MODULES / ".bin" / "esbuild").is_file():
        pytest.skip("needs the npm packages (npm ci)")
    monkeypatch.setattr(paths, "BUILD", tmp_path / "cache")
    dist = tmp_path / "dist"
    out = base.DistWriter(dist)
    content.copy_web(out)
    bundle_prompt_api(out)
    assert not (dist / "prompt-api").exists()  # only the bundle is shipped
    assert (dist / "prompt-api.d.ts").is_file()
    module = (dist / "js" / "prompt-api-source.js").read_text(encoding="utf-8")
    prefix = "export const PROMPT_API_SOURCE = "
    line = next(line for line in module.splitlines() if line.startswith(prefix))
    source = json.loads(line.removeprefix(prefix).removesuffix(";"))
    assert source.startswith("var napllmPromptApi=")
    assert "installPromptApi" in source
    assert "</script" not in source.lower() and "<!--" not in source
    # No code generation: the napplet frame's CSP has no 'unsafe-eval'.
    assert "new Function" not in source and "eval(" not in source


ECHO_BUILD: dict[str, object] = {
    "kind": "echo",
    "bundles": [{"entry": "echo.js", "output": "vendor/echo/echo.js"}],
    "packages": ["@scope/echo"],
    "vendor": [{"from": "@scope/echo/dist/echo.wasm", "to": "vendor/echo/echo.wasm"}],
    "models": [{"source": "echo", "dest": "models/echo-model", "files": ["a.json", "w/b.bin"]}],
    "test": {
        "replace": {"engines/echo.js": {"hook": "echo.js", "product": "engines/echo.product.js"}},
        "add": {"testhooks/echo-double.js": "echo-double.js"},
    },
}


def test_the_build_bundles_exactly_the_declared_entries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """esbuild runs on each engine's declared entries and the shell's own, nothing
    else; the declared node_modules files are copied beside the bundles."""
    from buildsys import bundles

    entries = tmp_path / "web" / "vendor-entry"
    entries.mkdir(parents=True)
    for name in ("echo.js", "hash-wasm.js", "undeclared.js"):
        (entries / name).write_text(f"// {name}")
    (tmp_path / "package-lock.json").write_text("{}")
    wasm = tmp_path / "node_modules" / "@scope" / "echo" / "dist" / "echo.wasm"
    wasm.parent.mkdir(parents=True)
    wasm.write_bytes(b"\0asm")
    monkeypatch.setattr(paths, "ROOT", tmp_path)
    monkeypatch.setattr(paths, "NODE_MODULES", tmp_path / "node_modules")
    monkeypatch.setattr(paths, "STAMPS", tmp_path / "build" / "stamps")
    ran: list[tuple[str, str]] = []

    def esbuild(cmd: list[str]) -> None:
        outfile = Path(cmd[-1].removeprefix("--outfile="))
        ran.append((Path(cmd[1]).name, outfile.relative_to(tmp_path / "dist").as_posix()))
        outfile.write_text("bundle")

    monkeypatch.setattr(bundles, "run", esbuild)
    out = base.DistWriter(tmp_path / "dist")
    bundles.bundle_js(out, [ECHO_BUILD])
    assert ran == [("echo.js", "vendor/echo/echo.js"), *bundles.SHELL_BUNDLES]
    assert (tmp_path / "dist" / "vendor/echo/echo.wasm").read_bytes() == b"\0asm"
    assert {p.relative_to(out.root).as_posix() for p in out.written} == {
        "vendor/echo/echo.js",
        "vendor/echo/echo.wasm",
        *(rel for _, rel in bundles.SHELL_BUNDLES),
    }
    # Unchanged inputs: nothing is bundled again; without the engine, its bundle goes.
    bundles.bundle_js(base.DistWriter(tmp_path / "dist"), [ECHO_BUILD])
    assert len(ran) == 2
    bundles.bundle_js(base.DistWriter(tmp_path / "dist"), [])
    assert ran[2:] == list(bundles.SHELL_BUNDLES)
    wasm.unlink()
    with pytest.raises(build.BuildError, match=r"echo\.wasm is missing"):
        bundles.bundle_js(base.DistWriter(tmp_path / "dist"), [ECHO_BUILD])


def test_the_declared_model_files_are_copied_after_their_sums_are_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "models" / "echo"
    (folder / "w").mkdir(parents=True)
    (folder / "a.json").write_text("{}")
    (folder / "w" / "b.bin").write_bytes(b"weights")
    (folder / "kit.py").write_text("# not shipped")
    sums = {
        name: hashlib.sha256((folder / name).read_bytes()).hexdigest()
        for name in ("a.json", "w/b.bin")
    }
    (folder / "SHA256SUMS").write_text("".join(f"{h}  {n}\n" for n, h in sums.items()))
    monkeypatch.setattr(paths, "ROOT", tmp_path)
    monkeypatch.setattr(paths, "MODELS", tmp_path / "models")
    dist = tmp_path / "dist"
    shipped = models.copy_models(base.DistWriter(dist), [ECHO_BUILD, {"kind": "bare"}])
    assert shipped == {
        "echo": [{"path": "models/echo-model", "files": sums, "bytes": 2 + len(b"weights")}],
        "bare": [],
    }
    copied = sorted(p.relative_to(dist).as_posix() for p in dist.rglob("*") if p.is_file())
    assert copied == ["models/echo-model/a.json", "models/echo-model/w/b.bin"]
    assert [
        str(p.relative_to(tmp_path)) for p in models.model_sources(ECHO_BUILD["models"][0])
    ] == [  # type: ignore[index]
        "models/echo/SHA256SUMS",
        "models/echo/a.json",
        "models/echo/w/b.bin",
    ]
    (folder / "w" / "b.bin").write_bytes(b"changed")
    with pytest.raises(build.BuildError, match=r"b\.bin is missing or does not match"):
        models.copy_models(base.DistWriter(dist), [ECHO_BUILD])
    (folder / "SHA256SUMS").write_text(f"{sums['a.json']}  a.json\n")
    (folder / "w" / "b.bin").write_bytes(b"weights")
    with pytest.raises(build.BuildError, match=r"b\.bin is missing or does not match"):
        models.copy_models(base.DistWriter(dist), [ECHO_BUILD])
    (folder / "SHA256SUMS").unlink()
    with pytest.raises(build.BuildError, match="SHA256SUMS is missing"):
        models.copy_models(base.DistWriter(dist), [ECHO_BUILD])


def test_a_catalogue_is_what_its_engines_function_makes_of_the_exports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The build reads the declared exports and hands them, with the engine's
    shipped models, to the function its spec names; a refusal stops the build."""
    from buildsys import bundles, engines

    declared = [b for b in engines.engine_builds() if "catalog" in b]
    assert declared, "no engine declares a catalogue"
    read: list[tuple[str, str, list[str]]] = []
    exports = {
        "prebuiltAppConfig": {"model_list": [{"model_id": "m", "vram_required_MB": 1, "x": 2}]},
        "functionCallingModelIds": ["m"],
    }

    def fake_exports(kind: str, bundle: Path, names: list[str]) -> dict[str, object]:
        read.append((kind, bundle.relative_to(tmp_path).as_posix(), names))
        return exports

    monkeypatch.setattr(bundles, "library_exports", fake_exports)
    sums = {"mlc-chat-config.json": "a" * 64, "tinychat-webgpu.wasm": "b" * 64}
    sums["tokenizer.json"] = "c" * 64
    shipped = {b["kind"]: [{"path": "models/m", "files": sums, "bytes": 1}] for b in declared}
    out = base.DistWriter(tmp_path)
    written = bundles.write_catalogs(out, shipped, declared)
    assert written == [b["catalog"]["file"] for b in declared]
    for build_, rel in zip(declared, written, strict=True):
        catalog = build_["catalog"]
        assert (build_["kind"], catalog["bundle"], catalog["exports"]) in read
        make = engines.catalog_function(build_["kind"], catalog["make"])
        assert json.loads((tmp_path / rel).read_text()) == make(exports, shipped[build_["kind"]])
    exports = {"prebuiltAppConfig": {"model_list": []}}
    with pytest.raises(build.BuildError, match="catalogue"):
        bundles.write_catalogs(base.DistWriter(tmp_path), shipped, declared)
    assert bundles.write_catalogs(base.DistWriter(tmp_path), {}, [ECHO_BUILD]) == []


def test_the_test_build_takes_each_engines_hooks_from_its_declaration() -> None:
    from buildsys import dist

    overrides, additions = dist.dist_test_hooks([ECHO_BUILD])
    assert overrides == {
        **dist.TEST_OVERRIDES,
        "engines/echo.js": ("echo.js", "engines/echo.product.js"),
    }
    assert additions == {**dist.TEST_ADDITIONS, "testhooks/echo-double.js": "echo-double.js"}
    assert dist.dist_test_hooks([]) == (dist.TEST_OVERRIDES, dist.TEST_ADDITIONS)
    twice = {"kind": "other", "test": {"add": {"testhooks/echo-double.js": "x.js"}}}
    with pytest.raises(build.BuildError, match="two test hooks"):
        dist.dist_test_hooks([ECHO_BUILD, twice])


def test_build_info_names_each_declared_library_and_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from buildsys import dist

    monkeypatch.setattr(dist, "npm_version", lambda package: f"1.0-{package}")
    out = base.DistWriter(tmp_path)
    out.write_bytes("index.html", b"<!doctype html>")
    shipped = {"echo": [{"path": "models/echo-model", "files": {}, "bytes": 0}]}
    pyodide_info = {"info": {"python": "3.14.0"}, "packages": {}}
    info = dist.write_build_info(out, pyodide_info, shipped, 0, [ECHO_BUILD])
    assert info["echo"] == "1.0-@scope/echo"
    assert info["models"] == shipped
    assert info["files"] == {"index.html": 15}


def test_a_malformed_build_declaration_stops_the_build(monkeypatch: pytest.MonkeyPatch) -> None:
    from buildsys import engines

    from napllm.providers import engine_specs

    def refuse() -> list[dict[str, object]]:
        raise ValueError("the build of 'echo' names a file outside its folder or dist/")

    monkeypatch.setattr(engine_specs, "build_declarations", refuse)
    with pytest.raises(build.BuildError, match="outside its folder"):
        engines.engine_builds()
    with pytest.raises(build.BuildError, match="no engine of kind"):
        engines.catalog_function("no-such-engine", "make")
