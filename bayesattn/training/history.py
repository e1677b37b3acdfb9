"""The per-epoch training record, :class:`History` (its figure is drawn by
:func:`bayesattn.training.curves.plot_history`)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["History"]

_HISTORY_KEYS = (
    "epoch",
    "step",
    "train_loss",
    "train_acc",
    "val_loss",
    "val_acc",
    "val_nll",
    "val_ece",
    "lr",
    "beta",
    "seconds",
)


@dataclass
class History:
    """Per-epoch training record.

    Lists, one entry per (possibly partial, when ``max_steps`` stops mid-epoch) epoch:
    ``epoch`` (1-based), ``step`` (optimiser steps so far), ``train_loss`` (β-weighted negative ELBO
    per training example, averaged over the epoch's minibatches), ``train_acc`` (accuracy of the
    sampled-attention predictions seen in training; token-level, padding ignored, for sequence
    models), ``val_loss`` (``TrainConfig.val_loss``), ``val_acc``, ``val_nll``, ``val_ece``
    (posterior predictive; see :mod:`bayesattn.training.validation`; all ``None`` when not
    evaluated), ``lr`` and ``beta`` (of the epoch's last step), ``seconds`` (wall time of the
    epoch's steps). ``stopped_early``, ``best_epoch`` and ``best_val_loss`` summarise early
    stopping.
    """

    epoch: list[int] = field(default_factory=list)
    step: list[int] = field(default_factory=list)
    train_loss: list[float] = field(default_factory=list)
    train_acc: list[float] = field(default_factory=list)
    val_loss: list[float | None] = field(default_factory=list)
    val_acc: list[float | None] = field(default_factory=list)
    val_nll: list[float | None] = field(default_factory=list)
    val_ece: list[float | None] = field(default_factory=list)
    lr: list[float] = field(default_factory=list)
    beta: list[float] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    stopped_early: bool = False
    best_epoch: int | None = None
    best_val_loss: float | None = None

    def __len__(self) -> int:
        return len(self.epoch)

    def append(self, **record: Any) -> None:
        missing = set(_HISTORY_KEYS) - set(record)
        if missing:
            raise ValueError(f"history record is missing {sorted(missing)}")
        for k in _HISTORY_KEYS:
            getattr(self, k).append(record[k])

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of lists and numbers (JSON- and ``weights_only``-safe)."""
        d: dict[str, Any] = {k: list(getattr(self, k)) for k in _HISTORY_KEYS}
        d.update(
            stopped_early=self.stopped_early,
            best_epoch=self.best_epoch,
            best_val_loss=self.best_val_loss,
        )
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> History:
        n = len(d.get("epoch", []))
        # a history saved before val_nll/val_ece existed: those curves are unknown (None)
        curves: dict[str, Any] = {k: list(d.get(k, [None] * n)) for k in _HISTORY_KEYS}
        h = cls(**curves)
        h.stopped_early = bool(d.get("stopped_early", False))
        h.best_epoch = d.get("best_epoch")
        h.best_val_loss = d.get("best_val_loss")
        return h

    def plot(self, path: str | os.PathLike | None = None) -> Figure:
        """Loss, accuracy and LR/β curves as a :class:`matplotlib.figure.Figure` (saved as an
        image, e.g. PNG, when ``path`` is given): :func:`bayesattn.training.curves.plot_history`.
        matplotlib is imported lazily."""
        from .curves import plot_history

        return plot_history(self, path)
