"""The package's structure: no library file over 600 lines, no class over 400, no function over
80, and no import cycle between ``bayesattn`` modules, counting *every* import (those under
``if TYPE_CHECKING:``, which the ``lint-imports`` contracts leave out, and inside functions).

The known offenders are listed below with their size today. The lists only shrink: an entry
that grows fails, and so does one that is back within its limit (delete it then).

``python tests/cross_cutting/test_structure.py`` prints a summary (files, the largest file,
class and function, the cycles).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "bayesattn"

FILE_LIMIT = 600
CLASS_LIMIT = 400
FUNCTION_LIMIT = 80

# known offenders, ``path`` (``path::qualname``) -> current lines: none since issue 32; a new
# entry needs a reason in its issue
FILES_OVER_LIMIT: dict[str, int] = {}
CLASSES_OVER_LIMIT: dict[str, int] = {}
FUNCTIONS_OVER_LIMIT: dict[str, int] = {}
# import cycles (strongly connected modules), by their modules: none
CYCLES_ALLOWED: list[frozenset[str]] = []


# -- sizes -----------------------------------------------------------------------------------


def _lines(node: ast.stmt) -> int:
    """Lines of a definition, from ``def``/``class`` to its last line (docstring included)."""
    return (node.end_lineno or node.lineno) - node.lineno + 1


def _rel(path: Path, pkg: Path) -> str:
    return path.relative_to(pkg.parent).as_posix()


_DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _definitions(
    node: ast.AST, prefix: str = ""
) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef]]:
    """``(qualified name, node)`` of every class and function under ``node``, nested ones
    included (``Class.method``, ``outer.inner``, those under ``if``/``try``)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, _DEFINITIONS):
            yield f"{prefix}{child.name}", child
            yield from _definitions(child, f"{prefix}{child.name}.")
        else:
            yield from _definitions(child, prefix)


def measure(pkg: Path = PKG) -> tuple[dict[str, int], dict[str, int], dict[str, int]]:
    """Lines of every file, class and function of the package: three dicts keyed by
    ``path`` / ``path::qualname`` (paths relative to the package's parent)."""
    files: dict[str, int] = {}
    classes: dict[str, int] = {}
    functions: dict[str, int] = {}
    for path in sorted(pkg.rglob("*.py")):
        src = path.read_text()
        rel = _rel(path, pkg)
        files[rel] = len(src.splitlines())
        for name, node in _definitions(ast.parse(src)):
            into = classes if isinstance(node, ast.ClassDef) else functions
            into[f"{rel}::{name}"] = _lines(node)
    return files, classes, functions


def over_limit(measured: Mapping[str, int], limit: int, allowed: Mapping[str, int]) -> list[str]:
    """What breaks the limit: an item over it that is not allowlisted, an allowlisted item that
    grew past its listed size, and an allowlisted item no longer over the limit (to prune)."""
    problems = []
    for key, n in sorted(measured.items()):
        if n > limit and key not in allowed:
            problems.append(f"{key}: {n} lines > {limit}")
        elif key in allowed and n > allowed[key]:
            problems.append(f"{key}: grew to {n} lines (allowlisted at {allowed[key]})")
    for key in sorted(allowed):
        if measured.get(key, 0) <= limit:
            problems.append(f"{key}: no longer over {limit} lines; remove it from the allowlist")
    return problems


# -- the import graph --------------------------------------------------------------------------


