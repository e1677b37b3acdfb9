r"""Dense attention as one more support: every key, the log-prior as a full ``(…, Tq, Tk)`` tensor.

The posterior mean without weights runs torch's fused ``scaled_dot_product_attention`` (rows with
no allowed key read zero, as the exact posterior says); with weights, or for draws, the logits
:math:`q\cdot k/\sqrt d` over every key are the support. A layer built without ``support=`` reads
through :data:`DENSE`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ... import functional as BF
from ...functional import supports as K
from ...priors import KeyRelevancePrior, UniformPrior, add_key_prior
from .base import AttentionSupport

__all__ = ["DenseSupport", "DENSE", "fused_attention"]


def fused_attention(q: Tensor, k: Tensor, v: Tensor, log_prior: Tensor | None, p: float) -> Tensor:
    """``F.scaled_dot_product_attention`` with rows that have no allowed key set to zero.

    Shape:
        q ``(…, B, H, Tq, Dh)``, k/v ``(…, B, H, Tk, Dh)``, log_prior broadcastable to
        ``(…, B, H, Tq, Tk)`` → ``(…, B, H, Tq, Dh)``.
    """
    dead = None
    if log_prior is not None:
        dead = ~(log_prior > float("-inf")).any(-1, keepdim=True)  # (…, Tq|1, 1)
        if torch.compiler.is_compiling():  # no data-dependent branch in a graph
            log_prior = log_prior.masked_fill(dead, 0.0)
        elif bool(dead.any()):
            log_prior = log_prior.masked_fill(dead, 0.0)
        else:
            dead = None
    lead = q.shape[:-3]  # (…, B)
    if len(lead) > 1 and k.shape[:-2] == q.shape[:-2] and v.shape[:-2] == q.shape[:-2]:
        # torch's CPU flash kernel takes 4-D inputs only (5-D falls back to the math path,
        # several times slower): fold the sample dims into the batch
        def fold(t: Tensor) -> Tensor:
            return t.reshape((-1,) + t.shape[-3:])

        lp = None if log_prior is None else fold(log_prior.expand(lead + log_prior.shape[-3:]))
        out = F.scaled_dot_product_attention(fold(q), fold(k), fold(v), attn_mask=lp, dropout_p=p)
        out = out.reshape(q.shape[:-1] + v.shape[-1:])
    else:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=log_prior, dropout_p=p)
    if dead is not None:
        out = out.masked_fill(dead, 0.0)
    return out


class DenseSupport(AttentionSupport):
    r"""Every key: :math:`p(z_i = j\mid q_i) \propto \pi_{ij}\exp(q_i\cdot k_j/\sqrt d)` over
    ``j = 1..Tk``, ``O(Tq·Tk)``. Takes every mask, ``add_bias_kv``/``add_zero_attn`` and any
    key-relevance prior."""

    name = "dense"

    def check_options(
        self,
        *,
        attn_mask: Tensor | None,
        is_causal: bool,
        prior: KeyRelevancePrior,
        extra_key: bool,
    ) -> None:
        """Dense attention takes everything."""

    def log_prior(
        self,
        prior: KeyRelevancePrior,
        attn_mask: Tensor | None,
        key_padding_mask: Tensor | None,
        is_causal: bool,
        q: Tensor,
        k: Tensor,
        q_pos: Tensor | None,
        k_pos: Tensor | None,
    ) -> Tensor | None:
        """log π: the masks as a log-prior plus the key-relevance prior (``None``: uniform).

        Shape:
            → ``(…, B|1, H|1, Tq|1, Tk)`` or ``None``.
        """
        log_prior = BF.mask_to_log_prior(
            attn_mask,
            key_padding_mask,
            is_causal,
            batch_size=q.shape[-4],
            num_heads=q.shape[-3],
            tgt_len=q.shape[-2],
            src_len=k.shape[-2],
            dtype=q.dtype,
            device=q.device,
        )  # (B|1, H|1, Tq|1, Tk) or None
        if not isinstance(prior, UniformPrior):
            log_prior = add_key_prior(prior, log_prior, q, k, q_pos, k_pos)
        return log_prior

    def reduce(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        log_prior: Tensor | None,
        key_padding_mask: Tensor | None,
        is_causal: bool = False,
    ) -> tuple[K.ReducedSupport, Tensor]:
        logits = BF.attention_logits(q, k)  # (…, B, H, Tq, Tk)
        return K.ReducedSupport(logits, log_prior, None, k.shape[-2], "dense"), v

    def posterior_weights(self, support: K.ReducedSupport) -> Tensor:
        logits, log_prior = support.logits, support.log_prior
        if log_prior is None and not torch.is_grad_enabled():
            # inference: softmax in place over the fresh scores; skipping a new (B,H,Tq,Tk)
            # allocation (page faults) is most of the cost of returning weights at large T
            return torch._softmax(logits, -1, False, out=logits)
        return BF.posterior_weights(logits, log_prior)

    def mean_output(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        log_prior: Tensor | None,
        key_padding_mask: Tensor | None,
        dropout_p: float,
    ) -> Tensor:
        return fused_attention(q, k, v, log_prior, dropout_p)


#: the dense support every layer without ``support=`` reads through (it holds no state)
DENSE = DenseSupport()
