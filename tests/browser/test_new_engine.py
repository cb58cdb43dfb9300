"""Adding an engine takes its spec, its worker and one registry entry (docs/design.md).

A temporary copy of the repository gets a throwaway `echo` engine: a spec
(`providers/engine_echo.py`) and a worker (`web/engines/echo-worker.js`),
both written here, and its entry in `providers.engine_specs.ENGINE_SPECS`;
no other file changes. The copy's own build then serves a shell that lists
the kind in the connection form, offers the connection's files for offline
use (kept in the cache the spec declares, shown in the storage panel under
the spec's words), tells the service worker the spec's rules, and answers a
generation through the shell with the worker's echo.

The copy's build starts from a copy of this checkout's built dist/ and
build cache, and this checkout's node_modules, so only what the new engine
changes is built again.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from flaky_host import FlakyHost, HostedFile
from test_downloads import BOOT_TIMEOUT_MS, STEP_TIMEOUT_MS, add_connection, boot_shell, chat_hello

ROOT = Path(__file__).resolve().parents[2]

ECHO_SPEC = '''"""A throwaway engine for a test: every answer is the last user text, echoed."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..lmsp import LmspRequest
from ..records import Capabilities, Connection
from .chat_request import lmsp_to_chat
from .chat_stream import ChatStreamToLmsp
from .engine import SpecDefaults


class EchoSpec(SpecDefaults):
    """The `echo` engine."""

    kind = "echo"
    form: Mapping[str, Any] = {"label": "Echo engine", "summary": "Echoes the last message."}
    route = "This browser (echo engine) on this device"
    page: Mapping[str, Any] = {
        "kind": "echo",
        "worker": "engines/echo-worker.js",
        "report": "environment",
        "offline": "engines/offline-worker.js",
        "caches": {"echo-cache": {"label": "Echo", "entry": "file"}},
        "weights": [{"suffix": ".echo", "limit": 1024}],
    }
    report_before_chat = False

    def read_device(self, report: object) -> None:
        return None

    def built_in(self, device: object) -> list[Connection]:
        return []

    def capabilities(self, model: str, settings: Mapping[str, Any], device: object) -> Capabilities:
        return Capabilities(images=False, json_output=False, tools=False, tool_choice_modes=())

    def unavailable_reason(self, model: str, device: object) -> str | None:
        return None

    def blocker(self, model: str, device: object) -> str | None:
        return None

    def load_call(self, connection: Connection, device: object) -> tuple[str, dict[str, Any]]:
        return connection.model, {"model": connection.model}

    def chat_body(self, request: LmspRequest) -> dict[str, Any]:
        return lmsp_to_chat(request, response_format_style="json_object", stream=True)

    def chunk_mapping(self, request: LmspRequest, body: Mapping[str, Any]) -> ChatStreamToLmsp:
        return ChatStreamToLmsp()


