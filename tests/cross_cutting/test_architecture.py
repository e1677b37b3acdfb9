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


def _result_builders(root: Path) -> set[str]:
    """Modules of ``root/bayesattn`` outside ``predictive/`` that call ``PredictionResult(...)``."""
    found = set()
    for path in (root / "bayesattn").rglob("*.py"):
        rel = path.relative_to(root).as_posix()
        if rel.startswith("bayesattn/predictive/"):
            continue
        code = "\n".join(line.split("#")[0] for line in path.read_text().splitlines())
        if re.search(r"(?<![\w.])PredictionResult\(", code):
            found.add(rel)
    return found


def test_predictives_made_outside_predictive_are_the_ones_the_page_names():
    """The page's claim: every attention-drawing predictive goes through Predictive; the modules
    that build a PredictionResult themselves are exactly those its table lists."""
    text = PAGE.read_text()
    section = text.split("## One predictive engine", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"^\| `(bayesattn/[\w/]+\.py)` \|", section, flags=re.M))
    assert listed, "the page lists no module that builds its own PredictionResult"
    assert _result_builders(ROOT) == listed


def test_result_builders_are_found(tmp_path):
    """The check can fail: a new module that builds a PredictionResult is caught, one inside
    predictive/ and a mention in a comment are not."""
    (tmp_path / "bayesattn" / "predictive").mkdir(parents=True)
    (tmp_path / "bayesattn" / "new_read.py").write_text("x = PredictionResult(probs)\n")
    (tmp_path / "bayesattn" / "other.py").write_text("# PredictionResult(probs)\ny = my.PredictionResult(p)\n")
    (tmp_path / "bayesattn" / "predictive" / "engine.py").write_text("z = PredictionResult(p)\n")
    assert _result_builders(tmp_path) == {"bayesattn/new_read.py"}
