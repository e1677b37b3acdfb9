"""Which attention can you trust? Alignment posteriors against the gold alignments of the
reordering grammar (``bayesattn.data.make_translation_task``).

Per seed, on one train/validation/test split, the script trains ``Seq2Seq`` models that differ
only in their decoder's attention:

* ``soft``: deterministic soft cross-attention (and ``ensemble``: ``--members`` of them, seeds
  differing only in the initialisation);
* ``dirichlet``, ``logistic_normal``, ``weibull``, ``concrete``: a variational family on the
  cross-attention (``AttentionConfig(family=..., which=("cross",))``, tempered ELBO, KL weight
  ``--kl-weight``);
* ``latent``: ``alignment="latent"``, the categorical alignment summed out exactly;
* ``context_ensemble``: ``--members`` latent decoders with the context emission (member 0 is
  ``context``), their posteriors averaged: the uncertainty over which convention the network
  learnt (e.g. whether a German article is explained by *the* or by its noun) that one
  network's posterior cannot show;
* ``variational``: ``alignment="variational"``, the same model trained by the exact ELBO with an
  inference network :math:`q(z_t\\mid x, y)` over the whole target (marginal-likelihood weight
  ``--marginal-weight``; with several, each seed picks the one with the lowest posterior AER on
  its validation split). It is scored twice: with the exact posterior (``variational``) and with
  ``q`` itself (``variational_q``).

``latent`` and ``variational`` use the one-word emission (``emission="word"``); ``context``
(``alignment="latent"``) and ``variational_context`` (``alignment="variational"``, scored twice
like ``variational``: ``variational_context`` and ``variational_context_q``) the context emission
(``emission="context"``, the default of a latent or variational decoder).

For each it reads, on the test split, the prior attention :math:`p(z_t\\mid x, y_{<t})` and the
posterior :math:`p(z_t\\mid x, y_{\\le t})` (``bayesattn.predictive.alignment_posterior``; the
posterior attention of Shankar & Sarawagi for the soft kinds) and measures, on every target word
with a gold link: AER, precision and recall of the arg-max link, ECE of the max weight as the
probability that the arg-max link is gold (15 equal-width bins), AUROC of the uncertainty
(entropy; Jensen-Shannon disagreement of draws or members) for finding wrong links; the token
accuracy (teacher forcing, every real target token) and the posterior's KL from its prior
(nats per target token). The training steps of ``latent``, ``variational``, ``context`` and
``variational_context`` are timed against ``soft`` in the same process (median of interleaved
repeats) and printed as ratios.

Writes ``benchmarks/results/alignment.json`` (``--results``) and a study folder
``studies/<date>-alignments/`` (``--study``): ``results.json`` (every seed), ``report.md``
generated from it, ``alignment_matrices.png`` and ``reliability.png``.

Run: ``python benchmarks/alignment.py [--quick] [--seeds 5] [--threads 1]``
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

from bayesattn import AttentionConfig, Seq2Seq
from bayesattn.calibration import (
    alignment_error_rate,
    argmax_links,
    expected_calibration_error,
    link_precision_recall,
    ood_auroc,
    reliability_curve,
)
from bayesattn.data import make_translation_task, train_val_test_split
from bayesattn.data.sequences import SequenceTask
from bayesattn.predictive import AlignmentPosterior, alignment_posterior
from bayesattn.training import fit

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _results import machine_meta  # noqa: E402
from _timing import interleaved  # noqa: E402

ARTICLES = ("das", "den", "die")
FAMILIES = ("dirichlet", "logistic_normal", "weibull", "concrete")
#: the variational kinds (inference network q): each is also scored by q as ``<kind>_q``
VARIATIONAL = ("variational", "variational_context")
#: the kinds with the context emission (the others with a latent alignment read one word)
CONTEXT = ("context", "variational_context")
#: ensembles of ``--members`` decoders (member 0 is the single decoder of the same kind)
ENSEMBLES = {"ensemble": "soft", "context_ensemble": "context"}
ROOT = Path(__file__).resolve().parent.parent


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny sizes, 2 seeds, about a minute")
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--n", type=int, default=1200, help="sentence pairs per seed (80/10/10 split)")
    p.add_argument("--epochs", type=int, default=12)
    p.add_argument("--d-model", type=int, default=32)
    p.add_argument("--warmup", type=int, default=8, help="latent: epochs with a uniform prior")
    p.add_argument(
        "--members",
        type=int,
        default=3,
        help="decoders in an ensemble (ensemble, context_ensemble)",
    )
    p.add_argument("--samples", type=int, default=16, help="attention draws of a family")
    p.add_argument("--kl-weight", type=float, default=0.01)
    p.add_argument(
        "--marginal-weight",
        default="0",
        help="variational: weight(s) of the marginal likelihood in the objective, comma-separated "
        "(several: chosen per seed on the validation split's posterior AER)",
    )
    p.add_argument("--kinds", default="soft,ensemble," + ",".join(FAMILIES) + ",latent,context")
    p.add_argument(
        "--front-adverb",
        type=float,
        default=0.0,
        help="harder task: P(a main clause's adverb goes first in German)",
    )
    p.add_argument("--name", default=None, help="results file name (default alignment)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--results", type=Path, default=None, help="results folder (JSON)")
    p.add_argument("--study", type=Path, default=None, help="study folder (report, figures)")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    if args.quick:
        args.seeds, args.n, args.epochs, args.members, args.samples = 2, 300, 3, 2, 4
        args.warmup = 1
        args.d_model = 16
    return args


# ---- models ------------------------------------------------------------------------------------


def build(kind: str, task: SequenceTask, d_model: int, marginal_weight: float = 0.0) -> Seq2Seq:
    attention = AttentionConfig(family=kind, which=("cross",)) if kind in FAMILIES else None
    alignment = "latent" if kind in ("latent", "context") else "soft"
    if kind in VARIATIONAL:
        alignment = "variational"
    return Seq2Seq(
        task.src_vocab_size,
        task.tgt_vocab_size,
        d_model=d_model,
        nhead=2,
        num_encoder_layers=1,
        num_decoder_layers=1,
        dim_feedforward=2 * d_model,
        dropout=0.0,
        max_len=task.tgt.shape[1],
        attention=attention,
        alignment=alignment,
        marginal_weight=marginal_weight if kind in VARIATIONAL else 0.0,
        emission=None if alignment == "soft" else ("context" if kind in CONTEXT else "word"),
    )


def train(
    kind: str, seed: int, train_data: SequenceTask, val: SequenceTask, args, lam: float = 0.0
) -> Seq2Seq:
    torch.manual_seed(seed)
    net = build(kind, train_data, args.d_model, lam)
    steps = -(-len(train_data) // 32)
    kw = dict(batch_size=32, lr=3e-3, kl_weight=args.kl_weight, progress=False)
    if net.latent is not None and args.warmup > 0:  # IBM-Model-1 start: uniform prior
        net.latent.uniform_prior = True
        fit(net, train_data, epochs=args.warmup, seed=seed + 1, **kw)
        net.latent.uniform_prior = False
    fit(net, train_data, epochs=args.epochs, kl_anneal_steps=2 * steps, seed=seed, **kw)
    return net.eval()


# ---- metrics -----------------------------------------------------------------------------------


def _auroc(u_ok: torch.Tensor, u_bad: torch.Tensor) -> float:
    if len(u_ok) == 0 or len(u_bad) == 0:
        return float("nan")
    if float(torch.cat([u_ok, u_bad]).std()) == 0.0:
        return 0.5  # a constant score ranks nothing
    return ood_auroc(u_ok, u_bad)


def side_metrics(
    ap: AlignmentPosterior,
    which: str,
    gold: torch.Tensor,
    rows: torch.Tensor,
    article: torch.Tensor,
) -> dict[str, Any]:
    """Alignment metrics of ``which`` (prior/posterior) on the gold-linked target words;
    ``article`` marks the German articles (their form depends on the noun, not on "the")."""
    probs = ap.prior if which == "prior" else ap.posterior  # (B, T, Ts)
    links = argmax_links(probs, rows)
    aer = alignment_error_rate(links, gold.bool() & rows[..., None])
    content = rows & ~article  # the gold-linked words that are not articles
    aer_content = alignment_error_rate(
        argmax_links(probs, content), gold.bool() & content[..., None]
    )
    prec, rec = link_precision_recall(links, gold.bool() & rows[..., None])
    p_rows, g_rows = probs[rows].double(), gold[rows].argmax(-1)  # (N, Ts), (N,)
    p_rows = p_rows / p_rows.sum(-1, keepdim=True)
    ece = expected_calibration_error(p_rows, g_rows, n_bins=15)
    curve = reliability_curve(p_rows, g_rows, n_bins=10)
    wrong = p_rows.argmax(-1) != g_rows
    ent = ap.entropy(which)[rows]
    dis = ap.disagreement(which)[rows]
    conf = 1 - p_rows.max(-1).values
    out = {
        "aer": aer, "aer_no_articles": aer_content, "precision": prec, "recall": rec, "ece": ece,
        "auroc_entropy": _auroc(ent[~wrong], ent[wrong]),
        "auroc_max": _auroc(conf[~wrong], conf[wrong]),
        "auroc_disagreement": (
            _auroc(dis[~wrong], dis[wrong]) if ap.num_draws > 1 else float("nan")
        ),
        "wrong_links": int(wrong.sum()),
        "wrong_on_articles": int((wrong & article[rows]).sum()),
        "links": int(rows.sum()),
        "reliability": {
            "confidence": curve.confidence.tolist(), "accuracy": curve.accuracy.tolist(),
            "count": curve.count.tolist(),
        },
    }  # fmt: skip
    return out


def evaluate(
    models: list[Seq2Seq], test: SequenceTask, samples: int, posterior: str = "exact"
) -> dict[str, Any]:
    ap = alignment_posterior(
        models if len(models) > 1 else models[0], test.src, test.tgt, samples,
        posterior=posterior,  # type: ignore[arg-type]
    )  # fmt: skip
    gold = test.alignment_matrix()  # (B, T, Ts)
    rows = gold.sum(-1) > 0  # target words with a gold link (not the comma, EOS or pad)
    tgt_out, mask = test.tgt[:, 1:], ap.tgt_mask
    art_ids = torch.tensor([test.tgt_vocab.index(w) for w in ARTICLES])
    article = torch.isin(tgt_out, art_ids)  # (B, T)
    acc = float((ap.probs.mean(0).argmax(-1) == tgt_out)[mask].float().mean())
    return {
        "token_accuracy": acc,
        "kl": float(ap.kl()[mask].mean()),
        "prior": side_metrics(ap, "prior", gold, rows, article),
        "posterior": side_metrics(ap, "posterior", gold, rows, article),
        "_ap": ap,
    }


def step_cost(task: SequenceTask, args, repeats: int) -> dict[str, float]:
    """Median ms of one training step (loss, backward, Adam) of soft, latent, variational,
    context and variational_context, interleaved."""
    xb, yb = task.src[:32], task.tgt[:32]

    def stepper(kind: str):
        torch.manual_seed(0)
        net = build(kind, task, args.d_model).train()
        opt = torch.optim.Adam(net.parameters(), lr=1e-3)

        def step() -> None:
            opt.zero_grad()
            loss, _ = net.elbo_loss(xb, yb, num_data=len(task))
            loss.backward()
            opt.step()

        return step

    kinds = ("soft", "latent", "variational", "context", "variational_context")
    ms = interleaved({k: stepper(k) for k in kinds}, repeats)
    out = {"soft_ms": ms["soft"], "latent_ms": ms["latent"], "ratio": ms["latent"] / ms["soft"]}
    for k in kinds[2:]:
        out[f"{k}_ms"], out[f"{k}_ratio"] = ms[k], ms[k] / ms["soft"]
    # an ensemble trains its members one after another: members × one member's step
    out["context_ensemble_ratio"] = args.members * out["context_ratio"]
    return out


# ---- driver ------------------------------------------------------------------------------------


def train_members(
    kind: str, n: int, seed: int, tr: SequenceTask, val: SequenceTask, args, bar
) -> tuple[list[Seq2Seq], list[float]]:
    """``n`` decoders of ``kind`` (initialisations ``1000 * seed + m``; member 0 is the single
    decoder of that kind) and each one's training seconds."""
    nets, secs = [], []
    for m in range(n):
        t0 = time.perf_counter()
        nets.append(train(kind, 1000 * seed + m, tr, val, args))
        secs.append(time.perf_counter() - t0)
        bar.update(1)
    return nets, secs


