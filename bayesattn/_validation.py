"""Shared argument checks: each raises ``TypeError`` (wrong kind of value) or ``ValueError`` (right
kind, bad value) naming the argument, what was expected and the value or shape seen. Also seeded
random-number helpers and atomic file writes.

Every module checks its generic arguments (ints, reals, seeds, fractions, tensors of a given rank,
finite tensors) with these; only domain checks (shapes that must agree, ids inside a vocabulary)
live next to their code, built on these primitives."""

from __future__ import annotations

import contextlib
import math
import numbers
import os
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal, overload

import torch
from torch import Tensor

__all__ = [
    "ArgumentTypeError",
    "check_int",
    "check_seed",
    "check_real",
    "check_bool",
    "check_type",
    "check_tensor",
    "check_float_tensor",
    "check_same_dtype",
    "check_no_nan",
    "check_finite",
    "check_positive",
    "check_broadcasts",
    "check_spd",
    "check_callable",
    "check_has_values",
    "seeded",
    "torch_generator",
    "atomic_write_bytes",
    "atomic_write_text",
]


class ArgumentTypeError(TypeError, ValueError):
    """An argument of the wrong type. Both a ``TypeError`` and a ``ValueError``: callers that
    catch the library's historical ``ValueError`` for a bad argument keep working."""


def _is_int(v: Any) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


@overload
def check_int(
    name: str,
    v: Any,
    minimum: int | None = None,
    maximum: int | None = None,
    *,
    allow_none: Literal[False] = False,
) -> int: ...


@overload
def check_int(
    name: str, v: Any, minimum: int | None = None, maximum: int | None = None, *, allow_none: bool
) -> int | None: ...


def check_int(
    name: str,
    v: Any,
    minimum: int | None = None,
    maximum: int | None = None,
    *,
    allow_none: bool = False,
) -> int | None:
    """``v`` as an ``int`` in ``[minimum, maximum]`` (``None`` passes through with
    ``allow_none``). Python, numpy and other ``numbers.Integral`` ints are accepted; bools and
    floats (``2.0``) are refused with an :class:`ArgumentTypeError`, out-of-range values with a
    ``ValueError``."""
    if allow_none and v is None:
        return None
    or_none = " or None" if allow_none else ""
    if not _is_int(v):
        raise ArgumentTypeError(f"{name} must be an int{or_none}; got {v!r} ({type(v).__name__})")
    v = int(v)
    if minimum is not None and maximum is not None and not minimum <= v <= maximum:
        raise ValueError(f"{name} must be an int in [{minimum}, {maximum}]{or_none}; got {v}")
    if minimum is not None and v < minimum:
        what = {0: "a non-negative int", 1: "a positive int"}.get(minimum, f"an int >= {minimum}")
        raise ValueError(f"{name} must be {what}{or_none}; got {v}")
    if maximum is not None and v > maximum:
        raise ValueError(f"{name} must be an int <= {maximum}{or_none}; got {v}")
    return v


def check_seed(v: Any, name: str = "seed") -> int:
    """A random seed: a non-negative int (what ``numpy`` and ``torch.Generator`` both accept)."""
    return check_int(name, v, 0)


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
    if not _within(f, gt, ge, lt, le):
        raise ValueError(f"{name} must be {_describe_bounds(gt, ge, lt, le)}; got {v!r}")
    return f


def check_reals(name: str, v: Any, *, gt: float | None = None) -> tuple[float, ...]:
    """A non-empty sequence (not a string) of real numbers, each ``> gt`` when given, as a
    tuple of floats; otherwise a ``TypeError``/``ValueError`` naming ``name`` and what was seen."""
    if isinstance(v, (str, bytes)) or not isinstance(v, Sequence) or len(v) == 0:
        raise TypeError(f"{name} must be a non-empty sequence of numbers; got {v!r}")
    return tuple(check_real(f"{name}[{i}]", x, gt=gt) for i, x in enumerate(v))


def _within(
    f: float, gt: float | None, ge: float | None, lt: float | None, le: float | None
) -> bool:
    return (
        math.isfinite(f)
        and (gt is None or f > gt)
        and (ge is None or f >= ge)
        and (lt is None or f < lt)
        and (le is None or f <= le)
    )


