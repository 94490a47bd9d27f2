"""The shape of the code, checked: no import circle among the project's modules, no class in
the edge's round loop over ~150 lines (shared/DESIGN.md, "The round loop, next step"), no
class name defined twice (one name, one idea), and no file over 450 lines (one job each).

The import graph is read from the source with `ast` (nothing is imported): every `import` and
`from ... import` counts, at module level, inside functions and under `if TYPE_CHECKING:` alike
(a deferred or type-only import is still a circle in the design, only hidden from the
interpreter). Importing `a.b.c` also runs the packages `a` and `a.b`, so those count too,
except a module's own enclosing packages (a package may re-export its submodules).
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit  # fast: no process or server started (pyproject.toml)

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("tandem", "edge", "cloud", "sim", "bench", "models")

# Circles known today, each entry naming its modules (sorted); none since make_backend moved
# beside the implementations (cloud/runtime/factory.py). A new circle fails the test.
KNOWN_CIRCLES: set[tuple[str, ...]] = set()

# The round loop and its controller: these modules and packages, every class in them.
ROUND_LOOP = ("edge/generation.py", "edge/state.py", "edge/caps.py", "edge/fast_mode.py",
              "edge/rounds", "edge/record.py", "edge/client.py",
              # the one controller that plans each round, and its cost model
              "edge/control/adaptive.py", "edge/control/costs.py", "edge/control/options.py",
              "edge/control/pass_cap.py")
MAX_CLASS_LINES = 150


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            found[_module_name(path)] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules `name` imports (directly or as an enclosing package)."""
    is_package = path.name == "__init__.py"
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = name.split(".") if is_package else name.split(".")[:-1]
                package = package[:len(package) - node.level + 1]
                base = ".".join(package + ([base] if base else []))
            targets.add(base)
            targets.update(f"{base}.{alias.name}" for alias in node.names)
    own = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
    found: set[str] = set()
    for target in targets:
        parts = target.split(".")
        for i in range(1, len(parts) + 1):
            prefix = ".".join(parts[:i])
            if prefix in modules and prefix not in own and prefix != name:
                found.add(prefix)
    return found


