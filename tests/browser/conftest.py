"""Browser test harness: a built dist/, a local COOP/COEP server and offline Chromium.

Rules
- Chromium is Debian's (``/usr/bin/chromium``, or ``$NAPLLM_CHROMIUM``),
  driven by pytest-playwright through ``executable_path``; browsers are never
  downloaded. Launch flags keep Chromium off the network: background services
  are disabled and ``--host-resolver-rules`` makes every name but 127.0.0.1
  unresolvable, so even requests Playwright cannot observe fail inside
  Chromium. Path and flags come from ``napllm.devtools.headless``, which the
  benchmarks and napllm-check use too.
- dist/ is built once per session when it is missing or older than its
  sources; ``NAPLLM_SKIP_BUILD=1`` uses dist/ as it is.
- The tests drive the *test build* ``dist-test/`` (``build.py build
  --with-test-hooks``: dist/ plus tests/hooks/, remade from dist/ at the
  start of every session), served as ``dist_url`` / ``base_url`` on a free
  127.0.0.1 port by the shell's own server (``napllm.devtools.headless``,
  the one ``python build.py serve`` runs). The product dist/ never has a test hook; tests about
  the product itself use ``dist_dir`` or ``product_url`` (dist/ served
  the same way). Pages that exist only for tests are
  written by tests into a temporary folder served under ``/_test/``, so they
  can use the same relative URLs as the shell (``../pyodide/pyodide.mjs``)
  without entering dist/.
- ``request_log`` records every request of every page of the test's browser
  context and fails the test when one leaves 127.0.0.1 (``data:``, ``blob:``
  and ``about:`` URLs are not requests to anywhere). Console messages and
  page errors are recorded too and printed in the report of a failed test.
- A module boots its shell page once: ``booted`` (module scope, in its own
  context ``shell_context``) and ``shell`` (the same page, reset after each
  test). A module overrides ``booted`` where it needs another start, and
  ``shell`` where a test needs more cleaning after it.
- WebGPU needs ``--enable-unsafe-webgpu``: use the ``webgpu_session`` fixture,
  which runs a second browser with that flag and the same request checks.
- Every test under tests/browser/ is marked ``browser``.
- Browser contexts are returning visitors: every context made by the
  ``browser`` and ``webgpu_browser`` fixtures (``new_context``, hence also
  pytest-playwright's ``context``/``page``) runs `RETURNING_VISITOR_SCRIPT`,
  which records in localStorage that the first visit happened, so the shell
  does not open the Chat napplet by itself and tests start from the plain
  start view. Tests of the first visit use ``first_visit_context``.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import urlsplit

import pytest
from shellpage import ShellPage, boot_shell

from napllm.devtools.headless import CHROMIUM, CHROMIUM_ARGS, WEBGPU_ARGS, serving

ROOT = Path(__file__).resolve().parents[2]
TEST_PREFIX = "/_test/"

#: Marks the first visit as done (the key of web/js/gallery.js) in the top
#: document, before the shell's scripts run; see the module docstring.
RETURNING_VISITOR_SCRIPT = (
    "try { if (window.top === window) localStorage.setItem('napllm.firstVisit', 'done'); }"
    " catch (e) {}"
)

#: URL schemes that do not leave the browser.
LOCAL_SCHEMES = frozenset({"data", "blob", "about"})


def _load_build_module() -> ModuleType:
    """Import the repository's build.py under a private name (``build`` is a PyPI name)."""
    spec = importlib.util.spec_from_file_location("napllm_build", ROOT / "build.py")
    if spec is None or spec.loader is None:
        raise RuntimeError("cannot import build.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


build_module = _load_build_module()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "webgpu: needs Chromium with --enable-unsafe-webgpu")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.browser)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Attach the browser's console, page errors and requests to a failed test's report."""
    report = yield
    logs: list[BrowserLog] = item.stash.get(_LOGS_KEY, [])
    if report.failed:
        for log in logs:
            report.sections.append((f"browser ({log.name})", log.describe()))
    return report


# --------------------------------------------------------------------------- logs


def is_local_url(url: str) -> bool:
    """True for URLs on 127.0.0.1 and for data:, blob: and about: URLs."""
    parts = urlsplit(url)
    if parts.scheme in LOCAL_SCHEMES:
        return True
    return parts.scheme in ("http", "https", "ws", "wss") and parts.hostname == "127.0.0.1"


@dataclass
class BrowserLog:
    """What the pages of one browser context did: requests, failures, console, errors."""

    name: str
    requests: list[str] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)
    statuses: dict[str, int] = field(default_factory=dict)
    console: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)

    def attach(self, context: Any) -> None:
        """Record the events of ``context`` (a Playwright BrowserContext) and its pages."""
        context.on("request", lambda r: self.requests.append(r.url))
        context.on("requestfailed", lambda r: self.failed.append((r.url, str(r.failure))))
        context.on("response", lambda r: self.statuses.__setitem__(r.url, r.status))
        context.on("console", lambda m: self.console.append(f"{m.type}: {m.text}"))
        context.on("page", self._watch_page)
        for page in context.pages:
            self._watch_page(page)

    def _watch_page(self, page: Any) -> None:
        page.on("pageerror", lambda e: self.page_errors.append(str(e)))

    def external(self) -> list[str]:
        """Requested URLs that leave 127.0.0.1."""
        return [u for u in self.requests if not is_local_url(u)]

    def errors(self, ignore: Callable[[str], bool] = lambda u: False) -> list[str]:
        """Failed requests and HTTP error responses (status >= 400), except ``ignore``d URLs."""
        out = [f"{u}: {why}" for u, why in self.failed if not ignore(u)]
        out += [f"{u}: HTTP {s}" for u, s in self.statuses.items() if s >= 400 and not ignore(u)]
        return out

    def assert_local(self) -> None:
        """Fail unless every request stayed on 127.0.0.1."""
        outside = self.external()
        assert not outside, f"requests left 127.0.0.1: {outside}"

    def describe(self) -> str:
        """A text dump for failure reports."""
        lines = ["requests:", *(f"  {u} -> {self.statuses.get(u, '-')}" for u in self.requests)]
        lines += ["failed requests:", *(f"  {u}: {why}" for u, why in self.failed)]
        lines += ["console:", *(f"  {m}" for m in self.console)]
        lines += ["page errors:", *(f"  {e}" for e in self.page_errors)]
        return "\n".join(lines)


_LOGS_KEY = pytest.StashKey[list[BrowserLog]]()


def _register(request: pytest.FixtureRequest, log: BrowserLog) -> None:
    request.node.stash.setdefault(_LOGS_KEY, []).append(log)


# --------------------------------------------------------------------------- dist and server


@pytest.fixture(scope="session")
def dist_dir() -> Path:
    """dist/, built first when missing or stale (unless ``NAPLLM_SKIP_BUILD=1``)."""
    dist: Path = build_module.DIST
    if os.environ.get("NAPLLM_SKIP_BUILD") == "1":
        if not (dist / "build-info.json").is_file():
            pytest.fail("NAPLLM_SKIP_BUILD=1 but dist/ is not built; run `python build.py`")
    elif build_module.dist_is_stale():
        try:
            build_module.build()
        except build_module.BuildError as exc:
            pytest.fail(f"build.py failed: {exc}")
    return dist


@pytest.fixture(scope="session")
def test_dist_dir(dist_dir: Path) -> Path:
    """dist-test/: the built dist/ plus the test hooks (see build.py ``--with-test-hooks``)."""
    try:
        path: Path = build_module.build_test_dist()
    except build_module.BuildError as exc:
        pytest.fail(f"build.py --with-test-hooks failed: {exc}")
    return path


@pytest.fixture(scope="session")
def test_pages_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A temporary folder served under ``/_test/``, for pages that exist only in tests."""
    return tmp_path_factory.mktemp("test-pages")


