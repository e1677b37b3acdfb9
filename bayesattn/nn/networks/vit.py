"""Image classification: :class:`VisionTransformer`, a :class:`TransformerClassifier` on
patches."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from ..._patches import patchify
from ..._validation import check_int
from .classifier import TransformerClassifier

__all__ = ["VisionTransformer"]


class VisionTransformer(TransformerClassifier):
    """ViT for small images: non-overlapping ``patch_size`` patches → linear embedding → a
    :class:`TransformerClassifier` with a CLS token (8×8 digits with 2×2 patches: 16 tokens).

    Shape:
        x ``(B, H, W)`` or ``(B, C, H, W)`` → logits ``(*S, B, num_classes)``.
    """

    def __init__(
        self,
        num_classes: int,
        image_size: int = 8,
        patch_size: int = 2,
        in_channels: int = 1,
        **kwargs: Any,
    ) -> None:
        check_int("image_size", image_size, 1)
        check_int("patch_size", patch_size, 1)
        check_int("in_channels", in_channels, 1)
        if image_size % patch_size:
            raise ValueError(
                f"image_size must be divisible by patch_size; got {image_size}, {patch_size}"
            )
        self.image_size, self.patch_size, self.in_channels = image_size, patch_size, in_channels
        n = (image_size // patch_size) ** 2
        kwargs.setdefault("pooling", "cls")
        kwargs.setdefault("max_len", n)
        super().__init__(num_classes, input_dim=in_channels * patch_size**2, **kwargs)

    def patchify(self, x: Tensor) -> Tensor:
        """``(B, C, H, W)`` → ``(B, N, C·p·p)`` row-major patches."""
        if x.dim() == 3:
            x = x.unsqueeze(1)
        return patchify(x, self.patch_size)

    def check_batch(self, x: Tensor, y: Tensor | None) -> None:
        if not isinstance(x, Tensor):
            raise TypeError(f"images must be a torch.Tensor; got {type(x).__name__}")
        s, c = self.image_size, self.in_channels
        ok = x.dim() == 3 and c == 1 and x.shape[1:] == (s, s)
        ok = ok or (x.dim() == 4 and x.shape[1:] == (c, s, s))
        if not ok:
            raise ValueError(
                f"images must be (B, {s}, {s}) or (B, {c}, {s}, {s}); got {tuple(x.shape)}"
            )
        super().check_batch(self.patchify(x), y)

    def forward_logits(self, x: Tensor, y: Tensor | None = None, num_samples: int = 1) -> Tensor:
        return super().forward_logits(self.patchify(x), y, num_samples)

