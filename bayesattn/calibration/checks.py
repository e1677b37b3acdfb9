"""Input validation shared by the metrics of :mod:`bayesattn.calibration`: conversion to float64
tensors and checks of ``probs``/``labels``, ``uncertainty``/``correct`` (the conventions are in
the package docstring)."""

from __future__ import annotations

from typing import Any, Literal, get_args

import numpy as np
import torch
from torch import Tensor

Strategy = Literal["uniform", "quantile"]
_STRATEGIES: tuple[Strategy, ...] = get_args(Strategy)
_ROW_SUM_TOL = 1e-3
F64 = torch.float64


def to_tensor(x: Any, name: str) -> Tensor:
    """Convert ``x`` to a tensor (no copy for tensors), raising TypeError naming ``name``."""
    if isinstance(x, Tensor):
        t = x.detach()
    else:
        try:
            # Via NumPy so Python float sequences become float64 (torch would pick float32).
            t = torch.as_tensor(np.asarray(x))
        except (TypeError, ValueError, RuntimeError) as exc:
            raise TypeError(
                f"{name} must be a torch.Tensor or array-like of numbers, got "
                f"{type(x).__name__} ({exc})"
            ) from exc
    if t.is_complex():
        raise TypeError(f"{name} must be real-valued, got dtype {t.dtype}")
    return t


def to_float64(x: Any, name: str) -> Tensor:
    t = to_tensor(x, name).to(device="cpu", dtype=F64)
    if not bool(torch.isfinite(t).all()):
        raise ValueError(f"{name} contains NaN or Inf values (shape {tuple(t.shape)})")
    return t


def check_probs(probs: Any, name: str = "probs") -> Tensor:
    t = to_tensor(probs, name)
    if t.dim() != 2:
        raise ValueError(f"{name} must be 2-D with shape (N, C), got shape {tuple(t.shape)}")
    n, c = t.shape
    if n == 0 or c == 0:
        raise ValueError(f"{name} must be non-empty with shape (N, C), got shape {tuple(t.shape)}")
    t = to_float64(t, name)
    if bool((t < 0).any()):
        raise ValueError(
            f"{name} must be non-negative, got minimum {t.min().item():.4g} "
            f"(shape {tuple(t.shape)})"
        )
    dev = (t.sum(dim=1) - 1.0).abs()
    if bool((dev > _ROW_SUM_TOL).any()):
        row = int(dev.argmax())
        raise ValueError(
            f"{name} rows must sum to 1 within {_ROW_SUM_TOL:g} (shape {tuple(t.shape)}); "
            f"row {row} sums to {t[row].sum().item():.6g}"
        )
    return t


def check_labels(labels: Any, n: int, c: int, name: str = "labels") -> Tensor:
    t = to_tensor(labels, name)
    if t.dtype == torch.bool or t.dtype.is_floating_point:
        raise TypeError(
            f"{name} must have an integer dtype, got {t.dtype} (shape {tuple(t.shape)})"
        )
    if t.dim() != 1 or t.shape[0] != n:
        raise ValueError(
            f"{name} must have shape ({n},) to match probs of shape ({n}, {c}), "
            f"got shape {tuple(t.shape)}"
        )
    t = t.to(device="cpu", dtype=torch.long)
    if bool(((t < 0) | (t >= c)).any()):
        raise ValueError(
            f"{name} must lie in [0, {c}) for probs with C={c} classes, got values in "
            f"[{int(t.min())}, {int(t.max())}] (shape {tuple(t.shape)})"
        )
    return t


def check_probs_labels(probs: Any, labels: Any) -> tuple[Tensor, Tensor]:
    """``probs`` ``(N, C)`` rows on the simplex and integer ``labels`` ``(N,)`` in ``[0, C)``,
    as float64 / int64 tensors; ``ValueError``/``TypeError`` naming the argument otherwise."""
    p = check_probs(probs)
    y = check_labels(labels, p.shape[0], p.shape[1])
    return p, y


def check_strategy(strategy: Any) -> Strategy:
    if strategy not in _STRATEGIES:
        raise ValueError(f"strategy must be one of {_STRATEGIES}, got {strategy!r}")
    return strategy


def _check_1d(x: Any, name: str) -> Tensor:
    """Finite, non-empty, 1-D float64 tensor."""
    t = to_tensor(x, name)
    if t.dim() != 1:
        raise ValueError(f"{name} must be 1-D with shape (N,), got shape {tuple(t.shape)}")
    if t.shape[0] == 0:
        raise ValueError(f"{name} must be non-empty, got shape {tuple(t.shape)}")
    return to_float64(t, name)


def check_uncertainty_correct(uncertainty: Any, correct: Any) -> tuple[Tensor, Tensor]:
    u = _check_1d(uncertainty, "uncertainty")
    k = to_tensor(correct, "correct")
    if k.shape != u.shape:
        raise ValueError(
            f"correct must have the same shape as uncertainty {tuple(u.shape)}, "
            f"got shape {tuple(k.shape)}"
        )
    if k.dtype != torch.bool:
        kf = k.to(device="cpu", dtype=F64)
        if not bool(((kf == 0) | (kf == 1)).all()):
            raise ValueError(
                f"correct must be boolean or contain only 0/1 values (shape {tuple(k.shape)})"
            )
        k = kf == 1
    return u, k.to("cpu")
