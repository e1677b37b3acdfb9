r"""``linear``: ``x @ weight.T + bias`` for weights with leading sample dims (sampled
projection weights, a trunk mixture's draws), which ``F.linear`` does not broadcast."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["linear", "in_projections"]


def linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """``x @ weight.T + bias`` that also broadcasts *sampled* weights with leading sample dims.

    ``x`` is read as a stack of ``(T, In)`` matrices with batch dims ``(*S, B)``. A sampled
    weight's batch dims are those of Pyro plates: ``(P, 1)`` (particle plate, data plate) lines up
    with ``(P, B)`` by broadcasting; a weight with fewer batch dims than ``x`` (e.g. ``(S,)`` from a
    sample plate) is aligned from the left (``S`` with ``S``). ``F.linear`` cannot do this: it
    needs a 2-D weight.

    Shape:
        x ``(*S, B, T, In)``, weight ``(Out, In)`` or ``(*S', Out, In)``, bias ``(Out,)`` or
        ``(*S', Out)``; output ``(*S, B, T, Out)``.
    """
    if weight.dim() == 2 and (bias is None or bias.dim() == 1):
        return F.linear(x, weight, bias)
    nb = x.dim() - 2  # batch dims of x as a stack of (T, In) matrices
    if weight.dim() == 3 and x.dim() == 4 and weight.shape[0] == x.shape[0] > 1:
        # one weight per sample: a batched GEMM (S, B·T, In) @ (S, In, Out), about 10x faster
        # on CPU than matmul broadcasting (S, B, T, In) against (S, 1, In, Out)
        S, B, T, In = x.shape
        x3, wt = x.reshape(S, B * T, In), weight.transpose(-1, -2)
        if bias is not None and bias.dim() == 1:  # the bias in the same kernel
            return torch.baddbmm(bias.to(x.dtype), x3, wt).reshape(S, B, T, -1)
        out = torch.bmm(x3, wt).reshape(S, B, T, -1)
    else:
        w = weight.reshape(weight.shape[:-2] + (1,) * (nb - (weight.dim() - 2)) + weight.shape[-2:])
        out = torch.matmul(x, w.transpose(-1, -2))  # (*S, B, T, Out)
    if bias is not None:
        out = out + bias.reshape(bias.shape[:-1] + (1,) * (nb + 2 - bias.dim()) + bias.shape[-1:])
    return out


def in_projections(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    weights: tuple[Tensor, Tensor, Tensor],
    bias: Tensor | None,
    packed: Tensor | None,
    self_attn: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """Multi-head attention's input projections ``q, k, v`` (torch's ``in_proj``), for weights
    and a packed bias ``(3E,)`` that may carry leading sample dims.

    ``weights``: ``(W_q, W_k, W_v)``; ``packed``: the packed ``(3E, E)`` weight when there is one
    (self-attention then runs one matmul). As torch's fused kernel, the bias follows the weights'
    dtype.

    Shape:
        query ``(…, B, Tq, E)``, key/value ``(…, B, Tk, kdim/vdim)`` → ``(…, B, T, E)`` each.
    """
    wq, wk, wv = weights
    E = wq.shape[-2]
    b = bias
    bq, bk, bv = (None, None, None) if b is None else (b[:E], b[E : 2 * E], b[2 * E :])
    if b is not None and b.dtype != wq.dtype:  # as torch's fused kernel: bias follows weights
        b = b.to(wq.dtype)
        bq, bk, bv = b[:E], b[E : 2 * E], b[2 * E :]
    if b is not None and b.dim() > 1:  # sampled biases (*S, 3E)
        bq, bk, bv = b[..., :E], b[..., E : 2 * E], b[..., 2 * E :]
    if packed is not None and self_attn and packed.dim() == 2 and (b is None or b.dim() == 1):
        q, k, v = F.linear(query, packed, b).chunk(3, dim=-1)  # one matmul for self-attention
        return q, k, v
    return linear(query, wq, bq), linear(key, wk, bk), linear(value, wv, bv)
