"""Draw the plot gallery's figures (``docs/gallery.md``) by running the page's code.

Runs the page's ``python`` blocks in order in one namespace (``docs/snippets.py``, one torch
thread, the page's seed), from ``docs/img/gallery/``, so each ``path="name.png"`` in the code
writes the figure the page shows as ``img/gallery/name.png``. Checks that every image the page
shows was drawn.

Usage: python docs/gallery.py
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "gallery.md"
OUT = ROOT / "docs" / "img" / "gallery"
_IMAGE = re.compile(r"!\[[^\]]*\]\(img/gallery/([^)\s]+)\)")


def _snippets():
    spec = importlib.util.spec_from_file_location(
        "_docs_snippets", Path(__file__).with_name("snippets.py")
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def shown_figures(page: Path = PAGE) -> list[str]:
    """The file names of the figures the page shows, in order."""
    return _IMAGE.findall(page.read_text(encoding="utf-8"))


def drawn_figures(page: Path = PAGE) -> list[str]:
    """The file names the page's code writes (its ``path="..."`` arguments), in order."""
    code = "\n".join(b.code for b in _snippets().python_blocks(page))
    return re.findall(r'path="([^"]+\.png)"', code)


def draw(page: Path = PAGE, out: Path = OUT) -> list[str]:
    """Run the page's code from ``out``; returns the figures written."""
    import matplotlib
    import torch

    matplotlib.use("Agg")
    torch.set_num_threads(1)
    snippets = _snippets()
    out.mkdir(parents=True, exist_ok=True)
    cwd = os.getcwd()
    os.chdir(out)
    try:
        snippets.seed_page()
        ns: dict = {"__name__": "__gallery__"}
        for block in snippets.python_blocks(page):
            snippets.run_block(block, ns)
    finally:
        os.chdir(cwd)
    missing = [f for f in shown_figures(page) if not (out / f).is_file()]
    if missing:
        raise RuntimeError(f"the gallery shows figures its code did not draw: {missing}")
    return drawn_figures(page)


if __name__ == "__main__":
    names = draw()
    print(f"gallery: {len(names)} figures in {OUT.relative_to(ROOT)}/")
