"""Every script in ``examples/`` runs with ``--quick``, writes the files it promises and prints
numbers in range; its docstring shows what the full run prints, and those numbers are in range
too."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from collections.abc import Callable
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


_Check = tuple[str, Callable[..., bool], str]
_NUM = r"([-+]?\d[\d.]*(?:e[-+]?\d+)?)"
#: what every run prints, quick or full: script -> (pattern, condition on its numbers, meaning)
BOTH: dict[str, list[_Check]] = {
    "01_exact_posterior.py": [
        (
            rf" {_NUM} +{_NUM}\n",
            lambda enum, svi: enum < 1e-5 and svi < 0.2,
            "enumeration equals the closed form; SVI comes close",
        ),
    ],
    "02_drop_in_attention.py": [
        (rf"after the swap: {_NUM}", lambda d: d < 1e-5, "the drop-in equals torch's layer"),
        (rf"std of a weight: {_NUM}", lambda s: s > 0.01, "the weights have posterior spread"),
    ],
    "03_train_classifier.py": [
        (rf"\n *accuracy {_NUM}", lambda a: a >= 0.8, "well above chance (labels 10% flipped)"),
        (
            rf"epistemic \(MI\) {_NUM}\n *unseen tokens: entropy [\d.]+, MI {_NUM}",
            lambda on, off: off > 2 * on,
            "more mutual information off the data",
        ),
        (rf"OOD AUROC: entropy [\d.]+, MI {_NUM}", lambda a: a >= 0.8, "MI finds unseen tokens"),
    ],
    "05_online_belief_updates.py": [
        (rf"max \|difference\| {_NUM}", lambda d: d < 0.05, "SVI matches the conjugate update"),
    ],
    "08_class_density.py": [
        (rf"AUROC by density {_NUM}", lambda a: a >= 0.85, "the density finds held-out classes"),
        (
            rf"MI on the data {_NUM}, off it {_NUM}",
            lambda on, off: off > on,
            "more mutual information off the data",
        ),
    ],
}
#: what only the full run reaches (its ``--quick`` run is a smoke test of a few steps)
FULL_ONLY: dict[str, list[_Check]] = {
    "04_translation_uncertainty.py": [
        (rf"token accuracy {_NUM}\n", lambda a: a >= 0.9, "it learns to translate"),
        (
            rf"MI on correct tokens {_NUM}, on wrong tokens {_NUM}",
            lambda ok, bad: bad > ok,
            "more mutual information on its mistakes",
        ),
    ],
    "06_scaling_out.py": [(rf"test acc {_NUM}", lambda a: a >= 0.9, "it learns the digits")],
    "07_posthoc_calibration.py": [
        (rf"\n *before +{_NUM}", lambda a: a >= 0.85, "the models it calibrates are trained"),
    ],
}


def out_of_range(printed: str, checks: list[_Check]) -> list[str]:
    """The checks ``printed`` fails (a pattern that never matches fails too)."""
    problems = []
    for pattern, ok, meaning in checks:
        found = re.findall(pattern, printed)
        if not found:
            problems.append(f"nothing printed matches {pattern!r} ({meaning})")
        for groups in found:
            values = [float(v) for v in (groups if isinstance(groups, tuple) else (groups,))]
            if not ok(*values):
                problems.append(f"{pattern!r} printed {values}: not {meaning}")
    return problems


def full_run_output(script: str) -> str:
    """The output the docstring shows (its ``Prints (the full run …)::`` block)."""
    doc = ast.get_docstring(ast.parse((EXAMPLES / script).read_text(encoding="utf-8"))) or ""
    _, sep, shown = doc.partition("Prints (the full run")
    assert sep, f"{script}: the docstring shows no full-run output ('Prints (the full run ...)::')"
    return shown.split("::", 1)[1]


@pytest.mark.parametrize("script", sorted(EXPECTED))
def test_the_docstring_shows_useful_full_run_output(script: str):
    """What the docstring shows the full run printing is in range (re-measure and update it
    when a change moves the numbers)."""
    checks = BOTH.get(script, []) + FULL_ONLY.get(script, [])
    assert checks, f"{script}: add the numbers its output must reach to BOTH or FULL_ONLY"
    assert out_of_range(full_run_output(script), checks) == []


def test_range_checks_can_fail():
    checks = BOTH["03_train_classifier.py"]
    good = (
        "\naccuracy 0.89  NLL\n... epistemic (MI) 3.2e-06\nunseen tokens: entropy 0.4, "
        "MI 3.3e-05\nOOD AUROC: entropy 0.9, MI 0.92"
    )
    assert out_of_range(good, checks) == []
    bad = good.replace("MI 3.3e-05", "MI 1.0e-06").replace("accuracy 0.89", "accuracy 0.52")
    assert len(out_of_range(bad, checks)) == 2
    assert "nothing printed matches" in out_of_range("", checks)[0]


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
    assert out_of_range(proc.stdout, BOTH.get(script, [])) == [], proc.stdout
    if script in FULL_ONLY:  # numbers that mean nothing at smoke size say so
        assert "smoke run (--quick)" in proc.stdout, proc.stdout
    printed = proc.stdout + proc.stderr  # no third-party advertisement or deprecation warning
    assert not re.search(r"Tip:|litlogger|[Dd]eprecat", printed), printed[-4000:]
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
