r"""Latent alignments: the exact mixture likelihood and Bayes-rule posterior of a categorical
alignment :math:`z_t` over source positions (Deng et al. 2018, "Latent alignment and variational
attention"; the posterior attention of Shankar & Sarawagi 2019).

The model of one target position :math:`t` with source positions :math:`j = 1..T_s`:

.. math::
    p(z_t = j \mid x, y_{<t}) = \pi_{tj}, \qquad
    p(y_t \mid x, y_{<t}) = \sum_j \pi_{tj}\, p(y_t \mid z_t = j, x, y_{<t}),

    p(z_t = j \mid x, y_{\le t}) = \frac{\pi_{tj}\, p(y_t \mid z_t = j, \dots)}
                                     {\sum_k \pi_{tk}\, p(y_t \mid z_t = k, \dots)}.

Pure tensor functions, everything in log space; masked (padded) source positions get
:math:`\pi_{tj} = 0`. Shapes: ``(…, Tt, Ts)`` prior/posterior, ``(…, Tt, Ts, V)`` emissions.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = [
    "alignment_log_prior",
    "mixture_log_probs",
    "alignment_log_posterior",
    "alignment_elbo",
    "categorical_kl",
    "categorical_entropy",
    "jensen_shannon",
]


def alignment_log_prior(scores: Tensor, key_padding_mask: Tensor | None = None) -> Tensor:
    r""":math:`\log \pi_{tj} = \log\mathrm{softmax}_j(s_{tj})`, ``-inf`` at padded positions.

    Shape:
        scores ``(…, B, Tt, Ts)``, key_padding_mask ``(B, Ts)`` (``True`` = pad) → like scores.
    """
    if key_padding_mask is not None:
        scores = scores.masked_fill(key_padding_mask[:, None, :], float("-inf"))  # (…, B, Tt, Ts)
    return torch.log_softmax(scores, dim=-1)


def mixture_log_probs(log_prior: Tensor, log_emission: Tensor) -> Tensor:
    r"""The marginal :math:`\log p(y_t = v) = \log\sum_j \pi_{tj}\, p(v \mid z_t = j)` for every
    token ``v`` (the closed-form sum the enumerated Pyro model computes).

    Shape:
        log_prior ``(…, Tt, Ts)``, log_emission ``(…, Tt, Ts, V)`` (normalised over ``V``) →
        ``(…, Tt, V)``.
    """
    return torch.logsumexp(log_prior.unsqueeze(-1) + log_emission, dim=-2)  # (…, Tt, V)


def alignment_log_posterior(log_prior: Tensor, log_lik: Tensor) -> Tensor:
    r"""Bayes' rule, :math:`\log p(z_t = j \mid y_t) = \log\pi_{tj} + \log p(y_t \mid j) -
    \log\sum_k \pi_{tk} p(y_t \mid k)`; padded positions stay ``-inf``.

    Shape:
        log_prior ``(…, Tt, Ts)``, log_lik ``(…, Tt, Ts)`` (the emission at the observed token) →
        ``(…, Tt, Ts)``.
    """
    joint = log_prior + log_lik  # (…, Tt, Ts)
    return joint - torch.logsumexp(joint, dim=-1, keepdim=True)


def alignment_elbo(log_q: Tensor, log_prior: Tensor, log_lik: Tensor) -> Tensor:
    r"""The evidence lower bound of one target position under an alignment posterior
    :math:`q(z_t)`, with the sum over source positions enumerated (no sampling):

    .. math::
        \mathcal L_t = \sum_j q_{tj} \log p(y_t \mid z_t = j, \dots)
                      - \mathrm{KL}\big(q_t \,\|\, \pi_t\big)
                    = \log p(y_t \mid x, y_{<t}) - \mathrm{KL}\big(q_t \,\|\,
                      p(z_t \mid x, y_{\le t})\big) \le \log p(y_t \mid x, y_{<t}),

    with equality when ``q`` is the exact posterior (:func:`alignment_log_posterior`). Positions
    where :math:`q_{tj} = 0` (padding) contribute nothing.

    Shape:
        log_q, log_prior, log_lik ``(…, Tt, Ts)`` (``log_lik``: the emission at the observed
        token) → ``(…, Tt)``.
    """
    if not (log_q.shape == log_prior.shape == log_lik.shape):
        raise ValueError(
            "log_q, log_prior and log_lik must have the same shape (…, Tt, Ts); got "
            f"{tuple(log_q.shape)}, {tuple(log_prior.shape)}, {tuple(log_lik.shape)}"
        )
    q = log_q.exp()
    expected = torch.where(q > 0, q * log_lik, torch.zeros_like(q)).sum(-1)  # (…, Tt)
    return expected - categorical_kl(log_q, log_prior)


def _plogp_ratio(p: Tensor, log_p: Tensor, log_q: Tensor) -> Tensor:
    """``p (log p − log q)`` with the convention ``0 · (anything) = 0``."""
    diff = torch.where(p > 0, log_p - log_q, torch.zeros_like(log_p))
    return p * diff


def categorical_kl(log_p: Tensor, log_q: Tensor) -> Tensor:
    r""":math:`\mathrm{KL}(p\,\|\,q) = \sum_j p_j (\log p_j - \log q_j)` over the last dim, in nats.

    Shape:
        log_p, log_q ``(…, K)`` → ``(…,)``.
    """
    return _plogp_ratio(log_p.exp(), log_p, log_q).sum(-1)


def categorical_entropy(log_p: Tensor) -> Tensor:
    r""":math:`H(p) = -\sum_j p_j \log p_j` over the last dim, in nats.

    Shape:
        log_p ``(…, K)`` → ``(…,)``.
    """
    p = log_p.exp()
    return -torch.where(p > 0, p * log_p, torch.zeros_like(p)).sum(-1)


def jensen_shannon(probs: Tensor) -> Tensor:
    r"""Disagreement of ``S`` categorical draws (leading dim):
    :math:`H\big(\tfrac1S\sum_s p_s\big) - \tfrac1S\sum_s H(p_s) \ge 0` (the generalised
    Jensen–Shannon divergence; the mutual information between draw and outcome).

    Shape:
        probs ``(S, …, K)`` → ``(…,)``.
    """
    mean = probs.mean(0)
    h_mean = categorical_entropy(mean.clamp_min(0).log())
    return (h_mean - categorical_entropy(probs.clamp_min(0).log()).mean(0)).clamp_min(0)
