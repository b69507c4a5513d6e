"""The inner loop's list of slow tests (tests/conftest.py) names tests that exist, so that a rename
does not silently put a slow test back into ``pytest -m "not slow"``."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import INNER_LOOP_SKIPS

ROOT = Path(__file__).resolve().parents[1]


def test_every_listed_test_exists():
    missing = []
    for node in INNER_LOOP_SKIPS:
        path, name = node.split("::")
        tree = ast.parse((ROOT / path).read_text())
        if not any(isinstance(n, ast.FunctionDef) and n.name == name for n in tree.body):
            missing.append(node)
    assert missing == []
