r"""What every key support shares: the interface a layer's read calls, and the log-prior it takes.

A *support* is the set of key slots a query scores (the glossary's word): every key (dense), a
band, the top ``k``, the keys of the nearest clusters, low-rank mixtures of keys. A support never
sees the layer: the read (:class:`bayesattn.nn.read.AttentionRead`) hands it the per-head
``q, k, v``, the log-prior and, for draws, a :data:`Drawer` — a function
``draw(logits, log_prior, q, k) -> weights`` bound to the layer's family, mode and Pyro sites.

Shape glossary: ``S`` samples (leftmost), ``B`` batch, ``H`` heads, ``Tq``/``Tk`` query/key
length, ``K`` slots on the support, ``Dh`` head dim.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from ..._validation import MaskDTypeError
from ...functional import supports as K
from ...priors import KeyRelevancePrior, UniformPrior, add_key_prior

__all__ = [
    "AttentionSupport",
    "Drawer",
    "LogPrior",
    "bool_padding",
]

#: ``draw(logits, log_prior, q, k) -> weights``: one draw of a family's weights on a support,
#: ``(…, B, H, Tq, K)`` → ``(*S, …, B, H, Tq, K)`` (:meth:`bayesattn.nn.read.AttentionRead.draw`).
Drawer = Callable[[Tensor, "Tensor | None", Tensor, Tensor], Tensor]
#: what a support takes as its log-prior: a full tensor (dense) or chunk by chunk (reduced)
LogPrior = Any


class AttentionSupport(nn.Module):
    """Base class: how a layer scores queries against a (reduced) key support.

    Subclasses implement :meth:`reduce`; :meth:`mean_output` and :meth:`sample_output` are
    optional faster paths that return ``None`` to fall back on the whole support."""

    name = "support"
    supports_masks = True  # attn_mask, is_causal and key-relevance priors
    supports_causal = True  # is_causal (when supports_masks is False)

    def reduce(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        log_prior: LogPrior,
        key_padding_mask: Tensor | None,
        is_causal: bool = False,
    ) -> tuple[K.ReducedSupport, Tensor]:
        """``(support, values to read)``: each query's slots and their scores."""
        raise NotImplementedError

    def posterior_weights(self, support: K.ReducedSupport) -> Tensor:
        r"""The exact posterior on the support, :math:`\operatorname{softmax}(\log\pi + \ell)`."""
        return support.posterior_weights()

    def mean_output(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        log_prior: LogPrior,
        key_padding_mask: Tensor | None,
        dropout_p: float,
    ) -> Tensor | None:
        """Posterior-mean output without weights (a faster path), or ``None`` to use the
        support."""
        return None

    def sample_output(
        self,
        draw: Drawer,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        log_prior: LogPrior,
        dropout_p: float,
    ) -> Tensor | None:
        """Output of posterior draws without returning weights (a leaner path), or ``None`` to
        draw on the whole support."""
        return None

    def check_options(
        self,
        *,
        attn_mask: Tensor | None,
        is_causal: bool,
        prior: KeyRelevancePrior,
        extra_key: bool,
    ) -> None:
        """``ValueError`` for what this support cannot express: an appended key (``add_bias_kv``/
        ``add_zero_attn``), and, without :attr:`supports_masks`, masks and priors."""
        if extra_key:
            raise ValueError(
                f"support={self.name!r} does not support add_bias_kv or add_zero_attn (they "
                "append a key outside the sequence)"
            )
        if self.supports_masks:
            return
        bad = []
        if attn_mask is not None:
            bad.append("attn_mask")
        if is_causal and not self.supports_causal:
            bad.append("is_causal")
        if not isinstance(prior, UniformPrior):
            bad.append(f"prior={type(prior).__name__}")
        if bad:
            why = (
                "its slots are mixtures of keys"
                if not self.supports_causal
                else "its candidates are found per key, not per (query, key) pair"
            )
            raise ValueError(
                f"support={self.name!r} takes only a key_padding_mask"
                f"{'' if not self.supports_causal else ' and is_causal'}: {why}, so "
                f"{', '.join(bad)} cannot be applied"
            )

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
    ) -> LogPrior:
        """:math:`\\log\\pi` built chunk by chunk (:func:`~bayesattn.functional.supports.chunk_log_prior`):
        the masks plus the key-relevance prior, evaluated only on the slots a chunk scores
        (``None`` for a support that takes no masks).

        Shape:
            q ``(…, B, H, Tq, Dh)``, k ``(…, B, H, Tk, Dh)``.
        """
        if not self.supports_masks:
            return None
        B, H, Tq, Tk = q.shape[-4], q.shape[-3], q.shape[-2], k.shape[-2]
        prior_fn = None
        if not isinstance(prior, UniformPrior):
            qp = q_pos if q_pos is not None else torch.arange(Tq, device=q.device)
            kp = k_pos if k_pos is not None else torch.arange(Tk, device=q.device)

            def prior_fn(s: int, e: int, kidx: Tensor) -> Tensor:
                return add_key_prior(
                    prior, None, q[..., s:e, :], k.index_select(-2, kidx), qp[s:e], kp[kidx]
                )

        return K.chunk_log_prior(
            attn_mask,
            key_padding_mask,
            is_causal,
            prior_fn,
            batch_size=B,
            num_heads=H,
            tgt_len=Tq,
            src_len=Tk,
            dtype=q.dtype,
            device=q.device,
        )


def bool_padding(key_padding_mask: Tensor, support: str = "this support") -> Tensor:
    """A key padding mask as bool ``True`` = padded: a float mask of ``0`` (keep) and ``-inf``
    (padded) as the dense supports take it; a soft float bias (which a support that does not
    score every key cannot apply) or another dtype is refused naming ``support``."""
    if key_padding_mask.dtype == torch.bool:
        return key_padding_mask
    if not key_padding_mask.is_floating_point():
        raise MaskDTypeError(
            f"key_padding_mask must be bool or float (0 keep, -inf padded); got "
            f"{key_padding_mask.dtype}"
        )
    pad = key_padding_mask == float("-inf")
    if key_padding_mask.device.type != "meta" and not bool(((key_padding_mask == 0) | pad).all()):
        raise ValueError(
            f"{support} takes a float key_padding_mask of 0 (keep) and -inf (padded) only: "
            "it does not score every key, so soft per-key biases cannot be applied; got values "
            "other than 0 and -inf (use a bool mask, True = padded)"
        )
    return pad
