"""The epoch loop of :class:`~bayesattn.training.trainer.Trainer`: :class:`EpochState` (the open
epoch's data order, position and running record, saved in checkpoints so that a resumed run
continues the epoch exactly) and :func:`train_epochs`, which runs epochs until ``epochs``,
``max_steps`` or early stopping, recording each in the history."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import Tensor

from ..nn.networks import BayesianNetwork
from .checks import check_data
from .config import TrainConfig
from .data import DataSource, TensorSource
from .data import fork_rng as _fork_rng
from .early_stopping import EarlyStopping
from .history import History
from .objective import predictive_scores

__all__ = ["EpochState", "batch_hits", "train_epochs", "epoch_record"]


def _new_accum() -> dict[str, float]:
    return {"loss": 0.0, "batches": 0.0, "correct": 0.0, "count": 0.0, "seconds": 0.0}


@dataclass
class EpochState:
    """The open epoch: its data order ``perm`` ``(N,)`` (``None`` for streams) and batch sizes
    (when a ``DataLoader`` sets them), whether one is ``open``, the batches already taken
    (``pos``) and the running sums of its record (``accum``)."""

    perm: Tensor | None = None
    batch_sizes: Tensor | None = None
    open: bool = False
    pos: int = 0
    accum: dict[str, float] = field(default_factory=_new_accum)

    def begin(self, plan: tuple[Tensor, Tensor | None] | None) -> None:
        """Open an epoch with ``plan`` (its order and batch sizes; ``None`` for a stream)."""
        self.perm, self.batch_sizes = plan if plan is not None else (None, None)
        self.pos, self.accum, self.open = 0, _new_accum(), True

    def plan(self) -> tuple[Tensor, Tensor | None] | None:
        return None if self.perm is None else (self.perm, self.batch_sizes)

    def close(self) -> None:
        self.perm, self.batch_sizes, self.open = None, None, False

    def add(self, loss: float, correct: float, count: float, seconds: float) -> None:
        a = self.accum
        a["loss"] += loss
        a["batches"] += 1
        a["correct"] += correct
        a["count"] += count
        a["seconds"] += seconds
        self.pos += 1

    def state_dict(self) -> dict[str, Any]:
        return {
            "perm": None if self.perm is None else self.perm.clone(),
            "batch_sizes": None if self.batch_sizes is None else self.batch_sizes.clone(),
            "open": self.open,
            "pos": self.pos,
            "accum": dict(self.accum),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.perm = state["perm"]
        self.batch_sizes = state.get("batch_sizes")
        self.open = bool(state.get("open", self.perm is not None))
        self.pos = int(state["pos"])
        self.accum = {k: float(v) for k, v in state["accum"].items()}


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
    """What the loop reads and advances: a :class:`~bayesattn.training.trainer.Trainer`."""

    config: TrainConfig
    network: BayesianNetwork
    device: torch.device
    history: History
    step: int
    epoch: int
    epoch_state: EpochState
    early_stopping: EarlyStopping
    generator: torch.Generator

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
    c = tr.config
    nb = src.batches_per_epoch()
    exact_nb = nb if src.source_type != "stream" else None  # a stream ends when it ends
    max_steps = c.max_steps if c.max_steps is not None else math.inf
    total = min(c.epochs * nb, max_steps) - tr.step if nb is not None else max_steps
    from tqdm.auto import tqdm

    bar = tqdm(
        total=None if math.isinf(total) else max(0, int(total)),
        disable=not c.progress,
        desc=c.method,
        leave=False,
    )
    tr.network.train()
    try:
        while tr.epoch < c.epochs and tr.step < max_steps and not tr.history.stopped_early:
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
    es = tr.epoch_state
    if not es.open:
        es.begin(src.plan(tr.generator, tr.epoch))
    batches = src.batches(es.plan(), es.pos)
    while True:
        if tr.step >= max_steps:  # does the epoch end here too?
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
    es = tr.epoch_state
    if not isinstance(src, TensorSource):
        check_data(tr.network, xb, yb, f"train_data (epoch {tr.epoch + 1}, batch {es.pos})")
    xb = xb.to(tr.device)
    yb = None if yb is None else yb.to(tr.device)
    t0 = time.perf_counter()
    loss, logits = tr.train_step(xb, yb)
    seconds = time.perf_counter() - t0
    if not math.isfinite(loss):
        raise FloatingPointError(
            f"training loss became {loss} at step {tr.step} (epoch "
            f"{tr.epoch + 1}); lower lr, enable clip_norm or anneal the KL"
        )
    es.add(loss, *batch_hits(tr.network, logits, xb, yb), seconds)
    a = es.accum
    bar.update(1)
    bar.set_postfix(
        epoch=tr.epoch + 1,
        loss=f"{a['loss'] / a['batches']:.4g}",
        acc=f"{a['correct'] / max(a['count'], 1):.3f}",
        refresh=False,
    )


def epoch_record(tr: LoopOwner, val: Any, evaluate: bool) -> dict[str, Any]:
    """The record of the current (open) epoch, evaluated on ``val`` when asked."""
    a = tr.epoch_state.accum
    last = max(tr.step - 1, 0)
    rec: dict[str, Any] = {
        "epoch": tr.epoch + 1,
        "step": tr.step,
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
    c = tr.config
    if tr.epoch_state.pos == 0:
        raise ValueError(f"train_data yielded no batch in epoch {tr.epoch + 1}")
    last = tr.epoch + 1 == c.epochs or tr.step >= max_steps
    rec = epoch_record(tr, val_data, (tr.epoch + 1) % c.eval_every == 0 or last)
    if rec["val_loss"] is not None and tr.early_stopping.update(
        rec["val_loss"], tr.epoch + 1, tr.history, tr.network
    ):
        tr.history.stopped_early = True
    tr.history.append(**rec)
    tr.epoch += 1
    tr.epoch_state.close()
    if checkpoint_path is not None:
        tr.save_checkpoint(checkpoint_path)
