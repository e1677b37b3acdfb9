r"""A class-conditional density read of what attention writes (DDU's discriminant analysis, with a
conjugate posterior): fitted post hoc on a trained network's features, one or more *views*
(the CLS output the head reads, the mean of the final token states).

For each view :math:`v` and class :math:`c` the features of the training examples of class
:math:`c` give a Normal–inverse-Wishart posterior over that class's mean and full covariance
(:mod:`bayesattn.functional.niw`; the prior centred on the training mean with the pooled
within-class covariance, its strength :math:`\nu_0` chosen by the validation features' log
predictive density under their own class: in-distribution data only). A query's feature density
is the posterior predictive mixture

.. math:: \log p_v(h) = \operatorname{logsumexp}_c\big(\log\pi_c + \log t_{vc}(h)\big),

:math:`t_{vc}` the class's Student-t predictive. The OOD score is the sum over views of
:math:`-\log p_v(h_v(x))`, each standardised by its mean and standard deviation on the
validation split (so neither view's dimension dominates).

Two predictives:

* :meth:`ClassDensityRead.probs` — the network's logits under a density-aware temperature,
  :math:`\operatorname{softmax}\big(z(x) / \sqrt{T^2 + b\,u(x)}\big)` with
  :math:`u = \operatorname{softplus}(\text{score})`, :math:`(T, b\ge0)` fitted on the validation
  NLL (the density was fitted on the training split, so validation inputs look as unseen as test
  inputs). :math:`b = 0` is temperature scaling; :math:`T \to 0` is a temperature proportional
  to :math:`\sqrt u` (the form the fit often picks: the logits' confidence divided by the
  feature novelty).
* :meth:`ClassDensityRead.sample_probs` — the generative classifier under posterior draws of the
  class parameters of the first view: :math:`p_s(c\mid h) \propto \pi_c\,\mathcal N(h;
  \mu_{cs}, \Sigma_{cs})`; their disagreement is the read's mutual information.

:meth:`ClassDensityRead.kl` is the global KL of every class posterior from the prior, in nats
(closed form, :func:`~bayesattn.functional.niw.niw_kl`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from .._validation import check_int
from ..calibration.variance_temperature import fit_variance_temperature, variance_tempered
from ..functional.niw import (
    NIW,
    niw_kl,
    niw_log_predictive,
    niw_posterior,
    niw_predictive,
    niw_sample,
    student_t_log_prob_batched,
)
from ._checks import check_labels

__all__ = ["ClassDensityRead", "fit_class_density", "fit_density_temperature"]

#: candidate prior strengths nu_0 - D - 1 (pseudo-observations of the covariance)
DEFAULT_STRENGTHS: tuple[float, ...] = (1.0, 4.0, 16.0, 64.0, 256.0)


@dataclass
class ClassDensityRead:
    """A fitted read (:func:`fit_class_density`); one list of class posteriors per view."""

    priors: list[NIW]
    posteriors: list[list[NIW]]  # [view][class]
    log_class_prior: Tensor  # (C,)
    score_center: Tensor  # (V,)
    score_scale: Tensor  # (V,)
    strengths: list[float]
    temperature: float = 1.0  # T of the density-aware temperature sqrt(T² + b·u)
    scale: float = 0.0  # b
    #: the class predictives stacked per view (:meth:`_predictives`; derived, cached)
    _stacked: list[tuple[Tensor, Tensor, Tensor]] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    @property
    def num_views(self) -> int:
        return len(self.posteriors)

    @property
    def num_classes(self) -> int:
        return len(self.posteriors[0])

    def _check_views(self, views: Sequence[Tensor]) -> list[Tensor]:
        if not isinstance(views, (list, tuple)) or len(views) != self.num_views:
            raise ValueError(
                f"views must be a sequence of {self.num_views} feature tensors (B, D); got "
                f"{type(views).__name__} of {len(views) if hasattr(views, '__len__') else '?'}"
            )
        out = []
        for i, (h, p) in enumerate(zip(views, self.priors, strict=True)):
            if not isinstance(h, Tensor) or h.dim() != 2 or h.shape[1] != p.dim:
                raise ValueError(
                    f"views[{i}] must be (B, {p.dim}); got {tuple(getattr(h, 'shape', ()))}"
                )
            if not bool(torch.isfinite(h).all()):
                raise ValueError(f"views[{i}] holds NaN/inf values")
            out.append(h.double())
        if len({h.shape[0] for h in out}) != 1:
            raise ValueError(f"views differ in batch size: {[tuple(h.shape) for h in out]}")
        return out

    def _predictives(self) -> list[tuple[Tensor, Tensor, Tensor]]:
        """Per view the class predictives stacked: loc ``(C, D)``, scale_tril ``(C, D, D)``,
        df ``(C,)`` (computed once: the posteriors do not change after the fit)."""
        if self._stacked is None:
            self._stacked = []
            for posts in self.posteriors:
                parts = [niw_predictive(p) for p in posts]
                self._stacked.append((torch.stack([p[0] for p in parts]),
                                      torch.stack([p[1] for p in parts]),
                                      torch.tensor([p[2] for p in parts], dtype=torch.float64)))  # fmt: skip
        return self._stacked

    def class_log_likelihood(self, views: Sequence[Tensor]) -> Tensor:
        r""":math:`\log t_{vc}(h_v)` of every view and class ``(V, B, C)``: the Student-t of
        :func:`~bayesattn.functional.niw.student_t_log_prob`, batched over the classes."""
        hs = self._check_views(views)
        out = [student_t_log_prob_batched(h, loc, tril, df)  # (B, C)
               for h, (loc, tril, df) in zip(hs, self._predictives(), strict=True)]  # fmt: skip
        return torch.stack(out)  # (V, B, C)

    def log_density(self, views: Sequence[Tensor]) -> Tensor:
        r""":math:`\log p_v(h_v)` of each view ``(V, B)`` (the class mixture)."""
        return torch.logsumexp(self.class_log_likelihood(views) + self.log_class_prior, -1)

    def _raw_score(self, views: Sequence[Tensor]) -> Tensor:
        return -self.log_density(views)  # (V, B)

    def score(self, views: Sequence[Tensor]) -> Tensor:
        """The OOD score ``(B,)`` (higher = less like the training data): the sum over views of
        the standardised negative log density."""
        z = (self._raw_score(views) - self.score_center[:, None]) / self.score_scale[:, None]
        return z.sum(0)

    def probs(self, logits: Tensor, views: Sequence[Tensor]) -> Tensor:
        """The density-aware tempered predictive ``(B, C)`` of the network's ``logits``."""
        return self.probs_from_novelty(logits, nn.functional.softplus(self.score(views)))

    def probs_from_novelty(self, logits: Tensor, u: Tensor) -> Tensor:
        """``softmax(z / sqrt(T² + b·u))`` ``(B, C)`` in float64 (``u = softplus(score)``)."""
        return torch.softmax(_tempered(logits.double(), u, self.temperature, self.scale), -1)

    def sample_probs(
        self, views: Sequence[Tensor], num_samples: int = 8, seed: int = 0
    ) -> Tensor:
        r"""``(S, B, C)`` generative-classifier probabilities under ``S`` posterior draws of the
        first view's class means and covariances (the draws' spread is the read's MI)."""
        check_int("num_samples", num_samples, 1)
        h = self._check_views(views)[0]
        g = torch.Generator().manual_seed(seed)
        parts = []
        for post in self.posteriors[0]:
            mean, tril = niw_sample(post, num_samples, g)  # (S, D), (S, D, D)
            d = torch.distributions.MultivariateNormal(mean[:, None, :], scale_tril=tril[:, None])
            parts.append(d.log_prob(h))  # (S, B)
        ll = torch.stack(parts, -1) + self.log_class_prior  # (S, B, C)
        return torch.softmax(ll, -1)

    def kl(self) -> float:
        """KL of every class posterior from its prior, summed over classes and views (nats)."""
        return float(sum(niw_kl(q, p) for posts, p in zip(self.posteriors, self.priors,
                                                           strict=True) for q in posts))  # fmt: skip


