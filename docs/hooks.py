"""MkDocs hooks (``hooks:`` in mkdocs.yml): an offline site, and benchmark numbers rendered as tables.

* MathJax 2.7 ships inside the ``jupyter-server-mathjax`` package; after the build its files are
  copied to ``site/assets/mathjax/``, which ``extra_javascript`` loads: formulas render offline.
* Notebook pages (mkdocs-jupyter) carry nbconvert's CDN scripts (MathJax, mermaid); they are
  removed: the site's own MathJax typesets the notebooks' maths too.
* ``docs/benchmarks.md`` holds the marker ``<!-- benchmark-results -->``; it is replaced by every
  ``benchmarks/results/*.json`` (schema in ``benchmarks/_results.py``) rendered as Markdown tables,
  with a line plot for each table whose first column is a numeric sweep (T, S, lengths, ...) and
  the figures a result file lists (files beside it).
* A page may hold ``<!-- benchmark-result: NAME -->``: replaced by ``benchmarks/results/NAME.json``
  alone, rendered the same way (a page that quotes one benchmark's numbers, e.g. ``alignments.md``).
* Study pages (``docs/study_pages.py``): every folder of ``studies/`` becomes a page
  ``results/<folder>.md`` generated from its ``results.json``, with its summary figures, listed
  in the nav under "Results"; ``docs/results/index.md`` holds the marker
  ``<!-- studies-index -->``, replaced by the list of studies. The landing page's figure
  (``img/hero.png``, ``docs/figures.py``) is drawn from the newest full-protocol study.
* A page may hold ``<!-- study-summary: METHOD ... -->``: replaced by those methods' accuracy,
  NLL and held-out AUROC on every dataset of the newest full-protocol study that ran them, or of
  the study named by ``from FOLDER`` (``study_pages.summary_section``), so a page quotes study
  numbers without typing them.
* ``docs/changelog.md`` holds the marker ``<!-- changelog -->``; it is replaced by the repository's
  ``CHANGELOG.md`` (its title dropped), so the version history lives on one page of the site.
"""

from __future__ import annotations

import functools
import html
import importlib.util
import json
import re
import shutil
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = ROOT / "benchmarks" / "results"
MARKER = "<!-- benchmark-results -->"
ONE_RESULT = re.compile(r"<!-- benchmark-result: (?P<name>[\w.-]+) -->")
CHANGELOG_MARKER = "<!-- changelog -->"
STUDIES_MARKER = "<!-- studies-index -->"
CHANGELOG = ROOT / "CHANGELOG.md"
PLOT_DIR = "benchmarks-plots"  # under site/

# nbconvert's <script src="https://...">, its MathJax configuration block, and the mermaid loader
_CDN_SCRIPT = re.compile(r"<script[^>]*\ssrc=\"(?:https?://[^\"]*)?\"[^>]*>\s*</script>", re.S)
_MATHJAX_CONFIG = re.compile(r"<script type=\"text/x-mathjax-config\">.*?</script>", re.S)
_MERMAID = re.compile(
    r"<script type=\"module\">(?:(?!</script>).)*mermaid(?:(?!</script>).)*</script>", re.S
)

_pending_plots: dict[str, Any] = {}
_pending_figures: list[Path] = []  # figure files listed by result files, copied into the site


def mathjax_dir() -> Path:
    """The MathJax 2.7 files inside the installed ``jupyter_server_mathjax`` package."""
    import jupyter_server_mathjax

    return Path(jupyter_server_mathjax.__file__).resolve().parent / "static"


def strip_cdn_scripts(page_html: str) -> str:
    """Remove script tags that load code from another host (or, with ``src=""``, the page itself),
    nbconvert's MathJax configuration and its mermaid loader."""
    for pattern in (_CDN_SCRIPT, _MATHJAX_CONFIG, _MERMAID):
        page_html = pattern.sub("", page_html)
    return page_html


def _portable(arg: str) -> str:
    """A command-line argument as a reader can use it: an absolute path (the build machine's)
    becomes its last part."""
    return Path(arg).name if Path(arg).is_absolute() else arg


def _cell(v: Any) -> str:
    if v is None:  # not run / not applicable: the row's note says why
        return "–"
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if v != v:  # NaN
            return "–"
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    return html.escape(str(v)).replace("|", "\\|")


def _number(v: Any) -> float | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int | float):
        return float(v)
    return None


