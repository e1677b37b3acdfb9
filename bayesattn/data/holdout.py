"""Class-held-out splits: stratified train/val/test indices of the in-distribution classes and the
indices of the held-out classes (the OOD pool), and the disjoint class pairs a study rotates over.

Every dataset of the study (:mod:`~bayesattn.data.digits`, :mod:`~bayesattn.data.mnist1d`,
:mod:`~bayesattn.data.fortunes`) splits through :func:`holdout_split_indices`, so "no held-out
class in training or validation" is a property of one function, checked on its indices; each
returns a :class:`HoldoutData` (the split's tensors), of its own subclass."""

from __future__ import annotations

import numbers
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import torch
from torch import Tensor

from .._validation import check_int, check_real, check_seed

__all__ = [
    "HoldoutSplit",
    "HoldoutData",
    "holdout_split_indices",
    "check_holdout_classes",
    "rotation_pairs",
    "data_from_split",
]


@dataclass(frozen=True, eq=False)
class HoldoutSplit:
    """Row indices into the full dataset: ``train``/``val``/``test`` hold only in-distribution
    classes (each split shuffled), ``ood`` every row of a held-out class (original order);
    ``classes`` the in-distribution classes in increasing order, ``holdout`` the held-out ones."""

    train: np.ndarray
    val: np.ndarray
    test: np.ndarray
    ood: np.ndarray
    classes: tuple[int, ...]
    holdout: tuple[int, ...]

    def remap(self, targets: np.ndarray) -> np.ndarray:
        """Original labels → ``0..C-1`` (``-1`` for a held-out class)."""
        table = np.full(int(targets.max()) + 1, -1, dtype=np.int64)
        for k, c in enumerate(self.classes):
            table[c] = k
        return table[targets]


