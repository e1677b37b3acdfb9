"""Open the built site in a real (headless) Chromium and check what a reader sees (``make docs-check``).

Serves ``site/`` on 127.0.0.1, opens the main pages with Playwright driving the system Chromium
(never a downloaded browser) and checks, page by page:

* maths is typeset: MathJax output elements are present wherever the page has maths, no MathJax
  error box, and no raw ``\\(`` / ``\\[`` / ``$$`` left in the visible text (code excluded);
* every image is loaded (``naturalWidth > 0``); notebook pages show their stored figures;
* no request leaves the machine: every request is recorded, any to another host is blocked and
  fails the check; no uncaught JavaScript error;
* on a phone (390 px wide), every page of the site: the page does not scroll sideways, nothing in
  its content sticks out of the window unless inside its own scrolling box, and no display
  equation is cut off (:func:`mobile_problems`);
* at 390 px and at 1366 px, every page: **nothing scrolls sideways in the main column**
  (:func:`column_problems`). The main column is the page's ``article``. It scrolls sideways when
  an element ends past the column's right edge outside a scrolling box of its own, or when a
  **table or code block** (a ``table``, a ``pre``, or the box that holds one, such as Material's
  table wrapper or a notebook's output area) is wider than its box, so that the reader would have
  to scroll it: code wraps its lines, and a table too wide for the column is shown as cards, a
  card per row (``docs/js/tables.js``). Only display equations may scroll inside their own box.

Screenshots of the landing page and of a notebook page (desktop and 390 px), and ``report.json``, go to ``--out``
(default ``site-check/``). Exit status 0 when every check passes, 1 otherwise, 2 when no Chromium
is found (set ``CHROMIUM=/path/to/chromium``).

Usage: python docs/check_site.py [site] [--out site-check]
"""

from __future__ import annotations

import argparse
import functools
import http.server
import json
import os
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

# (path under site/, what must be on it)
PAGES: list[tuple[str, dict[str, Any]]] = [
    ("", {"maths": True, "images": 1, "screenshot": "landing.png"}),
    ("concepts/", {"maths": True}),
    ("uncertainty/", {"maths": True}),
    ("benchmarks/", {}),
    ("results/", {}),
    ("notebooks/", {}),
    ("notebooks/01_attention_as_inference/", {"maths": True, "images": 3}),
    (
        "notebooks/02_digits_uncertainty/",
        {"images": 3, "screenshot": "notebook-02.png", "scroll_to": ".jupyter-wrapper img"},
    ),
    ("notebooks/04_arviz_diagnostics/", {"maths": True, "images": 2}),
    ("notebooks/07_mixture_posterior/", {"images": 2}),
    ("notebooks/09_your_model/", {"images": 2}),
    ("your-model/", {}),
    ("which-attention/", {"images": 1, "screenshot": "which-attention.png"}),
    ("gallery/", {"images": 7}),
    ("results/2026-12-04-full-protocol-0.6/", {"images": 9}),
    ("api/functional/", {"maths": True}),
]
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]
LOCAL_HOSTS = {"127.0.0.1", "localhost"}

# visible text of the content, without code (which may legitimately show TeX source)
_VISIBLE_TEXT_JS = """() => {
  const root = (document.querySelector('article') || document.body).cloneNode(true);
  root.querySelectorAll('pre, code, script, style, .MathJax_Preview').forEach(e => e.remove());
  return root.innerText;
}"""
_MATHJAX_IDLE_JS = """() => !!(window.MathJax && MathJax.isReady && MathJax.Hub
  && MathJax.Hub.queue.pending === 0 && MathJax.Hub.queue.running === 0)"""
_PAGE_STATE_JS = """() => ({
  mathjax: document.querySelectorAll('.MathJax, .MathJax_Display, .MathJax_SVG').length,
  math_errors: document.querySelectorAll('.MathJax_Error, merror, .mjx-merror').length,
  math_sources: document.querySelectorAll('.arithmatex').length,
  images: Array.from(document.querySelectorAll('article img')).map(
      i => ({src: i.getAttribute('src').slice(0, 80), ok: i.complete && i.naturalWidth > 0})),
  notebook_images: document.querySelectorAll('.jupyter-wrapper img').length,
  wide_overflow: document.documentElement.scrollWidth > window.innerWidth + 1,
})"""


