"""What depends on the machine: usable cores, thread counts and the locale's text encoding."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from napllm.lmsp_service.llama_load import available_cpus, default_threads

ROOT = Path(__file__).resolve().parents[2]


def affinity() -> int:
    return len(os.sched_getaffinity(0))


@pytest.mark.parametrize(
    ("cpu_max", "expected"),
    [
        ("max 100000\n", None),  # no quota: the affinity mask decides
        ("100000 100000\n", 1),
        ("50000 100000\n", 1),  # half a core still needs one thread
        ("150000 100000\n", 2),  # rounded up
        ("garbage\n", None),
        ("0 100000\n", None),
        ("", None),
    ],
)
def test_available_cpus_reads_the_cgroup_quota(
    tmp_path: Path, cpu_max: str, expected: int | None
) -> None:
    quota = tmp_path / "cpu.max"
    quota.write_text(cpu_max, encoding="ascii")
    want = affinity() if expected is None else min(affinity(), expected)
    assert available_cpus(quota) == want


def test_available_cpus_without_a_quota_file(tmp_path: Path) -> None:
    assert available_cpus(tmp_path / "missing") == affinity()


def test_default_threads_keep_llama_cpps_rule_on_the_usable_cores() -> None:
    assert default_threads(1) == (1, 1)
    assert default_threads(2) == (1, 2)
    assert default_threads(16) == (8, 16)
    assert default_threads(0) == (1, 1)


def _mode(node: ast.Call, position: int) -> str:
    """The `mode` of an `open` call (argument `position` or keyword), `"r"` by default."""
    value: ast.expr | None = node.args[position] if len(node.args) > position else None
    for keyword in node.keywords:
        if keyword.arg == "mode":
            value = keyword.value
    if value is None:
        return "r"
    return str(value.value) if isinstance(value, ast.Constant) else "?"


def _text_io_without_encoding(path: Path) -> list[str]:
    """Calls in `path` that read or write text in the locale's encoding."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or any(k.arg == "encoding" for k in node.keywords):
            continue
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in ("read_text", "write_text"):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno} {func.attr}")
        elif isinstance(func, ast.Name) and func.id == "open" and "b" not in _mode(node, 1):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno} open")
        elif (
            isinstance(func, ast.Attribute)
            and func.attr == "open"
            and not (isinstance(func.value, ast.Name) and func.value.id == "os")
            and "b" not in _mode(node, 0)
        ):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno} .open")
    return found


def test_product_code_names_the_encoding_of_every_text_file() -> None:
    """A machine whose locale is not UTF-8 reads and writes the same bytes as any other."""
    files = [ROOT / "build.py", *sorted((ROOT / "tools" / "buildsys").glob("*.py"))]
    files += sorted((ROOT / "runtime" / "napllm").rglob("*.py"))
    offenders = [hit for path in files for hit in _text_io_without_encoding(path)]
    assert offenders == []


def test_build_reads_napplet_cards_under_an_ascii_locale() -> None:
    """`build.py` under the POSIX locale with UTF-8 mode off (text I/O would be ASCII)."""
    env = {
        **os.environ,
        "LC_ALL": "POSIX",
        "LANG": "POSIX",
        "PYTHONUTF8": "0",
        "PYTHONCOERCECLOCALE": "0",
    }
    code = (
        "import locale, json, sys; sys.path.insert(0, '.'); import build;"
        "from buildsys.content import napplet_card;"
        "print(locale.getpreferredencoding(False));"
        "print(json.dumps([napplet_card(p.parent) for p in "
        "sorted(build.ROOT.glob('napplets/*/index.html'))], ensure_ascii=True))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    encoding, cards = done.stdout.splitlines()[:2]
    assert encoding.lower().replace("-", "") in {"ansi_x3.41968", "ascii", "usascii"}
    assert cards.startswith("[")


def test_every_python_dependency_is_pinned_in_the_lock() -> None:
    """`requirements/lock.txt` pins each package `pyproject.toml` names, and `build.py` uses it."""
    import re
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    wanted = list(project["dependencies"])
    for extra in ("test", "service", "cpython"):
        wanted += project["optional-dependencies"][extra]
    lock = (ROOT / "requirements" / "lock.txt").read_text(encoding="utf-8")
    pinned = {
        re.sub(r"[-_.]+", "-", m.group(1)).lower(): m.group(2)
        for m in re.finditer(r"(?m)^([A-Za-z0-9_.-]+)==(\S+)", lock)
    }
    for requirement in wanted:
        name = re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9_.-]+", requirement).group()).lower()
        assert name in pinned, f"{name} is not pinned in requirements/lock.txt"
    build = (ROOT / "tools" / "buildsys" / "installs.py").read_text(encoding="utf-8")
    assert '"-c", str(PYTHON_LOCK)' in build
