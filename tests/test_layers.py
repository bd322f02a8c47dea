"""The package's layers, read from its imports: no import runs back up, no cycle, and the
hook path's scheduling (``pacing/``) is state in objects, not in modules.

A folder names a role (README, "Layout"); each may import only from the layers below it, so
a reader can take the package bottom-up and a change low down is seen by what sits above."""

from __future__ import annotations

import ast
import collections
from pathlib import Path

import nriplugin

ROOT = Path(nriplugin.__file__).parent

# Lowest first; a package may import from a lower layer only (none from its own row but itself).
LAYERS: tuple[tuple[str, ...], ...] = (
    ("kernel", "obs", "pacing", "cri"),
    ("nri", "policy"),
    ("intent",),
    ("features",),
    ("node",),
    ("reconciler", "inventory", "netqos", "qos", "cluster"),
    ("agent",),
    ("cli",),
)
RANK = {pkg: i for i, row in enumerate(LAYERS) for pkg in row}


def modules() -> dict[str, ast.Module]:
    return {str(f.relative_to(ROOT)): ast.parse(f.read_text(), str(f)) for f in sorted(ROOT.rglob("*.py"))}


def imported(tree: ast.Module) -> set[str]:
    """The ``nriplugin.*`` modules a module imports (type-only imports too: a dependency all
    the same), as dotted names."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return {m for m in out if m.startswith("nriplugin.")}


def package_edges() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = collections.defaultdict(set)
    for path, tree in modules().items():
        parts = Path(path).parts
        if len(parts) < 2:
            continue  # nriplugin/__init__.py, __main__.py: the top
        for m in imported(tree):
            target = m.split(".")[1]
            if (ROOT / target).is_dir() and target != parts[0]:
                edges[parts[0]].add(target)
    return edges


def test_every_package_has_a_layer() -> None:
    packages = {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()}
    assert packages == set(RANK), "a package without a layer (or a layer without a package)"


def test_no_import_runs_back_up_or_sideways() -> None:
    wrong = sorted(f"{src} -> {dst}" for src, dsts in package_edges().items() for dst in dsts if RANK[dst] >= RANK[src])
    assert wrong == []


def test_no_import_cycle_between_modules() -> None:
    """Module by module (layers alone would allow a cycle within one package)."""
    graph: dict[str, set[str]] = {}
    names = {}
    for path in modules():
        dotted = "nriplugin." + path[:-3].replace("/", ".")
        names[dotted.removesuffix(".__init__")] = path
    for dotted, path in names.items():
        deps = imported(ast.parse((ROOT / path).read_text()))
        graph[dotted] = {d if d in names else d.rsplit(".", 1)[0] for d in deps} & set(names) - {dotted}
    # A package's __init__ re-exporting its modules is no cycle of meaning: skip edges into a
    # package from its own modules.
    for dotted in graph:
        graph[dotted] = {d for d in graph[dotted] if not dotted.startswith(d + ".")}
    state: dict[str, int] = {}
    cycle: list[str] = []

    def visit(n: str, stack: list[str]) -> bool:
        state[n] = 1
        for d in sorted(graph[n]):
            if state.get(d) == 1:
                cycle.extend([*stack[stack.index(d) :], d] if d in stack else [n, d])
                return True
            if d not in state and visit(d, [*stack, d]):
                return True
        state[n] = 2
        return False

    for n in sorted(graph):
        if n not in state and visit(n, [n]):
            break
    assert cycle == []


def test_the_hook_paths_scheduling_depends_on_nothing_of_the_agent() -> None:
    """``pacing/`` imports nothing of NRI or the node: the transport and the packages that do
    long work depend on it, not on each other, and none imports ``node/`` for it."""
    assert package_edges().get("pacing", set()) == set()
    assert not (ROOT / "node" / "turns.py").exists()


def test_no_module_keeps_state_in_globals_or_reaches_into_asyncio() -> None:
    """State is in objects that are handed to who shares it (no ``global``), and no private
    attribute of the event loop is touched."""
    found = []
    for path, tree in modules().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Global):
                found.append(f"{path}:{node.lineno}: global {', '.join(node.names)}")
            elif isinstance(node, ast.Attribute) and node.attr in ("_ready", "_process_events"):
                found.append(f"{path}:{node.lineno}: .{node.attr}")
    assert found == []


def test_the_version_is_pyprojects() -> None:
    import tomllib

    project = tomllib.loads((ROOT.parent / "pyproject.toml").read_text())["project"]
    assert nriplugin.__version__ == project["version"]
