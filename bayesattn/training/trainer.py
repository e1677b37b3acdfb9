"""The training loop: :class:`Trainer` (SVI or one-pass hybrid ELBO, KL annealing, early
stopping, exact resume) and the function :func:`fit`. See :mod:`bayesattn.training` for the
training methods.

The trainer is assembled from small parts, one module each: the objective
(:mod:`~bayesattn.training.objective`), the optimiser and schedule
(:mod:`~bayesattn.training.optimisation`), the epoch loop (:mod:`~bayesattn.training.loop`),
validation (:mod:`~bayesattn.training.validation`), early stopping
(:mod:`~bayesattn.training.early_stopping`), the checks before training
(:mod:`~bayesattn.training.checks`) and the saved state (:mod:`~bayesattn.training.resume`,
:mod:`~bayesattn.training.checkpoint`)."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import pyro
import torch
from torch import Tensor, nn

from .._validation import check_has_values
from ..nn.networks import BayesianNetwork
from ..nn.networks.foreign import as_network
from .checkpoint import load_checkpoint, save_checkpoint
from .checks import check_fit_data, diverged_forward, resume_args
from .config import TrainConfig, resolve_config
from .data import DataSource, as_train_data
from .data import fork_rng as _fork_rng
from .early_stopping import EarlyStopping
from .history import History
from .loop import epoch_record, train_epochs
from .objective import ElboObjective
from .optimisation import Optimisation, diverged_error, schedule_args
from .param_store import sync_param_store
from .resume import restore_trainer_state, trainer_state
from .schedules import lr_factor
from .state import EpochState, StateField, TrainerState
from .validation import validate

__all__ = ["Trainer", "fit", "sync_param_store"]


class Trainer:
    """Trains a :class:`~bayesattn.nn.networks.BayesianNetwork` (see the module docstring), or
    any ``nn.Module`` that returns logits ``(B, C)``.

    Args:
        network: the network to train (moved to ``config.device``); a plain ``nn.Module`` (a
            converted torch or transformers model) is wrapped in a
            :class:`~bayesattn.nn.networks.ModuleClassifier` (``self.network``) and trained
            in place; wrap it yourself to give ``forward=``.
        config: a :class:`TrainConfig` (or a dict of its fields); ``overrides`` replace fields.

    Attributes:
        state: the :class:`~bayesattn.training.state.TrainerState`, the one owner of what the
            trainer advances; the attributes below (but ``objective``) are views of its fields.
        history: the :class:`History` so far.
        step: optimiser steps taken so far.
        epoch: completed epochs.
        objective: the :class:`~bayesattn.training.objective.ElboObjective` it optimises.
        optimisation: the :class:`~bayesattn.training.optimisation.Optimisation` (after
            set-up); ``optimizer``, ``scheduler``, ``pyro_optim`` and ``last_grad_norm`` are its.
        early_stopping: the :class:`~bayesattn.training.early_stopping.EarlyStopping` state.
        epoch_state: the open epoch (:class:`~bayesattn.training.state.EpochState`).
        num_data: the number of training examples :math:`N` (after set-up); ``data`` the training
            data source; ``param_names`` the Pyro parameter names of the model and guide;
            ``generator`` the data-order generator (seeded by ``config.seed``).

    Example::

        trainer = Trainer(net, TrainConfig(method="svi", epochs=3, progress=False))
        history = trainer.fit((x, y), val_data=(xv, yv), checkpoint_path="ckpt.pt")
        # later, in a fresh process: a new network and trainer continue exactly
        Trainer(new_net, trainer.config).fit((x, y), (xv, yv), "ckpt.pt", resume=True)
    """

    def __init__(
        self,
        network: BayesianNetwork | nn.Module,
        config: TrainConfig | dict | None = None,
        **overrides: Any,
    ) -> None:
        self.state = TrainerState.fresh(as_network(network), resolve_config(config, overrides))
        self.objective = ElboObjective(self.network, self.config)

    #: the trainer's attributes below are views of its one state, ``self.state``
    network = StateField[BayesianNetwork]()
    config = StateField[TrainConfig]()
    device = StateField[torch.device]()
    history = StateField[History]()
    step = StateField[int]()
    epoch = StateField[int]()
    optimisation = StateField["Optimisation | None"]()
    early_stopping = StateField[EarlyStopping]()
    epoch_state = StateField[EpochState]()
    generator = StateField[torch.Generator]()
    num_data = StateField["int | None"]()
    data = StateField["DataSource | None"]()
    param_names = StateField["list[str]"]()

    def _reset(self) -> None:
        """The state of a trainer that has not trained yet."""
        self.state = TrainerState.fresh(self.network, self.config)
        self.objective = ElboObjective(self.network, self.config)

    # ---- the optimiser's parts ----------------------------------------------------------------
    @property
    def optimizer(self) -> torch.optim.Optimizer | None:
        """The ``torch.optim.AdamW`` optimiser (hybrid method; ``None`` with svi)."""
        return None if self.optimisation is None else self.optimisation.optimizer

    @property
    def scheduler(self) -> torch.optim.lr_scheduler.LRScheduler | None:
        """Its learning-rate schedule (hybrid method)."""
        return None if self.optimisation is None else self.optimisation.scheduler

    @property
    def pyro_optim(self) -> pyro.optim.PyroLRScheduler | None:
        """The ``pyro.optim`` scheduler (svi method)."""
        return None if self.optimisation is None else self.optimisation.pyro_optim

    @property
    def last_grad_norm(self) -> float | None:
        """Global gradient norm of the last step *before* clipping."""
        return None if self.optimisation is None else self.optimisation.last_grad_norm

    # ---- schedules ----------------------------------------------------------------------------
    def beta(self, step: int | None = None) -> float:
        """KL weight β used at (0-based) step ``step`` (default: the next step)."""
        return self.objective.beta_at(self.step if step is None else step)

    def lr_at(self, step: int | None = None) -> float:
        """Learning rate used at (0-based) step ``step`` (default: the next step)."""
        s = self.step if step is None else step
        if self.optimisation is not None:
            return self.config.lr * self.optimisation.lr_factor(s)
        return self.config.lr * lr_factor(s, **schedule_args(self.config, None))

    def make_scheduler(
        self, optimizer: torch.optim.Optimizer
    ) -> torch.optim.lr_scheduler.LRScheduler:
        """The configured :func:`lr_scheduler` over ``optimizer`` (after set-up: it needs the
        schedule length)."""
        if self.optimisation is None:
            raise RuntimeError("make_scheduler needs a set-up trainer: call fit() first")
        return self.optimisation.make_scheduler(optimizer)

    # ---- set-up -------------------------------------------------------------------------------
    def _setup(self, src: DataSource) -> None:
        """Build the optimiser once; needs the training data for the schedule length and one
        dry call that creates any lazily built parameters (e.g. a weight autoguide)."""
        c, net = self.config, self.network
        assert src.num_data is not None
        self.num_data = n = src.num_data
        nb = src.batches_per_epoch()
        if c.decay_steps is None and nb is None and c.lr_decay in ("cosine", "linear"):
            raise ValueError(
                f"lr_decay={c.lr_decay!r} needs the schedule length, and the number of batches "
                f"per epoch of train_data is unknown: set TrainConfig.decay_steps"
            )
        net.to(self.device)
        xb, yb = src.first_batch()
        xb = xb.to(self.device)
        yb = None if yb is None else yb.to(self.device)
        self.param_names = sync_param_store(net, xb, yb, n)
        if c.method == "hybrid":
            with _fork_rng(), torch.no_grad():  # creates lazily built parameters, if any
                net.elbo_loss(xb, yb, num_data=n)
        decay_steps = c.decay_steps or max(1, c.epochs * (nb or 1))
        self.optimisation = Optimisation(net, c, decay_steps)

    # ---- one step -----------------------------------------------------------------------------
    def train_step(self, xb: Tensor, yb: Tensor | None) -> tuple[float, Tensor]:
        """One optimiser step on a minibatch (after :meth:`fit` has set the trainer up; no
        input validation, for custom loops and benchmarks). Advances ``step``.

        Returns:
            the β-weighted negative ELBO per training example, and the detached logits
            ``(*P, B, ...)`` of the sampled-attention pass (``P`` particles when > 1).
        """
        if self.optimisation is None:
            raise RuntimeError("train_step needs a set-up trainer: call fit() first")
        opt, obj = self.optimisation, self.objective
        assert self.num_data is not None
        obj.set_step(self.step)
        try:
            opt.zero_grad()
            out = obj.loss_and_grads(xb, yb, self.num_data)
            refused = opt.step(self.network, out.params, out.loss)
        except (FloatingPointError, ValueError) as e:
            # overflowed parameters/activations surface in the forward pass as non-finite logits
            # or "query must be finite"; with a finite batch that is divergence, not bad input
            if not diverged_forward(e, xb):
                raise
            raise self._diverged(f"the forward pass failed ({e})") from e
        if refused is not None:
            raise self._diverged(refused)
        self.step += 1
        return out.loss, out.logits

    def _diverged(self, detail: str) -> Exception:
        where = f"step {self.step} (epoch {self.epoch + 1})"
        return diverged_error(self.network, self.config, where, detail)

    # ---- validation ---------------------------------------------------------------------------
    def evaluate(self, data: Any, name: str = "data") -> dict[str, float]:
        """Validation metrics of ``data`` (:func:`~bayesattn.training.validation.validate`):
        ``"loss"`` (``config.val_loss``: deterministic NLL or negative ELBO, per example) and the
        posterior predictive's ``"accuracy"``, ``"nll"`` and ``"ece"`` (``config.val_samples``
        draws; token-level for sequence models); in eval mode, RNG untouched.

        ``data`` takes the forms of ``train_data`` (tensors, datasets, ``DataLoader`` objects,
        streams); it is read in order. ``val_loss="elbo"`` needs the number of examples up front
        (a stream without ``__len__`` supports ``"nll"`` only)."""
        c = self.config
        return validate(
            self.network,
            data,
            name=name,
            batch_size=c.eval_batch_size or max(c.batch_size, 256),
            device=self.device,
            val_loss=c.val_loss,
            num_samples=c.val_samples,
        )

    # ---- state --------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue exactly (plain containers and tensors only)."""
        if self.optimisation is None:
            raise RuntimeError("the trainer has no state before fit() set it up")
        return trainer_state(self.state)

    def load_state_dict(self, state: dict[str, Any], where: str = "state") -> None:
        """Restore a state from :meth:`state_dict` / :func:`load_checkpoint` (after set-up)."""
        if self.optimisation is None:
            raise RuntimeError("call load_state_dict after set-up (fit(resume=True) does this)")
        restore_trainer_state(self.state, state, where)

    def save_checkpoint(self, path: str | os.PathLike) -> Path:
        return save_checkpoint(path, self)

    def load_checkpoint(self, path: str | os.PathLike) -> None:
        self.load_state_dict(load_checkpoint(path), where=repr(str(path)))

    # ---- fit ----------------------------------------------------------------------------------
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
        checkpoint_path, resume = resume_args(checkpoint_path, resume)
        check_has_values("network", self.network)
        c = self.config
        src = as_train_data(train_data, "train_data", c.batch_size, c.drop_last, num_data)
        set_up_n = None if self.optimisation is None else self.num_data
        check_fit_data(self.network, c, src, val_data, set_up_n)
        undo = self._snapshot()
        try:
            self._begin(src, checkpoint_path, resume)
            train_epochs(self, src, val_data, checkpoint_path)
            return self._end(val_data, checkpoint_path)
        except Exception as e:
            # a fit that raises leaves the network, the Pyro param store and the trainer as they
            # were before it; a diverged step keeps its last finite parameters (documented)
            if not (isinstance(e, FloatingPointError) and "training diverged" in str(e)):
                undo()
            raise

    def _snapshot(self) -> Any:
        """A function that puts the network (parameters, buffers, train/eval flags, device),
        the Pyro param store's names and this trainer back as they are now."""
        net = self.network
        weights = {k: v.detach().clone() for k, v in net.state_dict(keep_vars=True).items()}
        flags = [(m, m.training) for m in net.modules()]
        ref = next(iter(net.parameters()), None)
        device = None if ref is None else ref.device
        store = pyro.get_param_store()
        names = set(store.keys())
        trainer = None if self.optimisation is None else copy.deepcopy(self.state_dict())

        def undo() -> None:
            for name in set(store.keys()) - names:
                del store[name]
            if device is not None:
                net.to(device)
            net.load_state_dict(weights, strict=False)
            for m, flag in flags:
                m.training = flag
            if trainer is None:
                self._reset()
            else:
                self.load_state_dict(trainer)

        return undo

    def _begin(self, src: DataSource, checkpoint_path: Path | None, resume: bool) -> None:
        """Take ``src`` as the training data, set up on first use (seeding a fresh run) and, when
        resuming, restore the checkpoint (verified before any work)."""
        self.data = src
        ckpt_state = None
        if resume:
            assert checkpoint_path is not None
            ckpt_state = load_checkpoint(checkpoint_path)  # verify before any work
        if self.optimisation is None:
            if ckpt_state is None and self.step == 0:
                pyro.set_rng_seed(self.config.seed)  # torch, random, numpy
            self._setup(src)
        if ckpt_state is not None:
            self.load_state_dict(ckpt_state, where=repr(str(checkpoint_path)))

    def _end(self, val_data: Any, checkpoint_path: Path | None) -> History:
        """After the loop: checkpoint an epoch left open by ``max_steps`` (and return a history
        ending with its partial record), restore the best weights if asked, eval mode."""
        history = self.history
        if self.epoch_state.open and self.epoch_state.pos > 0:
            # interrupted mid-epoch by max_steps: the checkpoint keeps the open epoch (a resumed
            # run continues it exactly); the returned history ends with a partial-epoch record
            if checkpoint_path is not None:
                save_checkpoint(checkpoint_path, self)
            history = copy.deepcopy(self.history)
            history.append(**epoch_record(self, val_data, evaluate=True))
        self.early_stopping.restore(self.network)
        self.network.eval()
        return history


def fit(
    network: BayesianNetwork | nn.Module,
    train_data: Any,
    val_data: Any = None,
    config: TrainConfig | dict | None = None,
    checkpoint_path: str | os.PathLike | None = None,
    resume: bool | str = False,
    num_data: int | None = None,
    **overrides: Any,
) -> History:
    """Train ``network`` on ``train_data``: ``Trainer(network, config, **overrides).fit(...)``.

    ``network`` is a :class:`~bayesattn.nn.networks.BayesianNetwork` or any ``nn.Module`` whose
    forward returns class logits ``(B, C)`` (a transformers output's ``.logits`` included), e.g.
    a model converted by :func:`bayesattn.convert` or :func:`bayesattn.interop.hf.convert_hf`: it
    is trained in place through :class:`~bayesattn.nn.networks.ModuleClassifier` (use
    ``fit(ModuleClassifier(model, forward=...), ...)`` when ``model(x)`` is not the logits).

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
