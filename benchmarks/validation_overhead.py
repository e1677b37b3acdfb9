"""Cost of input validation (finite checks of queries, keys, logits and log-priors; dtype, shape and
argument checks) on a training step and on an attention forward pass that returns weights.

The finite checks run under Pyro's validation flag (on by default); this script times the same
work with ``pyro.enable_validation(True)`` and ``False`` in one process, interleaved, and prints
the ratio (CPU time, best of several repeats, one thread).

    python benchmarks/validation_overhead.py
"""

from __future__ import annotations

import time

import pyro
import torch

import bayesattn as ba
from bayesattn.nn import AttentionConfig


def best_ms(fn, n: int, repeats: int = 5) -> float:
    for _ in range(3):
        fn()
    best = float("inf")
    for _ in range(repeats):
        t = time.process_time()
        for _ in range(n):
            fn()
        best = min(best, (time.process_time() - t) / n)
    return best * 1e3


def main() -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    net = ba.TransformerClassifier(10, vocab_size=50, d_model=64, nhead=4, num_layers=2,
                                   dim_feedforward=128, attention=AttentionConfig("dirichlet"))
    x, y = torch.randint(1, 50, (64, 32)), torch.randint(0, 10, (64,))
    opt = torch.optim.AdamW(net.parameters(), 1e-3)

    def step():
        opt.zero_grad()
        loss, _ = net.elbo_loss(x, y)
        loss.backward()
        opt.step()

    mha = ba.BayesianMultiheadAttention(64, 4, batch_first=True)
    h = torch.randn(64, 64, 64)
    mask = torch.rand(64, 64) < 0.1

    def forward():
        mha(h, h, h, key_padding_mask=mask, need_weights=True)

    for name, fn, n in (("train step (hybrid, dirichlet)", step, 10),
                        ("attention forward with weights", forward, 30)):
        on, off = [], []
        for _ in range(3):  # interleaved: load changes hit both alike
            pyro.enable_validation(True)
            on.append(best_ms(fn, n))
            pyro.enable_validation(False)
            off.append(best_ms(fn, n))
        pyro.enable_validation(True)
        print(f"{name}: validation on {min(on):.2f} ms, off {min(off):.2f} ms, "
              f"ratio on/off {min(on) / min(off):.3f}")


if __name__ == "__main__":
    main()
