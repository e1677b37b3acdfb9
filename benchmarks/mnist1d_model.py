"""Which MNIST-1D transformer the study trains: test accuracy against training time.

Trains the study's deterministic network (``bayesattn.study.datasets.mnist1d.SignalTransformer``, trained by
the study's own ``Run.train``: AdamW, warm-up, best validation epoch restored) on MNIST-1D with
one held-out class pair, for each architecture below and each seed, and prints the mean test
accuracy (the 8 in-distribution classes) and the mean training seconds of one torch thread.
The reference row is the 0.4 study model; ``study`` is ``MODEL_DEFAULTS["mnist1d"]`` as it is
in this checkout.

Run: ``python benchmarks/mnist1d_model.py [--seeds 3] [--pair 0 9] [--configs study v04 ...]``
(about 1 minute per configuration and seed on one core; timings are of this machine; run
nothing else beside it).
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

import torch

from bayesattn.study import MODEL_DEFAULTS, StudyConfig
from bayesattn.study.datasets.mnist1d import SignalTransformer
from bayesattn.study.runs import Run

#: name -> (architecture and training settings); ``patch``/``stride``: windows of ``patch`` steps
#: every ``stride`` steps
CONFIGS: dict[str, dict[str, Any]] = {
    "v04": dict(d_model=64, nhead=4, num_layers=3, dim_feedforward=128, epochs=40, lr=3e-3,
                batch_size=64, patch=4, stride=4),
    "v04_20ep": dict(d_model=64, nhead=4, num_layers=3, dim_feedforward=128, epochs=20, lr=3e-3,
                     batch_size=64, patch=4, stride=4),
    "patch8": dict(d_model=64, nhead=4, num_layers=3, dim_feedforward=128, epochs=40, lr=3e-3,
                   batch_size=64, patch=8, stride=8),
    "small": dict(d_model=32, nhead=4, num_layers=2, dim_feedforward=64, epochs=40, lr=5e-3,
                  batch_size=64, patch=4, stride=4),
    "overlap_3l": dict(d_model=64, nhead=4, num_layers=3, dim_feedforward=128, epochs=40, lr=3e-3,
                       batch_size=64, patch=8, stride=4),
    "overlap_2l_b64": dict(d_model=64, nhead=4, num_layers=2, dim_feedforward=128, epochs=30,
                           lr=3e-3, batch_size=64, patch=8, stride=4),
    "overlap_2l_20ep": dict(d_model=64, nhead=4, num_layers=2, dim_feedforward=128, epochs=20,
                            lr=3e-3, batch_size=64, patch=8, stride=4),
    "study": dict(MODEL_DEFAULTS["mnist1d"]),
}  # fmt: skip


def measure(name: str, seeds: int, pair: tuple[int, int]) -> tuple[float, float, list[float]]:
    """Mean test accuracy, mean training seconds and the per-seed accuracies of ``name``."""
    c = CONFIGS[name]
    cfg = StudyConfig(dataset="mnist1d", holdout_classes=pair, progress=False,
                      methods=("deterministic",), epochs=c["epochs"], lr=c["lr"],
                      batch_size=c["batch_size"])  # fmt: skip
    accs, secs = [], []
    for seed in range(seeds):
        run = Run.load(cfg, "mnist1d", pair, seed)
        torch.manual_seed(seed)
        net = SignalTransformer(run.data.num_classes, length=run.data.x_train.shape[1],
                                patch=c["patch"], stride=c.get("stride"), d_model=c["d_model"],
                                nhead=c["nhead"], num_layers=c["num_layers"],
                                dim_feedforward=c["dim_feedforward"], dropout=cfg.dropout)  # fmt: skip
        secs.append(run.train(net, seed, bayes=False))
        net.eval()
        with torch.no_grad():
            pred = net(run.data.x_test).argmax(-1)
        accs.append(float((pred == run.data.y_test).float().mean()))
    return statistics.fmean(accs), statistics.fmean(secs), accs


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--pair", type=int, nargs=2, default=(0, 9))
    p.add_argument("--configs", nargs="+", choices=list(CONFIGS), default=list(CONFIGS))
    p.add_argument("--epochs", type=int, default=None, help="override every config's epochs")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    if args.epochs is not None:
        for c in CONFIGS.values():
            c["epochs"] = args.epochs
    print("| model | tokens | test acc (mean) | per seed | train s (mean) |")
    print("|---|---|---|---|---|")
    for name in args.configs:
        c = CONFIGS[name]
        acc, sec, accs = measure(name, args.seeds, tuple(args.pair))  # type: ignore[arg-type]
        tokens = (40 - c["patch"]) // c["stride"] + 1
        per = ", ".join(f"{a:.3f}" for a in accs)
        print(f"| {name} | {tokens} | {acc:.3f} | {per} | {sec:.1f} |", flush=True)


if __name__ == "__main__":
    main()
