"""``study --merge`` (issue 33): sources that are not studies, repeated, incomplete, or the output
folder itself are refused, and a merge that raises leaves ``--out`` as it was."""

from __future__ import annotations

import json
import shutil

import pytest

from bayesattn._study_io import RESULTS, study_status
from bayesattn.cli import main
from bayesattn.study import StudyConfig, run_study
from bayesattn.study.merge import merge_studies, without_times

pytestmark = pytest.mark.slow  # one tiny study (about 10 s), then copies of it


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    out = tmp_path_factory.mktemp("merge") / "a"
    run_study(StudyConfig.quick(out=str(out), methods=("deterministic",), seeds=1, epochs=1,
                                figures=False, progress=False))  # fmt: skip
    return out


def _copy(study, tmp_path, name):
    dst = tmp_path / name
    shutil.copytree(study, dst)
    return dst


def _snapshot(folder):
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def test_a_merge_of_copies_is_the_study_itself(study, tmp_path):
    a, b = _copy(study, tmp_path, "a"), _copy(study, tmp_path, "b")
    merged = merge_studies([a, b], tmp_path / "m")
    want = json.loads((a / RESULTS).read_text())
    def text(o):  # NaN intervals (one seed) compare equal as text
        return json.dumps(without_times(o), sort_keys=True)

    for part in ("pooled", "paired", "per_pair", "wins", "runs"):
        assert text(merged["datasets"]["digits"][part]) == text(want["datasets"]["digits"][part])
    assert study_status(tmp_path / "m") == "complete"
    listed = set(json.loads((a / RESULTS).read_text())["files"])
    runs = {f for f in listed if f.startswith("run_") or f == "study.json"}
    assert runs and listed - runs <= set(merged["files"])  # figures copied; run files not:
    assert not runs & set(merged["files"])  # the merged study is pooled, not resumable


def _edit_config(folder, edit):
    results = json.loads((folder / RESULTS).read_text())
    edit(results["config"])
    (folder / RESULTS).write_text(json.dumps(results))


def test_a_study_from_before_the_smoke_field_counts_as_not_smoke(study, tmp_path):
    """``smoke`` (issue 31) is absent from older studies: they merge with ``smoke=False`` ones,
    and a smoke run never merges into one that is not."""
    a, b = _copy(study, tmp_path, "a"), _copy(study, tmp_path, "b")
    _edit_config(a, lambda c: c.update(smoke=False))
    _edit_config(b, lambda c: c.pop("smoke"))
    assert merge_studies([a, b], tmp_path / "m")["config"]["smoke"] is False
    _edit_config(a, lambda c: c.update(smoke=True))
    with pytest.raises(ValueError, match=r"differs .* in \['smoke'\]"):
        merge_studies([a, b], tmp_path / "m2")


def test_sources_that_are_not_studies_are_refused(study, tmp_path):
    a = _copy(study, tmp_path, "a")
    other = tmp_path / "other"
    other.mkdir()
    (other / RESULTS).write_text(json.dumps({"accuracy": 0.9}))
    with pytest.raises(ValueError, match=r"source .*other: results.json is not a bayesattn study"):
        merge_studies([a, other], tmp_path / "m")
    (other / RESULTS).write_text("{not json")
    with pytest.raises(ValueError, match="cannot be read as JSON"):
        merge_studies([a, other], tmp_path / "m")
    (other / RESULTS).write_text(json.dumps([1, 2]))
    with pytest.raises(ValueError, match="is not a bayesattn study"):
        merge_studies([a, other], tmp_path / "m")
    assert not (tmp_path / "m").exists()


def test_a_repeated_source_and_an_output_among_the_sources_are_refused(study, tmp_path):
    a, b = _copy(study, tmp_path, "a"), _copy(study, tmp_path, "b")
    with pytest.raises(ValueError, match="distinct studies.*counts twice|count twice"):
        merge_studies([a, tmp_path / "." / "a"], tmp_path / "m")
    before = _snapshot(a)
    with pytest.raises(ValueError, match="out must be a new folder, not one of the sources"):
        merge_studies([a, b], a)
    assert _snapshot(a) == before and study_status(a) == "complete"


def test_a_source_missing_a_listed_file_is_refused(study, tmp_path):
    a, b = _copy(study, tmp_path, "a"), _copy(study, tmp_path, "b")
    listed = [f for f in json.loads((b / RESULTS).read_text())["files"] if f.endswith(".png")]
    (b / listed[0]).unlink()
    with pytest.raises(ValueError, match=f"not a complete study.*{listed[0]}"):
        merge_studies([a, b], tmp_path / "m")


def test_a_merge_that_raises_leaves_the_output_folder_as_it_was(study, tmp_path):
    a, b = _copy(study, tmp_path, "a"), _copy(study, tmp_path, "b")
    out = _copy(study, tmp_path, "out")  # an earlier study there (replaced only on success)
    before = _snapshot(out)
    res = json.loads((b / RESULTS).read_text())
    res["datasets"]["digits"]["runs"][0]["methods"]["deterministic"]["accuracy"] += 0.01
    (b / RESULTS).write_text(json.dumps(res))
    with pytest.raises(ValueError, match="'deterministic' differs"):
        merge_studies([a, b], out)
    assert _snapshot(out) == before


def test_the_command_line_refuses_bad_merges_cleanly(study, tmp_path, capsys):
    a, b = _copy(study, tmp_path, "a"), _copy(study, tmp_path, "b")
    assert main(["study", "--merge", str(a), str(a), "--out", str(tmp_path / "m")]) == 2
    assert "distinct" in capsys.readouterr().err
    assert main(["study", "--merge", str(a), str(b), "--out", str(a), "--force"]) == 2
    assert "not one of the sources" in capsys.readouterr().err
    assert study_status(a) == "complete"


def test_a_merge_keeps_the_studys_dataset_order(study, tmp_path):
    """results.json is written with sorted keys; the merged report lists the datasets in the
    order the study ran them (``config["datasets"]``), as the sources' own reports do."""
    a, b = _copy(study, tmp_path, "a"), _copy(study, tmp_path, "b")
    for folder in (a, b):
        results = json.loads((folder / RESULTS).read_text())
        results["datasets"]["mnist1d"] = results["datasets"]["digits"]  # a second dataset
        results["config"]["datasets"] = ["mnist1d", "digits"]
        (folder / RESULTS).write_text(json.dumps(results, sort_keys=True))
    merged = merge_studies([a, b], tmp_path / "m")
    assert list(merged["datasets"]) == ["mnist1d", "digits"]
    text = (tmp_path / "m" / "report.md").read_text()
    assert text.index("**mnist1d**") < text.index("**digits**")


def test_a_merge_keeping_some_methods_leaves_the_others_files_behind():
    from bayesattn.study.merge import _copied

    every = ["density", "density_bow", "density_cls", "bow"]
    kept = ["density", "density_bow"]
    assert _copied("wordnet_entropy_density.png", every, kept)
    assert _copied("wordnet_entropy_density_bow.png", every, kept)  # not "bow"'s file
    assert not _copied("wordnet_entropy_density_cls.png", every, kept)
    assert not _copied("wordnet_entropy_bow.png", every, kept)
    assert _copied("pareto_wordnet.png", every, kept) and not _copied(RESULTS, every, kept)