def _describe_bounds(gt: float | None, ge: float | None, lt: float | None, le: float | None) -> str:
    """``"in [0, 1)"`` for one lower and one upper bound, else e.g. ``"finite and > 0"``."""
    lows = [f"{br}{b:g}" for br, b in (("(", gt), ("[", ge)) if b is not None]
    highs = [f"{b:g}{br}" for br, b in ((")", lt), ("]", le)) if b is not None]
    if len(lows) == 1 and len(highs) == 1:
        return f"in {lows[0]}, {highs[0]}"
    bounds = [
        f"{op} {b:g}" for op, b in ((">", gt), (">=", ge), ("<", lt), ("<=", le)) if b is not None
    ]
    return " and ".join(["finite", *bounds])


def check_bool(name: str, v: Any) -> bool:
    if not isinstance(v, bool):
        raise ArgumentTypeError(f"{name} must be a bool; got {v!r} ({type(v).__name__})")
    return v


def check_type(name: str, v: Any, kind: type | tuple[type, ...], *, allow_none: bool = False) -> Any:
    """``v`` itself when it is an instance of ``kind`` (or ``None`` with ``allow_none``), else an
    :class:`ArgumentTypeError` naming ``name``, the type seen and the types allowed."""
    if (allow_none and v is None) or isinstance(v, kind):
        return v
    kinds = kind if isinstance(kind, tuple) else (kind,)
    allowed = " or ".join(k.__name__ for k in kinds) + (" or None" if allow_none else "")
    shown = repr(v)
    shown = f"{shown} ({type(v).__name__})" if len(shown) <= 80 else f"a {type(v).__name__}"
    raise ArgumentTypeError(f"{name} must be an instance of {allowed}; got {shown}")


def check_tensor(
    name: str, x: Any, ndim: int | None = None, *, layout: str | None = None
) -> Tensor:
    """A ``torch.Tensor`` (with exactly ``ndim`` dims if given). ``layout`` (e.g. ``"(B, T, D)"``)
    is shown in the messages."""
    where = f" {layout}" if layout else ""
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor{where}; got {type(x).__name__}")
    if ndim is not None and x.dim() != ndim:
        what = f"shape {layout}" if layout else f"{ndim} dims"
        raise ValueError(f"{name} must have {what}; got shape {tuple(x.shape)}")
    return x


def check_float_tensor(
    name: str, x: Any, min_dim: int = 0, *, ndim: int | None = None, layout: str | None = None
) -> Tensor:
    """A floating-point tensor with at least ``min_dim`` dims (exactly ``ndim`` if given)."""
    where = f" {layout}" if layout else ""
    check_tensor(name, x, layout=layout)
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor{where}; got dtype {x.dtype}")
    check_tensor(name, x, ndim, layout=layout)
    if x.dim() < min_dim:
        raise ValueError(
            f"{name} must have at least {min_dim} dims{where}; got shape {tuple(x.shape)}"
        )
    return x


class DTypeMismatchError(TypeError, RuntimeError):
    """An input whose dtype differs from the parameters': a ``TypeError`` here, and the
    ``RuntimeError`` torch raises in the same case (code written for torch catches that)."""


class ShapeAssertionError(ValueError, AssertionError):
    """A bad shape where ``torch.nn.MultiheadAttention`` fails an ``assert``: a ``ValueError``
    here, and the ``AssertionError`` torch raises (``except`` clauses written for torch work)."""


class ShapeRuntimeError(ValueError, RuntimeError):
    """A bad shape where torch raises ``RuntimeError`` (e.g. a mask of the wrong size): a
    ``ValueError`` here, and torch's ``RuntimeError``."""


class MaskDTypeError(TypeError, AssertionError):
    """A mask of an unsupported dtype: a ``TypeError`` here, and torch's ``AssertionError``."""


def check_same_dtype(name: str, x: Tensor, dtype: torch.dtype, owner: str) -> None:
    """``x`` must have the parameters' dtype (torch would fail deep inside a matmul)."""
    if x.dtype != dtype:
        raise DTypeMismatchError(
            f"{name} has dtype {x.dtype} but {owner}'s parameters are {dtype}; convert the input "
            f"(x.to({dtype})) or the module (module.to({x.dtype}))"
        )


