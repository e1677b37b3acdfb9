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

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyro
import torch
from pyro import poutine
from torch import Tensor, nn

from ._deprecation import renamed_kwargs, warn_renamed
from ._validation import check_int, check_real, check_simplex
from .functional import entropy, uncertainty_decomposition
from .nn.attention import BayesianMultiheadAttention
from .nn.modes import AttentionMode, attention_mode, check_mode, global_values
from .nn.networks import BayesianNetwork, Seq2Seq, TransformerClassifier

__all__ = [
    "AttentionSamples",
    "PredictionResult",
    "predict",
    "predict_mc_dropout",
    "predict_ensemble",
    "entropy",
]


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


def _quantile0(x: Tensor, q: float) -> Tensor:
    """Quantile over dim 0 with linear interpolation (``torch.quantile``'s default), without
    ``torch.quantile``'s input-size limit.

    Shape:
        ``(S, ...)`` → ``(...)``.
    """
    s = x.shape[0]
    xs = torch.sort(x, dim=0).values  # (S, ...)
    pos = q * (s - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, s - 1)
    frac = pos - lo
    return xs[lo] + (xs[hi] - xs[lo]) * frac


# --------------------------------------------------------------------------------------------
# attention samples
# --------------------------------------------------------------------------------------------


@dataclass
class AttentionSamples:
    r"""Posterior samples of one attention layer's weights and their summaries.

    Fields:
        samples: ``(S, B, H, Tq, Tk)`` draws of the weights; every row lies on the simplex over the
            allowed keys.
        allowed: optional bool ``(B|1, H|1, Tq|1, Tk)`` of keys with prior mass. ``None`` (the
            default) derives it from the samples: a key is allowed when some draw gives it
            positive weight (masked keys are exactly 0 in every draw).

    Shape:
        ``mean``/``std``/``interval`` bounds ``(B, H, Tq, Tk)``; ``entropy_of_mean``/
        ``mean_key_std`` ``(B, H, Tq)``.
    """

    samples: Tensor
    allowed: Tensor | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.samples, Tensor):
            raise TypeError(f"samples must be a torch.Tensor; got {type(self.samples).__name__}")
        if self.samples.dim() != 5:
            raise ValueError(
                f"samples must be 5-D (S, B, H, Tq, Tk); got shape {tuple(self.samples.shape)}"
            )
        if not self.samples.is_floating_point():
            raise TypeError(f"samples must be floating point; got dtype {self.samples.dtype}")
        if self.allowed is not None:
            if self.allowed.dtype != torch.bool or self.allowed.dim() != 4:
                raise ValueError(
                    f"allowed must be a 4-D bool tensor broadcastable to (B, H, Tq, Tk) = "
                    f"{tuple(self.samples.shape[1:])}; got {self.allowed.dtype} "
                    f"{tuple(self.allowed.shape)}"
                )
            torch.broadcast_shapes(self.allowed.shape, self.samples.shape[1:])

    @property
    def num_samples(self) -> int:
        return self.samples.shape[0]

    @property
    def mean(self) -> Tensor:
        r"""Posterior mean :math:`\bar w = \frac1S\sum_s w_s`. Shape ``(B, H, Tq, Tk)``."""
        return self.samples.mean(0)

    @property
    def std(self) -> Tensor:
        r"""Posterior std per weight (``S − 1`` denominator; zero when ``S = 1``).
        Shape ``(B, H, Tq, Tk)``."""
        if self.num_samples == 1:
            return torch.zeros_like(self.samples[0])
        return self.samples.std(0, correction=1)

    def key_mask(self) -> Tensor:
        """Allowed keys, bool ``(B, H, Tq, Tk)`` (see the class docstring)."""
        if self.allowed is not None:
            return self.allowed.expand(self.samples.shape[1:])
        return (self.samples > 0).any(0)  # (B, H, Tq, Tk)

    def interval(self, prob: float = 0.9) -> tuple[Tensor, Tensor]:
        r"""Central credible interval :math:`[Q_{(1-p)/2}, Q_{(1+p)/2}]` of every weight, with
        quantiles over the ``S`` draws (linear interpolation, as :func:`torch.quantile`).

        Shape:
            ``(lo, hi)``, each ``(B, H, Tq, Tk)``.
        """
        p = check_real("prob", prob, gt=0.0, lt=1.0)
        return _quantile0(self.samples, (1.0 - p) / 2), _quantile0(self.samples, (1.0 + p) / 2)

    def entropy_of_mean(self) -> Tensor:
        r""":math:`H[\bar w_{i\cdot}] = -\sum_j \bar w_{ij}\log\bar w_{ij}` per query (nats).

        Shape:
            ``(B, H, Tq)``.
        """
        return entropy(self.mean)

    def mean_key_std(self) -> Tensor:
        r"""Average posterior std of a query's weights over its allowed keys,
        :math:`\frac{1}{|A_i|}\sum_{j\in A_i}\operatorname{std}(w_{ij})` (0 for a row with no
        allowed key).

        Shape:
            ``(B, H, Tq)``.
        """
        allowed = self.key_mask()  # (B, H, Tq, Tk)
        n = allowed.sum(-1).clamp_min(1).to(self.samples.dtype)  # (B, H, Tq)
        return (self.std * allowed).sum(-1) / n

    def keys_excluding(self, threshold: float, prob: float = 0.9) -> Tensor:
        r"""Keys whose central ``prob`` credible interval lies strictly above ``threshold``
        (:math:`\mathrm{lo}_{ij} > t`): the query confidently reads at least that much from them.

        Shape:
            bool ``(B, H, Tq, Tk)``.
        """
        threshold = check_real("threshold", threshold, ge=0.0, le=1.0)
        lo, _ = self.interval(prob)
        return lo > float(threshold)

    def summary(self) -> dict[str, float]:
        """Scalar summaries: mean entropy of the mean weights, mean key std, mean interval width
        (90 %), averaged over batch, heads and queries."""
        lo, hi = self.interval(0.9)
        allowed = self.key_mask()
        width = ((hi - lo) * allowed).sum(-1) / allowed.sum(-1).clamp_min(1)  # (B, H, Tq)
        return {
            "entropy_of_mean": float(self.entropy_of_mean().mean()),
            "mean_key_std": float(self.mean_key_std().mean()),
            "mean_interval_width_90": float(width.mean()),
        }