def run_seed(seed: int, kinds: list[str], args, bar) -> dict[str, Any]:
    task = make_translation_task(args.n, seed=seed, front_adverb=args.front_adverb)
    tr, val, test = train_val_test_split(task, (0.8, 0.1, 0.1), seed=seed)
    out: dict[str, Any] = {}
    members: dict[str, tuple[list[Seq2Seq], list[float]]] = {}  # single kind -> nets, seconds
    for kind in kinds:
        if kind in ENSEMBLES or kind.endswith("_q"):
            continue
        t0 = time.perf_counter()
        if kind in ENSEMBLES.values():  # soft, context: more members when their ensemble runs
            ens = next(e for e, single in ENSEMBLES.items() if single == kind)
            n = args.members if ens in kinds else 1
            members[kind] = train_members(kind, n, seed, tr, val, args, bar)
            net = members[kind][0][0]
        elif kind in VARIATIONAL:
            net, lam, val_aer = train_variational(kind, seed, tr, val, args, bar)
            out[f"{kind}_q"] = evaluate([net], test, args.samples, posterior="inference")
            out[f"{kind}_q"]["marginal_weight"] = lam
        else:
            net = train(kind, 1000 * seed, tr, val, args)
            bar.update(1)
        res = evaluate([net], test, args.samples)
        res["train_s"] = members[kind][1][0] if kind in members else time.perf_counter() - t0
        if kind in VARIATIONAL:
            res["marginal_weight"], res["val_posterior_aer"] = lam, val_aer
        out[kind] = res
    for ens, single in ENSEMBLES.items():
        if ens in kinds:
            nets, secs = members[single]
            out[ens] = evaluate(nets, test, 1) | {"train_s": sum(secs)}
    out = {k: out[k] for k in kinds if k in out}  # the kinds' order
    out["_test"] = test
    return out


