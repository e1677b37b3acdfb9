"""The study results pages of the site, generated from ``studies/<folder>/results.json``.

Every folder of ``studies/`` is one study: a ``README.md`` (its first ``#`` line is the title, the
paragraph under it says what the study measured, the first ``bash`` block is the command) and one
``results.json`` as ``bayesattn study`` wrote it, either in the folder or in its sub-folders (one
per dataset, when a study ran in parts). From them, with no number typed by hand:

* :func:`study_page`: one page per study (``results/<folder>.md`` in the site) — the set-up, the
  time it took, and per dataset short tables (mean and 95% t-interval over runs; paired
  differences against the deterministic network and the ensemble, **bold** when they resolve
  after Holm's correction) and the summary figures the study kept;
* :func:`summary_section`: a few methods' accuracy, NLL and held-out AUROC on every dataset of
  the newest full-protocol study that ran them, for a page that quotes them (the marker
  ``<!-- study-summary: METHOD ... [from FOLDER] -->`` of a top-level docs page);
* :func:`index_table`: the list of studies (date, what it measured, runs, time, command), on the
  site's Results page and in ``studies/README.md``.

``docs/hooks.py`` adds the pages, their figures and a nav entry each at build time.
``python docs/study_pages.py`` rewrites ``studies/README.md``; ``--check`` exits 1 when it is not
current (the tests run it).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
STUDIES = ROOT / "studies"
README_MARKER = "<!-- studies-index -->"


def _legacy() -> Any:
    """``bayesattn/study/legacy.py`` (the method renames; standard library only), loaded by path:
    the pages build without importing the library."""
    path = ROOT / "bayesattn" / "study" / "legacy.py"
    spec = importlib.util.spec_from_file_location("_docs_study_legacy", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


#: a ``results.json`` with its method names current (an old study's ``recommended`` is shown as
#: ``last_layer``, the name the method has now)
upgrade_results = _legacy().upgrade_results

_DATE = re.compile(r"^(\d{4}-\d{2}-\d{2})-")
_BASH = re.compile(r"^```bash\n(.*?)^```", re.S | re.M)

#: (key in ``pooled``, column title, decimals) per table; a column appears when a method has it
QUALITY = [("accuracy", "acc", 3), ("nll", "NLL", 3), ("ece", "ECE", 3), ("brier", "Brier", 3)]
HELD_OUT = [
    ("auroc_primary", "AUROC", 3),
    ("primary_score", "by", 0),
    ("auroc_entropy", "by entropy", 3),
]
SHIFT = [
    ("auroc_far", "far sets", 3),
    ("auroc_far_moments", "moments", 3),
    ("auroc_shift", "shift", 3),
    ("corruption_accuracy_mean", "acc shifted", 3),
]
SHIFT_OLD = [  # studies before the near / far / shift tables: AUROC by entropy
    ("far_auroc_uniform", "uniform", 3),
    ("far_auroc_inverted", "inverted", 3),
    ("corruption_auroc_mean", "shift", 3),
    ("corruption_accuracy_mean", "acc shifted", 3),
]
COST = [
    ("train_seconds", "train s", 1),
    ("infer_ms_batch512", "ms/example", 3),
    ("infer_ms_batch1", "ms batch 1", 2),
    ("wall_seconds", "wall s", 1),
]
KL = [("kl_global", "KL global", 0), ("kl_local", "KL local", 3)]
PAIRED = [("accuracy", "Δ acc", 3), ("nll", "Δ NLL", 3), ("ece", "Δ ECE", 3)]
DATASET_NAMES = {"digits": "Digits", "mnist1d": "MNIST-1D", "fortunes": "Fortunes (tokens)"}


@dataclass
class Study:
    """One folder of ``studies/``: its README's title, summary and command, and its results."""

    folder: str
    title: str
    summary: str
    command: str
    results: list[dict[str, Any]] = field(default_factory=list)
    root: Path = STUDIES

    @property
    def date(self) -> str:
        m = _DATE.match(self.folder)
        return m[1] if m else ""

    @property
    def slug(self) -> str:
        return self.folder

    def datasets(self) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
        """``(name, dataset block, results.json)`` for every dataset of every part (none for a
        benchmark's report folder, whose ``results.json`` is not a ``bayesattn study``'s)."""
        return [(n, block, r) for r in self.results for n, block in r.get("datasets", {}).items()]

    @property
    def is_report(self) -> bool:
        """A benchmark's study-style folder (e.g. ``benchmarks/alignment.py``): its page is its
        own ``report.md``, generated from its ``results.json`` by the benchmark."""
        return not any("datasets" in r for r in self.results)

    def seconds(self) -> float:
        return sum(
            float(r.get("seconds", r.get("meta", {}).get("wall_s", 0.0))) for r in self.results
        )

    def runs(self) -> int:
        if self.is_report:
            return sum(len(r.get("per_seed", [])) for r in self.results)
        return sum(len(block.get("runs", [])) for _, block, _ in self.datasets())


