"""The core and browser conformance suites run the same cases under the same names.

docs/conformance.md promises that tests/browser/test_conformance.py repeats
every conformance case of tests/unit/test_conformance_core.py in Pyodide.
These checks read both modules' source (nothing is imported or run) and
assert that promise: every `test_llm_c*` name of one suite exists in the
other (apart from the listed browser-only tests, which check the page's own
parts), every test that parametrizes over a table of
tests/conformance_cases.py does so in both suites, with the same argument
name, every table is used, and a test running a scenario of
tests/conformance_scenarios.py runs the same one in both suites.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import conformance_cases
import conformance_scenarios

TESTS = Path(__file__).resolve().parents[1]
CORE = TESTS / "unit" / "test_conformance_core.py"
BROWSER = TESTS / "browser" / "test_conformance.py"

#: Browser tests with no core counterpart: they check parts only the page has.
BROWSER_ONLY = {
    # the `window.napplet.llm` binding (web/prelude.js) over the same cases
    "test_llm_c01_binding_select_describe_generate",
    # the tab's LLM switch, which recreates the frame without the domain
    "test_llm_c08_llm_access_revoked_during_consent",
}


def _tests(path: Path) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {
        node.name: node
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.name.startswith("test_llm_c")
    }


def _tables(test: ast.FunctionDef | ast.AsyncFunctionDef) -> set[tuple[str, str]]:
    """`(argument name, table name)` of each `parametrize` over `cases.TABLE`."""
    found = set()
    for decorator in test.decorator_list:
        is_call = isinstance(decorator, ast.Call)
        if not (is_call and ast.unparse(decorator.func).endswith("parametrize")):
            continue
        argnames, argvalues = decorator.args[0], decorator.args[1]
        for node in ast.walk(argvalues):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "cases"
            ):
                assert isinstance(argnames, ast.Constant), ast.unparse(decorator)
                found.add((str(argnames.value), node.attr))
    return found


def test_every_core_case_test_has_a_browser_test_of_the_same_name() -> None:
    core, browser = _tests(CORE), _tests(BROWSER)
    assert sorted(set(core) - set(browser)) == []
    assert sorted(set(browser) - set(core)) == sorted(BROWSER_ONLY)


def test_both_suites_parametrize_over_the_same_shared_tables() -> None:
    core, browser = _tests(CORE), _tests(BROWSER)
    core_tables = {name: _tables(test) for name, test in core.items()}
    browser_tables = {name: _tables(test) for name, test in browser.items() if name in core}
    assert browser_tables == core_tables
    used = {table for tables in core_tables.values() for _, table in tables}
    assert used == set(conformance_cases.TABLES)


def _scenarios(test: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    """The `sc.<scenario>` names a test hands to its driver."""
    return {
        node.attr
        for node in ast.walk(test)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "sc"
        and node.attr.startswith("llm_c")
    }


def test_shared_scenarios_run_in_both_suites_under_their_own_names() -> None:
    """A test that runs a scenario of tests/conformance_scenarios.py runs the one of
    its own name, the other suite's test of that name runs it too, and every
    scenario is run."""
    core, browser = _tests(CORE), _tests(BROWSER)
    core_runs = {name: _scenarios(test) for name, test in core.items()}
    browser_runs = {name: _scenarios(test) for name, test in browser.items() if name in core}
    assert browser_runs == core_runs
    for name, runs in core_runs.items():
        assert runs in (set(), {name.removeprefix("test_")}), (name, runs)
    defined = {name for name in vars(conformance_scenarios) if name.startswith("llm_c")}
    assert {s for runs in core_runs.values() for s in runs} == defined


def test_every_table_is_named_and_non_empty() -> None:
    for name, table in conformance_cases.TABLES.items():
        assert getattr(conformance_cases, name) is table
        assert len(table) > 0, name
        if isinstance(table, dict):
            assert all(isinstance(case, str) and case for case in table), name


def test_shared_tables_are_the_only_case_tables() -> None:
    """Neither suite keeps a module-level table of its own (a non-empty literal)."""
    literals = ast.Dict | ast.List | ast.Tuple
    for path in (CORE, BROWSER):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        local = [
            ast.unparse(node.targets[0] if isinstance(node, ast.Assign) else node.target)
            for node in tree.body
            if isinstance(node, ast.Assign | ast.AnnAssign)
            and isinstance(node.value, literals)
            and (node.value.keys if isinstance(node.value, ast.Dict) else node.value.elts)
        ]
        assert local == [], (path.name, local)


DOC = TESTS.parent / "docs" / "conformance.md"
#: Short names docs/conformance.md uses for test files.
DOC_PREFIXES = {
    "core": CORE,
    "browser": BROWSER,
    "shell": TESTS / "unit" / "test_shell.py",
    "leaks": TESTS / "unit" / "test_leaks.py",
}


def _cited() -> list[tuple[Path, str]]:
    """Every `file::test_name` docs/conformance.md cites, as (file, name)."""
    text = DOC.read_text(encoding="utf-8")
    cited: list[tuple[Path, str]] = []
    for where, name in re.findall(r"`([\w/.]+)::(test_\w+)(?![\w.])", text):
        if where in DOC_PREFIXES:
            path = DOC_PREFIXES[where]
        elif where.startswith("tests/"):
            path = TESTS.parent / where
        else:
            path = TESTS / "unit" / where
        cited.append((path, name))
    return cited


def test_conformance_doc_cites_only_tests_that_exist() -> None:
    defined: dict[Path, set[str]] = {}
    missing = []
    for path, name in _cited():
        if path not in defined:
            tree = ast.parse(path.read_text(encoding="utf-8")) if path.is_file() else None
            defined[path] = {
                node.name
                for node in (tree.body if tree else [])
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            }
        if name not in defined[path]:
            missing.append(f"{path.relative_to(TESTS.parent)}::{name}")
    assert sorted(set(missing)) == []