ECHO = EchoSpec()
'''

ECHO_WORKER = """// A throwaway engine's worker for a test: echoes the last user text.
const text = (content) => typeof content === "string" ? content
  : Array.isArray(content) ? content.map((part) => part.text || "").join("") : "";
self.onmessage = ({ data }) => {
  if (data.op === "load") self.postMessage({ op: "loaded", key: data.key, info: { ok: true } });
  if (data.op === "files") {
    const url = new URL("_echo/model.echo", data.base).href;
    self.postMessage({ op: "files", ok: true, files: [{ url, store: "echo-cache" }] });
  }
  if (data.op === "chat") {
    const users = data.body.messages.filter((m) => m.role === "user");
    const said = text(users[users.length - 1].content);
    const chunk = (delta, finish) => JSON.stringify({ id: "e", object: "chat.completion.chunk",
      created: 0, model: "echo", choices: [{ index: 0, delta, finish_reason: finish }] });
    self.postMessage({ op: "end", id: data.id, kind: null,
      chunks: [chunk({ role: "assistant", content: `Echo: ${said}` }, null), chunk({}, "stop")] });
  }
};
"""


def copy_checkout(target: Path) -> None:
    """The checkout's files (tracked and new, not ignored) and its built dist/.

    dist/ is copied, not linked: some build steps (Workbox, esbuild) write
    their files in place, which would change this checkout's dist/ through
    a hard link.
    """
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout.decode()
    for rel in filter(None, listed.split("\0")):
        source = ROOT / rel
        if source.is_file():
            (target / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / rel)
    shutil.copytree(ROOT / "dist", target / "dist")
    shutil.copytree(ROOT / "build", target / "build")
    (target / "node_modules").symlink_to(ROOT / "node_modules")


def changed_files(repo: Path) -> list[str]:
    """Sources of the copy `repo` that are new or differ from this checkout's.

    Only the copied sources count (build outputs, caches and an installed
    package's metadata in this checkout are not part of a change).
    """
    changed = []
    for top in ("runtime", "web", "tools"):
        for path in sorted((repo / top).rglob("*")):
            rel = path.relative_to(repo)
            if path.is_file() and "__pycache__" not in rel.parts:
                mine = ROOT / rel
                if not mine.is_file() or mine.read_bytes() != path.read_bytes():
                    changed.append(rel.as_posix())
    return changed


@pytest.fixture(scope="module")
def echo_dist(dist_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """dist/ of a copy of the repository with the echo engine added (module doc)."""
    repo = tmp_path_factory.mktemp("new-engine") / "repo"
    copy_checkout(repo)
    (repo / "runtime/napllm/providers/engine_echo.py").write_text(ECHO_SPEC)
    (repo / "web/engines/echo-worker.js").write_text(ECHO_WORKER)
    registry = repo / "runtime/napllm/providers/engine_specs.py"
    text = registry.read_text()
    entry = "ENGINE_SPECS: tuple[EngineSpec, ...] = (WASM, WEBLLM, ONNX)"
    assert entry in text
    registry.write_text(
        text.replace(
            entry, "from .engine_echo import ECHO  # noqa: E402\n" + entry[:-1] + ", ECHO)"
        )
    )
    assert changed_files(repo) == [
        "runtime/napllm/providers/engine_echo.py",
        "runtime/napllm/providers/engine_specs.py",
        "web/engines/echo-worker.js",
    ]  # the spec, the registry's one line, the worker
    subprocess.run([sys.executable, "build.py", "build"], cwd=repo, check=True, timeout=900)
    return repo / "dist"


def test_a_new_engine_is_its_spec_its_worker_and_one_registry_entry(
    browser: Any, echo_dist: Path
) -> None:
    host = FlakyHost(echo_dist)
    # The echo model's one file: within the declared ceiling (1024 bytes).
    host.files["/_echo/model.echo"] = HostedFile(body=bytes(range(256)) * 2)
    context = browser.new_context()
    context.set_default_timeout(STEP_TIMEOUT_MS)
    try:
        page = boot_shell(context, host)
        # Listed in the connection form, with the spec's words.
        page.click("#connection-add")
        option = page.locator("#connection-kind option[value='echo']")
        assert option.text_content() == "Echo engine"
        page.click("#connection-cancel")
        add_connection(page, "Echo model", "echo", "echo-1")
        entry = page.locator("li.connection", has_text="Echo model")
        assert "This browser (echo engine) on this device" in (entry.text_content() or "")

        # Offered for offline use: the worker's list, kept in the declared cache,
        # shown in the storage panel under the declared words.
        entry.locator("button.offline").click()
        entry.locator(".offline-control[data-stored='true']").wait_for(state="attached")
        model = host.url + "_echo/model.echo"
        kept = (
            "(u) => caches.open('echo-cache').then((c) => c.match(u))"
            ".then((r) => r ? r.arrayBuffer().then((b) => b.byteLength) : 0)"
        )
        assert page.evaluate(kept, model) == 512
        row = page.locator("#storage-models li.storage-model", has_text="(Echo)")
        row.wait_for(timeout=BOOT_TIMEOUT_MS)
        assert "Used by Echo model" in (row.locator(".storage-users").text_content() or "")

        # The service worker got the spec's rules from the build.
        build = (echo_dist / "sw-build.js").read_text()
        names = json.loads(re.search(r"NAPLLM_BUILD = (\{.*\});", build).group(1))  # type: ignore[union-attr]
        assert {"suffix": ".echo", "limit": 1024} in names["weights"]
        assert "engines/echo-worker.js" in (echo_dist / "sw.js").read_text()

        # A generation through the shell, answered by the echo worker.
        frame = chat_hello(page, "Echo model")
        assert frame.text_content("#status") == "Done."
        assert "Echo: Hello!" in (frame.text_content("#history li.assistant") or "")
    finally:
        context.close()
        host.stop()
