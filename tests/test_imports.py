"""The package's import graph has no cycles, and ``import memwal_datasource`` stays light.

The graph is read from the source with :mod:`ast`: every import statement of a
module, at module level or inside a function, is an edge (an import inside a
function only delays a cycle, it does not remove one). ``from . import x`` is
an edge to the submodule ``x`` when there is one, else to the package's
``__init__``; ``from .x import y`` likewise to ``x.y`` or ``x``. Importing
``a.b.c`` also runs the ``__init__`` of ``a`` and ``a.b``, unless those are
packages the importing module itself lives in (they are being initialised
already), so those are edges too; naming a name of a package the module lives
in (``from .. import name``) is an edge to that package's ``__init__``.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

import memwal_datasource

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("memwal_datasource", "benchmarks")

# Cycles tolerated while a branch removes them (each as the test names it): none now.
KNOWN_ELSEWHERE: frozenset[tuple[str, ...]] = frozenset()


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_modules() -> dict[str, Path]:
    """``{dotted name: path}`` of every module of the packages under test."""
    out = {}
    for pkg in PACKAGES:
        if (ROOT / pkg / "__init__.py").exists():
            for path in sorted((ROOT / pkg).rglob("*.py")):
                out[module_name(path)] = path
    return out


def _resolve(importer: str, is_package: bool, level: int, module: str | None) -> str:
    """The absolute dotted name a (possibly relative) ``from`` import refers to."""
    if not level:
        return module or ""
    base = importer.split(".")
    if not is_package:
        base = base[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join(base + ([module] if module else []))


def imported(importer: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package modules ``importer`` imports anywhere in its source."""
    is_package = path.name == "__init__.py"
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(importer, is_package, node.level, node.module)
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                names.add(sub if sub in modules else target)
    # Packages the importer lives in are initialising already when it runs: importing
    # one of its modules does not run their __init__ again (naming one does: above).
    ancestors = {".".join(importer.split(".")[:i]) for i in range(1, importer.count(".") + 1)}
    edges = {name for name in names if name in modules}
    for name in names:
        parts = name.split(".")
        edges.update(p for p in (".".join(parts[:i]) for i in range(1, len(parts)))
                     if p in modules and p not in ancestors)
    edges.discard(importer)
    return edges


def import_graph() -> dict[str, set[str]]:
    """``{module: modules it imports}`` over every module of :data:`PACKAGES`."""
    modules = package_modules()
    graph = {name: imported(name, path, modules) for name, path in modules.items()}
    # The package's public names are imported on first use through its _LAZY table.
    lazy = memwal_datasource._LAZY.values()
    graph["memwal_datasource"] |= {f"memwal_datasource.{m}" for m in lazy}
    return graph


def components(graph: dict[str, set[str]]) -> dict[str, int]:
    """``{module: number of its strongly connected component}`` (Kosaraju, iterative)."""
    order, seen = [], set()
    for root in sorted(graph):
        if root in seen:
            continue
        seen.add(root)
        stack = [(root, iter(sorted(graph[root])))]
        while stack:
            node, todo = stack[-1]
            nxt = next((n for n in todo if n not in seen), None)
            if nxt is None:
                order.append(node)
                stack.pop()
            else:
                seen.add(nxt)
                stack.append((nxt, iter(sorted(graph[nxt]))))
    reverse: dict[str, set[str]] = {n: set() for n in graph}
    for node, targets in graph.items():
        for t in targets:
            reverse[t].add(node)
    comp: dict[str, int] = {}
    for root in reversed(order):
        if root in comp:
            continue
        comp[root] = root_id = len(comp)
        stack = [root]
        while stack:
            for prev in reverse[stack.pop()]:
                if prev not in comp:
                    comp[prev] = root_id
                    stack.append(prev)
    return comp


