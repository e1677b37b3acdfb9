"""The documentation builds (``mkdocs build --strict``) and its Python snippets run.

Every fenced ``python`` block of ``README.md`` and ``docs/*.md`` is executed, page by page, in one
namespace per page (later blocks may use names defined by earlier ones), from a temporary working
directory and with one torch thread. A block directly preceded by ``<!-- skip -->`` is not run.
README blocks that use names defined nowhere (illustrations with the user's own data) must carry
that mark: ``test_readme_blocks_are_self_contained`` fails on any other.

A block that prints shows what it prints in the ``text`` block under it; the run compares them
(``docs/snippets.py``: same words, numbers within tolerance; ``python docs/snippets.py PAGE``
rewrites them after a change), and ``RANGES`` checks what the numbers must say whatever the page
shows: accuracy well above chance, uncertainty larger off the data than on it.
"""

from __future__ import annotations

import ast
import builtins
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

#: whole programs (``make test-fast`` skips them; CI runs them)
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def _load(name: str):
    """A script of ``docs/`` (not a package) as a module."""
    spec = importlib.util.spec_from_file_location(f"_docs_{name}", DOCS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


_snippets = _load("snippets")
SKIP_MARK = _snippets.SKIP_MARK
Block = _snippets.Block
python_blocks = _snippets.python_blocks


def undefined_names(code: str, known: set[str]) -> set[str]:
    """Names a block reads that it never binds and that are neither builtins nor ``known``."""
    tree = ast.parse(code)
    bound: set[str] = set()
    loaded: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (loaded if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for a in node.names:
                bound.add((a.asname or a.name).split(".")[0])
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
            if not isinstance(node, ast.ClassDef):
                args = node.args
                for a in args.posonlyargs + args.args + args.kwonlyargs:
                    bound.add(a.arg)
                for a in (args.vararg, args.kwarg):
                    if a is not None:
                        bound.add(a.arg)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
    return loaded - bound - known - set(dir(builtins))


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]


def _run_page(path: Path, tmp_path: Path, monkeypatch, skip_undefined: bool) -> list[str]:
    """Run every block of a page in one namespace; returns descriptions of skipped blocks.

    What a block prints must match the ``text`` block under it (``docs/snippets.py``: same words,
    numbers within tolerance) and a block that prints must show it; then the page's printed
    output must satisfy its ``RANGES``."""
    monkeypatch.chdir(tmp_path)
    import matplotlib

    matplotlib.use("Agg")
    _snippets.seed_page()
    ns: dict = {"__name__": "__docs__"}
    skipped, problems, printed = [], [], []
    for b in python_blocks(path):
        if b.skip:
            skipped.append(f"{b.where} (marked {SKIP_MARK})")
            continue
        if skip_undefined:
            missing = undefined_names(b.code, set(ns))
            if missing:
                skipped.append(f"{b.where} (undefined: {', '.join(sorted(missing))})")
                continue
        try:
            out = _snippets.run_block(b, ns)
        except Exception as e:
            raise AssertionError(
                f"snippet at {b.where} failed: {type(e).__name__}: {e}\n{b.code}"
            ) from e
        printed.append(out)
        if b.expected is None and out.strip():
            problems.append(f"{b.where} prints but shows no ```text block under it:\n{out}")
        elif b.expected is not None:
            problems += [f"{b.where}: {m}" for m in _snippets.output_mismatches(out, b.expected)]
    problems += range_violations(path.name, "".join(printed))
    assert not problems, "\n\n".join(problems) + "\n(python docs/snippets.py PAGE rewrites them)"
    return skipped


#: what the printed output of a page must say, whatever its ``text`` blocks show: page name ->
#: (pattern whose groups are numbers, the condition they meet, what it means). Every pattern
#: must match at least once. Accuracy of the two-class token tasks: chance is 0.5.
RANGES: dict[str, list[tuple[str, Callable[..., bool], str]]] = {
    "README.md": [
        (r"accuracy ([\d.]+)", lambda a: a >= 0.9, "the network learns its task"),
        (
            r"MI test ([\d.e+-]+) +MI unseen tokens ([\d.e+-]+)",
            lambda on, off: off > 2 * on,
            "the network is more unsure off the data",
        ),
        (r"'accuracy': ([\d.]+)", lambda a: a >= 0.9, "the converted model keeps its accuracy"),
        (r"'ood_auroc': ([\d.]+)", lambda a: a >= 0.7, "its entropy finds noise inputs"),
        (
            r"GP spread test ([\d.e+-]+) +noise ([\d.e+-]+)",
            lambda on, off: off > on > 0,
            "the GP read's draws disagree more off the data",
        ),
        (
            r"density score test ([\d.e+-]+) +noise ([\d.e+-]+)",
            lambda on, off: off > on,
            "the density read scores noise as unlike training",
        ),
    ],
    "getting-started.md": [
        (r"accuracy ([\d.]+)", lambda a: a >= 0.9, "the network learns its task"),
        (
            r"MI test ([\d.e+-]+) +MI unseen tokens ([\d.e+-]+)",
            lambda on, off: off > 10 * on,
            "the network is more unsure off the data",
        ),
    ],
    "your-model.md": [
        (
            r"accuracy ([\d.]+) -> ([\d.]+)",
            lambda plain, read: plain == read and plain >= 0.85,
            "the read keeps the network's predictions, and the networks learn their task",
        ),
        (
            r"AUROC by entropy ([\d.]+) -> by the read's score ([\d.]+)",
            lambda ent, read: read > ent and read >= 0.75,
            "the read's score finds unseen kinds better than the softmax entropy",
        ),
    ],
    "uncertainty.md": [
        (r"acc ([\d.]+)", lambda a: a >= 0.8, "well above chance (10% of the labels are flipped)"),
        (r"AUROC MI +([\d.]+)", lambda a: a >= 0.75, "mutual information finds unseen tokens"),
        (
            r"ensemble/mean: MI test ([\d.e+-]+) +MI unseen tokens ([\d.e+-]+)",
            lambda on, off: off > 2 * on,
            "the ensemble's members disagree more off the data",
        ),
        (
            r"NLL ([\d.]+) -> ([\d.]+)",
            lambda raw, cal: cal <= raw + 1e-3,
            "temperature scaling does not worsen the NLL it minimises on validation",
        ),
    ],
}


def range_violations(page: str, printed: str) -> list[str]:
    """The ``RANGES`` of ``page`` that ``printed`` does not meet (or never prints)."""
    problems = []
    for pattern, ok, meaning in RANGES.get(page, []):
        found = re.findall(pattern, printed)
        if not found:
            problems.append(f"{page}: nothing printed matches {pattern!r} ({meaning})")
        for groups in found:
            values = [float(v) for v in (groups if isinstance(groups, tuple) else (groups,))]
            if not ok(*values):
                problems.append(f"{page}: {pattern!r} printed {values}: not {meaning}")
    return problems


def test_output_checks_can_fail(tmp_path, monkeypatch):
    """A snippet whose output differs from the page, shows none, or misses its ranges fails."""
    page = tmp_path / "getting-started.md"
    good = "```python\nprint('accuracy', 0.95, 'MI test 1e-05  MI unseen tokens 0.01')\n```\n"
    page.write_text(good + "\n```text\naccuracy 0.95 MI test 1e-05  MI unseen tokens 0.01\n```\n")
    assert _run_page(page, tmp_path, monkeypatch, skip_undefined=False) == []
    for shown, why in [
        ("accuracy 0.5 MI test 1e-05  MI unseen tokens 0.01", "printed 0.95"),  # a stale number
        ("acc 0.95 MI test 1e-05  MI unseen tokens 0.01", "but the page shows"),  # other words
    ]:
        page.write_text(good + f"\n```text\n{shown}\n```\n")
        with pytest.raises(AssertionError, match=why):
            _run_page(page, tmp_path, monkeypatch, skip_undefined=False)
    page.write_text(good)
    with pytest.raises(AssertionError, match="shows no ```text block"):
        _run_page(page, tmp_path, monkeypatch, skip_undefined=False)
    bad = "print('accuracy 0.6 MI test 0.02  MI unseen tokens 0.01')"
    page.write_text(f"```python\n{bad}\n```\n\n```text\n{bad[7:-2]}\n```\n")
    with pytest.raises(AssertionError) as err:
        _run_page(page, tmp_path, monkeypatch, skip_undefined=False)
    assert "learns its task" in str(err.value) and "more unsure off the data" in str(err.value)
    never = range_violations("README.md", "")  # a check never printed fails
    assert len(never) == len(RANGES["README.md"]) and any("GP spread" in v for v in never)


@pytest.mark.parametrize(
    "page",
    [p for p in sorted(DOCS.glob("*.md")) if python_blocks(p)],
    ids=lambda p: p.name,
)
def test_docs_snippets_run(page: Path, tmp_path, monkeypatch, one_thread):
    skipped = _run_page(page, tmp_path, monkeypatch, skip_undefined=False)
    # every skip is deliberate, but a page that skips everything tests nothing
    assert len(skipped) < len(python_blocks(page)), f"{page.name}: every block is skipped"


def test_readme_snippets_run(tmp_path, monkeypatch, one_thread):
    skipped = _run_page(ROOT / "README.md", tmp_path, monkeypatch, skip_undefined=False)
    assert len(skipped) < len(python_blocks(ROOT / "README.md")), "every README block skipped"


def not_self_contained(path: Path) -> list[str]:
    """Blocks of a page, not marked ``<!-- skip -->``, that read names no earlier block (nor
    they themselves) define: they cannot run as written."""
    known: set[str] = set()
    problems = []
    for b in python_blocks(path):
        missing = undefined_names(b.code, known)
        if missing and not b.skip:
            problems.append(f"{b.where} uses undefined {sorted(missing)}")
        known |= _bound_names(b.code)
    return problems


def test_readme_blocks_are_self_contained():
    """Every README block runs as written (after the blocks above it), or is marked skip."""
    problems = not_self_contained(ROOT / "README.md")
    assert not problems, f"mark these {SKIP_MARK} or make them self-contained: {problems}"


def test_self_contained_check_catches_undefined_names(tmp_path):
    """The check above can fail: a block reading a name nobody defines is reported, unless it is
    marked skip; a name bound by an earlier block is fine."""
    page = tmp_path / "page.md"
    ok = "```python\nimport torch\nx = torch.ones(2)\n```\n\n```python\nprint(x.sum())\n```\n"
    page.write_text(ok)
    assert not_self_contained(page) == []
    page.write_text(ok + "\n```python\nnet.fit(my_data)\n```\n")
    (problem,) = not_self_contained(page)
    assert problem.endswith("page.md:10 uses undefined ['my_data', 'net']"), problem
    page.write_text(ok + f"\n{SKIP_MARK}\n```python\nnet.fit(my_data)\n```\n")
    assert not_self_contained(page) == []


def _bound_names(code: str) -> set[str]:
    return {
        n.id
        for n in ast.walk(ast.parse(code))
        if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)
    } | {
        (a.asname or a.name).split(".")[0]
        for n in ast.walk(ast.parse(code))
        if isinstance(n, (ast.Import, ast.ImportFrom))
        for a in n.names
    }


