"""Print the package's structure figures: what a reshaping is measured by.

Run from the project root: ``python scripts/structure_report.py [--json]``.

* modules, and those sharing a file name (``__init__.py`` aside);
* the largest class and its length in lines;
* functions longer than 50 lines;
* ``getattr`` probes on the running scheduler or a store;
* import cycles inside one folder (all imports, ``TYPE_CHECKING`` ones aside).
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "scrapy_banker"
PROBE = re.compile(r"getattr\((running_scheduler\(|self\.store\b|store\b|scheduler\b)")


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted((ROOT / PACKAGE).rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _runtime_imports(tree: ast.Module, module: str, is_package: bool) -> set[str]:
    """Imported module names, leaving out ``if TYPE_CHECKING:`` blocks."""
    found: set[str] = set()
    base = module.split(".") if is_package else module.split(".")[:-1]

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                visit(node.orelse)
                continue
            for sub in ast.walk(node):
                if isinstance(sub, ast.Import):
                    found.update(a.name for a in sub.names)
                elif isinstance(sub, ast.ImportFrom):
                    if sub.level:
                        anchor = base[: len(base) - sub.level + 1]
                        name = ".".join(anchor + ([sub.module] if sub.module else []))
                    else:
                        name = sub.module or ""
                    found.add(name)
                    found.update(f"{name}.{a.name}" for a in sub.names)

    visit(tree.body)
    return found


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def strong(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10_000)
    for v in graph:
        if v not in index:
            strong(v)
    return out


def report() -> dict[str, object]:
    modules = _modules()
    names = Counter(p.name for p in modules.values() if p.name != "__init__.py")
    classes: list[tuple[int, str]] = []
    long_functions: list[tuple[int, str]] = []
    probes: list[str] = []
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in modules.items():
        text = path.read_text()
        tree = ast.parse(text)
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                span = (node.end_lineno or node.lineno) - node.lineno + 1
                classes.append((span, f"{name}.{node.name}"))
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                span = (node.end_lineno or node.lineno) - node.lineno + 1
                if span > 50:
                    long_functions.append((span, f"{name}:{node.name}"))
        for number, line in enumerate(text.splitlines(), 1):
            if PROBE.search(line) and "__" not in line:
                probes.append(f"{path.relative_to(ROOT)}:{number}")
        folder = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for imported in _runtime_imports(tree, name, path.name == "__init__.py"):
            if imported in modules and imported != name:
                other = modules[imported]
                other_folder = (
                    imported if other.name == "__init__.py" else imported.rpartition(".")[0]
                )
                if other_folder == folder:
                    graph[name].add(imported)
    classes.sort(reverse=True)
    long_functions.sort(reverse=True)
    cycles = _cycles(dict(graph))
    return {
        "modules": len(modules),
        "shared_file_names": sorted(n for n, c in names.items() if c > 1),
        "largest_class": {"name": classes[0][1], "lines": classes[0][0]},
        "largest_classes": [f"{n} ({s})" for s, n in classes[:5]],
        "functions_over_50_lines": len(long_functions),
        "long_functions": [f"{n} ({s})" for s, n in long_functions],
        "getattr_probes": len(probes),
        "probes": probes,
        "cycles_inside_folders": len(cycles),
        "cycles": cycles,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="one JSON object")
    args = parser.parse_args()
    figures = report()
    if args.json:
        print(json.dumps(figures))
        return
    for key, value in figures.items():
        if isinstance(value, list) and value and not isinstance(value[0], str | list):
            value = ", ".join(map(str, value))
        if isinstance(value, list):
            print(f"{key}:")
            for item in value:
                print(f"  {item}")
        else:
            print(f"{key}: {value}")


if __name__ == "__main__":
    main()
