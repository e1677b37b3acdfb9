r"""Pure tensor maths of attention read as Bayesian inference.

For query :math:`q_i` and keys :math:`k_1..k_{T_k}`, let :math:`z_i` be the key the query reads.

.. math::

    \text{prior}\quad p(z_i = j) = \pi_{ij}, \qquad
    \text{likelihood}\quad p(q_i \mid z_i = j) \propto \exp(q_i \cdot k_j / \sqrt{d}),

    \text{posterior}\quad p(z_i = j \mid q_i) = \operatorname{softmax}_j(\log\pi_{ij} + q_i\cdot k_j/\sqrt{d}),
    \qquad y_i = \sum_j p(z_i = j \mid q_i)\, v_j .

Every PyTorch mask is a log-prior: ``True`` in a boolean ``attn_mask``/``key_padding_mask`` (and the
future under ``is_causal``) is :math:`\log \pi = -\infty`; a float mask is added to the logits.

**Rows with no allowed key.** If every key of a query is masked the posterior is undefined; we return
**zero weights and a zero output** for that row (no NaN, zero gradient), and document it everywhere.

Dimension glossary: ``S`` posterior samples (leftmost), ``B`` batch, ``H`` heads, ``Tq`` queries,
``Tk`` keys, ``Dh`` head dim, ``E`` embedding dim.
"""

from __future__ import annotations

import math

import torch
from pyro.infer.util import is_validation_enabled
from torch import Tensor

from .._validation import (
    MaskDTypeError,
    ShapeAssertionError,
    ShapeRuntimeError,
    assert_in_graph,
    check_finite,
    check_float_tensor,
    check_int,
    check_no_nan,
    check_real,
    check_simplex,
    check_tensor,
    tracing,
)

__all__ = [
    "attention_logits",
    "causal_log_prior",
    "mask_to_log_prior",
    "posterior_logits",
    "posterior_weights",
    "log_posterior_weights",
    "allowed_keys",
    "attend",
    "attention",
    "check_finite",
    "entropy",
    "uncertainty_decomposition",
]


def entropy(probs: Tensor, dim: int = -1) -> Tensor:
    r"""Shannon entropy :math:`H[p] = -\sum_c p_c \log p_c` in nats, with :math:`0\log 0 = 0`.

    Shape:
        ``(..., C)`` → ``(...)`` (``dim`` removed).
    """
    if not isinstance(probs, Tensor):
        raise TypeError(f"probs must be a torch.Tensor; got {type(probs).__name__}")
    if not probs.is_floating_point():
        raise TypeError(f"probs must be a floating-point tensor; got dtype {probs.dtype}")
    if is_validation_enabled() and probs.numel() and not bool(probs.min() >= 0):
        raise ValueError(
            f"probs must be non-negative and not NaN; got min {float(probs.min())} in a tensor of "
            f"shape {tuple(probs.shape)}"
        )
    return -torch.special.xlogy(probs, probs).sum(dim)


