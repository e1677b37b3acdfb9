"""Figures and ``report.md`` of ``benchmarks/alignment.py``, generated from its results.

``figures(first, kinds, doc, out)`` draws ``alignment_matrices.png`` (prior and posterior of one
test sentence per decoder kind, gold links as circles) and ``reliability.png`` (reliability
diagrams of the posterior and prior, pooled over seeds); ``report(doc, figures)`` writes the
markdown report from the results dict alone, so it can be regenerated from ``results.json``::

    python benchmarks/alignment_report.py studies/<date>-alignments/results.json

which also rewrites ``benchmarks/results/alignment.json`` (:func:`publish`: the table per decoder,
the step cost and the goals, the tables the docs render).
"""

from __future__ import annotations

import json
import math
import sys
import textwrap
from pathlib import Path
from typing import Any

SHOWN = ("soft", "ensemble", "dirichlet", "latent", "variational", "variational_q", "context",
         "context_ensemble", "variational_context", "variational_context_q")  # fmt: skip
LABELS = {
    "soft": "soft attention",
    "ensemble": "ensemble of soft decoders",
    "dirichlet": "Dirichlet family",
    "logistic_normal": "logistic-normal family",
    "weibull": "Weibull family",
    "concrete": "concrete family",
    "latent": "latent alignment (exact)",
    "variational": "variational alignment (exact posterior)",
    "variational_q": "variational alignment (inference network q)",
    "context": "latent alignment, context emission (exact)",
    "context_ensemble": "ensemble of latent decoders, context emission (exact)",
    "variational_context": "variational alignment, context emission (exact posterior)",
    "variational_context_q": "variational alignment, context emission (inference network q)",
}
#: decoders the goals are checked for, and the step-cost ratio each one is charged
GOAL_KINDS = {"latent": "ratio", "variational": "variational_ratio",
              "variational_q": "variational_ratio", "context": "context_ratio",
              "context_ensemble": "context_ensemble_ratio",
              "variational_context": "variational_context_ratio",
              "variational_context_q": "variational_context_ratio"}  # fmt: skip
#: the step-cost columns besides soft and latent, when timed
TIMED = ("variational", "context", "variational_context")


def _sentence(test: Any) -> int:
    """Index of the first subordinate-clause test sentence (the longest reordering)."""
    for i, text in enumerate(test.src_text):
        if " that " in f" {text} ":
            return i
    return 0


def alignment_figure(first: dict[str, Any], kinds: list[str], path: Path) -> None:
    from matplotlib.figure import Figure

    test = first["_test"]
    i = _sentence(test)
    src = test.src_text[i].split()
    tgt = test.tgt_text[i].split()
    gold = test.alignment_matrix()[i, : len(tgt), : len(src)]  # (Tt, Ts)
    shown = [k for k in SHOWN if k in kinds]
    fig = Figure(figsize=(7.5, 3.2 * len(shown)), layout="constrained")
    axes = fig.subplots(len(shown), 2, squeeze=False)
    for r, kind in enumerate(shown):
        ap = first[kind]["_ap"]
        for c, (name, probs) in enumerate((("prior", ap.prior), ("posterior", ap.posterior))):
            ax = axes[r, c]
            m = probs[i, : len(tgt), : len(src)].numpy()
            ax.imshow(m, vmin=0, vmax=1, cmap="Blues")
            ts, js = gold.nonzero(as_tuple=True)
            ax.scatter(js, ts, s=90, facecolors="none", edgecolors="C3", linewidths=1.5)
            ax.set_xticks(range(len(src)), src, rotation=60, fontsize=7)
            ax.set_yticks(range(len(tgt)), tgt, fontsize=7)
            ax.set_title(textwrap.fill(f"{LABELS.get(kind, kind)}: {name}", 40), fontsize=9)
    fig.suptitle("alignment of one test sentence (rows: German words; red circles: gold links)")
    fig.savefig(path, dpi=100)


def pooled_reliability(doc: dict[str, Any], kind: str, side: str) -> tuple[list, list]:
    """Confidence and accuracy per bin, pooled over seeds (bins with no link dropped)."""
    curves = [r[kind][side]["reliability"] for r in doc["per_seed"]]
    conf, acc = [], []
    for b in range(len(curves[0]["count"])):
        n = sum(c["count"][b] for c in curves)
        if n == 0:
            continue
        conf.append(sum(c["confidence"][b] * c["count"][b] for c in curves if c["count"][b]) / n)
        acc.append(sum(c["accuracy"][b] * c["count"][b] for c in curves if c["count"][b]) / n)
    return conf, acc