def test_snippet_extraction():
    """The extractor sees fences, languages and skip marks as intended."""
    blocks = python_blocks(ROOT / "README.md")
    assert blocks and all(b.code.strip() for b in blocks)
    assert undefined_names("import torch\nx = torch.ones(1)\nprint(x, y)", set()) == {"y"}


def test_every_api_page_is_in_the_nav():
    nav = (ROOT / "mkdocs.yml").read_text()
    for page in sorted((DOCS / "api").glob("*.md")):
        assert f"api/{page.name}" in nav, f"{page.name} missing from mkdocs.yml nav"


_HAVE_MKDOCS = all(
    importlib.util.find_spec(m) is not None for m in ("mkdocs", "mkdocstrings_handlers.python")
)


@pytest.fixture(scope="module")
def built_site(tmp_path_factory) -> Path:
    """``mkdocs build --strict`` of the whole site (user guide, notebooks, results, API), once."""
    if not _HAVE_MKDOCS:
        pytest.skip("mkdocs + mkdocstrings[python] not installed")
    site = tmp_path_factory.mktemp("docs") / "site"
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    seconds = time.perf_counter() - t0
    assert proc.returncode == 0, (
        f"mkdocs build --strict failed (rc={proc.returncode}, {seconds:.1f} s):\n"
        f"{proc.stdout[-5000:]}\n{proc.stderr[-10000:]}"
    )
    return site