def marginal_weights(args) -> list[float]:
    return [float(w) for w in str(args.marginal_weight).split(",") if w.strip()]


def train_variational(
    kind: str, seed: int, tr: SequenceTask, val: SequenceTask, args, bar
) -> tuple[Seq2Seq, float, dict[float, float]]:
    """The variational decoder (``kind``) of each marginal-likelihood weight; with several, the
    one whose exact posterior has the lowest AER on the validation split (the test split is not
    read)."""
    nets, val_aer = {}, {}
    for lam in marginal_weights(args):
        nets[lam] = train(kind, 1000 * seed, tr, val, args, lam)
        bar.update(1)
        val_aer[lam] = evaluate([nets[lam]], val, 1)["posterior"]["aer"]
    best = min(val_aer, key=val_aer.__getitem__)
    return nets[best], best, val_aer


def interval(xs: list[float]) -> tuple[float, float, float]:
    """Mean and the 95% Student-t interval over seeds."""
    xs = [x for x in xs if not math.isnan(x)]
    n = len(xs)
    if n == 0:
        return float("nan"), float("nan"), float("nan")
    m = sum(xs) / n
    if n == 1:
        return m, float("nan"), float("nan")
    from scipy import stats

    sd = (sum((x - m) ** 2 for x in xs) / (n - 1)) ** 0.5
    h = float(stats.t.ppf(0.975, n - 1)) * sd / n**0.5
    return m, m - h, m + h


