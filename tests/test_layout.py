"""The package layout of docs/DESIGN.md, "Layout", read from the imports themselves.

Each package may import only the packages below it; nothing imports the command line; no private
name (``_x``) crosses a package boundary. Imports inside functions count like any other.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# package -> the project packages it may import (besides itself)
ALLOWED = {
    "configs": set(),
    "bytestream": {"configs"},
    "logit_store": {"bytestream", "configs"},
    "distill": {"logit_store", "bytestream", "configs"},
    "students": {"distill", "logit_store", "bytestream", "configs"},
    "bytedistill": {"students", "distill", "logit_store", "bytestream", "configs"},
}


def imports_of(package: str) -> list[tuple[Path, str, list[str]]]:
    """(file, imported module, imported names) for every import statement in ``package``."""
    found = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.append((path, node.module, [alias.name for alias in node.names]))
            elif isinstance(node, ast.Import):
                found += [(path, alias.name, []) for alias in node.names]
    return found


def cross_package_imports(package: str) -> list[tuple[Path, str, list[str]]]:
    return [(p, m, n) for p, m, n in imports_of(package) if m.split(".")[0] in ALLOWED and m.split(".")[0] != package]


def package_graph() -> dict[str, set[str]]:
    return {package: {m.split(".")[0] for _, m, _ in cross_package_imports(package)} for package in ALLOWED}


def test_the_allowed_graph_has_no_cycle():
    """The rule itself is a strict order, so that following it leaves no cycle."""
    order = list(ALLOWED)
    assert all(order.index(below) < order.index(package) for package, allowed in ALLOWED.items() for below in allowed)


@pytest.mark.parametrize("package", list(ALLOWED))
def test_a_package_imports_only_the_packages_below_it(package):
    wrong = [
        f"{p.relative_to(ROOT)}: {m}"
        for p, m, _ in cross_package_imports(package)
        if m.split(".")[0] not in ALLOWED[package]
    ]
    assert not wrong, f"{package} may import only {sorted(ALLOWED[package])}: {wrong}"


@pytest.mark.parametrize("package", list(ALLOWED))
def test_no_private_name_crosses_a_package_boundary(package):
    private = [
        f"{p.relative_to(ROOT)}: {m}.{name}"
        for p, m, names in cross_package_imports(package)
        for name in [*names, m.rsplit(".", 1)[-1]]
        if name.startswith("_") and not name.startswith("__")
    ]
    assert not private, private


def test_the_graph_is_the_one_the_design_draws():
    """docs/DESIGN.md lists the arrows; the code has exactly those (a new arrow is a design change)."""
    design = (ROOT / "docs/DESIGN.md").read_text()
    section = design.split("## Layout", 1)[1].split("\n## ", 1)[0]
    drawn = {}
    for line in section.splitlines():
        if line.startswith("- `") and " imports: " in line:
            package, rest = line[3:].split("` imports: ", 1)
            drawn[package] = set(re.findall(r"`(\w+)`", rest.split(".", 1)[0]))
    assert drawn == package_graph()


def test_the_checker_sees_a_forbidden_import(tmp_path, monkeypatch):
    """A file that imports the router from the store is caught (the rule can fail)."""
    monkeypatch.setattr("tests.test_layout.ROOT", tmp_path)
    (tmp_path / "logit_store").mkdir()
    (tmp_path / "logit_store/bad.py").write_text(
        "def f():\n    from bytedistill.cli import main\n    from distill.convert import _x\n"
    )
    assert [m for _, m, _ in cross_package_imports("logit_store")] == ["bytedistill.cli", "distill.convert"]
    with pytest.raises(AssertionError, match="bytedistill.cli"):
        test_a_package_imports_only_the_packages_below_it("logit_store")
    with pytest.raises(AssertionError, match="_x"):
        test_no_private_name_crosses_a_package_boundary("logit_store")