def test_docs_build_strict(built_site: Path):
    assert (built_site / "index.html").is_file()
    assert (built_site / "api" / "functional" / "index.html").is_file()
    assert (built_site / "results" / "index.html").is_file()
    assert (built_site / "assets" / "mathjax" / "MathJax.js").is_file(), "MathJax not copied"
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):  # every notebook is a page
        page = built_site / "notebooks" / nb.stem / "index.html"
        assert page.is_file(), f"{nb.name} has no page"
        assert "<img" in page.read_text(encoding="utf-8"), f"{nb.name}'s page shows no figure"


# attributes that make a browser fetch something to display the page
_FETCHING = {
    "script": ("src",),
    "img": ("src", "srcset"),
    "source": ("src", "srcset"),
    "iframe": ("src",),
    "video": ("src", "poster"),
    "audio": ("src",),
    "embed": ("src",),
    "object": ("data",),
    "link": ("href",),  # stylesheets, icons, preloads, manifests (rel="canonical" etc. excepted)
}
_LINK_RELS_NOT_FETCHED = {"canonical", "alternate", "next", "prev", "author", "license", "help"}
_CSS_URL = re.compile(r"url\(\s*['\"]?((?:https?:)?//[^'\")]+)")
_IMPORT = re.compile(r"@import\s+['\"]((?:https?:)?//[^'\"]+)")


