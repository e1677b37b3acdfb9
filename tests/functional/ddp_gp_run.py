"""Helper of ``tests/functional/test_gaussian_process.py``: train a tiny network with a
sparse-GP (SGPA) read in its last attention layer (a global latent) under ``lightning.Trainer``
with 2-process DDP on CPU.

Run as a script (Lightning's ``strategy="ddp"`` re-launches this file for the second rank)::

    python tests/functional/ddp_gp_run.py --out OUT

Every rank writes ``OUT/rank{r}.pt``: its final parameters, the ``num_data`` it scaled the ELBO
to, its batch size and the KL of the global latent.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

N = 32


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    torch.set_num_threads(1)

    import lightning as L
    from torch.utils.data import DataLoader, TensorDataset

    from bayesattn import AttentionConfig, TransformerClassifier
    from bayesattn.training.lightning import BayesianLightningModule
    from tests.tasks import contains3  # the repository root is on PYTHONPATH

    x, y = contains3(N, 0, T=6)
    torch.manual_seed(0)
    cfg = AttentionConfig(read="sparse_gp", layers="last", read_kwargs={"num_inducing": 6})
    net = TransformerClassifier(
        2, vocab_size=10, d_model=8, nhead=2, num_layers=1, dim_feedforward=16, dropout=0.0,
        max_len=8, attention=cfg,
    ).double()  # fmt: skip
    module = BayesianLightningModule(net, lr=0.02, seed=1)
    loader = DataLoader(TensorDataset(x, y), batch_size=4, shuffle=True)
    trainer = L.Trainer(
        max_epochs=2, accelerator="cpu", devices=2, strategy="ddp", logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, precision="64-true",
    )  # fmt: skip
    trainer.fit(module, loader)
    a.out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().clone() for k, v in module.network.state_dict().items()}
    info = {"num_data": module.num_data, "batch_size": loader.batch_size, "world": trainer.world_size,
            "kl": float(net.encoder.layers[0].self_attn.gp_read.kl().detach()), "state": state}  # fmt: skip
    torch.save(info, a.out / f"rank{trainer.global_rank}.pt")


if __name__ == "__main__":
    main()