def plottable(tab: dict[str, Any]) -> tuple[list[float], dict[str, list[float]]] | None:
    """``(x, {column: y})`` when the first column is a numeric sweep (>= 3 distinct values, one
    row each) and at least one other column is numeric in every row; else None. Only the ratio
    columns are plotted when there are any."""
    rows = tab["rows"]
    xs = [_number(r[0]) for r in rows]
    if len(rows) < 3 or any(x is None for x in xs) or len(set(xs)) != len(xs):
        return None
    ys = {}
    for j, col in enumerate(tab["columns"][1:], start=1):
        vals = [_number(r[j]) for r in rows]
        if all(v is not None for v in vals):
            ys[col] = [float(v) for v in vals if v is not None]
    if not ys:
        return None
    ratios = {k: v for k, v in ys.items() if "ratio" in k.lower() or "speed-up" in k.lower()}
    ys = ratios or ys  # ratios share one axis; absolute times only when there is no ratio
    return [float(x) for x in xs if x is not None], ys


def _img(title: str, name: str) -> str:
    # raw HTML: the file is written into the site after the build, not a docs file mkdocs checks
    alt = html.escape(title, quote=True)
    return f'<p><img class="bench-plot" alt="{alt}" src="../{PLOT_DIR}/{name}"></p>\n'


def script_of(doc: dict[str, Any]) -> str:
    """The script that wrote a result file: its recorded ``meta.script``, else (older files) the
    longest ``_``-prefix of the results name that is a script in ``benchmarks/`` (a results
    file named by ``--name``, ``alignment_context10``, comes from ``alignment.py``)."""
    script = doc.get("meta", {}).get("script")
    if script and script.endswith(".py"):
        return str(script)
    parts = str(doc["benchmark"]).split("_")
    for k in range(len(parts), 0, -1):
        name = "_".join(parts[:k]) + ".py"
        if (ROOT / "benchmarks" / name).is_file():
            return name
    return f"{doc['benchmark']}.py"


def render_results(
    results_dir: Path = RESULTS_DIR,
    plots: dict[str, Any] | None = None,
    figures: list[Path] | None = None,
    only: str | None = None,
) -> str:
    """Markdown for every result file (``only``: the file ``<only>.json`` alone): a heading, the
    run's machine line, its tables (and plots: ``plots`` collects ``{file name: (title, x label, x,
    ys)}`` for the hook to draw) and the figures it lists (``figures`` collects their paths, for
    the hook to copy)."""
    files = sorted(results_dir.glob("*.json" if only is None else f"{only}.json"))
    if not files:
        what = "benchmark results" if only is None else f"results of benchmarks/{only}.py"
        return f"*No {what} yet: run `make bench`.*\n"
    out: list[str] = []
    for f in files:
        doc = json.loads(f.read_text(encoding="utf-8"))
        m = doc.get("meta", {})
        out.append(f"### {html.escape(doc.get('title', doc['benchmark']))}\n")
        args = " ".join(_portable(a) for a in m.get("argv", [])) or "(defaults)"
        out.append(
            f"`benchmarks/{script_of(doc)} {args}` — run {m.get('date', '?')} on "
            f"{m.get('processor', '?')} ({m.get('cpus', '?')} CPUs), {m.get('threads', '?')} "
            f"torch thread(s); Python {m.get('python', '?')}, torch {m.get('torch', '?')}, "
            f"bayesattn {m.get('bayesattn', '?')}.\n"
        )
        for k, tab in enumerate(doc.get("tables", [])):
            out.append(f"**{html.escape(tab['title'])}**\n")
            out.append("| " + " | ".join(_cell(c) for c in tab["columns"]) + " |")
            out.append("|" + "|".join("---" for _ in tab["columns"]) + "|")
            out.extend("| " + " | ".join(_cell(c) for c in r) + " |" for r in tab["rows"])
            out.append("")
            xy = plottable(tab)
            if xy is not None and plots is not None:
                name = f"{doc['benchmark']}-{k}.svg"
                plots[name] = (tab["title"], tab["columns"][0], *xy)
                out.append(_img(tab["title"], name))
        for fig in doc.get("figures", []):
            src = results_dir / fig
            if src.is_file() and figures is not None:
                figures.append(src)
                out.append(_img(Path(fig).stem, Path(fig).name))
    return "\n".join(out) + "\n"


def draw_plot(
    path: Path, title: str, xlabel: str, x: list[float], ys: dict[str, list[float]]
) -> None:
    """One small SVG line plot: log x when the sweep spans a factor of 8 or more (ticks at the
    measured values), log y when the values do; the title without its parenthesised details."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.2))
    for label, y in ys.items():
        ax.plot(x, y, marker="o", label=label)
    if min(x) > 0 and max(x) / min(x) >= 8:
        ax.set_xscale("log", base=2)
        ax.set_xticks(x, [f"{v:g}" for v in x])
        ax.minorticks_off()
    values = [v for y in ys.values() for v in y if v == v]
    if values and min(values) > 0 and max(values) / min(values) >= 30:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_title(title.split(" (")[0], fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="svg", metadata={"Date": None})
    plt.close(fig)


# --- mkdocs events -----------------------------------------------------------------------------


def changelog_markdown(path: Path = CHANGELOG) -> str:
    """``CHANGELOG.md`` without its ``# Changelog`` title (the page has its own)."""
    text = path.read_text(encoding="utf-8")
    return re.sub(r"\A#\s+Changelog\s*\n", "", text, count=1)


