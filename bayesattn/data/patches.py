"""Images to ViT-style patch tokens and back (the cutting itself is
:func:`bayesattn._patches.patchify`, shared with
:meth:`bayesattn.nn.networks.VisionTransformer.patchify`)."""

from __future__ import annotations

import math
import numbers

from torch import Tensor

from .._patches import patchify
from .._validation import check_int, check_tensor

__all__ = ["images_to_patches", "patches_to_images"]


def images_to_patches(x: Tensor, patch_size: int = 2) -> Tensor:
    """Cut images into non-overlapping square patches (ViT-style tokens).

    Patches are ordered row-major over the patch grid, and pixels row-major within a
    patch. An 8x8 image with ``patch_size=2`` gives 16 patches of dimension 4.

    Shape:
        x: ``(N, H, W)``. Returns ``(N, (H // p) * (W // p), p * p)``.
    """
    x = check_tensor("x", x, 3)
    p = check_int("patch_size", patch_size, 1)
    return patchify(x.unsqueeze(1), p)  # (N, 1, H, W) -> (N, gh * gw, p * p)


def patches_to_images(patches: Tensor, image_size: int | tuple[int, int] | None = None) -> Tensor:
    """Inverse of :func:`images_to_patches`.

    ``image_size`` is ``(H, W)`` or an int for square images; ``None`` assumes a square
    patch grid.

    Shape:
        patches: ``(N, num_patches, p * p)``. Returns ``(N, H, W)``.
    """
    patches = check_tensor("patches", patches, 3)
    n, num_patches, dim = patches.shape
    p = math.isqrt(dim)
    if p * p != dim or dim == 0:
        raise ValueError(f"patch dimension must be a perfect square p * p, got {dim}")
    if image_size is None:
        g = math.isqrt(num_patches)
        if g * g != num_patches:
            raise ValueError(
                f"num_patches={num_patches} is not a square grid; pass image_size=(H, W)"
            )
        h = w = g * p
    else:
        if isinstance(image_size, numbers.Integral) and not isinstance(image_size, bool):
            h = w = int(image_size)
        elif (
            isinstance(image_size, tuple)
            and len(image_size) == 2
            and all(isinstance(v, numbers.Integral) for v in image_size)
        ):
            h, w = (int(v) for v in image_size)
        else:
            raise TypeError(f"image_size must be an int or (H, W) tuple, got {image_size!r}")
        if h % p or w % p or (h // p) * (w // p) != num_patches:
            raise ValueError(
                f"image_size={image_size!r} does not match {num_patches} patches of size {p}x{p}"
            )
    gh, gw = h // p, w // p
    x = patches.reshape(n, gh, gw, p, p).permute(0, 1, 3, 2, 4)  # (N, gh, p, gw, p)
    return x.reshape(n, h, w)