@pytest.fixture(scope="session")
def dist_url(test_dist_dir: Path, test_pages_dir: Path) -> Iterator[str]:
    """Base URL (ending in ``/``) of the test build served on 127.0.0.1 with COOP/COEP."""
    with serving(test_dist_dir, overlays={TEST_PREFIX: test_pages_dir}) as url:
        yield url


@pytest.fixture(scope="session")
def product_url(dist_dir: Path, test_pages_dir: Path) -> Iterator[str]:
    """Base URL (ending in ``/``) of the product dist/ served the same way."""
    with serving(dist_dir, overlays={TEST_PREFIX: test_pages_dir}) as url:
        yield url


@pytest.fixture(scope="session")
def base_url(dist_url: str) -> str:
    """pytest-playwright's base URL: relative ``page.goto`` targets resolve against the
    test build."""
    return dist_url


@pytest.fixture
def test_page(test_pages_dir: Path, dist_url: str) -> Callable[[str, str], str]:
    """Write a test-only page and return its URL: ``test_page(name, html) -> url``.

    The page is served as ``/_test/<name>``, one level below dist/'s root, so
    it reaches dist/ files as ``../pyodide/...``, ``../vendor/...``.
    """

    def write(name: str, html: str) -> str:
        (test_pages_dir / name).write_text(html, encoding="utf-8")
        return f"{dist_url}{TEST_PREFIX.strip('/')}/{name}"

    return write