# --------------------------------------------------------------------------------------------
# prediction result
# --------------------------------------------------------------------------------------------


@dataclass
class PredictionResult:
    r"""``S`` posterior-predictive samples for ``B`` inputs and the uncertainty decomposition.

    Fields:
        probs: ``(S, B, C)`` per-sample class probabilities :math:`p_s(c\mid x_b)`.
        attention: layer path → :class:`AttentionSamples` ``(S, B, H, Tq, Tk)`` (empty when
            ``keep_attention=False``).
        kind: how the samples were drawn: the attention mode (``"guide"``, ``"model"``,
            ``"mean"``, ``"elbo"``), ``"mc_dropout"`` or ``"ensemble/<mode>"`` (formerly
            ``mode``, a deprecated alias until 0.4).
        mask: for per-token predictives ``(S, B, T, V)``, the valid positions ``(B, T)``
            (``None``: all valid).

    Properties (all ``(B,)`` unless noted; ``(B, T)`` for per-token predictives):
        ``mean_probs`` ``(B, C)`` :math:`\bar p`; ``predictive_entropy`` :math:`H[\bar p]`;
        ``expected_entropy`` :math:`\frac1S\sum_s H[p_s]` (aleatoric); ``mutual_information``
        :math:`H[\bar p] - \frac1S\sum_s H[p_s]` (epistemic); ``predictions`` (argmax of
        :math:`\bar p`, int64); ``confidence`` :math:`\max_c \bar p_c`.

    Entropies are computed in float64 and returned in the dtype of ``probs``. The mutual
    information is clamped at 0 only to remove float round-off (it is :math:`\ge 0` exactly).
    """

    probs: Tensor
    attention: dict[str, AttentionSamples] = field(default_factory=dict)
    kind: str = "guide"
    mask: Tensor | None = None

    @property
    def mode(self) -> str:
        """Deprecated: :attr:`kind`."""
        warn_renamed("PredictionResult.mode", "kind", "attribute")
        return self.kind

    def __post_init__(self) -> None:
        if not isinstance(self.probs, Tensor):
            raise TypeError(f"probs must be a torch.Tensor; got {type(self.probs).__name__}")
        if self.probs.dim() < 3:
            raise ValueError(
                f"probs must be (S, B, C) or (S, B, T, V); got shape {tuple(self.probs.shape)}"
            )
        if self.probs.is_floating_point():
            check_simplex("probs", self.probs)
        if self.mask is not None and self.mask.shape != self.probs.shape[1:-1]:
            raise ValueError(
                f"mask must have shape {tuple(self.probs.shape[1:-1])} (probs without S and C); "
                f"got {tuple(self.mask.shape)}"
            )

    @property
    def num_samples(self) -> int:
        return self.probs.shape[0]

    @property
    def mean_probs(self) -> Tensor:
        r""":math:`\bar p = \frac1S\sum_s p_s`. Shape ``(B, C)``."""
        return self.probs.mean(0)

    @property
    def predictive_entropy(self) -> Tensor:
        r"""Total uncertainty :math:`H[\bar p]`. Shape ``(B,)``."""
        return uncertainty_decomposition(self.probs)[0]

    @property
    def expected_entropy(self) -> Tensor:
        r"""Aleatoric uncertainty :math:`\frac1S\sum_s H[p_s]`. Shape ``(B,)``."""
        return uncertainty_decomposition(self.probs)[1]

    @property
    def mutual_information(self) -> Tensor:
        r"""Epistemic uncertainty :math:`I = H[\bar p] - \frac1S\sum_s H[p_s] \ge 0`.
        Shape ``(B,)``."""
        return uncertainty_decomposition(self.probs)[2]

    def log_likelihood(self, y: Tensor) -> Tensor:
        r"""Pointwise log-likelihood of observed labels under every sample,
        :math:`\ell_{sb} = \log p_s(y_b\mid x_b)`; per-token results sum over the valid tokens
        of an example. Shape ``(S, B)`` (what ArviZ's ``log_likelihood`` group and LOO read)."""
        if not isinstance(y, Tensor) or y.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"y must be an integer label tensor; got {getattr(y, 'dtype', y)!r}")
        if y.shape != self.probs.shape[1:-1]:
            raise ValueError(
                f"y must have shape {tuple(self.probs.shape[1:-1])} (probs without S and C); "
                f"got {tuple(y.shape)}"
            )
        C = self.probs.shape[-1]
        bad = (y < 0) | (y >= C)  # (B, ...)
        if self.mask is not None:
            bad = bad & self.mask  # labels at padded positions are never read
        if bool(bad.any()):
            seen = y[bad]
            raise ValueError(
                f"y must hold labels in [0, {C}) (the probs have {C} classes); got "
                f"{int(seen.min())}..{int(seen.max())} at {int(bad.sum())} position(s)"
            )
        idx = y.long().clamp(0, C - 1)  # only padded positions move (their terms are zeroed)
        p = self.probs.gather(-1, idx.expand(self.probs.shape[:-1]).unsqueeze(-1)).squeeze(-1)
        lp = p.double().clamp_min(torch.finfo(torch.float64).tiny).log()  # (S, B, ...)
        if self.mask is not None:
            lp = torch.where(self.mask, lp, torch.zeros_like(lp))
        return lp.reshape(lp.shape[0], lp.shape[1], -1).sum(-1).to(self.probs.dtype)

    @property
    def predictions(self) -> Tensor:
        """Argmax of the posterior predictive. Shape ``(B,)`` int64."""
        return self.mean_probs.argmax(-1)

    @property
    def confidence(self) -> Tensor:
        r""":math:`\max_c \bar p_c`. Shape ``(B,)``."""
        return self.mean_probs.max(-1).values

    def summary(self) -> dict[str, float]:
        """Scalars averaged over the batch, plus ``"attention/<layer>/<stat>"`` for every kept
        layer (see :meth:`AttentionSamples.summary`); per-token results average over the valid
        positions (``mask``)."""

        def avg(t: Tensor) -> float:
            return float(t[self.mask].mean() if self.mask is not None else t.mean())

        out: dict[str, float] = {
            "num_samples": float(self.num_samples),
            "mean_confidence": avg(self.confidence),
            "mean_predictive_entropy": avg(self.predictive_entropy),
            "mean_expected_entropy": avg(self.expected_entropy),
            "mean_mutual_information": avg(self.mutual_information),
        }
        for name, a in self.attention.items():
            for k, v in a.summary().items():
                out[f"attention/{name}/{k}"] = v
        return out


