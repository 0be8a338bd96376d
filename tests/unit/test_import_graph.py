"""The import graph of featpipe has no cycles.

Every ``import`` and ``from ... import`` of every module counts, at module level, inside
functions and under ``TYPE_CHECKING`` alike: a module imports only modules below it (plain
functions sit below the modules that use them, as packed item reading sits below the store).
Importing ``a.b.c`` also runs ``a.b``'s ``__init__``; those implicit edges are left out, since
a package always imports its own submodules.
"""

from __future__ import annotations

import ast
from pathlib import Path

import featpipe

ROOT = Path(featpipe.__file__).parent


def _modules() -> dict[str, Path]:
    found = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _targets(module: str, path: Path, node: ast.AST, modules: dict) -> set[str]:
    """The featpipe modules an import statement loads."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            package = module.split(".") if path.name == "__init__.py" \
                else module.split(".")[:-1]
            package = package[:len(package) - node.level + 1]
            base = ".".join(package + ([base] if base else []))
        # ``from a import b`` loads module ``a.b`` when there is one, else ``a``
        names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                 for alias in node.names]
    out = set()
    for name in names:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        if name and name != module:
            out.add(name)
    return out


def import_graph() -> dict[str, set[str]]:
    """Module -> the featpipe modules it imports anywhere in its body."""
    modules = _modules()
    graph = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        graph[module] = set().union(*(_targets(module, path, node, modules)
                                      for node in ast.walk(tree)
                                      if isinstance(node, ast.Import | ast.ImportFrom)))
    return graph


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected components of more than one module (Tarjan), plus self-loops."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_walker_sees_function_level_imports():
    modules = _modules()
    body = ast.parse("def f():\n    from featpipe.store import Stage\n"
                     "    from . import packed\n")
    found = set().union(*(_targets("featpipe.store.pack", modules["featpipe.store.pack"], node,
                                   modules)
                          for node in ast.walk(body)
                          if isinstance(node, ast.Import | ast.ImportFrom)))
    assert found == {"featpipe.store", "featpipe.store.packed"}
    assert "featpipe.store.facade" in import_graph()["featpipe.store.pack"]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]


def test_no_import_cycles():
    found = [sorted(c) for c in cycles(import_graph())]
    assert not found, f"import cycles: {found}"
