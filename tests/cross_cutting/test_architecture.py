"""docs/architecture.md and its figure against the code: every unit of the package sits in one
layer, no import points up (annotation-only and function-level imports included), every path the
page names exists, and the figure script draws."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "architecture.md"


@pytest.fixture(scope="module")
def fig():
    spec = importlib.util.spec_from_file_location("architecture_figure", ROOT / "docs" / "architecture_figure.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_unit_is_in_exactly_one_layer(fig):
    rows = fig.layers()
    placed = [u for row in rows for u in row]
    assert len(placed) == len(set(placed))
    units = {
        "bayesattn." + p.stem if p.is_file() else "bayesattn." + p.name
        for p in (ROOT / "bayesattn").iterdir()
        if (p.suffix == ".py" and p.name != "__init__.py") or (p / "__init__.py").exists()
    }
    assert units == set(placed)


def test_no_import_points_up(fig):
    assert fig.upward(fig.layers(), fig.arrows()) == []


def test_upward_arrows_are_found(fig, tmp_path):
    """The check can fail: a maths module that imports the layer above it is caught."""
    pkg = tmp_path / "bayesattn"
    (pkg / "functional").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "functional" / "__init__.py").write_text("from typing import TYPE_CHECKING\n"
                                                    "if TYPE_CHECKING:\n    from ..nn import X\n")
    (pkg / "nn.py").write_text("from .functional import Y\n")
    rows = [["bayesattn.nn"], ["bayesattn.functional"]]
    assert fig.upward(rows, fig.arrows(pkg)) == [("bayesattn.functional", "bayesattn.nn")]


def test_paths_on_the_page_exist():
    text = PAGE.read_text()
    paths = set(re.findall(r"`((?:bayesattn|tests|docs)/[\w/.<>-]+)`", text))
    assert paths, "the page names no paths"
    for p in sorted(paths):
        if "<name>" in p:
            assert (ROOT / p.split("<name>")[0]).is_dir(), p
        else:
            assert (ROOT / p).exists(), p
    for link in re.findall(r"\]\(([\w-]+\.md)\)", text):
        assert (ROOT / "docs" / link).exists(), link
    assert "architecture.md" in (ROOT / "mkdocs.yml").read_text()


def test_figure_draws(fig, tmp_path):
    out = fig.draw(fig.layers(), fig.arrows(), tmp_path / "a.png")
    assert out.stat().st_size > 10_000
    assert (ROOT / "docs" / "img" / "architecture.png").exists()
