"""``benchmarks/wordnet_tokens.py --lm --lm-bayesian`` runs end to end (a smoke run): the
Bayesian-attention language model's predictive surprisal and its draws' mutual information over
next tokens are scored, and so are their sums with the network's entropy."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from bayesattn.data.wordnet import WORDNET_DIR

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(not Path(WORDNET_DIR, "data.noun").is_file(), reason="Debian's wordnet-base")
def test_the_bayesian_language_model_scores_run():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "wordnet_tokens.py"), "--lm", "--lm-bayesian",
         "--setting", "32-1-1-0.1", "--quick"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    for name in ("Bayesian-attention causal LM surprisal",
                 "Bayesian-attention causal LM mutual information",
                 "sum: entropy + Bayesian-attention causal LM mutual information"):  # fmt: skip
        row = re.search(rf"^{re.escape(name)} \|.*\| (\d\.\d+) \[", proc.stdout, re.M)
        assert row is not None, proc.stdout
        assert 0.0 <= float(row.group(1)) <= 1.0
    bad = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "wordnet_tokens.py"), "--lm-bayesian"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert bad.returncode != 0 and "--lm-bayesian goes with --lm" in bad.stderr
