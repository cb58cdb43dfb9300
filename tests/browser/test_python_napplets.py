"""Python napplets: the loader in the frame (web/js/python-loader.js) and the
shell's files (web/js/python-files.js), in Chromium around the real shell.

- A napplet with ``<meta name="napplet-python">`` runs its ``<script
  type="py">`` blocks in order with napllm importable; a traceback shows in
  the frame; micropip installs a pinned wheel and refuses any other by name;
  the meta loads pinned packages and refuses any other by name; only what
  the scripts import (and the meta names) is loaded.
- Nothing leaves the frame: ``pyodide.http.pyfetch``, ``js.fetch``, an image,
  a WebSocket, a form, XMLHttpRequest, a beacon, EventSource, ``open``,
  ``import()``, a service worker, ``loadPackage`` and ``micropip.install`` of
  URLs, a stylesheet, a script, an iframe, CSS imports, fonts and
  backgrounds, a module from a ``blob:`` URL that fetches and imports,
  workers, and micropip loaded by hand (so not pinned) with the listener as
  its index, each aimed at a local listener, are blocked and the listener
  sees none of them (while the shell page itself does reach it).
- After one visit, a Python napplet boots with the shell's server gone:
  Pyodide and the wheels come from the service worker.

Each boot of Pyodide costs seconds, so each napplet here does several checks.
"""

# ruff: noqa: E501  (the Python and JavaScript embedded below keep their natural line length)

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from recording_host import RecordingHost, recording_host
from shellpage import ShellPage
from test_offline import Server, persistent, wait_boot, wait_offline_ready  # noqa: F401

pytestmark = pytest.mark.browser

PYTHON_TIMEOUT_MS = 120_000

#: A napplet's page: `meta` is the napplet-python content, `scripts` the Python blocks.
PAGE = """<!doctype html><html><head><meta charset="utf-8"><title>Python probe</title>
<meta name="napplet-python" content="{meta}"></head>
<body><ul id="out"></ul>
<script type="py">
import js
def out(text):
    item = js.document.createElement("li")
    item.textContent = str(text)
    js.document.getElementById("out").append(item)
</script>
{scripts}
</body></html>"""


def python_page(meta: str, *scripts: str) -> str:
    """The HTML of a Python napplet whose scripts can call ``out(text)``."""
    blocks = "\n".join(f'<script type="py">\n{s}\n</script>' for s in scripts)
    return PAGE.format(meta=meta, scripts=blocks)


def lines(frame: Any) -> list[str]:
    """What the napplet's scripts wrote with ``out``."""
    found: list[str] = frame.eval_on_selector_all(
        "#out li", "(items) => items.map((i) => i.textContent)"
    )
    return found


def errors(frame: Any) -> list[str]:
    """The error blocks the loader showed in the frame."""
    found: list[str] = frame.eval_on_selector_all(
        "pre.napplet-python-error", "(items) => items.map((i) => i.textContent)"
    )
    return found


def state(frame: Any) -> str:
    value: str = frame.evaluate("document.documentElement.dataset.nappletPython")
    return value


# --------------------------------------------------------------------------- the listener


@pytest.fixture(scope="module")
def listener() -> Iterator[RecordingHost]:
    with recording_host() as host:
        yield host


def napplet_url(test_pages_dir: Path, dist_url: str, name: str, html: str) -> str:
    (test_pages_dir / name).write_text(html, encoding="utf-8")
    return f"{dist_url}_test/{name}"


# --------------------------------------------------------------------------- running


def test_python_napplet_runs_its_scripts_shows_tracebacks_and_installs_only_pinned_wheels(
    shell: ShellPage, test_pages_dir: Path, dist_url: str
) -> None:
    html = python_page(
        "",
        "import sys, napllm, pydantic\nout(f'napllm {napllm.__name__} pydantic {pydantic.VERSION} tabulate {\"tabulate\" in sys.modules}')",
        # Indented like the rest of the page: the loader dedents.
        "    import micropip\n    await micropip.install('tabulate')\n    from tabulate import tabulate\n    out(tabulate([['a', 1]], tablefmt='plain'))",
        "try:\n    await micropip.install('requests>=2')\nexcept ValueError as err:\n    out(f'refused: {err}')",
        "def explode():\n    raise RuntimeError('boom from Python')\nexplode()",
        "out('after the failing script')",
    )
    napplet = shell.open_python(napplet_url(test_pages_dir, dist_url, "py-run.html", html))
    frame = napplet.frame
    got = lines(frame)
    assert got[0] == "napllm napllm pydantic 2.14.4 tabulate False"
    assert got[1] == "a  1"
    assert got[2].startswith("refused: package 'requests>=2' is not pinned by this shell")
    assert "tabulate" in got[2]
    assert got[3] == "after the failing script"
    # The traceback is in the frame, visible, after its script.
    shown = errors(frame)
    assert len(shown) == 1
    assert "Traceback (most recent call last)" in shown[0]
    assert 'File "<script type="py"> #5", line 3' in shown[0]
    assert shown[0].rstrip().endswith("RuntimeError: boom from Python")
    assert frame.locator("pre.napplet-python-error").is_visible()
    assert state(frame) == "error"


