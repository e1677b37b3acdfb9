"""Argument checks and seeded generators shared by the data modules."""

from __future__ import annotations

import numbers
from typing import Any

import torch
from torch import Tensor


def _check_int(name: str, value: Any, *, min_value: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    value = int(value)
    if min_value is not None and value < min_value:
        raise ValueError(f"{name} must be >= {min_value}, got {value}")
    return value


def _check_seed(seed: Any) -> int:
    return _check_int("seed", seed, min_value=0)


def _check_fraction(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a float, got {value!r} ({type(value).__name__})")
    value = float(value)
    if not 0.0 <= value < 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {value}")
    return value


def _check_tensor(name: str, value: Any, ndim: int) -> Tensor:
    if not isinstance(value, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if value.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dims, got shape {tuple(value.shape)}")
    return value


def _torch_generator(seed: int) -> torch.Generator:
    return torch.Generator(device="cpu").manual_seed(seed)
