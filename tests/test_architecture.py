"""The import rules of docs/ARCHITECTURE.md, read from the source (module-level and function-level imports alike).

A package may import only the packages its row allows; the import graph between modules gets no new cycle (the
cycles that remain are listed in `KNOWN_CYCLES`, and the test fails when one of them is gone so the list shrinks
with the code).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "hf_paged"

# package -> hf_paged packages it may import (besides itself). The package face `hf_paged/__init__.py` is the "api"
# layer too.
ALLOWED = {
    "errors": set(),
    "lazy": set(),  # the lazy package faces' `__getattr__` (a leaf, like errors)
    "compat": set(),  # every use of another library's private API (a leaf)
    "background_compile": set(),  # numba kernels compiled in a child process, one per cache (a leaf)
    "after_fork": set(),  # fresh module-level locks in a forked child (a leaf, any layer may use it)
    "config_checks": set(),  # PagedConfig's field checks and combination refusals (a leaf under config)
    "config": {"errors", "config_checks"},
    "cache": {"compat", "after_fork", "config", "errors", "lazy", "background_compile"},
    "processors": {"compat", "after_fork", "config", "errors", "lazy", "background_compile"},
    "kv_transfer": {"compat", "after_fork", "cache", "config", "errors", "lazy"},  # KV blocks between engines and tiers
    "batching": {"compat", "after_fork", "cache", "kv_transfer", "processors", "config", "errors", "lazy"},
    "serving": {"compat", "batching", "cache", "processors", "config", "errors", "lazy", "api"},
    "scaleout": {"compat", "serving", "batching", "kv_transfer", "cache", "processors", "config", "errors", "lazy",
                 "api"},  # kv_transfer: prefill/decode replicas hand KV over through Ray's object store
    "distributed": {"compat", "batching", "cache", "config", "errors", "lazy", "api"},
    "api": {"compat", "distributed", "batching", "cache", "processors", "config", "errors", "lazy"},
    "cli": {"api", "integrations", "serving", "scaleout", "distributed", "batching", "cache", "processors", "config",
            "errors", "lazy", "compat"},
    "integrations": {"compat", "distributed", "batching", "processors", "config", "errors", "lazy", "api"},
    "programs": {"compat", "after_fork", "batching", "cache", "processors", "config", "errors", "lazy", "api"},
    "__main__": {"cli"},  # `python -m hf_paged`: the command line, nothing else
}

# Cycles present when this test was written (issue 19 removed the three inside `processors/`); a new cycle fails the
# test, and so does a listed one that is gone, so the list only shrinks.
KNOWN_CYCLES: set[frozenset[str]] = set()


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _lazy_table(path: Path) -> dict[str, str]:
    """A package face's `_LAZY` table (name -> the module that defines it), or {}."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "_LAZY" for t in node.targets):
            return {k.value: v.value for k, v in zip(node.value.keys, node.value.values)}
    return {}


def _imports(path: Path, modules: set[str], faces: dict[str, dict[str, str]]) -> set[str]:
    """hf_paged modules imported anywhere in the file (inside functions and under `TYPE_CHECKING` too: an import for
    the type checker still ties the two modules together), resolved to module names: a name taken from a package
    is the submodule of that name, or else the package's `__init__` itself (the face, eager or lazy; a lazy face's
    own edges are the modules its `_LAZY` table names, see `_graph`)."""
    tree = ast.parse(path.read_text())
    package = _module_name(path) if path.name == "__init__.py" else _module_name(path).rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("hf_paged"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if not module.startswith("hf_paged"):
                continue
            for alias in node.names:
                if f"{module}.{alias.name}" in modules:
                    found.add(f"{module}.{alias.name}")
                else:
                    found.add(module)
    return found


def _graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in ROOT.rglob("*.py")}
    faces = {name: _lazy_table(path) for name, path in modules.items() if path.name == "__init__.py"}
    graph = {name: {m for m in _imports(path, set(modules), faces) if m in modules and m != name}
             for name, path in modules.items()}
    for face, table in faces.items():  # a lazy face imports what its table names, only later
        graph[face] |= {m for m in table.values() if m in modules and m != face}
    return graph


def _layer(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "api"
    return parts[1]


def test_packages_import_only_what_their_layer_allows():
    bad = []
    for module, deps in _graph().items():
        layer = _layer(module)
        if module == "hf_paged":  # the package face: lazily, every public name
            continue
        for dep in deps:
            target = _layer(dep)
            if target != layer and target not in ALLOWED[layer]:
                bad.append(f"{module} imports {dep} ({layer} -> {target})")
    assert not bad, "forbidden imports (see docs/ARCHITECTURE.md):\n" + "\n".join(sorted(bad))


def test_the_top_level_holds_only_leaves_and_the_face():
    """At most 8 modules directly in `hf_paged/`: the face and the leaves every layer may use; the rest are stages
    in folders."""
    top = sorted(p.name for p in ROOT.glob("*.py"))
    assert len([p for p in top if p != "__main__.py"]) <= 8, top
    assert all(p.removesuffix(".py") in ALLOWED or p == "__init__.py" for p in top), top


def _cycles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """Strongly connected components of more than one module (the compiler's Tarjan, `call_graph`)."""
    from hf_paged.processors.automaton.call_graph import strongly_connected

    full = {v: set(ws) for v, ws in graph.items()}
    for ws in graph.values():  # (it wants every edge's target as a key)
        for w in ws:
            full.setdefault(w, set())
    return {frozenset(c) for c in strongly_connected(full) if len(c) > 1}


def test_no_new_import_cycles():
    """Package faces are nodes too: an eager face imports its modules, a lazy face every module of its `_LAZY`
    table, and a module that takes a re-exported name from its own face (or imports a module for its type hints
    only) closes a cycle."""
    cycles = _cycles(_graph())
    new = [sorted(c) for c in cycles - KNOWN_CYCLES]
    gone = [sorted(c) for c in KNOWN_CYCLES - cycles]
    assert not new, f"new import cycles: {new}"
    assert not gone, f"cycles gone (remove them from KNOWN_CYCLES): {gone}"


def test_no_module_is_over_400_lines():
    """A module that outgrows 400 lines holds more than one concept: split it (STYLE.md asks ~300)."""
    sizes = {p.relative_to(ROOT).as_posix(): len(p.read_text().splitlines()) for p in ROOT.rglob("*.py")}
    assert {name: n for name, n in sizes.items() if n > 400} == {}
