r"""Learning-rate schedules from :mod:`torch.optim.lr_scheduler`: warm-up, then a decay.

:func:`lr_scheduler` composes stock torch schedulers with :class:`~torch.optim.lr_scheduler.SequentialLR`
(warm-up :class:`~torch.optim.lr_scheduler.LinearLR`, then
:class:`~torch.optim.lr_scheduler.CosineAnnealingLR`, :class:`~torch.optim.lr_scheduler.LinearLR`,
:class:`~torch.optim.lr_scheduler.StepLR` or nothing, then a
:class:`~torch.optim.lr_scheduler.ConstantLR` floor at ``min_lr_ratio``). Call its ``step()`` once
after every optimiser step; its ``state_dict()`` is saved in checkpoints. The learning rate used at
(0-based) step :math:`s` is ``lr · lr_factor(s, ...)``, the closed form:

Warm-up :math:`(s + 1)/W` for :math:`s < W`; then, with :math:`t = s - W`,
:math:`D = \max(1, T - W)`, :math:`p = \min(1, t/D)` and :math:`r` = ``min_lr_ratio``:

=========  ================================================================
cosine     :math:`r + (1 - r)\,\tfrac12(1 + \cos\pi p)`
linear     :math:`1 - (1 - r)\,p`
step       :math:`\max(r, \gamma^{\lfloor t/k\rfloor})`
none       :math:`1`
=========  ================================================================

The torch schedulers update the rate recursively, so they agree with the closed form to float
round-off (the tests compare them step by step).

Example:
    >>> opt = torch.optim.AdamW(torch.nn.Linear(2, 2).parameters(), lr=0.1)
    >>> sched = lr_scheduler(opt, warmup_steps=2, decay="linear", decay_steps=4)
    >>> lrs = []
    >>> for _ in range(6):
    ...     lrs.append(round(opt.param_groups[0]["lr"], 4)); opt.step(); sched.step()
    >>> lrs
    [0.05, 0.1, 0.1, 0.05, 0.0, 0.0]
"""

from __future__ import annotations

import itertools
import math
from typing import Any, Literal, get_args

import torch
from torch.optim.lr_scheduler import (
    ConstantLR,
    CosineAnnealingLR,
    LinearLR,
    LRScheduler,
    SequentialLR,
    StepLR,
)

from .._validation import check_int

__all__ = ["LR_DECAYS", "lr_factor", "lr_scheduler"]

#: the learning-rate decay after warm-up (``TrainConfig.lr_decay``)
LrDecay = Literal["cosine", "linear", "step", "none"]
LR_DECAYS: tuple[LrDecay, ...] = get_args(LrDecay)

# a ConstantLR that never switches back: the floor of the schedule (steps are counted in ints)
_FOREVER = 2**62


def lr_factor(
    step: int,
    *,
    warmup_steps: int = 0,
    decay: LrDecay = "cosine",
    decay_steps: int = 1,
    min_lr_ratio: float = 0.0,
    step_size: int = 1000,
    gamma: float = 0.1,
) -> float:
    r"""Multiplier of the peak LR at (0-based) step ``step``: the closed form of
    :func:`lr_scheduler` (see the module docstring).

    Warm-up: :math:`(s + 1)/W` for :math:`s < W`. Then, with :math:`p = \min(1, (s - W)/(T - W))`:
    cosine :math:`r + (1 - r)\tfrac12(1 + \cos\pi p)`, linear :math:`1 - (1 - r)p`, step
    :math:`\max(r, \gamma^{\lfloor (s - W)/k\rfloor})`, none 1 (:math:`r` = ``min_lr_ratio``,
    :math:`T` = ``decay_steps``).
    """
    if warmup_steps and step < warmup_steps:
        return (step + 1) / warmup_steps
    t = step - warmup_steps
    if decay == "none":
        return 1.0
    if decay == "step":
        return max(min_lr_ratio, gamma ** (t // step_size))
    p = min(1.0, t / max(1, decay_steps - warmup_steps))
    if decay == "cosine":
        return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * p))
    if decay == "linear":
        return 1.0 - (1.0 - min_lr_ratio) * p
    raise ValueError(f"decay must be one of {LR_DECAYS}; got {decay!r}")


def _steps_to_floor(gamma: float, min_lr_ratio: float) -> int | None:
    """Smallest ``j`` with ``gamma**j < min_lr_ratio`` (``None``: never)."""
    if min_lr_ratio <= 0.0 or gamma >= 1.0:
        return None
    j = 0
    while gamma**j >= min_lr_ratio:
        j += 1
    return j


