"""Training-step cost of Bayesian attention against plain PyTorch, in one run.

A 2-layer classifier (d_model=64, 4 heads, dim_feedforward=128, T=32, B=64, Dirichlet attention
in every layer; ``--families`` picks the families) takes one optimiser step per call in each configuration:

* ``plain``: the same ``TransformerClassifier`` with deterministic attention (``attention=None``,
  fused SDPA), cross-entropy, ``AdamW``, ``clip_grad_norm_`` — the baseline of every ratio;
* ``torch.nn``: ``torch.nn.TransformerEncoder`` of the same sizes (embedding, mean pooling, head);
* ``hybrid/svi, attention=None``: the trainer on the deterministic network (no latent sites):
  the trainer's and Pyro's own overhead, without any attention sampling;
* ``hybrid``: :class:`bayesattn.training.Trainer` ``method="hybrid"`` (one pass, analytic KL);
* ``svi``: ``method="svi"`` (``Trace_ELBO``: guide pass + replayed model pass);
* 8 particles: svi vectorised / sequential, hybrid vectorised / sequential.

Steps are interleaved round-robin (one step of each configuration per round) after a warm-up, and
the median over rounds is reported, with the intra-op thread count fixed. ``--profile`` prints the
top ``torch.profiler`` operators and cProfile functions of one svi and one hybrid step.

Run: ``python benchmarks/training_speed.py [--rounds 25] [--threads 1] [--profile]``
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import time

import pyro
import torch
from _results import table, write_results
from torch import nn

from bayesattn.nn.blocks import AttentionConfig
from bayesattn.nn.networks import TransformerClassifier
from bayesattn.training import TrainConfig, Trainer

B, T, D, H, FF, LAYERS, VOCAB, CLASSES = 64, 32, 64, 4, 128, 2, 100, 2
NUM_DATA = 100 * B


def bayes_net(family: str | None = "dirichlet", pooling: str = "mean") -> TransformerClassifier:
    """``family="recommended"``: :meth:`AttentionConfig.last_layer` (use with CLS pooling)."""
    att = (
        AttentionConfig.last_layer() if family == "recommended" else AttentionConfig(family=family)
    )
    return TransformerClassifier(
        CLASSES,
        vocab_size=VOCAB,
        d_model=D,
        nhead=H,
        num_layers=LAYERS,
        dim_feedforward=FF,
        dropout=0.1,
        max_len=T,
        pooling=pooling,
        attention=att,
    )


class TorchEncoderClassifier(nn.Module):
    """Reference: torch.nn.TransformerEncoder with the same sizes (pre-norm, mean pooling)."""

    def __init__(self) -> None:
        super().__init__()
        self.tokens = nn.Embedding(VOCAB, D)
        self.pos = nn.Embedding(T + 1, D)
        layer = nn.TransformerEncoderLayer(D, H, FF, dropout=0.1, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(
            layer, LAYERS, norm=nn.LayerNorm(D), enable_nested_tensor=False
        )
        self.head = nn.Linear(D, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.tokens(x) * D**0.5 + self.pos(torch.arange(x.shape[1]))
        pad = x == 0
        h = self.encoder(h, src_key_padding_mask=pad)
        keep = (~pad).float().unsqueeze(-1)
        return self.head((h * keep).sum(1) / keep.sum(1).clamp_min(1.0))


def plain_stepper(model: nn.Module):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model.train()

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    return step


def trainer_stepper(
    method: str,
    particles: int = 1,
    vectorize: bool = True,
    family: str | None = "dirichlet",
    pooling: str = "mean",
):
    cfg = TrainConfig(
        method=method,
        epochs=1000,
        max_steps=1,
        batch_size=B,
        num_particles=particles,
        vectorize_particles=vectorize,
        lr=1e-3,
        clip_norm=1.0,
        progress=False,
    )
    trainer = Trainer(bayes_net(family, pooling), cfg)
    x = torch.randint(1, VOCAB, (NUM_DATA, T))
    y = torch.randint(0, CLASSES, (NUM_DATA,))
    trainer.fit((x, y))  # sets up optimiser, param store, schedules; one step
    trainer.network.train()

    def step(xb, yb):
        trainer.train_step(xb, yb)

    return step


def make_steppers(families: list[str], particles: bool) -> dict:
    torch.manual_seed(0)
    pyro.clear_param_store()
    steppers = {
        "plain (attention=None)": plain_stepper(bayes_net(None)),
        "torch.nn.TransformerEncoder": plain_stepper(TorchEncoderClassifier()),
        "hybrid, attention=None": trainer_stepper("hybrid", family=None),
        "svi, attention=None": trainer_stepper("svi", family=None),
    }
    # the last-layer recipe (AttentionConfig.last_layer; the row keeps its stored name) against
    # the same CLS-pooled network
    steppers["plain (attention=None), cls pooling"] = plain_stepper(bayes_net(None, "cls"))
    steppers["hybrid P=1 recommended, cls pooling"] = trainer_stepper(
        "hybrid", family="recommended", pooling="cls"
    )
    for fam in families:
        steppers[f"hybrid P=1 {fam}"] = trainer_stepper("hybrid", family=fam)
        steppers[f"svi P=1 {fam}"] = trainer_stepper("svi", family=fam)
    if particles:
        fam = families[0]
        steppers[f"hybrid P=8 vectorised {fam}"] = trainer_stepper("hybrid", 8, True, fam)
        steppers[f"hybrid P=8 sequential {fam}"] = trainer_stepper("hybrid", 8, False, fam)
        steppers[f"svi P=8 vectorised {fam}"] = trainer_stepper("svi", 8, True, fam)
        steppers[f"svi P=8 sequential {fam}"] = trainer_stepper("svi", 8, False, fam)
    return steppers


def benchmark(rounds: int, warmup: int, families: list[str], particles: bool) -> dict[str, float]:
    steppers = make_steppers(families, particles)
    g = torch.Generator().manual_seed(1)
    x = torch.randint(1, VOCAB, (B, T), generator=g)
    y = torch.randint(0, CLASSES, (B,), generator=g)
    times: dict[str, list[float]] = {k: [] for k in steppers}
    for r in range(warmup + rounds):
        for name, step in steppers.items():  # interleaved: drift hits every config alike
            t0 = time.perf_counter()
            step(x, y)
            dt = time.perf_counter() - t0
            if r >= warmup:
                times[name].append(dt)
    return {k: 1e3 * statistics.median(v) for k, v in times.items()}


def profile(top: int) -> None:
    x = torch.randint(1, VOCAB, (B, T))
    y = torch.randint(0, CLASSES, (B,))
    for method in ("svi", "hybrid"):
        torch.manual_seed(0)
        pyro.clear_param_store()
        step = trainer_stepper(method)
        for _ in range(3):
            step(x, y)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            step(x, y)
        print(f"\n=== torch.profiler: one {method} step (top {top} by self CPU time) ===")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top))
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(5):
            step(x, y)
        pr.disable()
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(top)
        print(f"=== cProfile: 5 {method} steps (top {top} by own time) ===")
        print("\n".join(s.getvalue().splitlines()[: top + 12]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=25, help="timed steps per config (median)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed rounds first")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument("--profile", action="store_true", help="profile one svi and one hybrid step")
    ap.add_argument("--top", type=int, default=15, help="rows shown per profile")
    ap.add_argument(
        "--families",
        nargs="+",
        default=["dirichlet", "logistic_normal", "weibull", "concrete"],
        choices=["dirichlet", "logistic_normal", "weibull", "concrete"],
        help="attention families to time (particle runs use the first)",
    )
    ap.add_argument("--no-particles", action="store_true", help="skip the 8-particle runs")
    ap.add_argument("--quick", action="store_true", help="5 rounds, one family, no particles")
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.warmup, args.families, args.no_particles = 5, 1, args.families[:1], True
    torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, pyro {pyro.__version__}, threads={torch.get_num_threads()}; "
        f"{LAYERS} layers, d_model={D}, heads={H}, dim_ff={FF}, T={T}, B={B}, "
        f"families={args.families}, dropout=0.1, AdamW + clip_grad_norm"
    )
    res = benchmark(args.rounds, args.warmup, args.families, not args.no_particles)
    base = res["plain (attention=None)"]
    base_cls = res["plain (attention=None), cls pooling"]
    print(f"\nmedian of {args.rounds} interleaved steps after {args.warmup} warm-up rounds")
    print(f"{'configuration':<42} {'ms/step':>9} {'vs plain':>9}  (cls rows: vs plain cls)")
    rows = []
    for name, ms in res.items():
        ref = base_cls if name.endswith("cls pooling") else base
        print(f"{name:<42} {ms:9.2f} {ms / ref:8.2f}x")
        rows.append([name, round(ms, 3), round(ms / ref, 3)])
    path = write_results(
        "training_speed",
        "Training-step cost against plain PyTorch",
        [
            table(
                f"One optimiser step, median of {args.rounds} interleaved rounds "
                f"({LAYERS} layers, d_model={D}, T={T}, B={B}; cls rows against plain cls)",
                ["configuration", "ms/step", "ratio vs plain"],
                rows,
            )
        ],
    )
    print(f"wrote {path}")
    if args.profile:
        profile(args.top)


if __name__ == "__main__":
    main()
