"""The drawing of the house: ``docs/img/architecture.png`` from the code itself.

The layers are the import-linter contract in ``pyproject.toml`` (the first ``layers`` contract, the
package's main one); the arrows are the imports between its top-level modules and subpackages,
found with ``ast`` in every file (imports under ``if TYPE_CHECKING:`` and inside functions
included). ``python docs/architecture_figure.py`` redraws the figure and prints the layers and any
arrow that points up (there should be none: ``tests/cross_cutting/test_architecture.py``).
"""

from __future__ import annotations

import ast
import sys
import tomllib
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "bayesattn"
OUT = ROOT / "docs" / "img" / "architecture.png"


def layers(pyproject: Path = ROOT / "pyproject.toml") -> list[list[str]]:
    """The main layers contract, top first: each layer a list of units (``bayesattn.nn`` …)."""
    cfg = tomllib.loads(pyproject.read_text())
    for c in cfg["tool"]["importlinter"]["contracts"]:
        if c["type"] == "layers" and "containers" not in c:
            return [[u.strip() for u in row.replace("|", ":").split(":")] for row in c["layers"]]
    raise ValueError("no top-level layers contract in pyproject.toml")


def _unit(module: str) -> str:
    """``bayesattn.nn.read`` → ``bayesattn.nn`` (the unit a layer names)."""
    return ".".join(module.split(".")[:2])


def _module_name(path: Path, pkg: Path) -> str:
    parts = list(path.relative_to(pkg.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(node: ast.AST, module: str, is_pkg: bool) -> list[str]:
    """Absolute names an import statement brings in (relative imports resolved)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = module.split(".") if is_pkg else module.split(".")[:-1]
    if node.level:
        base = base[: len(base) - (node.level - 1)]
        mod = ".".join(base + ([node.module] if node.module else []))
    else:
        mod = node.module or ""
    return [mod] + [f"{mod}.{a.name}" for a in node.names]


def arrows(pkg: Path = PKG) -> dict[str, set[str]]:
    """``{unit: units it imports}`` between the package's top-level units."""
    out: dict[str, set[str]] = defaultdict(set)
    units = {f"{pkg.name}.{p.stem}" for p in pkg.iterdir() if p.suffix == ".py"}
    units |= {f"{pkg.name}.{p.name}" for p in pkg.iterdir() if (p / "__init__.py").is_file()}
    for path in sorted(pkg.rglob("*.py")):
        module = _module_name(path, pkg)
        src = _unit(module)
        for node in ast.walk(ast.parse(path.read_text())):
            for name in _imported(node, module, path.name == "__init__.py"):
                if _unit(name) in units and _unit(name) != src:  # modules, not attributes
                    out[src].add(_unit(name))
    return out


def upward(rows: list[list[str]], graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Arrows from a unit to a unit in a layer above it (or not in any layer)."""
    level = {u: i for i, row in enumerate(rows) for u in row}
    bad = []
    for a, targets in graph.items():
        for b in targets:
            if a in level and (b not in level or level[b] < level[a]):
                bad.append((a, b))
    return sorted(bad)


def draw(rows: list[list[str]], graph: dict[str, set[str]], out: Path = OUT) -> Path:
    """Layers as rows of boxes (top: the application), imports as grey arrows downwards (those
    into the bottom row of helpers, which nearly every module imports, are left out)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    width = max(len(r) for r in rows)
    fig, ax = plt.subplots(figsize=(2.3 * width, 0.75 * len(rows) + 0.6))
    pos = {}
    for i, row in enumerate(rows):
        y = len(rows) - 1 - i
        for j, u in enumerate(row):
            pos[u] = ((j + 0.5) * width / len(row), y)
    for a, targets in graph.items():
        for b in targets:
            if a in pos and b in pos and b not in rows[-1]:
                (x0, y0), (x1, y1) = pos[a], pos[b]
                ax.annotate("", (x1, y1 + 0.22), (x0, y0 - 0.22),
                            arrowprops={"arrowstyle": "->", "color": "0.75", "lw": 0.6})  # fmt: skip
    for u, (x, y) in pos.items():
        ax.text(x, y, u.removeprefix("bayesattn."), ha="center", va="center", fontsize=9,
                bbox={"boxstyle": "round", "fc": "#e8eaf6", "ec": "#3f51b5"})  # fmt: skip
    ax.set_xlim(0, width)
    ax.set_ylim(-0.6, len(rows) - 0.4)
    ax.axis("off")
    ax.set_title("bayesattn: each layer imports only from the layers below it\n"
                 "(arrows into the bottom row of helpers left out)", fontsize=10)  # fmt: skip
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main() -> int:
    rows, graph = layers(), arrows()
    for row in rows:
        print(" | ".join(u.removeprefix("bayesattn.") for u in row))
    bad = upward(rows, graph)
    for a, b in bad:
        print(f"UPWARD: {a} -> {b}")
    print(f"{sum(len(t) for t in graph.values())} arrows, {len(bad)} upward; wrote {draw(rows, graph)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
