"""No import cycles among xsens modules, function-local imports included.

A cycle hidden in a function-local import works until someone moves that import to the top
of its file; this guard reads every `import` statement of `xsens/` (AST, nothing imported).
"""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _module_name(path: pathlib.Path) -> str:
  parts = list(path.relative_to(ROOT).with_suffix("").parts)
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
  """{xsens module: the xsens modules its import statements name (the most specific)}."""
  files = {_module_name(p): p for p in (ROOT / "xsens").rglob("*.py")}
  graph = {}
  for name, path in files.items():
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
      if isinstance(node, ast.Import):
        targets.update(a.name for a in node.names)
      elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
          up = package.split(".")[:len(package.split(".")) - node.level + 1]
          base = ".".join(up + ([base] if base else []))
        for alias in node.names:
          full = f"{base}.{alias.name}"
          targets.add(full if full in files else base)
    graph[name] = {t for t in targets if t in files and t != name}
  return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
  """Strongly connected components with more than one module (Tarjan)."""
  index, low, stack, on_stack, out = {}, {}, [], set(), []

  def visit(v):
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
        out.append(sorted(component))

  for v in sorted(graph):
    if v not in index:
      visit(v)
  return out


def test_the_guard_finds_a_cycle():
  assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
  assert cycles({"a": {"b"}, "b": set()}) == []


def test_xsens_has_no_import_cycles():
  graph = import_graph()
  assert "xsens.data.streaming" in graph["xsens.train.trainer"]   # the scan sees imports
  assert cycles(graph) == []
