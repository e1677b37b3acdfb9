"""Helper of ``tests/training/test_lightning.py``: train a tiny network under ``lightning.Trainer``.

Run as a script (Lightning's ``strategy="ddp"`` re-launches this file for every further rank)::

    python tests/training/ddp_run.py --devices 2 --out OUT [--epochs 2] [--resume CKPT]
        [--method hybrid] [--strategy ddp|ddp_spawn]

With ``--strategy ddp_spawn`` Lightning pickles the module into 2 fresh (spawned) processes and
copies rank 0's weights back into this one.

The network has Bayesian projection weights (global latents, whose KL the data plate's scale
weighs against the likelihood) and deterministic attention without dropout, so that every draw is
a function of the seed and the step: a 2-process run with per-rank batch ``b`` and a 1-process run
with batch ``2b`` then see the same data and the same draws in every step, and must end with the
same parameters. Rank 0 writes ``OUT/params.pt``; every rank writes ``OUT/rank{r}.json`` (the
``num_data`` it scaled the ELBO to, its batch size); a checkpoint is kept after every epoch.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import lightning as L
import torch
from torch import Tensor

GLOBAL_BATCH = 8
N = 32


def _write_rank_info(trainer, module, loader, out: Path) -> None:
    info = {
        "rank": trainer.global_rank,
        "world_size": trainer.world_size,
        "num_data": module.num_data,
        "batch_size": loader.batch_size,
        "global_step": trainer.global_step,
        "pid": os.getpid(),
    }
    (out / f"rank{trainer.global_rank}.json").write_text(json.dumps(info))


class RankInfo(L.Callback):
    """Every rank writes ``OUT/rank{r}.json`` when training ends (in the spawned processes too,
    under ``ddp_spawn``; top level, so the trainer holding it pickles)."""

    def __init__(self, out: Path, loader) -> None:
        self.out, self.loader = out, loader

    def on_train_end(self, trainer, pl_module) -> None:
        _write_rank_info(trainer, pl_module, self.loader, self.out)


def run(
    devices: int,
    out: Path,
    epochs: int = 2,
    resume: Path | None = None,
    method: str = "hybrid",
    strategy: str = "ddp",
) -> dict[str, Tensor]:
    """Train; returns the final network state (every rank)."""
    args = argparse.Namespace(
        devices=devices, out=Path(out), epochs=epochs, resume=resume, method=method
    )

    from lightning.pytorch.callbacks import ModelCheckpoint
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    from bayesattn import AttentionConfig, TransformerClassifier, bayesian_projections
    from bayesattn.training.lightning import BayesianLightningModule
    from tests.tasks import contains3  # the repository root is on PYTHONPATH

    x, y = contains3(N, 0, T=6)
    torch.manual_seed(0)
    net = TransformerClassifier(
        2,
        vocab_size=10,
        d_model=8,
        nhead=2,
        num_layers=1,
        dim_feedforward=16,
        dropout=0.0,
        max_len=8,
        attention=AttentionConfig(family=None),
    )
    # float64 throughout (built in float64, so a checkpoint also loads into float64 weights):
    # Adam would amplify float32 summation-order noise between 1 and 2 processes
    net = net.double()
    bayesian_projections(net, targets=("*self_attn.in_proj_weight", "*linear1.weight"))
    module = BayesianLightningModule(
        net, method=args.method, lr=0.02, warmup_steps=2, kl_anneal_steps=3, clip_norm=0.5, seed=1
    )
    data = TensorDataset(x, y)
    if args.devices == 1:
        # the order Lightning's DistributedSampler (shuffle=True, seed 0) gives R ranks, as one
        # stream: rank r takes perm[r::R], so the R per-rank batches k together are the
        # one-process batch perm[kRb:(k+1)Rb]
        sampler = DistributedSampler(data, num_replicas=1, rank=0, shuffle=True, seed=0)
        loader = DataLoader(data, batch_size=GLOBAL_BATCH, sampler=sampler)
    else:  # Lightning injects DistributedSampler(shuffle=True, seed=0) into a shuffled loader
        loader = DataLoader(data, batch_size=GLOBAL_BATCH // args.devices, shuffle=True)
    args.out.mkdir(parents=True, exist_ok=True)
    ckpt = ModelCheckpoint(
        dirpath=args.out,
        filename="epoch{epoch}",
        every_n_epochs=1,
        save_top_k=-1,
        auto_insert_metric_name=False,
    )
    trainer = L.Trainer(
        max_epochs=args.epochs,
        accelerator="cpu",
        devices=args.devices,
        strategy=strategy if args.devices > 1 else "auto",
        logger=False,
        callbacks=[ckpt, RankInfo(args.out, loader)],
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        precision="64-true",
    )
    trainer.fit(module, loader, ckpt_path=args.resume)
    state = {k: v.detach().clone() for k, v in module.network.state_dict().items()}
    if trainer.global_rank == 0:
        torch.save(state, args.out / "params.pt")
    return state


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--devices", type=int, default=1)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--resume", type=Path, default=None)
    ap.add_argument("--method", default="hybrid")
    ap.add_argument("--strategy", default="ddp", choices=["ddp", "ddp_spawn"])
    a = ap.parse_args()
    torch.set_num_threads(1)
    run(a.devices, a.out, a.epochs, a.resume, a.method, a.strategy)


if __name__ == "__main__":
    main()
