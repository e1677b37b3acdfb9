"""Cost of ``fit``'s data sources against in-memory tensors, in one run.

The same classifier (2 layers, d_model=64, 4 heads, T=32, Dirichlet attention) trains one epoch
(``--n`` examples, batch 64, hybrid method) from each source:

* ``tensors``: ``fit(net, (x, y))``, slices of a permutation — the baseline of every ratio;
* ``Dataset``: a map-style dataset, items collated by a ``DataLoader`` over the saved permutation;
* ``DataLoader(shuffle)``: the user's loader; its batches are drawn under the trainer's seed;
* ``stream``: an ``IterableDataset`` generating the examples on the fly (never all in memory).

Epochs are interleaved round-robin after a warm-up; the median seconds per epoch over rounds is
reported with the ratio to ``tensors``, and the resume cost of a stream (restart and skip half an
epoch) as a fraction of an epoch.

Run: ``python benchmarks/data_sources.py [--rounds 5] [--n 2048] [--threads 1]``
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from bayesattn.nn.blocks import AttentionConfig
from bayesattn.nn.networks import TransformerClassifier
from bayesattn.training import TrainConfig, Trainer
from bayesattn.training.data import as_train_data

T, VOCAB = 32, 100


def make(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(1, VOCAB, (n, T), generator=g)
    return x, (x == 3).any(1).long()


class Pairs(Dataset):
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class Stream(IterableDataset):
    def __init__(self, n: int):
        self.n = n

    def __iter__(self):
        g = torch.Generator().manual_seed(0)
        for _ in range(self.n):
            x = torch.randint(1, VOCAB, (T,), generator=g)
            yield x, (x == 3).any().long()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--n", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    x, y = make(args.n)
    sources = {
        "tensors": lambda: (x, y),
        "Dataset": lambda: Pairs(x, y),
        "DataLoader(shuffle)": lambda: DataLoader(Pairs(x, y), batch_size=64, shuffle=True),
        "stream": lambda: Stream(args.n),
    }
    cfg = TrainConfig(epochs=1, batch_size=64, lr=1e-3, lr_decay="none", progress=False)
    torch.manual_seed(0)
    net = TransformerClassifier(
        2,
        vocab_size=VOCAB,
        d_model=64,
        nhead=4,
        num_layers=2,
        dim_feedforward=128,
        max_len=T,
        attention=AttentionConfig(family="dirichlet"),
    )
    times: dict[str, list[float]] = {k: [] for k in sources}
    for r in range(args.rounds + 1):  # round 0 warms up
        for name, data in sources.items():
            trainer = Trainer(net, cfg)
            t0 = time.perf_counter()
            trainer.fit(data(), num_data=args.n if name == "stream" else None)
            if r:
                times[name].append(time.perf_counter() - t0)
    base = statistics.median(times["tensors"])
    print(
        f"one epoch of {args.n} examples, batch 64, {args.threads} thread(s), median of "
        f"{args.rounds} rounds"
    )
    for name, ts in times.items():
        m = statistics.median(ts)
        print(f"  {name:22s} {m:7.3f} s/epoch   ratio {m / base:5.2f}")
    src = as_train_data(Stream(args.n), "train_data", 64, num_data=args.n)
    t0 = time.perf_counter()
    skipped = src.batches(None, (args.n // 64) // 2)
    next(skipped)
    skip = time.perf_counter() - t0
    print(
        f"  stream resume: restart + skip half an epoch {skip:.3f} s "
        f"({skip / statistics.median(times['stream']):.3f} of an epoch)"
    )


if __name__ == "__main__":
    main()
