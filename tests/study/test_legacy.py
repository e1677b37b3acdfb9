"""Old method names (``recommended``, now ``last_layer``) are read under their current names:
stored results, a merge of a study from before the rename, a resumed one; a config naming the
old name says what it is called now."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest

from bayesattn._study_io import RESULTS
from bayesattn.study import StudyConfig, run_study
from bayesattn.study.legacy import (
    LEGACY_METHOD_NAMES,
    current_method_name,
    upgrade_results,
    upgrade_run,
)
from bayesattn.study.merge import merge_studies, without_times
from bayesattn.study.runfiles import STUDY_FILE, config_hash, run_file_name

ROOT = Path(__file__).resolve().parents[2]
STORED = ROOT / "studies" / "2026-12-04-full-protocol-0.6" / "results.json"


def _method_names(res: dict) -> set[str]:
    """Every method name an independent walk of a results file finds (keys and win names)."""
    out = set(res["methods"]) | set(res["config"]["methods"])
    for block in res["datasets"].values():
        out |= set(block["pooled"])
        for base, rows in block["paired"].items():
            out |= {base, *rows}
        for rows in block["per_pair"].values():
            out |= set(rows)
        for run in block["runs"]:
            out |= set(run["methods"]) | set(run.get("first_run", {}))
        for win in block["wins"].values():
            out |= {win["method"], win.get("runner_up", win["method"])}
    return out


def test_the_map_and_the_default_methods():
    from bayesattn.study import DEFAULT_METHODS, FULL_METHODS, METHODS

    assert dict(LEGACY_METHOD_NAMES) == {"recommended": "last_layer"}
    assert current_method_name("recommended") == "last_layer"
    assert current_method_name("density") == "density"
    assert "last_layer" in DEFAULT_METHODS and "last_layer" in FULL_METHODS
    assert "recommended" not in METHODS and len(DEFAULT_METHODS) == 14
    with pytest.raises(ValueError, match="'recommended' is now called 'last_layer'"):
        StudyConfig(methods=("deterministic", "recommended"))


def test_a_stored_study_reads_under_the_current_names():
    raw = json.loads(STORED.read_text())
    before = copy.deepcopy(raw)
    res = upgrade_results(raw)
    assert raw == before  # the file's contents are not changed in place
    assert "recommended" in _method_names(raw)
    names = _method_names(res)
    assert "recommended" not in names and "last_layer" in names
    assert res["methods"].index("last_layer") == raw["methods"].index("recommended")
    for ds, block in raw["datasets"].items():
        new = res["datasets"][ds]
        assert new["pooled"]["last_layer"] == block["pooled"]["recommended"]
        assert list(new["pooled"]) == [current_method_name(m) for m in block["pooled"]]
        assert new["paired"]["ensemble"]["last_layer"] == block["paired"]["ensemble"]["recommended"]
        for old_run, run in zip(block["runs"], new["runs"], strict=True):
            assert run["methods"]["last_layer"] == old_run["methods"]["recommended"]
            assert run["first_run"].keys() == {current_method_name(m) for m in old_run["first_run"]}
    assert res["files"] == raw["files"]  # file names are what is on disk: kept
    assert upgrade_results(res) == res  # current names stay as they are


def test_one_method_under_both_names_is_refused():
    for methods in ({"recommended": {"nll": 1.0}, "last_layer": {"nll": 2.0}},
                    {"last_layer": {"nll": 2.0}, "recommended": {"nll": 1.0}}):  # fmt: skip
        with pytest.raises(ValueError, match="'last_layer' under two names"):
            upgrade_run({"methods": methods})


# ---- a study from before the rename: merged and resumed -------------------------------------

_KW = dict(methods=("deterministic", "last_layer"), epochs=1, seeds=2, num_samples=2,
           ensemble_size=1, d_model=8, nhead=2, num_layers=1, dim_feedforward=8,
           severities=(3,), arviz_examples=2, figures=False, progress=False,
           holdout_classes=(8, 9))  # fmt: skip


def _old(text: str) -> str:
    """A file as the study wrote it before the rename."""
    return text.replace('"last_layer"', '"recommended"')


def _text(res: dict) -> str:
    drop = ("files", "seconds", "merged_from", "config_hash")
    res = {k: v for k, v in res.items() if k not in drop}
    res["config"] = {k: v for k, v in res["config"].items() if k != "out"}
    return json.dumps(without_times(res), sort_keys=True)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("legacy") / "ref"
    run_study(StudyConfig(out=str(out), **_KW))
    return out


@pytest.mark.slow
def test_a_study_from_before_the_rename_merges_under_the_current_name(reference, tmp_path):
    old = tmp_path / "old"
    shutil.copytree(reference, old)
    (old / RESULTS).write_text(_old((old / RESULTS).read_text()))
    assert '"recommended"' in (old / RESULTS).read_text()
    merged = merge_studies([old, reference], tmp_path / "m")
    assert merged["methods"] == ["deterministic", "last_layer"]
    want = json.loads((reference / RESULTS).read_text())
    for part in ("pooled", "paired", "per_pair", "wins", "runs"):
        a, b = merged["datasets"]["digits"][part], want["datasets"]["digits"][part]
        assert json.dumps(without_times(a), sort_keys=True) == json.dumps(
            without_times(b), sort_keys=True
        ), part
    assert "last_layer" in (tmp_path / "m" / "report.md").read_text()


@pytest.mark.slow
def test_a_study_from_before_the_rename_resumes(reference, tmp_path):
    out = tmp_path / "old"
    shutil.copytree(reference, out)
    study = json.loads(_old((out / STUDY_FILE).read_text()))
    study["config_hash"] = h = config_hash(study["config"])  # the hash it had then
    (out / STUDY_FILE).write_text(json.dumps(study))
    runs = [run_file_name("digits", (8, 9), s) for s in range(2)]
    for name in [*runs, RESULTS]:
        payload = json.loads(_old((out / name).read_text()))
        payload["config_hash"] = h
        (out / name).write_text(json.dumps(payload))
    kept = {n: (out / n).stat().st_mtime_ns for n in runs}
    res = run_study(StudyConfig(out=str(out), **_KW))  # the same study under current names
    assert {n: (out / n).stat().st_mtime_ns for n in runs} == kept  # read, not redone
    assert res["config_hash"] == h
    assert _text(res) == _text(json.loads((reference / RESULTS).read_text()))
