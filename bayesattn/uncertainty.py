r"""Posterior predictive sampling, the entropy decomposition of uncertainty, and attention statistics.

:func:`predict` draws ``S`` samples of a classifier's predictive distribution in one vectorised pass
(a leading sample dim through the whole network) and returns a :class:`PredictionResult`:

.. math::

    p_s(c\mid x) = p(c\mid x, w_s, \theta_s), \qquad
    \bar p(c\mid x) = \frac1S\sum_s p_s(c\mid x)

where :math:`w_s \sim q(w\mid x)` are attention weights drawn from the amortised posterior and
:math:`\theta_s \sim q(\theta)` projection weights drawn from the weight guide (if the network has
Bayesian projections, see :func:`bayesattn.nn.weights.bayesian_projections`). The predictive
entropy splits into an aleatoric and an epistemic part:

.. math::

    \underbrace{H\big[\bar p\big]}_{\text{total}}
    = \underbrace{\frac1S\sum_s H\big[p_s\big]}_{\text{aleatoric (expected entropy)}}
    + \underbrace{I[y; w, \theta \mid x]}_{\text{epistemic (mutual information)}},

and the mutual information is :math:`\ge 0` by Jensen's inequality (concavity of :math:`H`).

The attention weights of every layer are kept as :class:`AttentionSamples`
``(S, B, H, Tq, Tk)`` with their mean, std, central credible intervals and summaries.

:func:`predict`, :func:`predict_mc_dropout` and :func:`predict_ensemble` are calls of the one
predictive engine, :class:`bayesattn.predictive.Predictive` (where :class:`PredictionResult` and
:class:`AttentionSamples` live; they are re-exported here).

Shape glossary: ``S`` posterior samples (leftmost), ``B`` batch, ``C`` classes, ``H`` heads,
``Tq``/``Tk`` query/key length.

Example:
    >>> net = TransformerClassifier(2, vocab_size=8, attention=AttentionConfig("dirichlet"))
    >>> res = predict(net, torch.randint(1, 8, (4, 6)), num_samples=16)
    >>> res.probs.shape, res.mutual_information.shape
    (torch.Size([16, 4, 2]), torch.Size([4]))
    >>> res.attention["encoder.layers.0.self_attn"].samples.shape
    torch.Size([16, 4, 4, 6, 6])
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from .functional import entropy
from .nn.modes import AttentionMode, check_mode
from .nn.networks import BayesianNetwork
from .predictive import AttentionSamples, PredictionResult, Predictive
from .predictive.foreign import Inputs
from .predictive.network import check_network

__all__ = [
    "AttentionSamples",
    "PredictionResult",
    "predict",
    "predict_mc_dropout",
    "predict_ensemble",
    "entropy",
]


def predict(
    network: BayesianNetwork | nn.Module,
    x: Inputs,
    num_samples: int = 32,
    batch_size: int | None = None,
    progress: bool = False,
    mode: AttentionMode = "guide",
    keep_attention: bool = True,
    *,
    y: Tensor | None = None,
    forward: Callable[[nn.Module, Any], Tensor] | None = None,
    temperature: float = 1.0,
    vectorised: bool = False,
) -> PredictionResult:
    r"""Draw ``num_samples`` posterior-predictive samples of any network in one vectorised pass.

    The library's one posterior-predictive path, ``Predictive(network, num_samples, batch_size,
    ...)(x, y)`` (:class:`bayesattn.predictive.Predictive`; :func:`predict_mc_dropout` and
    :func:`predict_ensemble` too): classifiers and ViTs give ``(S, B, C)``, sequence models their
    per-token predictive ``(S, B, T, V)`` (teacher-forced: ``Seq2Seq`` needs the targets ``y``; a
    ``CausalLM`` predicts ``x[:, 1:]`` from ``x[:, :-1]``) with the valid positions in ``mask``.

    Each sample :math:`s` runs the network with attention weights drawn in ``mode`` (the amortised
    guide :math:`q(w\mid x)` by default; ``"model"``: the weight model; ``"mean"``: the deterministic
    exact-posterior weights) and, if the network has Bayesian projections, with projection weights
    :math:`\theta_s \sim q(\theta)` (one draw per sample shared by all inputs and batches, as
    are global latents such as sparse-GP inducing values, :mod:`bayesattn.nn.gp_read`; the
    projection prior in ``"model"`` mode, the guide's median in ``"mean"`` mode). The ``S`` samples
    travel as a leading sample dim (``forward(x, num_samples=S)``), entering a classifier just
    before its first random layer (the computation before it is shared), sampled weights
    broadcasting through :func:`bayesattn.nn.attention.linear` (which is why
    :func:`~bayesattn.nn.weights.bayesian_projections` accepts only attention and linear weights).

    A network with nothing random in ``mode`` (no Bayesian attention layer and no weight guide, or
    ``mode="mean"``) is run once and its output repeated ``S`` times (the usual shapes; the mutual
    information is exactly 0). The network runs in eval mode (dropout off) under ``torch.no_grad``
    with Pyro sites hidden from any enclosing handler; its training flags and the attention
    layers' ``record_weights``/``last_weights`` are restored afterwards.

    Args:
        network: any :class:`~bayesattn.nn.networks.BayesianNetwork`.
        x: inputs as the network takes them.
        num_samples: ``S >= 1``.
        batch_size: split ``x`` into chunks of at most this many inputs (``None``: one chunk).
        progress: show a ``tqdm`` bar over the chunks.
        mode: the attention mode: ``"guide"`` (default), ``"model"``, ``"mean"`` or ``"elbo"``
            (guide draws without Pyro sites); see :mod:`bayesattn.nn.modes`.
        keep_attention: record every attention layer's weights.
        y: target sequences for a ``Seq2Seq`` (BOS first); not used by other networks.
        forward, temperature, vectorised: for a **model we did not write** (any ``nn.Module``
            whose attention :func:`bayesattn.convert` or :func:`bayesattn.interop.hf.convert_hf`
            made Bayesian; ``x`` a tensor or a dict of tensors): ``forward(model, x)`` gives
            logits ``(B, C)`` (default ``model(x)``/``model(**x)``, a transformers output's
            ``.logits``), divided by ``temperature``; ``vectorised=True`` draws the samples in
            one pass under :func:`bayesattn.num_samples` (the model must broadcast a leading
            sample dim), otherwise by batched repetition (every example ``S`` times in the batch;
            any model); either way at most ``batch_size`` rows (example × sample) per pass
            (vectorised: at least one example's ``S``). A base model's output (no ``.logits``)
            or logits whose dim 0 is not the batch (a sequence-first model) are refused with
            the ``forward=`` to pass. Attention maps are not kept.

    Shape:
        x ``(B, T)`` tokens, ``(B, T, D)`` vectors or ``(B, [C,] H, W)`` images →
        ``probs (S, B, C)`` (``(S, B, T, V)`` for sequence models), attention
        ``(S, B, H, Tq, Tk)`` per layer.
    """
    mode = check_mode(mode)
    if isinstance(network, Sequence):  # an ensemble is predict_ensemble's
        check_network(network)
    engine = Predictive(network, num_samples, batch_size, mode=mode, keep_attention=keep_attention,
                        progress=progress, forward=forward, temperature=temperature,
                        vectorised=vectorised)  # fmt: skip
    return _warn_if_nothing_random(engine(x, y), mode)


def _warn_if_nothing_random(result: PredictionResult, mode: AttentionMode) -> PredictionResult:
    """Warn when ``S > 1`` draws outside ``"mean"`` mode came out identical: the model has
    nothing random to draw (the mutual information is then exactly 0, not a measurement)."""
    probs = result.probs  # (S, B, ..., C)
    if mode == "mean" or probs.shape[0] < 2 or probs.numel() == 0:
        return result
    if torch.equal(probs, probs[:1].expand_as(probs)):
        warnings.warn(
            f"predict drew {probs.shape[0]} identical samples in mode {mode!r}: the model has "
            "nothing random to draw, so the mutual information is exactly 0. Make its "
            "attention Bayesian first (an AttentionConfig with a family, "
            "bayesattn.convert(model) or bayesattn.interop.hf.convert_hf(model)), or use "
            "predict_mc_dropout / predict_ensemble.",
            UserWarning,
            stacklevel=3,
        )
    return result


def predict_mc_dropout(
    network: BayesianNetwork,
    x: Tensor,
    num_samples: int = 32,
    batch_size: int | None = None,
    *,
    y: Tensor | None = None,
    progress: bool = False,
) -> PredictionResult:
    r"""MC dropout (Gal & Ghahramani, 2016), the standard cheap baseline: every ``nn.Dropout`` of
    the network stays active at prediction time and attention is the posterior mean, so
    :math:`p_s = p(y\mid x, \text{dropout mask}_s)`. Same path, shapes and result as
    :func:`predict` (``mode`` is recorded as ``"mc_dropout"``). A network without dropout gives
    ``S`` identical samples (MI = 0)."""
    engine = Predictive(
        network, num_samples, batch_size, mode="mean", dropout=True, keep_attention=False,
        progress=progress,
    )  # fmt: skip
    return engine(x, y)


def predict_ensemble(
    networks: Sequence[BayesianNetwork],
    x: Tensor,
    batch_size: int | None = None,
    *,
    y: Tensor | None = None,
    mode: AttentionMode = "mean",
    num_samples: int = 1,
) -> PredictionResult:
    r"""Deep ensemble (Lakshminarayanan et al., 2017): ``M`` independently trained networks, each
    run through :func:`predict` (``num_samples`` draws each in ``mode``; deterministic
    exact-posterior attention, ``"mean"``, by default); the samples of all members are stacked,
    ``probs (M·S, B, ..., C)``, and the decomposition reads member disagreement as epistemic."""
    mode = check_mode(mode)
    if isinstance(networks, BayesianNetwork) or not isinstance(networks, Sequence):
        raise TypeError(
            f"networks must be a sequence of BayesianNetworks; got {type(networks).__name__}"
        )
    return Predictive(list(networks), num_samples, batch_size, mode=mode)(x, y)
