"""Seeded image corruptions (noise, rotation, occlusion at severities 1..5) for
distribution-shift studies. Images are float32 ``(N, H, W)`` in ``[0, 1]``."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal, get_args

import torch
import torch.nn.functional as F
from torch import Tensor

from .._validation import check_float_tensor, check_int, check_seed, torch_generator

__all__ = ["CORRUPTION_KINDS", "corrupt_images", "corruption_suite"]


#: an image corruption (:func:`corrupt_images`)
CorruptionKind = Literal["noise", "rotation", "occlusion"]
CORRUPTION_KINDS: tuple[CorruptionKind, ...] = get_args(CorruptionKind)
_NOISE_STD = (0.05, 0.1, 0.2, 0.3, 0.4)  # severity 1..5
_ROTATION_DEG = (15.0, 30.0, 45.0, 60.0, 75.0)
_OCCLUSION_FRAC = (0.25, 0.375, 0.5, 0.625, 0.75)  # patch side / min(H, W)


def _check_kind(kind: Any) -> CorruptionKind:
    if kind not in CORRUPTION_KINDS:
        raise ValueError(f"kind must be one of {CORRUPTION_KINDS}, got {kind!r}")
    return kind


def _occlusion_side(severity: int, height: int, width: int) -> int:
    return max(1, int(round(min(height, width) * _OCCLUSION_FRAC[severity - 1])))


def corrupt_images(x: Tensor, kind: CorruptionKind, severity: int, seed: int = 0) -> Tensor:
    """Return a corrupted copy of ``x`` (the input is not modified).

    * ``"noise"``: additive Gaussian noise, std ``(0.05, 0.1, 0.2, 0.3, 0.4)`` for
      severity 1..5, clipped to ``[0, 1]``.
    * ``"rotation"``: rotation about the image centre by ``15 * severity`` degrees with a
      seeded random direction per image; bilinear sampling, zeros outside.
    * ``"occlusion"``: a zeroed square of side ``round(min(H, W) * (severity + 1) / 8)``
      (2..6 pixels on 8x8) at a seeded random location fully inside the image.

    The random draws do not depend on ``severity`` (common random numbers), so for a
    fixed seed severities differ only in magnitude.

    Shape:
        x: ``(N, H, W)`` floating point. Returns ``(N, H, W)``, same dtype and device.
    """
    x = check_float_tensor("x", x, ndim=3)
    if not bool(torch.isfinite(x).all()):
        raise ValueError(f"x must be finite; got NaN or Inf pixels in shape {tuple(x.shape)}")
    kind = _check_kind(kind)
    severity = check_int("severity", severity, 1, 5)
    seed = check_seed(seed)
    g = torch_generator(seed)
    n, h, w = x.shape

    if kind == "noise":
        noise = torch.randn((n, h, w), generator=g).to(device=x.device, dtype=x.dtype)
        return (x + _NOISE_STD[severity - 1] * noise).clamp(0.0, 1.0)  # (N, H, W)

    if kind == "rotation":
        sign = torch.randint(0, 2, (n,), generator=g).to(x.dtype) * 2 - 1  # (N,)
        angle = sign * math.radians(_ROTATION_DEG[severity - 1])
        cos, sin = torch.cos(angle), torch.sin(angle)
        zeros = torch.zeros_like(cos)
        # output pixel p samples input at R p; normalised coords rescale by the aspect ratio
        theta = torch.stack(
            [
                torch.stack([cos, -sin * h / w, zeros], dim=-1),
                torch.stack([sin * w / h, cos, zeros], dim=-1),
            ],
            dim=1,
        ).to(x.device)  # (N, 2, 3)
        grid = F.affine_grid(theta, [n, 1, h, w], align_corners=False)  # (N, H, W, 2)
        out = F.grid_sample(
            x.unsqueeze(1), grid, mode="bilinear", padding_mode="zeros", align_corners=False
        )  # (N, 1, H, W)
        return out.squeeze(1)

    # occlusion
    side = _occlusion_side(severity, h, w)
    u = torch.rand((n, 2), generator=g)  # (N, 2)
    top = torch.floor(u[:, 0] * (h - side + 1)).long().to(x.device)  # (N,)
    left = torch.floor(u[:, 1] * (w - side + 1)).long().to(x.device)  # (N,)
    rows = torch.arange(h, device=x.device)
    cols = torch.arange(w, device=x.device)
    row_in = (rows >= top[:, None]) & (rows < top[:, None] + side)  # (N, H)
    col_in = (cols >= left[:, None]) & (cols < left[:, None] + side)  # (N, W)
    mask = row_in[:, :, None] & col_in[:, None, :]  # (N, H, W)
    return x.masked_fill(mask, 0.0)


def corruption_suite(
    x: Tensor,
    kinds: Sequence[CorruptionKind] = CORRUPTION_KINDS,
    severities: Sequence[int] = (1, 3, 5),
    seed: int = 0,
) -> dict[tuple[str, int], Tensor]:
    """Corrupt ``x`` with every ``(kind, severity)`` combination.

    Every entry uses the same ``seed``; entry ``(k, s)`` equals
    ``corrupt_images(x, k, s, seed)``.

    Shape:
        x: ``(N, H, W)``. Returns ``{(kind, severity): (N, H, W)}`` in kinds x severities
        order.
    """
    if isinstance(kinds, str) or len(kinds) == 0:
        raise ValueError(f"kinds must be a non-empty sequence of kind names, got {kinds!r}")
    if isinstance(severities, (str, bytes)) or len(severities) == 0:
        raise ValueError(f"severities must be a non-empty sequence of ints, got {severities!r}")
    for k in kinds:
        _check_kind(k)
    for s in severities:
        check_int("severity", s, 1, 5)
    return {(k, int(s)): corrupt_images(x, k, s, seed=seed) for k in kinds for s in severities}