def simple_cycles(graph: dict[str, set[str]]) -> list[tuple[str, ...]]:
    """Every simple cycle, each starting at its smallest module.

    Searched inside strongly connected components only (every cycle lies in
    one), which keeps this quick on an acyclic graph of any size.
    """
    comp = components(graph)
    cycles = []
    for start in sorted(graph):
        stack = [(start, [start])]
        while stack:
            node, path = stack.pop()
            for nxt in sorted(graph[node]):
                if nxt == start:
                    cycles.append(tuple(path))
                elif nxt > start and nxt not in path and comp[nxt] == comp[start]:
                    stack.append((nxt, [*path, nxt]))
    return cycles


def show(cycle: tuple[str, ...]) -> str:
    return " -> ".join([*cycle, cycle[0]])


def test_graph_sees_relative_package_and_function_level_imports():
    graph = import_graph()
    # module level: ``from .writer_base import ...`` and ``from . import hooks`` (a module)
    assert {"memwal_datasource.shard.writer_base", "memwal_datasource.hooks"} <= graph[
        "memwal_datasource.shard.writer"]
    # inside a function: the CLI's compact command imports compaction when it runs
    assert "memwal_datasource.maintenance.compact" in graph["memwal_datasource.cli.maintain"]
    # ``from ..x import y`` in a subpackage resolves to the top-level module
    assert "memwal_datasource.errors" in graph["memwal_datasource.cli.errors"]
    # importing a module of another package runs that package's __init__
    assert "memwal_datasource.spark" in graph["memwal_datasource.cli.options_cmd"]
    # the package's lazy public names (PEP 562 ``__getattr__``)
    assert {"memwal_datasource.memwal_table", "memwal_datasource.spark"} <= graph[
        "memwal_datasource"]