def _external(url: str) -> bool:
    return url.strip().lower().startswith(("http://", "https://", "//"))


def external_resources(html_text: str) -> list[str]:
    """URLs on another host that a page would fetch to display itself: script/img/iframe/...
    sources, stylesheet/icon/preload links, CSS ``url(...)`` and ``@import`` in inline styles.
    Plain ``<a href>`` links are not fetched and are not reported."""
    from html.parser import HTMLParser

    found: list[str] = []

    class Parser(HTMLParser):
        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            a = {k: v or "" for k, v in attrs}
            if tag == "link" and set(a.get("rel", "").lower().split()) & _LINK_RELS_NOT_FETCHED:
                return
            for attr in _FETCHING.get(tag, ()):
                for url in a.get(attr, "").split(","):
                    url = url.strip().split(" ")[0]
                    if url and _external(url):
                        found.append(f"<{tag} {attr}={url}>")
            if "style" in a:
                found.extend(_CSS_URL.findall(a["style"]))

    Parser().feed(html_text)
    found += _CSS_URL.findall(html_text) + _IMPORT.findall(html_text)
    return found


def test_external_resource_check_can_fail():
    page = (
        '<html><head><script src="https://cdn.example.org/mathjax.js"></script>'
        '<link rel="stylesheet" href="//fonts.example.org/css">'
        '<link rel="canonical" href="https://example.org/page/">'
        "<style>@font-face { src: url('https://fonts.example.org/a.woff2') }</style></head>"
        '<body><a href="https://example.org">a link is fine</a><img src="fig.png">'
        '<img srcset="small.png 1x, https://img.example.org/big.png 2x"></body></html>'
    )
    found = external_resources(page)
    assert "<script src=https://cdn.example.org/mathjax.js>" in found
    assert "<link href=//fonts.example.org/css>" in found
    assert "https://fonts.example.org/a.woff2" in found
    assert "<img srcset=https://img.example.org/big.png>" in found
    assert len(found) == 4, found  # not the canonical link, the <a>, nor the local image


def test_built_site_needs_no_network(built_site: Path):
    """No page or stylesheet of the site fetches anything from another host (maths included:
    MathJax is served from the site), and every page with maths loads the site's own MathJax."""
    problems = {}
    for page in sorted(built_site.rglob("*.html")):
        text = page.read_text(encoding="utf-8")
        found = external_resources(text)
        if found:
            problems[str(page.relative_to(built_site))] = found
        if 'class="arithmatex"' in text:
            assert "assets/mathjax/MathJax.js" in text, f"{page}: maths but no MathJax"
    for css in sorted(built_site.rglob("*.css")):
        found = _CSS_URL.findall(css.read_text(encoding="utf-8")) + _IMPORT.findall(
            css.read_text(encoding="utf-8")
        )
        if found:
            problems[str(css.relative_to(built_site))] = found
    assert not problems, f"the site fetches from other hosts: {problems}"


def test_notebook_pages_lose_their_cdn_scripts():
    hooks = _load("hooks")
    page = (
        '<script src="https://cdnjs.cloudflare.com/ajax/libs/mathjax/2.7.7/latest.js"> </script>'
        '<script type="text/x-mathjax-config">MathJax.Hub.Config({})</script>'
        '<script src=""> </script>'
        '<script type="module">const m = await import("https://cdn/mermaid.mjs")</script>'
        '<script src="../../assets/mathjax/MathJax.js"></script><p>kept</p>'
    )
    assert hooks.strip_cdn_scripts(page) == (
        '<script src="../../assets/mathjax/MathJax.js"></script><p>kept</p>'
    )