# --------------------------------------------------------------------------- browsers


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args: dict[str, Any]) -> dict[str, Any]:
    """Launch Debian's Chromium with the offline flags (never a downloaded browser)."""
    if not Path(CHROMIUM).exists():
        pytest.skip(f"Chromium not found at {CHROMIUM} (apt-get install chromium)")
    return {**browser_type_launch_args, "executable_path": CHROMIUM, "args": list(CHROMIUM_ARGS)}


def returning_visitors(browser: Any) -> Any:
    """Make ``browser.new_context`` add `RETURNING_VISITOR_SCRIPT` to each context;
    the unchanged method stays available as ``browser.first_visit_new_context``."""
    if hasattr(browser, "first_visit_new_context"):
        return browser
    original = browser.new_context

    def new_context(*args: Any, **kwargs: Any) -> Any:
        context = original(*args, **kwargs)
        context.add_init_script(RETURNING_VISITOR_SCRIPT)
        return context

    browser.first_visit_new_context = original
    browser.new_context = new_context
    return browser


@pytest.fixture(scope="session")
def browser(browser: Any) -> Any:
    """pytest-playwright's browser, whose contexts are returning visitors (module docstring)."""
    return returning_visitors(browser)


@pytest.fixture
def first_visit_context(browser: Any, base_url: str) -> Iterator[Any]:
    """A context of a first-time visitor (empty storage, no returning-visitor script)."""
    context = browser.first_visit_new_context(base_url=base_url)
    try:
        yield context
    finally:
        context.close()


@pytest.fixture
def request_log(request: pytest.FixtureRequest) -> Iterator[BrowserLog]:
    """Records the test's browser context; the test fails if a request left 127.0.0.1.

    The context is the module's shared one (`shell_context`) when the test
    drives the module's shell page (`booted`, through `shell`), else
    pytest-playwright's ``context`` (or the module's own override of it).
    """
    name = "shell_context" if "booted" in request.fixturenames else "context"
    log = BrowserLog("default")
    log.attach(request.getfixturevalue(name))
    _register(request, log)
    yield log
    log.assert_local()


# --------------------------------------------------------------------------- the shared shell page


@pytest.fixture(scope="module")
def shell_context(browser: Any) -> Iterator[Any]:
    """One browser context per module, holding the module's shell page (`booted`)."""
    context = browser.new_context()
    yield context
    context.close()


@pytest.fixture(scope="module")
def booted(shell_context: Any, dist_url: str, test_pages_dir: Path) -> ShellPage:
    """The module's shell page, booted once: the test build with its hooks
    (``?test=1``: the fixture connections). A module that needs another start
    (the product with scripted connections, a connection added through the
    panel) overrides this fixture, usually with `shellpage.boot_shell`."""
    return boot_shell(shell_context.new_page(), dist_url, test_pages_dir)


@pytest.fixture
def shell(booted: ShellPage, request_log: BrowserLog) -> Iterator[ShellPage]:
    """The module's shared shell page, reset after the test; requests stay on 127.0.0.1."""
    yield booted
    booted.reset()


@dataclass
class BrowserSession:
    """A page in its own context, with the log of everything the context did."""

    context: Any
    page: Any
    log: BrowserLog


@pytest.fixture(scope="session")
def webgpu_browser(browser_type: Any, browser_type_launch_args: dict[str, Any]) -> Iterator[Any]:
    """A second Chromium with ``--enable-unsafe-webgpu`` (SwiftShader when no GPU)."""
    args = [*browser_type_launch_args["args"], *WEBGPU_ARGS]
    browser = browser_type.launch(**{**browser_type_launch_args, "args": args})
    yield returning_visitors(browser)
    browser.close()


@pytest.fixture
def webgpu_session(
    webgpu_browser: Any, base_url: str, request: pytest.FixtureRequest
) -> Iterator[BrowserSession]:
    """A page of the WebGPU browser; fails the test if a request left 127.0.0.1."""
    context = webgpu_browser.new_context(base_url=base_url)
    log = BrowserLog("webgpu")
    log.attach(context)
    _register(request, log)
    page = context.new_page()
    try:
        yield BrowserSession(context, page, log)
    finally:
        context.close()
    log.assert_local()
