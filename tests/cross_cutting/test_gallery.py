"""The plot gallery (``docs/gallery.md``) shows every figure of ``bayesattn.plots``, each drawn
by the code above it (``docs/gallery.py``; ``tests/cross_cutting/test_docs.py`` runs the code)."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import bayesattn.plots

ROOT = Path(__file__).resolve().parents[2]


def _gallery():
    spec = importlib.util.spec_from_file_location("_docs_gallery", ROOT / "docs" / "gallery.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_every_plot_function_is_in_the_gallery():
    text = (ROOT / "docs" / "gallery.md").read_text()
    used = set(re.findall(r"plots\.(plot_\w+)\(", text))
    assert used == set(bayesattn.plots.__all__), set(bayesattn.plots.__all__) ^ used


def test_each_figure_shown_is_drawn_by_the_code_and_committed():
    g = _gallery()
    shown = g.shown_figures()
    assert shown and shown == g.drawn_figures(), (shown, g.drawn_figures())
    for name in shown:
        assert (g.OUT / name).is_file(), f"run python docs/gallery.py ({name} missing)"
        assert (g.OUT / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
