"""Prediction-time cost of posterior-predictive uncertainty against one deterministic pass.

The study's ViT (8×8 images, 2×2 patches: 17 tokens with CLS; ``--d-model`` 32, 4 heads, 2 layers)
predicts a batch of ``--batch`` images in each configuration; every ratio is against the plain
deterministic forward pass (``net(x)`` under ``no_grad``) of the same architecture, timed in the
same rounds (interleaved, median over rounds, fixed thread count):

* ``recommended S=…``: :meth:`AttentionConfig.last_layer` (the row keeps the name of the stored
  results) through :func:`bayesattn.uncertainty.predict` (the trunk is computed once, the last layer's CLS row draws the ``S`` samples);
* ``dirichlet, every layer S=…``: the former default (Dirichlet attention in every layer: the
  first layer's projections and scores are computed once, every sample runs the rest);
* ``MC dropout S=…`` and ``ensemble ×M``: the baselines (:func:`~bayesattn.uncertainty.predict_mc_dropout`,
  :func:`~bayesattn.uncertainty.predict_ensemble`).

Writes ``benchmarks/results/predictive_speed.json`` (see ``_results.py``).

Run: ``python benchmarks/predictive_speed.py [--rounds 20] [--threads 1] [--batch 256] [--quick]``
"""

from __future__ import annotations

import argparse
import statistics
import time

import pyro
import torch
from _results import table, write_results

from bayesattn.nn.blocks import AttentionConfig
from bayesattn.nn.networks import VisionTransformer
from bayesattn.uncertainty import predict, predict_ensemble, predict_mc_dropout

SAMPLES = (1, 8, 32)


def vit(attention: AttentionConfig | None, d_model: int) -> VisionTransformer:
    return VisionTransformer(
        10,
        image_size=8,
        patch_size=2,
        d_model=d_model,
        nhead=4,
        num_layers=2,
        dim_feedforward=2 * d_model,
        dropout=0.1,
        attention=attention,
    ).eval()


def configs(d_model: int, ensemble: int) -> dict:
    torch.manual_seed(0)
    pyro.clear_param_store()
    det = vit(None, d_model)
    rec = vit(AttentionConfig.last_layer(), d_model)
    old = vit(AttentionConfig(family="dirichlet"), d_model)
    members = [vit(None, d_model) for _ in range(ensemble)]

    def forward(x):
        with torch.no_grad():
            return det(x)

    out = {"deterministic forward": forward}
    for S in SAMPLES:
        out[f"recommended S={S}"] = lambda x, S=S: predict(rec, x, S, keep_attention=False)
    for S in SAMPLES:
        out[f"dirichlet, every layer S={S}"] = lambda x, S=S: predict(
            old, x, S, keep_attention=False
        )
    out["MC dropout S=8"] = lambda x: predict_mc_dropout(det, x, 8)
    out[f"ensemble x{ensemble}"] = lambda x: predict_ensemble(members, x)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--d-model", type=int, default=32)
    ap.add_argument("--ensemble", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="5 rounds of a batch of 64 (smoke run)")
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.warmup, args.batch = 5, 1, 64
    torch.set_num_threads(args.threads)
    fns = configs(args.d_model, args.ensemble)
    x = torch.rand(args.batch, 8, 8, generator=torch.Generator().manual_seed(1))
    times: dict[str, list[float]] = {k: [] for k in fns}
    for r in range(args.warmup + args.rounds):
        for name, fn in fns.items():  # interleaved: drift hits every configuration alike
            t0 = time.perf_counter()
            fn(x)
            if r >= args.warmup:
                times[name].append(time.perf_counter() - t0)
    print(
        f"torch {torch.__version__}, threads={torch.get_num_threads()}, batch={args.batch}, "
        f"d_model={args.d_model}; median of {args.rounds} interleaved rounds"
    )
    base = statistics.median(times["deterministic forward"])
    print(f"{'configuration':<32} {'ms/example':>11} {'vs forward':>11}")
    med = {name: statistics.median(ts) for name, ts in times.items()}
    for name, m in med.items():
        print(f"{name:<32} {1e3 * m / args.batch:11.4f} {m / base:10.2f}x")
    shapes = f"batch {args.batch}, d_model={args.d_model}, median of {args.rounds} rounds"
    rows = [[n, round(1e3 * m / args.batch, 4), round(m / base, 3)] for n, m in med.items()]
    by_s = [
        [S]
        + [round(med[f"{k} S={S}"] / base, 3) for k in ("recommended", "dirichlet, every layer")]
        for S in SAMPLES
    ]
    path = write_results(
        "predictive_speed",
        "Posterior-predictive cost against one deterministic pass",
        [
            table(
                f"Every configuration ({shapes})",
                ["configuration", "ms/example", "ratio vs forward"],
                rows,
            ),
            table(
                f"Cost against the number of samples S ({shapes})",
                ["S", "recommended: ratio vs forward", "dirichlet every layer: ratio vs forward"],
                by_s,
            ),
        ],
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
