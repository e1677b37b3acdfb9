r"""An epinet read-out (Osband et al., *Epistemic neural networks*, 2023): a classifier head whose
logits depend on a global **epistemic index** :math:`z\sim\mathcal N(0, I_D)`.

For the pooled (CLS) features :math:`h` and their stopped-gradient copy :math:`\tilde h`,

.. math::

    \text{logits}(h, z) = W h + b
        + \underbrace{g_\eta(\tilde h)^\top z}_{\text{learned}}
        + \alpha\,\underbrace{g_P(\tilde h)^\top z}_{\text{fixed random prior}},
    \qquad g(\tilde h)\in\mathbb R^{D\times C},

with :math:`g_P` a randomly initialised MLP that is never trained (a *randomised prior
function*) and :math:`g_\eta` an MLP of the same shape that is. The training loss averages over
the index, and since the index only adds noise to the logits, the data drive
:math:`g_\eta(\tilde h)\to-\alpha\,g_P(\tilde h)` **on the training features** — the predictive
spread over :math:`z` vanishes where the data are and keeps the prior's, :math:`\alpha^2
\lVert g_P(\tilde h)\rVert^2`, where the learned MLP has not been pulled to cancel it. The
stopped gradient keeps the index from reshaping the features.

:math:`z` is one global latent per posterior sample (Pyro site ``"<module path>.index"``, shared
by every example, outside the data plate) whose "posterior" **is** its reference distribution:
the KL is 0 and nothing about :math:`z` is learned — the epinet is an ensemble indexed by
:math:`z`, not a variational posterior. ``"mean"`` mode uses :math:`z = 0` (the linear head).
:math:`\alpha` (``prior_scale``) is in units of the standard deviation of :math:`W h + b` over
the first training batch (set once, from training data only).
"""

from __future__ import annotations

import pyro.distributions as dist
import torch
from pyro.nn import PyroModule
from torch import Tensor, nn

from .._validation import check_int, check_real
from .gp_read import draw_global
from .modes import current_mode

__all__ = ["EpinetReadout"]


def _mlp(in_dim: int, hidden: int, out_dim: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(in_dim, hidden), nn.ReLU(), nn.Linear(hidden, out_dim))


class EpinetReadout(PyroModule):
    r"""Epinet read-out of the pooled features (see the module docstring).

    Args:
        in_dim: feature size ``E``; num_classes: ``C``.
        index_dim: ``D``, the size of the epistemic index :math:`z`.
        hidden: width of the learned and the prior MLP.
        prior_scale: :math:`\alpha` in units of the logits' standard deviation on the first
            training batch.

    Shape:
        h ``(*, B, E)`` → logits ``(*, B, C)``; ``leading_samples=S`` (``h`` already carries the
        ``S`` samples as its leading dim) or ``num_samples=S`` (``h`` without them) give ``S``
        indices, one per sample.
    """

    is_bayesian = True
    global_latent = True

    def __init__(
        self,
        in_dim: int,
        num_classes: int,
        index_dim: int = 8,
        hidden: int = 32,
        prior_scale: float = 1.0,
    ) -> None:
        check_int("in_dim", in_dim, 1)
        check_int("num_classes", num_classes, 1)
        check_int("index_dim", index_dim, 1)
        check_int("hidden", hidden, 1)
        check_real("prior_scale", prior_scale, ge=0.0)
        super().__init__()
        self.in_dim, self.num_classes, self.index_dim = in_dim, num_classes, index_dim
        self.linear = nn.Linear(in_dim, num_classes)
        self.learned = _mlp(in_dim, hidden, index_dim * num_classes)
        prior = _mlp(in_dim, hidden, index_dim * num_classes)
        for i, p in enumerate(prior.parameters()):  # fixed: buffers, never trained
            self.register_buffer(f"prior_{i}", p.detach().clone())
        self.register_buffer("prior_scale", torch.tensor(float(prior_scale)))
        self.register_buffer("unit", torch.tensor(1.0))  # logits' sd on the first batch
        self.register_buffer("initialised", torch.tensor(False))

    @property
    def site_name(self) -> str:
        """The global Pyro site of the index ``(D,)``."""
        with self._pyro_context:
            return self._pyro_get_fullname("index")

    def _reference(self) -> dist.TorchDistribution:
        loc = self.unit.new_zeros(self.index_dim)
        return dist.Normal(loc, torch.ones_like(loc)).to_event(1)

    def posterior(self) -> dist.TorchDistribution:
        """The index's distribution, :math:`\\mathcal N(0, I_D)` (nothing is learned about it)."""
        return self._reference()

    def prior(self) -> dist.TorchDistribution:
        """:math:`\\mathcal N(0, I_D)`."""
        return self._reference()

    def kl(self) -> Tensor:
        """0 nats: the index's posterior is its prior."""
        return self.unit.new_zeros(())

    def prior_function(self, h: Tensor) -> Tensor:
        """:math:`\\alpha\\,g_P(h)` ``(*, B, C, D)`` (no gradient reaches ``h``)."""
        w0, b0, w1, b1 = (getattr(self, f"prior_{i}") for i in range(4))
        out = torch.relu(h.detach() @ w0.T + b0) @ w1.T + b1  # (*, B, C·D)
        out = out * (self.prior_scale * self.unit)
        return out.unflatten(-1, (self.num_classes, self.index_dim))

    def index_matrix(self, h: Tensor) -> Tensor:
        """:math:`g_\\eta(\\tilde h) + \\alpha g_P(\\tilde h)` ``(*, B, C, D)``: the logits'
        dependence on the index (its norm is the epistemic spread)."""
        learned = self.learned(h.detach()).unflatten(-1, (self.num_classes, self.index_dim))
        return learned + self.prior_function(h)

    @torch.no_grad()
    def _init_from(self, h: Tensor) -> None:
        sd = self.linear(h.detach()).std()
        self.unit.fill_(float(sd.clamp_min(1e-3)) if sd.isfinite() else 1.0)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.broadcast(self.unit, 0)
        self.initialised.fill_(True)

    def forward(
        self, h: Tensor, num_samples: int | None = None, leading_samples: int | None = None
    ) -> Tensor:
        if h.shape[-1] != self.in_dim:
            raise ValueError(f"h must be (*, B, {self.in_dim}); got {tuple(h.shape)}")
        if self.training and not bool(self.initialised):
            self._init_from(h)
        base = self.linear(h)  # (*, B, C)
        mode = current_mode() or "guide"
        if mode == "mean":
            return base
        z = draw_global(self, mode, num_samples if num_samples is not None else leading_samples)
        g = self.index_matrix(h)  # (*, B, C, D)
        if num_samples is not None:
            base, g = base.unsqueeze(0), g.unsqueeze(0)  # (1, *, B, …)
        lead = z.shape[:-1]  # () or (S,)
        z = z.reshape(lead + (1,) * (g.dim() - 2 - len(lead)) + (1, self.index_dim))
        return base + (g * z).sum(-1)  # (S?, *, B, C)

    def extra_repr(self) -> str:
        return (
            f"in_dim={self.in_dim}, num_classes={self.num_classes}, index_dim={self.index_dim}, "
            f"prior_scale={float(self.prior_scale):g}"
        )
