r"""Post-hoc calibration of a trained model: freeze its weights, fit only the attention
posteriors (and a temperature) by SVI on a calibration split, then draw the posterior predictive.

The model's attention is made Bayesian first (:func:`bayesattn.convert` for
``torch.nn.MultiheadAttention`` models, :func:`bayesattn.interop.hf.convert_hf` for Hugging Face
models); every other parameter stays frozen. With attention weights :math:`w_b` of example
:math:`b` (all layers), amortised posterior :math:`q_\phi(w_b\mid x_b)` and temperature
:math:`T`, :func:`fit_posthoc` maximises the per-example ELBO

.. math::

    \frac1B\sum_{b}\Big(E_{q_\phi}\log\operatorname{softmax}\big(f(x_b, w_b)/T\big)_{y_b}
    - \mathrm{KL}\big(q_\phi(w_b\mid x_b)\,\|\,p(w_b\mid x_b)\big)\Big)

over :math:`\phi` and :math:`\log T` with reparameterised draws and analytic KL per layer (the
one-pass ``"elbo"`` mode of :mod:`bayesattn.nn.modes`): stochastic variational inference with
:math:`T` as a point estimate. The predictive is

.. math::

    p(y\mid x) \approx \frac1S\sum_s \operatorname{softmax}\big(f(x, w_s)/T\big),
    \qquad w_s\sim q_\phi(w\mid x),

drawn by :func:`sample_probs` (``(S, B, C)``), the one sampling step of this module.

Inputs ``x`` are a tensor or a dict of tensors (e.g. ``input_ids``/``attention_mask``) with the
batch along dim 0; ``forward(model, x)`` maps them to logits ``(B, C)`` (default ``model(x)``;
for transformers ``lambda m, x: m(**x).logits``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import Tensor, nn

from .. import calibration as C
from .._validation import check_bool, check_int, check_real, check_seed, torch_generator
from ..nn.attention import BayesianMultiheadAttention
from ..nn.modes import collect_kl
from ..nn.read import FOREIGN_FAMILY_ATTR
from ..predictive.foreign import Inputs, default_forward, input_batch_size, take_rows
from ..uncertainty import predict
from ._checks import check_labels

__all__ = [
    "PosthocCalibration",
    "family_parameters",
    "freeze_for_posthoc",
    "fit_posthoc",
    "sample_probs",
    "mean_probs",
    "evaluate",
]

Forward = Callable[[nn.Module, Any], Tensor]


def family_parameters(model: nn.Module) -> list[nn.Parameter]:
    """Parameters of every attention family in ``model`` (torch or transformers), and of every
    GP read attached to a converted layer (``layer.gp_read``: inducing keys, scales, q(u))."""
    params: list[nn.Parameter] = []
    seen: set[int] = set()
    for m in model.modules():
        fam = m.family if isinstance(m, BayesianMultiheadAttention) else None
        fam = fam if fam is not None else getattr(m, FOREIGN_FAMILY_ATTR, None)
        gp = m.gp_read if isinstance(m, BayesianMultiheadAttention) else None
        for part in (fam, gp):
            for p in part.parameters() if part is not None else ():
                if id(p) not in seen:
                    seen.add(id(p))
                    params.append(p)
    return params


def freeze_for_posthoc(model: nn.Module) -> list[nn.Parameter]:
    """``requires_grad=False`` on every parameter but the attention families'; returns those."""
    keep = family_parameters(model)
    if not keep:
        raise ValueError(
            "model has no Bayesian attention with trainable family (or GP read) parameters: "
            "convert it first (bayesattn.convert(model, family=...) or "
            "bayesattn.interop.hf.convert_hf)"
        )
    ids = {id(p) for p in keep}
    for p in model.parameters():
        p.requires_grad_(id(p) in ids)
    return keep


