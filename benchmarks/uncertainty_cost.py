"""Inference cost of the single-network uncertainty reads against one deterministic forward pass
and a 5-member deep ensemble, measured in one process (same-process ratios, one torch thread),
on the study's two architectures (digits ViT, MNIST-1D signal transformer).

Rows: the deterministic network (logits); the 5-ensemble; the class-conditional density read
(``bayesattn.posthoc.DensityRead.predict_and_score``: one pass through the network with every
token of the last layer, then the calibrated probabilities and the OOD score from one density
evaluation); the post-hoc GP read's mean-field predictive with its variance
(``bayesattn.posthoc.GPRead`` on the features of one pass). Two reference rows: the forward pass
with every token of the last layer (what the density read's token view needs; a plain forward
computes the CLS row of the last layer only), and the density read with its probabilities and
score computed apart (two density evaluations, as 0.6's ``probs`` and ``score`` did). Timing only: the networks are
untrained (the cost of a pass does not depend on the weights' values), the reads are fitted on
their features.

Run: ``python benchmarks/uncertainty_cost.py [--repeats 15] [--quick]``
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import table, write_results  # noqa: E402
from _timing import interleaved  # noqa: E402

from bayesattn.posthoc import DensityRead, GPRead, extract_features  # noqa: E402
from bayesattn.study import StudyConfig  # noqa: E402
from bayesattn.study.runs import Run  # noqa: E402


def measure(dataset: str, repeats: int) -> list[list[object]]:
    cfg = StudyConfig(progress=False)
    run = Run.load(cfg, dataset, cfg.pairs()[0], 0)
    d = run.data
    nets = []
    for i in range(5):
        torch.manual_seed(i)
        nets.append(run.network(None).eval())
    net = nets[0]
    density = DensityRead(net).fit(d.x_train, d.y_train, val=(d.x_val, d.y_val))
    gp = GPRead(net, seed=0).fit(d.x_val, d.y_val)
    x = d.x_test
    rows = []
    for batch in (512, 1):
        xb = x[:batch] if len(x) >= batch else x.repeat(batch // len(x) + 1, *[1] * (x.dim() - 1))[:batch]

        def one(xb: torch.Tensor = xb) -> None:
            with torch.no_grad():
                net(xb)

        def ensemble(xb: torch.Tensor = xb) -> None:
            with torch.no_grad():
                torch.stack([torch.softmax(m(xb), -1) for m in nets]).mean(0)

        def dens(xb: torch.Tensor = xb) -> None:
            density.predict_and_score(xb)

        def tokens(xb: torch.Tensor = xb) -> None:
            extract_features(net, xb)  # the pass the density reads: every last-layer token

        def dens_apart(xb: torch.Tensor = xb) -> None:
            f = extract_features(net, xb)  # 0.6's calls: probs and score apart (two densities)
            views = [f.cls, f.tokens]
            density.core_.probs(f.logits, views)
            density.core_.score(views)

        def gp_mf(xb: torch.Tensor = xb) -> None:
            f = extract_features(net, xb, tokens=False)
            gp.predict(f)
            gp.score(f)

        ms = interleaved({"one": one, "ensemble": ensemble, "density": dens, "gp": gp_mf,
                          "tokens": tokens, "apart": dens_apart}, repeats)  # fmt: skip
        for k, label in (("one", "deterministic forward"), ("ensemble", "5-ensemble"),
                         ("tokens", "forward with every last-layer token (features)"),
                         ("density", "density read (probs + score)"),
                         ("apart", "density read, probs and score apart (0.6)"),
                         ("gp", "post-hoc GP read, mean-field (probs + variance)")):  # fmt: skip
            rows.append([dataset, batch, label, round(ms[k], 3), round(ms[k] / ms["one"], 2),
                         round(ms[k] / ms["ensemble"], 2)])  # fmt: skip
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--quick", action="store_true", help="3 repeats, digits only")
    args = ap.parse_args()
    torch.set_num_threads(1)
    repeats = 3 if args.quick else args.repeats
    rows = []
    for ds in ("digits",) if args.quick else ("digits", "mnist1d"):
        rows += measure(ds, repeats)
    cols = ["dataset", "batch", "method", "ms per call", "× one forward", "× 5-ensemble"]
    widths = [8, 6, 48, 12, 14, 13]
    print("".join(f"{c:>{w}s}" if i else f"{c:<{w}s}" for i, (c, w) in enumerate(zip(cols, widths, strict=True))))
    for r in rows:
        print("".join(f"{str(c):>{w}s}" if i else f"{str(c):<{w}s}"
                      for i, (c, w) in enumerate(zip(r, widths, strict=True))))  # fmt: skip
    if not args.quick:
        write_results("uncertainty_cost", "Single-network uncertainty reads: inference cost vs one "
                      "forward pass and a 5-ensemble (same process, one thread)",
                      [table("inference cost", cols, rows)])  # fmt: skip


if __name__ == "__main__":
    main()
