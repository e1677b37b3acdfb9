r"""What a posterior-predictive pass returns: :class:`PredictionResult` (``S`` draws of the
predictive and the entropy decomposition) and :class:`AttentionSamples` (``S`` draws of one
attention layer's weights with their summaries).

Shape glossary: ``S`` posterior samples (leftmost), ``B`` batch, ``C`` classes, ``H`` heads,
``Tq``/``Tk`` query/key length.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor

from .._validation import check_real, check_simplex
from ..functional import entropy, uncertainty_decomposition

__all__ = ["AttentionSamples", "PredictionResult"]


def _quantile0(x: Tensor, q: float) -> Tensor:
    """Quantile over dim 0 with linear interpolation (``torch.quantile``'s default), without
    ``torch.quantile``'s input-size limit.

    Shape:
        ``(S, ...)`` → ``(...)``.
    """
    s = x.shape[0]
    xs = torch.sort(x, dim=0).values  # (S, ...)
    pos = q * (s - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, s - 1)
    frac = pos - lo
    return xs[lo] + (xs[hi] - xs[lo]) * frac


@dataclass
class AttentionSamples:
    r"""Posterior samples of one attention layer's weights and their summaries.

    Fields:
        samples: ``(S, B, H, Tq, Tk)`` draws of the weights; every row lies on the simplex over the
            allowed keys.
        allowed: optional bool ``(B|1, H|1, Tq|1, Tk)`` of keys with prior mass. ``None`` (the
            default) derives it from the samples: a key is allowed when some draw gives it
            positive weight (masked keys are exactly 0 in every draw).

    Shape:
        ``mean``/``std``/``interval`` bounds ``(B, H, Tq, Tk)``; ``entropy_of_mean``/
        ``mean_key_std`` ``(B, H, Tq)``.
    """

    samples: Tensor
    allowed: Tensor | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.samples, Tensor):
            raise TypeError(f"samples must be a torch.Tensor; got {type(self.samples).__name__}")
        if self.samples.dim() != 5:
            raise ValueError(
                f"samples must be 5-D (S, B, H, Tq, Tk); got shape {tuple(self.samples.shape)}"
            )
        if not self.samples.is_floating_point():
            raise TypeError(f"samples must be floating point; got dtype {self.samples.dtype}")
        if self.allowed is not None:
            if self.allowed.dtype != torch.bool or self.allowed.dim() != 4:
                raise ValueError(
                    f"allowed must be a 4-D bool tensor broadcastable to (B, H, Tq, Tk) = "
                    f"{tuple(self.samples.shape[1:])}; got {self.allowed.dtype} "
                    f"{tuple(self.allowed.shape)}"
                )
            torch.broadcast_shapes(self.allowed.shape, self.samples.shape[1:])

    @property
    def num_samples(self) -> int:
        return self.samples.shape[0]

    @property
    def mean(self) -> Tensor:
        r"""Posterior mean :math:`\bar w = \frac1S\sum_s w_s`. Shape ``(B, H, Tq, Tk)``."""
        return self.samples.mean(0)

    @property
    def std(self) -> Tensor:
        r"""Posterior std per weight (``S − 1`` denominator; zero when ``S = 1``).
        Shape ``(B, H, Tq, Tk)``."""
        if self.num_samples == 1:
            return torch.zeros_like(self.samples[0])
        return self.samples.std(0, correction=1)

    def key_mask(self) -> Tensor:
        """Allowed keys, bool ``(B, H, Tq, Tk)`` (see the class docstring)."""
        if self.allowed is not None:
            return self.allowed.expand(self.samples.shape[1:])
        return (self.samples > 0).any(0)  # (B, H, Tq, Tk)

    def interval(self, prob: float = 0.9) -> tuple[Tensor, Tensor]:
        r"""Central credible interval :math:`[Q_{(1-p)/2}, Q_{(1+p)/2}]` of every weight, with
        quantiles over the ``S`` draws (linear interpolation, as :func:`torch.quantile`).

        Shape:
            ``(lo, hi)``, each ``(B, H, Tq, Tk)``.
        """
        p = check_real("prob", prob, gt=0.0, lt=1.0)
        return _quantile0(self.samples, (1.0 - p) / 2), _quantile0(self.samples, (1.0 + p) / 2)

    def entropy_of_mean(self) -> Tensor:
        r""":math:`H[\bar w_{i\cdot}] = -\sum_j \bar w_{ij}\log\bar w_{ij}` per query (nats).

        Shape:
            ``(B, H, Tq)``.
        """
        return entropy(self.mean)

    def mean_key_std(self) -> Tensor:
        r"""Average posterior std of a query's weights over its allowed keys,
        :math:`\frac{1}{|A_i|}\sum_{j\in A_i}\operatorname{std}(w_{ij})` (0 for a row with no
        allowed key).

        Shape:
            ``(B, H, Tq)``.
        """
        allowed = self.key_mask()  # (B, H, Tq, Tk)
        n = allowed.sum(-1).clamp_min(1).to(self.samples.dtype)  # (B, H, Tq)
        return (self.std * allowed).sum(-1) / n

    def keys_excluding(self, threshold: float, prob: float = 0.9) -> Tensor:
        r"""Keys whose central ``prob`` credible interval lies strictly above ``threshold``
        (:math:`\mathrm{lo}_{ij} > t`): the query confidently reads at least that much from them.

        Shape:
            bool ``(B, H, Tq, Tk)``.
        """
        threshold = check_real("threshold", threshold, ge=0.0, le=1.0)
        lo, _ = self.interval(prob)
        return lo > float(threshold)

    def summary(self) -> dict[str, float]:
        """Scalar summaries: mean entropy of the mean weights, mean key std, mean interval width
        (90 %), averaged over batch, heads and queries."""
        lo, hi = self.interval(0.9)
        allowed = self.key_mask()
        width = ((hi - lo) * allowed).sum(-1) / allowed.sum(-1).clamp_min(1)  # (B, H, Tq)
        return {
            "entropy_of_mean": float(self.entropy_of_mean().mean()),
            "mean_key_std": float(self.mean_key_std().mean()),
            "mean_interval_width_90": float(width.mean()),
        }


@dataclass
class PredictionResult:
    r"""``S`` posterior-predictive samples for ``B`` inputs and the uncertainty decomposition.

    Fields:
        probs: ``(S, B, C)`` per-sample class probabilities :math:`p_s(c\mid x_b)`.
        attention: layer path → :class:`AttentionSamples` ``(S, B, H, Tq, Tk)`` (empty when
            ``keep_attention=False``).
        kind: how the samples were drawn: the attention mode (``"guide"``, ``"model"``,
            ``"mean"``, ``"elbo"``), ``"mc_dropout"``, ``"ensemble/<mode>"`` (``mode``
            before 0.3) or a post-hoc read's ``"posthoc/<read>"`` (:mod:`bayesattn.posthoc`).
        mask: for per-token predictives ``(S, B, T, V)``, the valid positions ``(B, T)``
            (``None``: all valid).
        components: for a mixture posterior (:mod:`bayesattn.nn.mixture`), the component of
            each draw ``(S,)`` int64: stratified, draw ``i`` is component ``i % K``, so
            ``probs[k::K]`` and ``attention[...].samples[k::K]`` are component ``k``'s
            (``None``: not a mixture, or one draw of a component chosen at random).

    Properties (all ``(B,)`` unless noted; ``(B, T)`` for per-token predictives):
        ``mean_probs`` ``(B, C)`` :math:`\bar p`; ``predictive_entropy`` :math:`H[\bar p]`;
        ``expected_entropy`` :math:`\frac1S\sum_s H[p_s]` (aleatoric); ``mutual_information``
        :math:`H[\bar p] - \frac1S\sum_s H[p_s]` (epistemic); ``predictions`` (argmax of
        :math:`\bar p`, int64); ``confidence`` :math:`\max_c \bar p_c`.

    Entropies are computed in float64 and returned in the dtype of ``probs``. The mutual
    information is clamped at 0 only to remove float round-off (it is :math:`\ge 0` exactly).
    """

    probs: Tensor
    attention: dict[str, AttentionSamples] = field(default_factory=dict)
    kind: str = "guide"
    mask: Tensor | None = None
    components: Tensor | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.probs, Tensor):
            raise TypeError(f"probs must be a torch.Tensor; got {type(self.probs).__name__}")
        if self.probs.dim() < 3:
            raise ValueError(
                f"probs must be (S, B, C) or (S, B, T, V); got shape {tuple(self.probs.shape)}"
            )
        if self.probs.is_floating_point():
            check_simplex("probs", self.probs)
        if self.components is not None and self.components.shape != self.probs.shape[:1]:
            raise ValueError(
                f"components must have shape ({self.probs.shape[0]},) (one per draw); got "
                f"{tuple(self.components.shape)}"
            )
        if self.mask is not None and self.mask.shape != self.probs.shape[1:-1]:
            raise ValueError(
                f"mask must have shape {tuple(self.probs.shape[1:-1])} (probs without S and C); "
                f"got {tuple(self.mask.shape)}"
            )

    @property
    def num_samples(self) -> int:
        return self.probs.shape[0]

    @property
    def mean_probs(self) -> Tensor:
        r""":math:`\bar p = \frac1S\sum_s p_s`. Shape ``(B, C)``."""
        return self.probs.mean(0)

    @property
    def predictive_entropy(self) -> Tensor:
        r"""Total uncertainty :math:`H[\bar p]`. Shape ``(B,)``."""
        return uncertainty_decomposition(self.probs)[0]

    @property
    def expected_entropy(self) -> Tensor:
        r"""Aleatoric uncertainty :math:`\frac1S\sum_s H[p_s]`. Shape ``(B,)``."""
        return uncertainty_decomposition(self.probs)[1]

    @property
    def mutual_information(self) -> Tensor:
        r"""Epistemic uncertainty :math:`I = H[\bar p] - \frac1S\sum_s H[p_s] \ge 0`.
        Shape ``(B,)``."""
        return uncertainty_decomposition(self.probs)[2]

    def log_likelihood(self, y: Tensor) -> Tensor:
        r"""Pointwise log-likelihood of observed labels under every sample,
        :math:`\ell_{sb} = \log p_s(y_b\mid x_b)`; per-token results sum over the valid tokens
        of an example. Shape ``(S, B)`` (what ArviZ's ``log_likelihood`` group and LOO read)."""
        if not isinstance(y, Tensor) or y.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"y must be an integer label tensor; got {getattr(y, 'dtype', y)!r}")
        if y.shape != self.probs.shape[1:-1]:
            raise ValueError(
                f"y must have shape {tuple(self.probs.shape[1:-1])} (probs without S and C); "
                f"got {tuple(y.shape)}"
            )
        C = self.probs.shape[-1]
        bad = (y < 0) | (y >= C)  # (B, ...)
        if self.mask is not None:
            bad = bad & self.mask  # labels at padded positions are never read
        if bool(bad.any()):
            seen = y[bad]
            raise ValueError(
                f"y must hold labels in [0, {C}) (the probs have {C} classes); got "
                f"{int(seen.min())}..{int(seen.max())} at {int(bad.sum())} position(s)"
            )
        idx = y.long().clamp(0, C - 1)  # only padded positions move (their terms are zeroed)
        p = self.probs.gather(-1, idx.expand(self.probs.shape[:-1]).unsqueeze(-1)).squeeze(-1)
        lp = p.double().clamp_min(torch.finfo(torch.float64).tiny).log()  # (S, B, ...)
        if self.mask is not None:
            lp = torch.where(self.mask, lp, torch.zeros_like(lp))
        return lp.reshape(lp.shape[0], lp.shape[1], -1).sum(-1).to(self.probs.dtype)

    @property
    def predictions(self) -> Tensor:
        """Argmax of the posterior predictive. Shape ``(B,)`` int64."""
        return self.mean_probs.argmax(-1)

    @property
    def confidence(self) -> Tensor:
        r""":math:`\max_c \bar p_c`. Shape ``(B,)``."""
        return self.mean_probs.max(-1).values

    def summary(self) -> dict[str, float]:
        """Scalars averaged over the batch, plus ``"attention/<layer>/<stat>"`` for every kept
        layer (see :meth:`AttentionSamples.summary`); per-token results average over the valid
        positions (``mask``)."""

        def avg(t: Tensor) -> float:
            return float(t[self.mask].mean() if self.mask is not None else t.mean())

        out: dict[str, float] = {
            "num_samples": float(self.num_samples),
            "mean_confidence": avg(self.confidence),
            "mean_predictive_entropy": avg(self.predictive_entropy),
            "mean_expected_entropy": avg(self.expected_entropy),
            "mean_mutual_information": avg(self.mutual_information),
        }
        for name, a in self.attention.items():
            for k, v in a.summary().items():
                out[f"attention/{name}/{k}"] = v
        return out
