"""Seeded train / val / test splits of a :class:`~bayesattn.data.sequences.SequenceTask`."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from .._validation import check_seed, torch_generator
from .sequences import SequenceTask

__all__ = ["train_val_test_split"]


def train_val_test_split(
    task: SequenceTask,
    fractions: Sequence[float] = (0.8, 0.1, 0.1),
    seed: int = 0,
) -> tuple[SequenceTask, SequenceTask, SequenceTask]:
    """Seeded random split of a task into train / val / test tasks.

    Sizes are ``round(f_val * N)`` and ``round(f_test * N)``, train gets the rest.
    Vocabularies, alignments and texts follow their rows.

    Shape:
        Returns three tasks whose row counts sum to ``N``.
    """
    if not isinstance(task, SequenceTask):
        raise TypeError(f"task must be a SequenceTask, got {type(task).__name__}")
    if isinstance(fractions, str) or len(fractions) != 3:
        raise ValueError(f"fractions must be 3 numbers (train, val, test), got {fractions!r}")
    fr = [float(f) for f in fractions]
    if any(f < 0 for f in fr) or not math.isclose(sum(fr), 1.0, abs_tol=1e-6):
        raise ValueError(f"fractions must be non-negative and sum to 1, got {tuple(fractions)!r}")
    seed = check_seed(seed)
    n = len(task)
    n_val = int(round(fr[1] * n))
    n_test = int(round(fr[2] * n))
    n_train = n - n_val - n_test
    if n_train < 0:
        raise ValueError(f"fractions={tuple(fractions)!r} leave no training rows for N={n}")
    perm = torch.randperm(n, generator=torch_generator(seed))
    return (
        task.subset(perm[:n_train]),
        task.subset(perm[n_train : n_train + n_val]),
        task.subset(perm[n_train + n_val :]),
    )