def _result_file(tmp_path: Path) -> Path:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from _results import table, write_results
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return write_results(
        "demo",
        "Demo | speed",
        [
            table(
                "by T",
                ["T", "ms", "ratio ours/torch"],
                [[64, 1.5, 1.1], [128, 3.0, 1.2], [256, 7.0, 1.05]],
            ),
            table("by name", ["candidate", "ms"], [["a", 1.0], ["b", 2.0]]),
        ],
        out_dir=tmp_path,
    )


def test_benchmark_results_render_as_tables_and_plots(tmp_path: Path):
    hooks = _load("hooks")
    _result_file(tmp_path)
    plots: dict = {}
    md = hooks.render_results(tmp_path, plots=plots)
    assert "### Demo \\| speed" in md or "### Demo | speed" in md
    assert "| T | ms | ratio ours/torch |" in md
    assert "| 128 | 3 | 1.2 |" in md
    assert "| a | 1 |" in md
    assert "torch thread(s)" in md and "bayesattn" in md  # the machine line
    # one plot: the T sweep, of its ratio column only; none for the table without a sweep
    assert list(plots) == ["demo-0.svg"]
    title, xlabel, x, ys = plots["demo-0.svg"]
    assert (xlabel, x, list(ys)) == ("T", [64.0, 128.0, 256.0], ["ratio ours/torch"])
    hooks.draw_plot(tmp_path / "p.svg", title, xlabel, x, ys)
    assert (tmp_path / "p.svg").read_text().lstrip().startswith("<?xml")
    assert "No benchmark results" in hooks.render_results(tmp_path / "empty")
    assert "| None |" not in hooks.render_results(ROOT / "benchmarks" / "results")  # "–" instead


def test_a_result_file_names_the_script_that_wrote_it():
    """A results file named by ``--name`` (``alignment_context10``) is rendered with the command
    of its script (``benchmarks/alignment.py``): ``meta.script`` when recorded, else the longest
    ``_``-prefix of its name that is a script; every committed file names a script that exists."""
    hooks = _load("hooks")
    assert hooks.script_of({"benchmark": "alignment_context10", "meta": {}}) == "alignment.py"
    assert hooks.script_of({"benchmark": "wordnet_tokens_lm", "meta": {}}) == "wordnet_tokens.py"
    assert hooks.script_of({"benchmark": "x", "meta": {"script": "long_task.py"}}) == "long_task.py"
    assert hooks.script_of({"benchmark": "no_such_script", "meta": {}}) == "no_such_script.py"
    for f in (ROOT / "benchmarks" / "results").glob("*.json"):
        script = hooks.script_of(json.loads(f.read_text()))
        assert (ROOT / "benchmarks" / script).is_file(), (f.name, script)


def test_committed_benchmark_results_follow_the_schema():
    files = sorted((ROOT / "benchmarks" / "results").glob("*.json"))
    assert files, "no committed benchmark results (run `make bench`)"
    for f in files:
        doc = json.loads(f.read_text())
        assert doc["benchmark"] == f.stem
        assert {"date", "machine", "threads", "torch", "bayesattn"} <= set(doc["meta"])
        for t in doc["tables"]:
            assert all(len(r) == len(t["columns"]) for r in t["rows"]), (f.name, t["title"])


