"""The training loop: :class:`Trainer` (SVI or one-pass hybrid ELBO, KL annealing, early
stopping, exact resume) and the function :func:`fit`. See :mod:`bayesattn.inference` for the
objective and the training methods."""

from __future__ import annotations

import copy
import math
import os
import time
from pathlib import Path
from typing import Any

import pyro
import pyro.optim
import torch
from pyro import poutine
from pyro.infer import Trace_ELBO, TraceMeanField_ELBO
from torch import Tensor

from .._deprecation import renamed_kwargs
from .._validation import torch_generator
from ..nn.networks import BayesianNetwork
from .checkpoint import (
    _FORMAT,
    _VERSION,
    CheckpointError,
    _rng_state,
    _set_rng_state,
    check_state_fits,
    load_checkpoint,
    prepare_checkpoint_path,
    save_checkpoint,
    upgrade_state,
)
from .config import TrainConfig, _resolve_config
from .data import (
    DataSource,
    TensorSource,
    _as_tensors,
    as_train_data,
    iter_eval_batches,
)
from .data import fork_rng as _fork_rng
from .history import History
from .kl import AnnealedPair, kl_beta
from .schedules import lr_factor, lr_scheduler

__all__ = ["Trainer", "fit", "sync_param_store"]


def _check_data(net: BayesianNetwork, x: Tensor, y: Tensor | None, name: str) -> None:
    """Validate the whole dataset once, before any step; re-raise naming the argument."""
    try:
        net.check_batch(x, y)
    except (ValueError, TypeError) as e:
        raise type(e)(f"{name}: {e}") from e
    try:
        targets = net.targets(x[:1], None if y is None else y[:1])[0]
    except (TypeError, ValueError, IndexError):
        targets = None
    if targets is None:
        raise ValueError(
            f"{name}: {type(net).__name__} needs targets y to train and evaluate; got y=None"
        )


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
        optimizer: the ``torch.optim.AdamW`` optimiser (hybrid method; ``None`` with svi).
        scheduler: its ``LambdaLR`` learning-rate schedule (hybrid method).
        pyro_optim: the ``pyro.optim`` scheduler (svi method).
        last_grad_norm: global gradient norm of the last step *before* clipping.

    Example::

        trainer = Trainer(net, TrainConfig(method="svi", epochs=3, progress=False))
        history = trainer.fit((x, y), val_data=(xv, yv), checkpoint_path="ckpt.pt")
        # later, in a fresh process: a new network and trainer continue exactly
        Trainer(new_net, trainer.config).fit((x, y), (xv, yv), "ckpt.pt", resume=True)
    """

    @renamed_kwargs(mode="method")
    def __init__(
        self,
        network: BayesianNetwork,
        config: TrainConfig | dict | None = None,
        **overrides: Any,
    ) -> None:
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
        self._generator = torch_generator(self.config.seed)
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
        self._beta = 1.0
        self._pair = AnnealedPair(self.network, self._current_beta)  # a method: picklable
        self._elbo: Trace_ELBO | None = None
        self._set_up = False

    # ---- schedules ----------------------------------------------------------------------------
    def _current_beta(self) -> float:
        """The KL weight of the step in progress (read by the annealed model/guide pair)."""
        return self._beta

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

        if c.method == "hybrid":
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
            norm = torch.nn.utils.get_total_norm([p.grad for p in grads if p.grad is not None])
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
        if c.method == "hybrid":
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
        self._pair.clear()
        with poutine.trace(param_only=True) as capture:
            loss = self._elbo.loss_and_grads(self._pair.model, self._pair.guide, xb, yb, N)
        params, seen = [], set()
        for name, site in capture.trace.nodes.items():
            if site["value"] is None:  # pragma: no cover - Pyro records every param's value
                raise RuntimeError(f"param site {name!r} has no value")
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
        return float(loss) / N, self._pair.pop_logits()

    # ---- metrics ------------------------------------------------------------------------------
    def _correct(self, logits: Tensor, xb: Tensor, yb: Tensor | None) -> tuple[float, float]:
        targets, mask, _ = self.network.targets(xb, yb)
        if targets is None:
            raise ValueError(
                f"{type(self.network).__name__}.targets(x, y) gave no targets: accuracy needs labels"
            )
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
                        targets, mask, ev = net.targets(xb, yb)
                        if targets is None:
                            raise ValueError(f"{name}: validation needs targets; got y=None")
                        total -= float(net.likelihood(logits, mask, ev).log_prob(targets).sum())
                    hits, m = self._correct(logits, xb, yb)
                    correct, count = correct + hits, count + m
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
        if c.method == "hybrid":
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
            "method": c.method,
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

    def load_state_dict(self, state: dict[str, Any], where: str = "state") -> None:
        """Restore a state from :meth:`state_dict` / :func:`load_checkpoint` (after set-up)."""
        if not self._set_up:
            raise RuntimeError("call load_state_dict after set-up (fit(resume=True) does this)")
        state = upgrade_state(state, self.network.state_dict().keys(), self._param_names)
        check_state_fits(  # before anything is modified
            state,
            where=where,
            config=self.config,
            data=None if self._data is None else self._data.describe(),
            num_data=self._num_data,
            network=self.network,
            optimizer=self.optimizer if self.config.method == "hybrid" else None,
            param_names=self._param_names,
        )
        try:
            self.network.load_state_dict(state["network"], strict=True)
            if self.config.method == "hybrid":
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
                only for a stream without ``__len__`` (default: the length of the data). A
                stream that yields more than ``N`` examples in one epoch, or ``num_data`` that
                differs from the data's length, is a ``ValueError``; so is
                ``early_stopping_patience`` without ``val_data``.

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
        checkpoint_path, resume = self._resume_args(checkpoint_path, resume)
        c = self.config
        src = as_train_data(train_data, "train_data", c.batch_size, c.drop_last, num_data)
        self._check_fit_data(src, val_data)
        self._begin(src, checkpoint_path, resume)
        self._train_epochs(src, val_data, checkpoint_path)
        return self._end(val_data, checkpoint_path)

    # ---- fit, step by step -------------------------------------------------------------------
    @staticmethod
    def _resume_args(
        checkpoint_path: str | os.PathLike | None, resume: bool | str
    ) -> tuple[Path | None, bool]:
        """Check ``resume`` against ``checkpoint_path`` (prepared for writing); ``"auto"``
        becomes whether the checkpoint exists."""
        if not isinstance(resume, bool) and resume != "auto":
            raise TypeError(f"resume must be True, False or 'auto'; got {resume!r}")
        if resume and checkpoint_path is None:
            raise ValueError(f"resume={resume!r} needs a checkpoint_path")
        path = None if checkpoint_path is None else prepare_checkpoint_path(checkpoint_path)
        if resume == "auto":
            assert path is not None
            resume = path.is_file()
        return path, bool(resume)

    def _check_fit_data(self, src: DataSource, val_data: Any) -> None:
        """Validate the training data (in full when in memory, else its first batch) and the
        validation data before any step; the data must fit a trainer that is already set up."""
        c, net = self.config, self.network
        if isinstance(src, TensorSource):
            _check_data(net, src.x, src.y, "train_data")
        else:
            _check_data(net, *src.first_batch(), "train_data (batch 0)")
        if val_data is not None:
            self._check_val_data(val_data)
        elif self.config.early_stopping_patience is not None:
            raise ValueError(
                f"early_stopping_patience={self.config.early_stopping_patience} needs val_data "
                "(early stopping watches the validation loss); give val_data= or drop the "
                "patience"
            )
        if src.kind in ("tensors", "dataset") and c.drop_last and (src.num_data or 0) < c.batch_size:
            raise ValueError(
                f"batch_size={c.batch_size} with drop_last=True leaves no batch for "
                f"{src.num_data} training examples"
            )
        if self._set_up and self._num_data != src.num_data:
            raise ValueError(
                f"train_data has {src.num_data} examples; this trainer was set up with "
                f"{self._num_data}"
            )

    def _check_val_data(self, val_data: Any) -> None:
        """``val_data`` yields a valid first batch (RNG untouched); tensors are checked in full."""
        net = self.network
        batches, _ = iter_eval_batches(val_data, "val_data", self.config.batch_size)
        with _fork_rng():
            first = next(batches, None)
        if first is None:
            raise ValueError("val_data is empty: it yields no batch")
        _check_data(net, *first, "val_data")
        if isinstance(val_data, (tuple, list)) or not isinstance(
            val_data, (torch.utils.data.DataLoader, torch.utils.data.Dataset)
        ):
            _check_data(net, *_as_tensors(val_data, "val_data"), "val_data")

    def _begin(self, src: DataSource, checkpoint_path: Path | None, resume: bool) -> None:
        """Take ``src`` as the training data, set up on first use (seeding a fresh run) and, when
        resuming, restore the checkpoint (verified before any work)."""
        self._data = src
        ckpt_state = None
        if resume:
            assert checkpoint_path is not None
            ckpt_state = load_checkpoint(checkpoint_path)  # verify before any work
        if not self._set_up:
            if ckpt_state is None and self.step == 0:
                pyro.set_rng_seed(self.config.seed)  # torch, random, numpy
            self._setup(src)
        if ckpt_state is not None:
            self.load_state_dict(ckpt_state, where=repr(str(checkpoint_path)))

    def _train_epochs(self, src: DataSource, val_data: Any, checkpoint_path: Path | None) -> None:
        """The epoch loop, under a progress bar, until ``epochs``, ``max_steps`` or early
        stopping."""
        c = self.config
        nb = src.batches_per_epoch()
        exact_nb = nb if src.kind != "stream" else None  # a stream ends when it ends
        max_steps = c.max_steps if c.max_steps is not None else math.inf
        total = min(c.epochs * nb, max_steps) - self.step if nb is not None else max_steps
        from tqdm.auto import tqdm

        bar = tqdm(
            total=None if math.isinf(total) else max(0, int(total)),
            disable=not c.progress,
            desc=c.method,
            leave=False,
        )
        self.network.train()
        try:
            while (
                self.epoch < c.epochs and self.step < max_steps and not self.history.stopped_early
            ):
                if not self._train_epoch(src, bar, max_steps, exact_nb):
                    break  # stopped mid-epoch by max_steps
                self._close_epoch(val_data, checkpoint_path, max_steps)
        finally:
            bar.close()

    def _train_epoch(
        self, src: DataSource, bar: Any, max_steps: float, exact_nb: int | None
    ) -> bool:
        """Train on the rest of the open epoch (opening the next one if none is open): True when
        the epoch's data ran out, False when ``max_steps`` stopped it before its end."""
        if not self._open:
            plan = src.plan(self._generator, self.epoch)
            self._perm, self._batch_sizes = plan if plan is not None else (None, None)
            self._pos, self._accum, self._open = 0, self._new_accum(), True
        plan = None if self._perm is None else (self._perm, self._batch_sizes)
        batches = src.batches(plan, self._pos)
        while True:
            if self.step >= max_steps:  # does the epoch end here too?
                if exact_nb is not None:
                    return self._pos >= exact_nb
                with _fork_rng():
                    return next(batches, None) is None
            batch = next(batches, None)
            if batch is None:
                return True
            xb, yb = batch
            self._train_batch(src, xb, yb, bar)

    def _train_batch(self, src: DataSource, xb: Tensor, yb: Tensor | None, bar: Any) -> None:
        """One step on a batch of the open epoch (validated first unless the data is in memory,
        where it was validated in full), added to the epoch's running record."""
        if not isinstance(src, TensorSource):
            where = f"train_data (epoch {self.epoch + 1}, batch {self._pos})"
            _check_data(self.network, xb, yb, where)
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

    def _close_epoch(self, val_data: Any, checkpoint_path: Path | None, max_steps: float) -> None:
        """Record the finished epoch (evaluated every ``eval_every`` epochs and after the last),
        track early stopping and write the checkpoint."""
        c = self.config
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

    def _end(self, val_data: Any, checkpoint_path: Path | None) -> History:
        """After the loop: checkpoint an epoch left open by ``max_steps`` (and return a history
        ending with its partial record), restore the best weights if asked, eval mode."""
        c, net = self.config, self.network
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


@renamed_kwargs(mode="method")
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

    Keyword overrides are :class:`TrainConfig` fields (``fit(net, data, method="svi", epochs=5)``).
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
