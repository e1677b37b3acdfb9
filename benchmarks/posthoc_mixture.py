"""Post-hoc rank-1 mixture on the attention projections (``bayesattn.posthoc.MixtureRead``)
against the post-hoc GP read (``bayesattn.posthoc.GPRead``) and temperature scaling, on the
two models of ``examples/07_posthoc_calibration.py`` (a plain torch encoder on digits with 8/9
held out; a tiny Hugging Face BERT with never-seen tokens as OOD).

Per model and seed (the seed trains the model, draws its splits and seeds every fit): the
trained model, temperature scaling, the GP read's mean-field predictive and its 8 samples, and
the mixture (K = 4 and, as ablations, K = 1 and a wider prior s0 = 0.3), 8 predictive draws
(2 per component). Prints mean ± sd over seeds of accuracy, NLL, ECE, OOD AUROC by predictive
entropy (``ood_auroc``) and by mutual information (``ood_auroc_mi``), mean MI in / out, the
mixture's KL (nats, the convexity bound the ELBO charged) and temperature, the fit seconds
(``fit_s``) and the predictive's time over one plain forward pass on the test set (``cost_x``,
median of 5, same process); then the paired per-seed differences with 95% t-intervals to
temperature scaling and to the GP read.

Run: ``OMP_NUM_THREADS=1 python benchmarks/posthoc_mixture.py [--seeds 10] [--models torch hf]
[--quick]``
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch
from posthoc_gp import _example, _median_time, _oracle, _paired

from bayesattn import calibration as C
from bayesattn.posthoc import GPRead, MixtureRead
from bayesattn.posthoc._svi_core import evaluate

S = 8  # predictive draws of the sampled reads
MIXTURES = {  # row name: MixtureRead keywords
    "mixture K=4": dict(num_components=4),
    "mixture K=1": dict(num_components=1),
    "mixture K=4 s0=0.3": dict(num_components=4, prior_std=0.3),
}


def _mi(q: torch.Tensor) -> torch.Tensor:
    """Mutual information ``H[mean] − mean H`` per example ``(B,)`` of draws ``(S, B, C)``."""

    def ent(r: torch.Tensor) -> torch.Tensor:
        return -(r * r.clamp_min(1e-12).log()).sum(-1)

    return ent(q.mean(0)) - ent(q).mean(0)


def _sampled_row(p: torch.Tensor, p_ood: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    row = evaluate(p, y, p_ood)
    row["ood_auroc_mi"] = C.ood_auroc(_mi(p), _mi(p_ood))
    row["mi_in"], row["mi_out"] = float(_mi(p).mean()), float(_mi(p_ood).mean())
    return row


def _timed(fn: Any) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def run(ex: Any, name: str, seed: int, quick: bool) -> dict[str, dict[str, float]]:
    torch.manual_seed(seed)
    setup = ex.digits_setup if name == "torch" else ex.hf_setup
    model, fwd, (x_cal, y_cal), (x_te, y_te), x_ood = setup(quick, seed)
    model.eval()
    head = model.head if name == "torch" else model.classifier
    with torch.no_grad():
        z, z_ood = fwd(model, x_te), fwd(model, x_ood)
        T = C.fit_temperature(fwd(model, x_cal), y_cal)
        t_plain = _median_time(lambda: fwd(model, x_te))
    rows = {
        "trained": evaluate(torch.softmax(z, -1)[None], y_te, torch.softmax(z_ood, -1)[None]),
        "temperature": evaluate(
            torch.softmax(z / T, -1)[None], y_te, torch.softmax(z_ood / T, -1)[None]
        ),
    }
    if name == "hf":  # the task's Bayes-optimal predictive: the floor (10 % flipped labels)
        rows["bayes-optimal"] = evaluate(_oracle(x_te)[None], y_te, _oracle(x_ood)[None])
    read, fit_s = _timed(lambda: GPRead(model, head=head, forward=fwd, seed=seed).fit(x_cal, y_cal))
    mf = evaluate(read.predict(x_te).probs, y_te, read.predict(x_ood).probs)  # mean-field (1, B, C)
    mf["fit_s"], mf["cost_x"] = fit_s, _median_time(lambda: read.predict(x_te)) / t_plain
    rows["gp mean-field"] = mf
    gp = _sampled_row(
        read.predict(x_te, S, seed=seed).probs, read.predict(x_ood, S, seed=seed + 1).probs, y_te
    )
    gp["cost_x"] = _median_time(lambda: read.predict(x_te, S)) / t_plain
    rows["gp 8 samples"] = gp
    steps = 20 if quick else 300
    for label, kw in MIXTURES.items():
        mix, fit_s = _timed(
            lambda kw=kw: MixtureRead(model, forward=fwd, steps=steps, seed=seed, **kw).fit(
                x_cal, y_cal
            )
        )
        row = _sampled_row(
            mix.predict(x_te, S, seed=seed).probs, mix.predict(x_ood, S, seed=seed + 1).probs, y_te
        )
        row["kl"], row["T"], row["fit_s"] = mix.kl(), mix.temperature, fit_s
        row["cost_x"] = _median_time(lambda mix=mix: mix.predict(x_te, S), reps=3) / t_plain
        rows[label] = row
    return rows


KEYS = [
    "accuracy",
    "nll",
    "ece",
    "ood_auroc",
    "ood_auroc_mi",
    "mi_in",
    "mi_out",
    "kl",
    "T",
    "fit_s",
    "cost_x",
]


def _table(per: dict[str, list[dict[str, float]]]) -> None:
    print("| read | " + " | ".join(KEYS) + " |")
    print("|---" * (len(KEYS) + 1) + "|")
    for method, rs in per.items():
        cells = []
        for k in KEYS:
            xs = [r[k] for r in rs if k in r]
            sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
            cells.append(f"{statistics.mean(xs):.3f} ± {sd:.3f}" if xs else "")
        print(f"| {method} | " + " | ".join(cells) + " |", flush=True)


def _paired_tables(per: dict[str, list[dict[str, float]]], n: int) -> None:
    print(f"\nPaired differences (row − reference; mean, 95% t-interval, {n} seeds)\n")
    print("| read | reference | NLL | ECE | AUROC (entropy) | AUROC (MI) |")
    print("|---|---|---|---|---|---|")
    pairs = [(m, "temperature") for m in ("gp mean-field", *MIXTURES)]
    pairs += [(m, "gp mean-field") for m in MIXTURES]
    pairs += [(m, "mixture K=1") for m in ("mixture K=4",)]
    for method, ref in pairs:
        cells = [_paired(per[method], per[ref], k) for k in ("nll", "ece", "ood_auroc")]
        mi_ref = "gp 8 samples" if ref in ("temperature", "gp mean-field") else ref
        has_mi = "ood_auroc_mi" in per[method][0]
        mi = _paired(per[method], per[mi_ref], "ood_auroc_mi") + f" vs {mi_ref}" if has_mi else "—"
        print(f"| {method} | {ref} | " + " | ".join(cells) + f" | {mi} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--models", nargs="+", default=["torch", "hf"], choices=["torch", "hf"])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    ex = _example()
    for name in args.models:
        per: dict[str, list[dict[str, float]]] = {}
        for seed in range(args.seeds):
            for k, v in run(ex, name, seed, args.quick).items():
                per.setdefault(k, []).append(v)
        print(f"\n## {name} ({args.seeds} seeds, mean ± sd; {S} draws per sampled read)\n")
        _table(per)
        if args.seeds > 1:
            _paired_tables(per, args.seeds)


if __name__ == "__main__":
    main()