@dataclass(frozen=True, eq=False)
class HoldoutData:
    """The tensors of a class-held-out split: in-distribution ``train``/``val``/``test`` inputs
    and labels, and the held-out classes' inputs (``x_ood_classes``, all of their rows).

    Labels of in-distribution classes are remapped to ``0..C-1`` in increasing order of the
    original class; ``classes[k]`` is the original class of new label ``k`` and ``label_map``
    maps original class -> new label. ``y_ood_classes`` keeps the *original* class ids (they
    have no in-distribution label). Each dataset subclasses it (the inputs' shape and type are
    the subclass's: images, sequences, token ids).

    Shape:
        x_train, x_val, x_test: ``(N_split, *input)``; y_train, y_val, y_test: ``(N_split,)``
        int64 in ``[0, C)``; x_ood_classes ``(N_ood, *input)``; y_ood_classes ``(N_ood,)`` int64.
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


DataT = TypeVar("DataT", bound=HoldoutData)


def data_from_split(
    inputs: np.ndarray, targets: np.ndarray, split: HoldoutSplit, seed: int, cls: type[DataT]
) -> DataT:
    """The ``cls`` (a :class:`HoldoutData`) of ``inputs``/``targets`` rows picked by ``split``.

    Shape:
        inputs ``(N, *input)``, targets ``(N,)`` original labels → the split's tensors.
    """
    labels = split.remap(targets)

    def take(idx: np.ndarray) -> tuple[Tensor, Tensor]:
        return torch.from_numpy(inputs[idx].copy()), torch.from_numpy(labels[idx].copy())

    (x_train, y_train), (x_val, y_val), (x_test, y_test) = map(
        take, (split.train, split.val, split.test)
    )
    x_ood = torch.from_numpy(inputs[split.ood].copy())  # (N_ood, ...)
    y_ood = torch.from_numpy(targets[split.ood].copy())  # (N_ood,)
    return cls(
        x_train=x_train, y_train=y_train, x_val=x_val, y_val=y_val, x_test=x_test,
        y_test=y_test, classes=split.classes, label_map={c: k for k, c in enumerate(split.classes)},
        holdout_classes=split.holdout, x_ood_classes=x_ood, y_ood_classes=y_ood, seed=seed,
    )  # fmt: skip


def check_holdout_classes(holdout_classes: Iterable[int], num_classes: int = 10) -> tuple[int, ...]:
    """``holdout_classes`` as a sorted tuple of distinct class ids in ``0..num_classes-1`` that
    leaves at least 2 classes in distribution (``ValueError``/``TypeError`` otherwise)."""
    if isinstance(holdout_classes, (str, bytes)) or not isinstance(holdout_classes, Iterable):
        raise TypeError(f"holdout_classes must be an iterable of ints, got {holdout_classes!r}")
    h = list(holdout_classes)
    for c in h:
        if isinstance(c, bool) or not isinstance(c, numbers.Integral) or not 0 <= c < num_classes:
            raise ValueError(f"holdout_classes must contain digits 0..{num_classes - 1}, got {h!r}")
    if len(set(h)) != len(h):
        raise ValueError(f"holdout_classes must not repeat a class, got {h!r}")
    if num_classes - len(h) < 2:
        raise ValueError(
            f"holdout_classes must leave at least 2 in-distribution classes, got {h!r}"
        )
    return tuple(sorted(int(c) for c in h))


def holdout_split_indices(
    targets: np.ndarray,
    holdout_classes: Iterable[int],
    seed: int = 0,
    val_fraction: float = 0.15,
    test_fraction: float = 0.2,
    num_classes: int = 10,
) -> HoldoutSplit:
    """Seeded stratified split of the rows of ``targets`` (original labels ``0..num_classes-1``).

    Rows of ``holdout_classes`` go only to ``ood``. Each remaining class is shuffled and split
    per class: ``round(test_fraction · n_c)`` test, ``round(val_fraction · n_c)`` validation, the
    rest training; each split is then shuffled (one ``numpy.random.default_rng(seed)`` draws
    everything, in that order).

    Shape:
        targets ``(N,)`` ints → index arrays into ``0..N-1``.
    """
    seed = check_seed(seed)
    val_fraction = check_real("val_fraction", val_fraction, ge=0.0, lt=1.0)
    test_fraction = check_real("test_fraction", test_fraction, ge=0.0, lt=1.0)
    check_int("num_classes", num_classes, 2)
    if val_fraction + test_fraction >= 1.0:
        raise ValueError(
            "val_fraction + test_fraction must be < 1, got "
            f"{val_fraction} + {test_fraction} = {val_fraction + test_fraction}"
        )
    holdout = check_holdout_classes(holdout_classes, num_classes)
    targets = np.asarray(targets)
    if targets.ndim != 1 or not np.issubdtype(targets.dtype, np.integer):
        raise ValueError(f"targets must be a 1-D int array; got {targets.dtype} {targets.shape}")
    classes = tuple(c for c in range(num_classes) if c not in holdout)
    rng = np.random.default_rng(seed)
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
    split = {name: rng.permutation(np.concatenate(parts[name])) for name in parts}
    return HoldoutSplit(
        train=split["train"],
        val=split["val"],
        test=split["test"],
        ood=np.flatnonzero(np.isin(targets, holdout)),
        classes=classes,
        holdout=holdout,
    )


def rotation_pairs(k: int, num_classes: int = 10, seed: int = 0) -> list[tuple[int, int]]:
    """``k`` disjoint held-out class pairs: a seeded permutation of the classes cut into pairs
    (each sorted), the first ``k`` of them; ``k <= num_classes // 2``."""
    check_int("num_classes", num_classes, 2)
    k = check_int("holdout_rotation", k, 1, num_classes // 2)
    perm = np.random.default_rng(check_seed(seed)).permutation(num_classes)
    return [tuple(sorted((int(perm[2 * i]), int(perm[2 * i + 1])))) for i in range(k)]  # type: ignore[misc]