def lr_scheduler(
    optimizer: torch.optim.Optimizer,
    *,
    warmup_steps: int = 0,
    decay: LrDecay = "cosine",
    decay_steps: int = 1,
    min_lr_ratio: float = 0.0,
    step_size: int = 1000,
    gamma: float = 0.1,
) -> LRScheduler:
    r"""Warm-up then decay, as stock :mod:`torch.optim.lr_scheduler` objects.

    Phases (each a torch scheduler, chained by ``SequentialLR`` at step milestones):

    1. ``warmup_steps`` :math:`W > 0`: ``LinearLR`` from :math:`1/W` to 1 (step :math:`s` uses
       :math:`(s+1)/W`);
    2. ``decay``: ``"cosine"`` → ``CosineAnnealingLR(T_max=D, eta_min=r·lr)`` for
       :math:`D = \max(1, T - W)` steps, then ``ConstantLR(r)``; ``"linear"`` →
       ``LinearLR(1 → r, total_iters=D)`` (which stays at :math:`r`); ``"step"`` →
       ``StepLR(step_size, gamma)`` until it would fall below :math:`r`, then ``ConstantLR(r)``;
       ``"none"`` → ``ConstantLR(1)``.

    Args:
        optimizer: its ``lr`` (per parameter group) is the peak learning rate.
        warmup_steps, decay, decay_steps, min_lr_ratio, step_size, gamma: as
            :class:`bayesattn.training.TrainConfig` (``decay_steps`` is :math:`T`, the total
            length of warm-up plus decay).

    Returns:
        a ``SequentialLR`` (or a single scheduler when there is one phase); call ``step()``
        after every ``optimizer.step()``.
    """
    _check_schedule(decay, warmup_steps, decay_steps, min_lr_ratio, step_size, gamma)
    W, r = warmup_steps, float(min_lr_ratio)
    # phases (a scheduler and its length; None: the last) chained at their milestones
    phases: list[tuple[LRScheduler, int | None]] = []
    if W > 0:
        # factor (i + 1)/W at step i; total_iters >= 1 keeps LinearLR's formula defined at W = 1
        warm = LinearLR(optimizer, start_factor=1.0 / W, end_factor=1.0, total_iters=max(W - 1, 1))
        phases.append((warm, W))
    phases += _decay_phases(optimizer, decay, max(1, decay_steps - W), r, step_size, gamma)
    if len(phases) == 1:
        return phases[0][0]
    milestones = list(itertools.accumulate(n for _, n in phases[:-1] if n is not None))
    return SequentialLR(optimizer, [p for p, _ in phases], milestones)


def _check_schedule(
    decay: Any, warmup_steps: int, decay_steps: int, min_lr_ratio: float, step_size: int,
    gamma: float,
) -> None:
    """The arguments of :func:`lr_scheduler`, checked (``ValueError``/``TypeError`` naming one)."""
    if decay not in LR_DECAYS:
        raise ValueError(f"decay must be one of {LR_DECAYS}; got {decay!r}")
    for name, v in (("warmup_steps", warmup_steps), ("decay_steps", decay_steps)):
        check_int(name, v, 0)
    check_int("step_size", step_size, 1)
    if not 0.0 <= float(min_lr_ratio) <= 1.0:
        raise ValueError(f"min_lr_ratio must be in [0, 1]; got {min_lr_ratio!r}")
    if not 0.0 < float(gamma) <= 1.0:
        raise ValueError(f"gamma must be in (0, 1]; got {gamma!r}")


def _decay_phases(
    optimizer: torch.optim.Optimizer, decay: LrDecay, D: int, r: float, step_size: int,
    gamma: float,
) -> list[tuple[LRScheduler, int | None]]:
    """The decay after warm-up (:func:`lr_scheduler`'s phase 2): schedulers and their lengths
    (``None``: runs to the end), over ``D`` steps down to the ratio ``r``."""
    if decay == "cosine":
        base = [
            g["lr"] if "initial_lr" not in g else g["initial_lr"] for g in optimizer.param_groups
        ]
        if len({float(b) for b in base}) > 1:
            raise ValueError("cosine decay needs one peak lr for every parameter group")
        return [
            (CosineAnnealingLR(optimizer, T_max=D, eta_min=r * float(base[0])), D),
            (ConstantLR(optimizer, factor=r, total_iters=_FOREVER), None),
        ]
    if decay == "linear":
        return [(LinearLR(optimizer, start_factor=1.0, end_factor=r, total_iters=D), None)]
    if decay == "step":
        j = _steps_to_floor(float(gamma), r)
        if j is None:
            return [(StepLR(optimizer, step_size=step_size, gamma=gamma), None)]
        return [
            (StepLR(optimizer, step_size=step_size, gamma=gamma), j * step_size),
            (ConstantLR(optimizer, factor=r, total_iters=_FOREVER), None),
        ]
    return [(ConstantLR(optimizer, factor=1.0, total_iters=_FOREVER), None)]
