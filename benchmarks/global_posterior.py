"""Global, distance-aware attention posteriors against the study's baselines (issue 17).

Trains each method on the study's digits setting (its ``_vit``/``_train`` building blocks, the
study left unchanged) for every seed and held-out class pair, and prints the mean and a 95%
t-interval over the (pair, seed) runs of accuracy, NLL, ECE, held-out AUROC (predictive entropy
and mutual information), mean MI in and out of distribution, the KL of the global latents
(nats) and the training / inference time ratios against the deterministic network trained and
timed in the same process (inference: ``num_samples`` draws, batch 512).

Methods:

* ``deterministic`` and ``temperature`` (the same network, temperature fitted on validation);
* ``ensemble``: ``--ensemble`` deterministic members (the first is ``deterministic``);
* ``recommended``: ``AttentionConfig.last_layer()`` as it is in this checkout (the row keeps its
  earlier name, that of the stored results);
* ``logistic_normal_last``: the 0.3 recommendation (logistic-normal attention, last layer);
* ``sgpa``: ``AttentionConfig(read="sparse_gp", layers="last")`` (GP read of the CLS row, initial
  q(v) mean drawn from the prior, S = 0.3² I; ``sgpa_prior_init``: q(v) = p(v) initially;
  ``sgpa_small``/``sgpa_m64``: output scale 0.25 / 64 inducing keys; ``ln_sgpa``: with the
  logistic-normal family of ``logistic_normal_last``);
The epinet head (``epinet``, ``epinet_p3``; dropped in 0.5), the DUE-style sparse variational GP
read-out of the CLS output (``gp_readout``, ``gp_readout_m128``, ``gp_readout_matern``) and the
SNGP-style random-feature GP read-out with a Laplace covariance (``rff_readout``; ``ln_rff``:
with the logistic-normal family; both dropped in 0.4) earned no place: their numbers are in
``docs/which-attention.md`` ("Variants tried and not kept").

Run: ``python benchmarks/global_posterior.py --seeds 3 --pairs 8,9 3,5`` (``--epochs 40`` is the
study's; ``--methods`` picks a subset).
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable
from typing import Any

import pyro
import torch
from torch import Tensor

from bayesattn import calibration as C
from bayesattn.data import load_digits_data
from bayesattn.nn.blocks import AttentionConfig
from bayesattn.nn.networks import BayesianNetwork
from bayesattn.study import StudyConfig, _train, _vit
from bayesattn.uncertainty import PredictionResult, predict, predict_ensemble

_T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26}

_CONFIGS: dict[str, Callable[[], AttentionConfig]] = {
    "recommended": AttentionConfig.last_layer,
    "logistic_normal_last": lambda: AttentionConfig(
        family="logistic_normal",
        layers="last",
        family_kwargs={"input_dependent": True, "model_location": "attention"},
    ),
    "sgpa": lambda: AttentionConfig(
        read="sparse_gp", layers="last", read_kwargs={"init_mean": 1.0, "init_scale": 0.3}
    ),
    "sgpa_prior_init": lambda: AttentionConfig(read="sparse_gp", layers="last"),
    "sgpa_small": lambda: AttentionConfig(
        read="sparse_gp", layers="last", read_kwargs={"outputscale": 0.25}
    ),
    "sgpa_m64": lambda: AttentionConfig(
        read="sparse_gp", layers="last", read_kwargs={"num_inducing": 64}
    ),
    "ln_sgpa": lambda: AttentionConfig(
        family="logistic_normal",
        layers="last",
        family_kwargs={"input_dependent": True, "model_location": "attention"},
        read="sparse_gp",
    ),
}
METHODS = ("deterministic", "temperature", "ensemble", *_CONFIGS)


def _scores(res_in: PredictionResult, res_out: PredictionResult, y: Tensor) -> dict[str, float]:
    p = res_in.mean_probs
    return {
        "acc": C.accuracy(p, y),
        "nll": C.negative_log_likelihood(p, y),
        "ece": C.expected_calibration_error(p, y),
        "auroc_H": C.ood_auroc(res_in.predictive_entropy, res_out.predictive_entropy),
        "auroc_MI": C.ood_auroc(res_in.mutual_information, res_out.mutual_information),
        "MI_in": float(res_in.mutual_information.mean()),
        "MI_out": float(res_out.mutual_information.mean()),
    }


def _timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    fn()  # warm-up
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return out, sorted(times)[1]


def _tempered(res: PredictionResult, t: float) -> PredictionResult:
    logp = torch.log(res.probs.clamp_min(1e-12)) / t
    return PredictionResult(probs=torch.softmax(logp, -1), attention={}, kind=res.kind)


def run_setting(
    seed: int, pair: tuple[int, int], methods: list[str], args: argparse.Namespace
) -> dict[str, dict[str, float]]:
    cfg = StudyConfig(epochs=args.epochs, holdout_classes=pair, progress=False)
    data = load_digits_data(seed=seed, holdout_classes=pair)
    C_in = data.num_classes
    S = args.samples
    rows: dict[str, dict[str, float]] = {}

    def train(attention: AttentionConfig | None, s: int) -> tuple[BayesianNetwork, float]:
        pyro.clear_param_store()
        torch.manual_seed(s)
        net = _vit(cfg, C_in, attention)
        secs = _train(net, data, cfg, s, bayes=attention is not None)
        return net.eval(), secs

    det, det_s = train(None, seed)

    def det_pred(x: Tensor) -> PredictionResult:
        return predict_ensemble([det], x, batch_size=512)

    res_in, det_t = _timed(lambda: det_pred(data.x_test))
    res_out = det_pred(data.x_ood_classes)
    base = {"train_x": 1.0, "infer_x": 1.0, "KL": 0.0}
    if "deterministic" in methods:
        rows["deterministic"] = {**_scores(res_in, res_out, data.y_test), **base}
    if "temperature" in methods:
        with torch.no_grad():
            t = C.fit_temperature(det(data.x_val), data.y_val)
        rows["temperature"] = {
            **_scores(_tempered(res_in, t), _tempered(res_out, t), data.y_test),
            **base,
        }
    if "ensemble" in methods:
        nets, secs = [det], det_s
        for i in range(1, args.ensemble):
            n, s_ = train(None, seed + 1000 * i)
            nets.append(n)
            secs += s_

        def ens(x: Tensor) -> PredictionResult:
            return predict_ensemble(nets, x, batch_size=512)

        r_in, t_in = _timed(lambda: ens(data.x_test))
        rows["ensemble"] = {
            **_scores(r_in, ens(data.x_ood_classes), data.y_test),
            "train_x": secs / det_s,
            "infer_x": t_in / det_t,
            "KL": 0.0,
        }
    for m in methods:
        if m not in _CONFIGS:
            continue
        net, secs = train(_CONFIGS[m](), seed)

        def pred(x: Tensor, net: BayesianNetwork = net) -> PredictionResult:
            torch.manual_seed(seed)
            return predict(net, x, num_samples=S, batch_size=512, keep_attention=False)

        r_in, t_in = _timed(lambda: pred(data.x_test))
        kl = sum(float(g.kl().detach()) for g in net.global_latents())
        rows[m] = {
            **_scores(r_in, pred(data.x_ood_classes), data.y_test),
            "train_x": secs / det_s,
            "infer_x": t_in / det_t,
            "KL": kl,
        }
    return rows


def _interval(xs: list[float]) -> str:
    n = len(xs)
    mean = sum(xs) / n
    if n < 2:
        return f"{mean:.3f}"
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    half = _T95.get(n - 1, 1.96) * sd / math.sqrt(n)
    return f"{mean:.3f} ± {half:.3f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--pairs", nargs="+", default=["8,9", "3,5"])
    ap.add_argument("--epochs", type=int, default=40)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--ensemble", type=int, default=5)
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    args = ap.parse_args()
    torch.set_num_threads(1)
    pairs = [tuple(int(c) for c in p.split(",")) for p in args.pairs]
    per: dict[str, list[dict[str, float]]] = {m: [] for m in args.methods}
    for pair in pairs:
        for seed in range(args.seed, args.seed + args.seeds):
            rows = run_setting(seed, pair, list(args.methods), args)  # type: ignore[arg-type]
            for m, r in rows.items():
                per[m].append(r)
                print(f"# pair {pair} seed {seed} {m}: "
                      + " ".join(f"{k}={v:.4f}" for k, v in r.items()), flush=True)
    keys = ["acc", "nll", "ece", "auroc_H", "auroc_MI", "MI_in", "MI_out", "KL", "train_x",
            "infer_x"]  # fmt: skip
    n = len(pairs) * args.seeds
    print(f"\n{n} runs (pairs {args.pairs} x {args.seeds} seeds), {args.epochs} epochs, "
          f"S={args.samples}; mean ± 95% t-interval\n")  # fmt: skip
    print("| method | " + " | ".join(keys) + " |")
    print("|---" * (len(keys) + 1) + "|")
    for m, rs in per.items():
        print(f"| {m} | " + " | ".join(_interval([r[k] for r in rs]) for k in keys) + " |")


if __name__ == "__main__":
    main()
