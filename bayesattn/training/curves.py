"""The figure of a training :class:`~bayesattn.training.history.History` (what
:meth:`~bayesattn.training.history.History.plot` and
:func:`bayesattn.plots.plot_history` draw). matplotlib is imported lazily."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["plot_history"]

PathLike = str | os.PathLike[str]


class Curves(Protocol):
    """The curves drawn: a :class:`~bayesattn.training.history.History` (read only)."""

    @property
    def epoch(self) -> list[int]: ...
    @property
    def train_loss(self) -> list[float]: ...
    @property
    def train_acc(self) -> list[float]: ...
    @property
    def val_loss(self) -> list[float | None]: ...
    @property
    def val_acc(self) -> list[float | None]: ...
    @property
    def lr(self) -> list[float]: ...
    @property
    def beta(self) -> list[float]: ...
    @property
    def best_epoch(self) -> int | None: ...


def plot_history(history: Curves, path: PathLike | None = None) -> Figure:
    """Training curves of a :class:`~bayesattn.training.history.History`: loss per example (train
    −ELBO/N and validation), accuracy, and the learning-rate and KL-weight β schedules, one point
    per epoch, with the best epoch marked. Saved as an image (format from the file name,
    ``dpi=100``) when ``path`` is given. matplotlib is imported lazily."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 3.4), layout="constrained")
    ax_loss, ax_acc, ax_lr = fig.subplots(1, 3)
    ep = history.epoch

    def plot_opt(ax: Axes, values: Sequence[float | None], label: str, **kw: Any) -> None:
        pts = [(e, v) for e, v in zip(ep, values, strict=True) if v is not None]
        if pts:
            xs, ys = zip(*pts, strict=True)
            ax.plot(xs, ys, marker="o", ms=3, label=label, **kw)

    plot_opt(ax_loss, history.train_loss, "train (−ELBO/N)")
    plot_opt(ax_loss, history.val_loss, "validation")
    ax_loss.set(title="loss per example", xlabel="epoch")
    plot_opt(ax_acc, history.train_acc, "train")
    plot_opt(ax_acc, history.val_acc, "validation")
    ax_acc.set(title="accuracy", xlabel="epoch", ylim=(0, 1.02))
    if history.best_epoch is not None:
        for ax in (ax_loss, ax_acc):
            ax.axvline(history.best_epoch, color="grey", ls=":", lw=1, label="best")
    plot_opt(ax_lr, history.lr, "learning rate", color="C2")
    ax_lr.set(title="schedule", xlabel="epoch", ylabel="learning rate")
    ax_b = ax_lr.twinx()
    plot_opt(ax_b, history.beta, "KL weight β", color="C3")
    ax_b.set(ylabel="β", ylim=(0, 1.05))
    for ax in (ax_loss, ax_acc):
        if ax.has_data():
            ax.legend(fontsize=8)
    if path is not None:
        fig.savefig(path, dpi=100)
    return fig
