r"""Reading the values for weights on a support, :math:`y_i = \sum_m w_{im}\, v_{j(i, m)}`, with
any leading sample dims: block by block (local), gathered per query chunk (top-k), one matmul
(dense, low rank), never as a ``(Tq, Tk)`` matrix.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .base import gather_attend
from .local import local_attend
from .results import ReducedSupport

__all__ = ["support_attend", "sample_matmul", "FOLD_ROWS"]


def _cpu_autocast() -> bool:
    """Whether CPU autocast is on (``torch.is_autocast_enabled("cpu")``, torch >= 2.4)."""
    try:
        return torch.is_autocast_enabled("cpu")
    except TypeError:  # pragma: no cover - torch < 2.4
        return torch.is_autocast_cpu_enabled()


#: below this many query rows the sample dims are folded into the rows (one GEMM of ``S·Tq``
#: rows per shared ``v``); above it, on the CPU, one batched GEMM per sample into one buffer
FOLD_ROWS = 8


def sample_matmul(weights: Tensor, v: Tensor) -> Tensor:
    r"""``weights @ v`` for weights with more leading (sample) dims than ``v``, without
    ``torch.matmul``'s copy of ``v`` per sample: equal to ``torch.matmul`` bit for bit (every
    output row is the same dot product, only the batching of the GEMMs changes).

    * fewer than :data:`FOLD_ROWS` query rows: the sample dims are folded into the rows,
      :math:`(\ldots, S\cdot T_q, K) @ (\ldots, K, D)`, instead of ``S·…`` GEMMs of one row;
    * otherwise, on the CPU without autograd: one batched GEMM per sample written into one
      output buffer (no copy of the weights either);
    * anything else (and ``v`` with sample dims of its own): ``torch.matmul``.

    Shape:
        weights ``(*S, …, Tq, K)``, v ``(…, K, D)`` → ``(*S, …, Tq, D)``.
    """
    extra = weights.dim() - v.dim()
    if extra <= 0 or v.dim() < 2 or weights.shape[extra:-2] != v.shape[:-2]:
        return torch.matmul(weights, v)
    lead, (Tq, K) = weights.shape[:extra], weights.shape[-2:]
    if Tq < FOLD_ROWS:
        # (*S, …, Tq, K) → (…, *S, Tq, K) → (…, S·Tq, K)
        w = weights.movedim(tuple(range(extra)), tuple(range(-extra - 2, -2)))
        out = torch.matmul(w.reshape(v.shape[:-2] + (-1, K)), v)  # (…, S·Tq, D)
        out = out.reshape(v.shape[:-2] + lead + (Tq, v.shape[-1]))  # (…, *S, Tq, D)
        return out.movedim(tuple(range(-extra - 2, -2)), tuple(range(extra)))  # (*S, …, Tq, D)
    grad = torch.is_grad_enabled() and (weights.requires_grad or v.requires_grad)
    if grad or weights.device.type != "cpu" or _cpu_autocast():  # out= is outside autocast
        return torch.matmul(weights, v)
    w = weights.reshape((-1,) + weights.shape[extra:])  # (S', …, Tq, K)
    out = w.new_empty(w.shape[:-1] + v.shape[-1:])  # (S', …, Tq, D)
    for s in range(w.shape[0]):
        torch.matmul(w[s], v, out=out[s])
    return out.reshape(lead + out.shape[1:])


def support_attend(
    weights: Tensor,
    support: ReducedSupport,
    v: Tensor,
    *,
    chunk_size: int | None = None,
    global_weights: Tensor | None = None,
) -> Tensor:
    r"""Posterior read :math:`y_i = \sum_{m} w_{im}\, v_{j(i, m)}` for weights on a support.

    ``v`` are the values (for low rank: the projected values :math:`FV`, ``(…, r, Dv)``).
    ``weights`` may carry leading sample dims ``(*S, …, Tq, K)``. Values are read block by
    block (local) or gathered per query chunk (top-k), never as a ``(Tq, Tk)`` matrix. For a
    local + global support the global queries' rows read ``global_weights`` ``(*S, …, Gq, Tk)``
    (default: the exact posterior of ``support.global_support``).

    Shape:
        weights ``(*S, …, Tq, K)``, v ``(…, Tk, Dv)`` → ``(*S, …, Tq, Dv)``.
    """
    if weights.shape[-1] != support.size:
        raise ValueError(
            f"weights last dim must be the support size {support.size}; got {tuple(weights.shape)}"
        )
    if support.name == "lowrank" or support.index is None:
        return sample_matmul(weights, v)
    if v.shape[-2] != support.num_keys:
        raise ValueError(f"v must have Tk={support.num_keys} rows; got shape {tuple(v.shape)}")
    if weights.shape[-2] == 0:
        return weights.new_zeros(weights.shape[:-1] + (v.shape[-1],))  # no query rows
    if support.name == "dense":
        return sample_matmul(weights, v)
    if support.name in ("local", "local_global"):
        if support.window is None:
            raise ValueError(f"a {support.name!r} support needs its window; got window=None")
        Kb = 2 * support.window + 1
        out = local_attend(weights[..., :Kb], v, support.window, chunk_size)
        if support.global_keys is not None:
            vg = v.index_select(-2, support.global_keys)  # (…, G, Dv)
            out = out + torch.matmul(weights[..., Kb:], vg)
        return _global_rows_read(out, support, v, global_weights)
    return gather_attend(weights, support.index, v, chunk_size or 256)


def _global_rows_read(
    out: Tensor, support: ReducedSupport, v: Tensor, global_weights: Tensor | None
) -> Tensor:
    """Write the dense read of the global queries' rows into ``out`` ``(*S, …, Tq, Dv)``."""
    g, rows = support.global_support, support.global_rows
    if g is None or rows is None:
        return out
    gw = global_weights if global_weights is not None else g.posterior_weights()
    read = torch.matmul(gw, v)  # (*S, …, Gq, Dv)
    lead = torch.broadcast_shapes(out.shape[:-2], read.shape[:-2])
    out = out.expand(lead + out.shape[-2:])
    return out.index_copy(-2, rows, read.expand(lead + read.shape[-2:]))