# --------------------------------------------------------------------------------------------
# predict
# --------------------------------------------------------------------------------------------


Inputs = Tensor | Mapping[str, Tensor]  # a model's inputs: a tensor or a dict (transformers)


def _default_forward(model: nn.Module, x: Inputs) -> Tensor:
    """``model(x)`` (``model(**x)`` for a dict); a transformers output's ``.logits``, the first
    element of a tuple. A base model's output (``last_hidden_state``, no ``.logits``) is refused:
    which token and head give class logits is the caller's choice (``forward=``)."""
    out = model(**x) if isinstance(x, Mapping) else model(x)
    if hasattr(out, "logits"):
        out = out.logits
    elif hasattr(out, "last_hidden_state"):
        raise ValueError(
            f"{type(model).__name__} returned a {type(out).__name__} without .logits (a base "
            "model: hidden states, not class scores); use a model with a head (e.g. "
            "...ForSequenceClassification) or pass forward=, e.g. forward=lambda m, x: "
            "head(m(**x).last_hidden_state[:, 0])"
        )
    elif isinstance(out, tuple):
        out = out[0]
    return out


def _check_logits(out: Any, rows: int, b: int, x: Inputs) -> Tensor:
    """``out``: the forward's logits for ``rows`` input rows ``(rows, ..., C)``, or a clear
    error (the common mistakes: not a tensor; a sequence-first model)."""
    if not isinstance(out, Tensor) or not out.is_floating_point():
        raise TypeError(
            f"forward must return floating-point logits (B, C); got {type(out).__name__}"
            f"{'' if not isinstance(out, Tensor) else f' of dtype {out.dtype}'}"
        )
    if out.dim() != 2 or out.shape[0] != rows:
        xs = {k: tuple(v.shape) for k, v in x.items()} if isinstance(x, Mapping) else tuple(
            x.shape
        )
        raise ValueError(
            f"forward must return class logits (B, C) with the batch first: got shape "
            f"{tuple(out.shape)} for {rows} input rows ({b} examples, x {xs}). predict reads "
            "dim 0 of x as the batch; for a sequence-first model (batch_first=False) pass x "
            "batch-first and forward=lambda m, x: m(x.transpose(0, 1)) (with the output's batch "
            "moved first)"
        )
    return out


