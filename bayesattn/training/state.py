"""A trainer's state, owned in one place: :class:`TrainerState` (everything
:class:`~bayesattn.training.trainer.Trainer` advances while it trains, what its checkpoints save)
and :class:`EpochState` (the open epoch's data order, position and running record, saved so
that a resumed run continues the epoch exactly). The epoch loop
(:mod:`~bayesattn.training.loop`) and the saved state (:mod:`~bayesattn.training.resume`) read
and write a :class:`TrainerState`; the trainer's attributes (``step``, ``history``, ...) are
views of it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar, overload

import torch
from torch import Tensor

from .._validation import torch_generator
from ..nn.networks import BayesianNetwork
from .config import TrainConfig
from .data import DataSource
from .early_stopping import EarlyStopping
from .history import History
from .optimisation import Optimisation

__all__ = ["EpochState", "TrainerState", "StateField"]


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


@dataclass
class TrainerState:
    """Everything a trainer advances while it trains (one owner; the trainer's attributes are
    views of it, :class:`StateField`).

    ``step``: optimiser steps taken; ``epoch``: completed epochs; ``history``, ``epoch_state``
    (the open epoch), ``early_stopping``; ``generator``: the data order (seeded by
    ``config.seed``); after set-up, ``optimisation``, ``num_data`` (:math:`N`), ``data`` (the
    training data source) and ``param_names`` (the Pyro parameter names of model and guide).
    """

    config: TrainConfig
    network: BayesianNetwork
    device: torch.device
    early_stopping: EarlyStopping
    generator: torch.Generator
    history: History = field(default_factory=History)
    step: int = 0
    epoch: int = 0
    epoch_state: EpochState = field(default_factory=EpochState)
    optimisation: Optimisation | None = None
    num_data: int | None = None
    data: DataSource | None = None
    param_names: list[str] = field(default_factory=list)

    @classmethod
    def fresh(cls, network: BayesianNetwork, config: TrainConfig) -> TrainerState:
        """The state of a trainer that has not trained yet."""
        return cls(
            config=config,
            network=network,
            device=torch.device(config.device),
            early_stopping=EarlyStopping(config),
            generator=torch_generator(config.seed),
        )


T = TypeVar("T")


class StateField(Generic[T]):
    """A trainer attribute that reads and writes the field of the same name of its
    :class:`TrainerState` (``self.state``)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, objtype: type | None = None) -> StateField[T]: ...
    @overload
    def __get__(self, obj: object, objtype: type | None = None) -> T: ...
    def __get__(self, obj: Any, objtype: type | None = None) -> Any:
        return self if obj is None else getattr(obj.state, self.name)

    def __set__(self, obj: Any, value: T) -> None:
        setattr(obj.state, self.name, value)