def test_meta_refuses_a_package_the_shell_did_not_pin_by_name(
    shell: ShellPage, test_pages_dir: Path, dist_url: str
) -> None:
    html = python_page("tabulate no-such-package", "out('ran')")
    napplet = shell.open_python(napplet_url(test_pages_dir, dist_url, "py-unpinned.html", html))
    frame = napplet.frame
    shown = errors(frame)
    assert len(shown) == 1
    assert '"no-such-package" is not pinned by this shell' in shown[0]
    assert "tabulate" not in shown[0].split("not pinned")[0]
    assert lines(frame) == []
    assert state(frame) == "error"


# --------------------------------------------------------------------------- isolation


ESCAPES = """
import importlib, json
import pyodide_js
from pyodide.http import pyfetch
from pyodide.ffi import create_proxy
base = js.document.body.dataset.listener
# The loader loaded only what the scripts import (and the meta names): no napllm, no micropip.
results = {'loaded': sorted(js.Object.keys(pyodide_js.loadedPackages).to_py())}
async def attempt(name, start):
    try:
        await start()
        results[name] = 'loaded'
    except Exception as err:
        results[name] = 'blocked: ' + type(err).__name__
await attempt('pyfetch', lambda: pyfetch(base + 'pyfetch'))
await attempt('js.fetch', lambda: js.fetch(base + 'js-fetch'))
image = js.document.createElement('img')
image.src = base + 'image'
js.document.body.append(image)
try:
    socket = js.WebSocket.new(base.replace('http', 'ws') + 'websocket')
    results['websocket'] = 'created'
except Exception as err:
    results['websocket'] = 'blocked: ' + type(err).__name__
form = js.document.createElement('form')
form.method = 'post'
form.action = base + 'form'
js.document.body.append(form)
form.submit()
# More ways out, each aimed at the listener: none may reach it.
from pyodide.ffi import to_js
xhr = js.XMLHttpRequest.new()
xhr.open('GET', base + 'xhr')
xhr.send()
await attempt('beacon', lambda: js.Promise.resolve(js.navigator.sendBeacon(base + 'beacon', 'x')))
await attempt('eventsource', lambda: js.Promise.resolve(js.EventSource.new(base + 'eventsource')))
await attempt('open', lambda: js.Promise.resolve(js.open(base + 'open')))
await attempt('import', lambda: js.Function.new('u', 'return import(u)')(base + 'import.mjs'))
await attempt('serviceworker', lambda: js.navigator.serviceWorker.register(base + 'sw.js'))
await attempt('loadPackage', lambda: pyodide_js.loadPackage(base + 'pkg-1.0-py3-none-any.whl'))
for tag, attr, path in (('link', 'href', 'css'), ('script', 'src', 'script'), ('iframe', 'src', 'iframe')):
    element = js.document.createElement(tag)
    if tag == 'link':
        element.rel = 'stylesheet'
    setattr(element, attr, base + path)
    js.document.body.append(element)
style = js.document.createElement('style')
style.textContent = f"@import url('{base}import-css'); @font-face {{ font-family: f; src: url('{base}font') }} body {{ background: url('{base}background'); font-family: f }}"
js.document.head.append(style)
# A module from a blob: URL the frame made (script-src blob:) that tries to fetch and import.
module = js.Blob.new([f"fetch('{base}blob-fetch').catch(() => 0); import('{base}blob-import').catch(() => 0);"], to_js({'type': 'text/javascript'}, dict_converter=js.Object.fromEntries))
element = js.document.createElement('script')
element.type = 'module'
element.src = js.URL.createObjectURL(module)
js.document.body.append(element)
await attempt('worker', lambda: js.Promise.resolve(js.Worker.new(js.URL.createObjectURL(module))))
# The virtual base: a name the manifest cannot have is a 404 in the frame, whatever its size.
huge = await js.fetch('https://pyodide.napllm.invalid/' + 'a' * 1_000_000)
results['virtual-huge'] = huge.status
async def unpinned_micropip():
    # micropip loaded by hand (no import the loader sees, so not pinned), its index the listener.
    await pyodide_js.loadPackage('micropip')
    micropip = importlib.import_module('micropip')
    micropip.set_index_urls([base + 'simple/'])
    await micropip.install('requests')
await attempt('micropip', unpinned_micropip)
micropip = importlib.import_module('micropip')
await attempt('micropip-url', lambda: micropip.install(base + 'pkg-1.0-py3-none-any.whl'))
await attempt('micropip-emfs', lambda: micropip.install('emfs:pkg-1.0-py3-none-any.whl'))
import tabulate
out(json.dumps(results, sort_keys=True))
"""


