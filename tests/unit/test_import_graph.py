"""The import graph of the whole repository's code -- the library (experiments included), the
benchmarks and the scripts: no cycle anywhere (function-level imports included), no import that
points up a floor (``FLOORS``: every room of the house on its floor; an import goes to a lower one),
and no private name imported across packages. Read from the source with ``ast`` (nothing is
imported, so optional dependencies do not matter), which sees the imports that lazy loading hides
from a run."""
import ast
from pathlib import Path
from typing import Dict, List, Set

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "sparsenorm"
PACKAGES = (PACKAGE, PACKAGE.parent / "benchmarks", PACKAGE.parent / "scripts")
SCRIPT_FOLDERS = ("scripts",)  # plain folders (no __init__): a script imports a sibling by its bare name


def _modules() -> Dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` under the packages (``pkg/__init__.py`` is ``pkg``)."""
    found = {}
    for package in PACKAGES:
        for path in sorted(package.rglob("*.py")):
            parts = list(path.relative_to(package.parent).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


MODULES = _modules()


def _type_checking_only(node: ast.AST, parents: Dict[ast.AST, ast.AST]) -> bool:
    """Inside ``if TYPE_CHECKING:`` (never run, so no edge of the runtime graph)."""
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return True
    return False


def _imports(module: str) -> List[ast.ImportFrom | ast.Import]:
    path = MODULES[module]
    tree = ast.parse(path.read_text(), str(path))
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    return [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
            and not _type_checking_only(n, parents)]


def _package_of(module: str) -> List[str]:
    parts = module.split(".")
    return parts if MODULES[module].name == "__init__.py" else parts[:-1]


def _source(module: str, node: ast.ImportFrom) -> str:
    """The absolute name ``from <it> import ...`` reads from."""
    if not node.level:
        return node.module or ""
    package = _package_of(module)
    base = package[:len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _known(name: str, importer: str = "") -> str:
    """The longest prefix of ``name`` that is a module of the package ('' if none); a script's bare
    import of a sibling script (``from gpu_check import ...``, the folder on ``sys.path``) is that script."""
    folder = importer.partition(".")[0]
    if folder in SCRIPT_FOLDERS and f"{folder}.{name.partition('.')[0]}" in MODULES:
        name = f"{folder}.{name}"
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name


def import_edges(module: str) -> Set[str]:
    """The package's modules that ``module`` imports, at any level of its code (``from pkg import sub``
    is an edge to ``pkg.sub``; ``from mod import name`` to ``mod``)."""
    edges = set()
    for node in _imports(module):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            source = _source(module, node)
            targets = [f"{source}.{alias.name}" if f"{source}.{alias.name}" in MODULES else source
                       for alias in node.names]
        edges.update(t for t in (_known(target, module) for target in targets) if t and t != module)
    return edges


def find_cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    cycles: List[List[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def test_the_graph_is_read():
    graph = {m: import_edges(m) for m in MODULES}
    assert len(MODULES) > 50
    # edges the graph must show, lazy and relative imports among them
    assert "sparsenorm.registry" in graph["sparsenorm.experiments.evsoftmax_vqvae.train"]
    assert "sparsenorm.experiments._shared.runner" in graph["sparsenorm.experiments"]  # inside run()
    assert "sparsenorm.losses.rsoftmax" in graph["sparsenorm.registry"]  # from .losses import rsoftmax as r_losses
    assert "benchmarks.gpu_timing" in graph["benchmarks.bench_gpu_training"]  # the benchmarks are read too


def test_the_cycle_finder_finds_a_cycle_through_a_function_level_import():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycles(graph) == [["a", "b", "c"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_in_the_package():
    graph = {m: import_edges(m) for m in MODULES}
    assert find_cycles(graph) == []


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_private_name_is_imported_from_another_package(module):
    """``from x import _name`` only within x's own package (a private name is its package's business)."""
    own = ".".join(_package_of(module))
    for node in _imports(module):
        if not isinstance(node, ast.ImportFrom):
            continue
        source = _source(module, node)
        source_package = source if MODULES.get(source, Path()).name == "__init__.py" else source.rpartition(".")[0]
        for alias in node.names:
            private = alias.name.startswith("_") and not alias.name.startswith("__")
            assert not (private and source.startswith("sparsenorm") and source_package != own), (
                f"{module} imports the private {alias.name} from {source}")


def test_the_shared_experiment_code_imports_no_experiment():
    """``experiments/_shared`` is below the experiments: it imports neither the experiments package
    (``load``) nor any experiment's modules (issue 40)."""
    shared = [m for m in MODULES if m.startswith("sparsenorm.experiments._shared")]
    assert shared
    upward = {m: sorted(e for e in import_edges(m) if e.startswith("sparsenorm.experiments")
                        and not e.startswith("sparsenorm.experiments._shared")) for m in shared}
    assert {m: e for m, e in upward.items() if e} == {}


def room(module: str) -> str:
    """The room a module lives in: a kernels subpackage or top-level kernels module, the attention
    and losses packages, the shared experiment code, the experiments, the benchmarks, the scripts;
    else the module itself."""
    parts = module.split(".")
    if parts[0] in ("benchmarks", "scripts"):
        return parts[0]
    if parts[:2] == ["sparsenorm", "kernels"] and len(parts) > 2:
        return ".".join(parts[:3])
    if parts[:3] == ["sparsenorm", "experiments", "_shared"]:
        return "sparsenorm.experiments._shared"
    if parts[:2] in (["sparsenorm", "experiments"], ["sparsenorm", "attention"], ["sparsenorm", "losses"]):
        return ".".join(parts[:2])
    return module


# The house, floor by floor (0 = the ground): a room imports only rooms on lower floors. A new room
# (a new module at the library's top level, a new kernels file) must be given its floor here.
FLOORS = {
    0: ("sparsenorm._cache", "sparsenorm._text", "sparsenorm._validation", "sparsenorm.kernels.cuda_record",
        "sparsenorm.kernels.tiles"),
    1: ("sparsenorm.kernels.cuda_proof", "sparsenorm.kernels.reference", "sparsenorm.kernels.triton",
        "sparsenorm.marginalize", "sparsenorm.softmax"),
    2: ("sparsenorm.kernels.policy",),
    3: ("sparsenorm.kernels.cpu",),
    4: ("sparsenorm.kernels.auto_plan",),
    5: ("sparsenorm.kernels", "sparsenorm.kernels.ops"),
    6: ("sparsenorm.entmax", "sparsenorm.evidential", "sparsenorm.hourglass", "sparsenorm.rsoftmax",
        "sparsenorm.kernels.attention"),
    7: ("sparsenorm.losses",),
    8: ("sparsenorm.registry",),
    9: ("sparsenorm.attention", "sparsenorm.demo", "sparsenorm.experiments._shared", "sparsenorm.linear_loss"),
    10: ("sparsenorm", "sparsenorm.hf"),
    11: ("benchmarks", "sparsenorm.experiments"),
    12: ("sparsenorm.cli", "scripts"),  # the scripts use the experiments' data and models
}
FLOOR_OF = {r: floor for floor, rooms in FLOORS.items() for r in rooms}


def test_every_room_has_a_floor():
    assert sorted({room(m) for m in MODULES} - set(FLOOR_OF)) == []
    assert sorted(set(FLOOR_OF) - {room(m) for m in MODULES}) == []  # no floor kept for a room that is gone


def test_the_scripts_are_read():
    graph = {m: import_edges(m) for m in MODULES}
    assert "scripts.gpu_check" in graph["scripts.gpu_record"]  # a bare sibling import
    assert "sparsenorm.kernels.cuda_proof" in graph["scripts.gpu_record"]


def test_no_import_points_up():
    upward = sorted(f"{m} (floor {FLOOR_OF[room(m)]}) -> {e} (floor {FLOOR_OF[room(e)]})"
                    for m in MODULES for e in import_edges(m)
                    if room(m) != room(e) and FLOOR_OF.get(room(e), -1) >= FLOOR_OF.get(room(m), -1))
    assert upward == []


def test_the_floor_checker_finds_an_upward_import():
    assert room("sparsenorm.kernels.ops.evidential") == "sparsenorm.kernels.ops"
    assert FLOOR_OF[room("sparsenorm.kernels.policy")] < FLOOR_OF[room("sparsenorm.kernels.ops._common")]
    # ops/_common imported triton_launchers, which auto_plan (below the ops) needed: that edge pointed up
    assert FLOOR_OF["sparsenorm.kernels.auto_plan"] < FLOOR_OF["sparsenorm.kernels.ops"]
