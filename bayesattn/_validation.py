"""Shared argument checks: each raises ``TypeError`` (wrong kind of value) or ``ValueError`` (right
kind, bad value) naming the argument and what was expected. Also atomic file writes."""

from __future__ import annotations

import contextlib
import math
import numbers
import os
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

__all__ = [
    "ArgumentTypeError",
    "check_int",
    "check_real",
    "check_bool",
    "check_tensor",
    "check_float_tensor",
    "check_same_dtype",
    "check_no_nan",
    "atomic_write_bytes",
    "atomic_write_text",
]


class ArgumentTypeError(TypeError, ValueError):
    """An argument of the wrong type. Both a ``TypeError`` and a ``ValueError``: callers that
    catch the library's historical ``ValueError`` for a bad argument keep working."""


def _is_int(v: Any) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def check_int(name: str, v: Any, minimum: int | None = None, maximum: int | None = None) -> int:
    """``v`` as an ``int`` in ``[minimum, maximum]``; bools and floats (``2.0``) are refused."""
    if not _is_int(v):
        raise ArgumentTypeError(f"{name} must be an int; got {v!r} ({type(v).__name__})")
    v = int(v)
    if minimum is not None and v < minimum:
        what = {0: "a non-negative int", 1: "a positive int"}.get(minimum, f"an int >= {minimum}")
        raise ValueError(f"{name} must be {what}; got {v}")
    if maximum is not None and v > maximum:
        raise ValueError(f"{name} must be an int <= {maximum}; got {v}")
    return v


def check_real(
    name: str,
    v: Any,
    *,
    gt: float | None = None,
    ge: float | None = None,
    lt: float | None = None,
    le: float | None = None,
) -> float:
    """``v`` as a finite ``float`` within the given bounds."""
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise ArgumentTypeError(f"{name} must be a real number; got {v!r} ({type(v).__name__})")
    f = float(v)
    bounds = []
    ok = math.isfinite(f)
    if gt is not None:
        ok = ok and f > gt
        bounds.append(f"> {gt:g}")
    if ge is not None:
        ok = ok and f >= ge
        bounds.append(f">= {ge:g}")
    if lt is not None:
        ok = ok and f < lt
        bounds.append(f"< {lt:g}")
    if le is not None:
        ok = ok and f <= le
        bounds.append(f"<= {le:g}")
    if not ok:
        what = " and ".join(["finite", *bounds])
        raise ValueError(f"{name} must be {what}; got {v!r}")
    return f


def check_bool(name: str, v: Any) -> bool:
    if not isinstance(v, bool):
        raise ArgumentTypeError(f"{name} must be a bool; got {v!r} ({type(v).__name__})")
    return v


def check_tensor(name: str, x: Any) -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor; got {type(x).__name__}")
    return x


def check_float_tensor(name: str, x: Any, min_dim: int = 0) -> Tensor:
    """A floating-point tensor with at least ``min_dim`` dims."""
    check_tensor(name, x)
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor; got dtype {x.dtype}")
    if x.dim() < min_dim:
        raise ValueError(f"{name} must have at least {min_dim} dims; got shape {tuple(x.shape)}")
    return x


class DTypeMismatchError(TypeError, RuntimeError):
    """An input whose dtype differs from the parameters': a ``TypeError`` here, and the
    ``RuntimeError`` torch raises in the same case (code written for torch catches that)."""


def check_same_dtype(name: str, x: Tensor, dtype: torch.dtype, owner: str) -> None:
    """``x`` must have the parameters' dtype (torch would fail deep inside a matmul)."""
    if x.dtype != dtype:
        raise DTypeMismatchError(
            f"{name} has dtype {x.dtype} but {owner}'s parameters are {dtype}; convert the input "
            f"(x.to({dtype})) or the module (module.to({x.dtype}))"
        )


def check_no_nan(name: str, x: Tensor, allow_neg_inf: bool = True) -> None:
    """Refuse NaN (and +inf; -inf too unless ``allow_neg_inf``). One cheap pass in the common
    case: a sum is finite (or ``-inf`` with only ``-inf`` among the non-finite values)."""
    if not x.is_floating_point() or x.numel() == 0:
        return
    s = x.sum()
    if bool(torch.isfinite(s)) or (allow_neg_inf and bool(s == float("-inf"))):
        return  # a NaN or a +inf (with or without -inf) would make the sum NaN or +inf
    n_nan = int(torch.isnan(x).sum())
    n_pos = int((x == float("inf")).sum())
    n_neg = 0 if allow_neg_inf else int((x == float("-inf")).sum())
    if n_nan or n_pos or n_neg:
        what = "NaN or +inf" if allow_neg_inf else "NaN or ±inf"
        raise ValueError(
            f"{name} must not contain {what}; got {n_nan} NaN, {n_pos} +inf"
            + ("" if allow_neg_inf else f", {n_neg} -inf")
            + f" in a tensor of shape {tuple(x.shape)}"
        )


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically: a temporary file in the same folder, flushed and
    fsynced, then ``os.replace``d over ``path``. A crash leaves the old file or the new one."""
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    try:
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; a plain open() would not
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):
        dfd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))
