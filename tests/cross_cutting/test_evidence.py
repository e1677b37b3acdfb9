"""Published evidence is current: every executed notebook, every committed benchmark result and the
newest default study in ``studies/`` were produced by this minor version of bayesattn (or a later one), and notebooks
carry the code hash of a real run (no hand-edited hashes). A page older than the package's minor
version fails here: regenerate it (``make notebooks``, ``make bench``, ``make study &&
make docs-results``)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import bayesattn

ROOT = Path(__file__).resolve().parents[2]


def _minor(version: str) -> tuple[int, int]:
    m = re.match(r"(\d+)\.(\d+)", version)
    if m is None:
        raise ValueError(f"not a version: {version!r}")
    return int(m[1]), int(m[2])


CURRENT = _minor(bayesattn.__version__)


def _check(what: str, version: str | None) -> None:
    assert version is not None, f"{what} records no bayesattn version"
    assert _minor(version) >= CURRENT, (
        f"{what} was produced by bayesattn {version}, older than {bayesattn.__version__}: "
        "regenerate it"
    )


def test_minor_version_comparison():
    assert _minor("0.5.0") == (0, 5) and _minor("1.12.3rc1") == (1, 12)
    with pytest.raises(AssertionError, match="older than"):
        _check("a page", f"{CURRENT[0]}.{CURRENT[1] - 1}.9" if CURRENT[1] else "-1.0")
    with pytest.raises(AssertionError, match="no bayesattn version"):
        _check("a page", None)


@pytest.mark.parametrize("path", sorted((ROOT / "notebooks").glob("*.ipynb")), ids=lambda p: p.name)
def test_notebooks_are_current_runs(path: Path):
    meta = json.loads(path.read_text())["metadata"].get("bayesattn", {})
    _check(path.name, meta.get("version"))
    assert not meta.get("smoke"), f"{path.name} holds a smoke run"
    assert "hash_note" not in meta, f"{path.name}: its code hash was edited by hand; re-execute it"


@pytest.mark.parametrize(
    "path", sorted((ROOT / "benchmarks" / "results").glob("*.json")), ids=lambda p: p.name
)
def test_benchmark_results_are_current(path: Path):
    _check(path.name, json.loads(path.read_text())["meta"].get("bayesattn"))


def test_newest_default_study_is_current():
    """The newest run of the default study in ``studies/`` (``make docs-results`` names its
    folder ``<date>-default-<version>``) was made by this minor version."""
    folders = sorted(
        (p for p in (ROOT / "studies").glob("*-default-*") if p.is_dir()),
        key=lambda p: p.name[:10],
    )
    assert folders, "no default study in studies/: run `make study && make docs-results`"
    m = re.search(r"-default-(\d+\.\d+\S*)$", folders[-1].name)
    _check(f"studies/{folders[-1].name}", m[1] if m else None)
