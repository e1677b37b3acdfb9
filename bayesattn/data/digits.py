"""The 8x8 handwritten digits that ship inside scikit-learn (nothing is downloaded), split into
stratified train/val/test sets of in-distribution classes plus a pool of held-out classes for
out-of-distribution (OOD) evaluation. Images are float32 ``(N, H, W)`` in ``[0, 1]``; labels int64."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._validation import check_seed
from .holdout import HoldoutData, check_holdout_classes, data_from_split, holdout_split_indices

__all__ = ["DigitsData", "load_digits_data"]


@dataclass(frozen=True, eq=False)
class DigitsData(HoldoutData):
    """Stratified split of the 8x8 digits with held-out classes kept aside for OOD (the fields
    of :class:`~bayesattn.data.holdout.HoldoutData`; classes are the digits).

    Shape:
        x_train, x_val, x_test: ``(N_split, 8, 8)`` float32 in ``[0, 1]``.
        y_train, y_val, y_test: ``(N_split,)`` int64 in ``[0, C)``.
        x_ood_classes: ``(N_ood, 8, 8)`` float32; y_ood_classes: ``(N_ood,)`` int64.
    """


def _import_load_digits() -> Callable[..., Any]:
    try:
        from sklearn.datasets import load_digits
    except ImportError as exc:  # pragma: no cover - exercised via monkeypatch in tests
        raise ImportError(
            "load_digits_data needs scikit-learn, which ships the 8x8 digits dataset; "
            "install it with: pip install bayesattn[examples]"
        ) from exc
    return load_digits


def load_digits_data(
    seed: int = 0,
    val_fraction: float = 0.15,
    test_fraction: float = 0.2,
    holdout_classes: Iterable[int] = (8, 9),
) -> DigitsData:
    """Load the scikit-learn 8x8 digits with a seeded stratified split.

    Samples of ``holdout_classes`` go only to ``x_ood_classes``. Each remaining class is
    shuffled and split per class: ``round(test_fraction * n_c)`` test,
    ``round(val_fraction * n_c)`` validation, the rest training; each split is then
    shuffled. Pixel values are divided by 16.

    Shape:
        Returns a :class:`DigitsData` with images ``(N, 8, 8)`` and labels ``(N,)``.
    """
    seed = check_seed(seed)
    if isinstance(holdout_classes, (str, bytes)) or not isinstance(holdout_classes, Iterable):
        raise TypeError(f"holdout_classes must be an iterable of ints, got {holdout_classes!r}")
    holdout_list = list(holdout_classes)
    check_holdout_classes(holdout_list)
    bunch = _import_load_digits()()
    images = np.asarray(bunch.images, dtype=np.float32) / 16.0  # (1797, 8, 8)
    targets = np.asarray(bunch.target, dtype=np.int64)  # (1797,)
    split = holdout_split_indices(targets, holdout_list, seed, val_fraction, test_fraction)
    return data_from_split(images, targets, split, seed, DigitsData)