def _circles(graph: dict[str, set[str]]) -> list[tuple[str, ...]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[tuple[str, ...]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(tuple(sorted(component)))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def test_no_import_circle():
    circles = set(_circles(import_graph()))
    new = sorted(circles - KNOWN_CIRCLES)
    assert not new, f"import circles: {new}"
    gone = sorted(KNOWN_CIRCLES - circles)
    assert not gone, f"gone, delete from KNOWN_CIRCLES: {gone}"


# The layers: the product (tandem/ shared, edge/, cloud/, models/) below the simulation (sim/),
# the measurements (bench/) on top, a leaf nothing imports.
LOWER = {"sim": ("tandem", "edge", "cloud", "models"), "bench": ("tandem", "edge", "cloud", "models", "sim")}


def test_bench_is_a_leaf_and_sim_is_above_the_product():
    upward = []
    for name, imported in import_graph().items():
        for layer, below in LOWER.items():
            if name.split(".")[0] in below:
                upward += [f"{name} -> {target}" for target in imported if target.split(".")[0] == layer]
    assert not upward, upward


def test_the_circle_finder_finds_a_circle():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [("a", "b", "c")]


def test_no_class_in_the_round_loop_over_150_lines():
    too_long = []
    for entry in ROUND_LOOP:
        path = ROOT / entry
        for file in sorted(path.rglob("*.py")) if path.is_dir() else [path]:
            for node in ast.walk(ast.parse(file.read_text(), str(file))):
                if isinstance(node, ast.ClassDef):
                    lines = node.end_lineno - node.lineno + 1
                    if lines > MAX_CLASS_LINES:
                        too_long.append(f"{file.relative_to(ROOT)}:{node.name} ({lines} lines)")
    assert not too_long, too_long


# Where a class name must mean one thing: the generated wire stubs (tandem/v1) are not ours.
NAMED_ONCE = ("edge", "cloud", "sim", "bench", "tandem", "models")
GENERATED = ("tandem/v1",)


def _nodes(root: Path, skip: tuple[str, ...]):
    """(relative path, node) for every AST node of the project's own sources but `skip`."""
    for package in NAMED_ONCE:
        for file in sorted((root / package).rglob("*.py")):
            relative = file.relative_to(root).as_posix()
            if not relative.startswith(skip):
                yield from ((relative, node) for node in ast.walk(ast.parse(file.read_text(), str(file))))


def class_twins(root: Path = ROOT) -> dict[str, list[str]]:
    """Class names defined in more than one place, each with its places (path:line)."""
    places: dict[str, list[str]] = {}
    for relative, node in _nodes(root, GENERATED):
        if isinstance(node, ast.ClassDef):
            places.setdefault(node.name, []).append(f"{relative}:{node.lineno}")
    return {name: where for name, where in places.items() if len(where) > 1}


def test_no_class_name_is_defined_twice():
    assert not class_twins(), class_twins()


def test_the_twin_finder_finds_a_twin(tmp_path):
    for path, source in (("edge/a.py", "class Row:\n    pass\n"),
                         ("bench/b.py", "def f():\n    class Row:\n        pass\n"),
                         ("tandem/v1/c.py", "class Only:\n    pass\n"),
                         ("tandem/d.py", "class Only:\n    pass\n")):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(source)
    assert class_twins(tmp_path) == {"Row": ["edge/a.py:1", "bench/b.py:2"]}


# One job per file: none over MAX_FILE_LINES but the schema-only modules (field after field of
# typed config or API shapes, which only grow with what they describe).
SIZED = ("edge", "cloud", "sim", "bench")
MAX_FILE_LINES = 450
SCHEMA_ONLY = ("edge/daemon/openai_schema.py", "edge/config.py", "cloud/config.py")


def test_no_file_over_450_lines_but_the_schemas():
    too_long = []
    for package in SIZED:
        for file in sorted((ROOT / package).rglob("*.py")):
            relative = file.relative_to(ROOT).as_posix()
            lines = len(file.read_text().splitlines())
            if lines > MAX_FILE_LINES and relative not in SCHEMA_ONLY:
                too_long.append(f"{relative} ({lines} lines)")
    assert not too_long, too_long


# Every test file says its tier at module level, so `-m unit` and `-m e2e` between them run it.
TIERS = ("unit", "e2e")


def _module_tier(file: Path) -> str | None:
    for node in ast.parse(file.read_text(), str(file)).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "pytestmark" for t in node.targets):
            marks = node.value.elts if isinstance(node.value, (ast.List, ast.Tuple)) else [node.value]
            tiers = [mark.attr for mark in marks if isinstance(mark, ast.Attribute) and mark.attr in TIERS]
            return tiers[0] if tiers else None
    return None


def test_every_test_file_is_tiered():
    untiered = [file.relative_to(ROOT).as_posix() for file in sorted((ROOT / "tests").rglob("test_*.py"))
                if _module_tier(file) is None]
    assert not untiered, f"no module-level pytestmark = pytest.mark.unit or .e2e: {untiered}"


# Long functions hide several jobs; the training scripts (models/train) are one-off recipes.
MAX_FUNCTION_LINES = 80
FUNCTION_EXEMPT = ("models/train", "tandem/v1")


def long_functions(root: Path = ROOT) -> list[str]:
    return [f"{relative}:{node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for relative, node in _nodes(root, FUNCTION_EXEMPT)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]


def test_no_function_over_80_lines():
    assert not long_functions(), long_functions()


def test_no_private_name_is_imported_across_modules():
    """A leading underscore says "this module's own": another module that needs it needs a public
    name (the tests may reach in; the product may not)."""
    crossing = []
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and not name.startswith("tandem.v1"):
                crossing += [f"{name}: {node.module}.{alias.name}" for alias in node.names
                             if alias.name.startswith("_") and not alias.name.startswith("__")]
    assert not crossing, crossing