def check_logits_labels(logits: Any, y: Tensor, step: int) -> None:
    """The forward's logits ``(B, C)`` are finite and the labels lie in ``[0, C)``."""
    if not isinstance(logits, Tensor) or logits.dim() != 2 or logits.shape[0] != y.shape[0]:
        got = tuple(logits.shape) if isinstance(logits, Tensor) else type(logits).__name__
        raise ValueError(f"forward must return logits (B, C) = ({y.shape[0]}, C); got {got}")
    check_labels("y", y, num_classes=logits.shape[1])
    if not bool(torch.isfinite(logits).all()):
        raise FloatingPointError(
            f"fit_posthoc: the model's logits are not finite (NaN or Inf) at step {step}; "
            "the calibration needs a model whose outputs are finite on the calibration split"
        )


def check_step(loss: Tensor, params: list[Tensor], step: int) -> None:
    """The loss and every gradient are finite (as ``fit`` checks): a step is never taken on a
    NaN, so the family parameters and ``T`` stay at their last finite values."""
    bad = not bool(torch.isfinite(loss))
    bad = bad or any(p.grad is not None and not bool(torch.isfinite(p.grad).all()) for p in params)
    if bad:
        raise FloatingPointError(
            f"fit_posthoc diverged at step {step} (loss {float(loss):.4g}, or a gradient, is not "
            "finite); the parameters keep their last finite values: lower lr"
        )


@dataclass
class PosthocCalibration:
    """A model with fitted attention posteriors and temperature (see :func:`fit_posthoc`)."""

    model: nn.Module
    forward: Forward
    log_temperature: Tensor
    history: list[float] = field(default_factory=list)  # per-step negative ELBO per example

    @property
    def temperature(self) -> float:
        return float(self.log_temperature.exp())

    def sample_probs(self, x: Inputs, num_samples: int = 32, **kw: Any) -> Tensor:
        """Posterior-predictive probability samples ``(S, B, C)`` (see :func:`sample_probs`)."""
        return sample_probs(
            self.model, x, num_samples, forward=self.forward, temperature=self.temperature, **kw
        )


def _steps(steps: int, progress: bool) -> Any:
    if not progress:
        return range(steps)
    from tqdm.auto import tqdm

    return tqdm(range(steps), desc="post-hoc SVI")


def _negative_elbo(
    model: nn.Module, fwd: Forward, xb: Inputs, yb: Tensor, log_t: Tensor, n: int, step: int
) -> Tensor:
    """The negative ELBO per example of one batch: local KLs per example, a global latent's
    KL (a GP read's inducing values) once per data set, i.e. 1/n of it per example."""
    with collect_kl() as col:
        logits = fwd(model, xb)  # (B, C)
        kl = col.total()  # (B,) or 0.0
    check_logits_labels(logits, yb, step)
    nll = nn.functional.cross_entropy(logits / log_t.exp(), yb, reduction="none")  # (B,)
    return (nll + kl).mean() + col.global_total() / n


def fit_posthoc(
    model: nn.Module,
    x: Inputs,
    y: Tensor,
    *,
    forward: Forward | None = None,
    steps: int = 200,
    lr: float = 0.03,
    batch_size: int = 64,
    fit_temperature: bool = True,
    seed: int = 0,
    progress: bool = False,
) -> PosthocCalibration:
    """Fit the attention posteriors (and ``log T``) of a converted, trained ``model`` by SVI on
    the calibration split ``(x, y)``; all other weights are frozen (only the families' parameters
    and ``log T`` are given to the optimiser; ``requires_grad`` flags are restored afterwards) and
    dropout is off.

    Returns a :class:`PosthocCalibration`; ``history`` holds the negative ELBO per example.
    """
    fwd = forward or default_forward
    n = input_batch_size(x)
    check_labels("y", y, n)
    for name, v in (("steps", steps), ("batch_size", batch_size)):
        check_int(name, v, 1)
    check_real("lr", lr, gt=0.0)
    check_seed(seed)
    check_bool("fit_temperature", fit_temperature)
    check_bool("progress", progress)
    flags = [(p, p.requires_grad) for p in model.parameters()]
    params = freeze_for_posthoc(model)
    trainable = {id(p) for p in params}
    ref = params[0]
    log_t = torch.zeros((), device=ref.device, dtype=ref.dtype, requires_grad=fit_temperature)
    opt = torch.optim.Adam(params + ([log_t] if fit_temperature else []), lr=lr)
    gen = torch_generator(seed)
    was_training = model.training
    model.eval()
    history: list[float] = []
    try:
        for step in _steps(steps, progress):
            idx = torch.randint(0, n, (min(batch_size, n),), generator=gen)
            xb, yb = take_rows(x, idx), y[idx].to(ref.device, torch.long)
            loss = _negative_elbo(model, fwd, xb, yb, log_t, n, step)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            check_step(loss, params + [log_t], step)  # before the step: parameters stay finite
            opt.step()
            history.append(float(loss.detach()))
    finally:
        # Pyro's param store turns requires_grad back on for PyroModule parameters it registers:
        # the frozen weights never reach the optimiser, and their flags and grads are restored
        for p, flag in flags:
            if id(p) not in trainable:
                p.grad = None
            p.requires_grad_(flag)
        model.train(was_training)
    return PosthocCalibration(model, fwd, log_t.detach(), history)


