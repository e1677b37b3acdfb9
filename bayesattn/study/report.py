"""The study's Markdown: :func:`format_table` (the pooled table the CLI prints) and
:func:`render` (``report.md``: set-up, how hyperparameters were chosen, per dataset the pooled
tables with 95% intervals, paired differences and which resolve, the ensemble-size curve, who
wins what, the figures, and the per-pair appendix)."""

from __future__ import annotations

import math
from typing import Any

from .datasets import get_dataset
from .methods import get_method
from .results import DatasetBlock, PooledRow, StudyResults
from .stats import holm

__all__ = ["format_table", "render"]

_MAIN = [
    ("accuracy", "acc", 3),
    ("nll", "NLL", 3),
    ("ece", "ECE", 3),
    ("brier", "Brier", 3),
    ("auroc_primary", "AUROC held-out", 3),
    ("primary_score", "by (primary score)", 0),
    ("auroc_entropy", "AUROC ent", 3),
    ("train_seconds", "train s", 1),
    ("infer_ms_batch512", "infer ms/ex", 3),
]
#: near / far / shift, every AUROC by the method's primary score
_NEAR_FAR = [
    ("auroc_primary", "near: held-out classes", 3),
    ("auroc_far", "far: mean of the sets", 3),
    ("auroc_far_moments", "far: moments", 3),
    ("auroc_shift", "shift: corruptions", 3),
    ("corruption_accuracy_mean", "acc under shift", 3),
    ("primary_score", "by", 0),
]
_SELECTIVE = [
    ("aurc", "AURC (entropy)", 4),
    ("acc_at_90", "acc @ 90% coverage", 3),
    ("acc_at_80", "acc @ 80% coverage", 3),
    ("aurc_own", "AURC (own score)", 4),
]


def _score_names(pooled: dict[str, PooledRow]) -> dict[str, Any]:
    """``pooled`` with the primary score's name spelled out (``own`` → the own score's name)."""
    out = {}
    for m, r in pooled.items():
        name = r.get("primary_score")
        if name == "own":
            name = f"own: {get_method(m).own_score}"
        out[m] = {**r, "primary_score": name}
    return out


def _cell(r: dict[str, Any] | str | None, digits: int) -> str:
    if r is None:
        return "—"
    if isinstance(r, str):  # a name (the primary score's)
        return r
    h = r["half_width"]
    pm = "" if math.isnan(h) else f" ± {h:.{digits}f}"
    return f"{r['mean']:.{digits}f}{pm}"


def _table(pooled: dict[str, PooledRow], cols: list[tuple[str, str, int]]) -> list[str]:
    lines = ["| method | " + " | ".join(c[1] for c in cols) + " |",
             "|---" * (len(cols) + 1) + "|"]  # fmt: skip
    for m, r in _score_names(pooled).items():
        lines.append(f"| {m} | " + " | ".join(_cell(r.get(k), d) for k, _, d in cols) + " |")
    return lines


#: what a smoke run's report and table say first (``StudyConfig.quick()``, ``--quick``)
SMOKE_NOTE = (
    "**A smoke run (`--quick`), not results.** It checks that the study runs end to end on a "
    "reduced protocol (few epochs, runs and ensemble members): its numbers say nothing about "
    "the methods. The results are those of `bayesattn study` without `--quick` (`make study`)."
)


def is_smoke(results: StudyResults) -> bool:
    """Whether ``results`` come from a smoke run (``smoke`` in their configuration)."""
    return bool(results.get("config", {}).get("smoke", False))


def format_table(results: StudyResults) -> str:
    """The pooled table of every dataset (mean ± half-width of the 95% t-interval over runs),
    under :data:`SMOKE_NOTE` for a smoke run."""
    parts = [SMOKE_NOTE, ""] if is_smoke(results) else []
    for ds, block in results["datasets"].items():
        n = len(block["runs"])
        parts += [f"**{ds}** ({n} runs: held-out pairs × seeds; ± = 95% t-interval)", ""]
        parts += _table(block["pooled"], _MAIN) + [""]
        parts += ["Near / far / shift: AUROC by each method's primary score", ""]
        parts += _table(block["pooled"], _NEAR_FAR) + [""]
    return "\n".join(parts).rstrip()


