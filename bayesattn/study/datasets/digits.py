"""The 8×8 handwritten digits of scikit-learn as a study data set: a ViT over 2×2 patches
(16 tokens + CLS); image corruptions (:func:`~bayesattn.data.corrupt_images`) and the far-OOD
suite of :func:`~bayesattn.data.far_ood.far_ood_suite`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from torch import Tensor

from ...data import CORRUPTION_KINDS, corrupt_images, load_digits_data
from ...data.far_ood import far_ood_suite
from ...data.holdout import HoldoutData
from ...nn.blocks import AttentionConfig
from ...nn.networks import TransformerClassifier, VisionTransformer
from .base import StudyDataset, register_dataset

__all__ = ["Digits"]


class Digits(StudyDataset):
    """The digits: images ``(N, 8, 8)`` in ``[0, 1]``, ten classes."""

    name = "digits"
    description = "scikit-learn's 8×8 handwritten digits, a ViT over 2×2 patches"
    model_defaults = dict(d_model=32, nhead=4, num_layers=2, dim_feedforward=64, epochs=20,
                          lr=3e-3, batch_size=64, patch=2)  # fmt: skip
    token_unit = "pixels²"
    full_protocol = True
    order = 0
    geometry = True

    @property
    def figure_prefix(self) -> str:
        """None: the digits are the default data set."""
        return ""

    def load(self, seed: int, holdout_classes: tuple[int, ...]) -> HoldoutData:
        return load_digits_data(seed=seed, holdout_classes=holdout_classes)

    def corruptions(
        self, data: HoldoutData, severities: Sequence[int], seed: int
    ) -> dict[tuple[str, int], Tensor]:
        return {(k, s): corrupt_images(data.x_test, k, s, seed)
                for k in CORRUPTION_KINDS for s in severities}  # fmt: skip

    def far_ood(self, data: HoldoutData, seed: int) -> dict[str, Tensor]:
        return far_ood_suite(data.x_test, seed, train=(data.x_train, data.y_train))

    def network(
        self,
        data: HoldoutData,
        model: Mapping[str, Any],
        dropout: float,
        attention: AttentionConfig | None,
    ) -> TransformerClassifier:
        """A ViT over ``patch``×``patch`` patches of the 8×8 image."""
        kw = self.sizes(model, dropout, attention)
        return VisionTransformer(data.num_classes, image_size=8, patch_size=model["patch"], **kw)


register_dataset(Digits())
