"""Building blocks of the training loops (:mod:`bayesattn.inference`, :mod:`bayesattn.lightning`).

* :mod:`bayesattn.training.schedules`: learning-rate schedules built from
  :mod:`torch.optim.lr_scheduler` (warm-up, then cosine, linear or step decay).
* :mod:`bayesattn.training.data`: what ``fit`` accepts as data (tensors, map-style and iterable
  datasets, ``DataLoader`` objects) and the epoch order that makes resume exact.
* :mod:`bayesattn.training.config`: :class:`~bayesattn.training.config.TrainConfig`, the
  validated training options.
* :mod:`bayesattn.training.kl`: KL annealing (``kl_beta``, ``ScaleLatents``, ``AnnealedPair``).
* :mod:`bayesattn.training.history`: the per-epoch record ``History``.
* :mod:`bayesattn.training.checkpoint`: atomic, verified, exact-resume checkpoints, and
  ``check_state_fits``, whether a saved state fits a run.
* :mod:`bayesattn.training.trainer`: the loop, ``Trainer`` and ``fit`` (all of these are
  re-exported by :mod:`bayesattn.inference`, the place to import them from).
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