def test_study_run_is_published_with_its_provenance(tmp_path: Path):
    publish = _load("publish_results")
    run = tmp_path / "run"
    run.mkdir()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(15, 2), dpi=100)  # 1500 px wide: scaled down
    fig.savefig(run / "pareto_digits.png")
    plt.close(fig)
    (run / "other.png").write_bytes(b"not listed: not copied")
    (run / "report.md").write_text("# bayesattn uncertainty study\n\n| m | acc |\n|---|---|\n")
    from bayesattn.study import StudyConfig

    cfg = {k: v for k, v in vars(StudyConfig.quick()).items()}
    results = json.loads((ROOT / "studies/2026-12-04-mixture-digits/results.json").read_text())
    results["config"] = json.loads(json.dumps(cfg, default=list))
    results["datasets"]["digits"]["figures"] = {"pareto": "pareto_digits.png"}
    (run / "results.json").write_text(json.dumps(results))
    studies = tmp_path / "studies"
    studies.mkdir()
    folder = publish.publish(run, studies)
    assert folder.parent == studies and "-quick-" in folder.name
    assert sorted(p.name for p in folder.iterdir()) == [
        "README.md", "pareto_digits.png", "report.md", "results.json"
    ]
    readme = (folder / "README.md").read_text()
    assert readme.startswith("# A quick smoke run of ") and "Produced 20" in readme
    assert "```bash\nbayesattn study --quick\n```" in readme
    from PIL import Image

    with Image.open(folder / "pareto_digits.png") as im:
        assert im.width == publish.MAX_WIDTH
    index = (studies / "README.md").read_text()
    assert f"]({folder.name}/)" in index  # the index lists it
    pages = _load("study_pages")
    page = pages.study_page(pages.load_studies(studies)[0])
    assert "![pareto: digits]" in page
    cfg_default = {k: v for k, v in vars(StudyConfig()).items()}
    assert publish.settings_kind(json.loads(json.dumps(cfg_default, default=list))) == "default"
    assert publish.settings_kind({**cfg_default, "epochs": 3}) == "custom"
    old = json.loads(json.dumps(cfg_default, default=list))  # a run from before the rename
    old["methods"] = ["recommended" if m == "last_layer" else m for m in old["methods"]]
    assert "recommended" in old["methods"] and publish.settings_kind(old) == "default"
    (run / "results.json").unlink()
    with pytest.raises(FileNotFoundError, match="results.json"):
        publish.publish(run, studies)


@pytest.mark.slow
def test_site_in_a_real_browser(built_site: Path):
    """``docs/check_site.py`` on the built site in headless Chromium: maths typeset, images shown,
    no request to another host. Screenshots go to ``site-check/``. Skipped when there is no
    system Chromium (``apt-get install chromium``; ``.ci/run`` installs it where it can)."""
    check = _load("check_site")
    if check.find_chromium() is None:
        pytest.skip("no Chromium on this machine (apt-get install chromium): browser check skipped")
    pytest.importorskip("playwright")
    rc = check.main([str(built_site), "--out", str(ROOT / "site-check")])
    report = json.loads((ROOT / "site-check" / "report.json").read_text())
    assert rc == 0, json.dumps(report, indent=1)
    assert report["external_requests"] == [] and report["passed"]
    assert (ROOT / "site-check" / "landing.png").is_file()


def test_mobile_check_can_fail():
    """``mobile_problems`` at 390 px in a real Chromium: a page with content wider than the
    window and a display equation cut off by its box fails; the same content in scrolling boxes
    (a wide table in its own container, an equation that scrolls) passes."""
    check = _load("check_site")
    if check.find_chromium() is None:
        pytest.skip("no Chromium on this machine (apt-get install chromium): browser check skipped")
    sync_api = pytest.importorskip("playwright.sync_api")
    wide = '<table><tr><td style="white-space:nowrap">' + "wide_cell " * 40 + "</td></tr></table>"
    eq = '<span class="MathJax_Display" style="display:block;{}"><span style="display:inline-block;width:900px">x</span></span>'
    bad = (
        '<html><body style="margin:0;overflow-x:hidden"><article>'
        f'<div>{wide}</div><div class="arithmatex" style="overflow:hidden">{eq.format("overflow:hidden")}</div>'
        f'<div class="arithmatex" style="overflow-x:auto;overflow-y:hidden;height:10px">{eq.format("height:40px")}</div>'
        "</article></body></html>"
    )
    good = (
        '<html><body style="margin:0"><article>'
        f'<div style="overflow-x:auto">{wide}</div>'
        f'<div class="arithmatex" style="overflow-x:auto">{eq.format("")}</div>'
        "<p>text that wraps " + "word " * 100 + "</p></article></body></html>"
    )
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=check.find_chromium(), args=check.CHROMIUM_FLAGS)
        page = browser.new_context(viewport=check.MOBILE_VIEWPORT).new_page()
        page.set_content(bad)
        problems = check.mobile_problems(page)
        page.set_content(good)
        fine = check.mobile_problems(page)
        browser.close()
    assert any("past the window" in p for p in problems), problems
    assert any("equations cut off" in p for p in problems), problems
    assert any("a line hidden" in p for p in problems), problems  # clipped below, not beside
    assert fine == [], fine