# at a phone's width: what sticks out of the window and is not inside its own scrolling box, and
# display equations wider than their box where that box does not scroll (cut off)
MOBILE_VIEWPORT = {"width": 390, "height": 844}
_MOBILE_JS = """() => {
  const vw = document.documentElement.clientWidth;
  const root = document.querySelector('article') || document.body;
  const scrolls = e => ['auto', 'scroll'].includes(getComputedStyle(e).overflowX);
  const name = e => e.tagName.toLowerCase() + (e.id ? '#' + e.id : '')
      + (typeof e.className === 'string' && e.className ? '.' + e.className.trim().split(/\\s+/)[0] : '');
  const out = [];
  for (const e of root.querySelectorAll('*')) {
    const r = e.getBoundingClientRect();
    if (r.width === 0 || r.right <= vw + 1) continue;
    let a = e.parentElement, held = false;
    for (; a && a !== document.body; a = a.parentElement) {
      if (scrolls(a) && a.getBoundingClientRect().right <= vw + 1) { held = true; break; }
    }
    if (!held) out.push(`${name(e)} ends at ${Math.round(r.right)} px`);
    if (out.length >= 5) break;
  }
  const cut = [];
  for (const m of root.querySelectorAll('.MathJax_Display, mjx-container[display="true"]')) {
    let box = m.closest('div.arithmatex') || m.parentElement;
    const clipsY = e => !['visible', 'auto', 'scroll'].includes(getComputedStyle(e).overflowY)
        && e.scrollHeight > e.clientHeight + 1;
    if (m.scrollWidth > m.clientWidth + 1 && !scrolls(m) && !scrolls(box)) cut.push(name(box));
    else if (box.scrollWidth > box.clientWidth + 1 && !scrolls(box)) cut.push(name(box));
    else if (clipsY(m) || clipsY(box)) cut.push(name(box) + ' (a line hidden)');
  }
  return {viewport: vw, page_wider: document.documentElement.scrollWidth > vw + 1,
          sticking_out: out, equations_cut: cut};
}"""


DESKTOP_VIEWPORT = {"width": 1366, "height": 900}
# tables and code blocks (or the boxes that hold them) wider than their box, and anything past
# the main column's right edge that no scrolling box holds
_COLUMN_JS = """() => {
  const root = document.querySelector('article') || document.body;
  // the column's edge: Material's content box (on a phone code blocks bleed into its margin)
  const edge = (document.querySelector('.md-content') || root).getBoundingClientRect().right;
  const scrolls = e => ['auto', 'scroll'].includes(getComputedStyle(e).overflowX);
  const name = e => e.tagName.toLowerCase() + (e.id ? '#' + e.id : '')
      + (typeof e.className === 'string' && e.className ? '.' + e.className.trim().split(/\\s+/)[0] : '');
  const isMath = e => !!e.closest('.arithmatex, .MathJax_Display, mjx-container');
  const scrolling = [];
  for (const e of root.querySelectorAll('table, pre, code, div')) {
    if (isMath(e) || e.scrollWidth <= e.clientWidth + 1) continue;
    const tag = e.tagName;
    const holds = tag === 'TABLE' || tag === 'PRE' || (tag === 'CODE' && e.parentElement.tagName === 'PRE')
        || (tag === 'DIV' && scrolls(e) && e.querySelector('table, pre'));
    if (holds && (scrolls(e) || tag === 'TABLE')) scrolling.push(`${name(e)} (${e.scrollWidth} px in ${e.clientWidth})`);
    if (scrolling.length >= 5) break;
  }
  const out = [];
  for (const e of root.querySelectorAll('*')) {
    const r = e.getBoundingClientRect();
    if (r.width === 0 || r.right <= edge + 1 || isMath(e)) continue;
    let a = e.parentElement, held = false;
    for (; a && a !== root; a = a.parentElement) {
      if (scrolls(a) && a.getBoundingClientRect().right <= edge + 1) { held = true; break; }
    }
    if (!held) out.push(`${name(e)} ends at ${Math.round(r.right)} px, the column at ${Math.round(edge)}`);
    if (out.length >= 5) break;
  }
  return {scrolling: scrolling, past_column: out};
}"""


def column_problems(page: Any) -> list[str]:
    """At the current viewport: tables or code blocks that scroll sideways in the main column,
    and content past the column's right edge; empty when the column never scrolls sideways."""
    state = page.evaluate(_COLUMN_JS)
    problems = []
    if state["scrolling"]:
        problems.append(f"tables or code that scroll sideways: {state['scrolling']}")
    if state["past_column"]:
        problems.append(f"content past the main column: {state['past_column']}")
    return problems


