r"""Linformer attention: keys and values projected along the sequence to ``rank`` mixtures."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..._validation import check_int
from ...functional import supports as K
from .base import AttentionSupport, bool_padding

__all__ = ["LowRankSupport"]


def _hard_padding(key_padding_mask: Tensor | None) -> Tensor | None:
    """A float key padding mask of ``0`` (keep) and ``-inf`` (padded) as bool, as the other
    supports accept it; soft float values cannot be applied to mixtures of keys."""
    if key_padding_mask is None:
        return None
    return bool_padding(key_padding_mask, "support='lowrank' (its slots are mixtures of keys)")


def _all_padded(key_padding_mask: Tensor | None, k: Tensor) -> Tensor | None:
    """``(B, 1, 1, 1)`` bool: sequences whose every key is padded (their rows read nothing, as
    in dense attention), or ``None`` when there are none. With ``Tk = 0`` every row is dead."""
    if k.shape[-2] == 0:
        return torch.ones((1,) * 4, dtype=torch.bool, device=k.device)
    if key_padding_mask is None:
        return None
    dead = bool_padding(key_padding_mask).all(-1)  # (B,)
    return dead.view(-1, 1, 1, 1) if bool(dead.any()) else None


class LowRankSupport(AttentionSupport):
    r"""Linformer attention: keys and values projected along the sequence to ``rank`` mixtures,
    :math:`\tilde K = E K`, :math:`\tilde V = F V`, with learned :math:`E, F\in\mathbb R^{r\times
    n}` (``n = max_len``, shared by the heads; a sequence of ``T <= n`` keys uses the first ``T``
    columns). Initialised like Linformer's ``nn.Linear(max_len, rank)``: uniform on
    :math:`\pm 1/\sqrt{n}`."""

    name = "lowrank"
    supports_masks = False
    supports_causal = False

    def __init__(self, rank: int = 64, max_len: int = 4096) -> None:
        super().__init__()
        self.rank = check_int("rank", rank, 1)
        self.max_len = check_int("max_len", max_len, 1)
        bound = 1.0 / math.sqrt(max_len)  # nn.Linear(max_len, rank)'s default bound
        self.proj_k = nn.Parameter(torch.empty(rank, max_len).uniform_(-bound, bound))
        self.proj_v = nn.Parameter(torch.empty(rank, max_len).uniform_(-bound, bound))

    def reduce(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        log_prior: K.ChunkLogPrior | None,
        key_padding_mask: Tensor | None,
        is_causal: bool = False,
    ) -> tuple[K.ReducedSupport, Tensor]:
        key_padding_mask = _hard_padding(key_padding_mask)
        k_r, v_r = K.lowrank_project(k, v, self.proj_k, self.proj_v, key_padding_mask)
        return K.lowrank_support(q, k_r, dead=_all_padded(key_padding_mask, k)), v_r

    def mean_output(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        log_prior: K.ChunkLogPrior | None,
        key_padding_mask: Tensor | None,
        dropout_p: float,
    ) -> Tensor:
        key_padding_mask = _hard_padding(key_padding_mask)
        k_r, v_r = K.lowrank_project(k, v, self.proj_k, self.proj_v, key_padding_mask)
        out = F.scaled_dot_product_attention(q, k_r, v_r, dropout_p=dropout_p)
        dead = _all_padded(key_padding_mask, k)
        return out if dead is None else out.masked_fill(dead, 0.0)

    def extra_repr(self) -> str:
        return f"rank={self.rank}, max_len={self.max_len}"