def test_python_napplet_sends_nothing_out(
    shell: ShellPage, test_pages_dir: Path, dist_url: str, listener: RecordingHost
) -> None:
    html = python_page("tabulate", ESCAPES).replace(
        "<body>", f'<body data-listener="{listener.url}">'
    )
    napplet = shell.open_python(napplet_url(test_pages_dir, dist_url, "py-escape.html", html))
    frame = napplet.frame
    assert state(frame) == "ready", errors(frame)
    results = json.loads(lines(frame)[0])
    assert results["pyfetch"].startswith("blocked") and results["js.fetch"].startswith("blocked")
    # loadPackage only logs its failure and a blocked Worker fails by an event:
    # the listener below is what counts for them.
    for name in ("import", "micropip-url", "micropip-emfs"):
        assert results[name].startswith("blocked"), (name, results)
    assert results["virtual-huge"] == 404
    assert results["micropip"].startswith("blocked"), results
    assert results["loaded"] == ["tabulate"], results
    # The image, the socket and the form fail asynchronously: give them time to.
    shell.page.wait_for_timeout(1000)
    assert listener.hits == [], listener.hits
    # The listener does record what the shell page itself sends (positive control).
    shell.page.evaluate(
        "(u) => fetch(u, {mode: 'no-cors'}).catch(() => null)", listener.url + "control"
    )
    for _ in range(50):
        if listener.hits:
            break
        shell.page.wait_for_timeout(20)
    assert listener.hits == ["GET /control"]


# --------------------------------------------------------------------------- offline


def test_python_napplet_boots_with_the_shells_server_gone_after_one_visit(
    persistent: Any,  # noqa: F811  (test_offline's fixture, imported above)
    dist_dir: Path,
    listener: RecordingHost,
) -> None:
    url = listener.page(
        "/py-offline.html", python_page("tabulate", "import napllm, tabulate\nout('offline ok')")
    )
    server = Server(dist_dir)
    try:
        page = persistent.new_page()
        page.goto(server.url + "index.html")
        wait_boot(page)
        wait_offline_ready(page)
    finally:
        server.stop()
    responses: list[Any] = []
    persistent.on("response", lambda r: responses.append(r))
    failed: list[str] = []
    persistent.on(
        "requestfailed",
        lambda r: None if r.method == "HEAD" else failed.append(f"{r.url}: {r.failure}"),
    )
    page.reload()
    wait_boot(page)
    page.fill("#napplet-url", url)
    page.click("#napplet-url-open")
    frame = page.wait_for_selector("iframe.napplet-frame").content_frame()
    frame.wait_for_function(
        "() => ['ready', 'error'].includes(document.documentElement.dataset.nappletPython)",
        timeout=PYTHON_TIMEOUT_MS,
        polling=100,
    )
    assert state(frame) == "ready", errors(frame)
    assert lines(frame) == ["offline ok"]
    shell_files = [r for r in responses if r.url.startswith(server.url)]
    assert any(r.url.endswith("pyodide/pyodide.asm.wasm") for r in shell_files)
    assert any(r.url.endswith(".whl") and "tabulate" in r.url for r in shell_files)
    not_from_sw = [r.url for r in shell_files if not r.from_service_worker]
    assert not not_from_sw, f"served without the service worker: {not_from_sw}"
    assert not failed, f"requests failed: {failed}"
