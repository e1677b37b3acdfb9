r"""Validation, one way for both loops (:meth:`~bayesattn.training.trainer.Trainer.evaluate` and
:class:`~bayesattn.training.lightning.BayesianLightningModule`). Per example (token-level, padding
ignored, for sequence models):

``loss``
    ``TrainConfig.val_loss``: ``"nll"``, the deterministic (posterior-mean attention) negative
    log-likelihood, or ``"elbo"``, the negative ELBO (β = 1, one particle) scaled to the
    validation set; what early stopping watches.
``accuracy``, ``nll``, ``ece``
    of the posterior predictive :math:`\bar p = \frac1S\sum_s p(\cdot\mid x, w_s)` with ``S``
    draws (the predictive engine, :class:`bayesattn.predictive.Predictive`): accuracy of :math:`\arg\max\bar p`,
    :math:`-\log\bar p_y` and the expected calibration error over ``n_bins`` equal-width
    confidence bins (:func:`bayesattn.calibration.reliability_curve`). ``S = 0``: of the
    deterministic posterior-mean predictive (one pass; the accuracy is then the one ``fit``
    reported before 0.4).

:func:`validation_batch` computes one batch's pieces, :class:`ValidationMetrics` sums them
(the Lightning module feeds the same pieces to ``torchmetrics`` instead, to synchronise them
across processes), :func:`validate` runs a whole data set.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import Tensor

from ..calibration import reliability_curve
from ..nn.modes import AttentionMode
from ..nn.networks import BayesianNetwork, Seq2Seq
from ..predictive import Predictive
from .checks import check_data, in_memory
from .data import as_tensors, iter_eval_batches
from .data import fork_rng as _fork_rng

__all__ = ["ValidationBatch", "ValidationMetrics", "validation_batch", "validate"]

ValLoss = Literal["nll", "elbo"]


@dataclass
class ValidationBatch:
    """One batch's validation pieces.

    Attributes:
        loss_sum: the batch's share of the validation loss (summed over its examples).
        examples: the batch's examples ``B``.
        probs: posterior-predictive probabilities, one row per prediction ``(M, C)``.
        targets: their targets ``(M,)`` (``M = B`` for classifiers, the non-padding target
            tokens for sequence models).
    """

    loss_sum: float
    examples: int
    probs: Tensor
    targets: Tensor


def _loss_sum(
    net: BayesianNetwork, xb: Tensor, yb: Tensor | None, val_loss: ValLoss, n: int | None
) -> float:
    """The batch's summed validation loss (see the module docstring)."""
    if val_loss == "elbo":
        if n is None:
            raise ValueError("val_loss='elbo' needs the number of validation examples")
        loss, _ = net.elbo_loss(xb, yb, num_data=n)
        return float(loss) * len(xb) / n
    logits = net(xb, yb)
    targets, mask, ev = net.targets(xb, yb)
    if targets is None:
        raise ValueError("validation needs targets; got y=None")
    return -float(net.likelihood(logits, mask, ev).log_prob(targets).sum())


def predictive_rows(
    net: BayesianNetwork, xb: Tensor, yb: Tensor | None, num_samples: int
) -> tuple[Tensor, Tensor]:
    """Posterior-predictive probabilities ``(M, C)`` and targets ``(M,)`` of a batch, one row per
    prediction (the valid target positions of sequence models); ``num_samples=0``: the
    deterministic posterior-mean predictive instead (one pass, attention mode ``"mean"``)."""
    y_in = yb if isinstance(net, Seq2Seq) else None  # teacher forcing; others predict from x
    mode: AttentionMode = "guide" if num_samples > 0 else "mean"
    res = Predictive(net, max(num_samples, 1), mode=mode, keep_attention=False)(xb, y_in)
    targets, mask, _ = net.targets(xb, yb)
    if targets is None:
        raise ValueError("validation needs targets; got y=None")
    probs = res.mean_probs  # (B, [T,] C)
    if mask is not None:
        return probs[mask], targets[mask]
    return probs.reshape(-1, probs.shape[-1]), targets.reshape(-1)