def test_graph_resolves_from_imports(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    modules = {"pkg": pkg / "__init__.py", "pkg.a": pkg / "a.py", "pkg.sub": pkg / "sub"
               / "__init__.py", "pkg.sub.b": pkg / "sub" / "b.py"}
    sources = {"pkg": "", "pkg.a": "from . import sub\nfrom .sub import b, name\n",
               "pkg.sub": "", "pkg.sub.b": "def f():\n    from .. import a, name\n"}
    for name, path in modules.items():
        path.write_text(sources[name])
    # ``from . import sub``: the subpackage; ``from .sub import b``: the module b
    # (and sub's __init__); ``from .sub import name``: sub's __init__
    assert imported("pkg.a", modules["pkg.a"], modules) == {"pkg.sub", "pkg.sub.b"}
    # ``from .. import a, name`` in a function: module a and, explicitly, pkg's __init__
    assert imported("pkg.sub.b", modules["pkg.sub.b"], modules) == {"pkg.a", "pkg"}


def test_cycle_finder_names_every_cycle():
    graph = {"a": {"b"}, "b": {"c", "a"}, "c": {"a", "d"}, "d": set()}
    assert sorted(simple_cycles(graph)) == [("a", "b"), ("a", "b", "c")]
    assert show(("a", "b", "c")) == "a -> b -> c -> a"


def test_no_import_cycles():
    new = [show(c) for c in simple_cycles(import_graph()) if c not in KNOWN_ELSEWHERE]
    assert not new, ("import cycle(s): move what both modules need below them, or the "
                     "caller above them:\n" + "\n".join(new))


def test_known_cycles_are_still_there():
    """Like a strict xfail: once a branch removes a known cycle, drop it from the list."""
    gone = KNOWN_ELSEWHERE - set(simple_cycles(import_graph()))
    assert not gone, "remove from KNOWN_ELSEWHERE (fixed): " + ", ".join(map(show, gone))


# The core's layers, lowest first. A module may import its own layer and those below;
# the package root's lazy names (PEP 562) are the public API and sit on top.
LAYERS = (
    ("memwal_datasource.errors", "memwal_datasource.hooks", "memwal_datasource.lance_logging"),
    ("memwal_datasource.options", "memwal_datasource.config"),
    ("memwal_datasource.store",),
    ("memwal_datasource.format",),
    ("memwal_datasource.shard",),
    ("memwal_datasource.log",),
    ("memwal_datasource.table",),
    ("memwal_datasource.write", "memwal_datasource.maintenance"),
    ("memwal_datasource.memwal_table",),
    ("memwal_datasource.lance_readers",),
    ("memwal_datasource.spark",),
    ("memwal_datasource.cli",),
)
# Imports that run against the layers, each as the test names it: none.
LAYER_ALLOWED: frozenset[tuple[str, str]] = frozenset()


def layer_of(module: str) -> tuple[int, str] | None:
    """``(layer index, unit)`` of a package module; the root ``__init__`` has none."""
    for index, units in enumerate(LAYERS):
        for unit in units:
            if module == unit or module.startswith(unit + "."):
                return index, unit
    return None


def test_every_core_module_has_a_layer():
    loose = [m for m in package_modules() if m.startswith("memwal_datasource.")
             and layer_of(m) is None]
    assert not loose, f"give these a layer in LAYERS: {loose}"


def test_each_layer_imports_only_the_layers_below():
    """A sub-package imports itself and lower layers, never a sibling or a layer above."""
    wrong = []
    for importer, targets in sorted(import_graph().items()):
        mine = layer_of(importer)
        if mine is None:
            continue
        for target in sorted(targets):
            theirs = layer_of(target)
            if theirs is None or theirs[1] == mine[1]:
                continue
            if theirs[0] >= mine[0] and (importer, target) not in LAYER_ALLOWED:
                wrong.append(f"{importer} -> {target}")
    assert not wrong, ("imports that run up or sideways across the layers (move the code "
                       "down, or the caller up):\n" + "\n".join(wrong))


def test_layer_check_catches_an_upward_import():
    assert layer_of("memwal_datasource.shard.wal")[0] < layer_of(
        "memwal_datasource.log.commit")[0]
    assert layer_of("memwal_datasource.write.native")[0] == layer_of(
        "memwal_datasource.maintenance.gc")[0]
    assert layer_of("memwal_datasource") is None


HEAVY = ("numpy", "pyarrow", "lance", "pandas", "pyspark", "memwal_datasource.maintenance.compact",
         "memwal_datasource.maintenance.gc")


def in_fresh_python(code: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                          text=True, check=True).stdout.strip()


def test_package_import_loads_nothing_heavy():
    """A Spark worker's ``import memwal_datasource`` loads no compaction, numpy, lance, pandas."""
    loaded = in_fresh_python(
        f"import sys, memwal_datasource; print([m for m in {HEAVY!r} if m in sys.modules])")
    assert loaded == "[]", f"import memwal_datasource loaded {loaded}"


def test_public_names_are_all_there():
    public = set(memwal_datasource.__all__)
    assert public == {
        "CollectedError", "CommitRefused", "CompactionError", "ConfigError", "Fenced",
        "MemWalDataSource", "MemWalError", "MemWalTable", "MissingEntryError", "ShardSealedError",
        "ShardWriterConfig", "WriterPoisoned", "compact", "lancedb_table",
        "open_shard_writer", "read_table"}
    assert public <= set(dir(memwal_datasource))
    for name in sorted(public):
        assert getattr(memwal_datasource, name).__name__ == name
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        memwal_datasource.nope  # noqa: B018


def test_compact_stays_the_function_after_the_module_is_imported():
    """Importing the submodule ``memwal_datasource.maintenance.compact`` first must not shadow
    ``memwal_datasource.compact(uri)``."""
    got = in_fresh_python("import memwal_datasource.maintenance.compact\n"
                          "from memwal_datasource import compact, MemWalTable\n"
                          "print(compact.__module__, MemWalTable.compact.__module__)")
    assert got == "memwal_datasource.memwal_table memwal_datasource.memwal_table"