def read_readme(text: str) -> tuple[str, str, str]:
    """``(title, summary, command)`` of a study's README: the first ``#`` heading, the first
    paragraph after it and the first ``bash`` block (empty strings where one is missing)."""
    lines = text.splitlines()
    title, start = "", 0
    for i, line in enumerate(lines):
        if line.startswith("# "):
            title, start = line[2:].strip(), i + 1
            break
    para: list[str] = []
    for line in lines[start:]:
        if not line.strip():
            if para:
                break
            continue
        if line.startswith(("```", "#")):
            break
        para.append(line.strip())
    m = _BASH.search(text)
    return title, " ".join(para), (m[1].strip() if m else "")


def load_studies(root: Path = STUDIES) -> list[Study]:
    """Every study folder under ``root`` (sorted by name, so by date), with its results.

    Raises ``ValueError`` for a folder without a README title or without any ``results.json``:
    every study in the index says what it is."""
    studies = []
    for d in sorted(p for p in root.iterdir() if p.is_dir()):
        readme = d / "README.md"
        if not readme.is_file():
            raise ValueError(f"studies/{d.name}: no README.md (title, summary, command)")
        title, summary, command = read_readme(readme.read_text(encoding="utf-8"))
        if not title or not summary:
            raise ValueError(
                f"studies/{d.name}/README.md: needs a '# title' and a paragraph under it"
            )
        files = sorted(d.glob("results.json")) or sorted(d.glob("*/results.json"))
        if not files:
            raise ValueError(f"studies/{d.name}: no results.json (in it or one folder down)")
        results = [upgrade_results(json.loads(f.read_text(encoding="utf-8"))) for f in files]
        for f, r in zip(files, results, strict=True):
            r["_dir"] = f.parent.relative_to(d).as_posix()
        studies.append(Study(d.name, title, summary, command, results, root))
    return studies


# --- formatting -------------------------------------------------------------------------------


def minutes(seconds: float) -> str:
    """``"6.4 min"``, or ``"2 h 45 min"`` from an hour on."""
    m = seconds / 60
    if m < 60:
        return f"{m:.1f} min"
    return f"{int(m // 60)} h {round(m % 60):d} min"


def _signed(x: float, digits: int) -> str:
    return f"{x:+.{digits}f}".replace("-", "−")


def stat_cell(r: Any, digits: int) -> str:
    """A pooled statistic: the mean, and under it (small) the half-width of its 95% interval;
    a name as it is; ``–`` for a missing value."""
    if r is None:
        return "–"
    if isinstance(r, str):
        return r
    mean, hw = r.get("mean"), r.get("half_width")
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return "–"
    text = f"{mean:,.{digits}f}" if abs(mean) >= 1000 else f"{mean:.{digits}f}"
    if hw is None or math.isnan(hw) or r.get("n", 2) < 2 or hw == 0:
        return text
    h = f"{hw:,.{digits}f}" if abs(hw) >= 1000 else f"{hw:.{digits}f}"
    return f"{text}<br><small>± {h}</small>"


