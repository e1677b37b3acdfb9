"""The study's report and terminal table: a smoke run (``--quick``) says it is not results."""

from __future__ import annotations

import json

import pytest

from bayesattn.cli import main
from bayesattn.study import StudyConfig
from bayesattn.study.report import SMOKE_NOTE, format_table, is_smoke


def _results(**config) -> dict:
    return {"config": config, "datasets": {}}


def test_the_quick_preset_is_a_smoke_run_and_the_others_are_not():
    assert StudyConfig.quick().smoke and not StudyConfig().smoke
    assert not StudyConfig.full().smoke
    with pytest.raises(TypeError, match="smoke must be a bool"):
        StudyConfig(smoke="yes")


def test_the_table_of_a_smoke_run_starts_with_the_note():
    assert format_table(_results(smoke=True)).startswith(SMOKE_NOTE)
    assert "smoke" not in format_table(_results(smoke=False))
    assert not is_smoke(_results())  # results.json of a study from before the field: not smoke
    assert "not results" in SMOKE_NOTE


@pytest.mark.slow
def test_a_quick_run_says_it_is_a_smoke_run_in_the_terminal_and_the_report(tmp_path, capsys):
    out = tmp_path / "q"
    args = ["study", "--quick", "--out", str(out), "--methods", "deterministic", "--seeds", "1",
            "--epochs", "1", "--ensemble-size", "1", "--samples", "2", "--no-progress"]  # fmt: skip
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("bayesattn: a smoke run (--quick)")
    assert SMOKE_NOTE in printed and "| deterministic |" in printed
    report = (out / "report.md").read_text()
    assert report.startswith("# bayesattn uncertainty study (smoke run)\n\n> " + SMOKE_NOTE)
    assert json.loads((out / "results.json").read_text())["config"]["smoke"] is True