@torch.no_grad()
def validation_batch(
    network: BayesianNetwork,
    xb: Tensor,
    yb: Tensor | None,
    *,
    val_loss: ValLoss = "nll",
    num_data: int | None = None,
    num_samples: int = 8,
) -> ValidationBatch:
    """The validation pieces of one batch, with the network in eval mode (its mode is restored).
    ``num_data``: the number of validation examples (needed by ``val_loss="elbo"``)."""
    was_training = network.training
    network.eval()
    try:
        loss_sum = _loss_sum(network, xb, yb, val_loss, num_data)
        with _fork_rng():  # the loss's random stream does not depend on the predictive's draws
            probs, targets = predictive_rows(network, xb, yb, num_samples)
    finally:
        network.train(was_training)
    return ValidationBatch(loss_sum, len(xb), probs, targets)


@dataclass
class ValidationMetrics:
    """Running sums of :class:`ValidationBatch` pieces; :meth:`compute` gives the metrics."""

    n_bins: int = 15
    loss_sum: float = 0.0
    examples: int = 0
    predictions: int = 0
    correct: float = 0.0
    nll_sum: float = 0.0
    bin_count: Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.float64))
    bin_conf: Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.float64))
    bin_acc: Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.float64))

    def update(self, b: ValidationBatch) -> None:
        self.loss_sum += b.loss_sum
        self.examples += b.examples
        if b.targets.numel() == 0:
            return
        p = b.probs.detach().cpu().double()
        y = b.targets.detach().cpu().long()
        self.predictions += len(y)
        self.correct += float((p.argmax(-1) == y).sum())
        self.nll_sum -= float(p.gather(-1, y[:, None]).clamp_min(1e-12).log().sum())
        curve = reliability_curve(p, y, n_bins=self.n_bins)
        count = curve.count.double()
        conf = torch.nan_to_num(curve.confidence) * count  # sums per bin
        acc = torch.nan_to_num(curve.accuracy) * count
        if self.bin_count.numel() == 0:
            self.bin_count, self.bin_conf, self.bin_acc = count, conf, acc
        else:
            self.bin_count, self.bin_conf, self.bin_acc = (
                self.bin_count + count,
                self.bin_conf + conf,
                self.bin_acc + acc,
            )

    def compute(self, num_data: int | None = None) -> dict[str, float]:
        """``{"loss", "accuracy", "nll", "ece"}``; the loss is per example of ``num_data``
        (default: the examples seen)."""
        m = max(self.predictions, 1)
        ece = 0.0
        if self.bin_count.numel():
            full = self.bin_count > 0
            n = self.bin_count[full]
            gap = (self.bin_acc[full] / n - self.bin_conf[full] / n).abs()
            ece = float((n / self.bin_count.sum() * gap).sum())
        return {
            "loss": self.loss_sum / max(num_data or self.examples, 1),
            "accuracy": self.correct / m,
            "nll": self.nll_sum / m,
            "ece": ece,
        }


@torch.no_grad()
def validate(
    network: BayesianNetwork,
    data: Any,
    *,
    name: str = "data",
    batch_size: int = 256,
    device: torch.device | str = "cpu",
    val_loss: ValLoss = "nll",
    num_samples: int = 8,
    n_bins: int = 15,
) -> dict[str, float]:
    """``{"loss", "accuracy", "nll", "ece"}`` of ``data`` (see the module docstring), read in
    order in batches of ``batch_size``; the network's mode and the global RNG are restored.

    ``data`` takes the forms of ``fit``'s ``train_data`` (tensors, datasets, ``DataLoader``
    objects, streams). ``val_loss="elbo"`` needs the number of examples up front (a stream
    without ``__len__`` supports ``"nll"`` only)."""
    batches, n = iter_eval_batches(data, name, batch_size)
    tensors = in_memory(data)
    if tensors:  # in memory: validated in full up front
        check_data(network, *as_tensors(data, name), name)
    if val_loss == "elbo" and n is None:
        raise ValueError(
            f"{name}: val_loss='elbo' needs the number of examples; give a dataset with "
            f"__len__ or use val_loss='nll'"
        )
    metrics = ValidationMetrics(n_bins=n_bins)
    with _fork_rng():
        for k, (xb, yb) in enumerate(batches):
            if not tensors:
                check_data(network, xb, yb, f"{name} (batch {k})")
            xb = xb.to(device)
            yb = None if yb is None else yb.to(device)
            metrics.update(
                validation_batch(
                    network, xb, yb, val_loss=val_loss, num_data=n, num_samples=num_samples
                )
            )
    if metrics.examples == 0:
        raise ValueError(f"{name} is empty: it yields no batch")
    return metrics.compute(n)
