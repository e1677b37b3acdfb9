"""Publish a study run as a study of the repository (``make docs-results``).

Copies ``<run>/results.json``, ``report.md`` and the summary figures into
``studies/<date>-<kind>-<version>/`` with a ``README.md`` saying when the run was made, with which
bayesattn / Python / torch, and whether it used the default settings of ``bayesattn study`` or a
quick smoke run; ``studies/README.md`` is rewritten. The site renders every study folder as a
results page (``docs/study_pages.py``). Figures wider than ``MAX_WIDTH`` pixels are scaled down.

Usage: python docs/publish_results.py [--from bayesattn-study] [--to studies]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import shutil
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MAX_WIDTH = 1000  # pixels


def settings_kind(config: dict[str, Any]) -> str:
    """``"default"``, ``"quick"`` or ``"custom"``: how a run's config compares with the presets of
    :class:`bayesattn.study.StudyConfig` (the output folder and progress bar do not count)."""
    from bayesattn.study import StudyConfig
    from bayesattn.study.legacy import upgrade_config

    config = upgrade_config(config)  # a run from before a method's rename: current names

    def same(preset: Any) -> bool:
        for f in dataclasses.fields(preset):
            if f.name in ("out", "progress") or f.name not in config:
                continue
            want = getattr(preset, f.name)
            want = list(want) if isinstance(want, tuple | list) else want
            if json.loads(json.dumps(want)) != config[f.name]:
                return False
        return True

    if same(StudyConfig()):
        return "default"
    if same(StudyConfig.quick()):
        return "quick"
    return "custom"


def copy_figure(src: Path, dest: Path) -> None:
    """Copy one figure, scaled down to ``MAX_WIDTH`` pixels wide if it is wider (PNG only)."""
    if src.suffix.lower() != ".png":
        shutil.copyfile(src, dest)
        return
    from PIL import Image

    with Image.open(src) as im:
        if im.width > MAX_WIDTH:
            im = im.resize((MAX_WIDTH, round(im.height * MAX_WIDTH / im.width)), Image.LANCZOS)
        im.save(dest, optimize=True)


#: how the README of a published run names it, and the command it gives, by settings kind
_KINDS = {
    "default": ("The default study of {version}", "bayesattn study    # make study"),
    "quick": ("A quick smoke run of {version} (not results)", "bayesattn study --quick"),
    "custom": (
        "A study with custom settings, {version}",
        'bayesattn study ...    # the settings: "config" in results.json',
    ),
}


def publish(run: Path, studies: Path = ROOT / "studies") -> Path:
    """Copy a study run into ``studies/<date>-<kind>-<version>/`` (its ``results.json``,
    ``report.md`` and the summary figures ``results.json`` lists, scaled down) with a
    ``README.md`` saying when, by which bayesattn and with which settings it was made; the site
    shows it as a results page. Rewrites ``studies/README.md``. Returns the new folder."""
    report, results_file = run / "report.md", run / "results.json"
    for f in (report, results_file):
        if not f.is_file():
            raise FileNotFoundError(f"{f} not found: run `bayesattn study` (or `make study`) first")
    results = json.loads(results_file.read_text(encoding="utf-8"))
    import bayesattn

    env = results.get("environment", {})
    version = env.get("bayesattn", bayesattn.__version__)
    stamp = dt.datetime.fromtimestamp(report.stat().st_mtime, dt.UTC)
    kind = settings_kind(results.get("config", {})) if results.get("config") else "custom"
    dest = studies / f"{stamp:%Y-%m-%d}-{kind}-{version}"
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    shutil.copyfile(results_file, dest / "results.json")
    shutil.copyfile(report, dest / "report.md")
    for block in results.get("datasets", {}).values():
        for name in block.get("figures", {}).values():
            if (run / name).is_file():
                copy_figure(run / name, dest / name)
    title, command = _KINDS[kind]
    runtime = ", ".join(f"{k} {v}" for k, v in env.items() if k != "bayesattn")
    summary = (
        f"Produced {stamp:%Y-%m-%d %H:%M} UTC by bayesattn {version}"
        + (f" ({runtime})" if runtime else "")
        + "; published with `make docs-results`."
        + {
            "default": " The settings of `bayesattn study` without options.",
            "quick": " A smoke run: few epochs, runs and members; its numbers say nothing about "
            "the methods.",
            "custom": " Not the default settings; `report.md` lists them.",
        }[kind]
    )
    (dest / "README.md").write_text(
        f"# {title.format(version=version)}\n\n{summary}\n\n```bash\n{command}\n```\n",
        encoding="utf-8",
    )
    pages = _study_pages()
    (studies / "README.md").write_text(pages.readme(pages.load_studies(studies)), encoding="utf-8")
    return dest


def _study_pages():
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "_docs_study_pages", Path(__file__).with_name("study_pages.py")
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "--from", dest="run", default="bayesattn-study", help="the study's --out folder"
    )
    ap.add_argument("--to", dest="dest", default=str(ROOT / "studies"), help="the studies folder")
    args = ap.parse_args(argv)
    try:
        folder = publish(Path(args.run), Path(args.dest))
    except FileNotFoundError as e:
        print(f"docs-results: {e}", file=sys.stderr)
        return 1
    print(f"docs-results: {folder} from {args.run}; the site shows it under Results")
    return 0


if __name__ == "__main__":
    sys.exit(main())
