"""The study's Markdown: :func:`format_table` (the pooled table the CLI prints) and
:func:`render` (``report.md``: set-up, how hyperparameters were chosen, per dataset the pooled
tables with 95% intervals, paired differences and which resolve, the ensemble-size curve, who
wins what, the figures, and the per-pair appendix)."""

from __future__ import annotations

import math
from typing import Any

from .methods import get_method

__all__ = ["format_table", "render"]

_MAIN = [
    ("accuracy", "acc", 3),
    ("nll", "NLL", 3),
    ("ece", "ECE", 3),
    ("brier", "Brier", 3),
    ("auroc_primary", "AUROC held-out", 3),
    ("primary_score", "by", 0),
    ("auroc_entropy", "AUROC ent", 3),
    ("corruption_auroc_mean", "AUROC corrupt", 3),
    ("train_seconds", "train s", 1),
    ("infer_ms_batch512", "infer ms/ex", 3),
]


def _cell(r: dict[str, Any] | str | None, digits: int) -> str:
    if r is None:
        return "—"
    if isinstance(r, str):  # a name (the primary score's)
        return r
    h = r["half_width"]
    pm = "" if math.isnan(h) else f" ± {h:.{digits}f}"
    return f"{r['mean']:.{digits}f}{pm}"


def _table(pooled: dict[str, Any], cols: list[tuple[str, str, int]]) -> list[str]:
    lines = ["| method | " + " | ".join(c[1] for c in cols) + " |",
             "|---" * (len(cols) + 1) + "|"]  # fmt: skip
    for m, r in pooled.items():
        lines.append(f"| {m} | " + " | ".join(_cell(r.get(k), d) for k, _, d in cols) + " |")
    return lines


#: what a smoke run's report and table say first (``StudyConfig.quick()``, ``--quick``)
SMOKE_NOTE = (
    "**A smoke run (`--quick`), not results.** It checks that the study runs end to end on a "
    "reduced protocol (few epochs, runs and ensemble members): its numbers say nothing about "
    "the methods. The results are those of `bayesattn study` without `--quick` (`make study`)."
)


def is_smoke(results: dict[str, Any]) -> bool:
    """Whether ``results`` come from a smoke run (``smoke`` in their configuration)."""
    return bool(results.get("config", {}).get("smoke", False))


def format_table(results: dict[str, Any]) -> str:
    """The pooled table of every dataset (mean ± half-width of the 95% t-interval over runs),
    under :data:`SMOKE_NOTE` for a smoke run."""
    parts = [SMOKE_NOTE, ""] if is_smoke(results) else []
    for ds, block in results["datasets"].items():
        n = len(block["runs"])
        parts += [f"**{ds}** ({n} runs: held-out pairs × seeds; ± = 95% t-interval)", ""]
        parts += _table(block["pooled"], _MAIN) + [""]
    return "\n".join(parts).rstrip()


def _paired_table(paired: dict[str, Any], ref: str) -> list[str]:
    keys = [("accuracy", "Δacc"), ("nll", "ΔNLL"), ("ece", "ΔECE"), ("nll_ts", "ΔNLL (TS)"),
            ("auroc_entropy", "ΔAUROC ent"), ("auroc_mi", "ΔAUROC MI"),
            ("auroc_primary", "ΔAUROC primary"),
            ("corruption_auroc_mean", "ΔAUROC corrupt")]  # fmt: skip
    rows = paired.get(ref, {})
    if not rows:
        return []
    lines = [f"#### Paired differences against `{ref}` (method − {ref}, same pair and seed; "
             "95% interval; **bold** = resolved, the interval excludes 0)", "",
             "| method | " + " | ".join(k[1] for k in keys) + " |",
             "|---" * (len(keys) + 1) + "|"]  # fmt: skip
    resolved = []
    for m, d in rows.items():
        cells = []
        for k, label in keys:
            if k not in d:
                cells.append("—")
                continue
            r = d[k]
            txt = f"{r['mean']:+.3f} [{r['lo']:+.3f}, {r['hi']:+.3f}]"
            cells.append(f"**{txt}**" if r["resolved"] else txt)
            if r["resolved"]:
                resolved.append(f"`{m}` {label} {r['mean']:+.3f}")
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    lines += ["", "Resolved: " + ("; ".join(resolved) if resolved else "none") + ".", ""]
    return lines


