"""The tests mirror the package: ``tests/<pkg>/`` holds the tests of ``bayesattn/<pkg>/`` (nested
folders likewise), ``tests/test_<module>.py`` those of a top-level module, and
``tests/cross_cutting/`` the tests of the package as a whole (docs, examples, notebooks, the study
end to end, layout, typing, deprecations, faults, fuzzing, pickling)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: the one folder of tests/ that is not named after a package of bayesattn
CROSS_CUTTING = "cross_cutting"


def mirror_problems(tests: Path, package: Path) -> list[str]:
    """What breaks the mirror rule in ``tests`` against ``package`` (empty when nothing does).

    * every folder under ``tests`` (but ``cross_cutting``) is named after a package under
      ``package``: ``tests/a/b`` needs ``package/a/b/__init__.py``;
    * every folder under ``tests`` is a Python package (``__init__.py``), so files of one name in
      two folders do not collide;
    * no file at the top of ``tests`` tests a subpackage (``test_<pkg>.py`` or
      ``test_<pkg>_*.py``): it belongs in ``tests/<pkg>/``.
    """
    problems: list[str] = []
    folders = sorted(
        p
        for p in tests.rglob("*")
        if p.is_dir()
        and not any(part.startswith((".", "__")) for part in p.relative_to(tests).parts)
    )
    for folder in folders:
        rel = folder.relative_to(tests)
        if not (folder / "__init__.py").is_file():
            problems.append(f"tests/{rel.as_posix()}/ has no __init__.py")
        if rel.parts[0] == CROSS_CUTTING:
            continue
        if not (package / rel / "__init__.py").is_file():
            problems.append(
                f"tests/{rel.as_posix()}/ mirrors no package {package.name}/{rel.as_posix()}/"
            )
    if not (tests / "__init__.py").is_file():
        problems.append("tests/ has no __init__.py")
    subpackages = {p.parent.name for p in package.glob("*/__init__.py")}
    for f in sorted(tests.glob("test_*.py")):
        stem = f.stem.removeprefix("test_")
        for sub in subpackages:
            if stem == sub or stem.startswith(sub + "_"):
                problems.append(
                    f"tests/{f.name} tests {package.name}.{sub}: move it to tests/{sub}/"
                )
    return problems


def test_the_tests_mirror_the_package():
    assert mirror_problems(ROOT / "tests", ROOT / "bayesattn") == []


def test_the_mirror_rule_catches_a_stray_folder_and_a_flat_file(tmp_path):
    """The check fails on a tree that breaks each part of the rule."""
    pkg, tests = tmp_path / "bayesattn", tmp_path / "tests"
    for d in (pkg / "nn", pkg / "study", tests / "nn", tests / "kernels", tests / CROSS_CUTTING):
        d.mkdir(parents=True)
        (d / "__init__.py").touch()
    (tests / "__init__.py").touch()
    (tests / "nn" / "extra").mkdir()  # no package bayesattn/nn/extra, and no __init__.py
    (tests / "test_study_stats.py").touch()  # a study test at the top
    (tests / "test_priors.py").touch()  # a top-level module's test: fine
    assert mirror_problems(tests, pkg) == [
        "tests/kernels/ mirrors no package bayesattn/kernels/",
        "tests/nn/extra/ has no __init__.py",
        "tests/nn/extra/ mirrors no package bayesattn/nn/extra/",
        "tests/test_study_stats.py tests bayesattn.study: move it to tests/study/",
    ]
    (tests / "__init__.py").unlink()
    assert "tests/ has no __init__.py" in mirror_problems(tests, pkg)