def diff_cell(r: Any, digits: int) -> str:
    """A paired difference: its mean (bold when it resolves) and under it the 95% interval."""
    if r is None or r.get("mean") is None or math.isnan(r["mean"]):
        return "–"
    mean = _signed(r["mean"], digits)
    mean = f"**{mean}**" if r.get("resolved") else mean
    lo, hi = r.get("lo"), r.get("hi")
    if lo is None or hi is None or math.isnan(lo):
        return mean
    return f"{mean}<br><small>[{_signed(lo, digits)}, {_signed(hi, digits)}]</small>"


def _present(
    pooled: dict[str, Any], cols: list[tuple[str, str, int]]
) -> list[tuple[str, str, int]]:
    """The columns some method has a value for (KL: a value other than 0)."""
    out = []
    for key, title, digits in cols:
        vals = [r.get(key) for r in pooled.values()]
        if key.startswith("kl_"):
            vals = [v for v in vals if isinstance(v, dict) and v.get("mean")]
        if any(v is not None for v in vals):
            out.append((key, title, digits))
    return out


def table(
    rows: dict[str, dict[str, Any]], cols: list[tuple[str, str, int]], cell=stat_cell
) -> list[str]:
    """A Markdown table, one row per method (rows without any value left out)."""
    lines = ["| method | " + " | ".join(c[1] for c in cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for method, r in rows.items():
        cells = [cell(r.get(k), d) for k, _, d in cols]
        if all(c == "–" for c in cells):
            continue
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return lines


def _ordered(rows: dict[str, Any], methods: list[str]) -> dict[str, Any]:
    """``rows`` in the study's method order (its ``--methods``), then any others by name."""
    order = [m for m in methods if m in rows] + sorted(m for m in rows if m not in methods)
    return {m: rows[m] for m in order}


def _score_name(pooled: dict[str, Any]) -> dict[str, Any]:
    return {
        m: {
            **r,
            "primary_score": {"own": "own score"}.get(
                r.get("primary_score"), r.get("primary_score")
            ),
        }
        for m, r in pooled.items()
    }


# --- pages ------------------------------------------------------------------------------------


def _setup_line(study: Study) -> str:
    parts = []
    for r in study.results:
        pairs, seeds = r.get("pairs", []), r.get("seeds", [])
        names = ", ".join(DATASET_NAMES.get(n, n) for n in r["datasets"])
        parts.append(
            f"{names}: {len(pairs)} held-out class pair{'s' * (len(pairs) != 1)} × "
            f"{len(seeds)} seed{'s' * (len(seeds) != 1)}, {len(r.get('methods', []))} methods"
        )
    env = study.results[0].get("environment", {})
    runtime = ", ".join(f"{k} {v}" for k, v in env.items())
    return (
        "; ".join(parts)
        + f". {study.runs()} runs in all, **{minutes(study.seconds())}** of wall time"
        + (f" ({runtime})" if runtime else "")
        + "."
    )


def dataset_section(
    name: str, block: dict[str, Any], results: dict[str, Any], study: Study
) -> list[str]:
    """The tables and figures of one dataset of a study."""
    methods = list(results.get("methods", []))
    pooled = _ordered(_score_name(block["pooled"]), methods)
    new = any("auroc_far" in r for r in pooled.values())
    n = len(block.get("runs", []))
    out = [
        f"## {DATASET_NAMES.get(name, name)}",
        "",
        f"{n} runs, {minutes(float(block.get('seconds', 0.0)))}. Mean over runs; under it, ± the "
        "half-width of the 95% t-interval.",
        "",
    ]
    sections = [
        ("Accuracy and calibration", QUALITY),
        ("Held-out classes: AUROC by each method's primary score", HELD_OUT),
        (
            "Far and shifted inputs: AUROC by the primary score"
            if new
            else "Far and shifted inputs: AUROC by entropy",
            SHIFT if new else SHIFT_OLD,
        ),
        ("What the posterior learned (nats)", KL),
        ("Cost", COST),
    ]
    for title, cols in sections:
        present = _present(pooled, cols)
        if not present:
            continue
        out += [f"**{title}**", "", *table(pooled, present), ""]
    for ref in ("deterministic", "ensemble"):
        paired = _ordered(block.get("paired", {}).get(ref, {}), methods)
        if not paired:
            continue
        score = next(iter(paired.values()))
        auroc = "auroc_primary" if "auroc_primary" in score else "auroc_entropy"
        cols = [*PAIRED, (auroc, "Δ AUROC", 3)]
        out += [
            f"**Against {ref}** (method − {ref}, same pair and seed; **bold** = resolved after "
            "Holm's correction)",
            "",
            *table(paired, _present(paired, cols), cell=diff_cell),
            "",
        ]
    base = study.root / study.folder / results["_dir"]
    for kind, fname in block.get("figures", {}).items():
        if (base / fname).is_file():
            label = kind.replace("_", " ")
            out += [f"![{label}: {name}]({figure_uri(study, results, fname)})", ""]
    return out


def figure_uri(study: Study, results: dict[str, Any], fname: str) -> str:
    """A figure's path relative to the study's page (``results/<folder>.md``)."""
    sub = results["_dir"]
    return f"{study.slug}/" + (f"{sub}/" if sub != "." else "") + fname


def figures(study: Study) -> list[tuple[str, Path]]:
    """``(path under results/, file)`` of every summary figure a study's pages show."""
    out = []
    if study.is_report:
        folder = study.root / study.folder
        return [(f"{study.slug}/{f.name}", f) for f in sorted(folder.glob("*.png"))]
    for _, block, r in study.datasets():
        for fname in block.get("figures", {}).values():
            src = study.root / study.folder / r["_dir"] / fname
            if src.is_file():
                out.append((figure_uri(study, r, fname), src))
    return out


def report_page(study: Study) -> str:
    """The page of a benchmark's report folder: its ``report.md`` (generated from its
    ``results.json`` by the benchmark), figures linked from the page's folder."""
    text = (study.root / study.folder / "report.md").read_text(encoding="utf-8")
    text = re.sub(r"\]\((?!https?:|/|#)([^)]+\.png)\)", rf"]({study.slug}/\1)", text)
    body = re.sub(r"\A# .*\n", "", text)  # the report's own title: the page has the README's
    head = [
        f"# {study.title}",
        "",
        study.summary,
        "",
        f"**Run** {study.date}: {study.runs()} seeds, **{minutes(study.seconds())}** of wall time. "
        f"Files: `studies/{study.folder}/`.",
        "",
    ]
    if study.command:
        head += ["```bash", study.command, "```", ""]
    return "\n".join(head) + body.lstrip("\n").rstrip() + "\n"


def study_page(study: Study) -> str:
    """The Markdown of one study's page."""
    if study.is_report:
        return report_page(study)
    out = [
        f"# {study.title}",
        "",
        study.summary,
        "",
        f"**Run** {study.date}. {_setup_line(study)} Files: `studies/{study.folder}/` "
        "(`results.json` holds every run's numbers and the configuration).",
        "",
    ]
    if study.command:
        out += ["```bash", study.command, "```", ""]
    for name, block, r in study.datasets():
        out += dataset_section(name, block, r, study)
    return "\n".join(out).rstrip() + "\n"


SUMMARY_MARKER = re.compile(
    r"<!-- study-summary: (?P<methods>[\w ]+?)(?: from (?P<folder>[\w.-]+))? -->"
)
SUMMARY = [("accuracy", "acc", 3), ("nll", "NLL", 3), ("auroc_primary", "AUROC", 3)]


def newest_full_study(studies: list[Study], methods: list[str]) -> Study:
    """The newest ``*full-protocol*`` study whose every dataset ran ``methods`` (of one date,
    the one with the most runs)."""
    for s in sorted(studies, key=lambda s: (s.date, s.runs()), reverse=True):
        sets = s.datasets()
        if (
            "full-protocol" in s.folder
            and sets
            and all(m in block["pooled"] for _, block, _ in sets for m in methods)
        ):
            return s
    raise ValueError(f"no full-protocol study in studies/ ran every one of {methods}")


def summary_section(studies: list[Study], methods: list[str], folder: str | None = None) -> str:
    """One narrow table (dataset, method, accuracy, NLL, held-out AUROC by the method's primary
    score) from the newest full-protocol study that ran ``methods`` (or the study in
    ``studies/<folder>``), and a link to its page (relative to a top-level docs page)."""
    if folder is None:
        study = newest_full_study(studies, methods)
    else:
        found = [s for s in studies if s.folder == folder]
        if not found:
            raise ValueError(f"study-summary: no study folder {folder!r} in studies/")
        study = found[0]
    lines = ["| data | method | " + " | ".join(c[1] for c in SUMMARY) + " |",
             "|---" * (len(SUMMARY) + 2) + "|"]  # fmt: skip
    for name, block, _ in study.datasets():
        shown = [m for m in methods if m in block["pooled"]]  # methods for words: not on images
        if not shown:
            raise ValueError(f"study-summary: {study.folder} ran none of {methods} on {name}")
        for i, m in enumerate(shown):
            cells = [stat_cell(block["pooled"][m].get(k), d) for k, _, d in SUMMARY]
            label = DATASET_NAMES.get(name, name).removesuffix(" (tokens)") if i == 0 else ""
            lines.append(f"| {label} | {m} | " + " | ".join(cells) + " |")
    runs = {len(block.get("runs", [])) for _, block, _ in study.datasets()}
    n = "/".join(str(r) for r in sorted(runs))
    lines += ["", f"*{n} runs a dataset; from [{study.title}](results/{study.slug}.md), "
              f"run {study.date}.*"]  # fmt: skip
    return "\n".join(lines) + "\n"


def render_summaries(markdown: str, studies: list[Study]) -> str:
    """``markdown`` with every ``<!-- study-summary: METHOD ... -->`` replaced by its table."""
    return SUMMARY_MARKER.sub(
        lambda m: summary_section(studies, m["methods"].split(), m["folder"]), markdown
    )


def index_table(studies: list[Study], link: bool) -> str:
    """The list of studies, newest first: date, title (a link to its page when ``link``), runs
    and wall time."""
    lines = ["| date | study | runs | time |", "|---|---|---|---|"]
    nb = str.maketrans({"-": "\u2011", " ": "\u00a0"})  # no line break inside a date or a time
    for s in reversed(studies):
        name = f"[{s.title}]({s.slug}.md)" if link else f"[{s.title}]({s.folder}/)"
        lines.append(
            f"| {s.date.translate(nb)} | {name} | {s.runs()} | {minutes(s.seconds()).translate(nb)} |"
        )
    return "\n".join(lines) + "\n"


def index_details(studies: list[Study], link: bool) -> str:
    """Per study, newest first: what it measured and the command that ran it."""
    out = []
    for s in reversed(studies):
        name = f"[{s.title}]({s.slug}.md)" if link else f"[{s.title}]({s.folder}/)"
        out += [f"**{name}** ({s.date}). {s.summary}", ""]
        if s.command:
            out += ["```bash", s.command, "```", ""]
    return "\n".join(out)


def readme(studies: list[Study]) -> str:
    """``studies/README.md``."""
    return (
        "# Studies\n\n"
        "Every folder is one run of `bayesattn study` (or several merged), or a benchmark's study-style "
        "report (the alignment benchmark): its `README.md` says what "
        "it measured and how it was run, its `results.json` holds every run's numbers and the "
        "configuration, `report.md` is the study's own report. The site has a page per study, "
        "generated from `results.json` (`docs/study_pages.py`). This list is generated too: "
        "`python docs/study_pages.py` rewrites it.\n\n"
        + index_table(studies, link=False)
        + "\n"
        + index_details(studies, link=False)
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "--check", action="store_true", help="exit 1 if studies/README.md is not current"
    )
    args = ap.parse_args(argv)
    text = readme(load_studies())
    path = STUDIES / "README.md"
    if args.check:
        current = path.is_file() and path.read_text(encoding="utf-8") == text
        if not current:
            print(
                "studies/README.md is not current: run python docs/study_pages.py", file=sys.stderr
            )
        return 0 if current else 1
    path.write_text(text, encoding="utf-8")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