def _curve_section(ds: str, block: dict[str, Any]) -> list[str]:
    curve = block["ensemble_curve"]
    if not curve:
        return []
    cols = [("accuracy", "acc", 3), ("nll", "NLL", 3), ("ece", "ECE", 3),
            ("auroc_entropy", "AUROC ent", 3), ("auroc_mi", "AUROC MI", 3),
            ("train_seconds", "train s", 1), ("infer_ms_batch512", "infer ms/ex", 3)]  # fmt: skip
    parts = ["### Ensemble size curve", "",
             "Ensembles of the first M deterministic members (the same members for every M), "
             "so each other method can be read as 'worth M members' on each metric.", ""]  # fmt: skip
    parts += _table({f"M={s}": r for s, r in sorted(curve.items(), key=lambda t: int(t[0]))},
                    cols)  # fmt: skip
    parts += ["", f"![ensemble curve]({block['figures']['ensemble_curve']})", ""]
    worth = []
    for m, r in block["pooled"].items():
        if m.startswith("ensemble") or "nll" not in r:
            continue
        below = [int(s) for s, c in curve.items() if c["nll"]["mean"] >= r["nll"]["mean"]]
        worth.append(f"`{m}` {max(below) if below else '< 1'}")
    parts += ["NLL worth (the largest M whose ensemble NLL is no better than the method's): "
              + ", ".join(worth) + ".", ""]  # fmt: skip
    return parts


def _wins_section(block: dict[str, Any]) -> list[str]:
    parts = ["### Who wins what", "",
             "Best mean per metric; the paired difference against the runner-up (same pair "
             "and seed) says whether the win resolves.", ""]  # fmt: skip
    for key, w in block["wins"].items():
        vs = w.get("vs_runner_up")
        if vs is None:
            parts.append(f"- **{key}**: `{w['method']}` ({w['mean']:.3f})")
            continue
        verdict = "resolved" if vs["resolved"] else "not resolved"
        parts.append(f"- **{key}**: `{w['method']}` ({w['mean']:.3f}); vs `{w['runner_up']}` "
                     f"{vs['mean']:+.4f} [{vs['lo']:+.4f}, {vs['hi']:+.4f}], {verdict}")  # fmt: skip
    return parts + [""]


def _params_section(pooled: dict[str, Any]) -> list[str]:
    parts = ["### Hyperparameters chosen (on in-distribution validation data)", ""]
    for m, r in pooled.items():
        ps = [p for p in r["params"] if p]
        if not ps:
            continue
        shown = {k: [p[k] for p in ps] for k in ps[0] if k not in ("chosen_by", "val_auroc_by_k")}
        desc = "; ".join(f"{k}: " + ", ".join(f"{v:.3g}" if isinstance(v, float) else str(v)
                                              for v in vs) for k, vs in shown.items())  # fmt: skip
        parts.append(f"- `{m}`: {desc} ({ps[0].get('chosen_by', '')})")
    return parts + [""]