def uncertainty_decomposition(probs: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    r"""Split the predictive entropy of ``S`` samples into aleatoric and epistemic parts:
    :math:`H[\bar p] = \frac1S\sum_s H[p_s] + I`, with :math:`\bar p = \frac1S\sum_s p_s`.

    Returns ``(total H[p̄], expected entropy, mutual information I ≥ 0)``, computed in float64
    and returned in ``probs``' dtype; ``I`` is clamped at 0 only to remove round-off.

    Shape:
        ``(S, ..., C)`` → three ``(...)`` tensors.
    """
    if not isinstance(probs, Tensor):
        raise TypeError(f"probs must be a torch.Tensor; got {type(probs).__name__}")
    if probs.dim() < 2:
        raise ValueError(f"probs must be (S, ..., C); got shape {tuple(probs.shape)}")
    if not probs.is_floating_point():
        raise TypeError(f"probs must be floating point; got dtype {probs.dtype}")
    check_simplex("probs", probs)
    p = probs.double()
    total = entropy(p.mean(0))
    expected = entropy(p).mean(0)
    mi = (total - expected).clamp_min(0.0)
    return total.to(probs.dtype), expected.to(probs.dtype), mi.to(probs.dtype)


def attention_logits(q: Tensor, k: Tensor, scale: float | None = None) -> Tensor:
    r"""Log-likelihood scores :math:`q\cdot k/\sqrt{d}` (or ``q·k * scale``).

    Shape:
        q: ``(..., Tq, D)``, k: ``(..., Tk, D)`` → ``(..., Tq, Tk)``; leading dims broadcast.
    """
    check_float_tensor("q", q, min_dim=2)
    check_float_tensor("k", k, min_dim=2)
    if q.dtype != k.dtype:
        raise TypeError(f"q and k must have the same dtype; got q {q.dtype}, k {k.dtype}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"q and k must share the last (feature) dim; got q {tuple(q.shape)}, k {tuple(k.shape)}"
        )
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    else:
        check_real("scale", scale, gt=0.0)
    # scale the (smaller) queries rather than the (Tq, Tk) scores, as torch does
    return torch.matmul(q * scale, k.transpose(-2, -1))  # (..., Tq, Tk)


def causal_log_prior(
    tgt_len: int,
    src_len: int,
    *,
    offset: int = 0,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> Tensor:
    r"""Causal log-prior: :math:`\log\pi_{ij} = 0` if :math:`j \le i + \text{offset}`, else :math:`-\infty`.

    ``offset=0`` is PyTorch's top-left alignment (``torch.ones(Tq, Tk).tril()``); for incremental
    decoding with a cache of past keys use ``offset = Tk - Tq`` (bottom-right alignment).

    Shape:
        ``(Tq, Tk)``
    """
    tgt_len = check_int("tgt_len", tgt_len, 0)
    src_len = check_int("src_len", src_len, 0)
    offset = check_int("offset", offset)
    i = torch.arange(tgt_len, device=device).unsqueeze(-1)  # (Tq, 1)
    j = torch.arange(src_len, device=device).unsqueeze(0)  # (1, Tk)
    future = j > i + offset  # (Tq, Tk)
    return torch.zeros(tgt_len, src_len, dtype=dtype, device=device).masked_fill(
        future, float("-inf")
    )


def _as_log_prior(mask: Tensor, name: str, dtype: torch.dtype) -> Tensor:
    check_tensor(name, mask)
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(
            mask, float("-inf")
        )
    if mask.is_floating_point():
        if tracing():  # no data-dependent branch in a compiled/exported graph
            assert_in_graph(
                ~(torch.isnan(mask) | (mask == float("inf"))).any(),
                f"{name} (float) must not contain NaN or +inf (use -inf to mask)",
            )
        elif torch.isnan(mask).any() or (mask == float("inf")).any():
            raise ValueError(
                f"{name} (float) must not contain NaN or +inf (use -inf to mask); "
                f"shape {tuple(mask.shape)}"
            )
        return mask.to(dtype)
    raise MaskDTypeError(f"{name} must be a bool or floating-point tensor; got dtype {mask.dtype}")


def mask_to_log_prior(
    attn_mask: Tensor | None = None,
    key_padding_mask: Tensor | None = None,
    is_causal: bool = False,
    *,
    batch_size: int,
    num_heads: int,
    tgt_len: int,
    src_len: int,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> Tensor | None:
    r"""Turn every PyTorch mask form into one additive log-prior :math:`\log\pi`.

    Args:
        attn_mask: bool (``True`` = not allowed) or float (added to the logits), of shape
            ``(Tq, Tk)``, ``(B*H, Tq, Tk)`` (PyTorch's 3-D form) or ``(B, H, Tq, Tk)`` (dims of
            size 1 broadcast).
        key_padding_mask: bool (``True`` = padding, ignored) or float, shape ``(B, Tk)``.
        is_causal: if ``attn_mask`` is None, add the causal log-prior (query ``i`` sees keys
            ``j <= i``). With an ``attn_mask`` it is only a hint, as in PyTorch.

    Returns:
        ``None`` when nothing is masked, else a tensor broadcastable to ``(B, H, Tq, Tk)``.
    """
    out: Tensor | None = None
    if attn_mask is not None:
        lp = _as_log_prior(attn_mask, "attn_mask", dtype)
        if lp.dim() == 2:
            if tuple(lp.shape) != (tgt_len, src_len):
                raise ShapeRuntimeError(  # torch: RuntimeError
                    f"attn_mask 2-D shape must be (Tq, Tk) = {(tgt_len, src_len)}; "
                    f"got {tuple(lp.shape)}"
                )
            out = lp.view(1, 1, tgt_len, src_len)  # (1, 1, Tq, Tk)
        elif lp.dim() == 3:
            want = (batch_size * num_heads, tgt_len, src_len)
            if tuple(lp.shape) != want:
                raise ShapeRuntimeError(
                    f"attn_mask 3-D shape must be (B*H, Tq, Tk) = {want}; got {tuple(lp.shape)}"
                )
            out = lp.view(batch_size, num_heads, tgt_len, src_len)  # (B, H, Tq, Tk)
        elif lp.dim() == 4:
            full = (batch_size, num_heads, tgt_len, src_len)
            if any(s not in (1, f) for s, f in zip(lp.shape, full, strict=True)):
                raise ShapeRuntimeError(
                    f"attn_mask 4-D shape must broadcast to (B, H, Tq, Tk) = {full}; "
                    f"got {tuple(lp.shape)}"
                )
            out = lp
        else:
            raise ShapeAssertionError(  # torch: AssertionError
                f"attn_mask must be 2-D (Tq, Tk), 3-D (B*H, Tq, Tk) or 4-D (B, H, Tq, Tk); "
                f"got shape {tuple(lp.shape)}"
            )
    elif is_causal:
        out = causal_log_prior(tgt_len, src_len, dtype=dtype, device=device).view(
            1, 1, tgt_len, src_len
        )
    if key_padding_mask is not None:
        kp = _as_log_prior(key_padding_mask, "key_padding_mask", dtype)
        if tuple(kp.shape) != (batch_size, src_len):
            raise ShapeAssertionError(  # torch: AssertionError
                f"key_padding_mask shape must be (B, Tk) = {(batch_size, src_len)}; "
                f"got {tuple(kp.shape)}"
            )
        kp = kp.view(batch_size, 1, 1, src_len)  # (B, 1, 1, Tk)
        out = kp if out is None else out + kp
    return out


def posterior_logits(logits: Tensor, log_prior: Tensor | None = None) -> Tensor:
    r"""Unnormalised log-posterior :math:`\log\pi_{ij} + q_i\cdot k_j/\sqrt d`."""
    return logits if log_prior is None else logits + log_prior


def allowed_keys(logits: Tensor) -> Tensor:
    """Bool tensor, ``True`` where a key has non-zero prior mass (finite logit)."""
    return logits > float("-inf")


def log_posterior_weights(logits: Tensor, log_prior: Tensor | None = None) -> Tensor:
    r"""Normalised log-posterior :math:`\log p(z=j\mid q)`; rows with no allowed key are all ``-inf``.

    Shape:
        ``(..., Tq, Tk)``
    """
    _check_logits(logits, log_prior)
    if log_prior is None:
        return torch.log_softmax(logits, dim=-1)
    a = posterior_logits(logits, log_prior)
    dead = ~allowed_keys(a).any(-1, keepdim=True)  # (..., Tq, 1)
    out = torch.log_softmax(a.masked_fill(dead, 0.0), dim=-1)
    return out.masked_fill(dead, float("-inf"))


def _check_logits(logits: Tensor, log_prior: Tensor | None) -> None:
    check_float_tensor("logits", logits, min_dim=1)
    if log_prior is not None:
        check_float_tensor("log_prior", log_prior)
    if is_validation_enabled():
        check_no_nan("logits", logits)
        if log_prior is not None:
            check_no_nan("log_prior", log_prior)


def posterior_weights(logits: Tensor, log_prior: Tensor | None = None) -> Tensor:
    r"""Exact posterior :math:`p(z=j\mid q) = \operatorname{softmax}_j(\log\pi_j + q\cdot k_j/\sqrt d)`.

    A row whose keys are all masked gets zero weights (and zero gradient), never NaN.

    Shape:
        ``(..., Tq, Tk)``

    Example:
        >>> w = posterior_weights(torch.zeros(1, 3), torch.tensor([[0.0, 0.0, float("-inf")]]))
        >>> w
        tensor([[0.5000, 0.5000, 0.0000]])
    """
    _check_logits(logits, log_prior)
    if log_prior is None:  # nothing masked (logits are finite): plain softmax
        return torch.softmax(logits, dim=-1)
    a = posterior_logits(logits, log_prior)
    dead = ~allowed_keys(a).any(-1, keepdim=True)  # (..., Tq, 1)
    w = torch.softmax(a.masked_fill(dead, 0.0), dim=-1)
    return w.masked_fill(dead, 0.0)


def attend(weights: Tensor, v: Tensor) -> Tensor:
    r"""Posterior mean of the value read: :math:`y_i = \sum_j w_{ij} v_j`.

    Shape:
        weights ``(..., Tq, Tk)``, v ``(..., Tk, Dv)`` → ``(..., Tq, Dv)``; leading dims (e.g. a
        sample dim ``S`` on the weights) broadcast.
    """
    check_float_tensor("weights", weights, min_dim=1)
    check_float_tensor("v", v, min_dim=2)
    if weights.dtype != v.dtype:
        raise TypeError(
            f"weights and v must have the same dtype; got weights {weights.dtype}, v {v.dtype}"
        )
    if weights.shape[-1] != v.shape[-2]:
        raise ValueError(
            f"weights last dim (Tk) must equal v's key dim; got weights {tuple(weights.shape)}, "
            f"v {tuple(v.shape)}"
        )
    return torch.matmul(weights, v)


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    log_prior: Tensor | None = None,
    *,
    scale: float | None = None,
    dropout_p: float = 0.0,
    training: bool = False,
) -> tuple[Tensor, Tensor]:
    r"""Scaled dot-product attention as the posterior mean under the prior ``log_prior``.

    Returns ``(output, weights)``; ``weights`` are the exact posterior before dropout.

    Shape:
        q ``(..., Tq, D)``, k ``(..., Tk, D)``, v ``(..., Tk, Dv)``, log_prior broadcastable to
        ``(..., Tq, Tk)`` → output ``(..., Tq, Dv)``, weights ``(..., Tq, Tk)``.
    """
    check_real("dropout_p", dropout_p, ge=0.0, lt=1.0)
    w = posterior_weights(attention_logits(q, k, scale), log_prior)  # (..., Tq, Tk)
    w_drop = torch.nn.functional.dropout(w, dropout_p, training) if dropout_p > 0 else w
    return attend(w_drop, v), w
