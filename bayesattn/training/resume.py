"""A trainer's whole state as plain containers and tensors (:func:`trainer_state`) and back
(:func:`restore_trainer_state`): what a checkpoint holds so that a resumed run continues bit for
bit (network, optimiser and schedule, counters, the open epoch's data order and position,
history, early stopping, every RNG)."""

from __future__ import annotations

import copy
from typing import Any

from .checkpoint import (
    CheckpointError,
    check_state_fits,
    checkpoint_header,
    rng_state,
    set_rng_state,
    upgrade_state,
)
from .history import History
from .state import TrainerState

__all__ = ["trainer_state", "restore_trainer_state"]


def trainer_state(tr: TrainerState) -> dict[str, Any]:
    """Everything needed to continue exactly (see the module docstring)."""
    assert tr.optimisation is not None
    c = tr.config
    opt_state, sched_state = tr.optimisation.state_dict()
    return {
        **checkpoint_header(),
        "method": c.method,
        "config": c.to_dict(),
        "network_class": type(tr.network).__name__,
        "network": {k: v.detach().cpu().clone() for k, v in tr.network.state_dict().items()},
        "optimizer": copy.deepcopy(opt_state),
        "scheduler": copy.deepcopy(sched_state),
        "step": tr.step,
        "epoch": tr.epoch,
        "num_data": tr.num_data,
        "decay_steps": tr.optimisation.decay_steps,
        **tr.epoch_state.state_dict(),
        "data": None if tr.data is None else tr.data.describe(),
        "history": tr.history.to_dict(),
        "early_stopping": tr.early_stopping.state_dict(),
        "rng": rng_state(tr.generator),
    }


def restore_trainer_state(tr: TrainerState, state: dict[str, Any], where: str) -> None:
    """Restore a :func:`trainer_state` (after set-up); checked to fit before anything is
    modified, else :class:`CheckpointError` naming ``where``."""
    assert tr.optimisation is not None
    opt = tr.optimisation
    state = upgrade_state(state, tr.network.state_dict().keys(), tr.param_names)
    check_state_fits(
        state,
        where=where,
        config=tr.config,
        data=None if tr.data is None else tr.data.describe(),
        num_data=tr.num_data,
        network=tr.network,
        optimizer=opt.optimizer,
        param_names=tr.param_names,
    )
    try:
        tr.network.load_state_dict(state["network"], strict=True)
        opt.load_state_dict(state["optimizer"], state["scheduler"])
        tr.step = int(state["step"])
        tr.epoch = int(state["epoch"])
        opt.decay_steps = int(state["decay_steps"])
        tr.epoch_state.load_state_dict(state)
        tr.history = History.from_dict(state["history"])
        tr.early_stopping.load_state_dict(state["early_stopping"])
        set_rng_state(state["rng"], tr.generator)
    except (KeyError, TypeError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"checkpoint {where} could not be restored: {e}") from e
