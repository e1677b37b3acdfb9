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
:mod:`bayesattn.lightning`); validation, :func:`~bayesattn.training.validation.validate`, reports
the loss of ``TrainConfig.val_loss`` and the posterior predictive's accuracy, NLL and ECE.
The pieces live in :mod:`bayesattn.training`, one concern per module, and are re-exported here:
:mod:`~bayesattn.training.config` (:class:`TrainConfig`), :mod:`~bayesattn.training.kl`
(:func:`kl_beta`, :class:`ScaleLatents`), :mod:`~bayesattn.training.history` (:class:`History`),
:mod:`~bayesattn.training.checkpoint` (:func:`save_checkpoint`, :func:`load_checkpoint`,
:func:`prepare_checkpoint_path`, :class:`CheckpointError`), :mod:`~bayesattn.training.trainer`
(:class:`Trainer`, :func:`fit`, :func:`sync_param_store`) and
:mod:`~bayesattn.training.schedules` (:func:`lr_factor`, :func:`lr_scheduler`).

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

from ._deprecation import module_getattr
from .training.checkpoint import (
    CheckpointError,
    load_checkpoint,
    prepare_checkpoint_path,
    save_checkpoint,
)
from .training.config import (  # noqa: F401  (METHODS, ELBOS, VAL_LOSSES, _resolve_config: as before)
    ELBOS,
    METHODS,
    VAL_LOSSES,
    TrainConfig,
    _resolve_config,
)
from .training.history import History
from .training.kl import ScaleLatents, kl_beta
from .training.schedules import LR_DECAYS, lr_factor, lr_scheduler  # noqa: F401
from .training.trainer import Trainer, fit, sync_param_store  # noqa: F401

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

__getattr__ = module_getattr(
    "bayesattn.inference", {"MODES": ("bayesattn.training.config", "METHODS")}, "constant"
)