@torch.no_grad()
def sample_probs(
    model: nn.Module,
    x: Inputs,
    num_samples: int = 32,
    *,
    forward: Forward | None = None,
    temperature: float = 1.0,
    method: Literal["repeat", "vectorised"] = "repeat",
    batch_size: int = 4096,
) -> Tensor:
    """Posterior-predictive probability samples ``softmax(f(x, w_s)/T)``, ``w_s ~ q(w|x)``.

    ``method="repeat"`` (batched repetition, any model): each example is repeated ``S`` times in
    the batch, so every copy draws its own attention weights in one ordinary forward pass (rows of
    at most ``batch_size``). ``method="vectorised"``: one pass under
    :func:`bayesattn.num_samples` for models whose other operations broadcast over a leading
    sample dim (they must return ``(S, B, C)``).

    Shape:
        returns ``(S, B, C)``.
    """
    if method not in ("repeat", "vectorised"):
        raise ValueError(f"method must be 'repeat' or 'vectorised'; got {method!r}")
    res = predict(
        model,
        x,
        num_samples,
        batch_size=batch_size,
        forward=forward,
        temperature=temperature,
        vectorised=method == "vectorised",
    )
    return res.probs  # (S, B, C): the library's one posterior-predictive path


@torch.no_grad()
def mean_probs(
    model: nn.Module, x: Inputs, *, forward: Forward | None = None, temperature: float = 1.0
) -> Tensor:
    """Deterministic (posterior-mean attention) probabilities ``(1, B, C)``: the model as trained."""
    res = predict(model, x, 1, mode="mean", forward=forward, temperature=temperature)
    return res.probs


def evaluate(
    probs: Tensor, y: Tensor, probs_ood: Tensor | None = None, n_bins: int = 15
) -> dict[str, float]:
    """Accuracy, ECE, NLL, Brier of the predictive mean of ``probs`` ``(S, B, C)`` against ``y``,
    and OOD AUROC (predictive entropy as the score) when ``probs_ood`` ``(S, B', C)`` is given."""
    if probs.dim() != 3:
        raise ValueError(f"probs must be (S, B, C); got shape {tuple(probs.shape)}")
    p = probs.mean(0).double()  # (B, C)
    out = {
        "accuracy": C.accuracy(p, y),
        "ece": C.expected_calibration_error(p, y, n_bins=n_bins),
        "nll": C.negative_log_likelihood(p, y),
        "brier": C.brier_score(p, y),
    }
    if probs_ood is not None:
        if probs_ood.dim() != 3:
            raise ValueError(f"probs_ood must be (S, B, C); got shape {tuple(probs_ood.shape)}")
        if probs_ood.shape[-1] != probs.shape[-1]:
            raise ValueError(
                f"probs_ood must have the same class count C as probs ({probs.shape[-1]}); got "
                f"shape {tuple(probs_ood.shape)} against probs {tuple(probs.shape)}"
            )
        h_in = C.predictive_entropy(p)
        h_out = C.predictive_entropy(probs_ood.mean(0).double())
        out["ood_auroc"] = C.ood_auroc(h_in, h_out)
    return out
