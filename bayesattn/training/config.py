"""Training options: :class:`TrainConfig` (validated on construction) and how ``fit``'s keyword
overrides are merged into it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal, get_args

import torch

from .._validation import check_int, check_real
from .schedules import LR_DECAYS, LrDecay

__all__ = ["TrainConfig", "TrainMethod", "METHODS", "ELBOS", "VAL_LOSSES"]

#: how the ELBO is optimised (``TrainConfig.method``)
TrainMethod = Literal["svi", "hybrid"]
METHODS: tuple[TrainMethod, ...] = get_args(TrainMethod)
#: the SVI objective: ``Trace_ELBO`` or ``TraceMeanField_ELBO`` (``TrainConfig.elbo``)
ElboKind = Literal["trace", "meanfield"]
ELBOS: tuple[ElboKind, ...] = get_args(ElboKind)
#: what validation reports as its loss (``TrainConfig.val_loss``)
ValLoss = Literal["nll", "elbo"]
VAL_LOSSES: tuple[ValLoss, ...] = get_args(ValLoss)


@dataclass
class TrainConfig:
    """Training options; every field is validated on construction (``ValueError`` naming it).

    Args:
        method: the training method, ``"hybrid"`` (one-pass ELBO with analytic KLs, AdamW) or
            ``"svi"`` (Pyro ELBO of ``model`` against ``guide``). A config saved before 0.3
            with the key ``"mode"`` still loads (:meth:`from_dict`).
        epochs: passes over the training data.
        max_steps: stop after this many optimiser steps in total (``None``: no cap). Only a
            stopping rule: the LR schedule is set by ``decay_steps``, so a run interrupted by
            ``max_steps`` and resumed reproduces the uninterrupted run.
        batch_size: examples per step (the last batch of an epoch may be smaller).
        lr: peak learning rate.
        weight_decay: decoupled (AdamW) weight decay, both methods.
        warmup_steps: linear warm-up, step ``s`` (0-based) uses ``lr·(s+1)/warmup_steps``.
        lr_decay: after warm-up, ``"cosine"`` or ``"linear"`` to ``min_lr_ratio·lr`` at
            ``decay_steps``; ``"step"`` multiplies by ``lr_gamma`` every ``lr_step_size`` steps
            (floored at ``min_lr_ratio``); ``"none"`` keeps ``lr``.
        decay_steps: total steps of the schedule (default ``epochs × batches per epoch``).
        min_lr_ratio: final LR as a fraction of ``lr``.
        lr_step_size, lr_gamma: the ``"step"`` decay.
        clip_norm: clip the global gradient norm (of the per-example loss) to this; ``None`` off.
        kl_anneal_steps: β rises linearly from ``kl_start`` to 1 over this many steps (0: β = 1).
        kl_start: initial β (> 0: ``poutine.scale`` and Pyro need positive scales).
        kl_weight: final β (1 = the ELBO; < 1 a tempered ELBO that down-weights every KL).
        num_particles: ELBO samples per step.
        vectorize_particles: draw the particles in one vectorised pass (a leading sample dim)
            instead of a Python loop.
        elbo: SVI estimator: ``"trace"`` (``Trace_ELBO``) or ``"meanfield"``
            (``TraceMeanField_ELBO``: analytic KL where registered).
        seed: seeds torch/Pyro/random/numpy at the start of a fresh run and the data order.
        progress: show a tqdm bar with loss and accuracy.
        early_stopping_patience: stop after this many evaluations without a validation-loss
            improvement larger than ``min_delta`` (``None``: off).
        min_delta: improvement threshold for early stopping.
        restore_best: with early stopping, load the best validation weights when training ends.
        eval_every: evaluate on the validation data every this many epochs (and after the last).
        eval_batch_size: evaluation batch size (default ``max(batch_size, 256)``).
        val_loss: ``"nll"`` (deterministic posterior-mean negative log-likelihood per example) or
            ``"elbo"`` (negative ELBO per example, β = 1, one particle): what early stopping
            watches.
        val_samples: posterior draws per prediction of the posterior-predictive validation
            metrics (accuracy, NLL, ECE; :mod:`bayesattn.training.validation`); 0: of the
            deterministic posterior-mean predictive (one pass, as cheap as the loss).
        drop_last: drop the last incomplete batch of each epoch.
        device: torch device the network and batches are moved to.
    """

    method: TrainMethod = "hybrid"
    epochs: int = 10
    max_steps: int | None = None
    batch_size: int = 64
    lr: float = 1e-3
    weight_decay: float = 0.0
    warmup_steps: int = 0
    lr_decay: LrDecay = "cosine"
    decay_steps: int | None = None
    min_lr_ratio: float = 0.0
    lr_step_size: int = 1000
    lr_gamma: float = 0.1
    clip_norm: float | None = 1.0
    kl_anneal_steps: int = 0
    kl_start: float = 1e-3
    kl_weight: float = 1.0
    num_particles: int = 1
    vectorize_particles: bool = True
    elbo: ElboKind = "trace"
    seed: int = 0
    progress: bool = True
    early_stopping_patience: int | None = None
    min_delta: float = 0.0
    restore_best: bool = True
    eval_every: int = 1
    eval_batch_size: int | None = None
    val_loss: ValLoss = "nll"
    val_samples: int = 8
    drop_last: bool = False
    device: str = "cpu"

    def __post_init__(self) -> None:
        def need(ok: bool, name: str, what: str) -> None:
            if not ok:
                raise ValueError(f"TrainConfig.{name} must be {what}; got {getattr(self, name)!r}")

        def choice(name: str, options: tuple[str, ...]) -> None:
            need(getattr(self, name) in options, name, f"one of {options}")

        choice("method", METHODS)
        choice("lr_decay", LR_DECAYS)
        choice("elbo", ELBOS)
        choice("val_loss", VAL_LOSSES)

        def arg(name: str) -> tuple[str, Any]:  # (name in messages, value)
            return f"TrainConfig.{name}", getattr(self, name)

        for name in (
            "epochs",
            "batch_size",
            "num_particles",
            "eval_every",
            "lr_step_size",
        ):
            check_int(*arg(name), 1)
        for name in ("warmup_steps", "kl_anneal_steps", "seed", "val_samples"):
            check_int(*arg(name), 0)
        for name in ("max_steps", "decay_steps", "eval_batch_size", "early_stopping_patience"):
            check_int(*arg(name), 1, allow_none=True)
        check_real(*arg("lr"), gt=0.0)
        check_real(*arg("weight_decay"), ge=0.0)
        check_real(*arg("min_lr_ratio"), ge=0.0, le=1.0)
        for name in ("lr_gamma", "kl_start", "kl_weight"):
            check_real(*arg(name), gt=0.0, le=1.0)
        check_real(*arg("min_delta"), ge=0.0)
        if self.clip_norm is not None:
            check_real(*arg("clip_norm"), gt=0.0)
        for name in ("vectorize_particles", "progress", "restore_best", "drop_last"):
            need(isinstance(getattr(self, name), bool), name, "a bool")
        need(isinstance(self.device, (str, torch.device)), "device", "a str or torch.device")
        try:
            torch.device(self.device)
        except (RuntimeError, TypeError) as e:
            raise ValueError(f"TrainConfig.device is not a valid device: {self.device!r}") from e
        check_device_available("TrainConfig.device", torch.device(self.device))
        if isinstance(self.device, torch.device):
            self.device = str(self.device)

    @classmethod
    def tiny(cls, **overrides: Any) -> TrainConfig:
        """A small preset for tests, notebooks and smoke runs (2 epochs, batch 16, no bar)."""
        kw: dict[str, Any] = dict(epochs=2, batch_size=16, lr=3e-3, progress=False)
        kw.update(overrides)
        return cls(**kw)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        """A config from :meth:`to_dict`'s output; a saved config's ``"mode"`` (the old name
        of ``"method"``) is read as ``"method"``."""
        d = upgrade_config_dict(d)
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"unknown TrainConfig fields {unknown}")
        return cls(**d)


def upgrade_config_dict(d: dict[str, Any]) -> dict[str, Any]:
    """A saved config dict with the old key ``"mode"`` (before 0.3) as one with ``"method"``."""
    if isinstance(d, dict) and "mode" in d and "method" not in d:
        d = {("method" if k == "mode" else k): v for k, v in d.items()}
    return d


def resolve_config(config: TrainConfig | dict | None, overrides: dict[str, Any]) -> TrainConfig:
    """The :class:`TrainConfig` of ``config`` (a config, a saved dict or ``None``: the defaults)
    with the keyword ``overrides`` applied."""
    if config is None:
        config = TrainConfig()
    elif isinstance(config, dict):
        config = TrainConfig.from_dict(config)
    elif not isinstance(config, TrainConfig):
        raise TypeError(
            f"config must be a TrainConfig, a dict or None; got {type(config).__name__}"
        )
    if overrides:
        names = {f.name for f in dataclasses.fields(TrainConfig)}
        unknown = sorted(set(overrides) - names)
        if unknown:
            raise TypeError(
                f"unknown training options {unknown}; TrainConfig fields: {sorted(names)}"
            )
        config = dataclasses.replace(config, **overrides)
    return config


def check_device_available(name: str, device: torch.device) -> None:
    """A ``ValueError`` naming ``name`` when ``device`` is a CUDA/MPS device this build of torch
    or this machine does not have (instead of torch's assertion deep inside the first move)."""
    if device.type == "cuda":
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n == 0:
            raise ValueError(
                f"{name} is {str(device)!r} but CUDA is not available (torch {torch.__version__}, "
                f"CUDA build: {torch.version.cuda or 'no'}); use 'cpu'"
            )
        if device.index is not None and device.index >= n:
            raise ValueError(f"{name} is {str(device)!r} but this machine has {n} CUDA device(s)")
    if device.type == "mps" and not (
        hasattr(torch.backends, "mps") and torch.backends.mps.is_available()
    ):
        raise ValueError(f"{name} is {str(device)!r} but MPS is not available; use 'cpu'")