def _tempered(z: Tensor, u: Tensor, temperature: Tensor | float, scale: Tensor | float) -> Tensor:
    return variance_tempered(z, u, temperature, scale, "additive")


def fit_density_temperature(logits: Tensor, u: Tensor, labels: Tensor) -> tuple[float, float]:
    r"""``(T, b)`` minimising the NLL of :math:`\operatorname{softmax}(z / \sqrt{T^2 + b u})`
    (:func:`~bayesattn.calibration.fit_variance_temperature`, ``form="additive"``).

    Shape:
        logits ``(B, C)``, u ``(B,)``, labels ``(B,)``.
    """
    return fit_variance_temperature(logits, u, labels, "additive")


def _best_strength(
    h: Tensor, hv: Tensor, y: Tensor, yv: Tensor, num_classes: int, strengths: Sequence[float]
) -> tuple[float, float, NIW, list[NIW]]:
    """``(log predictive, strength, prior, class posteriors)`` of the strength whose class
    posteriors on ``h (N, D)`` give the validation features ``hv`` the highest log predictive
    density under their own class (the first of equals)."""
    best: tuple[float, float, NIW, list[NIW]] | None = None
    for s in strengths:
        prior = _tied_prior(h, y, num_classes, float(s))
        posts = [niw_posterior(h[y == c], prior) for c in range(num_classes)]
        ll = sum(float(niw_log_predictive(hv[yv == c], posts[c]).sum())
                 for c in range(num_classes) if bool((yv == c).any()))  # fmt: skip
        if best is None or ll > best[0]:
            best = (ll, float(s), prior, posts)
    assert best is not None
    return best


