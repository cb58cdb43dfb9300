"""Serving dist/ and launching Chromium (napllm.devtools.headless): one place for
the headers and the flags that build.py, the tests, the benchmarks and
napllm-check share.
"""

from __future__ import annotations

import subprocess
import threading
import urllib.error
import urllib.request
from email.message import Message
from pathlib import Path

import pytest

from napllm.devtools import check, headless

ROOT = Path(__file__).resolve().parents[2]
#: How the old copies of the shell's server set its first header.
#: (Both patterns are split so that this file does not match them.)
OPENER = 'send_header("Cross-Origin-' + 'Opener-Policy"'
FLAG = "host-resolver-" + "rules=MAP"


def test_launch_options_are_debians_chromium_with_the_offline_flags() -> None:
    plain = headless.launch_options()
    assert plain["executable_path"] == headless.CHROMIUM
    assert plain["args"] == list(headless.CHROMIUM_ARGS)
    assert f"--{FLAG} * ~NOTFOUND , EXCLUDE 127.0.0.1" in plain["args"]
    webgpu = headless.launch_options(webgpu=True, headless=True)
    assert webgpu["args"] == [*headless.CHROMIUM_ARGS, "--enable-unsafe-webgpu"]
    assert webgpu["headless"] is True


def test_the_flags_and_the_headers_are_written_once() -> None:
    listed = subprocess.run(
        ["git", "grep", "-l", "--untracked", "-e", FLAG, "-e", OPENER],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    if listed.returncode not in (0, 1):
        pytest.skip("not a git checkout")
    assert listed.stdout.split() == ["runtime/napllm/devtools/headless.py"]


def fetch(url: str) -> tuple[int, Message, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.headers, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, b""


def test_napllm_check_serves_the_shell_and_the_napplet_with_the_shells_headers(
    tmp_path: Path,
) -> None:
    dist = tmp_path / "dist"
    napplets = tmp_path / "napplets"
    dist.mkdir()
    napplets.mkdir()
    (dist / "index.html").write_text("shell")
    (dist / "app.mjs").write_text("export {}")
    (napplets / "hello.html").write_text("napplet")
    (tmp_path / "secret.txt").write_text("outside")
    server = check.serve(dist, napplets)
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        status, headers, body = fetch(f"{base}/index.html")
        assert (status, body) == (200, b"shell")
        for name, value in headless.SHELL_HEADERS:
            assert headers[name] == value
        assert fetch(f"{base}/app.mjs")[1].get("Content-Type") == "text/javascript"
        assert fetch(f"{base}{check.NAPPLET_PREFIX}hello.html")[2] == b"napplet"
        for escape in ("/_napplet/../secret.txt", "/_napplet/%2e%2e/secret.txt", "/../secret.txt"):
            status, _, body = fetch(base + escape)
            assert body != b"outside", escape
    finally:
        server.shutdown()
        server.server_close()


def test_serving_stops_its_server(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("a")
    before = threading.active_count()
    with headless.serving(tmp_path) as base:
        assert fetch(base + "a.txt")[2] == b"a"
    with pytest.raises(OSError):
        urllib.request.urlopen(base + "a.txt", timeout=2)
    assert threading.active_count() <= before + 1