def tracing() -> bool:
    """True inside ``torch.compile``/``torch.export`` tracing: checks must not branch on data
    there (they become graph asserts, see :func:`assert_in_graph`)."""
    return bool(torch.compiler.is_compiling())


def assert_in_graph(ok: Tensor, message: str) -> None:
    """The traceable form of a data check: an assert op in the graph (raises ``RuntimeError``
    with ``message`` when the compiled or exported program runs on bad data)."""
    torch._assert_async(ok, message)


def check_no_nan(name: str, x: Tensor, allow_neg_inf: bool = True) -> None:
    """Refuse NaN (and +inf; -inf too unless ``allow_neg_inf``). One cheap pass in the common
    case: a sum is finite (or ``-inf`` with only ``-inf`` among the non-finite values)."""
    if not x.is_floating_point() or x.numel() == 0 or x.device.type == "meta":
        return
    if tracing():
        bad = torch.isnan(x) | (x == float("inf"))
        if not allow_neg_inf:
            bad = bad | (x == float("-inf"))
        what = "NaN or +inf" if allow_neg_inf else "NaN or ±inf"
        assert_in_graph(~bad.any(), f"{name} must not contain {what}")
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


def check_finite(name: str, x: Tensor) -> None:
    """Raise ``ValueError`` naming ``name`` if ``x`` holds NaN or ±Inf.

    One cheap pass: a sum is finite unless some element is NaN/±Inf (or the sum overflows, which
    the exact count below then clears)."""
    if x.is_floating_point() and tracing():
        assert_in_graph(torch.isfinite(x).all(), f"{name} must be finite (NaN or Inf found)")
        return
    if x.device.type == "meta":  # no values to check (shape inference)
        return
    if not x.is_floating_point() or bool(torch.isfinite(x.sum())):
        return
    if not bool(torch.isfinite(x).all()):
        n_nan = int(torch.isnan(x).sum())
        n_inf = int(torch.isinf(x).sum())
        raise ValueError(
            f"{name} must be finite; got {n_nan} NaN and {n_inf} Inf values in a tensor of shape "
            f"{tuple(x.shape)}"
        )


def check_positive(name: str, value: Any, like: Tensor | None = None) -> Tensor:
    """``value`` (a tensor, or a real number made a tensor of ``like``'s dtype and device) as a
    floating-point tensor that is finite and ``> 0`` everywhere (not checked on ``meta``)."""
    if isinstance(value, Tensor):
        if not value.is_floating_point():
            raise ArgumentTypeError(
                f"{name} must be a floating-point tensor or a real number; got dtype {value.dtype}"
            )
        t = value
    elif isinstance(value, numbers.Real) and not isinstance(value, bool):
        dt = like.dtype if like is not None and like.is_floating_point() else None
        t = torch.tensor(float(value), dtype=dt, device=None if like is None else like.device)
    else:
        raise ArgumentTypeError(
            f"{name} must be a tensor or a real number; got {value!r} ({type(value).__name__})"
        )
    if t.device.type == "meta" or t.numel() == 0 or tracing():
        return t
    if not bool((torch.isfinite(t) & (t > 0)).all()):
        shown = t.detach().flatten()[:8].tolist()
        raise ValueError(f"{name} must be finite and > 0; got {shown}")
    return t


def check_broadcasts(
    name: str, x: Tensor, shape: tuple[int, ...], layout: str, *, into: bool = True
) -> None:
    """``x`` broadcasts with ``shape`` (e.g. one value per group, ``layout`` ``"(G,)"``), and with
    ``into`` without growing it; else a ``ValueError`` naming ``name``, the shape seen and the
    one allowed."""
    try:
        out = torch.broadcast_shapes(tuple(x.shape), shape)
        ok = not into or out == torch.Size(shape)
    except RuntimeError:
        ok = False
    if not ok:
        how = "broadcast to" if into else "broadcast with"
        raise ValueError(
            f"{name} must be a scalar or {how} {layout} = {tuple(shape)}; got shape "
            f"{tuple(x.shape)}"
        )


