"""``benchmarks/wordnet_recipe_scores.py`` runs end to end (a smoke run): the recipe for words and
every score tried beside it are scored on one study run, and bad arguments are refused."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from bayesattn.data.wordnet import WORDNET_DIR

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "wordnet_recipe_scores.py"


def _auroc(stdout: str, name: str) -> tuple[float, str]:
    row = re.search(rf"^{re.escape(name)} \| (\d\.\d+) \[[^|]*\| ([+-]\d\.\d+)", stdout, re.M)
    assert row is not None, (name, stdout)
    return float(row.group(1)), row.group(2)


@pytest.mark.skipif(not Path(WORDNET_DIR, "data.noun").is_file(), reason="Debian's wordnet-base")
def test_the_scores_beside_the_recipe_run():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--jobs", "1"],
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    recipe, diff = _auroc(proc.stdout, "the recipe (density_bow_pair's own score)")
    assert 0.0 <= recipe <= 1.0 and diff == "+0.000"
    for name in ("mixture mutual information", "bag of words' energy",
                 "kNN distance of the CLS (k = 10)", "Mahalanobis in a 256-d LSA of the TF-IDF",
                 "unseen-word rate", "sum: the two parts + mixture entropy (two networks + bag of words)"):  # fmt: skip
        value, d = _auroc(proc.stdout, name)
        assert 0.0 <= value <= 1.0
        assert abs(float(d) - (value - recipe)) < 2e-3  # the paired difference of one run
    assert "wrote" not in proc.stdout  # a smoke run writes no result file


def test_bad_arguments_are_refused():
    bad = subprocess.run([sys.executable, str(SCRIPT), "--pairs", "6"],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert bad.returncode != 0 and "--pairs must be 1-5" in bad.stderr


def test_the_figure_draws_the_pooled_table(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import wordnet_recipe_scores as w

    rows = [[w.RECIPE, "0.840 [0.792, 0.895]", "+0.000 [+0.000, +0.000]"],
            ["a score", "0.827 [0.781, 0.883]", "-0.013 [-0.016, -0.010]"],
            ["a score off the scale", "0.346 [0.283, 0.412]", "-0.494 [-0.565, -0.424]"]]  # fmt: skip
    w.figure(rows, 8, tmp_path / "f.png")
    assert (tmp_path / "f.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError):
        w.figure([rows[0], ["bad", "0.8", "not a difference"]], 8, tmp_path / "g.png")