def _tied_prior(h: Tensor, y: Tensor, num_classes: int, strength: float) -> NIW:
    D = h.shape[1]
    centred = torch.cat([h[y == c] - h[y == c].mean(0) for c in range(num_classes)
                         if bool((y == c).any())])  # fmt: skip
    cov = centred.T @ centred / max(len(centred) - num_classes, 1)
    ridge = 1e-6 * float(cov.diagonal().mean()) + 1e-12
    cov = cov + ridge * torch.eye(D, dtype=torch.float64)
    df = D + 1 + strength
    return NIW(h.mean(0), 1.0, cov * strength, df)  # E[Σ] = Ψ0 / (ν0 - D - 1) = cov


def fit_class_density(
    train_views: Sequence[Tensor],
    y_train: Tensor,
    val_views: Sequence[Tensor],
    y_val: Tensor,
    num_classes: int,
    val_logits: Tensor | None = None,
    strengths: Sequence[float] = DEFAULT_STRENGTHS,
) -> ClassDensityRead:
    """Fit the read (module docstring): per view, the prior strength from ``strengths`` with the
    best validation log predictive density under the true class, the class posteriors on the
    training features, the score's standardisation on validation, and, with ``val_logits``, the
    density-aware temperature :math:`(T, a)` on the validation NLL.

    Shape:
        train_views ``[(N, D_v)]``, y_train ``(N,)``, val_views ``[(M, D_v)]``, y_val ``(M,)``,
        val_logits ``(M, C)``.
    """
    check_int("num_classes", num_classes, 2)
    if not isinstance(train_views, (list, tuple)) or not train_views:
        raise ValueError("train_views must be a non-empty sequence of (N, D) feature tensors")
    if len(val_views) != len(train_views):
        raise ValueError(
            f"val_views must hold as many views as train_views ({len(train_views)}); got "
            f"{len(val_views)}"
        )
    y_train = check_labels("y_train", y_train, num_classes=num_classes)
    y_val = check_labels("y_val", y_val, num_classes=num_classes)
    counts = torch.bincount(y_train, minlength=num_classes)
    if bool((counts == 0).any()):
        raise ValueError(f"every class needs training examples; counts {counts.tolist()}")
    if not strengths or any(not (s > 0) for s in strengths):
        raise ValueError(f"strengths must be a non-empty sequence of numbers > 0; got {strengths}")
    priors, posteriors, chosen = [], [], []
    for i, (h, hv) in enumerate(zip(train_views, val_views, strict=True)):
        h, hv = _features(f"train_views[{i}]", h, len(y_train)), _features(
            f"val_views[{i}]", hv, len(y_val), h.shape[1]
        )
        best = _best_strength(h, hv, y_train, y_val, num_classes, strengths)
        priors.append(best[2])
        posteriors.append(best[3])
        chosen.append(best[1])
    log_pi = torch.log(counts.double() / counts.sum())
    read = ClassDensityRead(priors, posteriors, log_pi, torch.zeros(len(priors)),
                            torch.ones(len(priors)), chosen)  # fmt: skip
    raw = read._raw_score(val_views)  # (V, M)
    read.score_center = raw.mean(1)
    read.score_scale = raw.std(1).clamp_min(1e-12) if raw.shape[1] > 1 else torch.ones(len(raw))
    if val_logits is not None:
        if val_logits.shape != (len(y_val), num_classes):
            raise ValueError(
                f"val_logits must be ({len(y_val)}, {num_classes}); got {tuple(val_logits.shape)}"
            )
        u = nn.functional.softplus(read.score(val_views))
        read.temperature, read.scale = fit_density_temperature(val_logits, u, y_val)
    return read


def _features(name: str, h: Tensor, n: int, dim: int | None = None) -> Tensor:
    if not isinstance(h, Tensor) or h.dim() != 2 or h.shape[0] != n:
        raise ValueError(f"{name} must be ({n}, D); got {tuple(getattr(h, 'shape', ()))}")
    if dim is not None and h.shape[1] != dim:
        raise ValueError(f"{name} must have D = {dim} as its training view; got {tuple(h.shape)}")
    if not bool(torch.isfinite(h).all()):
        raise ValueError(f"{name} holds NaN/inf values")
    return h.double()