METRICS = (
    ("posterior", "aer"), ("prior", "aer"), ("posterior", "aer_no_articles"),
    ("prior", "aer_no_articles"), ("posterior", "precision"), ("posterior", "recall"),
    ("posterior", "ece"), ("prior", "ece"),
    ("posterior", "auroc_entropy"), ("posterior", "auroc_disagreement"),
    ("prior", "auroc_entropy"), ("prior", "auroc_disagreement"),
    (None, "token_accuracy"), (None, "kl"),
)  # fmt: skip


def summarise(per_seed: list[dict[str, Any]], kinds: list[str]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for kind in kinds:
        row: dict[str, Any] = {}
        for side, metric in METRICS:
            vals = [r[kind][metric] if side is None else r[kind][side][metric] for r in per_seed]
            key = metric if side is None else f"{side}_{metric}"
            row[key] = interval(vals)
        summary[kind] = row
    return summary


def expand_kinds(spec: str) -> list[str]:
    """The kinds of ``--kinds``, with what they need: a variational kind is also scored by q
    (``<kind>_q`` after it) and an ensemble trains its single kind (inserted before it)."""
    kinds = [k.strip() for k in spec.split(",") if k.strip()]
    for v in VARIATIONAL:
        if v in kinds and f"{v}_q" not in kinds:
            kinds.insert(kinds.index(v) + 1, f"{v}_q")
    for ens, single in ENSEMBLES.items():
        if ens in kinds and single not in kinds:
            kinds.insert(kinds.index(ens), single)
    return kinds


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    from tqdm import tqdm

    kinds = expand_kinds(args.kinds)
    per_kind = {ens: 0 for ens in ENSEMBLES} | {
        single: args.members if ens in kinds else 1 for ens, single in ENSEMBLES.items()
    }
    for v in VARIATIONAL:
        per_kind |= {v: len(marginal_weights(args)), f"{v}_q": 0}
    n_train = sum(per_kind.get(k, 1) for k in kinds)
    per_seed: list[dict[str, Any]] = []
    t_start = time.perf_counter()
    with tqdm(total=args.seeds * n_train, desc="training", disable=args.no_progress) as bar:
        for seed in range(args.seeds):
            per_seed.append(run_seed(seed, kinds, args, bar))
    cost = step_cost(make_translation_task(200, seed=0), args, 10 if args.quick else 40)
    summary = summarise(per_seed, kinds)
    doc = {
        "meta": machine_meta() | {"wall_s": time.perf_counter() - t_start},
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "kinds": kinds,
        "summary": summary,
        "step_cost": cost,
        "per_seed": [
            {k: {kk: vv for kk, vv in v.items() if not kk.startswith("_")}
             for k, v in r.items() if not k.startswith("_")}
            for r in per_seed
        ],
    }  # fmt: skip
    print_table(summary, kinds, cost)
    write_outputs(doc, per_seed[0], kinds, args)


def fmt(t: tuple[float, float, float], digits: int = 3) -> str:
    m, lo, hi = t
    if math.isnan(m):
        return "–"
    if math.isnan(lo):
        return f"{m:.{digits}f}"
    return f"{m:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def print_table(summary: dict[str, Any], kinds: list[str], cost: dict[str, float]) -> None:
    from alignment_report import COLUMNS, table_rows

    cols = ["decoder", *(c for c, _ in COLUMNS)]
    for row in table_rows(summary, kinds):
        print(" | ".join(f"{c}: {v}" for c, v in zip(cols, row, strict=True)))
    others = "".join(
        f"; {k} {cost[f'{k}_ms']:.2f} ms, ratio {k}/soft {cost[f'{k}_ratio']:.2f}"
        for k in ("variational", "context", "variational_context")
    )
    print(
        f"training step: soft {cost['soft_ms']:.2f} ms, latent {cost['latent_ms']:.2f} ms, "
        f"ratio latent/soft {cost['ratio']:.2f}{others}"
    )


def write_outputs(doc: dict[str, Any], first: dict[str, Any], kinds: list[str], args) -> None:
    from alignment_report import figures, publish, report

    name = args.name or ("alignment_quick" if args.quick else "alignment")
    path = publish(doc, args.results, name)
    print(f"wrote {path}")
    date = dt.date.today().isoformat()
    suffix = (args.name or "alignment").removeprefix("alignment").strip("_").replace("_", "-")
    tag = "-quick" if args.quick else (f"-{suffix}" if suffix else "")
    study = args.study or ROOT / "studies" / f"{date}-alignments{tag}"
    study.mkdir(parents=True, exist_ok=True)
    (study / "results.json").write_text(json.dumps(doc, indent=1, default=float) + "\n")
    figs = figures(first, kinds, doc, study)
    (study / "report.md").write_text(report(doc, figs))
    print(f"wrote {study / 'report.md'}")


if __name__ == "__main__":
    main()
