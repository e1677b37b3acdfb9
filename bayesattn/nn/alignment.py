r"""The latent-alignment output layer of :class:`~bayesattn.nn.networks.Seq2Seq`
(``alignment="latent"``): cross-attention as a categorical latent :math:`z_t` over source
positions, marginalised exactly.

.. math::
    \pi_{tj} = \mathrm{softmax}_j\big((W_q h_t)\cdot(W_k m_j)/\sqrt d\big), \qquad
    p(y_t \mid z_t = j) = \mathrm{softmax}\big(W_o\,\mathrm{LN}(g_{tj})\big),\quad
    g_{tj} = u_{tj} + \mathrm{FF}(\mathrm{LN}(u_{tj})),\; u_{tj} = h_t + e(x_j),

and :math:`p(y_t) = \sum_j \pi_{tj}\, p(y_t \mid z_t = j)` (the sum in closed form;
:func:`enumerated_alignment_model` is the same model with Pyro enumeration). ``h_t`` is the
decoder state of the target prefix, ``m_j`` the encoder memory of source word ``j`` (the prior
reads the whole sentence) and ``e(x_j)`` the embedding of the source word itself: the emission sees
only the word it is aligned to, so an alignment is a statement about words (with the contextual
memory in the emission every position could explain every word, and the posterior would stay
at its prior).
"""

from __future__ import annotations

import math

import pyro
import pyro.distributions as dist
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._validation import check_int
from ..functional.alignment import alignment_log_prior, mixture_log_probs
from .linear import linear

__all__ = ["LatentAlignment", "enumerated_alignment_model"]


class LatentAlignment(nn.Module):
    """Prior over source positions, per-position emissions and their exact mixture.

    Shape:
        h ``(…, B, Tt, E)``, memory ``(…, B, Ts, E)``, src ``(B, Ts)`` source tokens,
        key_padding_mask ``(B, Ts)`` → ``forward``: ``(…, B, Tt, V)`` log-probabilities of the
        marginal.
    """

    def __init__(
        self,
        d_model: int,
        src_vocab_size: int,
        vocab_size: int,
        dim_feedforward: int,
        layer_norm_eps: float = 1e-5,
    ) -> None:
        check_int("d_model", d_model, 1)
        check_int("src_vocab_size", src_vocab_size, 1)
        check_int("vocab_size", vocab_size, 1)
        check_int("dim_feedforward", dim_feedforward, 1)
        super().__init__()
        self.d_model = d_model
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.word = nn.Embedding(src_vocab_size, d_model)
        self.norm1 = nn.LayerNorm(d_model, eps=layer_norm_eps)
        self.linear1 = nn.Linear(d_model, dim_feedforward)
        self.linear2 = nn.Linear(dim_feedforward, d_model)
        self.norm2 = nn.LayerNorm(d_model, eps=layer_norm_eps)
        self.head = nn.Linear(d_model, vocab_size)
        #: a uniform prior over the real source positions (IBM Model 1): train a few epochs with
        #: it first so the emissions learn which words translate which before the prior commits
        self.uniform_prior = False

    def log_prior(
        self, h: Tensor, memory: Tensor, key_padding_mask: Tensor | None = None
    ) -> Tensor:
        r""":math:`\log p(z_t = j \mid x, y_{<t})`; ``-inf`` at padded source positions.

        Shape:
            → ``(…, B, Tt, Ts)``.
        """
        q = linear(h, self.q_proj.weight, self.q_proj.bias)  # (…, B, Tt, E)
        k = linear(memory, self.k_proj.weight, self.k_proj.bias)  # (…, B, Ts, E)
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.d_model)  # (…, B, Tt, Ts)
        if self.uniform_prior:
            scores = torch.zeros_like(scores)
        return alignment_log_prior(scores, key_padding_mask)

    def log_emissions(self, h: Tensor, src: Tensor) -> Tensor:
        r""":math:`\log p(y_t = v \mid z_t = j, x_j, y_{<t})` for every position and token.

        Shape:
            h ``(…, B, Tt, E)``, src ``(B, Ts)`` → ``(…, B, Tt, Ts, V)``.
        """
        c = self.word(src)  # (B, Ts, E)
        u = h.unsqueeze(-2) + c.unsqueeze(-3)  # (…, B, Tt, Ts, E)
        ff = linear(F.relu(linear(self.norm1(u), self.linear1.weight, self.linear1.bias)),
                    self.linear2.weight, self.linear2.bias)  # fmt: skip
        logits = linear(self.norm2(u + ff), self.head.weight, self.head.bias)  # (…,B,Tt,Ts,V)
        return torch.log_softmax(logits, dim=-1)

    def forward(
        self, h: Tensor, memory: Tensor, src: Tensor, key_padding_mask: Tensor | None = None
    ) -> Tensor:
        return mixture_log_probs(
            self.log_prior(h, memory, key_padding_mask), self.log_emissions(h, src)
        )


def enumerated_alignment_model(
    log_prior: Tensor, log_emission: Tensor, tgt: Tensor, mask: Tensor | None = None
) -> None:
    r"""The latent-alignment likelihood as a Pyro model: ``z[b, t] ~ Categorical(π_bt)``
    enumerated in parallel (``infer={"enumerate": "parallel"}``) over source positions,
    ``y[b, t] ~ Categorical(p(· | z))`` observed. Under ``TraceEnum_ELBO`` with an empty guide its
    loss is :math:`-\sum_{b,t} \log\sum_j \pi_{btj} p(y_{bt} \mid j)`, the closed form of
    :func:`~bayesattn.functional.alignment.mixture_log_probs` (tested equal).

    Shape:
        log_prior ``(B, Tt, Ts)``, log_emission ``(B, Tt, Ts, V)``, tgt ``(B, Tt)``,
        mask ``(B, Tt)`` (``True`` = scored).
    """
    B, T = tgt.shape
    if log_prior.shape[:2] != (B, T) or log_emission.shape[:3] != log_prior.shape:
        raise ValueError(
            "log_prior (B, Tt, Ts), log_emission (B, Tt, Ts, V) and tgt (B, Tt) must agree; got "
            f"{tuple(log_prior.shape)}, {tuple(log_emission.shape)}, {tuple(tgt.shape)}"
        )
    with pyro.plate("tokens", T, dim=-1), pyro.plate("batch", B, dim=-2):
        z = pyro.sample(
            "z", dist.Categorical(logits=log_prior), infer={"enumerate": "parallel"}
        )  # (B, T) or (Ts, 1, 1) when enumerated
        # emission rows of the chosen position: log_emission[b, t, z] (enumerated z broadcasts)
        b = torch.arange(B, device=tgt.device)[:, None]  # (B, 1)
        t = torch.arange(T, device=tgt.device)[None, :]  # (1, T)
        d = dist.Categorical(logits=log_emission[b, t, z])  # (…, B, T, V)
        if mask is not None:
            d = d.mask(mask)
        pyro.sample("y", d, obs=tgt)
