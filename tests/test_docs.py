"""The documentation builds (``mkdocs build --strict``) and its Python snippets run.

Every fenced ``python`` block of ``README.md`` and ``docs/*.md`` is executed, page by page, in one
namespace per page (later blocks may use names defined by earlier ones), from a temporary working
directory and with one torch thread. A block directly preceded by ``<!-- skip -->`` is not run.
README blocks that use names defined nowhere (illustrations with the user's own data) must carry
that mark: ``test_readme_blocks_are_self_contained`` fails on any other.
"""

from __future__ import annotations

import ast
import builtins
import importlib.util
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
SKIP_MARK = "<!-- skip -->"
_FENCE = re.compile(r"^```\s*(?P<lang>[\w+-]*)")


@dataclass
class Block:
    path: Path
    line: int  # 1-based line of the opening fence
    code: str
    skip: bool

    @property
    def where(self) -> str:
        path = self.path.relative_to(ROOT) if self.path.is_relative_to(ROOT) else self.path
        return f"{path}:{self.line}"


def python_blocks(path: Path) -> list[Block]:
    """Top-level fenced ``python`` blocks of a Markdown file, with their skip marks."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    prev = ""  # last non-blank line outside code blocks
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            if lines[i].strip():
                prev = lines[i].strip()
            i += 1
            continue
        start = i
        i += 1
        body: list[str] = []
        while i < len(lines) and not lines[i].startswith("```"):
            body.append(lines[i])
            i += 1
        if m["lang"] in ("python", "py"):
            blocks.append(Block(path, start + 1, "\n".join(body) + "\n", prev == SKIP_MARK))
        prev = ""
        i += 1  # closing fence
    return blocks


def undefined_names(code: str, known: set[str]) -> set[str]:
    """Names a block reads that it never binds and that are neither builtins nor ``known``."""
    tree = ast.parse(code)
    bound: set[str] = set()
    loaded: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (loaded if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for a in node.names:
                bound.add((a.asname or a.name).split(".")[0])
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
            if not isinstance(node, ast.ClassDef):
                args = node.args
                for a in args.posonlyargs + args.args + args.kwonlyargs:
                    bound.add(a.arg)
                for a in (args.vararg, args.kwarg):
                    if a is not None:
                        bound.add(a.arg)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
    return loaded - bound - known - set(dir(builtins))


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]


def _run_page(path: Path, tmp_path: Path, monkeypatch, skip_undefined: bool) -> list[str]:
    """Run every block of a page in one namespace; returns descriptions of skipped blocks."""
    monkeypatch.chdir(tmp_path)
    import matplotlib

    matplotlib.use("Agg")
    ns: dict = {"__name__": "__docs__"}
    skipped = []
    for b in python_blocks(path):
        if b.skip:
            skipped.append(f"{b.where} (marked {SKIP_MARK})")
            continue
        if skip_undefined:
            missing = undefined_names(b.code, set(ns))
            if missing:
                skipped.append(f"{b.where} (undefined: {', '.join(sorted(missing))})")
                continue
        try:
            exec(compile(b.code, b.where, "exec"), ns)
        except Exception as e:
            raise AssertionError(
                f"snippet at {b.where} failed: {type(e).__name__}: {e}\n{b.code}"
            ) from e
    return skipped


@pytest.mark.parametrize(
    "page",
    [p for p in sorted(DOCS.glob("*.md")) if python_blocks(p)],
    ids=lambda p: p.name,
)
def test_docs_snippets_run(page: Path, tmp_path, monkeypatch, one_thread):
    skipped = _run_page(page, tmp_path, monkeypatch, skip_undefined=False)
    # every skip is deliberate, but a page that skips everything tests nothing
    assert len(skipped) < len(python_blocks(page)), f"{page.name}: every block is skipped"


def test_readme_snippets_run(tmp_path, monkeypatch, one_thread):
    skipped = _run_page(ROOT / "README.md", tmp_path, monkeypatch, skip_undefined=False)
    assert len(skipped) < len(python_blocks(ROOT / "README.md")), "every README block skipped"


def not_self_contained(path: Path) -> list[str]:
    """Blocks of a page, not marked ``<!-- skip -->``, that read names no earlier block (nor
    they themselves) define: they cannot run as written."""
    known: set[str] = set()
    problems = []
    for b in python_blocks(path):
        missing = undefined_names(b.code, known)
        if missing and not b.skip:
            problems.append(f"{b.where} uses undefined {sorted(missing)}")
        known |= _bound_names(b.code)
    return problems


def test_readme_blocks_are_self_contained():
    """Every README block runs as written (after the blocks above it), or is marked skip."""
    problems = not_self_contained(ROOT / "README.md")
    assert not problems, f"mark these {SKIP_MARK} or make them self-contained: {problems}"


def test_self_contained_check_catches_undefined_names(tmp_path):
    """The check above can fail: a block reading a name nobody defines is reported, unless it is
    marked skip; a name bound by an earlier block is fine."""
    page = tmp_path / "page.md"
    ok = "```python\nimport torch\nx = torch.ones(2)\n```\n\n```python\nprint(x.sum())\n```\n"
    page.write_text(ok)
    assert not_self_contained(page) == []
    page.write_text(ok + "\n```python\nnet.fit(my_data)\n```\n")
    (problem,) = not_self_contained(page)
    assert problem.endswith("page.md:10 uses undefined ['my_data', 'net']"), problem
    page.write_text(ok + f"\n{SKIP_MARK}\n```python\nnet.fit(my_data)\n```\n")
    assert not_self_contained(page) == []


def _bound_names(code: str) -> set[str]:
    return {
        n.id
        for n in ast.walk(ast.parse(code))
        if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)
    } | {
        (a.asname or a.name).split(".")[0]
        for n in ast.walk(ast.parse(code))
        if isinstance(n, (ast.Import, ast.ImportFrom))
        for a in n.names
    }


def test_snippet_extraction():
    """The extractor sees fences, languages and skip marks as intended."""
    blocks = python_blocks(ROOT / "README.md")
    assert blocks and all(b.code.strip() for b in blocks)
    assert undefined_names("import torch\nx = torch.ones(1)\nprint(x, y)", set()) == {"y"}


def test_every_api_page_is_in_the_nav():
    nav = (ROOT / "mkdocs.yml").read_text()
    for page in sorted((DOCS / "api").glob("*.md")):
        assert f"api/{page.name}" in nav, f"{page.name} missing from mkdocs.yml nav"


_HAVE_MKDOCS = all(
    importlib.util.find_spec(m) is not None for m in ("mkdocs", "mkdocstrings_handlers.python")
)


@pytest.mark.skipif(not _HAVE_MKDOCS, reason="mkdocs + mkdocstrings[python] not installed")
def test_docs_build_strict(tmp_path):
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    seconds = time.perf_counter() - t0
    assert proc.returncode == 0, (
        f"mkdocs build --strict failed (rc={proc.returncode}, {seconds:.1f} s):\n"
        f"{proc.stdout[-5000:]}\n{proc.stderr[-10000:]}"
    )
    assert (tmp_path / "site" / "index.html").is_file()
    assert (tmp_path / "site" / "api" / "functional" / "index.html").is_file()
