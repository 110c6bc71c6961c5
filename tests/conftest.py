"""Shared fixtures: repository paths and the shipped example."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))


@pytest.fixture
def example_doc() -> dict:
    """The shipped example as a plain document, for tests to break."""
    return yaml.safe_load((REPO / "examples" / "arithmetic.yaml").read_text())
