"""The optimiser side of a training step, one object per method: :class:`Optimisation` builds
``torch.optim.AdamW`` with the configured :func:`~bayesattn.training.schedules.lr_scheduler`
(hybrid) or a :class:`pyro.optim.PyroLRScheduler` over the same (SVI), clips the global gradient
norm, refuses a non-finite step and steps; its state goes into checkpoints."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import pyro
import pyro.optim
import torch
from torch import Tensor, nn

from .config import TrainConfig
from .schedules import lr_factor, lr_scheduler

__all__ = ["Optimisation", "schedule_args", "clip_gradients", "diverged_error"]


def schedule_args(config: TrainConfig, decay_steps: int | None) -> dict[str, Any]:
    """The configured schedule's arguments, shared by :func:`lr_factor` (closed form) and
    :func:`lr_scheduler` (torch's schedulers); ``decay_steps`` is the resolved schedule length."""
    c = config
    return dict(
        warmup_steps=c.warmup_steps,
        decay=c.lr_decay,
        decay_steps=decay_steps or c.decay_steps or 1,
        min_lr_ratio=c.min_lr_ratio,
        step_size=c.lr_step_size,
        gamma=c.lr_gamma,
    )


def clip_gradients(params: Iterable[Tensor], clip_norm: float | None) -> float:
    """Clip the global gradient norm of ``params`` to ``clip_norm`` (``None``: no clipping);
    returns the norm *before* clipping."""
    grads = [p for p in params if p.grad is not None]
    if clip_norm is not None:
        norm = torch.nn.utils.clip_grad_norm_(grads, clip_norm)
    else:
        norm = torch.nn.utils.get_total_norm([p.grad for p in grads if p.grad is not None])
    return float(norm)


def diverged_error(network: nn.Module, config: TrainConfig, where: str, detail: str) -> Exception:
    """The ``FloatingPointError`` of a diverged step (``where``: "step S (epoch E)"); drops
    every gradient of ``network`` so that nothing of the step is applied."""
    c = config
    for p in network.parameters():
        p.grad = None
    return FloatingPointError(
        f"training diverged at {where}: {detail}; this "
        "step was not applied, so the network keeps its last finite parameters. "
        f"Try a lower lr (now {c.lr:g}), clip_norm (now {c.clip_norm}), a longer "
        f"warmup_steps (now {c.warmup_steps}) or kl_anneal_steps (now {c.kl_anneal_steps}), "
        "or check the data for extreme values."
    )


def _nonfinite_detail(network: nn.Module, loss: float, norm: float | None) -> str | None:
    """``None`` when the loss and the gradient norm are finite, else what is not."""
    if math.isfinite(loss) and norm is not None and math.isfinite(norm):
        return None
    bad = [
        n
        for n, p in network.named_parameters()
        if p.grad is not None and not bool(torch.isfinite(p.grad).all())
    ]
    more = " …" if len(bad) > 5 else ""
    return f"loss {loss}, gradient norm {norm}" + (
        f", non-finite gradients in {bad[:5]}{more}" if bad else ""
    )


class Optimisation:
    """AdamW and the learning-rate schedule of one training method (see the module docstring).

    Attributes:
        optimizer: ``torch.optim.AdamW`` (hybrid; ``None`` with svi).
        scheduler: its ``LRScheduler`` (hybrid).
        pyro_optim: the ``pyro.optim.PyroLRScheduler`` (svi).
        last_grad_norm: global gradient norm of the last step *before* clipping.
    """

    def __init__(self, network: nn.Module, config: TrainConfig, decay_steps: int) -> None:
        self.config = config
        self.decay_steps = decay_steps
        self.last_grad_norm: float | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.scheduler: torch.optim.lr_scheduler.LRScheduler | None = None
        self.pyro_optim: pyro.optim.PyroLRScheduler | None = None
        c = config
        if c.method == "hybrid":
            self.optimizer = torch.optim.AdamW(
                network.parameters(), lr=c.lr, weight_decay=c.weight_decay
            )
            self.scheduler = self.make_scheduler(self.optimizer)
        else:
            self.pyro_optim = pyro.optim.PyroLRScheduler(
                self.make_scheduler,
                {
                    "optimizer": torch.optim.AdamW,
                    "optim_args": {"lr": c.lr, "weight_decay": c.weight_decay},
                },
            )

    def make_scheduler(
        self, optimizer: torch.optim.Optimizer
    ) -> torch.optim.lr_scheduler.LRScheduler:
        """The configured :func:`lr_scheduler` over ``optimizer``."""
        return lr_scheduler(optimizer, **schedule_args(self.config, self.decay_steps))

    def lr_factor(self, step: int) -> float:
        """The schedule's multiplier of the peak LR at (0-based) step ``step``."""
        return lr_factor(step, **schedule_args(self.config, self.decay_steps))

    def zero_grad(self) -> None:
        if self.optimizer is not None:
            self.optimizer.zero_grad(set_to_none=True)

    def step(self, network: nn.Module, params: list[Tensor], loss: float) -> str | None:
        """Clip, then step on ``params``' gradients (of the per-example ``loss``). A non-finite
        loss or gradient is refused: nothing is applied, the gradients are dropped, and the
        reason is returned (``None`` after a step)."""
        self.last_grad_norm = clip_gradients(params, self.config.clip_norm)
        detail = _nonfinite_detail(network, loss, self.last_grad_norm)
        if detail is not None:
            for p in params:
                p.grad = None
            return detail
        if self.optimizer is not None:
            assert self.scheduler is not None
            self.optimizer.step()
            self.scheduler.step()
        else:
            assert self.pyro_optim is not None
            self.pyro_optim(params)
            pyro.infer.util.zero_grads(set(params))
            self.pyro_optim.step()
        return None

    def state_dict(self) -> tuple[Any, Any]:
        """``(optimiser state, scheduler state)``: the Pyro optimiser's state per parameter
        name and ``None`` with svi."""
        if self.optimizer is not None:
            assert self.scheduler is not None
            return self.optimizer.state_dict(), self.scheduler.state_dict()
        assert self.pyro_optim is not None
        return self.pyro_optim.get_state(), None

    def load_state_dict(self, optimizer: Any, scheduler: Any) -> None:
        if self.optimizer is not None:
            assert self.scheduler is not None
            self.optimizer.load_state_dict(optimizer)
            self.scheduler.load_state_dict(scheduler)
        else:
            assert self.pyro_optim is not None
            self.pyro_optim.set_state(optimizer)  # consumed per parameter name
