"""A deployer's Content-Security-Policy header and the napplet frames.

A napplet's srcdoc frame inherits the shell page's CSP, so a policy without
`'unsafe-inline'` scripts stops the shell's prelude (and the napplet) from
running. Checked against dist/ served with a CSP header:
- the policy the README's deploy section recommends keeps everything working
  (boot, the connections form, a napplet selects and generates, on a
  scripted connection and on the built-in llama.cpp engine);
- a policy that blocks inline scripts gives the tab a specific error that
  names the page's policy, instead of a napplet that silently does nothing;
- a policy without `blob:` scripts gives a Python napplet's frame an error
  that says so.
"""

from __future__ import annotations

import functools
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from shellpage import ShellPage, generate, install_napplets

from conftest import TEST_PREFIX
from napllm.devtools.headless import make_server

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
FULL = "Scripted"
#: The example of a policy that breaks napplets (no inline scripts).
BREAKING_CSP = "default-src 'self'; script-src 'self' 'wasm-unsafe-eval'"


def recommended_csp() -> str:
    """The policy the README's deploy section gives (the one code block after its marker)."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    match = re.search(r"<!-- deploy-csp -->\s*```text\n(.+?)\n```", readme, re.S)
    assert match, "README.md has no deploy CSP block"
    return " ".join(match.group(1).split())


def serve(dist_dir: Path, test_pages_dir: Path, csp: str) -> tuple[Any, str]:
    """dist/ with the shell server's headers plus `Content-Security-Policy: csp`."""

    server = make_server(dist_dir, quiet=True, overlays={TEST_PREFIX: test_pages_dir})
    base = server.RequestHandlerClass.func  # functools.partial(handler, directory=...)

    def end_headers(self: Any) -> None:
        self.send_header("Content-Security-Policy", csp)
        super(with_csp, self).end_headers()

    with_csp = type("WithCsp", (base,), {"end_headers": end_headers})
    server.RequestHandlerClass = functools.partial(with_csp, directory=str(dist_dir))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


def no_blob_csp() -> str:
    """The recommended policy without `blob:` scripts (which Python napplets need)."""
    return recommended_csp().replace(" blob:;", ";", 1)


POLICIES = {
    "recommended": recommended_csp,
    "breaking": lambda: BREAKING_CSP,
    "no-blob": no_blob_csp,
}


@pytest.fixture
def csp_shell(
    browser: Any, dist_dir: Path, test_pages_dir: Path, request: pytest.FixtureRequest
) -> Iterator[ShellPage]:
    """A fresh browser context on the product dist/ served with the policy named by
    the parameter."""
    server, url = serve(dist_dir, test_pages_dir, POLICIES[request.param]())
    context = browser.new_context()
    try:
        yield ShellPage(context.new_page(), url, install_napplets(test_pages_dir, url))
    finally:
        context.close()
        server.shutdown()
        server.server_close()


def page_csp(shell: ShellPage) -> str:
    header: str = shell.page.evaluate(
        "() => fetch(location.href).then((r) => r.headers.get('content-security-policy'))"
    )
    return header


@pytest.mark.parametrize("csp_shell", ["recommended"], indirect=True)
def test_the_recommended_csp_keeps_napplets_working(csp_shell: ShellPage) -> None:
    shell = csp_shell
    shell.boot(query="")
    assert page_csp(shell) == recommended_csp()
    shell.scripted(FULL, [{"text": ["works"]}])
    app = shell.open_napplet()
    handle = app.select(FULL)
    result = app.run(generate("g1", handle))
    assert result["result"]["content"] == [{"type": "text", "text": "works"}]
    # the built-in engine (llama.cpp in WebAssembly, its workers) works under it too
    app.post({"type": "llm.select", "id": "s-tiny"})
    shell.chooser().locator(".candidate[data-candidate-id='builtin-tinychat']").click()
    tiny = app.wait_for("s-tiny", "llm.select.result")["model"]["handle"]
    app.post(generate("g-tiny", tiny, temperature=0, maxTokens=8))
    shell.allow()
    outcome = app.wait_for("g-tiny", timeout_ms=120_000)
    assert "result" in outcome and outcome["result"]["content"], outcome


@pytest.mark.parametrize("csp_shell", ["breaking"], indirect=True)
def test_a_csp_that_blocks_the_prelude_is_named_in_the_tab(csp_shell: ShellPage) -> None:
    shell = csp_shell
    shell.boot(query="")
    shell.page.fill("#napplet-url", shell.probe_url)
    shell.page.click("#napplet-url-open")
    stopped = shell.page.locator(".frame-stopped")
    stopped.wait_for()
    text = stopped.inner_text()
    assert "Content-Security-Policy" in text and BREAKING_CSP in text, text
    assert any(BREAKING_CSP in notice for notice in shell.notices())


@pytest.mark.parametrize("csp_shell", ["no-blob"], indirect=True)
def test_a_csp_without_blob_scripts_is_named_in_a_python_napplets_frame(
    csp_shell: ShellPage, test_pages_dir: Path
) -> None:
    shell = csp_shell
    assert " blob:;" in recommended_csp() and "blob:" not in no_blob_csp().split("style-src")[0]
    shell.boot(query="")
    page = '<meta name="napplet-python" content=""><script type="py">print(1)</script>'
    (test_pages_dir / "csp-python.html").write_text(page, encoding="utf-8")
    napplet = shell.open_python(f"{shell.dist_url}{TEST_PREFIX.strip('/')}/csp-python.html")
    frame = napplet.frame
    assert frame.evaluate("document.documentElement.dataset.nappletPython") == "error"
    text = frame.locator("pre.napplet-python-error").inner_text()
    assert "Content-Security-Policy blocks blob: scripts" in text, text
