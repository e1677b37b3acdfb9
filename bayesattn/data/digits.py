"""The 8x8 handwritten digits that ship inside scikit-learn (nothing is downloaded), split into
stratified train/val/test sets of in-distribution classes plus a pool of held-out classes for
out-of-distribution (OOD) evaluation. Images are float32 ``(N, H, W)`` in ``[0, 1]``; labels int64."""

from __future__ import annotations

import numbers
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .._validation import check_real, check_seed

__all__ = ["DigitsData", "load_digits_data"]


@dataclass(frozen=True, eq=False)
class DigitsData:
    """Stratified split of the 8x8 digits with held-out classes kept aside for OOD.

    Labels of in-distribution classes are remapped to ``0..C-1`` in increasing order of
    the original digit; ``classes[k]`` is the original digit of new label ``k`` and
    ``label_map`` maps original digit -> new label. ``y_ood_classes`` keeps the
    *original* digit ids (they have no in-distribution label).

    Shape:
        x_train, x_val, x_test: ``(N_split, 8, 8)`` float32 in ``[0, 1]``.
        y_train, y_val, y_test: ``(N_split,)`` int64 in ``[0, C)``.
        x_ood_classes: ``(N_ood, 8, 8)`` float32; y_ood_classes: ``(N_ood,)`` int64.
    """

    x_train: Tensor
    y_train: Tensor
    x_val: Tensor
    y_val: Tensor
    x_test: Tensor
    y_test: Tensor
    classes: tuple[int, ...]
    label_map: dict[int, int]
    holdout_classes: tuple[int, ...]
    x_ood_classes: Tensor
    y_ood_classes: Tensor
    seed: int

    @property
    def num_classes(self) -> int:
        """Number of in-distribution classes ``C``."""
        return len(self.classes)

    @property
    def class_names(self) -> tuple[str, ...]:
        """Printable names of the in-distribution classes, indexed by new label."""
        return tuple(str(c) for c in self.classes)


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
    val_fraction = check_real("val_fraction", val_fraction, ge=0.0, lt=1.0)
    test_fraction = check_real("test_fraction", test_fraction, ge=0.0, lt=1.0)
    if val_fraction + test_fraction >= 1.0:
        raise ValueError(
            "val_fraction + test_fraction must be < 1, got "
            f"{val_fraction} + {test_fraction} = {val_fraction + test_fraction}"
        )
    if isinstance(holdout_classes, (str, bytes)) or not isinstance(holdout_classes, Iterable):
        raise TypeError(f"holdout_classes must be an iterable of ints, got {holdout_classes!r}")
    holdout_list = list(holdout_classes)
    for c in holdout_list:
        if isinstance(c, bool) or not isinstance(c, numbers.Integral) or not 0 <= c <= 9:
            raise ValueError(f"holdout_classes must contain digits 0..9, got {holdout_list!r}")
    if len(set(holdout_list)) != len(holdout_list):
        raise ValueError(f"holdout_classes must not repeat a class, got {holdout_list!r}")
    holdout = tuple(sorted(int(c) for c in holdout_list))
    classes = tuple(c for c in range(10) if c not in holdout)
    if len(classes) < 2:
        raise ValueError(
            f"holdout_classes must leave at least 2 in-distribution classes, got {holdout_list!r}"
        )

    bunch = _import_load_digits()()
    images = np.asarray(bunch.images, dtype=np.float32) / 16.0  # (1797, 8, 8)
    targets = np.asarray(bunch.target, dtype=np.int64)  # (1797,)

    rng = np.random.default_rng(seed)
    label_map = {c: k for k, c in enumerate(classes)}
    parts: dict[str, list[np.ndarray]] = {"train": [], "val": [], "test": []}
    for c in classes:
        idx = rng.permutation(np.flatnonzero(targets == c))
        n_test = int(round(test_fraction * len(idx)))
        n_val = int(round(val_fraction * len(idx)))
        if n_test + n_val >= len(idx):
            raise ValueError(
                f"val_fraction={val_fraction} and test_fraction={test_fraction} leave no "
                f"training samples for class {c} ({len(idx)} samples)"
            )
        parts["test"].append(idx[:n_test])
        parts["val"].append(idx[n_test : n_test + n_val])
        parts["train"].append(idx[n_test + n_val :])

    remap = np.full(10, -1, dtype=np.int64)
    for c, k in label_map.items():
        remap[c] = k

    def take(name: str) -> tuple[Tensor, Tensor]:
        idx = rng.permutation(np.concatenate(parts[name]))
        x = torch.from_numpy(images[idx].copy())  # (N, 8, 8)
        y = torch.from_numpy(remap[targets[idx]])  # (N,)
        return x, y

    x_train, y_train = take("train")
    x_val, y_val = take("val")
    x_test, y_test = take("test")
    ood_idx = np.flatnonzero(np.isin(targets, holdout))
    x_ood = torch.from_numpy(images[ood_idx].copy()).reshape(-1, 8, 8)  # (N_ood, 8, 8)
    y_ood = torch.from_numpy(targets[ood_idx].copy())  # (N_ood,)
    return DigitsData(
        x_train=x_train,
        y_train=y_train,
        x_val=x_val,
        y_val=y_val,
        x_test=x_test,
        y_test=y_test,
        classes=classes,
        label_map=label_map,
        holdout_classes=holdout,
        x_ood_classes=x_ood,
        y_ood_classes=y_ood,
        seed=seed,
    )
