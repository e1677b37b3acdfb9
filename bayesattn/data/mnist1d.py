"""MNIST-1D (Greydanus, 2020): ten 1-D digit templates, randomly padded, translated, scaled,
sheared and noised into 40-step sequences. Generated offline with the ``mnist1d`` package's own
``make_dataset`` and its default arguments (5000 sequences, generation seed 42), never its
download path; then split like the digits (:func:`~bayesattn.data.holdout.holdout_split_indices`).
Needs the ``study`` extra (``pip install mnist1d``)."""

from __future__ import annotations

import functools
import random
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._validation import check_int, check_seed
from .holdout import HoldoutData, check_holdout_classes, data_from_split, holdout_split_indices

__all__ = ["Mnist1dData", "load_mnist1d_data", "generate_mnist1d"]


@dataclass(frozen=True, eq=False)
class Mnist1dData(HoldoutData):
    """The fields of :class:`~bayesattn.data.holdout.HoldoutData` for MNIST-1D: ``x_*`` are
    float32 sequences ``(N, 40)`` (standardised over the whole generated set, as the package
    does), ``y_*`` int64 labels remapped to ``0..C-1``; ``y_ood_classes`` the original digits."""


def import_mnist1d() -> Any:
    """The ``mnist1d.data`` module, or an ``ImportError`` saying how to install it."""
    try:
        from mnist1d import data as mdata
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "MNIST-1D needs the mnist1d package (generated offline, nothing downloaded): "
            "pip install mnist1d (the study extra; `make study` installs it)"
        ) from exc
    return mdata


@functools.lru_cache(maxsize=4)
def _generate(num_samples: int, data_seed: int) -> tuple[np.ndarray, np.ndarray]:
    mdata = import_mnist1d()
    args = mdata.get_dataset_args()
    args.num_samples, args.seed = num_samples, data_seed
    # make_dataset seeds numpy's and random's global generators: leave them as they were
    np_state, py_state = np.random.get_state(), random.getstate()
    try:
        d = mdata.make_dataset(args)
    finally:
        np.random.set_state(np_state)
        random.setstate(py_state)
    x = np.concatenate([d["x"], d["x_test"]]).astype(np.float32)  # (N, 40)
    y = np.concatenate([d["y"], d["y_test"]]).astype(np.int64)  # (N,)
    x.setflags(write=False)
    y.setflags(write=False)
    return x, y


def generate_mnist1d(num_samples: int = 5000, data_seed: int = 42) -> tuple[np.ndarray, np.ndarray]:
    """All ``num_samples`` sequences ``(N, 40)`` float32 and labels ``(N,)`` of
    ``mnist1d.data.make_dataset`` with its default arguments (the package's train rows then its
    test rows); cached per process, read-only arrays."""
    check_int("num_samples", num_samples, 10)
    return _generate(num_samples, check_seed(data_seed, "data_seed"))


def load_mnist1d_data(
    seed: int = 0,
    holdout_classes: Iterable[int] = (8, 9),
    val_fraction: float = 0.15,
    test_fraction: float = 0.2,
    num_samples: int = 5000,
    data_seed: int = 42,
) -> Mnist1dData:
    """MNIST-1D with a seeded stratified split (``seed``) and ``holdout_classes`` kept aside as
    OOD, like :func:`~bayesattn.data.digits.load_digits_data`; the sequences themselves are the
    package's (``num_samples``, ``data_seed``).

    Shape:
        Returns :class:`Mnist1dData` with sequences ``(N, 40)`` and labels ``(N,)``.
    """
    seed = check_seed(seed)
    holdout = check_holdout_classes(holdout_classes)
    x, y = generate_mnist1d(num_samples, data_seed)
    split = holdout_split_indices(y, holdout, seed, val_fraction, test_fraction)
    return data_from_split(x, y, split, seed, Mnist1dData)
