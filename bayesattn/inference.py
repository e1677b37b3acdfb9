r"""Training Bayesian-attention networks: SVI and one-pass ("hybrid") ELBO training loops,
KL annealing, learning-rate schedules, early stopping and exact-resume checkpoints.

Two objectives, one loop (:class:`Trainer`, or the function :func:`fit`):

``mode="svi"``
    ``pyro.infer`` ELBO (``Trace_ELBO`` or ``TraceMeanField_ELBO``) of ``network.model`` against
    ``network.guide``: the guide runs the network once with attention drawn from the amortised
    posteriors, the model runs it again, replayed, scoring those draws under the priors. Steps are
    taken by a :class:`pyro.optim.PyroLRScheduler` (our :func:`lr_scheduler` over
    ``torch.optim.AdamW``) on the
    parameters captured from the trace, exactly like :meth:`pyro.infer.SVI.step`, with one addition:
    the gradients are clipped to a *global* norm (over all parameters together, as in hybrid mode)
    before the per-parameter optimisers step.
``mode="hybrid"``
    ``network.elbo_loss``: the same negative ELBO in **one** network pass with analytic
    :math:`\mathrm{KL}(q\|p)` per attention layer, optimised by ``torch.optim.AdamW`` on
    ``network.parameters()`` with :func:`lr_scheduler` and ``clip_grad_norm_``.

The learning-rate schedule (warm-up, then cosine, linear or step decay) is built from stock
:mod:`torch.optim.lr_scheduler` objects by :func:`bayesattn.training.schedules.lr_scheduler`;
:func:`lr_factor` is its closed form. Training data may be tensors, map-style or iterable
(streaming) datasets, or ``DataLoader`` objects (:mod:`bayesattn.training.data`).

In both modes the optimised objective is the minibatch estimate of the dataset's negative ELBO
divided by ``num_data`` (the negative ELBO *per training example*):

.. math::
    \mathcal L_\beta = -\frac{1}{B}\sum_{b\in\text{batch}}\Big(E_q\log p(y_b\mid x_b, w_b)
    - \beta\,\mathrm{KL}\big(q(w_b\mid x_b)\,\|\,p(w_b\mid x_b)\big)\Big)
    + \frac{\beta}{N}\,\mathrm{KL}_{\text{weights}}

(the network scales the minibatch by :math:`N/B`; the trainer divides by :math:`N`). The optimum is
unchanged; ``clip_norm`` and the reported ``train_loss`` are in per-example units that do not grow
with the dataset. :math:`\beta` rises linearly from ``kl_start`` to 1 over ``kl_anneal_steps``; in
SVI mode it is applied by :class:`ScaleLatents`, a messenger that multiplies the scale of every
latent (unobserved) sample site by :math:`\beta` in model *and* guide, leaving ``"obs"`` at 1.

Checkpoints (:func:`save_checkpoint`, :func:`load_checkpoint`) are written atomically, load with
``torch.load(path, weights_only=True)``, carry a SHA-256 digest of their contents, and hold
everything needed to continue bit-for-bit: network, optimiser and scheduler states, counters, the
current epoch's data order and position, history, early-stopping state and all RNG states.
Resume is exact for tensors, map-style datasets and ``DataLoader`` objects over them (the epoch's order
is saved); for a stream (an ``IterableDataset``) it restarts the stream and skips the batches of
the open epoch already trained on, which is exact when every pass over the stream yields the same
items in the same order.

Example:
    >>> from bayesattn.nn.blocks import AttentionConfig
    >>> from bayesattn.nn.networks import TransformerClassifier
    >>> net = TransformerClassifier(2, vocab_size=8, d_model=16, nhead=2, num_layers=1,
    ...                             attention=AttentionConfig(posterior="dirichlet"))
    >>> x = torch.randint(1, 8, (64, 6)); y = (x == 3).any(1).long()
    >>> history = fit(net, (x, y), epochs=2, batch_size=16, progress=False)
    >>> len(history.train_loss)
    2
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
import math
import numbers
import os
import random
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyro
import pyro.optim
import torch
from pyro import poutine
from pyro.infer import Trace_ELBO, TraceMeanField_ELBO
from pyro.poutine.messenger import Messenger
from pyro.poutine.util import site_is_subsample
from torch import Tensor

from .nn.networks import BayesianNetwork
from .training.data import (
    DataSource,
    TensorSource,
    _as_tensors,
    as_train_data,
    iter_eval_batches,
)
from .training.data import fork_rng as _fork_rng
from .training.schedules import LR_DECAYS, lr_factor, lr_scheduler

__all__ = [
    "TrainConfig",
    "History",
    "Trainer",
    "fit",
    "ScaleLatents",
    "kl_beta",
    "lr_factor",
    "lr_scheduler",
    "save_checkpoint",
    "load_checkpoint",
    "prepare_checkpoint_path",
    "CheckpointError",
]

MODES = ("svi", "hybrid")
ELBOS = ("trace", "meanfield")
VAL_LOSSES = ("nll", "elbo")

_FORMAT = "bayesattn.checkpoint"
_VERSION = 2  # 2: torch.optim.lr_scheduler schedules, data sources (loaders, streams)


# ---------------------------------------------------------------------------------------------
# configuration
# ---------------------------------------------------------------------------------------------


def _is_int(v: Any) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _is_real(v: Any) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(float(v))


@dataclass
class TrainConfig:
    """Training options; every field is validated on construction (``ValueError`` naming it).

    Args:
        mode: ``"hybrid"`` (one-pass ELBO with analytic KLs, AdamW) or ``"svi"`` (Pyro ELBO of
            ``model`` against ``guide``).
        epochs: passes over the training data.
        max_steps: stop after this many optimiser steps in total (``None``: no cap). Only a
            stopping rule: the LR schedule is set by ``decay_steps``, so a run interrupted by
            ``max_steps`` and resumed reproduces the uninterrupted run.
        batch_size: examples per step (the last batch of an epoch may be smaller).
        lr: peak learning rate.
        weight_decay: decoupled (AdamW) weight decay, both modes.
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
            ``"elbo"`` (negative ELBO per example, β = 1, one particle).
        drop_last: drop the last incomplete batch of each epoch.
        device: torch device the network and batches are moved to.
    """

    mode: str = "hybrid"
    epochs: int = 10
    max_steps: int | None = None
    batch_size: int = 64
    lr: float = 1e-3
    weight_decay: float = 0.0
    warmup_steps: int = 0
    lr_decay: str = "cosine"
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
    elbo: str = "trace"
    seed: int = 0
    progress: bool = True
    early_stopping_patience: int | None = None
    min_delta: float = 0.0
    restore_best: bool = True
    eval_every: int = 1
    eval_batch_size: int | None = None
    val_loss: str = "nll"
    drop_last: bool = False
    device: str = "cpu"

    def __post_init__(self) -> None:
        def need(ok: bool, name: str, what: str) -> None:
            if not ok:
                raise ValueError(f"TrainConfig.{name} must be {what}; got {getattr(self, name)!r}")

        def choice(name: str, options: tuple[str, ...]) -> None:
            need(getattr(self, name) in options, name, f"one of {options}")

        choice("mode", MODES)
        choice("lr_decay", LR_DECAYS)
        choice("elbo", ELBOS)
        choice("val_loss", VAL_LOSSES)
        for name in ("epochs", "batch_size", "num_particles", "eval_every", "lr_step_size"):
            v = getattr(self, name)
            need(_is_int(v) and v >= 1, name, "an int >= 1")
        for name in ("warmup_steps", "kl_anneal_steps", "seed"):
            v = getattr(self, name)
            need(_is_int(v) and v >= 0, name, "an int >= 0")
        for name in ("max_steps", "decay_steps", "eval_batch_size"):
            v = getattr(self, name)
            need(v is None or (_is_int(v) and v >= 1), name, "None or an int >= 1")
        v = self.early_stopping_patience
        need(v is None or (_is_int(v) and v >= 1), "early_stopping_patience", "None or an int >= 1")
        need(_is_real(self.lr) and self.lr > 0, "lr", "a finite float > 0")
        need(_is_real(self.weight_decay) and self.weight_decay >= 0, "weight_decay", "a float >= 0")
        need(
            _is_real(self.min_lr_ratio) and 0 <= self.min_lr_ratio <= 1, "min_lr_ratio", "in [0, 1]"
        )
        need(_is_real(self.lr_gamma) and 0 < self.lr_gamma <= 1, "lr_gamma", "in (0, 1]")
        need(_is_real(self.kl_start) and 0 < self.kl_start <= 1, "kl_start", "in (0, 1]")
        need(_is_real(self.kl_weight) and 0 < self.kl_weight <= 1, "kl_weight", "in (0, 1]")
        need(_is_real(self.min_delta) and self.min_delta >= 0, "min_delta", "a float >= 0")
        v = self.clip_norm
        need(v is None or (_is_real(v) and v > 0), "clip_norm", "None or a float > 0")
        for name in ("vectorize_particles", "progress", "restore_best", "drop_last"):
            need(isinstance(getattr(self, name), bool), name, "a bool")
        need(isinstance(self.device, (str, torch.device)), "device", "a str or torch.device")
        try:
            torch.device(self.device)
        except (RuntimeError, TypeError) as e:
            raise ValueError(f"TrainConfig.device is not a valid device: {self.device!r}") from e
        if isinstance(self.device, torch.device):
            self.device = str(self.device)

    @classmethod
    def tiny(cls, **overrides) -> TrainConfig:
        """A small preset for tests, notebooks and smoke runs (2 epochs, batch 16, no bar)."""
        kw: dict[str, Any] = dict(epochs=2, batch_size=16, lr=3e-3, progress=False)
        kw.update(overrides)
        return cls(**kw)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"unknown TrainConfig fields {unknown}")
        return cls(**d)


def _resolve_config(config: TrainConfig | dict | None, overrides: dict[str, Any]) -> TrainConfig:
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


# ---------------------------------------------------------------------------------------------
# schedules and annealing
# ---------------------------------------------------------------------------------------------


def kl_beta(step: int, anneal_steps: int, start: float = 1e-3, final: float = 1.0) -> float:
    r"""KL weight at (0-based) optimiser step ``step``: ``final·start`` at step 0, rising linearly
    to ``final`` at ``anneal_steps`` and staying there; ``final`` when ``anneal_steps == 0``.

    .. math:: \beta_s = \beta_{\max}\big(\beta_0 + (1 - \beta_0)\min(1, s / S_{\text{anneal}})\big)

    ``final = 1`` is the ELBO; ``final < 1`` a tempered ELBO (a KL weight, as used for local
    attention latents whose KL would otherwise swamp a one-label-per-example likelihood).
    """
    if anneal_steps <= 0:
        return final
    return final * (start + (1.0 - start) * min(1.0, step / anneal_steps))


class ScaleLatents(Messenger):
    r"""Multiply the log-density scale of every *latent* sample site by :math:`\beta`.

    Observed sites (``"obs"``, and ``pyro.deterministic`` sites, which are observed) and plate
    subsample sites are left alone, so under a guide/model pair both wrapped in it the ELBO
    becomes :math:`E_q[\log p(y\mid w)] - \beta\,\mathrm{KL}(q\|p)`: the KL-annealed objective.
    ``beta`` may be a float or a zero-argument callable read at every site.

    Example::

        with ScaleLatents(0.1):
            tr = poutine.trace(net.guide).get_trace(x, y)  # latent sites: scale × 0.1
    """

    def __init__(self, beta: float | Callable[[], float] = 1.0) -> None:
        super().__init__()
        self.beta = beta

    def _process_message(self, msg) -> None:
        if msg["type"] != "sample" or msg["is_observed"] or site_is_subsample(msg):
            return
        beta = self.beta() if callable(self.beta) else self.beta
        if beta <= 0:
            raise ValueError(f"ScaleLatents needs beta > 0; got {beta}")
        msg["scale"] = beta * msg["scale"]


# ---------------------------------------------------------------------------------------------
# history
# ---------------------------------------------------------------------------------------------

_HISTORY_KEYS = (
    "epoch",
    "step",
    "train_loss",
    "train_acc",
    "val_loss",
    "val_acc",
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
    models), ``val_loss``/``val_acc`` (``None`` when not evaluated), ``lr`` and ``beta`` (of the
    epoch's last step), ``seconds`` (wall time of the epoch's steps). ``stopped_early``,
    ``best_epoch`` and ``best_val_loss`` summarise early stopping.
    """

    epoch: list[int] = field(default_factory=list)
    step: list[int] = field(default_factory=list)
    train_loss: list[float] = field(default_factory=list)
    train_acc: list[float] = field(default_factory=list)
    val_loss: list[float | None] = field(default_factory=list)
    val_acc: list[float | None] = field(default_factory=list)
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
        h = cls(**{k: list(d.get(k, [])) for k in _HISTORY_KEYS})
        h.stopped_early = bool(d.get("stopped_early", False))
        h.best_epoch = d.get("best_epoch")
        h.best_val_loss = d.get("best_val_loss")
        return h

    def plot(self, path: str | os.PathLike | None = None):
        """Loss, accuracy and LR/β curves as a :class:`matplotlib.figure.Figure` (saved as an
        image, e.g. PNG, when ``path`` is given). matplotlib is imported lazily."""
        from matplotlib.figure import Figure

        fig = Figure(figsize=(11, 3.4), layout="constrained")
        ax_loss, ax_acc, ax_lr = fig.subplots(1, 3)
        ep = self.epoch

        def plot_opt(ax, values, label, **kw):
            pts = [(e, v) for e, v in zip(ep, values, strict=True) if v is not None]
            if pts:
                xs, ys = zip(*pts, strict=True)
                ax.plot(xs, ys, marker="o", ms=3, label=label, **kw)

        plot_opt(ax_loss, self.train_loss, "train (−ELBO/N)")
        plot_opt(ax_loss, self.val_loss, "validation")
        ax_loss.set(title="loss per example", xlabel="epoch")
        plot_opt(ax_acc, self.train_acc, "train")
        plot_opt(ax_acc, self.val_acc, "validation")
        ax_acc.set(title="accuracy", xlabel="epoch", ylim=(0, 1.02))
        if self.best_epoch is not None:
            for ax in (ax_loss, ax_acc):
                ax.axvline(self.best_epoch, color="grey", ls=":", lw=1, label="best")
        plot_opt(ax_lr, self.lr, "learning rate", color="C2")
        ax_lr.set(title="schedule", xlabel="epoch", ylabel="learning rate")
        ax_b = ax_lr.twinx()
        plot_opt(ax_b, self.beta, "KL weight β", color="C3")
        ax_b.set(ylabel="β", ylim=(0, 1.05))
        for ax in (ax_loss, ax_acc):
            if ax.has_data():
                ax.legend(fontsize=8)
        if path is not None:
            fig.savefig(path, dpi=100)
        return fig