def _docs_module(name: str) -> Any:
    """A script of ``docs/`` (not a package) as a module."""
    if f"_docs_{name}" in sys.modules:
        return sys.modules[f"_docs_{name}"]
    spec = importlib.util.spec_from_file_location(f"_docs_{name}", ROOT / "docs" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


@functools.cache
def _studies() -> list[Any]:
    return _docs_module("study_pages").load_studies()


def study_nav(nav: list[Any], studies: list[Any]) -> list[Any]:
    """``nav`` with its ``Results: results/index.md`` entry turned into a section: the index,
    then one page per study, newest first."""
    out = []
    for item in nav:
        if isinstance(item, dict) and item.get("Results") == "results/index.md":
            pages: list[Any] = [{"All studies": "results/index.md"}]
            pages += [
                {f"{s.date}: {s.title.replace('`', '')}": f"results/{s.slug}.md"}
                for s in reversed(studies)
            ]
            item = {"Results": pages}
        out.append(item)
    return out


def on_config(config: Any) -> Any:
    _studies.cache_clear()
    config["nav"] = study_nav(config["nav"], _studies())
    return config


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    pages = _docs_module("study_pages")
    for s in _studies():
        files.append(File.generated(config, f"results/{s.slug}.md", content=pages.study_page(s)))
        for uri, src in pages.figures(s):
            files.append(File.generated(config, f"results/{uri}", abs_src_path=str(src)))
    figures = _docs_module("figures")
    files.append(File.generated(config, "img/hero.png", content=figures.hero_png()))
    for f in list(files.documentation_pages()):
        if f.src_uri.endswith(".md") and not f.generated_by:
            files.append(File.generated(config, source_copy(f.src_uri), content=f.content_string))
    return files


def source_copy(src_uri: str) -> str:
    """Where a page's Markdown source is copied in the site (a "view the source" link)."""
    return f"_sources/{src_uri}.txt"


def repo_path(src_uri: str, generated: bool) -> str:
    """The path in the repository a page comes from: ``docs/<page>``, a notebook under
    ``notebooks/``, a study page's ``studies/<folder>/``."""
    if generated and src_uri.startswith("results/"):
        return f"studies/{src_uri.removeprefix('results/').removesuffix('.md')}/results.json"
    if src_uri.startswith("notebooks/"):
        return src_uri
    return f"docs/{src_uri}"


def on_page_context(context: Any, page: Any, config: Any, nav: Any) -> Any:
    generated = bool(page.file.generated_by)
    page.meta["repo_path"] = repo_path(page.file.src_uri, generated)
    if page.file.src_uri.endswith(".md") and not generated:
        page.meta["source_copy"] = source_copy(page.file.src_uri)
    return context


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if STUDIES_MARKER in markdown:
        pages = _docs_module("study_pages")
        markdown = markdown.replace(
            STUDIES_MARKER,
            pages.index_table(_studies(), link=True)
            + "\n"
            + pages.index_details(_studies(), link=True),
        )
    if "<!-- study-summary:" in markdown:
        markdown = _docs_module("study_pages").render_summaries(markdown, _studies())
    if CHANGELOG_MARKER in markdown:
        markdown = markdown.replace(CHANGELOG_MARKER, changelog_markdown())
    if MARKER in markdown:
        _pending_plots.clear()
        _pending_figures.clear()
        rendered = render_results(plots=_pending_plots, figures=_pending_figures)
        markdown = markdown.replace(MARKER, rendered)
    return ONE_RESULT.sub(lambda m: render_results(only=m.group("name")), markdown)


def on_post_page(output: str, page: Any, config: Any) -> str:
    if page.file.src_uri.endswith(".ipynb"):
        output = strip_cdn_scripts(output)
    return output


def on_post_build(config: Any) -> None:
    site = Path(config["site_dir"])
    shutil.copytree(mathjax_dir(), site / "assets" / "mathjax", dirs_exist_ok=True)
    for name, (title, xlabel, x, ys) in _pending_plots.items():
        draw_plot(site / PLOT_DIR / name, title, xlabel, x, ys)
    for fig in _pending_figures:
        (site / PLOT_DIR).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(fig, site / PLOT_DIR / fig.name)