def reliability_figure(doc: dict[str, Any], kinds: list[str], path: Path) -> None:
    from matplotlib.figure import Figure

    cols = min(4, len(kinds))
    rows = -(-len(kinds) // cols)
    fig = Figure(figsize=(3.0 * cols, 3.0 * rows), layout="constrained")
    grid = fig.subplots(rows, cols, squeeze=False)
    axes = list(grid.flat)
    for ax in axes[len(kinds) :]:
        ax.set_visible(False)
    for ax, kind in zip(axes, kinds, strict=False):
        ax.plot([0, 1], [0, 1], color="0.6", lw=1)
        for side, style in (("posterior", "o-"), ("prior", "s--")):
            conf, acc = pooled_reliability(doc, kind, side)
            ax.plot(conf, acc, style, ms=4, label=side)
        ax.set_title(textwrap.fill(LABELS.get(kind, kind), 30), fontsize=9)
        ax.set_xlabel("max attention weight")
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
    axes[0].set_ylabel("P(arg-max link is gold)")
    axes[0].legend(fontsize=8)
    fig.suptitle("attention calibration on gold links (pooled over seeds)")
    fig.savefig(path, dpi=100)


def figures(first: dict[str, Any], kinds: list[str], doc: dict[str, Any], out: Path) -> list[str]:
    alignment_figure(first, kinds, out / "alignment_matrices.png")
    reliability_figure(doc, kinds, out / "reliability.png")
    return ["alignment_matrices.png", "reliability.png"]


# ---- report ------------------------------------------------------------------------------------


def _fmt(t: list[float] | tuple[float, ...], digits: int = 3) -> str:
    m, lo, hi = t
    if m is None or math.isnan(m):
        return "–"
    if lo is None or math.isnan(lo):
        return f"{m:.{digits}f}"
    return f"{m:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def goal_rows(doc: dict[str, Any], kind: str = "latent") -> list[list[str]]:
    """The issue's goals for a latent-alignment decoder (``latent``, ``variational`` or
    ``variational_q``): ``[goal, measured, target, reached]`` rows."""
    s = doc["summary"]
    if kind not in s or "soft" not in s or GOAL_KINDS[kind] not in doc["step_cost"]:
        return []
    lat, soft = s[kind], s["soft"]
    soft_aer = soft["prior_aer"][0]
    target = 0.05 if soft_aer < 0.10 else soft_aer / 2
    acc_l, acc_s = lat["token_accuracy"], soft["token_accuracy"]
    worse = acc_l[2] < acc_s[1]  # latent's interval wholly below soft's
    ece, au, kl = lat["posterior_ece"], lat["posterior_auroc_entropy"], lat["kl"]
    r = doc["step_cost"][GOAL_KINDS[kind]]
    step = f"training step {kind.removesuffix('_q')} / soft ≤ 2"
    if kind == "context_ensemble":  # its members train one after another
        step = f"training cost ({doc['config']['members']} members × one step) / soft ≤ 2"
    yes = lambda ok: "yes" if ok else "no"  # noqa: E731
    return [
        ["posterior AER ≤ ½ soft arg-max AER", _fmt(lat["posterior_aer"]),
         f"≤ {target:.3f} (soft {soft_aer:.3f})", yes(lat["posterior_aer"][0] <= target)],
        ["token accuracy not resolved worse than soft", _fmt(acc_l), f"soft {_fmt(acc_s)}",
         yes(not worse)],
        ["posterior ECE ≤ .03", _fmt(ece), "≤ 0.030", yes(ece[0] <= 0.03)],
        ["wrong links found, AUROC ≥ .90 (posterior entropy)", _fmt(au), "≥ 0.900",
         yes(au[0] >= 0.90)],
        ["KL(posterior ‖ prior), nats per target token", _fmt(kl, 4), "reported", "–"],
        [step, f"{r:.2f}", "≤ 2", yes(r <= 2)],
    ]  # fmt: skip


def goals(doc: dict[str, Any], kind: str = "latent") -> list[str]:
    """The goals of one decoder as report lines."""
    return [
        f"{g}: {m} (target {t}) — " + ("reached" if ok == "yes" else "**not reached**")
        if ok != "–" else f"{g}: {m}"
        for g, m, t, ok in goal_rows(doc, kind)
    ]  # fmt: skip


def cost_table(c: dict[str, float]) -> tuple[list[str], list[list[float]]]:
    """Columns and row of the step-cost table (``variational``, ``context``,
    ``variational_context`` when timed)."""
    cols, row = ["soft", "latent", "latent / soft"], [c["soft_ms"], c["latent_ms"], c["ratio"]]
    for kind in TIMED:
        if f"{kind}_ms" in c:
            cols += [kind, f"{kind} / soft"]
            row += [c[f"{kind}_ms"], c[f"{kind}_ratio"]]
    return cols, [row]


COLUMNS = (
    ("posterior AER", "posterior_aer"), ("prior AER", "prior_aer"),
    ("posterior AER without articles", "posterior_aer_no_articles"),
    ("posterior ECE", "posterior_ece"), ("prior ECE", "prior_ece"),
    ("AUROC posterior entropy", "posterior_auroc_entropy"),
    ("AUROC posterior disagreement", "posterior_auroc_disagreement"),
    ("AUROC prior entropy", "prior_auroc_entropy"),
    ("token accuracy", "token_accuracy"), ("KL posterior‖prior (nats/token)", "kl"),
)  # fmt: skip


NAN = (math.nan, math.nan, math.nan)


def table_rows(summary: dict[str, Any], kinds: list[str]) -> list[list[str]]:
    """One row per decoder (``–`` for a metric an older results file lacks)."""
    return [
        [LABELS.get(k, k), *(_fmt(summary[k].get(key, NAN)) for _, key in COLUMNS)] for k in kinds
    ]


def publish(doc: dict[str, Any], results_dir: Path | None = None, name: str = "alignment") -> Path:
    """``benchmarks/results/<name>.json``: the decoder table, the step cost and the goals."""
    from _results import table, write_results

    tables = [
        table("Alignment quality per decoder (mean [95% interval] over seeds)",
              ["decoder", *(col for col, _ in COLUMNS)], table_rows(doc["summary"], doc["kinds"])),
        table("Training step cost (median ms, interleaved)", *cost_table(doc["step_cost"])),
    ]  # fmt: skip
    for kind in GOAL_KINDS:
        rows = goal_rows(doc, kind)
        if rows:
            title = "latent-alignment decoder" if kind == "latent" else LABELS[kind]
            tables.append(table(f"Goals ({title})", ["goal", "measured", "target", "reached"],
                                rows))  # fmt: skip
    path = write_results(name, "Alignment posteriors against gold alignments", tables,
                         out_dir=results_dir)  # fmt: skip
    # the machine, date and command of the benchmark run, not of this (re)publication
    out = json.loads(path.read_text())
    out["meta"] = {k: v for k, v in doc["meta"].items() if k != "wall_s"}
    path.write_text(json.dumps(out, indent=1, default=float) + "\n")
    return path


def task_line(cfg: dict[str, Any]) -> str:
    if not cfg.get("front_adverb"):
        return (
            f"Task: `make_translation_task({cfg['n']}, seed)` (the reordering grammar, unchanged), "
        )
    return (
        f"Task: `make_translation_task({cfg['n']}, seed, front_adverb={cfg['front_adverb']})` "
        "(harder: a main clause's time adverb goes first in German with that probability, a "
        "word order the English does not determine), "
    )


def variational_line(doc: dict[str, Any]) -> list[str]:
    """The variational decoders' set-up: their objective and the marginal-likelihood weights."""
    lines = []
    for kind in ("variational", "variational_context"):
        if kind not in doc["kinds"]:
            continue
        chosen = [r[kind]["marginal_weight"] for r in doc["per_seed"]]
        emission = "context" if kind == "variational_context" else "one-word"
        lines += [
            "",
            f"{LABELS[kind].removesuffix(' (exact posterior)').capitalize()}: the latent model "
            f"({emission} emission) trained by the exact ELBO with an inference network "
            "q(z | x, y) over the whole target (a 1-layer bidirectional encoder), the marginal "
            f"likelihood mixed in with weight λ from {{{doc['config']['marginal_weight']}}}, "
            f"chosen per seed by the exact posterior's AER on the validation split: λ = {chosen} "
            "(per seed). *(exact posterior)* reads Bayes' rule on its prior, *(inference "
            "network q)* reads q.",
        ]
    return lines


def report(doc: dict[str, Any], figs: list[str]) -> str:
    cfg, kinds, s = doc["config"], doc["kinds"], doc["summary"]
    lines = [
        "# Alignment posteriors against gold alignments",
        "",
        f"Generated by `benchmarks/alignment.py` on {doc['meta']['date']} "
        f"({doc['meta']['cpus']} CPUs, {doc['meta']['threads']} torch thread(s), "
        f"{doc['meta']['wall_s'] / 60:.1f} min). Command: "
        f"`python benchmarks/alignment.py {' '.join(doc['meta']['argv'])}`.",
        "",
        task_line(cfg)
        + f"80/10/10 split per seed, {cfg['seeds']} seeds; `Seq2Seq` with d_model {cfg['d_model']}, "
        f"1 encoder and 1 decoder layer, 2 heads, {cfg['epochs']} epochs (latent, variational, context: "
        f"{cfg['warmup']} more epochs first with a uniform prior); families: KL weight "
        f"{cfg['kl_weight']}, {cfg['samples']} attention draws; ensembles: {cfg['members']} "
        "decoders. Link metrics on the test split's target words that have a gold link (the comma, "
        "EOS and padding have none); mean and 95% Student-t interval over seeds.",
        *variational_line(doc),
        "",
        "| decoder | posterior AER | prior AER | posterior AER without articles | posterior ECE | "
        "prior ECE | AUROC wrong links (posterior entropy) | AUROC (draw disagreement) | "
        "token accuracy | KL nats/token |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for k in kinds:
        r = s[k]
        lines.append(
            f"| {LABELS.get(k, k)} | {_fmt(r['posterior_aer'])} | {_fmt(r['prior_aer'])} | "
            f"{_fmt(r.get('posterior_aer_no_articles', NAN))} | {_fmt(r['posterior_ece'])} | {_fmt(r['prior_ece'])} | "
            f"{_fmt(r['posterior_auroc_entropy'])} | {_fmt(r['posterior_auroc_disagreement'])} | "
            f"{_fmt(r['token_accuracy'])} | {_fmt(r['kl'], 4)} |"
        )
    c = doc["step_cost"]
    variational = "".join(
        f"; {kind} {c[f'{kind}_ms']:.2f} ms, ratio **{c[f'{kind}_ratio']:.2f}**"
        for kind in TIMED
        if f"{kind}_ms" in c
    )
    lines += [
        "",
        f"Training step (batch 32, loss + backward + Adam; median of interleaved repeats): soft "
        f"{c['soft_ms']:.2f} ms, latent {c['latent_ms']:.2f} ms, ratio **{c['ratio']:.2f}**"
        f"{variational}.",
        "",
        "## Errors on articles",
        "",
        "Share of the wrong posterior links that sit on a German article (das/den/die), whose "
        "form is set by the noun's gender, not by English *the* (pooled over seeds; the table's "
        "*AER without articles* scores the other gold-linked words only):",
        "",
    ]
    for k in kinds:
        wrong = sum(r[k]["posterior"]["wrong_links"] for r in doc["per_seed"])
        art = sum(r[k]["posterior"]["wrong_on_articles"] for r in doc["per_seed"])
        links = sum(r[k]["posterior"]["links"] for r in doc["per_seed"])
        share = f"{art / wrong:.2f}" if wrong else "–"
        lines.append(f"- {LABELS.get(k, k)}: {wrong} wrong of {links} links, {share} on articles")
    lines += ["", "## Goals", ""]
    for kind in GOAL_KINDS:
        if goal_rows(doc, kind):
            lines += [f"{LABELS[kind]}:", ""] + [f"- {g}" for g in goals(doc, kind)] + [""]
    lines += ["", "## Figures", ""] + [f"![{f}]({f})" for f in figs] + [""]
    return "\n".join(lines)


if __name__ == "__main__":
    path = Path(sys.argv[1])
    d = json.loads(path.read_text())
    shown = [f for f in ("alignment_matrices.png", "reliability.png") if (path.parent / f).exists()]
    (path.parent / "report.md").write_text(report(d, shown))
    print(f"wrote {path.parent / 'report.md'}")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    name = d["config"].get("name") or ("alignment_quick" if d["config"]["quick"] else "alignment")
    print(f"wrote {publish(d, name=name)}")
