r"""Pure scores and feature views for token inputs (features in, ``(B,)`` score out), for the
density read and the trivial baselines on words.

* :func:`unknown_rate` -- the fraction of a text's words outside the training vocabulary (the
  reviewer's first question: is a held-out class only a vocabulary shift?).
* :func:`masked_token_mean` -- the mean final token state over the positions that are neither
  padding nor an unknown word (all unknown words share one embedding, so their states are
  typical of nothing yet pull a plain mean towards one point).
* :func:`standardise` / :func:`combine_scores` -- scores put on one scale by their mean and
  standard deviation on in-distribution validation data, then summed (Lee et al., 2018's
  feature ensemble; no OOD data is used to weigh them).
* :func:`mutual_information` -- the disagreement of ensemble members,
  :math:`H[\bar p] - \overline{H[p_s]}`.
* :func:`sequence_surprisal` -- the mean per-token negative log-likelihood of a text under a
  language model's next-token log-probabilities.

Higher scores mean *more likely out of distribution*.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["unknown_rate", "masked_token_mean", "standardise", "combine_scores",
           "mutual_information", "sequence_surprisal", "sequence_mutual_information"]  # fmt: skip


def _tokens(name: str, tokens: Tensor) -> Tensor:
    if not isinstance(tokens, Tensor) or tokens.dim() != 2 or tokens.is_floating_point():
        raise ValueError(
            f"{name} must be (B, T) integer token ids; got {getattr(tokens, 'shape', tokens)!r:.80}"
        )
    return tokens


def unknown_rate(tokens: Tensor, pad_id: int = 0, unk_id: int = 1) -> Tensor:
    r"""``(B,)`` float64: :math:`\#\{t: x_t = \text{unk}\} / \#\{t: x_t \ne \text{pad}\}` (0 for
    an all-padding row).

    Shape:
        tokens ``(B, T)`` → ``(B,)``.
    """
    tokens = _tokens("tokens", tokens)
    words = (tokens != pad_id).sum(-1).double()
    unknown = (tokens == unk_id).sum(-1).double()
    return unknown / words.clamp_min(1.0)


def masked_token_mean(
    states: Tensor, tokens: Tensor, pad_id: int = 0, unk_id: int | None = 1
) -> Tensor:
    r"""The mean of ``states`` over the positions whose token is neither ``pad_id`` nor
    ``unk_id`` (``unk_id=None``: padding only), :math:`\sum_t m_t h_t / \max(1, \sum_t m_t)`;
    a row with no such position gives zeros.

    Shape:
        states ``(B, T, E)``, tokens ``(B, T)`` → ``(B, E)``.
    """
    tokens = _tokens("tokens", tokens)
    if not isinstance(states, Tensor) or states.dim() != 3 or states.shape[:2] != tokens.shape:
        raise ValueError(
            f"states must be (B, T, E) with (B, T) = {tuple(tokens.shape)} of tokens; got "
            f"{tuple(getattr(states, 'shape', ()))}"
        )
    keep = tokens != pad_id
    if unk_id is not None:
        keep = keep & (tokens != unk_id)
    m = keep.to(states.dtype).unsqueeze(-1)  # (B, T, 1)
    return (states * m).sum(-2) / m.sum(-2).clamp_min(1.0)  # (B, E)


def _score(name: str, s: Tensor) -> Tensor:
    if not isinstance(s, Tensor) or s.dim() != 1 or s.numel() == 0:
        raise ValueError(f"{name} must be a non-empty (B,) tensor; got {getattr(s, 'shape', s)!r}")
    if not bool(torch.isfinite(s).all()):
        raise ValueError(f"{name} holds NaN/inf values")
    return s.double()


def standardise(score: Tensor, reference: Tensor) -> Tensor:
    r""":math:`(s - \mu_r) / \sigma_r`, the mean and standard deviation of the ``reference``
    scores (in-distribution validation data; :math:`\sigma_r` floored at ``1e-12``).

    Shape:
        score ``(B,)``, reference ``(M,)``, ``M >= 2`` → ``(B,)``.
    """
    s, r = _score("score", score), _score("reference", reference)
    if r.numel() < 2:
        raise ValueError(f"reference needs at least 2 scores; got {r.numel()}")
    return (s - r.mean()) / r.std().clamp_min(1e-12)


def combine_scores(scores: Sequence[Tensor], references: Sequence[Tensor]) -> Tensor:
    r""":math:`\sum_k (s_k - \mu_k) / \sigma_k`: each score standardised on its in-distribution
    ``references[k]`` (:func:`standardise`), then summed with equal weights.

    Shape:
        scores ``[(B,)]``, references ``[(M,)]`` → ``(B,)``.
    """
    if not scores or len(scores) != len(references):
        raise ValueError(
            f"scores and references must be non-empty and of one length; got {len(scores)} "
            f"and {len(references)}"
        )
    parts = [standardise(s, r) for s, r in zip(scores, references, strict=True)]
    if len({p.shape for p in parts}) != 1:
        raise ValueError(f"scores differ in length: {[tuple(p.shape) for p in parts]}")
    return torch.stack(parts).sum(0)


def mutual_information(member_probs: Tensor, eps: float = 1e-12) -> Tensor:
    r"""The members' disagreement :math:`H[\frac1S\sum_s p_s] - \frac1S\sum_s H[p_s]` (nats,
    :math:`\ge 0`).

    Shape:
        member_probs ``(S, B, C)`` → ``(B,)``.
    """
    if not isinstance(member_probs, Tensor) or member_probs.dim() != 3:
        raise ValueError(
            f"member_probs must be (S, B, C); got {tuple(getattr(member_probs, 'shape', ()))}"
        )
    p = member_probs.double()

    def entropy(q: Tensor) -> Tensor:
        return -(q * torch.log(q.clamp_min(eps))).sum(-1)

    return (entropy(p.mean(0)) - entropy(p).mean(0)).clamp_min(0.0)


def sequence_surprisal(log_probs: Tensor, targets: Tensor, pad_id: int = 0) -> Tensor:
    r"""The mean next-token surprisal :math:`-\frac1{n}\sum_{t: y_t \ne \text{pad}}
    \log p(y_t \mid y_{<t})` of each text (0 for an all-padding row).

    Shape:
        log_probs ``(B, T, V)`` (log-softmax over the vocabulary), targets ``(B, T)`` → ``(B,)``.
    """
    targets = _tokens("targets", targets)
    if (
        not isinstance(log_probs, Tensor)
        or log_probs.dim() != 3
        or (log_probs.shape[:2] != targets.shape)
    ):
        raise ValueError(
            f"log_probs must be (B, T, V) with (B, T) = {tuple(targets.shape)}; got "
            f"{tuple(getattr(log_probs, 'shape', ()))}"
        )
    lp = log_probs.double().gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (B, T)
    keep = (targets != pad_id).double()
    return -(lp * keep).sum(-1) / keep.sum(-1).clamp_min(1.0)


def sequence_mutual_information(log_probs: Tensor, targets: Tensor, pad_id: int = 0) -> Tensor:
    r"""The draws' disagreement about the next token, averaged over each text's non-padding
    positions: :math:`\frac1n\sum_{t: y_t \ne \text{pad}} \big(H[\bar p_t] - \frac1S\sum_s
    H[p_{st}]\big)`, :math:`\bar p_t = \frac1S\sum_s p_{st}` (0 for an all-padding row; the
    per-position term is :func:`mutual_information`).

    Shape:
        log_probs ``(S, B, T, V)`` (log-softmax draws over the vocabulary), targets ``(B, T)``
        → ``(B,)``.
    """
    targets = _tokens("targets", targets)
    if (
        not isinstance(log_probs, Tensor)
        or log_probs.dim() != 4
        or (log_probs.shape[1:3] != targets.shape)
    ):
        raise ValueError(
            f"log_probs must be (S, B, T, V) with (B, T) = {tuple(targets.shape)}; got "
            f"{tuple(getattr(log_probs, 'shape', ()))}"
        )
    if not log_probs.is_floating_point() or not bool(torch.isfinite(log_probs).all()):
        raise ValueError(
            f"log_probs must be finite floating-point log-probabilities; got dtype "
            f"{log_probs.dtype} with {int((~torch.isfinite(log_probs.double())).sum())} non-finite"
        )
    p = log_probs.exp()  # (S, B, T, V)
    h_each = -(p * log_probs).sum(-1).mean(0)  # (B, T)
    mean = p.mean(0)  # (B, T, V)
    h_mean = -(mean * torch.log(mean.clamp_min(1e-30))).sum(-1)  # (B, T)
    mi = (h_mean - h_each).double().clamp_min(0.0)
    keep = (targets != pad_id).double()
    return (mi * keep).sum(-1) / keep.sum(-1).clamp_min(1.0)
