"""MNIST-1D as a study data set: a transformer over the 40-step sequence cut into overlapping
windows (:class:`SignalTransformer`); sequence corruptions
(:func:`~bayesattn.data.far_ood.corrupt_sequences`) and the far-OOD suite. The model (0.5)
reaches about .91 test accuracy in about 17 s of one core; the 0.4 one (3 layers, 40 epochs,
non-overlapping windows of 4) .90 in about 50 s (docs/which-attention.md, "The MNIST-1D
model"). Needs the ``mnist1d`` package (the ``study`` extra)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from torch import Tensor

from ..._validation import check_int
from ...data.far_ood import SEQUENCE_CORRUPTIONS, corrupt_sequences, far_ood_suite
from ...data.holdout import HoldoutData
from ...data.mnist1d import import_mnist1d, load_mnist1d_data
from ...nn.blocks import AttentionConfig
from ...nn.networks import TransformerClassifier
from .base import StudyDataset, register_dataset

__all__ = ["Mnist1d", "SignalTransformer"]


class SignalTransformer(TransformerClassifier):
    """A transformer over 1-D signals: ``(B, T)`` cut into windows of ``patch`` steps every
    ``stride`` steps (default ``stride = patch``: non-overlapping; ``stride < patch``:
    overlapping windows, ``(T - patch) / stride + 1`` tokens), each linearly embedded, a CLS
    token, learned positions.

    Shape:
        x ``(B, T)`` → windows ``(B, (T - patch) / stride + 1, patch)`` → logits
        ``(*S, B, num_classes)``.
    """

    def __init__(
        self,
        num_classes: int,
        length: int = 40,
        patch: int = 4,
        stride: int | None = None,
        **kwargs: Any,
    ) -> None:
        length, patch = check_int("length", length, 1), check_int("patch", patch, 1)
        stride = patch if stride is None else check_int("stride", stride, 1)
        if patch > length or (length - patch) % stride:
            raise ValueError(
                f"windows of patch={patch} every stride={stride} steps must tile length={length} "
                f"exactly ((length - patch) divisible by stride)"
            )
        self.length, self.patch, self.stride = length, patch, stride
        kwargs.setdefault("pooling", "cls")
        super().__init__(
            num_classes, input_dim=patch, max_len=(length - patch) // stride + 1, **kwargs
        )

    def patchify(self, x: Tensor) -> Tensor:
        """``(B, T)`` → ``(B, (T - patch) / stride + 1, patch)`` windows (a view of ``x``)."""
        return x.unfold(-1, self.patch, self.stride)

    def check_batch(self, x: Tensor, y: Tensor | None) -> None:
        if not isinstance(x, Tensor) or x.dim() != 2 or x.shape[1] != self.length:
            raise ValueError(
                f"signals must be (B, {self.length}); got {tuple(getattr(x, 'shape', ()))}"
            )
        super().check_batch(self.patchify(x), y)

    def forward_logits(self, x: Tensor, y: Tensor | None = None, num_samples: int = 1) -> Tensor:
        return super().forward_logits(self.patchify(x), y, num_samples)


class Mnist1d(StudyDataset):
    """MNIST-1D: sequences ``(N, 40)`` (standardised), ten classes."""

    name = "mnist1d"
    description = "MNIST-1D sequences (generated offline; pip install mnist1d)"
    #: windows of 8 steps every 4 (9 tokens + CLS)
    model_defaults = dict(d_model=64, nhead=4, num_layers=2, dim_feedforward=128, epochs=30,
                          lr=5e-3, batch_size=128, patch=8, stride=4)  # fmt: skip
    token_unit = "steps"
    full_protocol = True
    order = 1

    def check_available(self) -> None:
        import_mnist1d()

    def load(self, seed: int, holdout_classes: tuple[int, ...]) -> HoldoutData:
        return load_mnist1d_data(seed=seed, holdout_classes=holdout_classes)

    def corruptions(
        self, data: HoldoutData, severities: Sequence[int], seed: int
    ) -> dict[tuple[str, int], Tensor]:
        return {(k, s): corrupt_sequences(data.x_test, k, s, seed)
                for k in SEQUENCE_CORRUPTIONS for s in severities}  # fmt: skip

    def far_ood(self, data: HoldoutData, seed: int) -> dict[str, Tensor]:
        return far_ood_suite(data.x_test, seed, train=(data.x_train, data.y_train))

    def network(
        self,
        data: HoldoutData,
        model: Mapping[str, Any],
        dropout: float,
        attention: AttentionConfig | None,
    ) -> TransformerClassifier:
        """A :class:`SignalTransformer` over windows of ``patch`` steps every ``stride``."""
        kw = self.sizes(model, dropout, attention)
        return SignalTransformer(data.num_classes, length=data.x_train.shape[1],
                                 patch=model["patch"], stride=model.get("stride"), **kw)  # fmt: skip


register_dataset(Mnist1d())
