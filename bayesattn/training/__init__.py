r"""Training Bayesian-attention networks: SVI and one-pass ("hybrid") ELBO training loops,
KL annealing, learning-rate schedules, early stopping and exact-resume checkpoints.

Two objectives (training methods, ``TrainConfig.method``), one loop (:class:`Trainer`, or the
function :func:`fit`):

``method="svi"``
    ``pyro.infer`` ELBO (``Trace_ELBO`` or ``TraceMeanField_ELBO``) of ``network.model`` against
    ``network.guide``: the guide runs the network once with attention drawn from the amortised
    posteriors, the model runs it again, replayed, scoring those draws under the priors. Steps are
    taken by a :class:`pyro.optim.PyroLRScheduler` (our :func:`lr_scheduler` over
    ``torch.optim.AdamW``) on the
    parameters captured from the trace, exactly like :meth:`pyro.infer.SVI.step`, with one addition:
    the gradients are clipped to a *global* norm (over all parameters together, as in the hybrid method)
    before the per-parameter optimisers step.
``method="hybrid"``
    ``network.elbo_loss``: the same negative ELBO in **one** network pass with analytic
    :math:`\mathrm{KL}(q\|p)` per attention layer, optimised by ``torch.optim.AdamW`` on
    ``network.parameters()`` with :func:`lr_scheduler` and ``clip_grad_norm_``.

The learning-rate schedule (warm-up, then cosine, linear or step decay) is built from stock
:mod:`torch.optim.lr_scheduler` objects by :func:`bayesattn.training.schedules.lr_scheduler`;
:func:`lr_factor` is its closed form. Training data may be tensors, map-style or iterable
(streaming) datasets, or ``DataLoader`` objects (:mod:`bayesattn.training.data`).

In both methods the optimised objective is the minibatch estimate of the dataset's negative ELBO
divided by ``num_data`` (the negative ELBO *per training example*):

.. math::
    \mathcal L_\beta = -\frac{1}{B}\sum_{b\in\text{batch}}\Big(E_q\log p(y_b\mid x_b, w_b)
    - \beta\,\mathrm{KL}\big(q(w_b\mid x_b)\,\|\,p(w_b\mid x_b)\big)\Big)
    + \frac{\beta}{N}\,\mathrm{KL}_{\text{weights}}

(the network scales the minibatch by :math:`N/B`; the trainer divides by :math:`N`). The optimum is
unchanged; ``clip_norm`` and the reported ``train_loss`` are in per-example units that do not grow
with the dataset. :math:`\beta` rises linearly from ``kl_start`` to 1 over ``kl_anneal_steps``;
with the SVI method it is applied by :class:`ScaleLatents`, a messenger that multiplies the scale of every
latent (unobserved) sample site by :math:`\beta` in model *and* guide, leaving ``"obs"`` at 1.

Checkpoints (:func:`save_checkpoint`, :func:`load_checkpoint`) are written atomically, load with
``torch.load(path, weights_only=True)``, carry a SHA-256 digest of their contents, and hold
everything needed to continue bit-for-bit: network, optimiser and scheduler states, counters, the
current epoch's data order and position, history, early-stopping state and all RNG states.
Resume is exact for tensors, map-style datasets and ``DataLoader`` objects over them (the epoch's order
is saved); for a stream (an ``IterableDataset``) it restarts the stream and skips the batches of
the open epoch already trained on, which is exact when every pass over the stream yields the same
items in the same order.

The objective is :class:`~bayesattn.training.objective.ElboObjective` (shared with
:mod:`bayesattn.training.lightning`); validation, :func:`~bayesattn.training.validation.validate`, reports
the loss of ``TrainConfig.val_loss`` and the posterior predictive's accuracy, NLL and ECE.
The pieces live in one module each and the public ones are re-exported here, the place to
import them from:

* :mod:`~bayesattn.training.objective`: the objective both loops optimise, ``ElboObjective``
  (hybrid or SVI negative ELBO per example, particles, the KL weight β).
* :mod:`~bayesattn.training.validation`: validation, one way for both loops (``validate``: the
  loss early stopping watches and the posterior predictive's accuracy, NLL and ECE).
* :mod:`~bayesattn.training.schedules`: learning-rate schedules built from
  :mod:`torch.optim.lr_scheduler` (:func:`lr_factor`, :func:`lr_scheduler`).
* :mod:`~bayesattn.training.optimisation`: AdamW and the schedule of a method, gradient clipping
  and the refusal of a non-finite step (``Optimisation``).
* :mod:`~bayesattn.training.data`: what ``fit`` accepts as data (tensors, map-style and iterable
  datasets, ``DataLoader`` objects) and the epoch order that makes resume exact.
* :mod:`~bayesattn.training.checks`: what ``fit`` checks before any step.
* :mod:`~bayesattn.training.config`: :class:`TrainConfig`, the validated training options.
* :mod:`~bayesattn.training.kl`: KL annealing (:func:`kl_beta`, :class:`ScaleLatents`,
  ``AnnealedPair``).
* :mod:`~bayesattn.training.state`: the trainer's state, owned in one place (``TrainerState``)
  with the open epoch's (``EpochState``).
* :mod:`~bayesattn.training.loop`: the epoch loop, which advances that state.
* :mod:`~bayesattn.training.early_stopping`: ``EarlyStopping`` and restoring the best weights.
* :mod:`~bayesattn.training.history`: the per-epoch record :class:`History`
  (:mod:`~bayesattn.training.curves` draws it).
* :mod:`~bayesattn.training.checkpoint`: atomic, verified, exact-resume checkpoints
  (:func:`save_checkpoint`, :func:`load_checkpoint`, :func:`prepare_checkpoint_path`,
  :class:`CheckpointError`) and ``check_state_fits``, whether a saved state fits a run;
  :mod:`~bayesattn.training.resume`: a trainer's whole state and back.
* :mod:`~bayesattn.training.param_store`: Pyro's parameter store and a network's parameters
  (:func:`sync_param_store`).
* :mod:`~bayesattn.training.trainer`: :class:`Trainer`, assembled from the parts above, and
  :func:`fit`.
* :mod:`~bayesattn.training.pretrain`: masked-language-model pretraining of a token
  classifier's trunk on unlabeled text (:func:`pretrain_masked_lm`) and the copy of a
  pretrained trunk into a network of another vocabulary (:func:`transfer_trunk`).
* :class:`ModuleClassifier` (from :mod:`bayesattn.nn.networks.foreign`, re-exported here): the
  network contract around any ``nn.Module`` that returns logits ``(B, C)`` (``fit`` wraps a
  plain module in it).
* :mod:`~bayesattn.training.lightning`: the same objective and validation under
  ``lightning.Trainer`` (optional extra ``lightning``; not imported by this package).

Example:
    >>> from bayesattn.nn.blocks import AttentionConfig
    >>> from bayesattn.nn.networks import TransformerClassifier
    >>> net = TransformerClassifier(2, vocab_size=8, d_model=16, nhead=2, num_layers=1,
    ...                             attention=AttentionConfig(family="dirichlet"))
    >>> x = torch.randint(1, 8, (64, 6)); y = (x == 3).any(1).long()
    >>> history = fit(net, (x, y), epochs=2, batch_size=16, progress=False)
    >>> len(history.train_loss)
    2
"""

from __future__ import annotations

from ..nn.networks import ModuleClassifier
from .checkpoint import CheckpointError, load_checkpoint, prepare_checkpoint_path, save_checkpoint
from .config import ELBOS, METHODS, VAL_LOSSES, TrainConfig
from .data import as_train_data, fork_rng, iter_eval_batches
from .history import History
from .kl import ScaleLatents, kl_beta
from .param_store import sync_param_store
from .pretrain import pretrain_masked_lm, transfer_trunk
from .schedules import LR_DECAYS, lr_factor, lr_scheduler
from .trainer import Trainer, fit

__all__ = [
    "TrainConfig",
    "History",
    "Trainer",
    "fit",
    "ModuleClassifier",
    "ScaleLatents",
    "kl_beta",
    "lr_factor",
    "lr_scheduler",
    "save_checkpoint",
    "load_checkpoint",
    "prepare_checkpoint_path",
    "CheckpointError",
    "sync_param_store",
    "METHODS",
    "ELBOS",
    "VAL_LOSSES",
    "LR_DECAYS",
    "as_train_data",
    "iter_eval_batches",
    "fork_rng",
    "pretrain_masked_lm",
    "transfer_trunk",
]