def _batch_size(x: Inputs) -> int:
    if isinstance(x, Mapping):
        sizes = {k: int(v.shape[0]) for k, v in x.items()}
        if len(set(sizes.values())) != 1:
            raise ValueError(f"inputs must share their batch size (dim 0); got {sizes}")
        return next(iter(sizes.values()))
    if not isinstance(x, Tensor):
        raise TypeError(f"x must be a Tensor or a dict of Tensors; got {type(x).__name__}")
    return int(x.shape[0])


def _take(x: Inputs, idx: Tensor | slice) -> Inputs:
    return {k: v[idx] for k, v in x.items()} if isinstance(x, Mapping) else x[idx]


def _repeat(x: Inputs, S: int) -> Inputs:
    """Each example ``S`` times, sample-major: row ``s * B + b`` is example ``b``."""

    def rep(v: Tensor) -> Tensor:
        return v.repeat((S,) + (1,) * (v.dim() - 1))  # (S*B, ...)

    return {k: rep(v) for k, v in x.items()} if isinstance(x, Mapping) else rep(x)


def _sample_foreign(
    model: nn.Module,
    x: Inputs,
    num_samples: int,
    batch_size: int | None,
    mode: AttentionMode,
    forward: Callable[[nn.Module, Any], Tensor] | None,
    temperature: float,
    vectorised: bool,
) -> PredictionResult:
    """The predictive path for a model we did not write (attention made Bayesian by
    :func:`bayesattn.convert` or :func:`bayesattn.interop.hf.convert_hf`): ``S`` draws of
    ``softmax(f(x, w_s) / T)``. ``vectorised``: one pass under :func:`bayesattn.num_samples`
    (the model must broadcast a leading sample dim and return ``(S, B, C)``); otherwise batched
    repetition: every example ``S`` times in the batch (any model). Either way at most
    ``batch_size`` rows (example × sample) go through the model per pass."""
    from .nn.sampling import num_samples as num_samples_ctx

    fwd = forward or _default_forward
    if not (isinstance(temperature, (int, float)) and math.isfinite(temperature)) or not (
        temperature > 0
    ):
        raise ValueError(f"temperature must be a positive finite number; got {temperature!r}")
    S, B = (1 if mode == "mean" else num_samples), _batch_size(x)
    if B == 0:
        raise ValueError("x must hold at least one input; got a batch of 0")
    saved = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        with torch.no_grad(), poutine.block(), attention_mode(mode):
            per = max(1, (batch_size or 4096) // S)  # examples per pass (S rows each)
            chunks = []
            for i in range(0, B, per):
                xb = _take(x, slice(i, i + per))
                b = _batch_size(xb)
                if vectorised and S > 1:
                    with num_samples_ctx(S):
                        out = fwd(model, xb)  # (S, b, C)
                    if not isinstance(out, Tensor) or out.dim() != 3 or (
                        tuple(out.shape[:2]) != (S, b)
                    ):
                        got = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
                        raise ValueError(
                            f"vectorised sampling needs a model that returns (S, B, C) = ({S}, "
                            f"{b}, C); got {got}: use batched repetition (vectorised=False; "
                            "method='repeat' in sample_probs)"
                        )
                    chunks.append(out)
                else:  # S*b rows, at most batch_size per pass (S > batch_size: split S too)
                    rows = _repeat(xb, S) if S > 1 else xb  # (S*b, ...)
                    step = batch_size or S * b
                    outs = [
                        _check_logits(fwd(model, _take(rows, slice(j, j + step))),
                                      min(step, S * b - j), b, xb)
                        for j in range(0, S * b, step)
                    ]  # fmt: skip
                    out = torch.cat(outs)  # (S*b, C)
                    chunks.append(out.reshape((S, b) + out.shape[1:]))  # (S, b, C)
            logits = torch.cat(chunks, dim=1)  # (S, B, C)
    finally:
        for m, flag in saved:
            m.training = flag
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if S != num_samples:
        probs = probs.expand((num_samples,) + probs.shape[1:])
    return PredictionResult(probs=probs, kind=mode)


# ``PredictionResult(mode=...)``: the field is ``kind`` since 0.3 (deprecated alias until 0.4)
PredictionResult.__init__ = renamed_kwargs(mode="kind")(PredictionResult.__init__)  # type: ignore[method-assign]


def _check_network(network: Any) -> BayesianNetwork:
    if not isinstance(network, BayesianNetwork):
        raise TypeError(
            f"network must be a bayesattn BayesianNetwork (TransformerClassifier, "
            f"VisionTransformer, Seq2Seq, CausalLM) or a torch nn.Module whose attention "
            f"bayesattn.convert made Bayesian; got {type(network).__name__}"
        )
    return network


def _check_targets(net: BayesianNetwork, x: Tensor, y: Tensor | None) -> None:
    if isinstance(net, Seq2Seq) and y is None:
        raise ValueError(
            "Seq2Seq needs y (the target sequences, BOS first) for its per-token predictive "
            "distribution (teacher forcing); use network.generate() to decode without targets"
        )
    if y is not None and not isinstance(net, Seq2Seq):
        raise ValueError(
            f"y is only used by Seq2Seq (teacher forcing); {type(net).__name__} predicts from x "
            f"alone, got y of shape {tuple(y.shape)}"
        )
    if y is not None and y.shape[0] != x.shape[0]:
        raise ValueError(
            f"x and y must have the same batch size; got x {tuple(x.shape)}, y {tuple(y.shape)}"
        )


def _draw_weights(
    network: BayesianNetwork, mode: AttentionMode, num_samples: int
) -> dict[str, Tensor] | None:
    """Projection weights for the ``S`` samples: ``(S, *shape)`` draws from the weight guide
    (``"guide"``/``"elbo"``) or the projection prior (``"model"``); the guide's median in
    ``"mean"`` mode (as :meth:`BayesianNetwork.forward`); ``None`` without Bayesian weights."""
    if network.weight_guide is None:
        return None
    if mode == "mean":
        return network.weight_guide.median()
    fn = network.weight_prior_model if mode == "model" else network.weight_guide
    with poutine.block():
        if num_samples == 1:
            values = fn()  # (*shape)
        else:
            with pyro.plate("_predict_samples", num_samples, dim=-1):
                values = fn()  # (S, *shape): one weight draw per sample
    return {k: v.detach() for k, v in values.items()}


def _chunks(n: int, batch_size: int | None) -> Iterator[slice]:
    step = n if batch_size is None else batch_size
    for start in range(0, n, max(step, 1)):
        yield slice(start, min(start + step, n))


def _run_pass(
    net: BayesianNetwork,
    xb: Tensor,
    yb: Tensor | None,
    mode: AttentionMode,
    values: dict[str, Tensor] | None,
    num_particles: int,
    layers: list[tuple[str, BayesianMultiheadAttention]],
    keep_attention: bool,
    globals_: dict[str, Tensor] | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """One network pass with ``num_particles`` particles: probabilities ``(P, b, ..., C)`` and the
    recorded attention weights ``(P, b, H, Tq, Tk)`` per layer."""
    with poutine.block(), attention_mode(mode), net.pyro_context, net.weights_from(values):
        with global_values(globals_):  # one draw per sample, shared by every chunk
            logits = net.forward_logits(xb, yb, num_particles)  # (P?, b, ..., C)
    if num_particles == 1:
        logits = logits.unsqueeze(0)  # (1, b, ..., C)
    ws: dict[str, Tensor] = {}
    for name, m in layers if keep_attention else ():
        w = m.last_weights
        if w is None:
            raise RuntimeError(f"attention layer {name} recorded no weights")
        ws[name] = w.unsqueeze(0) if w.dim() == 4 else w  # (P, b, H, Tq, Tk)
    return torch.softmax(logits, dim=-1), ws


def _predictive_mask(net: BayesianNetwork, x: Tensor, y: Tensor | None) -> Tensor | None:
    """Valid positions ``(B, T)`` of a sequence model's per-token predictive; ``None`` for
    classifiers."""
    if isinstance(net, TransformerClassifier):
        return None
    _, mask, _ = net.targets(x, y)
    return mask


def _sample_predictive(
    network: Any,
    x: Inputs,
    y: Tensor | None,
    num_samples: int,
    batch_size: int | None,
    progress: bool,
    mode: str,
    keep_attention: bool,
    dropout: bool = False,
) -> PredictionResult:
    """The posterior-predictive path every public predictor runs through (see :func:`predict`).

    ``dropout=True`` keeps every ``nn.Dropout`` active (MC dropout); otherwise the network runs in
    eval mode. Computation before the first random layer is shared by all samples
    (:meth:`~bayesattn.nn.networks.TransformerClassifier.first_stochastic_layer`).
    """
    net = _check_network(network)
    check_int("num_samples", num_samples, 1)
    check_int("batch_size", batch_size, 1, allow_none=True)
    mode = check_mode(mode)
    if not isinstance(x, Tensor):
        raise TypeError(f"x must be a torch.Tensor; got {type(x).__name__}")
    _check_targets(net, x, y)
    net.check_batch(x, y)
    if x.shape[0] == 0:
        raise ValueError(f"x must hold at least one input; got shape {tuple(x.shape)}")

    S = num_samples
    drops = [m for m in net.modules() if isinstance(m, nn.Dropout) and m.p > 0] if dropout else []
    stochastic = bool(drops) or (
        mode != "mean" and (bool(net.bayesian_layers) or net.weight_guide is not None)
    )
    S_run = S if stochastic else 1
    layers = [(n, m) for n, m in net.named_modules() if isinstance(m, BayesianMultiheadAttention)]
    saved_layers = [(m, m.record_weights, m.last_weights) for _, m in layers]
    saved_training = [(m, m.training) for m in net.modules()]

    probs_chunks: list[Tensor] = []
    attn_chunks: dict[str, list[Tensor]] = {n: [] for n, _ in layers} if keep_attention else {}
    chunks = list(_chunks(x.shape[0], batch_size))
    it = chunks
    if progress:
        from tqdm.auto import tqdm

        it = tqdm(chunks, desc="predict", unit="batch")
    try:
        net.eval()
        for drop in drops:
            drop.train()
        for _, layer in layers:
            layer.record_weights = keep_attention
        with torch.no_grad():
            values = _draw_weights(net, mode, S_run)
            gvals = net.draw_globals(mode, S_run if S_run > 1 else None)
            for sl in it:
                yb = None if y is None else y[sl]
                p, ws = _run_pass(
                    net, x[sl], yb, mode, values, S_run, layers, keep_attention, gvals
                )
                probs_chunks.append(p.expand((S,) + p.shape[1:]))  # (S, b, ..., C)
                for name, w in ws.items():
                    attn_chunks[name].append(w.expand((S,) + w.shape[1:]))  # (S, b, H, Tq, Tk)
    finally:
        for layer, rec, last in saved_layers:
            layer.record_weights, layer.last_weights = rec, last
        for mod, flag in saved_training:
            mod.training = flag

    probs = torch.cat(probs_chunks, dim=1)  # (S, B, ..., C)
    attention = {
        name: AttentionSamples(torch.cat(ws, dim=1))  # (S, B, H, Tq, Tk)
        for name, ws in attn_chunks.items()
    }
    mask = _predictive_mask(net, x, y)
    return PredictionResult(
        probs=probs, attention=attention, kind="mc_dropout" if dropout else mode, mask=mask
    )


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

    This is the library's one posterior-predictive path: classifiers and ViTs give ``(S, B, C)``,
    sequence models their per-token predictive ``(S, B, T, V)`` (teacher-forced: ``Seq2Seq``
    needs the targets ``y``; a ``CausalLM`` predicts ``x[:, 1:]`` from ``x[:, :-1]``) with the
    valid positions in ``mask``. :func:`predict_mc_dropout` and :func:`predict_ensemble` (the
    baselines) run through the same code.

    Each sample :math:`s` runs the network with attention weights drawn in ``mode`` (the amortised
    guide :math:`q(w\mid x)` by default; ``"model"``: the weight model; ``"mean"``: the deterministic
    exact-posterior weights) and, if the network has Bayesian projections, with projection weights
    :math:`\theta_s \sim q(\theta)` (one draw per sample shared by all inputs and batches, as
    are global latents such as sparse-GP inducing values, :mod:`bayesattn.nn.gp_read`; the
    projection prior in ``"model"`` mode, the guide's median in ``"mean"`` mode). The ``S`` samples
    travel as a leading particle dim (``forward(x, num_particles=S)``), entering a classifier just
    before its first random layer (the computation before it is shared), sampled weights
    broadcasting through :func:`bayesattn.nn.attention.linear` (which is why
    :func:`~bayesattn.nn.weights.bayesian_projections` accepts only attention and linear weights).

    A network with nothing random in ``mode`` (no Bayesian attention layer and no weight guide, or
    ``mode="mean"``) is run once and its output repeated ``S`` times, so every statistic has the
    usual shapes and the mutual information is exactly 0.

    The network runs in eval mode (dropout off) under ``torch.no_grad`` and Pyro sites are hidden
    from any enclosing handler; its training flags and the attention layers' ``record_weights``/
    ``last_weights`` are restored afterwards.

    Args:
        network: any :class:`~bayesattn.nn.networks.BayesianNetwork`.
        x: inputs as the network takes them.
        num_samples: ``S >= 1``.
        batch_size: split ``x`` into chunks of at most this many inputs (``None``: one chunk).
        progress: show a ``tqdm`` bar over the chunks.
        mode: the attention mode: ``"guide"`` (default), ``"model"``, ``"mean"`` or ``"elbo"``
            (guide draws without Pyro sites); see :mod:`bayesattn.nn.modes`. ``"posterior"`` and
            ``"prior"`` are deprecated spellings of ``"guide"`` and ``"model"``.
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
    mode = check_mode(mode, stacklevel=4)
    if isinstance(network, nn.Module) and not isinstance(network, BayesianNetwork):
        check_int("num_samples", num_samples, 1)
        check_int("batch_size", batch_size, 1, allow_none=True)
        if y is not None:
            raise ValueError("y is only used by Seq2Seq networks; got y for a foreign model")
        return _sample_foreign(
            network, x, num_samples, batch_size, mode, forward, temperature, vectorised
        )
    if forward is not None or temperature != 1.0 or vectorised:
        raise ValueError(
            "forward, temperature and vectorised apply to models we did not write; a "
            f"{type(network).__name__} samples in one vectorised pass by itself"
        )
    return _sample_predictive(
        network, x, y, num_samples, batch_size, progress, mode, keep_attention
    )


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
    return _sample_predictive(
        network, x, y, num_samples, batch_size, progress, "mean", False, dropout=True
    )


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
    mode = check_mode(mode, stacklevel=4)
    if isinstance(networks, BayesianNetwork) or not isinstance(networks, Sequence):
        raise TypeError(
            f"networks must be a sequence of BayesianNetworks; got {type(networks).__name__}"
        )
    if len(networks) < 1:
        raise ValueError("networks must hold at least one network")
    kinds = {type(n) for n in networks}
    if len(kinds) > 1:
        raise TypeError(
            f"ensemble members must be of one network type; got {sorted(k.__name__ for k in kinds)}"
        )
    results = [
        _sample_predictive(n, x, y, num_samples, batch_size, False, mode, False) for n in networks
    ]
    shapes = {tuple(r.probs.shape[1:]) for r in results}
    if len(shapes) > 1:
        raise ValueError(
            "ensemble members must predict the same classes for the same inputs; got "
            f"per-member probs (B, ..., C) of shapes {[tuple(r.probs.shape[1:]) for r in results]}"
        )
    probs = torch.cat([r.probs[: (num_samples if mode != "mean" else 1)] for r in results])
    return PredictionResult(probs=probs, kind=f"ensemble/{mode}", mask=results[0].mask)
