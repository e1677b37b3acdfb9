"""The Python snippets of ``README.md`` and ``docs/*.md``, their printed output and its check.

A page's fenced ``python`` blocks run in order in one namespace (later blocks use names of earlier
ones). A block that prints shows what it prints in the fenced ``text`` block right under it; the
test suite (``tests/cross_cutting/test_docs.py``) runs every page and compares: the words must be
the same, integers equal, other numbers within ``ATOL + RTOL·|shown|`` (torch builds and
platforms differ in the last digits of a trained network, never in the story).

Usage (after changing a snippet): ``python docs/snippets.py README.md docs/uncertainty.md`` runs
the pages and writes what each block printed into its ``text`` block (added where missing).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SKIP_MARK = "<!-- skip -->"
_FENCE = re.compile(r"^```\s*(?P<lang>[\w+-]*)")
_NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")
ATOL = 0.03  # printed numbers may differ from the shown ones by ATOL + RTOL·|shown|
RTOL = 0.3


@dataclass
class Block:
    path: Path
    line: int  # 1-based line of the opening fence
    code: str
    skip: bool
    expected: str | None = None  # the ``text`` block right under it: what it prints
    expected_line: int | None = None  # 1-based line of that block's opening fence

    @property
    def where(self) -> str:
        path = self.path.relative_to(ROOT) if self.path.is_relative_to(ROOT) else self.path
        return f"{path}:{self.line}"


def python_blocks(path: Path) -> list[Block]:
    """Top-level fenced ``python`` blocks of a Markdown file, with their skip marks and the
    ``text`` block (only blank lines between) that shows their output."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    prev = ""  # last non-blank line outside code blocks
    last_closed: Block | None = None  # a python block with only blank lines after it so far
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            if lines[i].strip():
                prev, last_closed = lines[i].strip(), None
            i += 1
            continue
        start = i
        i += 1
        body: list[str] = []
        while i < len(lines) and not lines[i].startswith("```"):
            body.append(lines[i])
            i += 1
        text = "\n".join(body) + "\n"
        if m["lang"] in ("python", "py"):
            blocks.append(Block(path, start + 1, text, prev == SKIP_MARK))
            last_closed = blocks[-1]
        elif m["lang"] == "text" and last_closed is not None:
            last_closed.expected, last_closed.expected_line = text, start + 1
            last_closed = None
        else:
            last_closed = None
        prev = ""
        i += 1  # closing fence
    return blocks


def run_block(block: Block, ns: dict[str, Any]) -> str:
    """Execute one block in ``ns``; returns what it printed."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(block.code, block.where, "exec"), ns)
    return out.getvalue()


def _numbers_and_words(text: str) -> tuple[list[str], list[str]]:
    words = [" ".join(part.split()) for part in _NUMBER.split(text)]
    return _NUMBER.findall(text), words


def output_mismatches(printed: str, shown: str) -> list[str]:
    """Where ``printed`` differs from ``shown``: other words, another count of numbers, an
    integer not equal, or a number outside ``ATOL + RTOL·|shown|``. Empty when they agree."""
    got_n, got_w = _numbers_and_words(printed)
    want_n, want_w = _numbers_and_words(shown)
    if got_w != want_w or len(got_n) != len(want_n):
        return [f"printed\n{printed.rstrip()}\nbut the page shows\n{shown.rstrip()}"]
    problems = []
    for got, want in zip(got_n, want_n, strict=True):
        integer = not any(c in want for c in ".eE")
        g, w = float(got), float(want)
        if (integer and g != w) or abs(g - w) > ATOL + RTOL * abs(w):
            problems.append(f"printed {got} where the page shows {want}")
    return problems


def seed_page() -> None:
    """Seed torch, ``random`` and NumPy before a page runs: its output does not depend on the
    pages run before it (a page whose printed numbers are random seeds itself too, for readers)."""
    import random

    import numpy as np
    import torch

    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)


def refresh(path: Path) -> list[str]:
    """Run the page's blocks and write each one's printed output into its ``text`` block."""
    seed_page()
    ns: dict[str, Any] = {"__name__": "__docs__"}
    lines = path.read_text(encoding="utf-8").splitlines()
    edits: list[tuple[int, int, list[str]]] = []  # (start, end) 0-based lines to replace
    log = []
    for b in python_blocks(path):
        if b.skip:
            continue
        t0 = time.perf_counter()
        printed = run_block(b, ns).rstrip("\n")
        log.append(f"{b.where}: {time.perf_counter() - t0:.1f} s")
        if not printed:
            continue
        new = ["```text", *printed.splitlines(), "```"]
        if b.expected_line is not None:
            start = b.expected_line - 1
            edits.append((start, start + len(b.expected.splitlines()) + 2, new))  # type: ignore[union-attr]
        else:
            end = b.line + len(b.code.splitlines())  # the closing fence's 0-based index
            edits.append((end + 1, end + 1, ["", *new]))
    for start, end, new in sorted(edits, reverse=True):
        lines[start:end] = new
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return log


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("pages", nargs="+", type=Path)
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))  # this checkout's bayesattn, wherever it is run from
    import matplotlib

    matplotlib.use("Agg")
    pages = [page.resolve() for page in args.pages]
    home = os.getcwd()
    for page in pages:
        with tempfile.TemporaryDirectory() as tmp:  # what a snippet writes goes nowhere
            os.chdir(tmp)
            try:
                for line in refresh(page):
                    print(line, file=sys.stderr)
            finally:
                os.chdir(home)
    return 0


if __name__ == "__main__":
    sys.exit(main())
