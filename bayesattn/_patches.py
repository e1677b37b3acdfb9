"""Cutting images into ViT patches: the one pure tensor implementation, shared by
:func:`bayesattn.data.images_to_patches` and :meth:`bayesattn.nn.networks.VisionTransformer.patchify`.

It sits at the bottom floor (imports only torch) so that both the networks and the data helpers
can use it without an upward import.
"""

from __future__ import annotations

from torch import Tensor

__all__ = ["patchify"]


def patchify(x: Tensor, patch_size: int) -> Tensor:
    r"""Non-overlapping ``p × p`` patches of ``(N, C, H, W)`` images, as tokens.

    Patches are ordered row-major over the ``(H/p) × (W/p)`` grid; a patch's features are
    ordered channel first, then row-major pixels: token ``g = i·(W/p) + j`` holds
    ``x[n, c, i·p + a, j·p + b]`` at feature ``c·p² + a·p + b``.

    Shape:
        x ``(N, C, H, W)`` → ``(N, (H/p)·(W/p), C·p·p)``.
    """
    p = patch_size
    n, c, h, w = x.shape
    if h % p or w % p:
        raise ValueError(f"image size (H, W) = ({h}, {w}) is not divisible by patch_size={p}")
    gh, gw = h // p, w // p
    x = x.reshape(n, c, gh, p, gw, p).permute(0, 2, 4, 1, 3, 5)  # (N, gh, gw, C, p, p)
    return x.reshape(n, gh * gw, c * p * p)
