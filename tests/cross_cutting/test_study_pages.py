"""The results pages (``docs/study_pages.py``) show what each study's ``results.json`` holds, the
studies index is current, and the landing figure (``docs/figures.py``) draws the committed
numbers."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"_docs_{name}", ROOT / "docs" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


pages = _load("study_pages")
figures = _load("figures")


def test_every_study_folder_is_a_page_with_its_command_and_time():
    studies = pages.load_studies()
    assert [s.folder for s in studies] == sorted(
        p.name for p in (ROOT / "studies").iterdir() if p.is_dir()
    )
    for s in studies:
        page = pages.study_page(s)
        assert page.startswith(f"# {s.title}\n") and s.command and f"```bash\n{s.command}" in page
        assert re.search(r"\*\*\d+(\.\d)? min\*\*|\*\*\d+ h \d+ min\*\*", page), s.folder
        assert not re.search(r"\bissue \d+", page, re.I), f"{s.folder}: an issue number"


def test_page_numbers_are_those_of_results_json():
    """An independent read of the JSON: the density read's digits row of the 0.6 study."""
    s = next(x for x in pages.load_studies() if x.folder == "2026-12-04-full-protocol-0.6")
    raw = json.loads((ROOT / "studies" / s.folder / "results.json").read_text())
    d = raw["datasets"]["digits"]["pooled"]["density"]
    page = pages.study_page(s)
    digits = page.split("## Digits")[1].split("\n## ")[0]
    row = next(line for line in digits.splitlines() if line.startswith("| density |"))
    want = f"{d['accuracy']['mean']:.3f}<br><small>± {d['accuracy']['half_width']:.3f}</small>"
    assert want in row
    paired = raw["datasets"]["digits"]["paired"]["ensemble"]["density"]["auroc_primary"]
    assert paired["resolved"]
    assert f"**{paired['mean']:+.3f}**".replace("-", "−") in digits
    assert pages.minutes(raw["seconds"]) == "2 h 45 min"


def test_cells():
    assert pages.stat_cell({"mean": 0.95, "half_width": 0.007, "n": 25}, 3) == (
        "0.950<br><small>± 0.007</small>"
    )
    assert pages.stat_cell({"mean": 0.95, "half_width": float("nan"), "n": 1}, 3) == "0.950"
    assert pages.stat_cell(None, 3) == "–"
    cell = pages.diff_cell({"mean": -0.02, "lo": -0.03, "hi": -0.01, "resolved": True}, 3)
    assert cell == "**−0.020**<br><small>[−0.030, −0.010]</small>"
    assert pages.minutes(384) == "6.4 min" and pages.minutes(9912) == "2 h 45 min"


def test_readme_parts():
    title, summary, command = pages.read_readme(
        "# A title\n\nWhat it\nmeasured.\n\nMore.\n\n```bash\nbayesattn study\n```\n"
    )
    assert (title, summary, command) == ("A title", "What it measured.", "bayesattn study")


def test_a_folder_without_readme_or_results_is_refused(tmp_path: Path):
    (tmp_path / "2026-01-01-x").mkdir()
    with pytest.raises(ValueError, match="no README.md"):
        pages.load_studies(tmp_path)
    (tmp_path / "2026-01-01-x" / "README.md").write_text("# T\n\nWhat.\n")
    with pytest.raises(ValueError, match="no results.json"):
        pages.load_studies(tmp_path)


def test_studies_index_is_current():
    assert pages.main(["--check"]) == 0, "run python docs/study_pages.py"


def test_hero_figure_reads_the_newest_full_study():
    path = figures.newest_full_study()
    raw = json.loads(path.read_text())
    data = figures.hero_data(raw)
    assert set(data) == set(raw["datasets"])
    assert (
        data["digits"]["density"]
        == raw["datasets"]["digits"]["pooled"]["density"]["auroc_primary"]["mean"]
    )
    assert figures.hero_png()[:8] == b"\x89PNG\r\n\x1a\n"


def test_studies_from_before_a_rename_show_the_current_method_names():
    """The stored 0.6 study ran ``recommended``; its page and the landing figure read it as
    ``last_layer`` (the file itself is not rewritten)."""
    s = next(x for x in pages.load_studies() if x.folder == "2026-12-04-full-protocol-0.6")
    raw = json.loads((ROOT / "studies" / s.folder / "results.json").read_text())
    assert "recommended" in raw["methods"]
    page = pages.study_page(s)
    assert "| last_layer |" in page and "| recommended |" not in page
    data = figures.hero_data(raw)
    want = raw["datasets"]["digits"]["pooled"]["recommended"]["auroc_primary"]["mean"]
    assert data["digits"]["last_layer"] == want


def test_study_summary_quotes_the_newest_full_protocol_study_results_json():
    """The ``<!-- study-summary: ... -->`` table holds the pooled means of the newest (most
    runs of its date) full-protocol study's ``results.json``, read here a second time."""
    methods = ["deterministic", "density", "ensemble"]
    marker = f"<!-- study-summary: {' '.join(methods)} -->"
    md = pages.render_summaries(f"a\n{marker}\nb", pages.load_studies())
    folders = [p for p in (ROOT / "studies").iterdir() if "full-protocol" in p.name]
    raw = {
        p.name: json.loads((p / "results.json").read_text())
        for p in folders
        if (p / "results.json").is_file()
    }
    usable = {
        k: r
        for k, r in raw.items()
        if all(m in d["pooled"] for d in r["datasets"].values() for m in methods)
    }
    runs = lambda r: sum(len(d["runs"]) for d in r["datasets"].values())  # noqa: E731
    newest = max(usable, key=lambda k: (k[:10], runs(usable[k])))
    assert f"(results/{newest}.md)" in md and "<!--" not in md
    rows = [line for line in md.splitlines() if line.startswith("| ") and "<br>" in line]
    assert len(rows) == len(methods) * len(usable[newest]["datasets"])
    for row, (name, m) in zip(
        rows, [(d, m) for d in usable[newest]["datasets"] for m in methods], strict=True
    ):
        pooled = usable[newest]["datasets"][name]["pooled"][m]
        cells = row.split("|")[3:6]
        got = [float(c.split("<br>")[0]) for c in cells]
        want = [pooled[k]["mean"] for k in ("accuracy", "nll", "auroc_primary")]
        assert got == pytest.approx(want, abs=5e-4), (name, m, row)
    with pytest.raises(ValueError, match="no full-protocol study"):
        pages.render_summaries("<!-- study-summary: no_such_method -->", pages.load_studies())


def test_study_summary_from_a_named_folder_quotes_that_study():
    """``<!-- study-summary: ... from FOLDER -->`` reads ``studies/FOLDER/results.json``; a
    folder that is not there is an error, not an empty table."""
    folder = "2026-12-05-wordnet-tokens"
    md = pages.render_summaries(f"<!-- study-summary: density ensemble from {folder} -->",
                                pages.load_studies())  # fmt: skip
    raw = json.loads((ROOT / "studies" / folder / "results.json").read_text())
    assert f"(results/{folder}.md)" in md and "<!--" not in md
    rows = [line for line in md.splitlines() if line.startswith("| ") and "<br>" in line]
    assert len(rows) == 2
    for row, m in zip(rows, ["density", "ensemble"], strict=True):
        want = raw["datasets"]["wordnet"]["pooled"][m]["auroc_primary"]["mean"]
        assert float(row.split("|")[5].split("<br>")[0]) == pytest.approx(want, abs=5e-4)
    with pytest.raises(ValueError, match="no study folder"):
        pages.render_summaries("<!-- study-summary: density from no-such-study -->", [])