def check_spd(name: str, m: Any) -> Tensor:
    """``m`` as a finite, symmetric positive-definite ``(D, D)`` floating-point matrix (its
    Cholesky factorisation in float64 succeeds); anything else is a ``ValueError`` (a
    ``TypeError`` for a non-tensor) naming ``name``."""
    check_float_tensor(name, m, ndim=2, layout="(D, D)")
    if m.shape[0] != m.shape[1]:
        raise ValueError(f"{name} must be a square (D, D) matrix; got shape {tuple(m.shape)}")
    check_finite(name, m)
    if m.device.type == "meta":
        return m
    d = m.detach().double()
    tol = 1e-8 * max(1.0, float(d.abs().max())) if d.numel() else 0.0
    if not bool(((d - d.T).abs() <= tol).all()):
        raise ValueError(f"{name} must be symmetric; got max |m - m.T| = "
                         f"{float((d - d.T).abs().max()):.3g}")
    if int(torch.linalg.cholesky_ex(d).info) != 0:
        low = float(torch.linalg.eigvalsh(d).min())
        raise ValueError(
            f"{name} must be positive definite; got smallest eigenvalue {low:.3g}"
        )
    return m


def check_callable(name: str, fn: Any, signature: str, *, allow_none: bool = False) -> Any:
    """``fn`` itself when it is callable (or ``None`` with ``allow_none``), else an
    :class:`ArgumentTypeError` naming ``name`` and the expected ``signature``."""
    if (allow_none and fn is None) or callable(fn):
        return fn
    or_none = " or None" if allow_none else ""
    raise ArgumentTypeError(
        f"{name} must be a callable {signature}{or_none}; got {fn!r} ({type(fn).__name__})"
    )


def check_has_values(name: str, module: torch.nn.Module) -> None:
    """``module``'s parameters and buffers hold values: none is on the ``meta`` device (shapes
    only), which training and sampling cannot use."""
    for what, items in (("parameter", module.named_parameters()),
                        ("buffer", module.named_buffers())):  # fmt: skip
        for path, t in items:
            if t.device.type == "meta":
                raise ValueError(
                    f"{name}'s {what} {path!r} is on the meta device (a shape, no values): "
                    "materialise the model first (model.to_empty(device=...) then "
                    "load_state_dict(...)), or build it on a real device"
                )


def check_simplex(name: str, p: Tensor) -> None:
    """``p`` holds probability vectors on its last dim: entries ``>= 0`` summing to 1 (within
    float round-off of its dtype); rows with NaN are left to the NaN checks."""
    t = p.detach()
    if bool((t < 0).any()):
        raise ValueError(
            f"{name} must be probabilities (non-negative); got minimum {float(t.min()):.4g} "
            f"(shape {tuple(p.shape)})"
        )
    tol = max(1e-4, 64 * torch.finfo(p.dtype).eps) * max(1, p.shape[-1] // 1000 + 1)
    dev = (t.sum(-1, dtype=torch.float64) - 1.0).abs()  # (...,), NaN rows compare False
    if bool((dev > tol).any()):
        worst = float(dev.nan_to_num(0.0).max())
        raise ValueError(
            f"{name} must be probabilities summing to 1 over the last dim (within {tol:.1e}); "
            f"a row is off by {worst:.4g} (shape {tuple(p.shape)}): pass softmax(logits), "
            "not logits"
        )


@contextlib.contextmanager
def seeded(seed: int | None) -> Iterator[None]:
    """Run a block under a fork of torch's global CPU RNG seeded with ``seed``: the same seed gives
    the same draws, and the global RNG state is restored afterwards. ``None``: a no-op (the block
    draws from, and advances, the global RNG)."""
    if seed is None:
        yield
        return
    check_int("seed", seed, allow_none=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        yield


def torch_generator(seed: int) -> torch.Generator:
    """A CPU ``torch.Generator`` seeded with ``seed`` (draws that leave the global RNG alone)."""
    return torch.Generator(device="cpu").manual_seed(seed)


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
