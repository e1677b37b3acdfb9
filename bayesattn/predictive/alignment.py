r"""Alignment posteriors of a :class:`~bayesattn.nn.networks.Seq2Seq`: which source word explains
each observed target word.

.. math::
    \text{prior } p(z_t = j \mid x, y_{<t}), \qquad
    \text{posterior } p(z_t = j \mid x, y_{\le t}) \propto
    p(z_t = j \mid x, y_{<t})\, p(y_t \mid z_t = j, x, y_{<t}).

:func:`alignment_posterior` computes both for any decoder kind: exact for
``alignment="latent"``; for soft attention (deterministic or with a variational family) the
prior is the last layer's cross-attention and the posterior is the posterior attention of
Shankar & Sarawagi (2019). Draws (a family's attention samples) or a list of ensemble members
travel as a leading dim; their disagreement is one measure of how far to trust a link.
A variational decoder (``alignment="variational"``) has two readings of the posterior: the
exact one above (``posterior="exact"``) and its inference network's amortised
:math:`q(z_t \mid x, y)`, which also sees the target words after :math:`y_t`
(``posterior="inference"``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

import torch
from torch import Tensor

from .._validation import check_int
from ..functional.alignment import (
    alignment_log_posterior,
    categorical_entropy,
    categorical_kl,
    jensen_shannon,
)
from ..nn.modes import AttentionMode, attention_mode, check_mode
from ..nn.networks import Seq2Seq

__all__ = ["AlignmentPosterior", "PosteriorKind", "alignment_posterior"]

#: which posterior: Bayes' rule on the model (``"exact"``) or a variational decoder's inference
#: network :math:`q(z_t \mid x, y)` (``"inference"``)
PosteriorKind = Literal["exact", "inference"]


@dataclass
class AlignmentPosterior:
    """Prior and posterior alignment of every target word, per draw.

    Rows are indexed like ``tgt[:, 1:]`` (the predicted words), columns are source positions.
    ``log_prior``/``log_posterior`` hold ``-inf`` at padded source positions.

    Shape:
        log_prior, log_posterior ``(S, B, Tt-1, Ts)``; tgt_mask ``(B, Tt-1)`` (``True``: a real
        target token, EOS included); src_mask ``(B, Ts)`` (``True``: a real source word);
        probs ``(S, B, Tt-1, V)`` the predictive of each draw (teacher forcing).
    """

    log_prior: Tensor
    log_posterior: Tensor
    tgt_mask: Tensor
    src_mask: Tensor
    probs: Tensor

    @property
    def num_draws(self) -> int:
        return self.log_prior.shape[0]

    @property
    def prior(self) -> Tensor:
        """Draw-averaged prior ``(B, Tt-1, Ts)``."""
        return self.log_prior.exp().mean(0)

    @property
    def posterior(self) -> Tensor:
        """Draw-averaged posterior ``(B, Tt-1, Ts)``."""
        return self.log_posterior.exp().mean(0)

    def kl(self) -> Tensor:
        r""":math:`\mathrm{KL}(\text{posterior}\,\|\,\text{prior})` per target word, nats, averaged
        over draws ``(B, Tt-1)``: how much observing :math:`y_t` moved the alignment."""
        return categorical_kl(self.log_posterior, self.log_prior).mean(0)

    def entropy(self, which: str = "posterior") -> Tensor:
        """Entropy (nats) of the draw-averaged prior or posterior ``(B, Tt-1)``."""
        p = self._pick(which)
        return categorical_entropy(p.clamp_min(0).log())

    def disagreement(self, which: str = "posterior") -> Tensor:
        """Jensen–Shannon disagreement of the draws (nats, ``(B, Tt-1)``; 0 with one draw)."""
        log_p = self.log_prior if which == "prior" else self.log_posterior
        self._pick(which)
        return jensen_shannon(log_p.exp())

    def _pick(self, which: str) -> Tensor:
        if which == "prior":
            return self.prior
        if which == "posterior":
            return self.posterior
        raise ValueError(f"which must be 'prior' or 'posterior'; got {which!r}")


def _members(model: Seq2Seq | Sequence[Seq2Seq]) -> list[Seq2Seq]:
    if isinstance(model, Seq2Seq):
        return [model]
    members = list(model) if isinstance(model, Sequence) and not isinstance(model, str) else []
    if not members or not all(isinstance(m, Seq2Seq) for m in members):
        raise TypeError(
            "model must be a Seq2Seq or a non-empty sequence of Seq2Seq (an ensemble); got "
            f"{type(model).__name__}"
        )
    return members


@torch.no_grad()
def alignment_posterior(
    model: Seq2Seq | Sequence[Seq2Seq],
    src: Tensor,
    tgt: Tensor,
    num_samples: int = 1,
    mode: AttentionMode = "guide",
    posterior: PosteriorKind = "exact",
) -> AlignmentPosterior:
    r"""Prior and posterior alignments of ``tgt`` given ``src`` (teacher forcing), in eval mode.

    ``model``: one :class:`~bayesattn.nn.networks.Seq2Seq` of either decoder kind, or a list of
    them (an ensemble: one draw per member). A network with Bayesian attention draws
    ``num_samples`` attention samples per member in ``mode`` (``"mean"``: its posterior mean,
    one draw); a deterministic network gives one draw. ``posterior="inference"`` (variational
    decoders only) puts the inference network's :math:`q(z_t \mid x, y)` in ``log_posterior``
    instead of Bayes' rule.

    Shape:
        src ``(B, Ts)``, tgt ``(B, Tt)`` → :class:`AlignmentPosterior` with
        ``S = members × draws``.
    """
    members = _members(model)
    check_int("num_samples", num_samples, 1)
    mode = check_mode(mode)
    if posterior not in get_args(PosteriorKind):
        raise ValueError(f"posterior must be one of {get_args(PosteriorKind)}; got {posterior!r}")
    if posterior == "inference" and any(m.inference is None for m in members):
        kinds = sorted({m.alignment for m in members})
        raise ValueError(
            "posterior='inference' needs Seq2Seq(alignment='variational') models; got "
            f"alignment {', '.join(map(repr, kinds))}"
        )
    priors, posts, probs = [], [], []
    for net in members:
        net.check_batch(src, tgt)
        S = num_samples if (net.bayesian_layers and mode != "mean") else 1
        was_training = net.training
        net.eval()
        try:
            with attention_mode(mode), net.pyro_context:
                log_prior, log_lik, logits = net.alignment_terms(src, tgt, S)
                log_q = (
                    net.inference_log_posterior(src, tgt, S) if posterior == "inference" else None
                )
        finally:
            net.train(was_training)
        log_post = alignment_log_posterior(log_prior, log_lik) if log_q is None else log_q
        if log_prior.dim() == 3:  # no sample dim: one draw
            log_prior, log_post, logits = log_prior[None], log_post[None], logits[None]
        priors.append(log_prior)
        posts.append(log_post)
        probs.append(torch.softmax(logits, -1))
    ref = members[0]
    return AlignmentPosterior(
        log_prior=torch.cat(priors),
        log_posterior=torch.cat(posts),
        tgt_mask=tgt[:, 1:] != ref.pad_id,
        src_mask=src != ref.pad_id,
        probs=torch.cat(probs),
    )
