"""Scale out: train a Bayesian-attention vision transformer with Lightning, on 1..N processes.

The 8x8 digits (scikit-learn) train a ``bayesattn.VisionTransformer`` with Dirichlet attention,
wrapped in ``bayesattn.training.lightning.BayesianLightningModule`` (the one-pass ELBO, KL annealing, a
warm-up + cosine ``torch.optim.lr_scheduler`` schedule) and run by ``lightning.Trainer``. With
``--devices N`` (N > 1) the Trainer runs ``strategy="ddp"``: N processes, each with 1/N of every
global batch (Lightning's ``DistributedSampler``), gradients averaged; every rank scales the ELBO's
data plate to the full training-set size. Validation is the posterior predictive
(``bayesattn.uncertainty.predict``): accuracy, NLL and ECE through ``torchmetrics``, averaged over
all processes.

Writes ``validation_metrics.png`` (accuracy, NLL, ECE per epoch) and ``reliability_diagram.png``
(test set, posterior predictive), from rank 0.

Run (see docs/scaling-out.md):

* one process: ``python examples/06_scaling_out.py``
* two CPU processes (gloo): ``python examples/06_scaling_out.py --devices 2``
* GPUs: ``python examples/06_scaling_out.py --accelerator gpu --devices 4``
* torchrun: ``torchrun --nproc_per_node=2 examples/06_scaling_out.py --devices 2``
* SLURM: ``srun python examples/06_scaling_out.py --accelerator gpu --devices 4 --num-nodes 2``

Prints (the full run, without ``--quick``: about 137 s on one thread of a shared 2-core machine)::

    1 process(es), 450 steps: val acc 0.963 nll 0.103 ece 0.026; test acc 0.972 ece 0.037
    figures in OUT
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", "--smoke", action="store_true", help="tiny sizes, a few seconds")
    p.add_argument("--out", type=Path, default=None, help="folder for PNGs (default: a temp dir)")
    p.add_argument("--devices", type=int, default=1, help="processes (GPUs) per node")
    p.add_argument("--num-nodes", type=int, default=1)
    p.add_argument("--accelerator", default="cpu", help="cpu, gpu, auto")
    p.add_argument("--epochs", type=int, default=None)
    p.add_argument("--batch-size", type=int, default=64, help="global batch (split over ranks)")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def main() -> None:
    args = parse_args()
    if args.quick:
        print("smoke run (--quick): tiny sizes that only check the script runs; "
              "its numbers are not results")
    torch.set_num_threads(1)
    import logging
    import warnings

    import lightning as L

    # Lightning's start-up chatter (accelerator lines, product tips) and a deprecation inside
    # Lightning itself are not this example's output
    for name in ("lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message=r".*LeafSpec.*is deprecated")

    from bayesattn import AttentionConfig, VisionTransformer
    from bayesattn.data import load_digits_data
    from bayesattn.training.lightning import BayesianLightningModule
    from bayesattn.uncertainty import predict

    L.seed_everything(args.seed, verbose=False)  # same init on every rank, seeded sampler
    data = load_digits_data(seed=args.seed)
    epochs = args.epochs or (2 if args.quick else 30)
    n_train = 256 if args.quick else len(data.x_train)
    world = args.devices * args.num_nodes
    if args.batch_size % world:
        raise SystemExit(f"--batch-size {args.batch_size} must be divisible by {world} processes")
    per_rank = args.batch_size // world

    d_model, layers, samples = (16, 1, 4) if args.quick else (32, 2, 8)
    net = VisionTransformer(
        len(data.classes),
        image_size=8,
        patch_size=2,
        d_model=d_model,
        nhead=4,
        num_layers=layers,
        dim_feedforward=2 * d_model,
        dropout=0.1,
        attention=AttentionConfig(family="dirichlet"),
    )
    module = BayesianLightningModule(
        net,
        lr=3e-3,
        weight_decay=1e-4,
        warmup_steps=10,
        lr_decay="cosine",
        kl_anneal_steps=100,
        kl_weight=1e-3,  # tempered KL for the local attention latents (docs/training.md)
        num_samples=samples,
        seed=args.seed,
    )
    train = torch.utils.data.TensorDataset(data.x_train[:n_train], data.y_train[:n_train])
    val = torch.utils.data.TensorDataset(data.x_val, data.y_val)

    history: dict[str, list[float]] = {"val/acc": [], "val/nll": [], "val/ece": []}

    class Record(L.Callback):
        def on_validation_epoch_end(self, trainer, pl_module):
            if trainer.sanity_checking:
                return
            for k in history:
                history[k].append(float(trainer.callback_metrics[k]))

    trainer = L.Trainer(
        max_epochs=epochs,
        accelerator=args.accelerator,
        devices=args.devices,
        num_nodes=args.num_nodes,
        strategy="ddp" if world > 1 else "auto",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=not args.quick,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=[Record()],
    )
    trainer.fit(
        module,
        torch.utils.data.DataLoader(train, batch_size=per_rank, shuffle=True),
        torch.utils.data.DataLoader(val, batch_size=256),
    )
    if trainer.global_rank != 0:
        return

    out = args.out or Path(tempfile.mkdtemp(prefix="bayesattn-example-"))
    out.mkdir(parents=True, exist_ok=True)
    from matplotlib.figure import Figure

    from bayesattn.calibration import accuracy, expected_calibration_error
    from bayesattn.plots import plot_reliability_diagram

    fig = Figure(figsize=(10, 3), layout="constrained")
    for ax, (k, v) in zip(fig.subplots(1, 3), history.items(), strict=True):
        ax.plot(range(1, len(v) + 1), v, marker="o", ms=3)
        ax.set(title=f"{k} ({world} process{'es' if world > 1 else ''})", xlabel="epoch")
    fig.savefig(out / "validation_metrics.png", dpi=100)

    net = module.network.cpu()
    res = predict(net, data.x_test, num_samples=2 * samples, batch_size=256)
    p = res.mean_probs
    plot_reliability_diagram(p, data.y_test, title="test set", path=out / "reliability_diagram.png")
    print(
        f"{world} process(es), {trainer.global_step} steps: val acc {history['val/acc'][-1]:.3f} "
        f"nll {history['val/nll'][-1]:.3f} ece {history['val/ece'][-1]:.3f}; test acc "
        f"{accuracy(p, data.y_test):.3f} ece {expected_calibration_error(p, data.y_test):.3f}"
    )
    print(f"figures in {out}")


if __name__ == "__main__":
    main()