def _paired_table(paired: dict[str, Any], ref: str) -> list[str]:
    keys = [("accuracy", "Δacc"), ("nll", "ΔNLL"), ("ece", "ΔECE"), ("nll_ts", "ΔNLL (TS)"),
            ("auroc_entropy", "ΔAUROC ent"), ("auroc_primary", "ΔAUROC primary"),
            ("auroc_far", "ΔAUROC far"), ("auroc_shift", "ΔAUROC shift"),
            ("aurc", "ΔAURC")]  # fmt: skip
    rows = paired.get(ref, {})
    if not rows:
        return []
    cells_at = [(m, k) for m, d in rows.items() for k, _ in keys if k in d]
    adjusted = dict(zip(cells_at, holm([rows[m][k].get("p", math.nan) for m, k in cells_at]),
                        strict=True))  # fmt: skip
    lines = [f"#### Paired differences against `{ref}` (method − {ref}, same pair and seed; "
             f"95% interval; **bold** = resolved after Holm's correction over the table's "
             f"{len(cells_at)} differences, * = the raw interval excludes 0 but Holm's "
             "correction does not resolve it)", "",
             "| method | " + " | ".join(k[1] for k in keys) + " |",
             "|---" * (len(keys) + 1) + "|"]  # fmt: skip
    resolved, raw_only = [], 0
    for m, d in rows.items():
        cells = []
        for k, label in keys:
            if k not in d:
                cells.append("—")
                continue
            r = d[k]
            txt = f"{r['mean']:+.3f} [{r['lo']:+.3f}, {r['hi']:+.3f}]"
            if adjusted[(m, k)] < 0.05:
                cells.append(f"**{txt}**")
                resolved.append(f"`{m}` {label} {r['mean']:+.3f}")
            else:
                raw_only += bool(r["resolved"])
                cells.append(f"{txt}{' *' if r['resolved'] else ''}")
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    lines += ["", "Resolved after Holm: " + ("; ".join(resolved) if resolved else "none")
              + f"; {raw_only} more resolve without the correction.", ""]  # fmt: skip
    return lines


def _laplace_note(block: DatasetBlock) -> list[str]:
    """Whether ``laplace`` and ``deterministic`` are level (no paired difference resolves on
    NLL, ECE or accuracy) and why: the prior precision by marginal likelihood, the effective
    number of parameters against the head's count, the 0.5 grid's choice."""
    pd = block["paired"].get("deterministic", {}).get("laplace")
    params = [p for p in block["pooled"].get("laplace", {}).get("params", []) if p]
    if pd is None or not params or "effective_params" not in params[0]:
        return []
    delta = [p["prior_precision"] for p in params]
    frac = sum(p["effective_params"] / p["num_params"] for p in params) / len(params)
    differ = [k for k in ("nll", "ece", "accuracy", "auroc_entropy") if pd[k]["resolved"]]
    verdict = (f"differs from `deterministic` on {', '.join(differ)} (paired, raw 95% interval)"
               if differ else "is level with `deterministic` (no paired difference in NLL, ECE, "
               "accuracy or entropy AUROC resolves)")  # fmt: skip
    grid = [p["grid_prior_precision"] for p in params]
    nll_grid = sum(p["grid_val_nll"] for p in params) / len(params)
    nll_ml = sum(p["val_nll"] for p in params) / len(params)
    return [f"**Laplace.** `laplace` {verdict}. Its prior precision, by marginal likelihood: "
            f"{min(delta):.3g}–{max(delta):.3g} over the runs; the data determine on average "
            f"{100 * frac:.1f}% of the head's {params[0]['num_params']} parameter directions "
            "(the effective number γ = Σ λ/(λ + δ) over the GGN's eigenvalues λ): the closer "
            "to 100%, the narrower the posterior and the closer the linearised predictive to "
            "the network's own, so a level result says the head is well determined by the "
            "training set, not that the control is broken. The 0.5 choice (grid 1e-4..1e4 on "
            f"validation NLL, kept as an ablation) took {min(grid):.3g}–{max(grid):.3g}, mean "
            f"validation NLL {nll_grid:.4f} there against {nll_ml:.4f} by marginal "
            "likelihood.", ""]  # fmt: skip


def _curve_section(ds: str, block: DatasetBlock) -> list[str]:
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


def _wins_section(block: DatasetBlock) -> list[str]:
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


def _params_section(pooled: dict[str, PooledRow]) -> list[str]:
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


