"""Which fortunes transformer the study trains: validation NLL and accuracy against training time.

Trains the study's deterministic network on the fortunes tokens (by the study's own
``Run.members``: AdamW, warm-up, best validation epoch restored) for each setting below on two
runs (held-out pair 4/6 with seed 0, pair 2/7 with seed 1) and prints the mean **validation**
NLL, validation accuracy and training seconds of one torch thread. The study's fortunes model
was chosen from this table (docs/which-attention.md, "Tokens"); no test split is read.

Run: ``python benchmarks/fortunes_model.py [--configs 64-20-0.1 64-10-0.1 ...]`` (about 20 s per
setting and run on one core; needs ``apt-get install fortunes``; run nothing else beside it).
"""

from __future__ import annotations

import argparse
import statistics

import torch
import torch.nn.functional as F

from bayesattn.study import StudyConfig
from bayesattn.study.runs import Run

#: ``d_model-epochs-dropout`` (feed-forward width 2·d_model, the other settings the study's)
CONFIGS = ("64-20-0.1", "64-10-0.1", "32-20-0.1", "32-10-0.1", "32-20-0.3", "64-20-0.3")
RUNS = (((4, 6), 0), ((2, 7), 1))


def measure(name: str) -> tuple[float, float, float]:
    """Mean validation NLL, validation accuracy and training seconds of setting ``name``."""
    d, e, p = name.split("-")
    d_model, epochs, dropout = int(d), int(e), float(p)
    nll, acc, secs = [], [], []
    for pair, seed in RUNS:
        cfg = StudyConfig(dataset="fortunes", d_model=d_model, dim_feedforward=2 * d_model,
                          epochs=epochs, dropout=dropout, holdout_classes=pair, seeds=1,
                          progress=False)  # fmt: skip
        run = Run.load(cfg, "fortunes", pair, seed)
        nets, s = run.members(1)
        with torch.no_grad():
            logits = nets[0](run.data.x_val)  # (N, C)
        nll.append(F.cross_entropy(logits, run.data.y_val).item())
        acc.append((logits.argmax(-1) == run.data.y_val).float().mean().item())
        secs.append(s[0])
    return statistics.mean(nll), statistics.mean(acc), statistics.mean(secs)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), metavar="D-E-P",
                    help="settings d_model-epochs-dropout (default: %(default)s)")  # fmt: skip
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    print(f"{'d_model-epochs-dropout':>24} {'val NLL':>8} {'val acc':>8} {'train s':>8}")
    for name in args.configs:
        nll, acc, secs = measure(name)
        print(f"{name:>24} {nll:>8.3f} {acc:>8.3f} {secs:>8.1f}", flush=True)


if __name__ == "__main__":
    main()
