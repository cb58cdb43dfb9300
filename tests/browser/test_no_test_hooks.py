"""The product dist/ carries no test hook; only the test build (dist-test/) does.

The hooks (fixture connections, ``window.napllmTest``, ``engineDelayMs``,
``setEngineFactoryForTests``) live in tests/hooks/ and are added by
``build.py build --with-test-hooks``. Here: no file of dist/ written from
this repository (nor any module of the napllm wheel) names a hook; the
product booted with ``?test=1`` has no ``napllmTest`` and no fixture
connection; the test build turns its hooks on only for a query whose
``test`` parameter is ``1`` (``?latest=1`` is not test mode).
"""

from __future__ import annotations

import re
import zipfile
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.browser

BOOT_TIMEOUT_MS = 60_000

#: Names that exist only in the test hooks (tests/hooks/).
HOOK_NAMES = re.compile(
    r"napllmTest|engineDelayMs|setEngineFactoryForTests|napllm_testhooks|test_connections"
    r"|fx-full|fx-text|testMode|test_mode|test=1"
)

#: Third-party files copied into dist/ (checked by their own pins, not here).
THIRD_PARTY = ("pyodide/", "vendor/")


def product_text_files(dist_dir: Path) -> dict[str, str]:
    """The repository's own text files in dist/ and the modules of the napllm wheel."""
    found: dict[str, str] = {}
    for path in sorted(dist_dir.rglob("*")):
        rel = path.relative_to(dist_dir).as_posix()
        if not path.is_file() or rel.startswith(THIRD_PARTY):
            continue
        if path.suffix in (".js", ".mjs", ".html", ".css", ".json", ".webmanifest", ".py"):
            found[rel] = path.read_text(encoding="utf-8", errors="replace")
    wheel = next((dist_dir / "pyodide").glob("napllm-*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            if name.endswith(".py"):
                found[f"{wheel.name}:{name}"] = archive.read(name).decode("utf-8", "replace")
    return found


def test_product_files_name_no_test_hook(dist_dir: Path) -> None:
    files = product_text_files(dist_dir)
    assert "js/boot-runtime.js" in files
    assert any(name.endswith("napllm/browser/app.py") for name in files)
    hits = {name: sorted(set(HOOK_NAMES.findall(text))) for name, text in files.items()}
    assert {name: found for name, found in hits.items() if found} == {}
    assert not (dist_dir / "testhooks").exists()


def test_test_build_adds_the_hooks(test_dist_dir: Path) -> None:
    hooks = (test_dist_dir / "testhooks" / "napllm_testhooks.py").read_text()
    assert "napllmTest" in hooks
    boot = (test_dist_dir / "js" / "boot-runtime.js").read_text()
    assert "napllm_testhooks" in boot


def boot(page: Any, url: str) -> None:
    page.goto(url)
    page.wait_for_function(
        "() => ['ready', 'failed'].includes(document.body.dataset.boot)", timeout=BOOT_TIMEOUT_MS
    )
    assert page.evaluate("document.body.dataset.boot") == "ready"


def connection_ids(page: Any) -> list[str]:
    page.wait_for_function("() => document.querySelectorAll('#connection-list > li').length > 0")
    ids: list[str] = page.eval_on_selector_all(
        "#connection-list > li", "(items) => items.map((li) => li.dataset.connectionId || '')"
    )
    return ids


def test_product_booted_with_test_query_has_no_hooks(
    page: Any, request_log: Any, product_url: str
) -> None:
    boot(page, f"{product_url}index.html?test=1&engineDelayMs=500")
    assert page.evaluate("typeof window.napllmTest") == "undefined"
    ids = connection_ids(page)
    assert not [i for i in ids if i.startswith("fx-")], ids
    # The product publishes only its own connection kinds (napllm.kinds), no fixture kind.
    kinds = page.eval_on_selector_all("#connection-kind option", "(o) => o.map((x) => x.value)")
    assert kinds == ["", "lmsp", "openai", "wasm", "webllm", "onnx", "scripted"]
    status = page.evaluate("fetch('./testhooks/napllm_testhooks.py').then((r) => r.status)")
    assert status == 404


def test_test_build_reads_the_query_parameter_not_a_substring(
    page: Any, request_log: Any, dist_url: str
) -> None:
    boot(page, f"{dist_url}index.html?latest=1&contest=1")
    assert page.evaluate("typeof window.napllmTest") == "undefined"
    assert not [i for i in connection_ids(page) if i.startswith("fx-")]
    boot(page, f"{dist_url}index.html?latest=0&test=1")
    assert page.evaluate("typeof window.napllmTest") == "object"
    assert "fx-full" in connection_ids(page)
