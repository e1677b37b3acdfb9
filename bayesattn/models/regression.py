r"""A one-layer attention regression small enough for NUTS: the ground-truth model that
:mod:`bayesattn.diagnostics.svi_nuts` checks SVI guides against.

Dimension glossary: ``N`` data points, ``T`` keys, ``d`` feature dim, ``P`` leading draw dims.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pyro
import pyro.distributions as dist
import torch
from torch import Tensor

from .._validation import check_int, torch_generator

__all__ = ["AttentionRegressionData", "simulate_attention_regression", "attention_regression_model"]


@dataclass
class AttentionRegressionData:
    r"""Data of :func:`attention_regression_model`, with the parameters that generated it.

    Shapes: ``q (N, d)``, ``keys (N, T, d)``, ``values (N, T)``, ``y (N,)``;
    ``true_params = {"M": (d, d), "log_pi": (T-1,)}``.
    """

    q: Tensor
    keys: Tensor
    values: Tensor
    y: Tensor
    noise_scale: float
    prior_scale: float
    true_params: dict[str, Tensor]

    @property
    def args(self) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        return self.q, self.keys, self.values, self.y

    @property
    def kwargs(self) -> dict[str, float]:
        return {"noise_scale": self.noise_scale, "prior_scale": self.prior_scale}


def drop_plate_dim(t: Tensor, event_dim: int) -> Tensor:
    """A global site drawn under an outer (particle) plate has batch shape ``(*P, 1)``: the 1 is
    the data plate's dim. Drop it so the draw dims sit left of the data dim."""
    if t.dim() > event_dim:
        if t.shape[-event_dim - 1] != 1:
            raise ValueError(
                f"unexpected batch shape {tuple(t.shape[:-event_dim])} of a global site"
            )
        t = t.squeeze(-event_dim - 1)
    return t


def attention_regression_model(
    q: Tensor,
    keys: Tensor,
    values: Tensor,
    y: Tensor | None = None,
    *,
    noise_scale: float = 0.1,
    prior_scale: float = 1.0,
) -> Tensor:
    r"""One attention read as a regression, small enough for NUTS.

    .. math::

        M_{ab} \sim \mathcal N(0, s^2), \qquad \log\pi_{j} \sim \mathcal N(0, s^2)\ (j \ge 2),
        \ \log\pi_1 = 0,

        w_{nj} = \operatorname{softmax}_j\big(\log\pi_j + q_n^\top M k_{nj}/\sqrt d\big),
        \qquad y_n \sim \mathcal N\big(\textstyle\sum_j w_{nj} v_{nj},\ \sigma^2\big).

    The score :math:`q^\top M k` is the bilinear form :math:`q^\top W_Q^\top W_K k`: the data
    identify only :math:`M = W_Q^\top W_K` (a prior on :math:`W_Q, W_K` separately gives a
    posterior with sign/rotation symmetries that no sampler mixes over), so ``M`` is the
    parameter. The key-relevance log-prior :math:`\log\pi` is pinned at 0 on the first key
    (position 0) because softmax is shift invariant (a free shift would be a direction the data
    never inform).

    Sites: ``"M"`` ``(d, d)``, ``"log_pi"`` ``(T-1,)``, ``"y"`` in plate ``"data"`` (dim -1).
    Broadcasts over leading draw dims (vectorised particles, ``Predictive(parallel=True)``).

    Shape:
        q ``(N, d)``, keys ``(N, T, d)``, values ``(N, T)``, y ``(N,)`` → mean ``(*P, N)``.
    """
    N, d = q.shape
    T = keys.shape[-2]
    if keys.shape != (N, T, d) or values.shape != (N, T) or (y is not None and y.shape != (N,)):
        raise ValueError(
            f"expected q (N, d), keys (N, T, d), values (N, T), y (N,); got {tuple(q.shape)}, "
            f"{tuple(keys.shape)}, {tuple(values.shape)}, {None if y is None else tuple(y.shape)}"
        )
    zero = q.new_zeros(())
    s = q.new_tensor(prior_scale)
    M = pyro.sample("M", dist.Normal(zero, s).expand([d, d]).to_event(2))
    log_pi = pyro.sample("log_pi", dist.Normal(zero, s).expand([T - 1]).to_event(1))
    M = drop_plate_dim(M, 2)  # (*P, d, d)
    log_pi = drop_plate_dim(log_pi, 1)  # (*P, T-1)
    log_pi = torch.cat([log_pi.new_zeros(log_pi.shape[:-1] + (1,)), log_pi], dim=-1)  # (*P, T)
    scores = torch.einsum("nd,...de,nte->...nt", q, M, keys) / math.sqrt(d)  # (*P, N, T)
    w = torch.softmax(log_pi.unsqueeze(-2) + scores, dim=-1)  # (*P, N, T)
    mean = (w * values).sum(-1)  # (*P, N)
    with pyro.plate("data", N, dim=-1):
        pyro.sample("y", dist.Normal(mean, q.new_tensor(noise_scale)), obs=y)
    return mean


def simulate_attention_regression(
    num_data: int = 30,
    num_keys: int = 3,
    dim: int = 2,
    *,
    noise_scale: float = 0.1,
    prior_scale: float = 1.0,
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
) -> AttentionRegressionData:
    """Seeded data from :func:`attention_regression_model` with fixed, well-identified parameters
    (``M`` with entries of size ~1, ``log_pi = [0, 0.5, -0.5, ...]``); global RNG untouched."""
    for name, v in (("num_data", num_data), ("num_keys", num_keys), ("dim", dim)):
        check_int(name, v, minimum=1)
    if num_keys < 2:
        raise ValueError(f"num_keys must be >= 2; got {num_keys}")
    g = torch_generator(seed)
    q = torch.randn(num_data, dim, generator=g, dtype=dtype)
    keys = torch.randn(num_data, num_keys, dim, generator=g, dtype=dtype)
    values = torch.randn(num_data, num_keys, generator=g, dtype=dtype)
    ones = torch.ones(dim, dim, dtype=dtype)
    M = torch.eye(dim, dtype=dtype) + 0.5 * (torch.tril(ones, -1) - torch.triu(ones, 1))
    M[0, 0] = 1.5  # d = 2: [[1.5, -0.5], [0.5, 1.0]]
    log_pi = torch.tensor([0.5 * (-1) ** j for j in range(num_keys - 1)], dtype=dtype)
    full = torch.cat([log_pi.new_zeros(1), log_pi])
    scores = torch.einsum("nd,de,nte->nt", q, M, keys) / math.sqrt(dim)
    mean = (torch.softmax(full + scores, -1) * values).sum(-1)
    y = mean + noise_scale * torch.randn(num_data, generator=g, dtype=dtype)
    return AttentionRegressionData(
        q, keys, values, y, noise_scale, prior_scale, {"M": M, "log_pi": log_pi}
    )
