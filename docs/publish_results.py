"""Publish a study run's report in the docs: ``docs/results/`` (``make docs-results``).

Copies ``<run>/report.md`` as it is (its headings one level down, under the page's own title) and
the figures it links to into ``docs/results/``, above a note saying when the run was made, with
which bayesattn / Python / torch, and whether it used the default settings of ``bayesattn study``
or a quick smoke run. Figures wider than ``MAX_WIDTH`` pixels are scaled down. The previous
publication is replaced.

Usage: python docs/publish_results.py [--from bayesattn-study] [--to docs/results]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import re
import shutil
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MAX_WIDTH = 1000  # pixels
_IMAGE = re.compile(r"!\[(?P<alt>[^\]]*)\]\((?P<src>[^)\s]+)\)")
_FENCE = re.compile(r"^(```|~~~)")


def settings_kind(config: dict[str, Any]) -> str:
    """``"default"``, ``"quick"`` or ``"custom"``: how a run's config compares with the presets of
    :class:`bayesattn.study.StudyConfig` (the output folder and progress bar do not count)."""
    from bayesattn.study import StudyConfig

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


def shift_headings(markdown: str) -> str:
    """Every ATX heading one level down (``#`` -> ``##``), code blocks untouched; the report's
    first top-level heading is dropped (the page has its own title)."""
    out, in_code, dropped = [], False, False
    for line in markdown.splitlines():
        if _FENCE.match(line):
            in_code = not in_code
        elif not in_code and line.startswith("#"):
            if line.startswith("# ") and not dropped:
                dropped = True
                continue
            line = "#" + line
        out.append(line)
    return "\n".join(out) + "\n"


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


def publish(run: Path, dest: Path) -> list[str]:
    """Write ``dest/index.md`` and the figures from ``run``; returns the figure names."""
    report = run / "report.md"
    if not report.is_file():
        raise FileNotFoundError(
            f"{report} not found: run `bayesattn study` (or `make study`) first"
        )
    results = (
        json.loads((run / "results.json").read_text()) if (run / "results.json").is_file() else {}
    )
    import bayesattn

    env = results.get("environment", {})
    version = env.get("bayesattn", bayesattn.__version__)
    made = dt.datetime.fromtimestamp(report.stat().st_mtime, dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    kind = settings_kind(results.get("config", {})) if results.get("config") else "custom"

    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.iterdir():
        if old.is_file():
            old.unlink()
    figures: list[str] = []

    def relink(m: re.Match[str]) -> str:
        src = m["src"]
        if "://" in src or src.startswith("/"):
            return m[0]
        name = Path(src).name
        if (run / src).is_file():
            copy_figure(run / src, dest / name)
            figures.append(name)
        return f"![{m['alt']}]({name})"

    body = _IMAGE.sub(relink, shift_headings(report.read_text(encoding="utf-8")))
    runtime = ", ".join(f"{k} {v}" for k, v in env.items() if k != "bayesattn")
    note = {
        "default": '!!! info "The default study"\n    The latest run of `bayesattn study` with its '
        "default settings (`make study`).",
        "quick": '!!! warning "A quick smoke run"\n    These numbers come from `bayesattn study '
        "--quick` (few epochs, seeds and ensemble members): they show the report's form, not the "
        "study's results. `make study && make docs-results` publishes the default run.",
        "custom": '!!! note "A run with custom settings"\n    Not the default settings of '
        "`bayesattn study`; the report below lists them.",
    }[kind]
    header = (
        "# Results\n\n"
        "The report of the uncertainty study (`bayesattn study`, see "
        "[Uncertainty and calibration](../uncertainty.md)), as the study wrote it.\n\n"
        f"{note}\n\n"
        f"Produced {made} by bayesattn {version}" + (f" ({runtime})" if runtime else "") + "; "
        "published with `make docs-results`.\n\n"
    )
    (dest / "index.md").write_text(header + body, encoding="utf-8")
    return figures


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "--from", dest="run", default="bayesattn-study", help="the study's --out folder"
    )
    ap.add_argument("--to", dest="dest", default=str(ROOT / "docs" / "results"))
    args = ap.parse_args(argv)
    try:
        figures = publish(Path(args.run), Path(args.dest))
    except FileNotFoundError as e:
        print(f"docs-results: {e}", file=sys.stderr)
        return 1
    print(f"docs-results: {args.dest}/index.md with {len(figures)} figures from {args.run}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
