"""The package layout of docs/DESIGN.md, "Layout", read from the imports themselves.

Each package may import only the packages below it; nothing imports the command line; no private
name (``_x``) crosses a package boundary. Inside ``students`` and ``distill``, each room (a
subpackage, or one module) may import only the rooms below it, and every module lives in a room.
No module imports itself back through others: no circle, inside a package or across packages.
Imports inside functions, and those made for type checking alone, count like any other.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# package -> the project packages it may import (besides itself)
ALLOWED = {
    "common": set(),
    "configs": {"common"},
    "bytestream": {"configs", "common"},
    "logit_store": {"bytestream", "configs", "common"},
    "distill": {"logit_store", "bytestream", "configs", "common"},
    "students": {"distill", "logit_store", "bytestream", "configs", "common"},
    "bytedistill": {"students", "distill", "logit_store", "bytestream", "configs", "common"},
}


# room of a package -> the rooms of that package it may import (besides itself), lowest first
ROOMS = {
    "students.models": set(),
    "students.training": {"students.models"},
    "students.release": {"students.training", "students.models"},
    "students.serving": {"students.release", "students.models"},
    "distill.corpus": set(),
    "distill.conversion": set(),
    "distill.teacher": {"distill.conversion"},
    "distill.check_teacher": {"distill.teacher", "distill.conversion"},
    "distill.dump": {"distill.teacher", "distill.conversion", "distill.corpus"},
}
ROOMED = sorted({room.split(".")[0] for room in ROOMS})  # the packages whose modules all live in rooms


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


def test_students_read_a_teacher_through_distill_teacher_not_the_dumps_modules():
    """On-policy scoring reads text as the dump did through the teacher's reader
    (``distill.teacher.reader``), so no student module imports the dump's own modules."""
    dump = [
        f"{p.relative_to(ROOT)}: {m}"
        for p, m, names in imports_of("students")
        if m == "distill.dump" or m.startswith("distill.dump.") or (m == "distill" and "dump" in names)
    ]
    assert not dump, dump


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


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def room_imports() -> list[tuple[Path, str, str]]:
    """(file, its room, the room it imports) for every import of one room by another of its package."""
    found = []
    for path, module, names in (found_import for package in ROOMED for found_import in imports_of(package)):
        here = room_of(module_name(path))
        targets = [module] if room_of(module) else [f"{module}.{name}" for name in names]
        rooms = [room_of(t) for t in targets]
        found += [(path, here, r) for r in rooms if here and r and r != here and r.split(".")[0] == here.split(".")[0]]
    return found


def room_graph() -> dict[str, set[str]]:
    graph = {room: set() for room in ROOMS}
    for _, here, imported in room_imports():
        graph[here].add(imported)
    return graph


@pytest.mark.parametrize("package", ROOMED)
def test_every_module_of_a_roomed_package_is_in_a_room(package):
    loose = [
        str(p.relative_to(ROOT))
        for p in (ROOT / package).rglob("*.py")
        if module_name(p) != package and room_of(module_name(p)) is None
    ]
    missing = [
        room
        for room in ROOMS
        if not (ROOT / room.replace(".", "/") / "__init__.py").is_file()
        and not (ROOT / room.replace(".", "/")).with_suffix(".py").is_file()
    ]
    assert not loose and not missing, (loose, missing)


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
        if line.startswith(tuple(f"  - `{package}." for package in ROOMED)) and " imports: " in line:
            room, rest = line[5:].split("` imports: ", 1)
            drawn[room] = set(re.findall(r"`([\w.]+)`", rest.split(". ", 1)[0]))
    assert drawn == room_graph()


def module_graph() -> dict[str, set[str]]:
    """module -> the project modules it imports (``from a import b`` names the module ``a.b`` when
    there is one, else ``a``), for every module of every package."""
    graph = {}
    for package in ALLOWED:
        for path, module, names in imports_of(package):
            if module.split(".")[0] not in ALLOWED:
                continue
            targets = [f"{module}.{name}" for name in names if is_module(f"{module}.{name}")] or [module]
            graph.setdefault(module_name(path), set()).update(t for t in targets if t != module_name(path))
    return graph


def is_module(name: str) -> bool:
    path = ROOT / name.replace(".", "/")
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def circles() -> list[list[str]]:
    """The modules that import each other in a loop, each loop's modules sorted (Tarjan's strongly
    connected components of more than one module)."""
    graph = module_graph()
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in sorted(graph.get(module, ())):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = []
            while not component or component[-1] != module:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return sorted(found)


def test_no_module_imports_itself_back():
    """No circle of imports, inside a package or across packages (type-only imports count too)."""
    assert not circles(), circles()


# the shipped tokenizer file (a copy for exports, not a module of the library): what the library may take from it
SHIPPED_TOKENIZER = "bytestream.stream_tokenizer"
FROM_SHIPPED_TOKENIZER = {"ByteStreamTokenizer", "TEACHER_TOKENIZER_FILE", "auto_map", "__file__"}


