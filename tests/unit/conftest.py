"""Fixtures shared by the unit tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from napllm.schema import JschonValidator, default_validator, set_default_validator


@pytest.fixture
def page_validator() -> Iterator[None]:
    """The page's schema validator (jschon, as in Pyodide) for the test's duration."""
    before = default_validator()
    set_default_validator(JschonValidator())
    try:
        yield
    finally:
        set_default_validator(before)