def _dataset_section(ds: str, block: dict[str, Any]) -> list[str]:
    pooled = block["pooled"]
    runs = block["runs"]
    sizes = runs[0]["data"]
    model = block["model"]
    parts = [
        f"## {ds}",
        "",
        f"{len(runs)} runs (held-out pairs × seeds); split train/val/test/held-out = "
        f"{sizes['train']}/{sizes['val']}/{sizes['test']}/{sizes['ood_classes']} (first run); "
        f"model d_model={model['d_model']}, heads={model['nhead']}, layers={model['num_layers']}, "
        f"ff={model['dim_feedforward']}, tokens of {model['patch']} "
        f"{'pixels²' if ds == 'digits' else 'steps'}"
        f"{f' every {stride}' if (stride := model.get('stride')) else ''}, "
        f"{model['epochs']} epochs; took "
        f"{block['seconds'] / 60:.1f} min. Cells: mean ± half-width of the 95% t-interval.",
        "",
        "### Quality (raw)",
        "",
    ]
    parts += _table(pooled, _MAIN)
    parts += ["", "### After temperature scaling (T fitted on validation NLL, per method)", ""]
    parts += _table(pooled, [("accuracy", "acc", 3), ("nll_ts", "NLL", 3), ("ece_ts", "ECE", 3),
                             ("brier_ts", "Brier", 3), ("temperature", "T", 2)])  # fmt: skip
    parts += ["", "### Out-of-distribution detection", "",
              "AUROC of held-out classes vs in-distribution test by predictive entropy, mutual "
              "information and the method's own score; mean MI in and out of distribution.", ""]  # fmt: skip
    parts += _table(pooled, [("auroc_entropy", "AUROC ent", 3), ("auroc_mi", "AUROC MI", 3),
                             ("auroc_own", "AUROC own", 3), ("mean_mi_in", "MI in", 4),
                             ("mean_mi_out", "MI out", 4)])  # fmt: skip
    own = [f"`{m}`: {get_method(m).own_score}" for m in pooled if get_method(m).own_score]
    parts += ["", "Own scores: " + (", ".join(own) if own else "none") + ".", ""]
    if any(pooled[m].get("kl_local") for m in pooled):
        parts += ["### What the posterior learned: KL(q‖p)", "",
                  "Mean per-example KL of the attention latents over the training inputs and the "
                  "KL charged once per data set (global latents: sparse-GP inducing values, "
                  "Bayesian weights), nats; only methods with a variational posterior. One draw "
                  "per example: exact for latents in one layer, a Monte Carlo estimate (averaged "
                  "over the training set) for latents in every layer.", ""]  # fmt: skip
        parts += _table({m: r for m, r in pooled.items() if r.get("kl_local")},
                        [("kl_local", "KL per example", 4), ("kl_global", "KL global", 2)])  # fmt: skip
        parts += [""]
    parts += ["### Far-OOD sanity sets and corruptions", "",
              "Entropy AUROC against uniform noise, inverted inputs and per-example permuted "
              "inputs; mean over corruption kinds and severities.", ""]  # fmt: skip
    parts += _table(pooled, [("far_auroc_uniform", "uniform", 3),
                             ("far_auroc_inverted", "inverted", 3),
                             ("far_auroc_permuted", "permuted", 3),
                             ("corruption_auroc_mean", "corrupt AUROC", 3),
                             ("corruption_accuracy_mean", "corrupt acc", 3)])  # fmt: skip
    parts += ["", f"![corruptions]({block['figures']['corruptions']})", ""]
    parts += ["### Cost", "", "Training seconds (the ensemble: sum over members; post-hoc "
              "methods: the network's plus their fit), inference ms per example in one call of "
              "batch 512 and of batch 1 (own score included).", ""]  # fmt: skip
    parts += _table(pooled, [("train_seconds", "train s", 1),
                             ("infer_ms_batch512", "ms/ex batch 512", 4),
                             ("infer_ms_batch1", "ms batch 1", 2)])  # fmt: skip
    parts += [""]
    parts += _paired_table(block["paired"], "deterministic")
    parts += _paired_table(block["paired"], "ensemble")
    parts += _curve_section(ds, block)
    parts += _wins_section(block)
    parts += ["### Quality against cost", "", f"![pareto]({block['figures']['pareto']})", ""]
    parts += _params_section(pooled)
    return parts


_HOW = """## How hyperparameters are chosen (no peeking)

Nothing is tuned on a held-out class, a far-OOD set or a corruption: each run's validation split
holds in-distribution classes only (checked on the split indices by the tests). Temperature
scaling (the `temp_scaled` method and every "after temperature scaling" column) fits T by
L-BFGS on the validation NLL of the method's predictive log-probabilities; the last-layer
Laplace prior precision is a grid search (1e-4..1e4, 21 values) on validation NLL; kNN's k is the
one (of the configured grid) whose distance best separates the deterministic network's
misclassified validation examples from its correct ones; relative Mahalanobis has no free
parameter (a 1e-6 ridge). Architectures, epochs, learning rate and the tempered-ELBO KL weight
are fixed in advance for all runs (`results.json` → `config`, per dataset `model`).
"""


