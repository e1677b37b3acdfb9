r"""Lightning integration: train any bayesattn network under ``lightning.Trainer`` (DDP included).

Optional extra: ``pip install "bayesattn[lightning]"`` (``lightning`` and ``torchmetrics``). This
module imports them at import time; ``import bayesattn`` does not import this module.

:class:`BayesianLightningModule` wraps a :class:`~bayesattn.nn.networks.BayesianNetwork`
(classifier, ViT, ``Seq2Seq`` or ``CausalLM``) with the objective of
:mod:`bayesattn.training`:

* the objective of the ``Trainer``, :class:`~bayesattn.training.objective.ElboObjective`:
  ``method="hybrid"``: ``network.elbo_loss`` (one pass, analytic KLs); ``method="svi"``: Pyro's
  ``Trace_ELBO``/``TraceMeanField_ELBO`` ``differentiable_loss`` of ``network.model`` against
  ``network.guide``, with :class:`~bayesattn.training.ScaleLatents` for the KL weight. Either way
  the loss is the negative ELBO per training example, KL-annealed by
  :func:`~bayesattn.training.kl_beta` at Lightning's ``global_step``.
* ``torch.optim.AdamW`` with :func:`~bayesattn.training.schedules.lr_scheduler` stepped every
  optimiser step, and global-norm gradient clipping at ``config.clip_norm`` (unless the Lightning
  ``Trainer`` sets ``gradient_clip_val``).
* validation as the ``Trainer`` validates (:mod:`bayesattn.training.validation`): the loss of
  ``config.val_loss`` and the posterior predictive's accuracy, NLL and ECE (``num_samples``
  draws, token by token for sequence models), accumulated by ``torchmetrics`` (synchronised
  across processes).

**ELBO scaling across processes.** Under DDP each of :math:`R` ranks sees a batch of :math:`b`
examples of the global batch :math:`Rb`. Every rank scales its data plate to the *full* dataset
size :math:`N` (``num_data``: ``len(train_dataloader.dataset)``, never the rank's shard), so its
loss is

.. math:: \ell_r = -\frac1b\sum_{i\in\text{rank } r}\big(E_q\log p(y_i\mid x_i, w_i)
          - \beta\,\mathrm{KL}_i\big) + \frac{\beta}{N}\mathrm{KL}_{\text{weights}},

and DDP's gradient average :math:`\frac1R\sum_r\nabla\ell_r` is the gradient of the one-process
loss on the global batch: the global (weight) KL counted once per dataset, the local terms
averaged over all :math:`Rb` examples.

**Randomness.** At every training step the global RNG is seeded from ``(config.seed,
global_step)``: the run is a function of the seed and the step (a checkpoint resumes exactly
without RNG state), and with ``shared_noise=True`` (default) every rank draws the same global
latents (Bayesian weights), as the one-process run draws one set per global batch. Local draws
(attention weights, dropout) then reuse the same random stream on every rank, applied to
different examples; ``shared_noise=False`` offsets the seed by the rank instead.

Example::

    import lightning as L
    from torch.utils.data import DataLoader, TensorDataset
    module = BayesianLightningModule(net, TrainConfig(lr=3e-3, kl_anneal_steps=100))
    trainer = L.Trainer(max_epochs=5, accelerator="cpu", devices=2, strategy="ddp")
    trainer.fit(module, DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True),
                DataLoader(TensorDataset(xv, yv), batch_size=256))
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

try:
    import lightning as L
    from torchmetrics import MeanMetric
    from torchmetrics.classification import MulticlassAccuracy, MulticlassCalibrationError
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        f"bayesattn.training.lightning needs the optional 'lightning' extra "
        f'(pip install "bayesattn[lightning]"): {e}'
    ) from e

from .._validation import check_bool, check_int
from ..nn.networks import BayesianNetwork, CausalLM, Seq2Seq, TransformerClassifier
from ..predictive import Predictive
from .config import TrainConfig, resolve_config, upgrade_config_dict
from .data import as_batch, fork_rng
from .objective import ElboObjective, predictive_scores
from .optimisation import schedule_args
from .param_store import sync_param_store
from .schedules import lr_scheduler
from .validation import validation_batch

if TYPE_CHECKING:
    from lightning.pytorch.utilities.types import OptimizerLRSchedulerConfig

__all__ = ["BayesianLightningModule", "predictive_probs"]


def _num_classes(network: BayesianNetwork) -> int:
    if isinstance(network, TransformerClassifier):
        return network.num_classes
    if isinstance(network, Seq2Seq):
        return network.tgt_vocab_size
    if isinstance(network, CausalLM):
        return network.vocab_size
    n = getattr(network, "num_classes", None)  # a user network (bayesattn.nn.contract)
    if isinstance(n, int) and not isinstance(n, bool) and n >= 1:
        return n
    raise TypeError(
        f"network must be a TransformerClassifier, VisionTransformer, Seq2Seq, CausalLM or a "
        f"BayesianNetwork with an int attribute num_classes >= 1 (the size of the last logits "
        f"dim; see bayesattn.nn.contract); got {type(network).__name__} with num_classes={n!r}"
    )


@torch.no_grad()
def predictive_probs(
    network: BayesianNetwork, x: Tensor, y: Tensor | None = None, num_samples: int = 8
) -> tuple[Tensor, Tensor]:
    r"""Posterior-predictive probabilities :math:`\bar p = \frac1S\sum_s p(\cdot\mid x, w_s)` and
    their targets, one row per prediction: ``Predictive(network, num_samples,
    keep_attention=False).probs_and_targets(x, y)`` (:class:`bayesattn.predictive.Predictive`).

    Classifiers are scored on their labels ``y``; sequence models take the same vectorised
    posterior pass (``S`` samples, Bayesian weights drawn by the weight guide) with teacher
    forcing, and keep the non-padding target positions.

    Shape:
        ``probs (M, C)``, ``targets (M,)``: ``M = B`` for classifiers, the number of non-padding
        target tokens for sequence models.
    """
    if not isinstance(network, TransformerClassifier):
        _num_classes(network)
    engine = Predictive(network, num_samples, keep_attention=False)
    return engine.probs_and_targets(x, y)


class BayesianLightningModule(L.LightningModule):
    """A ``LightningModule`` training a bayesattn network (see the module docstring).

    Args:
        network: any :class:`~bayesattn.nn.networks.BayesianNetwork`.
        config: a :class:`~bayesattn.training.TrainConfig` (or dict); ``overrides`` replace
            fields. Used here: ``method``, ``lr``, ``weight_decay``, the schedule fields
            (``warmup_steps``, ``lr_decay``, ``decay_steps``, ``min_lr_ratio``, ``lr_step_size``,
            ``lr_gamma``), ``clip_norm``, the KL fields (``kl_anneal_steps``, ``kl_start``,
            ``kl_weight``), ``num_particles``, ``vectorize_particles``, ``elbo``, ``val_loss`` and
            ``seed``.
            Epochs, steps, devices, checkpoints and early stopping belong to the Lightning
            ``Trainer`` (``decay_steps`` defaults to ``trainer.estimated_stepping_batches``).
        num_data: the number of training examples :math:`N` (default: the length of the train
            dataloader's dataset, which under DDP is the whole dataset, not a rank's shard).
        num_samples: posterior draws per validation prediction.
        n_bins: bins of the expected calibration error.
        shared_noise: seed every rank's step identically (see "Randomness" above).

    Logged: ``train/loss`` (negative ELBO per example), ``train/acc``, ``train/beta``,
    ``train/lr``; per epoch, what :meth:`~bayesattn.training.trainer.Trainer.evaluate`
    reports: ``val/loss`` (``config.val_loss``), ``val/acc``, ``val/nll``, ``val/ece``
    (posterior predictive).
    """

    def __init__(
        self,
        network: BayesianNetwork,
        config: TrainConfig | dict | None = None,
        *,
        num_data: int | None = None,
        num_samples: int = 8,
        n_bins: int = 15,
        shared_noise: bool = True,
        **overrides: Any,
    ) -> None:
        super().__init__()
        if not isinstance(network, BayesianNetwork):
            raise TypeError(
                f"network must be a bayesattn BayesianNetwork; got {type(network).__name__}"
            )
        check_int("num_data", num_data, 1, allow_none=True)
        check_int("num_samples", num_samples, 1)
        check_bool("shared_noise", shared_noise)
        self.network = network
        self.config = resolve_config(config, overrides)
        self.num_data = num_data
        self.num_samples = num_samples
        self.shared_noise = shared_noise
        C = _num_classes(network)
        # lazily built parameters (the weight autoguide's) must exist before DDP wraps the module
        if network.weight_guide is not None:
            with fork_rng(), torch.no_grad(), network.pyro_context:
                network.weight_guide()
        self.objective = ElboObjective(network, self.config)
        self._synced = False
        self.train_acc = MulticlassAccuracy(num_classes=C, average="micro")
        self.val_acc = MulticlassAccuracy(num_classes=C, average="micro")
        self.val_loss = MeanMetric()
        self.val_nll = MeanMetric()
        self.val_ece = MulticlassCalibrationError(num_classes=C, n_bins=n_bins, norm="l1")

    # ---- set-up -------------------------------------------------------------------------------
    def _resolve_num_data(self) -> int:
        if self.num_data is None:
            loader = self.trainer.train_dataloader
            dataset = getattr(loader, "dataset", None)
            try:
                # None or an unsized dataset raise the TypeError handled below
                self.num_data = len(dataset)  # type: ignore[arg-type]
            except TypeError:
                raise ValueError(
                    "the training data has no __len__ (a stream): give "
                    "BayesianLightningModule(num_data=N), N the number of training examples"
                ) from None
        return self.num_data

    def _seed_step(self, salt: int) -> None:
        """Seed the global RNG from (seed, step[, rank]): runs are functions of the step."""
        s = self.config.seed * 1_000_003 + salt
        if not self.shared_noise:
            s += 104_729 * (self.global_rank + 1)
        torch.manual_seed(s % (2**63))

    def _sync(self, xb: Tensor, yb: Tensor | None, n: int) -> None:
        if not self._synced:
            sync_param_store(self.network, xb, yb, n)
            self._synced = True

    def configure_optimizers(self) -> OptimizerLRSchedulerConfig:
        c = self.config
        opt = torch.optim.AdamW(self.network.parameters(), lr=c.lr, weight_decay=c.weight_decay)
        decay_steps = c.decay_steps
        if decay_steps is None:
            est = self.trainer.estimated_stepping_batches
            if isinstance(est, (int, float)) and math.isfinite(est):
                decay_steps = max(1, int(est))
            elif c.lr_decay in ("cosine", "linear"):
                raise ValueError(
                    f"lr_decay={c.lr_decay!r} needs the schedule length and the Trainer cannot "
                    f"estimate it: set TrainConfig.decay_steps or Trainer(max_steps=...)"
                )
            else:
                decay_steps = 1
        sched = lr_scheduler(opt, **schedule_args(c, decay_steps))  # the Trainer's schedule
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def configure_gradient_clipping(
        self,
        optimizer: torch.optim.Optimizer,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str | None = None,
    ) -> None:
        clip = gradient_clip_val if gradient_clip_val is not None else self.config.clip_norm
        if clip:
            self.clip_gradients(
                optimizer,
                gradient_clip_val=clip,
                gradient_clip_algorithm=gradient_clip_algorithm or "norm",
            )

    # ---- training -----------------------------------------------------------------------------
    def elbo_per_example(self, xb: Tensor, yb: Tensor | None, n: int) -> tuple[Tensor, Tensor]:
        """The β-weighted negative ELBO per training example (differentiable) and the logits of
        the sampled pass ``(*P, B, ...)``; β at the current ``global_step``
        (:meth:`~bayesattn.training.objective.ElboObjective.loss`)."""
        self.objective.set_step(self.global_step)
        return self.objective.loss(xb, yb, n)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        xb, yb = as_batch(batch, "train batch")
        n = self._resolve_num_data()
        self._sync(xb, yb, n)
        self._seed_step(self.global_step)
        loss, logits = self.elbo_per_example(xb, yb, n)
        if not torch.isfinite(loss):
            raise FloatingPointError(
                f"training loss became {float(loss)} at step {self.global_step}; lower lr, "
                f"enable clip_norm or anneal the KL"
            )
        targets, mask, _ = self.network.targets(xb, yb)
        if targets is None:
            raise ValueError(f"{type(self.network).__name__}.targets(x, y) gave no targets")
        logits = predictive_scores(logits, targets.dim())  # particles: averaged predictive
        pred, tgt = (logits[mask], targets[mask]) if mask is not None else (logits, targets)
        self.train_acc(pred.reshape(-1, pred.shape[-1]), tgt.reshape(-1))
        B = xb.shape[0]
        self.log("train/loss", loss.detach(), prog_bar=True, batch_size=B, sync_dist=True)
        self.log("train/acc", self.train_acc, on_step=False, on_epoch=True, batch_size=B)
        self.log("train/beta", self.objective.beta, batch_size=B, rank_zero_only=True)
        lr = self.trainer.optimizers[0].param_groups[0]["lr"]
        self.log("train/lr", float(lr), batch_size=B, rank_zero_only=True)
        return loss

    # ---- validation ---------------------------------------------------------------------------
    def validation_step(self, batch: Any, batch_idx: int) -> None:
        xb, yb = as_batch(batch, "validation batch")
        if not self._synced:
            self._sync(xb, yb, self.num_data or xb.shape[0])
        self._seed_step(-(batch_idx + 1) * 7_919)  # reproducible draws, apart from training's
        c = self.config
        n = self._val_num_data() if c.val_loss == "elbo" else None
        b = validation_batch(
            self.network, xb, yb, val_loss=c.val_loss, num_data=n, num_samples=self.num_samples
        )
        probs, targets = b.probs, b.targets
        nll = -torch.log(probs.gather(-1, targets[:, None]).squeeze(-1).clamp_min(1e-12))
        B = xb.shape[0]
        self.val_loss.update(torch.tensor(b.loss_sum / B), weight=B)
        self.val_acc.update(probs, targets)
        self.val_nll.update(nll)
        self.val_ece.update(probs, targets)
        self.log("val/loss", self.val_loss, on_epoch=True, batch_size=B)
        self.log("val/acc", self.val_acc, on_epoch=True, batch_size=B, prog_bar=True)
        self.log("val/nll", self.val_nll, on_epoch=True, batch_size=B, prog_bar=True)
        self.log("val/ece", self.val_ece, on_epoch=True, batch_size=B)

    def _val_num_data(self) -> int:
        """The number of validation examples (``val_loss="elbo"`` scales to it)."""
        loaders = self.trainer.val_dataloaders
        loader = loaders[0] if isinstance(loaders, (list, tuple)) else loaders
        try:
            return len(loader.dataset)  # type: ignore[union-attr]
        except (AttributeError, TypeError):
            raise ValueError(
                "val_loss='elbo' needs the number of validation examples: give a validation "
                "dataset with __len__ or use val_loss='nll'"
            ) from None

    def forward(self, *args: Any, **kwargs: Any) -> Tensor:
        """The network's deterministic (posterior-mean) logits."""
        return self.network(*args, **kwargs)

    # ---- checkpoints --------------------------------------------------------------------------
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["bayesattn"] = {
            "network_class": type(self.network).__name__,
            "config": self.config.to_dict(),
            "num_data": self.num_data,
        }

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        meta = checkpoint.get("bayesattn")
        if meta is None:
            raise ValueError("not a BayesianLightningModule checkpoint (no 'bayesattn' entry)")
        missing = [
            k for k in ("network_class", "config", "num_data") if not isinstance(meta, dict) or k not in meta
        ]
        if missing:
            raise ValueError(
                f"checkpoint's 'bayesattn' entry lacks {missing} (it must hold network_class, "
                "config and num_data, as BayesianLightningModule.on_save_checkpoint writes): not "
                "a BayesianLightningModule checkpoint, or a damaged one"
            )
        if meta["network_class"] != type(self.network).__name__:
            raise ValueError(
                f"checkpoint holds a {meta['network_class']}; this module wraps a "
                f"{type(self.network).__name__}"
            )
        saved = upgrade_config_dict(meta["config"])  # "mode" before 0.3
        if saved.get("method") != self.config.method:
            raise ValueError(
                f"checkpoint was trained with method {saved.get('method')!r}; this module "
                f"uses method {self.config.method!r}"
            )
        if self.num_data is None:
            self.num_data = meta["num_data"]
        elif meta["num_data"] is not None and meta["num_data"] != self.num_data:
            raise ValueError(
                f"checkpoint was trained with num_data={meta['num_data']}; this module has "
                f"num_data={self.num_data}"
            )
