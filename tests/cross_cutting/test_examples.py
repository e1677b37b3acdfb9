"""Every script in ``examples/`` runs with ``--quick`` and writes the files it promises."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

#: whole programs (``make test-fast`` skips them; CI runs them)
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"

# script -> files it must write into --out
EXPECTED = {
    "01_exact_posterior.py": ["exact_posterior.png"],
    "02_drop_in_attention.py": ["attention_uncertainty.png"],
    "03_train_classifier.py": [
        "training_history.png",
        "reliability_diagram.png",
        "ood_entropy.png",
    ],
    "04_translation_uncertainty.py": ["token_mutual_information.png", "cross_attention.png"],
    "05_online_belief_updates.py": ["belief_updates.png"],
    "06_scaling_out.py": ["validation_metrics.png", "reliability_diagram.png"],
    "07_posthoc_calibration.py": [
        "posthoc_torch_reliability.png",
        "posthoc_torch_ood_entropy.png",
        "posthoc_hf_reliability.png",
        "posthoc_hf_ood_entropy.png",
    ],
    "08_class_density.py": ["density_scores.png"],
}


def test_every_example_is_listed():
    scripts = sorted(p.name for p in EXAMPLES.glob("[0-9]*.py"))
    assert scripts == sorted(EXPECTED), "add new examples (and their outputs) to EXPECTED"


# script -> optional extra it needs (skipped without it; `make test` installs every extra)
NEEDS = {"06_scaling_out.py": "lightning"}


@pytest.mark.parametrize("script", sorted(EXPECTED))
def test_example_runs_quick(script: str, tmp_path: Path):
    if script in NEEDS:
        pytest.importorskip(NEEDS[script])
    out = tmp_path / "out"
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", MPLBACKEND="Agg")
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / script), "--quick", "--out", str(out)],
        cwd=tmp_path,  # nothing may be written into the repository
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, (
        f"{script} --quick failed (rc={proc.returncode})\n"
        f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-8000:]}"
    )
    for name in EXPECTED[script]:
        f = out / name
        assert f.is_file() and f.stat().st_size > 0, f"{script} did not write {name}"
        assert f.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"{name} is not a PNG"


@pytest.mark.parametrize("script", sorted(EXPECTED))
def test_example_has_docstring_and_quick_flag(script: str):
    src = (EXAMPLES / script).read_text(encoding="utf-8")
    doc = ast.get_docstring(ast.parse(src))
    assert doc and len(doc.splitlines()) > 3, f"{script} needs a module docstring"
    assert '"--quick"' in src and '"--out"' in src
