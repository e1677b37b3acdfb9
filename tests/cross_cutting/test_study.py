"""Whole-study runs on tiny configurations (slow: whole programs)."""

import importlib.util
import json
from pathlib import Path

import pytest

from bayesattn.cli import main
from bayesattn.study import StudyConfig, format_table, run_study

#: whole programs (``make test-fast`` skips them; CI runs them)
pytestmark = pytest.mark.slow

TINY = dict(
    epochs=1,
    seeds=1,
    num_samples=2,
    ensemble_size=2,
    d_model=8,
    nhead=2,
    num_layers=1,
    dim_feedforward=8,
    severities=(3,),
    arviz_examples=2,
    knn_ks=(1, 5),
    geometry=False,
    figures=False,
    progress=False,
)


def _numbers(block, keys=("accuracy", "nll", "ece", "nll_ts")):
    return [(m, k, r["methods"][m][k]) for r in block["runs"] for m in r["methods"] for k in keys]


def test_rotated_study_writes_everything_and_is_reproducible(tmp_path):
    laplace = ("laplace",) if importlib.util.find_spec("laplace") else ()  # the study extra
    methods = ("deterministic", "temp_scaled", "ensemble", "knn", "mahalanobis", *laplace,
               "last_layer")  # fmt: skip
    r1 = run_study(StudyConfig(out=str(tmp_path / "a"), methods=methods, holdout_rotation=2,
                               **TINY))  # fmt: skip
    block = r1["datasets"]["digits"]
    assert r1["methods"] == list(methods) and len(block["runs"]) == 2
    assert [run["pair"] for run in block["runs"]] == r1["pairs"]
    # the second pair again on its own: the same numbers (timings aside), whatever ran before
    r2 = run_study(StudyConfig(out=str(tmp_path / "b"), methods=methods,
                               holdout_classes=r1["pairs"][1], **TINY))  # fmt: skip
    n1 = _numbers({"runs": block["runs"][1:]})
    n2 = _numbers(r2["datasets"]["digits"])
    assert [x[:2] for x in n1] == [x[:2] for x in n2]
    assert [x[2] for x in n1] == pytest.approx([x[2] for x in n2], abs=1e-9)
    saved = json.loads((tmp_path / "a" / "results.json").read_text())
    assert saved["config"]["holdout_rotation"] == 2 and saved["datasets"]["digits"]["runs"]
    for run in block["runs"]:
        row = run["methods"]["knn"]
        assert row["params"]["k"] in (1, 5) and 0 <= row["held_out"]["auroc_own"] <= 1
        assert set(row["far_ood"]) == {"uniform", "inverted", "permuted", "moments"}
        assert 0 <= row["auroc_far"] <= 1 and 0 <= row["auroc_shift"] <= 1
        assert 0 <= row["selective"]["aurc"] <= 1 and row["selective"]["aurc_own"] is not None
        assert 0 <= row["selective"]["acc_at_80"] <= 1 and 0 <= row["selective"]["acc_at_90"] <= 1
        assert run["methods"]["deterministic"]["held_out"]["auroc_own"] is None
        if laplace:  # by marginal likelihood: inside the old grid, not on its upper end
            assert 0 < run["methods"]["laplace"]["params"]["prior_precision"] < 1e4
        assert set(run["ensemble_curve"]) == {"1", "2"}
        # the ensemble of one member is the deterministic network
        assert run["ensemble_curve"]["1"]["nll"] == pytest.approx(
            run["methods"]["deterministic"]["nll"]
        )
        for k in ("infer_ms_batch1", "infer_ms_batch512", "train_seconds", "nll_ts", "ece_ts"):
            assert isinstance(row[k], float)
    pooled = block["pooled"]
    acc = [run["methods"]["last_layer"]["accuracy"] for run in block["runs"]]
    assert pooled["last_layer"]["accuracy"]["mean"] == pytest.approx(sum(acc) / 2)
    d = block["paired"]["deterministic"]["last_layer"]["nll"]
    diffs = [run["methods"]["last_layer"]["nll"] - run["methods"]["deterministic"]["nll"]
             for run in block["runs"]]  # fmt: skip
    assert d["mean"] == pytest.approx(sum(diffs) / 2) and isinstance(d["resolved"], bool)
    assert "ensemble" in block["paired"] and "auroc_own" not in pooled["deterministic"]
    report = (tmp_path / "a" / "report.md").read_text()
    for text in ("95% t-interval", "How hyperparameters are chosen", "Paired differences against "
                 "`ensemble`", "Ensemble size curve", "Appendix: per held-out pair",
                 "pareto_digits.png", "Resolved after Holm:", "### Near / far / shift",
                 "### Selective prediction", "own: kNN distance", "Many comparisons",
                 format_table(r1).splitlines()[2]):  # fmt: skip
        assert text in report, text
    if laplace:
        assert "**Laplace.** `laplace`" in report
    for f in saved["files"]:
        assert (tmp_path / "a" / f).stat().st_size > 0


def test_full_protocol_path_runs_the_four_datasets_into_one_report(tmp_path, capsys):
    from bayesattn.data.wordnet import WORDNET_DIR

    pytest.importorskip("mnist1d")
    if not Path("/usr/share/games/fortunes/art").is_file():
        pytest.skip("Debian's fortunes package (.ci/run installs it)")
    if not Path(WORDNET_DIR, "data.noun").is_file():
        pytest.skip("Debian's wordnet-base package (.ci/run installs it)")
    out = tmp_path / "m"
    args = ["study", "--out", str(out), "--protocol", "full", "--methods", "deterministic",
            "--holdout-classes", "3", "4", "--seeds", "1", "--epochs", "1",
            "--ensemble-size", "1", "--samples", "2", "--no-progress"]  # fmt: skip
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "**digits**" in printed and "**mnist1d**" in printed and "| deterministic |" in printed
    assert "**fortunes**" in printed and "**wordnet**" in printed
    saved = json.loads((out / "results.json").read_text())
    assert sorted(saved["datasets"]) == ["digits", "fortunes", "mnist1d", "wordnet"]
    report = (out / "report.md").read_text()
    assert "## digits" in report and "## mnist1d" in report and "pareto_mnist1d.png" in report
    assert "## fortunes" in report
    assert "smoke" not in report and "smoke" not in printed  # not a --quick run: results
    run = saved["datasets"]["mnist1d"]["runs"][0]
    assert run["pair"] == [3, 4] and set(run["methods"]) == {"deterministic"}
    assert set(run["methods"]["deterministic"]["corruptions"]) == {
        "noise_1", "noise_3", "noise_5", "occlusion_1", "occlusion_3", "occlusion_5",
        "shift_1", "shift_3", "shift_5",
    }  # fmt: skip
    assert (out / "mnist1d_reliability_deterministic.png").exists()
    # the same command again resumes the finished study (every run is there: nothing is rerun)
    runs = {p.name: p.stat().st_mtime_ns for p in out.glob("run_*.json")}
    assert len(runs) == 4 and main(args) == 0
    assert {p.name: p.stat().st_mtime_ns for p in out.glob("run_*.json")} == runs
    other = [*args[:-1], "--ensemble-size", "2", "--no-progress"]
    assert main(other) == 2  # a study of other settings is there: --force needed
    assert "another configuration" in capsys.readouterr().err
    (out / "notes.txt").write_text("keep")
    assert main([*args, "--force"]) == 0
    assert (out / "notes.txt").read_text() == "keep"
    assert "notes.txt" not in json.loads((out / "results.json").read_text())["files"]
