import json

import pytest

from bayesattn.cli import main
from bayesattn.study import METHODS, StudyConfig, format_table, run_study

TINY = dict(
    epochs=1,
    seeds=1,
    num_samples=4,
    ensemble_size=2,
    d_model=16,
    nhead=2,
    num_layers=1,
    dim_feedforward=16,
    severities=(3,),
    arviz_examples=2,
    progress=False,
)


def test_study_writes_results_report_figures_and_is_reproducible(tmp_path):
    methods = ("deterministic", "mc_dropout", "ensemble", "dirichlet", "weights")
    r1 = run_study(StudyConfig(out=str(tmp_path / "a"), methods=methods, **TINY))
    r2 = run_study(StudyConfig(out=str(tmp_path / "b"), methods=methods, **TINY))
    assert list(r1["methods"]) == list(methods)
    for m in methods:
        row = r1["methods"][m]
        for k in ("accuracy", "nll", "ece", "brier", "train_seconds", "infer_ms_per_example"):
            assert isinstance(row[k], float)
        assert 0.0 <= row["ood_classes"]["auroc_entropy"] <= 1.0
        assert set(row["corruptions"]) == {"noise_3", "rotation_3", "occlusion_3"}
        for f in row["figures"]:
            assert (tmp_path / "a" / f).stat().st_size > 0
        # same seed: same numbers (timings aside)
        for k in ("accuracy", "nll", "ece", "brier"):
            assert row[k] == pytest.approx(r2["methods"][m][k], abs=1e-6)
    assert r1["methods"]["deterministic"]["mean_mi"] == 0.0
    assert r1["methods"]["dirichlet"]["mean_mi"] > 0.0
    att = r1["methods"]["dirichlet"]["attention"]
    assert (tmp_path / "a" / att["netcdf"]).exists() and (tmp_path / "a" / att["figure"]).exists()
    saved = json.loads((tmp_path / "a" / "results.json").read_text())
    assert set(saved["methods"]) == set(methods)
    report = (tmp_path / "a" / "report.md").read_text()
    assert format_table(r1).splitlines()[0] in report and "![" in report


def test_cli_refuses_to_overwrite_and_validates(tmp_path, capsys):
    out = tmp_path / "study"
    out.mkdir()
    (out / "old.txt").write_text("keep me")
    assert main(["study", "--out", str(out), "--quick", "--no-progress"]) == 2
    assert "--force" in capsys.readouterr().err
    assert (out / "old.txt").read_text() == "keep me"
    empty = tmp_path / "other"
    assert main(["study", "--out", str(empty), "--epochs", "0", "--no-progress"]) == 2
    assert "epochs must be a positive int" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["study", "--methods", "bogus"])


def test_cli_runs_a_small_study(tmp_path, capsys, monkeypatch):
    import bayesattn.study as study

    real = study.StudyConfig.quick

    def tiny_quick(**kw):
        return real(**{**TINY, **kw, "progress": False})

    monkeypatch.setattr(study.StudyConfig, "quick", staticmethod(tiny_quick))
    out = tmp_path / "s"
    rc = main(["study", "--out", str(out), "--quick", "--methods", "deterministic", "--force"])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "| deterministic |" in printed and (out / "results.json").exists()


def test_cli_seeds_and_holdout_classes(tmp_path, monkeypatch):
    import bayesattn.study as study

    seen = {}
    real = study.run_study

    def spy(cfg):
        seen["cfg"] = cfg
        return real(cfg)

    monkeypatch.setattr(study, "run_study", spy)
    out = tmp_path / "s"
    args = ["study", "--out", str(out), "--methods", "deterministic", "--seeds", "2",
            "--holdout-classes", "0", "3", "--epochs", "1", "--ensemble-size", "2",
            "--no-progress"]
    monkeypatch.setattr(
        study.StudyConfig, "__init__", _with_tiny(study.StudyConfig.__init__), raising=True
    )
    assert main(args) == 0
    cfg = seen["cfg"]
    assert cfg.seeds == 2 and tuple(cfg.holdout_classes) == (0, 3)
    saved = json.loads((out / "results.json").read_text())
    assert saved["seeds"] == [0, 1] and saved["data"]["holdout_classes"] == [0, 3]


def _with_tiny(init):
    def wrapped(self, **kw):
        small = {k: v for k, v in TINY.items() if k not in ("epochs", "seeds")}
        init(self, **{**small, **kw})

    return wrapped


def test_multi_seed_study_aggregates_pairs_and_reports(tmp_path):
    methods = ("deterministic", "ensemble", "recommended")
    cfg = StudyConfig(out=str(tmp_path), methods=methods, **{**TINY, "seeds": 2},
                      holdout_classes=(1, 7), timing_samples=(1, 2))
    r = run_study(cfg)
    assert r["seeds"] == [0, 1] and r["data"]["holdout_classes"] == [1, 7]
    for m in methods:
        row = r["methods"][m]
        vals = row["per_seed"]["accuracy"]
        assert len(vals) == 2
        assert row["accuracy"] == pytest.approx(sum(vals) / 2)
        assert row["sd"]["accuracy"] == pytest.approx(abs(vals[0] - vals[1]) / 2**0.5)
        # per-seed rows are kept whole
        assert r["per_seed"]["1"][m]["accuracy"] == pytest.approx(vals[1])
    d = r["paired"]["vs_deterministic"]["recommended"]["nll"]
    diffs = [r["per_seed"][s]["recommended"]["nll"] - r["per_seed"][s]["deterministic"]["nll"]
             for s in ("0", "1")]
    assert d["mean"] == pytest.approx(sum(diffs) / 2)
    assert "vs_ensemble" in r["paired"] and "ensemble" not in r["paired"]["vs_ensemble"]
    assert set(r["goal"]["checks"]) and isinstance(r["goal"]["reached"], bool)
    assert r["wins"]["accuracy"] in methods
    assert set(r["predictive_cost"]) == {"deterministic_forward", "S=1", "S=2"}
    assert (tmp_path / "pareto.png").stat().st_size > 0
    geo = r["geometry"]
    assert set(geo) == {"deterministic", "recommended"}
    assert geo["deterministic"]["posterior_sd"][geo["deterministic"]["layers"][0]] == 0.0
    assert all((tmp_path / f).stat().st_size > 0 for g in geo.values() for f in g["figures"])
    report = (tmp_path / "report.md").read_text()
    for text in ("Paired differences against `deterministic`", "Who wins what", "pareto.png",
                 "The goal for the recommended method", "± ", "Attention geometry"):
        assert text in report


def test_study_config_errors():
    with pytest.raises(ValueError, match="methods must be"):
        StudyConfig(methods=("nope",))
    with pytest.raises(ValueError, match="dataset"):
        StudyConfig(dataset="mnist")
    with pytest.raises(ValueError, match="severities"):
        StudyConfig(severities=(7,))
    with pytest.raises(ValueError, match="seeds"):
        StudyConfig(seeds=0)
    with pytest.raises(ValueError, match="holdout_classes"):
        StudyConfig(holdout_classes=(3, 3))
    with pytest.raises(ValueError, match="holdout_classes"):
        StudyConfig(holdout_classes=(11,))
    with pytest.raises(ValueError, match="timing_samples"):
        StudyConfig(timing_samples=(0,))
    assert set(METHODS) >= {"deterministic", "mc_dropout", "ensemble", "weights"}
