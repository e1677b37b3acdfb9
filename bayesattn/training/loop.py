"""The epoch loop of :class:`~bayesattn.training.trainer.Trainer`: :func:`train_epochs`, which
runs epochs until ``epochs``, ``max_steps`` or early stopping, recording each in the history. It
advances the trainer's :class:`~bayesattn.training.state.TrainerState` (its one owner) and calls
the trainer for the steps, validation and checkpoints (:class:`LoopOwner`)."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any, Protocol

from torch import Tensor

from ..nn.networks import BayesianNetwork
from .checks import check_data
from .data import DataSource, TensorSource
from .data import fork_rng as _fork_rng
from .objective import predictive_scores
from .state import EpochState, TrainerState

__all__ = ["EpochState", "batch_hits", "train_epochs", "epoch_record"]


def batch_hits(
    net: BayesianNetwork, logits: Tensor, xb: Tensor, yb: Tensor | None
) -> tuple[float, float]:
    """Correct predictions and predictions counted of a batch's logits ``(*P, B, ...)``
    (particles averaged in the predictive; token-level, padding ignored, for sequences)."""
    targets, mask, _ = net.targets(xb, yb)
    if targets is None:
        raise ValueError(
            f"{type(net).__name__}.targets(x, y) gave no targets: accuracy needs labels"
        )
    hit = predictive_scores(logits, targets.dim()).argmax(-1) == targets
    if mask is not None:
        return float((hit & mask).sum()), float(mask.sum())
    return float(hit.sum()), float(hit.numel())


class LoopOwner(Protocol):
    """What the loop calls: a :class:`~bayesattn.training.trainer.Trainer` (its state is
    ``state``, the one :class:`~bayesattn.training.state.TrainerState`)."""

    state: TrainerState

    def train_step(self, xb: Tensor, yb: Tensor | None) -> tuple[float, Tensor]: ...
    def evaluate(self, data: Any, name: str = ...) -> dict[str, float]: ...
    def beta(self, step: int | None = ...) -> float: ...
    def lr_at(self, step: int | None = ...) -> float: ...
    def save_checkpoint(self, path: str | Path) -> Path: ...


def train_epochs(
    tr: LoopOwner, src: DataSource, val_data: Any, checkpoint_path: Path | None
) -> None:
    """The epoch loop, under a progress bar, until ``epochs``, ``max_steps`` or early
    stopping."""
    c = tr.state.config
    nb = src.batches_per_epoch()
    exact_nb = nb if src.source_type != "stream" else None  # a stream ends when it ends
    max_steps = c.max_steps if c.max_steps is not None else math.inf
    total = min(c.epochs * nb, max_steps) - tr.state.step if nb is not None else max_steps
    from tqdm.auto import tqdm

    bar = tqdm(
        total=None if math.isinf(total) else max(0, int(total)),
        disable=not c.progress,
        desc=c.method,
        leave=False,
    )
    tr.state.network.train()
    try:
        while tr.state.epoch < c.epochs and tr.state.step < max_steps and not tr.state.history.stopped_early:
            if not _train_epoch(tr, src, bar, max_steps, exact_nb):
                break  # stopped mid-epoch by max_steps
            _close_epoch(tr, val_data, checkpoint_path, max_steps)
    finally:
        bar.close()


def _train_epoch(
    tr: LoopOwner, src: DataSource, bar: Any, max_steps: float, exact_nb: int | None
) -> bool:
    """Train on the rest of the open epoch (opening the next one if none is open): True when
    the epoch's data ran out, False when ``max_steps`` stopped it before its end."""
    es = tr.state.epoch_state
    if not es.open:
        es.begin(src.plan(tr.state.generator, tr.state.epoch))
    batches = src.batches(es.plan(), es.pos)
    while True:
        if tr.state.step >= max_steps:  # does the epoch end here too?
            if exact_nb is not None:
                return es.pos >= exact_nb
            with _fork_rng():
                return next(batches, None) is None
        batch = next(batches, None)
        if batch is None:
            return True
        _train_batch(tr, src, *batch, bar)


def _train_batch(tr: LoopOwner, src: DataSource, xb: Tensor, yb: Tensor | None, bar: Any) -> None:
    """One step on a batch of the open epoch (validated first unless the data is in memory,
    where it was validated in full), added to the epoch's running record."""
    es = tr.state.epoch_state
    if not isinstance(src, TensorSource):
        check_data(tr.state.network, xb, yb, f"train_data (epoch {tr.state.epoch + 1}, batch {es.pos})")
    xb = xb.to(tr.state.device)
    yb = None if yb is None else yb.to(tr.state.device)
    t0 = time.perf_counter()
    loss, logits = tr.train_step(xb, yb)
    seconds = time.perf_counter() - t0
    if not math.isfinite(loss):
        raise FloatingPointError(
            f"training loss became {loss} at step {tr.state.step} (epoch "
            f"{tr.state.epoch + 1}); lower lr, enable clip_norm or anneal the KL"
        )
    es.add(loss, *batch_hits(tr.state.network, logits, xb, yb), seconds)
    a = es.accum
    bar.update(1)
    bar.set_postfix(
        epoch=tr.state.epoch + 1,
        loss=f"{a['loss'] / a['batches']:.4g}",
        acc=f"{a['correct'] / max(a['count'], 1):.3f}",
        refresh=False,
    )


def epoch_record(tr: LoopOwner, val: Any, evaluate: bool) -> dict[str, Any]:
    """The record of the current (open) epoch, evaluated on ``val`` when asked."""
    a = tr.state.epoch_state.accum
    last = max(tr.state.step - 1, 0)
    rec: dict[str, Any] = {
        "epoch": tr.state.epoch + 1,
        "step": tr.state.step,
        "train_loss": a["loss"] / max(a["batches"], 1.0),
        "train_acc": a["correct"] / max(a["count"], 1.0),
        "val_loss": None,
        "val_acc": None,
        "val_nll": None,
        "val_ece": None,
        "lr": tr.lr_at(last),
        "beta": tr.beta(last),
        "seconds": a["seconds"],
    }
    if val is not None and evaluate:
        m = tr.evaluate(val, "val_data")
        rec.update(val_loss=m["loss"], val_acc=m["accuracy"], val_nll=m["nll"], val_ece=m["ece"])
    return rec


def _close_epoch(
    tr: LoopOwner, val_data: Any, checkpoint_path: Path | None, max_steps: float
) -> None:
    """Record the finished epoch (evaluated every ``eval_every`` epochs and after the last),
    track early stopping and write the checkpoint."""
    c = tr.state.config
    if tr.state.epoch_state.pos == 0:
        raise ValueError(f"train_data yielded no batch in epoch {tr.state.epoch + 1}")
    last = tr.state.epoch + 1 == c.epochs or tr.state.step >= max_steps
    rec = epoch_record(tr, val_data, (tr.state.epoch + 1) % c.eval_every == 0 or last)
    if rec["val_loss"] is not None and tr.state.early_stopping.update(
        rec["val_loss"], tr.state.epoch + 1, tr.state.history, tr.state.network
    ):
        tr.state.history.stopped_early = True
    tr.state.history.append(**rec)
    tr.state.epoch += 1
    tr.state.epoch_state.close()
    if checkpoint_path is not None:
        tr.save_checkpoint(checkpoint_path)
