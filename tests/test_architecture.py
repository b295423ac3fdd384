"""The house's arrows: kvsim's import graph has no cycle and only goes down the layers.

Every module of the package is parsed with ``ast`` (imports inside functions and under
``TYPE_CHECKING`` count: a late import still ties two modules together). The rooms, bottom to
top (docs/architecture.md):

- the bottom: ``kvsim.errors``, ``kvsim.output_file``, the package root, and
  ``workloads/identity.py`` (block ids)
  and ``workloads/request.py`` (``Request``);
- ``workloads/`` (trace files, generators) and ``cache/`` (pure engine logic); ``cache/`` sees
  nothing of ``workloads/`` but the bottom;
- ``reports/`` (result frames to files and pages), beside the engine: never ``cache/``,
  ``sim/`` or ``real_backend/``;
- ``sim/`` above ``cache/`` (and ``workloads/``); of ``reports/`` it sees only the output
  contract, ``reports/frames.py``, and the frame type, ``reports/columns.py``;
- ``real_backend/`` above ``sim/``;
- the top: the root modules (``cli.py`` and its command modules, ``pipeline``, ``api``...),
  which no room below imports.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ROOMS = ("cache", "sim", "workloads", "real_backend", "reports")
BOTTOM = {"kvsim", "kvsim.errors", "kvsim.output_file", "kvsim.workloads.identity",
          "kvsim.workloads.request"}
#: room -> the rooms its modules may import (besides their own and the bottom).
ALLOWED = {
    "workloads": set(),
    "cache": set(),
    "reports": set(),
    "sim": {"cache", "workloads", "kvsim.reports.frames", "kvsim.reports.columns"},
    "real_backend": {"sim", "cache", "workloads", "reports"},
    "top": {"top", "sim", "cache", "workloads", "reports", "real_backend"},
}


def module_files() -> dict[str, Path]:
    """``kvsim.*`` module name -> file, as setuptools maps the folders (root = ``kvsim``); a
    C extension (``cache/_intmap.c``) is a module that imports nothing of the package."""
    found = {}
    for path in [*ROOT.rglob("*.py"), *ROOT.rglob("*.c")]:
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[0] in ("tests", "bench", "build") or parts[0].startswith("."):
            continue
        names = ["kvsim", *parts[:-1]] + ([] if parts[-1] == "__init__" else [parts[-1]])
        found[".".join(names)] = path
    return found


def import_graph() -> tuple[set[str], set[tuple[str, str]]]:
    """``(modules, edges)``: an edge ``(a, b)`` for every import of module ``b`` in ``a``."""
    files = module_files()
    edges = set()
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        if path.suffix == ".c":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            for target in _targets(node, package, files):
                if target != name:
                    edges.add((name, target))
    return set(files), edges


def _targets(node: ast.AST, package: str, files: dict) -> list[str]:
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            up = package.split(".")[:len(package.split(".")) - node.level + 1]
            base = ".".join(up + ([node.module] if node.module else []))
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base
                 for a in node.names]
    else:
        return []
    return [_known(n, files) for n in names if n.startswith("kvsim") and _known(n, files)]


def _known(name: str, files: dict) -> str:
    """The longest prefix of ``name`` that is a module of the package ('' if none)."""
    while name and name not in files:
        name = name.rpartition(".")[0]
    return name


def room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in ROOMS else "top"


def cycles(modules: set[str], edges: set[tuple[str, str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    out = {m: [] for m in modules}
    for a, b in edges:
        out[a].append(b)
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in out[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(modules)))
    for v in sorted(modules):
        if v not in index:
            visit(v)
    return found


def allowed(a: str, b: str) -> bool:
    if b in BOTTOM or room(a) == room(b):
        return True
    rules = ALLOWED[room(a)]
    return room(b) in rules or b in rules


def test_the_graph_sees_top_level_and_function_level_imports():
    modules, edges = import_graph()
    assert len(modules) > 80
    assert ("kvsim.cli", "kvsim.commands.run") in edges                 # module level
    assert ("kvsim.commands.run", "kvsim.pipeline") in edges             # inside a function
    assert ("kvsim.cache.request_state", "kvsim.workloads.request") in edges   # TYPE_CHECKING
    assert ("kvsim.cache.host_tier", "kvsim.cache.eviction") in edges     # relative


def test_no_import_cycles():
    assert cycles(*import_graph()) == []


def test_the_cycle_finder_finds_a_cycle():
    edges = {("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")}
    assert cycles({"a", "b", "c", "d"}, edges) == [["a", "b", "c"]]


def test_imports_only_go_down_the_layers():
    _, edges = import_graph()
    wrong = sorted(f"{a} -> {b}" for a, b in edges if not allowed(a, b))
    assert wrong == []


def test_the_layer_rules_refuse_upward_imports():
    assert not allowed("kvsim.cache.kv_cache_manager", "kvsim.workloads.loader")
    assert not allowed("kvsim.reports.html", "kvsim.sim.serving.results")
    assert not allowed("kvsim.sim.serving.results", "kvsim.reports.html")
    assert not allowed("kvsim.sim.serving.runner", "kvsim.real_backend.session")
    assert not allowed("kvsim.real_backend.validate", "kvsim.pipeline")
    assert allowed("kvsim.cache.request_state", "kvsim.workloads.identity")
    assert allowed("kvsim.sim.serving.results", "kvsim.reports.frames")


def test_the_cache_engine_loads_no_trace_parser():
    code = ("import sys, kvsim.cache, kvsim.cache.scheduler, kvsim.cache.hitrate; "
            "print(' '.join(sorted(m for m in sys.modules if m.startswith('kvsim.'))))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    loaded = set(done.stdout.split())
    assert {m for m in loaded if room(m) != "cache"} <= BOTTOM | {"kvsim.workloads"}
