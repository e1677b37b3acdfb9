r""":class:`Predictive`: the library's one posterior-predictive engine.

Built once from what to sample (a bayesattn network, a converted torch/Hugging Face model, a list
of ensemble members) and how (``num_samples``, ``batch_size``, the attention ``mode``, MC
``dropout``), it draws

.. math:: p_s(c\mid x) = p(c\mid x, w_s, \theta_s), \quad s = 1..S, \qquad
          \bar p(c\mid x) = \frac1S\sum_s p_s(c\mid x)

through one of three passes, chosen by the network:

* a :class:`~bayesattn.nn.networks.BayesianNetwork`: ``S`` samples as a leading sample dim in one
  vectorised pass per chunk (:mod:`bayesattn.predictive.network`); with ``dropout=True`` every
  ``nn.Dropout`` stays active (MC dropout);
* any other ``nn.Module`` (a model we did not write): vectorised under
  :func:`bayesattn.num_samples` or by batched repetition (:mod:`bayesattn.predictive.foreign`);
* a sequence of networks (a deep ensemble): every member through the network pass, the
  ``M`` members' samples stacked, ``M·S`` in all.

``Predictive(...)(x)`` returns a :class:`~bayesattn.predictive.result.PredictionResult`
``(S, B, C)``; :meth:`Predictive.probs_and_targets` gives the averaged predictive per target
(validation); :meth:`Predictive.trace` runs Pyro's ``Predictive`` on ``network.model``/``.guide``
instead (any site, and the pointwise log-likelihood). :func:`bayesattn.uncertainty.predict`,
``predict_mc_dropout``, ``predict_ensemble``, ``bayesattn.training.lightning.predictive_probs``,
:func:`bayesattn.diagnostics.network_draws` and :func:`bayesattn.diagnostics.predictive_to_arviz`
are calls of this object.

Example:
    >>> engine = Predictive(net, num_samples=16, batch_size=256)
    >>> res = engine(x)                     # PredictionResult, probs (16, B, C)
    >>> probs, targets = engine.probs_and_targets(x, y)   # (M, C), (M,): validation
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from typing import Any, Literal

import torch
from torch import Tensor, nn

from .._validation import check_bool, check_callable, check_has_values, check_int
from ..nn.modes import AttentionMode, check_mode
from ..nn.networks import BayesianNetwork, TransformerClassifier
from .foreign import Inputs, sample_foreign
from .network import check_network, sample_network
from .result import PredictionResult
from .trace import NetworkDraws, sample_trace

__all__ = ["ModelType", "Predictive"]

#: what a :class:`Predictive` samples: one of our networks, a model we did not write, a deep
#: ensemble, or (for :meth:`Predictive.trace` only) any model/guide pair
ModelType = Literal["network", "foreign", "ensemble", "other"]


def _check_members(networks: Sequence[Any]) -> list[BayesianNetwork]:
    """Ensemble members: at least one, all BayesianNetworks of one type."""
    if len(networks) < 1:
        raise ValueError("networks must hold at least one network")
    members = [check_network(n) for n in networks]
    kinds = {type(n) for n in members}
    if len(kinds) > 1:
        raise TypeError(
            f"ensemble members must be of one network type; got {sorted(k.__name__ for k in kinds)}"
        )
    return members


class Predictive:
    r"""``S`` posterior-predictive samples of a network, in the fewest passes it allows.

    Args:
        network: a :class:`~bayesattn.nn.networks.BayesianNetwork`; any ``nn.Module`` whose
            attention :func:`bayesattn.convert`/:func:`bayesattn.interop.hf.convert_hf` made
            Bayesian; or a list/tuple of BayesianNetworks of one type (a deep ensemble). For
            :meth:`trace` only, any object with callable ``model`` and ``guide``.
        num_samples: ``S >= 1`` draws (per member for an ensemble).
        batch_size: at most this many inputs per pass (``None``: one pass); for a foreign model,
            at most this many rows (example × sample).
        mode: the attention mode, ``"guide"`` (default), ``"model"``, ``"mean"`` or ``"elbo"``
            (see :mod:`bayesattn.nn.modes`).
        dropout: keep every ``nn.Dropout`` active (MC dropout; a single BayesianNetwork only);
            the result's ``kind`` is ``"mc_dropout"``.
        keep_attention: record every attention layer's weights (a single BayesianNetwork only).
        progress: a ``tqdm`` bar over the chunks.
        forward, temperature, vectorised: for a foreign model only: ``forward(model, x)`` gives
            logits ``(B, C)`` (default ``model(x)``/``model(**x)``, a transformers output's
            ``.logits``), divided by ``temperature``; ``vectorised=True`` draws the ``S`` samples
            in one pass under :func:`bayesattn.num_samples`, otherwise by batched repetition.

    Attributes:
        model_type: what is sampled (:data:`ModelType`): ``"network"``, ``"foreign"``,
            ``"ensemble"`` or ``"other"``.

    Raises:
        TypeError: ``network`` of no supported type (at the call for :meth:`trace`-only
            objects), ensemble members of different types, ``dropout`` for anything but one
            BayesianNetwork.
        ValueError: bad ``num_samples``/``batch_size``/``mode``/``temperature``; ``forward``,
            ``temperature`` or ``vectorised`` for a network that is not foreign.
    """

    def __init__(
        self,
        network: BayesianNetwork | nn.Module | Sequence[BayesianNetwork] | Any,
        num_samples: int = 32,
        batch_size: int | None = None,
        *,
        mode: AttentionMode = "guide",
        dropout: bool = False,
        keep_attention: bool = True,
        progress: bool = False,
        forward: Callable[[nn.Module, Any], Tensor] | None = None,
        temperature: float = 1.0,
        vectorised: bool = False,
    ) -> None:
        self.network = network
        self.members: list[BayesianNetwork] | None = None
        #: what is sampled: one of ours, a model we did not write, an ensemble, or other
        self.model_type: ModelType
        if isinstance(network, BayesianNetwork):
            self.model_type = "network"
        elif isinstance(network, nn.Module):
            self.model_type = "foreign"
        elif isinstance(network, Sequence) and not isinstance(network, str):
            self.model_type = "ensemble"
            self.members = _check_members(network)
        else:
            self.model_type = "other"  # only .trace() (a model/guide pair); __call__ raises
        self.num_samples = check_int("num_samples", num_samples, 1)
        self.batch_size = check_int("batch_size", batch_size, 1, allow_none=True)
        self.mode: AttentionMode = check_mode(mode)
        self.dropout = check_bool("dropout", dropout)
        self.keep_attention = check_bool("keep_attention", keep_attention)
        self.progress = check_bool("progress", progress)
        self.forward = check_callable("forward", forward, "(model, x) -> logits", allow_none=True)
        self.temperature, self.vectorised = temperature, vectorised
        self._check_options()

    def _check_options(self) -> None:
        if self.model_type != "foreign" and (
            self.forward is not None or self.temperature != 1.0 or self.vectorised
        ):
            raise ValueError(
                "forward, temperature and vectorised apply to models we did not write; a "
                f"{type(self.network).__name__} samples in one vectorised pass by itself"
            )
        t = self.temperature
        if not (isinstance(t, (int, float)) and math.isfinite(t)) or not t > 0:
            raise ValueError(f"temperature must be a positive finite number; got {t!r}")
        if self.dropout and self.model_type != "network":
            raise TypeError(
                f"dropout (MC dropout) applies to one BayesianNetwork; got {self.model_type} "
                f"{type(self.network).__name__}"
            )

    def __repr__(self) -> str:
        return (
            f"Predictive({type(self.network).__name__}, num_samples={self.num_samples}, "
            f"batch_size={self.batch_size}, mode={self.mode!r}, dropout={self.dropout})"
        )

    @property
    def kind(self) -> ModelType:
        """Deprecated spelling of :attr:`model_type` ("kind" is how a predictive's samples were
        drawn, :attr:`PredictionResult.kind`); removed in the next release."""
        warnings.warn(
            "Predictive.kind is deprecated: use Predictive.model_type (PredictionResult.kind "
            "says how the samples were drawn)",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.model_type

    def __call__(self, x: Inputs, y: Tensor | None = None) -> PredictionResult:
        r"""``S`` draws of the predictive of ``x`` (``y``: a ``Seq2Seq``'s target sequences,
        BOS first, for its teacher-forced per-token predictive; no other network takes ``y``).

        Shape:
            ``probs (S, B, C)`` (``(S, B, T, V)`` for sequence models, ``(M·S, B, ...)`` for an
            ensemble of ``M``), attention ``(S, B, H, Tq, Tk)`` per layer.
        """
        if isinstance(self.network, nn.Module):
            check_has_values("network", self.network)
        if self.model_type == "foreign":
            if y is not None:
                raise ValueError("y is only used by Seq2Seq networks; got y for a foreign model")
            assert isinstance(self.network, nn.Module)
            return sample_foreign(
                self.network,
                x,
                self.num_samples,
                self.batch_size,
                self.mode,
                self.forward,
                self.temperature,
                self.vectorised,
            )
        if self.model_type == "ensemble":
            return self._ensemble(x, y, check_y=True)
        return self._sample(check_network(self.network), x, y, check_y=True)

    def _sample(
        self, net: BayesianNetwork, x: Any, y: Tensor | None, *, check_y: bool, expand: bool = True
    ) -> PredictionResult:
        single = self.model_type == "network"
        return sample_network(
            net,
            x,
            y,
            num_samples=self.num_samples,
            batch_size=self.batch_size,
            mode=self.mode,
            keep_attention=self.keep_attention and single,
            dropout=self.dropout,
            progress=self.progress and single,
            check_y=check_y,
            expand=expand,
        )

    def _ensemble(self, x: Any, y: Tensor | None, *, check_y: bool) -> PredictionResult:
        """Every member's samples, stacked: ``(M·S, B, ..., C)`` (``M`` in ``"mean"`` mode,
        where each member is deterministic)."""
        assert self.members is not None
        results = [self._sample(n, x, y, check_y=check_y) for n in self.members]
        shapes = {tuple(r.probs.shape[1:]) for r in results}
        if len(shapes) > 1:
            raise ValueError(
                "ensemble members must predict the same classes for the same inputs; got "
                "per-member probs (B, ..., C) of shapes "
                f"{[tuple(r.probs.shape[1:]) for r in results]}"
            )
        per = self.num_samples if self.mode != "mean" else 1
        probs = torch.cat([r.probs[:per] for r in results])  # (M·S, B, ..., C)
        return PredictionResult(probs=probs, kind=f"ensemble/{self.mode}", mask=results[0].mask)

    def probs_and_targets(self, x: Tensor, y: Tensor | None = None) -> tuple[Tensor, Tensor]:
        r"""The averaged predictive :math:`\bar p = \frac1S\sum_s p_s` at every target and the
        targets, one row per prediction: what a validation step scores (accuracy, NLL, ECE).

        ``y`` is a classifier's labels, or a sequence model's batch targets (``Seq2Seq``: the
        target sequences; ``CausalLM``: usually ``None``, the targets are ``x`` shifted).

        Shape:
            ``probs (M, C)``, ``targets (M,)``: ``M = B`` for classifiers, the number of
            non-padding target tokens for sequence models.
        """
        if self.model_type == "foreign" or self.model_type == "other":
            raise TypeError(
                "probs_and_targets needs bayesattn networks (their targets(x, y)); got "
                f"{type(self.network).__name__}"
            )
        net = check_network(self.network if self.members is None else self.members[0])
        is_classifier = isinstance(net, TransformerClassifier)
        if is_classifier and y is None:
            raise ValueError("a classifier needs labels y to be evaluated")
        if is_classifier:
            net.check_batch(x, y)  # labels: integer, (B,), in [0, C)
        y_in = None if is_classifier else y  # labels are not an input; sequence targets are
        if self.members is not None:
            res = self._ensemble(x, y_in, check_y=is_classifier)
        else:
            # a deterministic sequence model's one pass is used as it is (not averaged over S
            # identical copies, which can move the last bit), as before 0.4
            res = self._sample(net, x, y_in, check_y=is_classifier, expand=is_classifier)
        if is_classifier:
            assert y is not None
            return res.mean_probs, y  # (B, C), (B,)
        targets, mask, _ = net.targets(x, y)
        if targets is None:
            raise ValueError(f"{type(net).__name__}.targets(x, y) gave no targets")
        probs = res.mean_probs  # (B, T, V)
        if mask is None:
            return probs.reshape(-1, probs.shape[-1]), targets.reshape(-1)
        return probs[mask], targets[mask]  # (M, V), (M,)

    def trace(
        self,
        x: Tensor,
        y: Tensor | None = None,
        *,
        num_data: int | None = None,
        var_names: Sequence[str] | None = None,
        obs_name: str = "obs",
        parallel: bool = True,
        seed: int | None = None,
    ) -> NetworkDraws:
        r"""Pyro's ``Predictive`` on ``network.model``/``network.guide``: ``S`` joint guide draws
        with the model replayed on them, the kept sites, predictive draws of ``obs_name`` and
        (with ``y``) the unscaled pointwise log-likelihood
        :math:`\ell_{sb} = \log p(y_b\mid x_b, w_s)` (see :mod:`bayesattn.predictive.trace`).
        Uses ``num_samples`` only (one pass, or a loop with ``parallel=False``).

        Shape:
            x ``(B, ...)``, y ``(B, ...)`` → see :class:`~bayesattn.predictive.trace.NetworkDraws`.
        """
        if self.members is not None:
            raise TypeError("trace draws from one network's model and guide; got an ensemble")
        return sample_trace(
            self.network,
            x,
            y,
            self.num_samples,
            num_data=num_data,
            var_names=var_names,
            obs_name=obs_name,
            parallel=parallel,
            seed=seed,
        )
