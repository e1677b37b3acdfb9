"""The landing page's figure, drawn from the newest full-protocol study's ``results.json``.

:func:`hero_data` picks, per dataset, the held-out-class AUROC (each method's primary score) of
four methods a reader chooses between; :func:`hero_png` draws them as grouped horizontal bars,
large enough to read on a phone. ``docs/hooks.py`` writes the PNG into the site at build time
(``img/hero.png``), so it always shows the committed results.

Usage: python docs/figures.py [out.png]   (draws it to a file, to look at)
"""

from __future__ import annotations

import importlib.util
import io
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
STUDIES = ROOT / "studies"

#: (method in the study, label on the figure), top to bottom
HERO_METHODS = [
    ("deterministic", "softmax\nnetwork"),
    ("last_layer", "Bayesian\nattention"),
    ("ensemble", "ensemble\nof 5"),
    ("density", "softmax +\ndensity read"),
]
DATASET_ORDER = ["digits", "mnist1d", "fortunes"]
DATASET_LABELS = {"digits": "images", "mnist1d": "signals", "fortunes": "words"}


def _upgrade(results: dict[str, Any]) -> dict[str, Any]:
    """``results`` with current method names (``bayesattn/study/legacy.py``, standard library
    only, loaded by path: the figure draws without importing the library)."""
    spec = importlib.util.spec_from_file_location(
        "_docs_figures_legacy", ROOT / "bayesattn" / "study" / "legacy.py"
    )
    assert spec is not None and spec.loader is not None
    legacy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(legacy)
    return legacy.upgrade_results(results)


def newest_full_study(root: Path = STUDIES) -> Path:
    """``results.json`` of the newest ``*full-protocol*`` study that ran every hero method."""
    for d in sorted(root.glob("*full-protocol*"), reverse=True):
        f = d / "results.json"
        if f.is_file():
            methods = _upgrade(json.loads(f.read_text(encoding="utf-8"))).get("methods", [])
            if all(m in methods for m, _ in HERO_METHODS):
                return f
    raise FileNotFoundError(f"no full-protocol study with {[m for m, _ in HERO_METHODS]} in {root}")


def hero_data(results: dict[str, Any]) -> dict[str, dict[str, float]]:
    """``{dataset: {method: mean held-out AUROC by its primary score}}`` (current method names)."""
    results = _upgrade(results)
    return {
        name: {m: float(block["pooled"][m]["auroc_primary"]["mean"]) for m, _ in HERO_METHODS}
        for name, block in results["datasets"].items()
    }


def hero_png(path: Path | None = None) -> bytes:
    """The figure as PNG bytes (also written to ``path`` when given)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    data = hero_data(json.loads(newest_full_study().read_text(encoding="utf-8")))
    datasets = [d for d in DATASET_ORDER if d in data] + [d for d in data if d not in DATASET_ORDER]
    fig = Figure(figsize=(5.4, 4.8), dpi=120, layout="constrained")
    ax = fig.subplots()
    n = len(datasets)
    height = 0.8 / n
    colors = ["#1a237e", "#3f51b5", "#9fa8da"]
    for j, name in enumerate(datasets):
        ys = [i + (j - (n - 1) / 2) * height for i in range(len(HERO_METHODS))]
        vals = [data[name][m] for m, _ in HERO_METHODS]
        bars = ax.barh(
            ys,
            vals,
            height=height * 0.92,
            color=colors[j % 3],
            label=DATASET_LABELS.get(name, name),
        )
        ax.bar_label(bars, labels=[f"{v:.2f}" for v in vals], padding=3, fontsize=12)
    ax.set_yticks(range(len(HERO_METHODS)), [label for _, label in HERO_METHODS], fontsize=13)
    ax.get_yticklabels()[-1].set_fontweight("bold")
    ax.invert_yaxis()
    ax.set_xlim(0.5, 1.06)
    ax.set_xticks([0.5, 0.75, 1.0], ["0.5\nchance", "0.75", "1\nperfect"], fontsize=11)
    ax.set_xlabel("AUROC: inputs of unseen classes flagged", fontsize=12)
    fig.suptitle("Spotting classes never seen in training", fontsize=14, fontweight="bold")
    ax.spines[["top", "right"]].set_visible(False)
    fig.legend(fontsize=12, loc="outside lower center", ncols=n, frameon=False)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    data_png = buf.getvalue()
    if path is not None:
        Path(path).write_bytes(data_png)
    return data_png


if __name__ == "__main__":
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "hero.png")
    hero_png(out)
    print(f"wrote {out}")