def _appendix(results: dict[str, Any]) -> list[str]:
    parts = ["## Appendix: per held-out pair (mean over seeds)", ""]
    keys = [("accuracy", "acc"), ("nll", "NLL"), ("auroc_entropy", "AUROC ent"),
            ("auroc_mi", "AUROC MI"), ("auroc_own", "AUROC own")]  # fmt: skip
    for ds, block in results["datasets"].items():
        for pair, rows in block["per_pair"].items():
            parts += [f"### {ds}, held out {pair}", "",
                      "| method | " + " | ".join(k[1] for k in keys) + " |",
                      "|---" * (len(keys) + 1) + "|"]  # fmt: skip
            for m, r in rows.items():
                cells = [f"{r[k]:.3f}" if k in r else "—" for k, _ in keys]
                parts.append(f"| {m} | " + " | ".join(cells) + " |")
            parts.append("")
    return parts


def _figures_section(results: dict[str, Any]) -> list[str]:
    parts = ["## Figures of the first run of each dataset", ""]
    for ds, block in results["datasets"].items():
        for m, extra in block["runs"][0]["first_run"].items():
            parts.append(f"### {ds}: {m}")
            parts.append("")
            parts += [f"![{f}]({f})" for f in extra.get("figures", [])]
            if "attention" in extra:
                a = extra["attention"]
                parts += [f"![{a['figure']}]({a['figure']})", "",
                          f"Attention posterior of `{a['layer']}` saved for ArviZ as "
                          f"`{a['netcdf']}` (`arviz.from_netcdf`)."]  # fmt: skip
            if "geometry" in extra:
                g = extra["geometry"]
                rows = [f"{layer}: distance {g['distance_mean'][layer]:.2f}, entropy "
                        f"{g['entropy_mean'][layer]:.2f}, posterior sd "
                        f"{g['posterior_sd'][layer]:.4f}" for layer in g["layers"]]  # fmt: skip
                parts += ["", "Attention geometry (64 test images): " + "; ".join(rows) + "."]
                parts += [f"![{f}]({f})" for f in g["figures"]]
            parts.append("")
    return parts


def render(results: dict[str, Any]) -> str:
    """``report.md``."""
    cfg = results["config"]
    methods = ", ".join(f"`{m}` ({get_method(m).description})" for m in results["methods"])
    parts = [
        "# bayesattn uncertainty study" + (" (smoke run)" if is_smoke(results) else ""),
        "",
        *([f"> {SMOKE_NOTE}", ""] if is_smoke(results) else []),
        f"Datasets {', '.join(results['datasets'])}; held-out class pairs {results['pairs']} "
        f"(each pair its own runs); seeds {results['seeds']}; {cfg['num_samples']} posterior "
        f"samples; ensemble of {cfg['ensemble_size']}; corruption severities "
        f"{cfg['severities']}. Every number is pooled over runs (pair × seed) with a 95% "
        f"t-interval. The whole study took {results['seconds'] / 60:.1f} min on "
        f"{results['environment']['threads']} torch thread(s).",
        "",
        f"Methods: {methods}.",
        "",
        "\"AUROC held-out\" is the AUROC of held-out classes against in-distribution test inputs by "
        "each method's **primary score**, declared before any result (column \"by\"): its own "
        "score where it has one, else mutual information where its predictive has more than one "
        "draw, else predictive entropy; \"AUROC ent\" is by entropy for every method.",
        "",
        format_table(results),
        "",
        _HOW,
    ]
    for ds, block in results["datasets"].items():
        parts += _dataset_section(ds, block)
    parts += _appendix(results)
    parts += _figures_section(results)
    return "\n".join(parts)
