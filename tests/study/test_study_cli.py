"""The study command's options that need no study (issues 42, 43): each case below was a
traceback or was accepted silently on today's main."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bayesattn.cli import main

ROOT = Path(__file__).resolve().parents[2]


def test_a_seed_too_large_for_the_generators_is_refused_cleanly(tmp_path, capsys):
    out = tmp_path / "s"
    assert main(["study", "--seed", "99999999999999999999", "--out", str(out)]) == 2
    assert "seed must be an int in 0..4294967295" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("jobs", ["-1", "0", "two"])
def test_jobs_must_be_a_positive_int_with_merge_too(tmp_path, capsys, jobs):
    with pytest.raises(SystemExit) as e:
        main(["study", "--merge", "a", "b", "--jobs", jobs, "--out", str(tmp_path / "m")])
    assert e.value.code == 2 and "--jobs must be an int >= 1" in capsys.readouterr().err


def test_options_that_run_a_study_are_refused_with_merge(tmp_path, capsys):
    for extra in (["--jobs", "2"], ["--resume"], ["--scheduler", "tcp://nowhere:1"]):
        args = ["study", "--merge", "a", "b", "--out", str(tmp_path / "m"), *extra]
        assert main(args) == 2
        assert "--merge only merges" in capsys.readouterr().err
    assert not (tmp_path / "m").exists()


def test_scheduler_and_jobs_together_and_resume_without_a_study_are_refused(tmp_path, capsys):
    out = tmp_path / "s"
    assert main(["study", "--out", str(out), "--jobs", "2", "--scheduler", "tcp://x:1"]) == 2
    assert "not both" in capsys.readouterr().err
    assert main(["study", "--out", str(out), "--resume"]) == 2
    assert "no study of these settings to continue" in capsys.readouterr().err


def test_make_study_uses_every_core():
    text = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^study:.*\n\t(.*)$", text, re.M)
    assert recipe and "--jobs $(JOBS)" in recipe.group(1)
    assert re.search(r"^JOBS \?= \$\(shell nproc", text, re.M)


def test_a_folder_holding_only_a_killed_first_writes_temp_file_is_as_good_as_empty(tmp_path):
    """A study killed while writing its first file (``INCOMPLETE``, atomically) leaves only the
    temporary file: the folder has no status to report and a rerun may use it."""
    from bayesattn._study_io import prepare_out_dir, study_status

    out = tmp_path / "s"
    out.mkdir()
    (out / ".INCOMPLETE.k1ll3d.tmp").write_text("A bayesattn study is run")
    assert study_status(out) == "missing"
    assert prepare_out_dir(out, force=False) == out
    (out / "notes.txt").write_text("someone else's")
    assert study_status(out) == "incomplete"
    with pytest.raises(ValueError, match="holds files no study run wrote"):
        prepare_out_dir(out, force=False)