# ---------------------------------------------------------------------------------------------
# checkpoints
# ---------------------------------------------------------------------------------------------


class CheckpointError(ValueError):
    """A checkpoint file that cannot be used: corrupt, truncated, or not matching the trainer."""


def _digest(obj: Any) -> str:
    """SHA-256 over a canonical walk of a checkpoint's contents (tensors by dtype/shape/bytes)."""
    h = hashlib.sha256()

    def walk(o: Any) -> None:
        if isinstance(o, Tensor):
            t = o.detach().cpu().contiguous()
            h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
            if t.numel():
                h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
        elif isinstance(o, dict):
            h.update(f"D{len(o)}".encode())
            for k in sorted(o, key=lambda k: (type(k).__name__, repr(k))):
                h.update(repr(k).encode())
                walk(o[k])
        elif isinstance(o, (list, tuple)):
            h.update(f"L{len(o)}".encode())
            for v in o:
                walk(v)
        else:
            h.update(f"{type(o).__name__}:{o!r};".encode())

    walk(obj)
    return h.hexdigest()


def prepare_checkpoint_path(path: str | os.PathLike) -> Path:
    """Check a checkpoint path before training: a file path whose folder exists or can be
    created and is writable. Removes temporary files (``.<name>.*.tmp``) left next to it by
    checkpoint writes that were killed. Raises ``ValueError``/``TypeError`` naming the path."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"checkpoint_path must be a str or a path; got {type(path).__name__}")
    path = Path(path)
    if str(path) in ("", "."):
        raise ValueError(f"checkpoint_path must name a file; got {str(path)!r}")
    if path.is_dir():
        raise ValueError(
            f"checkpoint_path {str(path)!r} is a folder; give a file path such as "
            f"{str(path / 'checkpoint.pt')!r}"
        )
    parent = path.parent if str(path.parent) else Path(".")
    for p in (parent, *parent.parents):
        if p.exists():
            if not p.is_dir():
                raise ValueError(
                    f"checkpoint_path {str(path)!r} lies under {str(p)!r}, which is a file"
                )
            break
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"cannot create the folder of checkpoint_path {str(path)!r}: {e}") from e
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"the folder of checkpoint_path {str(path)!r} is not writable")
    for stale in parent.glob(f".{path.name}.*.tmp"):
        with contextlib.suppress(OSError):
            stale.unlink()
    return path


def save_checkpoint(path: str | os.PathLike, state: Trainer | dict[str, Any]) -> Path:
    """Write a trainer's state (or a state dict from :meth:`Trainer.state_dict`) atomically.

    The file is written to a temporary file in the same directory, flushed and fsynced, then
    moved over ``path`` with ``os.replace``: a crash leaves either the old or the new checkpoint,
    never a torn one. It loads with ``torch.load(path, weights_only=True)``.
    """
    if isinstance(state, Trainer):
        state = state.state_dict()
    if not isinstance(state, dict):
        raise TypeError(f"state must be a Trainer or a dict; got {type(state).__name__}")
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    directory.mkdir(parents=True, exist_ok=True)
    payload = {k: v for k, v in state.items() if k != "sha256"}
    payload["sha256"] = _digest(payload)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(payload, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):  # persist the rename (POSIX); not possible everywhere
        dfd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    return path


_REQUIRED = ("format", "version", "mode", "config", "network", "optimizer", "step", "epoch", "rng")


def load_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """Load and verify a checkpoint written by :func:`save_checkpoint`.

    Raises:
        FileNotFoundError: no file at ``path``.
        CheckpointError: the file is not a readable ``torch.save`` archive (garbage, truncated),
            is not a bayesattn checkpoint, lacks required entries, or its contents do not match
            their SHA-256 digest (bit rot, partial overwrite).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint file at {str(path)!r}")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # any unpickling or zip failure: the file is unusable
        raise CheckpointError(
            f"checkpoint {str(path)!r} is corrupt or truncated and could not be read "
            f"({type(e).__name__}: {e})"
        ) from e
    if not isinstance(state, dict) or state.get("format") != _FORMAT:
        raise CheckpointError(f"{str(path)!r} is not a bayesattn training checkpoint")
    missing = [k for k in _REQUIRED if k not in state]
    if missing:
        raise CheckpointError(f"checkpoint {str(path)!r} lacks required entries {missing}")
    if state["version"] != _VERSION:
        raise CheckpointError(
            f"checkpoint {str(path)!r} has format version {state['version']!r}; "
            f"this bayesattn reads version {_VERSION}"
        )
    expected = state.pop("sha256", None)
    if expected != _digest(state):
        raise CheckpointError(
            f"checkpoint {str(path)!r} is corrupt: its contents do not match their SHA-256 digest"
        )
    return state