def module_names(pkg: Path = PKG) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package (``__init__`` = the package)."""
    out = {}
    for path in sorted(pkg.rglob("*.py")):
        parts = list(path.relative_to(pkg.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _resolve_from(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module named by ``from <...> import`` in ``module``."""
    if node.level == 0:
        return node.module or ""
    parts = module.split(".")
    base = parts if is_package else parts[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def _imported(module: str, is_package: bool, node: ast.AST, known: set[str]) -> set[str]:
    """The package modules an ``import``/``from ... import`` statement imports."""
    out = set()
    if isinstance(node, ast.Import):
        for alias in node.names:
            name = alias.name
            while name and name not in known:  # ``import a.b.func``: the module a.b
                name = name.rpartition(".")[0]
            out.add(name)
    elif isinstance(node, ast.ImportFrom):
        source = _resolve_from(module, is_package, node)
        for alias in node.names:
            sub = f"{source}.{alias.name}"
            out.add(sub if sub in known else source)  # ``from pkg import sub``: the module
    return {m for m in out if m in known}


def import_graph(pkg: Path = PKG) -> dict[str, set[str]]:
    """Module -> the package modules it imports: every ``import`` anywhere in its file (module
    level, ``if TYPE_CHECKING:``, inside functions), relative ones resolved; a module importing
    its own ancestor package is not counted (Python runs the ancestors' ``__init__`` first)."""
    modules = module_names(pkg)
    known = set(modules)
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        is_package = path.name == "__init__.py"
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            targets |= _imported(module, is_package, node, known)
        graph[module] = {t for t in targets if t != module and not module.startswith(t + ".")}
    return graph


def import_cycles(graph: Mapping[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[frozenset[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
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
                out.append(frozenset(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out, key=sorted)


def cycle_problems(
    cycles: Iterable[frozenset[str]], allowed: Iterable[frozenset[str]]
) -> list[str]:
    """A cycle not within an allowlisted set of modules (new, or grown), and an allowlisted set
    that no longer holds a cycle (to prune)."""
    cycles, allowed = list(cycles), list(allowed)
    problems = [
        f"import cycle between {sorted(c)}" for c in cycles if not any(c <= a for a in allowed)
    ]
    for a in allowed:
        if not any(len(c & a) > 1 for c in cycles):
            problems.append(f"no cycle left in {sorted(a)}; remove it from the allowlist")
    return problems


# -- the tests ---------------------------------------------------------------------------------


def test_no_file_over_600_lines():
    files, _, _ = measure()
    assert over_limit(files, FILE_LIMIT, FILES_OVER_LIMIT) == []


def test_no_class_over_400_lines():
    _, classes, _ = measure()
    assert over_limit(classes, CLASS_LIMIT, CLASSES_OVER_LIMIT) == []


def test_no_function_over_80_lines():
    _, _, functions = measure()
    assert over_limit(functions, FUNCTION_LIMIT, FUNCTIONS_OVER_LIMIT) == []


def test_no_import_cycle():
    assert cycle_problems(import_cycles(import_graph()), CYCLES_ALLOWED) == []


def test_the_study_configuration_imports_its_registries_and_nothing_below_imports_it():
    """The configuration checks method and data-set names against their registries, which it
    imports (with the modules that register the density and mixture methods): no slot filled by
    whichever module was imported first. Nothing the configuration imports imports it back (a
    run reads its settings through the ``RunSettings`` protocol)."""
    from bayesattn.study import config

    graph = import_graph()
    imported = {m for m in graph["bayesattn.study.config"] if m.startswith("bayesattn.study")}
    assert {"bayesattn.study.methods", "bayesattn.study.density_methods",
            "bayesattn.study.mixture_methods", "bayesattn.study.datasets"} <= imported  # fmt: skip
    assert not hasattr(config, "use_method_names") and not hasattr(config, "_METHOD_NAMES")
    below = ("methods", "density_methods", "mixture_methods", "runs", "scores", "stats",
             "laplace_evidence", "results", "datasets")  # fmt: skip
    for name in below:
        assert "bayesattn.study.config" not in graph.get(f"bayesattn.study.{name}", set()), name


def test_the_allowlists_only_shrink():
    assert over_limit({"a": 5, "b": 12, "c": 8}, 8, {"b": 12, "c": 10}) == [
        "c: no longer over 8 lines; remove it from the allowlist"
    ]
    assert over_limit({"a": 9, "b": 13}, 8, {"b": 12}) == [
        "a: 9 lines > 8",
        "b: grew to 13 lines (allowlisted at 12)",
    ]
    assert over_limit({"b": 11}, 8, {"b": 12, "gone": 20}) == [
        "gone: no longer over 8 lines; remove it from the allowlist"
    ]
    ab, abc = frozenset("ab"), frozenset("abc")
    assert cycle_problems([ab], [abc]) == []  # a cycle that shrank is still allowed
    assert cycle_problems([abc], [ab]) == ["import cycle between ['a', 'b', 'c']"]
    assert cycle_problems([], [ab]) == ["no cycle left in ['a', 'b']; remove it from the allowlist"]


def _write(root: Path, files: Mapping[str, str]) -> Path:
    for rel, src in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(src)
    return root / "pkg"


def test_the_import_graph_sees_every_import(tmp_path):
    pkg = _write(
        tmp_path,
        {
            "pkg/__init__.py": "from . import a\nfrom .sub import c\n",
            "pkg/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import X\n",
            "pkg/b.py": "def f():\n    from pkg import a\n    import pkg.sub.c\n",
            "pkg/sub/__init__.py": "from .. import b\nfrom ..a import thing\n",
            "pkg/sub/c.py": "from . import helper\nfrom .d import y\nimport pkg\n",
            "pkg/sub/d.py": "import os\nfrom pkg.sub.c import z\n",
        },
    )
    assert import_graph(pkg) == {
        "pkg": {"pkg.a", "pkg.sub.c"},
        "pkg.a": {"pkg.b"},  # under TYPE_CHECKING
        "pkg.b": {"pkg.a", "pkg.sub.c"},  # inside a function; ``from pkg import a``: pkg.a
        "pkg.sub": {"pkg.b", "pkg.a"},  # relative to a package's __init__
        "pkg.sub.c": {"pkg.sub.d"},  # its own ancestors (pkg.sub, pkg) not counted
        "pkg.sub.d": {"pkg.sub.c"},
    }
    assert import_cycles(import_graph(pkg)) == [
        frozenset({"pkg.a", "pkg.b"}),
        frozenset({"pkg.sub.c", "pkg.sub.d"}),
    ]


def test_sizes_count_nested_definitions(tmp_path):
    pkg = _write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/m.py": (
                "class A:\n    def f(self):\n        def g():\n            pass\n"
                "if True:\n    def h():\n        return 1\n"
            ),
        },
    )
    files, classes, functions = measure(pkg)
    assert files == {"pkg/__init__.py": 0, "pkg/m.py": 7}
    assert classes == {"pkg/m.py::A": 4}
    assert functions == {"pkg/m.py::A.f": 3, "pkg/m.py::A.f.g": 2, "pkg/m.py::h": 2}


def summary(pkg: Path = PKG) -> str:
    """Counts for an issue note: files, the largest file/class/function, offenders, cycles."""
    files, classes, functions = measure(pkg)
    cycles = import_cycles(import_graph(pkg))
    lines = [f"{len(files)} files, {sum(files.values())} lines, {len(classes)} classes, "
             f"{len(functions)} functions"]  # fmt: skip
    for what, sizes, limit in (
        ("file", files, FILE_LIMIT),
        ("class", classes, CLASS_LIMIT),
        ("function", functions, FUNCTION_LIMIT),
    ):
        top = max(sizes, key=lambda k: sizes[k])
        over = sorted((k for k in sizes if sizes[k] > limit), key=lambda k: -sizes[k])
        lines.append(f"largest {what}: {top} ({sizes[top]} lines); {len(over)} over {limit}")
        lines += [f"    {k} ({sizes[k]})" for k in over]
    lines.append(f"import cycles: {len(cycles)}")
    lines += [f"    {' <-> '.join(sorted(c))}" for c in cycles]
    return "\n".join(lines)


if __name__ == "__main__":
    print(summary())
