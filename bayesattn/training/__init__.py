"""Building blocks of the training loops (:mod:`bayesattn.inference`, :mod:`bayesattn.lightning`).

* :mod:`bayesattn.training.objective`: the objective both loops optimise, ``ElboObjective``
  (hybrid or SVI negative ELBO per example, particles, the KL weight β).
* :mod:`bayesattn.training.validation`: validation, one way for both loops (``validate``: the
  loss early stopping watches and the posterior predictive's accuracy, NLL and ECE).
* :mod:`bayesattn.training.schedules`: learning-rate schedules built from
  :mod:`torch.optim.lr_scheduler` (warm-up, then cosine, linear or step decay).
* :mod:`bayesattn.training.optimisation`: AdamW and the schedule of a method, gradient clipping
  and the refusal of a non-finite step (``Optimisation``).
* :mod:`bayesattn.training.data`: what ``fit`` accepts as data (tensors, map-style and iterable
  datasets, ``DataLoader`` objects) and the epoch order that makes resume exact.
* :mod:`bayesattn.training.checks`: what ``fit`` checks before any step.
* :mod:`bayesattn.training.config`: :class:`~bayesattn.training.config.TrainConfig`, the
  validated training options.
* :mod:`bayesattn.training.kl`: KL annealing (``kl_beta``, ``ScaleLatents``, ``AnnealedPair``).
* :mod:`bayesattn.training.loop`: the epoch loop and the open epoch's state (``EpochState``).
* :mod:`bayesattn.training.early_stopping`: ``EarlyStopping`` and restoring the best weights.
* :mod:`bayesattn.training.history`: the per-epoch record ``History``
  (:mod:`bayesattn.training.curves` draws it).
* :mod:`bayesattn.training.checkpoint`: atomic, verified, exact-resume checkpoints, and
  ``check_state_fits``, whether a saved state fits a run; :mod:`bayesattn.training.resume`: a
  trainer's whole state and back.
* :mod:`bayesattn.training.param_store`: Pyro's parameter store and a network's parameters.
* :mod:`bayesattn.training.trainer`: ``Trainer``, assembled from the parts above, and ``fit``
  (re-exported by :mod:`bayesattn.inference`, the place to import them from).
"""

from __future__ import annotations

from .data import as_train_data, fork_rng, iter_eval_batches
from .schedules import LR_DECAYS, lr_factor, lr_scheduler

__all__ = [
    "LR_DECAYS",
    "lr_factor",
    "lr_scheduler",
    "as_train_data",
    "iter_eval_batches",
    "fork_rng",
]