def _rng_state(gen: torch.Generator) -> dict[str, Any]:
    version, internal, gauss = random.getstate()
    np_state = np.random.get_state()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": [version, list(internal), gauss],
        "numpy": {
            "kind": str(np_state[0]),
            "keys": torch.from_numpy(np.asarray(np_state[1], dtype=np.int64)),
            "pos": int(np_state[2]),
            "has_gauss": int(np_state[3]),
            "cached_gaussian": float(np_state[4]),
        },
        "data": gen.get_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any], gen: torch.Generator) -> None:
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    npst = state["numpy"]
    np.random.set_state(
        (
            npst["kind"],
            npst["keys"].numpy().astype(np.uint32),
            npst["pos"],
            npst["has_gauss"],
            npst["cached_gaussian"],
        )
    )
    gen.set_state(state["data"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# ---------------------------------------------------------------------------------------------
# data
# ---------------------------------------------------------------------------------------------


def _check_data(net: BayesianNetwork, x: Tensor, y: Tensor | None, name: str) -> None:
    """Validate the whole dataset once, before any step; re-raise naming the argument."""
    try:
        net._check_batch(x, y)
    except (ValueError, TypeError) as e:
        raise type(e)(f"{name}: {e}") from e
    try:
        targets = net._targets(x[:1], None if y is None else y[:1])[0]
    except (TypeError, ValueError, IndexError):
        targets = None
    if targets is None:
        raise ValueError(
            f"{name}: {type(net).__name__} needs targets y to train and evaluate; got y=None"
        )


# ---------------------------------------------------------------------------------------------
# the trainer
# ---------------------------------------------------------------------------------------------


def sync_param_store(
    network: BayesianNetwork, x: Tensor, y: Tensor | None, num_data: int | None
) -> list[str]:
    """Make Pyro's global param store point at ``network``'s tensors; returns the param names of
    its model and guide.

    PyroModules register their parameters in the global store by name; a stale entry of the
    same name (another network built earlier in the process) would otherwise be what SVI
    optimises (``pyro.module``) or be silently copied into this network (``PyroParam``).
    Names used by this network's model and guide are found in a scoped, empty store; stale
    entries under those names are removed so that the next trace registers ours.
    """
    net = network
    store = pyro.get_param_store()
    with _fork_rng(), torch.no_grad(), store.scope():
        gtr = poutine.trace(net.guide).get_trace(x, y, num_data)
        mtr = poutine.trace(poutine.replay(net.model, trace=gtr)).get_trace(x, y, num_data)
    names: list[str] = []
    for tr in (gtr, mtr):
        for name, site in tr.nodes.items():
            if site["type"] == "param" and name not in names:
                names.append(name)
    own = {id(p) for p in net.parameters()}
    current = dict(store.named_parameters())
    for name in names:
        if name in current and id(current[name]) not in own:
            del store[name]
    return names


def _diverged_forward(e: BaseException, xb: Tensor) -> bool:
    """A non-finite complaint from the forward pass on a finite batch: the model overflowed."""
    msg = str(e).lower()
    if not any(w in msg for w in ("finite", "nan", "inf")):
        return False
    return not xb.is_floating_point() or bool(torch.isfinite(xb).all())


class Trainer:
    """Trains a :class:`~bayesattn.nn.networks.BayesianNetwork` (see the module docstring).

    Args:
        network: the network to train (moved to ``config.device``).
        config: a :class:`TrainConfig` (or a dict of its fields); ``overrides`` replace fields.

    Attributes:
        history: the :class:`History` so far.
        step: optimiser steps taken so far.
        epoch: completed epochs.
        optimizer: the ``torch.optim.AdamW`` optimiser (hybrid mode; ``None`` in svi mode).
        scheduler: its ``LambdaLR`` learning-rate schedule (hybrid mode).
        pyro_optim: the ``pyro.optim`` scheduler (svi mode).
        last_grad_norm: global gradient norm of the last step *before* clipping.

    Example::

        trainer = Trainer(net, TrainConfig(mode="svi", epochs=3, progress=False))
        history = trainer.fit((x, y), val_data=(xv, yv), checkpoint_path="ckpt.pt")
        # later, in a fresh process: a new network and trainer continue exactly
        Trainer(new_net, trainer.config).fit((x, y), (xv, yv), "ckpt.pt", resume=True)
    """

    def __init__(
        self, network: BayesianNetwork, config: TrainConfig | dict | None = None, **overrides
    ):
        if not isinstance(network, BayesianNetwork):
            raise TypeError(
                f"network must be a bayesattn BayesianNetwork; got {type(network).__name__}"
            )
        self.network = network
        self.config = _resolve_config(config, overrides)
        self.device = torch.device(self.config.device)
        self.history = History()
        self.step = 0
        self.epoch = 0
        self.last_grad_norm: float | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.scheduler: torch.optim.lr_scheduler.LRScheduler | None = None
        self.pyro_optim: pyro.optim.PyroLRScheduler | None = None
        self._generator = torch.Generator().manual_seed(self.config.seed)
        self._num_data: int | None = None
        self._decay_steps: int | None = None
        self._perm: Tensor | None = None  # (N,) data order of the current epoch
        self._batch_sizes: Tensor | None = None  # (batches,) when a DataLoader sets them
        self._open = False  # an epoch is in progress (``_perm`` is None for streams)
        self._pos = 0  # batches of the current epoch already taken
        self._data: DataSource | None = None
        self._accum = self._new_accum()
        self._best_state: dict[str, Tensor] | None = None
        self._bad_evals = 0
        self._param_names: list[str] = []
        self._anneal = ScaleLatents(lambda: self._beta)
        self._beta = 1.0
        self._stash: list[Tensor] = []
        self._elbo = None
        self._set_up = False

    # ---- schedules ----------------------------------------------------------------------------
    def beta(self, step: int | None = None) -> float:
        """KL weight β used at (0-based) step ``step`` (default: the next step)."""
        c = self.config
        return kl_beta(
            self.step if step is None else step, c.kl_anneal_steps, c.kl_start, c.kl_weight
        )

    def lr_at(self, step: int | None = None) -> float:
        """Learning rate used at (0-based) step ``step`` (default: the next step)."""
        return self.config.lr * self._lr_factor(self.step if step is None else step)

    def _schedule(self) -> dict[str, Any]:
        """The configured schedule's arguments, shared by :func:`lr_factor` (closed form) and
        :func:`lr_scheduler` (torch's schedulers)."""
        c = self.config
        return dict(
            warmup_steps=c.warmup_steps,
            decay=c.lr_decay,
            decay_steps=self._decay_steps or c.decay_steps or 1,
            min_lr_ratio=c.min_lr_ratio,
            step_size=c.lr_step_size,
            gamma=c.lr_gamma,
        )

    def _lr_factor(self, step: int) -> float:
        return lr_factor(step, **self._schedule())

    # ---- set-up -------------------------------------------------------------------------------
    @staticmethod
    def _new_accum() -> dict[str, float]:
        return {"loss": 0.0, "batches": 0.0, "correct": 0.0, "count": 0.0, "seconds": 0.0}

    def _sync_param_store(self, x: Tensor, y: Tensor | None) -> None:
        """Make Pyro's global param store point at *this* network's tensors
        (see :func:`sync_param_store`)."""
        self._param_names = sync_param_store(self.network, x, y, self._num_data)

    def make_scheduler(
        self, optimizer: torch.optim.Optimizer
    ) -> torch.optim.lr_scheduler.LRScheduler:
        """The configured :func:`lr_scheduler` over ``optimizer`` (after set-up: it needs the
        schedule length)."""
        return lr_scheduler(optimizer, **self._schedule())

    def _setup(self, src: DataSource) -> None:
        """Build optimiser/scheduler once; needs the training data for the schedule length and
        one dry call that creates any lazily built parameters (e.g. a weight autoguide)."""
        c, net = self.config, self.network
        n = src.num_data
        assert n is not None
        self._num_data = n
        nb = src.batches_per_epoch()
        if c.decay_steps is None and nb is None and c.lr_decay in ("cosine", "linear"):
            raise ValueError(
                f"lr_decay={c.lr_decay!r} needs the schedule length, and the number of batches "
                f"per epoch of train_data is unknown: set TrainConfig.decay_steps"
            )
        self._decay_steps = c.decay_steps or max(1, c.epochs * (nb or 1))
        net.to(self.device)
        xb, yb = src.first_batch()
        xb = xb.to(self.device)
        yb = None if yb is None else yb.to(self.device)
        self._sync_param_store(xb, yb)

        if c.mode == "hybrid":
            with _fork_rng(), torch.no_grad():  # creates lazily built parameters, if any
                net.elbo_loss(xb, yb, num_data=n)
            self.optimizer = torch.optim.AdamW(
                net.parameters(), lr=c.lr, weight_decay=c.weight_decay
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
            elbo_cls = Trace_ELBO if c.elbo == "trace" else TraceMeanField_ELBO
            self._elbo = elbo_cls(
                num_particles=c.num_particles,
                vectorize_particles=c.vectorize_particles and c.num_particles > 1,
                max_plate_nesting=1,
            )
        self._set_up = True

    # ---- model/guide wrappers (svi) ----------------------------------------------------------
    def _model(self, *args, **kwargs):
        with self._anneal:
            logits = self.network.model(*args, **kwargs)
        self._stash.append(logits.detach())
        return logits

    def _guide(self, *args, **kwargs):
        with self._anneal:
            return self.network.guide(*args, **kwargs)

    # ---- one step -----------------------------------------------------------------------------
    def _check_step(self, loss: float, params: list[Tensor]) -> None:
        """Before the optimiser step: a non-finite loss or gradient stops training with the
        parameters untouched (the step is not applied, the gradients are dropped)."""
        norm = self.last_grad_norm
        if math.isfinite(loss) and norm is not None and math.isfinite(norm):
            return
        bad = [
            n
            for n, p in self.network.named_parameters()
            if p.grad is not None and not bool(torch.isfinite(p.grad).all())
        ]
        for p in params:
            p.grad = None
        raise self._diverged(
            f"loss {loss}, gradient norm {norm}"
            + (f", non-finite gradients in {bad[:5]}{' …' if len(bad) > 5 else ''}" if bad else "")
        )

    def _diverged(self, detail: str) -> FloatingPointError:
        c = self.config
        for p in self.network.parameters():
            p.grad = None
        return FloatingPointError(
            f"training diverged at step {self.step} (epoch {self.epoch + 1}): {detail}; this "
            "step was not applied, so the network keeps its last finite parameters. "
            f"Try a lower lr (now {c.lr:g}), clip_norm (now {c.clip_norm}), a longer "
            f"warmup_steps (now {c.warmup_steps}) or kl_anneal_steps (now {c.kl_anneal_steps}), "
            "or check the data for extreme values."
        )

    def _clip(self, params: list[Tensor]) -> None:
        grads = [p for p in params if p.grad is not None]
        if self.config.clip_norm is not None:
            norm = torch.nn.utils.clip_grad_norm_(grads, self.config.clip_norm)
        else:
            norm = torch.nn.utils.get_total_norm([p.grad for p in grads])
        self.last_grad_norm = float(norm)

    def train_step(self, xb: Tensor, yb: Tensor | None) -> tuple[float, Tensor]:
        """One optimiser step on a minibatch (after :meth:`fit` has set the trainer up; no
        input validation, for custom loops and benchmarks). Advances ``step``.

        Returns:
            the β-weighted negative ELBO per training example, and the detached logits
            ``(*P, B, ...)`` of the sampled-attention pass (``P`` particles when > 1).
        """
        if not self._set_up:
            raise RuntimeError("train_step needs a set-up trainer: call fit() first")
        try:
            loss, logits = self._step_impl(xb, yb)
        except (FloatingPointError, ValueError) as e:
            # overflowed parameters/activations surface in the forward pass as non-finite logits
            # or "query must be finite"; with a finite batch that is divergence, not bad input
            if "training diverged" in str(e) or not _diverged_forward(e, xb):
                raise
            raise self._diverged(f"the forward pass failed ({e})") from e
        self.step += 1
        return loss, logits

    def _step_impl(self, xb: Tensor, yb: Tensor | None) -> tuple[float, Tensor]:
        c, net, N = self.config, self.network, self._num_data
        assert N is not None
        self._beta = self.beta()
        if c.mode == "hybrid":
            assert self.optimizer is not None and self.scheduler is not None
            self.optimizer.zero_grad(set_to_none=True)
            if c.num_particles == 1 or c.vectorize_particles:
                loss, logits = net.elbo_loss(
                    xb, yb, num_data=N, beta=self._beta, num_particles=c.num_particles
                )
                (loss / N).backward()
                total, logits = float(loss.detach()), logits.detach()
            else:  # sequential particles: average P one-particle estimates
                total, outs = 0.0, []
                for _ in range(c.num_particles):
                    loss, logits = net.elbo_loss(xb, yb, num_data=N, beta=self._beta)
                    (loss / (N * c.num_particles)).backward()
                    total += float(loss.detach()) / c.num_particles
                    outs.append(logits.detach())
                logits = torch.stack(outs)
            params = [p for g in self.optimizer.param_groups for p in g["params"]]
            self._clip(params)
            self._check_step(total / N, params)
            self.optimizer.step()
            self.scheduler.step()
            return total / N, logits
        # svi: pyro.infer.SVI.step, with gradients in per-example units and a global-norm clip
        assert self.pyro_optim is not None and self._elbo is not None
        self._stash = []
        with poutine.trace(param_only=True) as capture:
            loss = self._elbo.loss_and_grads(self._model, self._guide, xb, yb, N)
        params, seen = [], set()
        for site in capture.trace.nodes.values():
            p = site["value"].unconstrained()
            if id(p) not in seen:
                seen.add(id(p))
                params.append(p)
        for p in params:
            if p.grad is not None:
                p.grad.div_(N)
        self._clip(params)
        self._check_step(float(loss) / N, params)
        self.pyro_optim(params)
        pyro.infer.util.zero_grads(set(params))
        self.pyro_optim.step()
        logits = self._stash[0] if len(self._stash) == 1 else torch.stack(self._stash)
        self._stash = []
        return float(loss) / N, logits

    # ---- metrics ------------------------------------------------------------------------------
    def _correct(self, logits: Tensor, xb: Tensor, yb: Tensor | None) -> tuple[float, float]:
        targets, mask, _ = self.network._targets(xb, yb)
        if logits.dim() > targets.dim() + 1:  # particles: average the predictive
            probs = torch.softmax(logits, -1).reshape((-1,) + logits.shape[-targets.dim() - 1 :])
            pred = probs.mean(0).argmax(-1)
        else:
            pred = logits.argmax(-1)
        hit = pred == targets
        if mask is not None:
            return float((hit & mask).sum()), float(mask.sum())
        return float(hit.sum()), float(hit.numel())

    @torch.no_grad()
    def evaluate(self, data: Any, name: str = "data") -> dict[str, float]:
        """Loss (``config.val_loss``: deterministic NLL or negative ELBO, per example) and
        accuracy (token-level for sequence models) of ``data``; in eval mode, RNG untouched.

        ``data`` takes the forms of ``train_data`` (tensors, datasets, ``DataLoader`` objects, streams);
        it is read in order. ``val_loss="elbo"`` needs the number of examples up front (a stream
        without ``__len__`` supports ``"nll"`` only)."""
        c, net = self.config, self.network
        bs = c.eval_batch_size or max(c.batch_size, 256)
        batches, n = iter_eval_batches(data, name, bs)
        tud = torch.utils.data
        tensors = isinstance(data, tud.TensorDataset) or not isinstance(
            data, (tud.DataLoader, tud.Dataset)
        )
        if tensors:  # in memory: validated in full up front
            _check_data(net, *_as_tensors(data, name), name)
        if c.val_loss == "elbo" and n is None:
            raise ValueError(
                f"{name}: val_loss='elbo' needs the number of examples; give a dataset with "
                f"__len__ or use val_loss='nll'"
            )
        was_training = net.training
        net.eval()
        total = correct = count = 0.0
        seen = 0
        try:
            with _fork_rng():
                for k, (xb, yb) in enumerate(batches):
                    if not tensors:
                        _check_data(net, xb, yb, f"{name} (batch {k})")
                    xb = xb.to(self.device)
                    yb = None if yb is None else yb.to(self.device)
                    seen += len(xb)
                    if c.val_loss == "elbo":
                        assert n is not None
                        loss, logits = net.elbo_loss(xb, yb, num_data=n)
                        total += float(loss) * len(xb) / n
                    else:
                        logits = net(xb, yb)
                        targets, mask, ev = net._targets(xb, yb)
                        total -= float(net._obs_dist(logits, mask, ev).log_prob(targets).sum())
                    k, m = self._correct(logits, xb, yb)
                    correct, count = correct + k, count + m
        finally:
            net.train(was_training)
        if seen == 0:
            raise ValueError(f"{name} is empty: it yields no batch")
        return {"loss": total / (n or seen), "accuracy": correct / max(count, 1.0)}

    # ---- state --------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue exactly (plain containers and tensors only)."""
        if not self._set_up:
            raise RuntimeError("the trainer has no state before fit() set it up")
        c = self.config
        if c.mode == "hybrid":
            assert self.optimizer is not None and self.scheduler is not None
            opt_state: Any = self.optimizer.state_dict()
            sched_state = self.scheduler.state_dict()
        else:
            assert self.pyro_optim is not None
            opt_state = self.pyro_optim.get_state()
            sched_state = None
        return {
            "format": _FORMAT,
            "version": _VERSION,
            "mode": c.mode,
            "config": c.to_dict(),
            "network_class": type(self.network).__name__,
            "network": {k: v.detach().cpu().clone() for k, v in self.network.state_dict().items()},
            "optimizer": copy.deepcopy(opt_state),
            "scheduler": copy.deepcopy(sched_state),
            "step": self.step,
            "epoch": self.epoch,
            "num_data": self._num_data,
            "decay_steps": self._decay_steps,
            "perm": None if self._perm is None else self._perm.clone(),
            "batch_sizes": None if self._batch_sizes is None else self._batch_sizes.clone(),
            "open": self._open,
            "pos": self._pos,
            "data": None if self._data is None else self._data.describe(),
            "accum": dict(self._accum),
            "history": self.history.to_dict(),
            "early_stopping": {
                "bad_evals": self._bad_evals,
                "best_state": self._best_state,
            },
            "rng": _rng_state(self._generator),
        }

    def _check_state(self, state: dict[str, Any], where: str) -> None:
        """Verify a checkpoint fits this trainer and network before anything is modified."""
        if state["mode"] != self.config.mode:
            raise CheckpointError(
                f"checkpoint {where} was made in mode {state['mode']!r}; the trainer is in "
                f"mode {self.config.mode!r}"
            )
        data = state.get("data") or {"kind": "tensors"}
        if self._data is not None and data.get("kind") != self._data.kind:
            raise CheckpointError(
                f"checkpoint {where} was made on train_data of kind {data.get('kind')!r}; "
                f"got {self._data.kind!r}"
            )
        if self._data is not None and self._data.kind == "stream":
            if data.get("batch_size") != self._data.batch_size:  # position counted in batches
                raise CheckpointError(
                    f"checkpoint {where} was made on a stream with batch_size="
                    f"{data.get('batch_size')!r}; got {self._data.batch_size!r}"
                )
        keys = ("batch_size", "drop_last") if data.get("kind") in ("tensors", "dataset") else ()
        for key in keys:  # they define the saved position in the data
            if state["config"].get(key) != getattr(self.config, key):
                raise CheckpointError(
                    f"checkpoint {where} was made with {key}={state['config'].get(key)!r}; "
                    f"the trainer has {key}={getattr(self.config, key)!r}"
                )
        if state.get("num_data") != self._num_data:
            raise CheckpointError(
                f"checkpoint {where} was made with {state.get('num_data')} training examples; "
                f"got {self._num_data}"
            )
        own = self.network.state_dict()
        sd = state["network"]
        missing = sorted(set(own) - set(sd))
        unexpected = sorted(set(sd) - set(own))
        if missing or unexpected:
            raise CheckpointError(
                f"checkpoint {where} does not match {type(self.network).__name__}: "
                f"missing keys {missing}, unexpected keys {unexpected}"
            )
        bad = [
            f"{k}: checkpoint {tuple(sd[k].shape)} vs network {tuple(v.shape)}"
            for k, v in own.items()
            if tuple(sd[k].shape) != tuple(v.shape)
        ]
        if bad:
            raise CheckpointError(f"checkpoint {where} has mismatched shapes: {bad}")
        if self.config.mode == "hybrid":
            assert self.optimizer is not None
            n_own = sum(len(g["params"]) for g in self.optimizer.param_groups)
            groups = state["optimizer"].get("param_groups", [])
            n_ckpt = sum(len(g["params"]) for g in groups)
            if n_own != n_ckpt:
                raise CheckpointError(
                    f"checkpoint {where} optimiser holds {n_ckpt} parameters; the network has "
                    f"{n_own}"
                )
        else:
            unknown = sorted(set(state["optimizer"]) - set(self._param_names))
            if unknown:
                raise CheckpointError(
                    f"checkpoint {where} has optimiser state for unknown parameters {unknown}"
                )

    def load_state_dict(self, state: dict[str, Any], where: str = "state") -> None:
        """Restore a state from :meth:`state_dict` / :func:`load_checkpoint` (after set-up)."""
        if not self._set_up:
            raise RuntimeError("call load_state_dict after set-up (fit(resume=True) does this)")
        self._check_state(state, where)
        try:
            self.network.load_state_dict(state["network"], strict=True)
            if self.config.mode == "hybrid":
                assert self.optimizer is not None and self.scheduler is not None
                self.optimizer.load_state_dict(state["optimizer"])
                self.scheduler.load_state_dict(state["scheduler"])
            else:
                assert self.pyro_optim is not None
                self.pyro_optim.set_state(state["optimizer"])  # consumed per parameter name
            self.step = int(state["step"])
            self.epoch = int(state["epoch"])
            self._decay_steps = int(state["decay_steps"])
            self._perm = state["perm"]
            self._batch_sizes = state.get("batch_sizes")
            self._open = bool(state.get("open", self._perm is not None))
            self._pos = int(state["pos"])
            self._accum = {k: float(v) for k, v in state["accum"].items()}
            self.history = History.from_dict(state["history"])
            self._bad_evals = int(state["early_stopping"]["bad_evals"])
            self._best_state = state["early_stopping"]["best_state"]
            _set_rng_state(state["rng"], self._generator)
        except (KeyError, TypeError, ValueError, RuntimeError) as e:
            raise CheckpointError(f"checkpoint {where} could not be restored: {e}") from e

    def save_checkpoint(self, path: str | os.PathLike) -> Path:
        return save_checkpoint(path, self)

    def load_checkpoint(self, path: str | os.PathLike) -> None:
        self.load_state_dict(load_checkpoint(path), where=repr(str(path)))

    # ---- the loop -----------------------------------------------------------------------------
    def _epoch_record(self, val: Any, evaluate: bool) -> dict[str, Any]:
        """The record of the current (open) epoch, evaluated on ``val`` when asked."""
        a = self._accum
        last = max(self.step - 1, 0)
        rec: dict[str, Any] = {
            "epoch": self.epoch + 1,
            "step": self.step,
            "train_loss": a["loss"] / max(a["batches"], 1.0),
            "train_acc": a["correct"] / max(a["count"], 1.0),
            "val_loss": None,
            "val_acc": None,
            "lr": self.lr_at(last),
            "beta": self.beta(last),
            "seconds": a["seconds"],
        }
        if val is not None and evaluate:
            m = self.evaluate(val, "val_data")
            rec["val_loss"], rec["val_acc"] = m["loss"], m["accuracy"]
        return rec

    def _early_stopping(self, val_loss: float) -> bool:
        """Track the best validation loss; True when patience has run out."""
        c, h = self.config, self.history
        if h.best_val_loss is None or val_loss < h.best_val_loss - c.min_delta:
            h.best_val_loss, h.best_epoch = val_loss, self.epoch + 1
            self._bad_evals = 0
            if c.early_stopping_patience is not None and c.restore_best:
                self._best_state = {
                    k: v.detach().cpu().clone() for k, v in self.network.state_dict().items()
                }
            return False
        self._bad_evals += 1
        patience = c.early_stopping_patience
        return patience is not None and self._bad_evals >= patience

    def fit(
        self,
        train_data: Any,
        val_data: Any = None,
        checkpoint_path: str | os.PathLike | None = None,
        resume: bool | str = False,
        num_data: int | None = None,
    ) -> History:
        """Train until ``config.epochs`` epochs, ``config.max_steps`` steps or early stopping.

        Args:
            train_data: ``(x, y)`` tensors (``y`` may be ``None`` for a ``CausalLM``), a
                ``TensorDataset``, a ``SequenceTask`` (all validated in full before any step), a
                map-style ``Dataset``, an ``IterableDataset`` (a stream, never held in memory)
                or a ``DataLoader`` over either (its own batching; batches validated as they
                come). See :mod:`bayesattn.training.data`.
            val_data: same forms; evaluated every ``eval_every`` epochs (early stopping).
            checkpoint_path: written (atomically) after every epoch and when training stops.
                Checked before any training (a folder, or a path under a file, is a
                ``ValueError``); temporary files left by killed writes are removed.
            resume: continue from ``checkpoint_path`` (which must exist) exactly where it
                stopped: weights, optimiser, schedule, data order, RNG, history. For a stream
                the open epoch restarts the stream and skips the batches already trained on
                (exact when each pass yields the same items in the same order). ``"auto"``:
                resume if the checkpoint exists, else start afresh (the restartable-job idiom).
            num_data: the number of training examples :math:`N` the ELBO is scaled to; needed
                only for a stream without ``__len__`` (default: the length of the data).

        Raises:
            FloatingPointError: "training diverged at step N": a non-finite loss or gradient.
                The step is not applied, so the network keeps its last finite parameters.

        The network is left in eval mode; with early stopping and ``restore_best`` it holds the
        best validation weights.

        Returns:
            the :class:`History`. When ``max_steps`` stops training mid-epoch, it ends with a
            record of that partial epoch, while ``self.history`` (and the checkpoint) keep the
            completed epochs only, so that a resumed run records the whole epoch.
        """
        c, net = self.config, self.network
        if not isinstance(resume, bool) and resume != "auto":
            raise TypeError(f"resume must be True, False or 'auto'; got {resume!r}")
        if resume and checkpoint_path is None:
            raise ValueError(f"resume={resume!r} needs a checkpoint_path")
        if checkpoint_path is not None:
            checkpoint_path = prepare_checkpoint_path(checkpoint_path)
        if resume == "auto":
            resume = checkpoint_path.is_file()
        src = as_train_data(train_data, "train_data", c.batch_size, c.drop_last, num_data)
        if isinstance(src, TensorSource):
            _check_data(net, src.x, src.y, "train_data")
        else:
            _check_data(net, *src.first_batch(), "train_data (batch 0)")
        if val_data is not None:
            batches, _ = iter_eval_batches(val_data, "val_data", c.batch_size)
            with _fork_rng():
                first = next(batches, None)
            if first is None:
                raise ValueError("val_data is empty: it yields no batch")
            _check_data(net, *first, "val_data")
            if isinstance(val_data, (tuple, list)) or not isinstance(
                val_data, (torch.utils.data.DataLoader, torch.utils.data.Dataset)
            ):
                _check_data(net, *_as_tensors(val_data, "val_data"), "val_data")
        if src.kind in ("tensors", "dataset") and c.drop_last and src.num_data < c.batch_size:
            raise ValueError(
                f"batch_size={c.batch_size} with drop_last=True leaves no batch for "
                f"{src.num_data} training examples"
            )
        if self._set_up and self._num_data != src.num_data:
            raise ValueError(
                f"train_data has {src.num_data} examples; this trainer was set up with "
                f"{self._num_data}"
            )
        self._data = src
        ckpt_state = None
        if resume:
            ckpt_state = load_checkpoint(checkpoint_path)  # verify before any work
        if not self._set_up:
            if ckpt_state is None and self.step == 0:
                pyro.set_rng_seed(c.seed)  # torch, random, numpy
            self._setup(src)
        if ckpt_state is not None:
            self.load_state_dict(ckpt_state, where=repr(str(checkpoint_path)))

        nb = src.batches_per_epoch()
        exact_nb = nb if src.kind != "stream" else None  # a stream ends when it ends
        max_steps = c.max_steps if c.max_steps is not None else math.inf
        total = min(c.epochs * nb, max_steps) - self.step if nb is not None else max_steps
        from tqdm.auto import tqdm

        bar = tqdm(
            total=None if math.isinf(total) else max(0, int(total)),
            disable=not c.progress,
            desc=c.mode,
            leave=False,
        )
        net.train()
        try:
            while (
                self.epoch < c.epochs and self.step < max_steps and not self.history.stopped_early
            ):
                if not self._open:
                    plan = src.plan(self._generator, self.epoch)
                    self._perm, self._batch_sizes = plan if plan is not None else (None, None)
                    self._pos, self._accum, self._open = 0, self._new_accum(), True
                plan = None if self._perm is None else (self._perm, self._batch_sizes)
                batches = src.batches(plan, self._pos)
                finished = False
                while True:
                    if self.step >= max_steps:  # does the epoch end here too?
                        if exact_nb is not None:
                            finished = self._pos >= exact_nb
                        else:
                            with _fork_rng():
                                finished = next(batches, None) is None
                        break
                    batch = next(batches, None)
                    if batch is None:
                        finished = True
                        break
                    xb, yb = batch
                    if not isinstance(src, TensorSource):
                        where = f"train_data (epoch {self.epoch + 1}, batch {self._pos})"
                        _check_data(net, xb, yb, where)
                    xb = xb.to(self.device)
                    yb = None if yb is None else yb.to(self.device)
                    t0 = time.perf_counter()
                    loss, logits = self.train_step(xb, yb)
                    self._accum["seconds"] += time.perf_counter() - t0
                    if not math.isfinite(loss):
                        raise FloatingPointError(
                            f"training loss became {loss} at step {self.step} (epoch "
                            f"{self.epoch + 1}); lower lr, enable clip_norm or anneal the KL"
                        )
                    k, m = self._correct(logits, xb, yb)
                    a = self._accum
                    a["loss"] += loss
                    a["batches"] += 1
                    a["correct"] += k
                    a["count"] += m
                    self._pos += 1
                    bar.update(1)
                    bar.set_postfix(
                        epoch=self.epoch + 1,
                        loss=f"{a['loss'] / a['batches']:.4g}",
                        acc=f"{a['correct'] / max(a['count'], 1):.3f}",
                        refresh=False,
                    )
                if not finished:  # stopped mid-epoch by max_steps
                    break
                if self._pos == 0:
                    raise ValueError(f"train_data yielded no batch in epoch {self.epoch + 1}")
                last = self.epoch + 1 == c.epochs or self.step >= max_steps
                rec = self._epoch_record(val_data, (self.epoch + 1) % c.eval_every == 0 or last)
                if rec["val_loss"] is not None and self._early_stopping(rec["val_loss"]):
                    self.history.stopped_early = True
                self.history.append(**rec)
                self.epoch += 1
                self._perm, self._batch_sizes, self._open = None, None, False
                if checkpoint_path is not None:
                    save_checkpoint(checkpoint_path, self)
        finally:
            bar.close()

        history = self.history
        if self._open and self._pos > 0:
            # interrupted mid-epoch by max_steps: the checkpoint keeps the open epoch (a resumed
            # run continues it exactly); the returned history ends with a partial-epoch record
            if checkpoint_path is not None:
                save_checkpoint(checkpoint_path, self)
            history = copy.deepcopy(self.history)
            history.append(**self._epoch_record(val_data, evaluate=True))
        if c.early_stopping_patience is not None and c.restore_best and self._best_state:
            net.load_state_dict(self._best_state)
        net.eval()
        return history


def fit(
    network: BayesianNetwork,
    train_data: Any,
    val_data: Any = None,
    config: TrainConfig | dict | None = None,
    checkpoint_path: str | os.PathLike | None = None,
    resume: bool | str = False,
    num_data: int | None = None,
    **overrides: Any,
) -> History:
    """Train ``network`` on ``train_data``: ``Trainer(network, config, **overrides).fit(...)``.

    Keyword overrides are :class:`TrainConfig` fields (``fit(net, data, mode="svi", epochs=5)``).
    See :class:`Trainer` and :meth:`Trainer.fit`. With ``resume=True`` (or ``"auto"`` and an
    existing checkpoint) and ``config=None`` the configuration saved in the checkpoint is used
    (override e.g. ``max_steps`` or ``epochs``). ``num_data`` is the number of training examples,
    for a stream without ``__len__``.
    """
    if config is None and resume and checkpoint_path is not None:
        if Path(checkpoint_path).is_file():
            config = TrainConfig.from_dict(load_checkpoint(checkpoint_path)["config"])
    return Trainer(network, config, **overrides).fit(
        train_data,
        val_data=val_data,
        checkpoint_path=checkpoint_path,
        resume=resume,
        num_data=num_data,
    )
