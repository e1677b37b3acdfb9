import json

import pytest
import torch

from bayesattn.cli import main
from bayesattn.study import METHODS, StudyConfig, format_table, run_study

TINY = dict(
    epochs=1,
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


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


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


def test_study_config_errors():
    with pytest.raises(ValueError, match="methods must be"):
        StudyConfig(methods=("nope",))
    with pytest.raises(ValueError, match="dataset"):
        StudyConfig(dataset="mnist")
    with pytest.raises(ValueError, match="severities"):
        StudyConfig(severities=(7,))
    assert set(METHODS) >= {"deterministic", "mc_dropout", "ensemble", "weights"}
