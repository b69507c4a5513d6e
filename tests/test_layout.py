"""The package layout of docs/DESIGN.md, "Layout", read from the imports themselves.

Each package may import only the packages below it; nothing imports the command line; no private
name (``_x``) crosses a package boundary. Inside ``students``, each room (subpackage) may import only
the rooms below it, and every module lives in a room. Imports inside functions count like any other.
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


# room of students -> the rooms it may import (besides itself)
ROOMS = {
    "students.models": set(),
    "students.training": {"students.models"},
    "students.release": {"students.training", "students.models"},
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


def room_of(module: str) -> str | None:
    return next((room for room in ROOMS if module == room or module.startswith(room + ".")), None)


def room_imports() -> list[tuple[Path, str, str]]:
    """(file, its room, the room it imports) for every import of one room of ``students`` by another."""
    found = []
    for path, module, names in imports_of("students"):
        here = room_of(".".join(path.relative_to(ROOT).with_suffix("").parts))
        targets = [module] if room_of(module) else [f"{module}.{name}" for name in names]
        found += [(path, here, room_of(t)) for t in targets if room_of(t) and room_of(t) != here]
    return found


def room_graph() -> dict[str, set[str]]:
    graph = {room: set() for room in ROOMS}
    for _, here, imported in room_imports():
        graph[here].add(imported)
    return graph


def test_every_module_of_students_is_in_a_room():
    loose = [str(p.relative_to(ROOT)) for p in (ROOT / "students").glob("*.py") if p.name != "__init__.py"]
    assert not loose and all((ROOT / room.replace(".", "/") / "__init__.py").is_file() for room in ROOMS), loose


def test_a_room_imports_only_the_rooms_below_it():
    order = list(ROOMS)
    assert all(order.index(below) < order.index(room) for room, allowed in ROOMS.items() for below in allowed)
    wrong = [
        f"{p.relative_to(ROOT)}: {imported}" for p, here, imported in room_imports() if imported not in ROOMS[here]
    ]
    assert not wrong, wrong


def test_the_rooms_are_the_ones_the_design_draws():
    design = (ROOT / "docs/DESIGN.md").read_text()
    section = design.split("## Layout", 1)[1].split("\n## ", 1)[0]
    drawn = {}
    for line in section.splitlines():
        if line.startswith("  - `students.") and " imports: " in line:
            room, rest = line[5:].split("` imports: ", 1)
            drawn[room] = set(re.findall(r"`([\w.]+)`", rest.split(". ", 1)[0]))
    assert drawn == room_graph()


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


def test_the_checker_sees_a_room_importing_upwards(tmp_path, monkeypatch):
    """A model that imports the release room is caught, in either import form."""
    monkeypatch.setattr("tests.test_layout.ROOT", tmp_path)
    (tmp_path / "students/models").mkdir(parents=True)
    (tmp_path / "students/models/bad.py").write_text(
        "from students.release.export import export_student\nfrom students.training import trainer\n"
    )
    assert [(here, imported) for _, here, imported in room_imports()] == [
        ("students.models", "students.release"),
        ("students.models", "students.training"),
    ]
    with pytest.raises(AssertionError, match="students.release"):
        test_a_room_imports_only_the_rooms_below_it()
