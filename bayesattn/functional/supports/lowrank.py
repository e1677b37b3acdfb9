r"""Low-rank (Linformer, Wang et al., 2020) attention: keys and values are projected along the
sequence, :math:`\tilde K = E K`, :math:`\tilde V = F V` with learned :math:`E, F \in \mathbb
R^{r\times T}`, and every query reads a posterior over the :math:`r` mixed keys;
:math:`O(T\cdot r)`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .base import NEG_INF, check_qkv, resolve_scale
from .results import ReducedSupport

__all__ = ["lowrank_project", "lowrank_support"]


def lowrank_project(
    k: Tensor,
    v: Tensor,
    proj_k: Tensor,
    proj_v: Tensor,
    key_padding_mask: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    r"""Project keys and values along the sequence: :math:`\tilde K = E_{:, :T_k} K`,
    :math:`\tilde V = F_{:, :T_k} V` (Linformer). Padded keys (``key_padding_mask`` ``True``,
    shape ``(B, Tk)``) are zeroed first so they contribute nothing.

    Shape:
        k ``(…, B, H, Tk, D)``, v ``(…, B, H, Tk, Dv)``, proj_k/proj_v ``(r, max_len)`` →
        ``(…, B, H, r, D)``, ``(…, B, H, r, Dv)``.
    """
    check_qkv(k, k, v)
    Tk = k.shape[-2]
    for name, p in (("proj_k", proj_k), ("proj_v", proj_v)):
        if p.dim() != 2:
            raise ValueError(f"{name} must be (rank, max_len); got {tuple(p.shape)}")
        if p.shape[-1] < Tk:
            raise ValueError(
                f"the low-rank kernel was built for sequences of at most {p.shape[-1]} keys "
                f"(max_len); got Tk={Tk}"
            )
    if key_padding_mask is not None:
        if key_padding_mask.dtype != torch.bool:
            raise TypeError(
                f"key_padding_mask must be bool for the low-rank kernel; got {key_padding_mask.dtype}"
            )
        if key_padding_mask.dim() != 2 or key_padding_mask.shape[-1] != Tk:
            raise ValueError(
                f"key_padding_mask must be (B, Tk={Tk}); got {tuple(key_padding_mask.shape)}"
            )
        keep = (~key_padding_mask).to(k.dtype)[:, None, :, None]  # (B, 1, Tk, 1)
        k, v = k * keep, v * keep
    k_r = torch.matmul(proj_k[:, :Tk].to(k.dtype), k)  # (…, r, D)
    v_r = torch.matmul(proj_v[:, :Tk].to(v.dtype), v)  # (…, r, Dv)
    return k_r, v_r


def lowrank_support(
    q: Tensor, k_r: Tensor, *, scale: float | None = None, dead: Tensor | None = None
) -> ReducedSupport:
    r"""Scores of every query on the ``r`` projected keys, :math:`q_i\cdot\tilde k_m/\sqrt d`
    (uniform prior over the mixtures; no key positions). ``dead`` (bool, broadcastable to
    ``(…, Tq, 1)``, e.g. ``(B, 1, 1, 1)``) marks rows with no key at all (a sequence whose every
    key is padded): their prior is ``-inf`` on every slot, so they read zeros, as in dense attention.

    Shape:
        q ``(…, Tq, D)``, k_r ``(…, r, D)`` → logits ``(…, Tq, r)``.
    """
    check_qkv(q, k_r)
    sc = resolve_scale(scale, q.shape[-1])
    logits = torch.matmul(q * sc, k_r.transpose(-1, -2))  # (…, Tq, r)
    lp = None
    if dead is not None:
        lp = torch.zeros(dead.shape, dtype=q.dtype, device=q.device).masked_fill(dead, NEG_INF)
    return ReducedSupport(logits, lp, None, k_r.shape[-2], "lowrank")