def test_column_check_can_fail():
    """``column_problems`` in a real Chromium, at 390 and 1366 px: a wide table in its own
    scrolling box, a code block that scrolls and a block wider than the main column fail; a
    narrow table, code that wraps and an equation that scrolls inside its box pass."""
    check = _load("check_site")
    if check.find_chromium() is None:
        pytest.skip("no Chromium on this machine (apt-get install chromium): browser check skipped")
    sync_api = pytest.importorskip("playwright.sync_api")
    long = "wide_cell " * 40
    column = '<html><body style="margin:0"><article style="width:{w}px">{body}</article></body></html>'
    bad = (
        f'<div style="overflow-x:auto"><table><tr><td style="white-space:nowrap">{long}</td></tr></table></div>'
        f'<pre style="overflow-x:auto"><code>{"x = 1; " * 60}</code></pre>'
        f'<div style="width:2000px">a block wider than the column</div>'
    )
    good = (
        "<table><tr><td>a</td><td>0.950<br><small>± 0.007</small></td></tr></table>"
        f'<pre style="overflow-x:auto"><code style="white-space:pre-wrap;overflow-wrap:anywhere">{"x = 1; " * 60}</code></pre>'
        '<div class="arithmatex" style="overflow-x:auto"><span class="MathJax_Display" style="display:block">'
        '<span style="display:inline-block;width:3000px">x</span></span></div>'
        "<p>" + "word " * 100 + "</p>"
    )
    results = {}
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=check.find_chromium(), args=check.CHROMIUM_FLAGS)
        for viewport in (check.MOBILE_VIEWPORT, check.DESKTOP_VIEWPORT):
            page = browser.new_context(viewport=viewport).new_page()
            w = viewport["width"] - 40 if viewport["width"] < 500 else 800
            page.set_content(column.format(w=w, body=bad))
            results[(viewport["width"], "bad")] = check.column_problems(page)
            page.set_content(column.format(w=w, body=good))
            results[(viewport["width"], "good")] = check.column_problems(page)
        browser.close()
    for width in (390, 1366):
        problems = " ".join(results[(width, "bad")])
        assert "table" in problems and "pre" in problems, problems
        assert "past the main column" in problems, problems
        assert results[(width, "good")] == [], results[(width, "good")]


def test_changelog_page_includes_the_changelog():
    hooks = _load("hooks")
    page = (DOCS / "changelog.md").read_text(encoding="utf-8")
    assert hooks.CHANGELOG_MARKER in page
    text = hooks.changelog_markdown()
    import bayesattn

    assert not text.startswith("# Changelog") and f"## {bayesattn.__version__}" in text


#: the longest a user page may be (lines of Markdown); longer: split it by topic
MAX_PAGE_LINES = 300


def test_user_pages_stay_short():
    """Every page of the user guide fits in ``MAX_PAGE_LINES`` lines (the API reference and the
    generated pages excepted): a longer one is two topics."""
    long = {p.name: n for p in DOCS.glob("*.md")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_PAGE_LINES}  # fmt: skip
    assert not long, f"split these pages by topic: {long}"


def test_readme_and_landing_page_open_with_the_recipe_for_your_model():
    """README and the landing page show the density read on the user's own model (at most ten
    lines of code) before the Bayesian-attention story, and link both guide pages; the nav
    puts them right after Getting started."""
    for page, prefix in ((ROOT / "README.md", "docs/"), (DOCS / "index.md", "")):
        text = page.read_text(encoding="utf-8")
        first = python_blocks(page)[0]
        assert "DensityRead(model).fit(" in first.code and "predict_and_score" in first.code
        assert len(first.code.strip().splitlines()) <= 10, f"{page.name}: the recipe is long"
        story = text.index("## Bayesian attention")
        assert text.index("DensityRead(model)") < story, page.name
        for target in ("your-model.md", "train-your-own-model.md"):
            assert f"]({prefix}{target})" in text, f"{page.name} does not link {target}"
    started = (DOCS / "getting-started.md").read_text(encoding="utf-8")
    assert "](your-model.md)" in started and "](train-your-own-model.md)" in started
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    order = [nav.index(f": {p}") for p in
             ("getting-started.md", "train-your-own-model.md", "your-model.md")]  # fmt: skip
    assert order == sorted(order)