def mobile_problems(page: Any) -> list[str]:
    """At the current (phone) viewport: the page scrolling sideways, content sticking out of the
    window outside any scrolling container, display equations cut off; empty when it fits."""
    state = page.evaluate(_MOBILE_JS)
    problems = []
    if state["page_wider"]:
        problems.append(f"the page is wider than the {state['viewport']} px window")
    if state["sticking_out"]:
        problems.append(f"content past the window's edge: {state['sticking_out']}")
    if state["equations_cut"]:
        problems.append(f"display equations cut off (no scrolling box): {state['equations_cut']}")
    return problems


def site_pages(site: Path) -> list[str]:
    """Every page of the built site, as paths under it (``""`` for the landing page)."""
    pages = []
    for f in sorted(site.rglob("index.html")):
        rel = f.parent.relative_to(site).as_posix()
        if not rel.startswith(("assets", "search")):
            pages.append("" if rel == "." else rel + "/")
    return pages


#: screenshots taken while checking every page: (width, page) -> file under --out
SHOTS = {
    (390, ""): "landing-390.png",
    (390, "priors-and-posteriors/"): "priors-390.png",
    (390, "which-attention/"): "which-attention-390.png",
    (390, "results/"): "results-390.png",
    (390, "results/2026-12-04-full-protocol-0.6/"): "study-390.png",
    (390, "gallery/"): "gallery-390.png",
    (390, "your-model/"): "your-model-390.png",
    (390, "notebooks/07_mixture_posterior/"): "notebook-07-390.png",
    (1366, "which-attention/"): "which-attention-1366.png",
    (1366, "results/"): "results-1366.png",
    (1366, "results/2026-12-04-full-protocol-0.6/"): "study-1366.png",
    (1366, "gallery/"): "gallery-1366.png",
    (1366, "your-model/"): "your-model-1366.png",
    (1366, "study-protocol/"): "study-protocol-1366.png",
}


def check_widths(
    context: Any, base: str, pages: list[str], out: Path, width: int
) -> dict[str, list[str]]:
    """Every page at ``width`` px (maths typeset first): :func:`column_problems`, and at a
    phone's width :func:`mobile_problems` too; the screenshots of :data:`SHOTS` go to ``out``."""
    page = context.new_page()
    page.set_default_timeout(30_000)
    results: dict[str, list[str]] = {}
    for path in pages:
        page.goto(base + path, wait_until="load")
        try:
            page.wait_for_function(_MATHJAX_IDLE_JS, timeout=30_000, polling=200)
            page.wait_for_timeout(300)
        except Exception:
            results[f"{width}px /{path}"] = ["MathJax did not finish typesetting in 30 s"]
            continue
        problems = column_problems(page)
        if width <= MOBILE_VIEWPORT["width"]:
            problems = mobile_problems(page) + problems
        results[f"{width}px /{path}"] = problems
        if (width, path) in SHOTS:
            page.screenshot(path=str(out / SHOTS[(width, path)]))
    page.close()
    return results


def find_chromium() -> str | None:
    """The system Chromium: $CHROMIUM, else chromium / chromium-browser / google-chrome on PATH."""
    env = os.environ.get("CHROMIUM")
    if env:
        return env if Path(env).exists() else shutil.which(env)
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass


def serve(site: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    """Serve ``site`` on 127.0.0.1 (a free port) from a daemon thread; returns (server, base URL)."""
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


def raw_tex_left(text: str) -> list[str]:
    """Snippets of visible text that still hold TeX delimiters (maths that was not typeset)."""
    found = []
    for delim in ("\\(", "\\[", "$$"):
        i = text.find(delim)
        if i >= 0:
            found.append(text[max(0, i - 30) : i + 50].replace("\n", " "))
    return found


def check_page(page: Any, url: str, want: dict[str, Any]) -> list[str]:
    """Load one page and return the problems found (empty: it passed)."""
    problems: list[str] = []
    resp = page.goto(url, wait_until="load")
    if resp is None or resp.status != 200:
        return [f"HTTP {resp.status if resp else 'no response'}"]
    try:  # MathJax ready and its queue empty, twice half a second apart (typesetting is done)
        for _ in range(2):
            page.wait_for_function(_MATHJAX_IDLE_JS, timeout=30_000, polling=200)
            page.wait_for_timeout(500)
    except Exception:
        problems.append("MathJax did not load or did not finish typesetting in 30 s")
    state = page.evaluate(_PAGE_STATE_JS)
    if want.get("maths") and state["mathjax"] == 0:
        problems.append("no typeset maths (no MathJax output element)")
    if state["math_sources"] and state["mathjax"] == 0:
        problems.append(f"{state['math_sources']} formulas left untypeset")
    if state["math_errors"]:
        problems.append(f"{state['math_errors']} MathJax errors")
    raw = raw_tex_left(page.evaluate(_VISIBLE_TEXT_JS))
    if raw:
        problems.append(f"raw TeX in visible text: {raw}")
    broken = [i["src"] for i in state["images"] if not i["ok"]]
    if broken:
        problems.append(f"images not shown: {broken}")
    loaded = sum(i["ok"] for i in state["images"])
    if loaded < want.get("images", 0):
        problems.append(f"{loaded} images shown, expected at least {want['images']}")
    if state["wide_overflow"]:
        problems.append("the page scrolls sideways (something is wider than the window)")
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("site", nargs="?", default="site", help="the built site (mkdocs build)")
    ap.add_argument("--out", default="site-check", help="screenshots and report.json")
    args = ap.parse_args(argv)
    site, out = Path(args.site), Path(args.out)
    if not (site / "index.html").is_file():
        print(f"docs-check: {site}/index.html not found; run `make docs` first", file=sys.stderr)
        return 1
    chromium = find_chromium()
    if chromium is None:
        print(
            "docs-check: no Chromium found (apt-get install chromium, or set CHROMIUM=...)",
            file=sys.stderr,
        )
        return 2
    from playwright.sync_api import sync_playwright

    out.mkdir(parents=True, exist_ok=True)
    server, base = serve(site)
    requests: list[str] = []
    external: list[str] = []
    js_errors: list[str] = []
    missing: list[str] = []  # local files the pages asked for that are not in the site
    results: dict[str, list[str]] = {}
    t0 = time.perf_counter()
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_FLAGS)
            context = browser.new_context(viewport=DESKTOP_VIEWPORT)

            def route(r: Any) -> None:
                url = r.request.url
                requests.append(url)
                host = urlparse(url).hostname
                if url.startswith(("data:", "blob:")) or host in LOCAL_HOSTS:
                    r.continue_()
                else:
                    external.append(url)
                    r.abort()

            context.route("**/*", route)
            page = context.new_page()
            page.set_default_timeout(30_000)
            page.on("pageerror", lambda e: js_errors.append(f"{page.url}: {e}"))
            page.on(
                "response",
                lambda r: r.status >= 400 and missing.append(f"{r.status} {r.url}"),
            )
            for path, want in PAGES:
                print(f"  ... /{path}", flush=True)
                results[path or "/"] = check_page(page, base + path, want)
                if "scroll_to" in want:  # show a figure, not only the first cells
                    page.eval_on_selector(
                        want["scroll_to"], "e => e.scrollIntoView({block: 'center'})"
                    )
                    page.wait_for_timeout(300)
                if "screenshot" in want:
                    page.screenshot(path=str(out / want["screenshot"]))
            results.update(
                check_widths(context, base, site_pages(site), out, DESKTOP_VIEWPORT["width"])
            )
            context.close()
            phone = browser.new_context(viewport=MOBILE_VIEWPORT)
            phone.route("**/*", route)
            results.update(
                check_widths(phone, base, site_pages(site), out, MOBILE_VIEWPORT["width"])
            )
            phone.close()
            browser.close()
    finally:
        server.shutdown()
    seconds = time.perf_counter() - t0
    failed = {p: probs for p, probs in results.items() if probs}
    report = {
        "chromium": chromium,
        "pages": results,
        "requests": len(requests),
        "external_requests": external,
        "js_errors": js_errors,
        "missing_files": missing,
        "seconds": round(seconds, 1),
        "passed": not (failed or external or js_errors or missing),
    }
    (out / "report.json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    for p, probs in results.items():
        if probs or not p[0].isdigit():  # the every-page checks only when they fail
            print(f"  {'FAIL' if probs else 'ok  '} {p}" + "".join(f"\n       {x}" for x in probs))
    print(
        f"docs-check: {len(results)} pages, {len(requests)} requests, {len(external)} to other "
        f"hosts, {len(missing)} missing files, {len(js_errors)} JS errors, {seconds:.1f} s; "
        f"screenshots in {out}/: {'passed' if report['passed'] else 'FAILED'}"
    )
    for x in external + missing + js_errors:
        print(f"  {x}")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
