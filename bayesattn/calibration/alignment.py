r"""Alignment quality against gold word alignments (Och & Ney 2003; Brown et al. 1993).

Links are boolean matrices ``(…, Tt, Ts)`` (target word ``t`` aligned to source word ``j``). With
predicted links :math:`A`, sure gold links :math:`S` and possible links :math:`P \supseteq S`:

.. math::
    \mathrm{precision} = \frac{|A\cap P|}{|A|},\qquad
    \mathrm{recall} = \frac{|A\cap S|}{|S|},\qquad
    \mathrm{AER} = 1 - \frac{|A\cap S| + |A\cap P|}{|A| + |S|}.

Pure functions on tensors; counts are summed over every leading dim (a corpus-level score).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["argmax_links", "alignment_error_rate", "link_precision_recall"]


def _check_links(name: str, links: Tensor, shape: torch.Size | None = None) -> Tensor:
    if not isinstance(links, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of links; got {type(links).__name__}")
    if links.dim() < 2:
        raise ValueError(f"{name} must be (…, Tt, Ts); got shape {tuple(links.shape)}")
    if shape is not None and links.shape != shape:
        raise ValueError(
            f"{name} must have the predicted links' shape {tuple(shape)}; got {tuple(links.shape)}"
        )
    if links.dtype != torch.bool:
        if links.is_floating_point() and not bool(((links == 0) | (links == 1)).all()):
            raise ValueError(f"{name} must hold 0/1 or booleans; got other values")
        links = links != 0
    return links


def argmax_links(probs: Tensor, rows: Tensor | None = None) -> Tensor:
    """One link per scored target word, to its most probable source word.

    Shape:
        probs ``(…, Tt, Ts)``, rows ``(…, Tt)`` (``True``: link this word) → bool ``(…, Tt, Ts)``.
    """
    if not isinstance(probs, Tensor) or probs.dim() < 2:
        raise ValueError(f"probs must be a (…, Tt, Ts) tensor; got {probs!r:.80}")
    links = torch.zeros(probs.shape, dtype=torch.bool, device=probs.device)
    links.scatter_(-1, probs.argmax(-1, keepdim=True), True)
    if rows is not None:
        if rows.shape != probs.shape[:-1]:
            raise ValueError(
                f"rows must be probs' shape without the last dim {tuple(probs.shape[:-1])}; got "
                f"{tuple(rows.shape)}"
            )
        links &= rows.bool().unsqueeze(-1)
    return links


def link_precision_recall(
    predicted: Tensor, sure: Tensor, possible: Tensor | None = None
) -> tuple[float, float]:
    """``(precision, recall)`` of the predicted links; ``possible`` defaults to ``sure``.

    Shape:
        predicted, sure, possible ``(…, Tt, Ts)`` → two floats (``nan`` when a denominator is 0).
    """
    a = _check_links("predicted", predicted)
    s = _check_links("sure", sure, a.shape)
    p = s if possible is None else _check_links("possible", possible, a.shape) | s
    n_a, n_s = int(a.sum()), int(s.sum())
    prec = int((a & p).sum()) / n_a if n_a else float("nan")
    rec = int((a & s).sum()) / n_s if n_s else float("nan")
    return prec, rec


def alignment_error_rate(predicted: Tensor, sure: Tensor, possible: Tensor | None = None) -> float:
    """Alignment error rate in ``[0, 1]`` (0: every sure link found, no link outside possible).

    Shape:
        predicted, sure, possible ``(…, Tt, Ts)`` → float (``nan`` with no links at all).
    """
    a = _check_links("predicted", predicted)
    s = _check_links("sure", sure, a.shape)
    p = s if possible is None else _check_links("possible", possible, a.shape) | s
    denom = int(a.sum()) + int(s.sum())
    if denom == 0:
        return float("nan")
    return 1.0 - (int((a & s).sum()) + int((a & p).sum())) / denom