def shipped_tokenizer_names(package: str) -> list[tuple[Path, str]]:
    """(file, name) for every name a module of ``package`` takes from the shipped tokenizer file:
    imported from it, or read off the module where the module itself is imported."""
    found = []
    for path in sorted((ROOT / package).rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        bound = set()  # the local names the module is bound to
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == SHIPPED_TOKENIZER:
                found += [(path, alias.name) for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == "bytestream":
                bound |= {alias.asname or alias.name for alias in node.names if alias.name == "stream_tokenizer"}
            elif isinstance(node, ast.Import):
                bound |= {alias.asname for alias in node.names if alias.name == SHIPPED_TOKENIZER and alias.asname}
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute):
                continue
            # ``shipped.X`` for a bound name, or ``bytestream.stream_tokenizer.X`` after a plain import
            of_module = isinstance(node.value, ast.Name) and node.value.id in bound
            if of_module or ast.unparse(node.value) == SHIPPED_TOKENIZER:
                found.append((path, node.attr))
    return found


@pytest.mark.parametrize("package", [*ALLOWED, "benchmarks"])
def test_only_the_tokenizer_class_is_taken_from_the_shipped_tokenizer(package):
    """What the library uses of the student's tokenizer lives in its own modules (teacher_tokens,
    stream_symbols, healing, stream_kind); the shipped file only copies them."""
    wrong = [
        f"{p.relative_to(ROOT)}: {name}"
        for p, name in shipped_tokenizer_names(package)
        if name not in FROM_SHIPPED_TOKENIZER
    ]
    assert not wrong, f"take only {sorted(FROM_SHIPPED_TOKENIZER)} from {SHIPPED_TOKENIZER}: {wrong}"


def test_the_checker_sees_a_name_taken_from_the_shipped_tokenizer(tmp_path, monkeypatch):
    """Each way of taking a name from the shipped file is seen, and a name beyond the class is caught."""
    monkeypatch.setattr("tests.test_layout.ROOT", tmp_path)
    (tmp_path / "students").mkdir()
    (tmp_path / "students/bad.py").write_text(
        "from bytestream.stream_tokenizer import STREAMS, ByteStreamTokenizer\n"
        "from bytestream import stream_tokenizer as shipped\n"
        "import bytestream.stream_tokenizer\n"
        "def f():\n"
        "    return shipped.HealingProcessor, bytestream.stream_tokenizer.stream_symbols, shipped.auto_map\n"
    )
    names = [name for _, name in shipped_tokenizer_names("students")]
    assert sorted(names) == ["ByteStreamTokenizer", "HealingProcessor", "STREAMS", "auto_map", "stream_symbols"]
    with pytest.raises(AssertionError, match="STREAMS.*HealingProcessor|HealingProcessor.*STREAMS"):
        test_only_the_tokenizer_class_is_taken_from_the_shipped_tokenizer("students")


def test_the_checker_sees_a_forbidden_import(tmp_path, monkeypatch):
    """A file that imports the router from the store is caught (the rule can fail)."""
    monkeypatch.setattr("tests.test_layout.ROOT", tmp_path)
    (tmp_path / "logit_store").mkdir()
    (tmp_path / "logit_store/bad.py").write_text(
        "def f():\n    from bytedistill.cli import main\n    from distill.conversion.converter import _x\n"
    )
    assert [m for _, m, _ in cross_package_imports("logit_store")] == [
        "bytedistill.cli",
        "distill.conversion.converter",
    ]
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


def test_the_checker_sees_a_circle_inside_a_package(tmp_path, monkeypatch):
    """Two modules of one room that import each other (one inside a function, one for type
    checking alone) are a circle, as is a loop through a third."""
    monkeypatch.setattr("tests.test_layout.ROOT", tmp_path)
    (tmp_path / "distill/conversion").mkdir(parents=True)
    (tmp_path / "distill/conversion/__init__.py").write_text("")
    (tmp_path / "distill/conversion/kernels.py").write_text("def f():\n    from distill.conversion import api\n")
    (tmp_path / "distill/conversion/api.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from distill.conversion.kernels import f\n"
    )
    (tmp_path / "logit_store").mkdir()
    for name, imported in [("a", "b"), ("b", "c"), ("c", "a")]:
        (tmp_path / f"logit_store/{name}.py").write_text(f"from logit_store.{imported} import x\n")
    assert circles() == [
        ["distill.conversion.api", "distill.conversion.kernels"],
        ["logit_store.a", "logit_store.b", "logit_store.c"],
    ]
    with pytest.raises(AssertionError, match="distill.conversion.kernels"):
        test_no_module_imports_itself_back()


def test_the_checker_sees_a_distill_room_importing_upwards(tmp_path, monkeypatch):
    """The conversion importing the dump's plan is caught; check_teacher, a room of one module, too."""
    monkeypatch.setattr("tests.test_layout.ROOT", tmp_path)
    (tmp_path / "distill/conversion").mkdir(parents=True)
    (tmp_path / "distill/conversion/bad.py").write_text("from distill.dump.plan import PlannedDocument\n")
    (tmp_path / "distill/teacher").mkdir()
    (tmp_path / "distill/teacher/bad.py").write_text("from distill import check_teacher\n")
    assert sorted((here, imported) for _, here, imported in room_imports()) == [
        ("distill.conversion", "distill.dump"),
        ("distill.teacher", "distill.check_teacher"),
    ]
    with pytest.raises(AssertionError, match="distill.dump"):
        test_a_room_imports_only_the_rooms_below_it()
