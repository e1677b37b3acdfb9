"""Packaging: one version, typed, licensed."""

from importlib import metadata
from pathlib import Path

import bayesattn

ROOT = Path(__file__).resolve().parents[2]


def test_version_lives_in_one_place():
    assert metadata.version("bayesattn") == bayesattn.__version__
    assert "version =" not in (ROOT / "pyproject.toml").read_text().split("[project]")[1].split(
        "dependencies"
    )[0]


def test_typed_and_licensed():
    assert (Path(bayesattn.__file__).parent / "py.typed").exists()
    assert "MIT License" in (ROOT / "LICENSE").read_text()
    assert f"## {bayesattn.__version__}" in (ROOT / "CHANGELOG.md").read_text()
