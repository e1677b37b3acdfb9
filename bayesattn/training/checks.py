"""What ``fit`` checks before any step: the data against the network (errors name the argument),
the ``resume``/``checkpoint_path`` pair, and whether a forward-pass error is divergence."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..nn.networks import BayesianNetwork
from .checkpoint import prepare_checkpoint_path
from .config import TrainConfig
from .data import DataSource, TensorSource, as_tensors, iter_eval_batches
from .data import fork_rng as _fork_rng

__all__ = ["check_data", "check_fit_data", "check_val_data", "resume_args", "diverged_forward"]


def check_data(net: BayesianNetwork, x: Tensor, y: Tensor | None, name: str) -> None:
    """Validate a whole dataset (or batch) once, before any step; re-raise naming ``name``."""
    try:
        net.check_batch(x, y)
    except (ValueError, TypeError) as e:
        raise type(e)(f"{name}: {e}") from e
    try:
        targets = net.targets(x[:1], None if y is None else y[:1])[0]
    except (TypeError, ValueError, IndexError):
        targets = None
    if targets is None:
        raise ValueError(
            f"{name}: {type(net).__name__} needs targets y to train and evaluate; got y=None"
        )


def in_memory(data: Any) -> bool:
    """``data`` is tensors (a pair or a ``TensorDataset``): validated in full up front."""
    tud = torch.utils.data
    return isinstance(data, tud.TensorDataset) or not isinstance(
        data, (tud.DataLoader, tud.Dataset)
    )


def check_val_data(net: BayesianNetwork, val_data: Any, batch_size: int) -> None:
    """``val_data`` yields a valid first batch (RNG untouched); tensors are checked in full."""
    batches, _ = iter_eval_batches(val_data, "val_data", batch_size)
    with _fork_rng():
        first = next(batches, None)
    if first is None:
        raise ValueError("val_data is empty: it yields no batch")
    check_data(net, *first, "val_data")
    if isinstance(val_data, (tuple, list)) or not isinstance(
        val_data, (torch.utils.data.DataLoader, torch.utils.data.Dataset)
    ):
        check_data(net, *as_tensors(val_data, "val_data"), "val_data")


def check_fit_data(
    net: BayesianNetwork,
    config: TrainConfig,
    src: DataSource,
    val_data: Any,
    set_up_num_data: int | None,
) -> None:
    """Validate the training data (in full when in memory, else its first batch) and the
    validation data before any step; ``set_up_num_data``: the ``N`` of a trainer already set up
    (the data must have as many examples), ``None`` before set-up."""
    c = config
    if isinstance(src, TensorSource):
        check_data(net, src.x, src.y, "train_data")
    else:
        check_data(net, *src.first_batch(), "train_data (batch 0)")
    if val_data is not None:
        check_val_data(net, val_data, c.batch_size)
    elif c.early_stopping_patience is not None:
        raise ValueError(
            f"early_stopping_patience={c.early_stopping_patience} needs val_data "
            "(early stopping watches the validation loss); give val_data= or drop the "
            "patience"
        )
    if src.source_type in ("tensors", "dataset") and c.drop_last and (src.num_data or 0) < c.batch_size:
        raise ValueError(
            f"batch_size={c.batch_size} with drop_last=True leaves no batch for "
            f"{src.num_data} training examples"
        )
    if set_up_num_data is not None and set_up_num_data != src.num_data:
        raise ValueError(
            f"train_data has {src.num_data} examples; this trainer was set up with "
            f"{set_up_num_data}"
        )


def resume_args(
    checkpoint_path: str | os.PathLike | None, resume: bool | str
) -> tuple[Path | None, bool]:
    """Check ``resume`` against ``checkpoint_path`` (prepared for writing); ``"auto"``
    becomes whether the checkpoint exists."""
    if not isinstance(resume, bool) and resume != "auto":
        raise TypeError(f"resume must be True, False or 'auto'; got {resume!r}")
    if resume and checkpoint_path is None:
        raise ValueError(f"resume={resume!r} needs a checkpoint_path")
    path = None if checkpoint_path is None else prepare_checkpoint_path(checkpoint_path)
    if resume == "auto":
        assert path is not None
        resume = path.is_file()
    return path, bool(resume)


def diverged_forward(e: BaseException, xb: Tensor) -> bool:
    """A non-finite complaint from the forward pass on a finite batch: the model overflowed."""
    msg = str(e).lower()
    if not any(w in msg for w in ("finite", "nan", "inf")):
        return False
    return not xb.is_floating_point() or bool(torch.isfinite(xb).all())