def _near_far_selective(pooled: dict[str, PooledRow]) -> list[str]:
    """The near / far / shift table and the selective-prediction table."""
    parts: list[str] = []
    parts += ["", "### Near / far / shift", "",
              "AUROC against in-distribution test inputs, by each method's primary score: near = "
              "the held-out classes; far = the mean over the far-OOD sets (uniform noise, "
              "inverted and permuted inputs, and the harder `moments` set: class-conditional "
              "Gaussians with the training classes' means and covariances, chosen before any "
              "result); shift = the mean over corruption kinds and severities, with the "
              "accuracy under them.", ""]  # fmt: skip
    parts += _table(pooled, _NEAR_FAR)
    parts += ["", "### Selective prediction", "",
              "On the in-distribution test set: AURC (area under the risk–coverage curve, "
              "lower is better) and the accuracy on the 90% / 80% most certain examples, "
              "abstaining by predictive entropy; AURC abstaining by the own score where a "
              "method has one.", ""]  # fmt: skip
    parts += _table(pooled, _SELECTIVE)
    return parts


def _dataset_section(ds: str, block: DatasetBlock) -> list[str]:
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
        f"{get_dataset(ds).token_unit}"
        f"{f' every {stride}' if (stride := model.get('stride')) else ''}, "
        f"{model['epochs']} epochs; took "
        f"{block['seconds'] / 60:.1f} min. Cells: mean ± half-width of the 95% t-interval.",
        "",
        "### Quality (raw)",
        "",
    ]
    parts += _table(pooled, _MAIN)
    parts += _near_far_selective(pooled)
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
    parts += ["### Far-OOD sets and corruptions by entropy", "",
              "Entropy AUROC against uniform noise, inverted inputs, per-example permuted "
              "inputs and the moment-matched Gaussians; mean over corruption kinds and "
              "severities.", ""]  # fmt: skip
    parts += _table(pooled, [("far_auroc_uniform", "uniform", 3),
                             ("far_auroc_inverted", "inverted", 3),
                             ("far_auroc_permuted", "permuted", 3),
                             ("far_auroc_moments", "moments", 3),
                             ("corruption_auroc_mean", "corrupt AUROC", 3),
                             ("corruption_accuracy_mean", "corrupt acc", 3)])  # fmt: skip
    parts += ["", f"![corruptions]({block['figures']['corruptions']})", ""]
    parts += ["### Cost", "", "Training seconds (the ensemble: sum over members; post-hoc "
              "methods: the network's plus their fit), inference ms per example in one call of "
              "batch 512 and of batch 1 (own score included), and the wall seconds the study "
              "spent on the method in a run (what it trained that no earlier method had, its "
              "fit and all its scoring: the sum over methods is a run's time).", ""]  # fmt: skip
    parts += _table(pooled, [("train_seconds", "train s", 1), ("wall_seconds", "wall s", 1),
                             ("infer_ms_batch512", "ms/ex batch 512", 4),
                             ("infer_ms_batch1", "ms batch 1", 2)])  # fmt: skip
    parts += [""]
    parts += _laplace_note(block)
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
Laplace prior precision maximises the Laplace log marginal likelihood of the training set (in
closed form from the GGN's eigenvalues; the 0.5 grid on validation NLL is kept as an ablation in
its parameters); kNN's k is the
one (of the configured grid) whose distance best separates the deterministic network's
misclassified validation examples from its correct ones; relative Mahalanobis has no free
parameter (a 1e-6 ridge). Architectures, epochs, learning rate and the tempered-ELBO KL weight
are fixed in advance for all runs (`results.json` → `config`, per dataset `model`).

## Many comparisons

The paired-difference tables read many intervals at once: a cell is **bold** only when it
resolves after Holm's correction over all the differences of its table (family-wise error 5%);
a * marks a raw 95% interval that excludes 0 without surviving the correction. The "who wins
what" lines use the raw intervals.
"""


def _appendix(results: StudyResults) -> list[str]:
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


def _figures_section(results: StudyResults) -> list[str]:
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


def render(results: StudyResults) -> str:
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
        '"AUROC held-out" is the AUROC of held-out classes against in-distribution test inputs by '
        'each method\'s **primary score**, declared before any result (column "by"): its own '
        "score where it has one, else mutual information where its predictive has more than one "
        'draw, else predictive entropy; "AUROC ent" is by entropy for every method.',
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
