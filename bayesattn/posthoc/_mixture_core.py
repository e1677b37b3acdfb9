r"""A K-component mixture posterior over rank-1 factors of the attention projections, fitted post
hoc on a frozen trained model (torch or Hugging Face), in one vectorised pass per step.

Every attention layer's projections :math:`W_q, W_k, W_v, W_o` get rank-1 factors
:math:`W = \bar W \circ (s\,r^\top)` (the sites of
:func:`~bayesattn.posthoc.rank1_hooks.rank1_sites`: four per ``MultiheadAttention`` layer, eight
per Hugging Face layer), all of them one vector :math:`\theta\in\mathbb R^D` with the equal-weight mixture posterior and prior of
:mod:`bayesattn.functional.mixture`:

.. math:: q(\theta) = \frac1K\sum_k \mathcal N(\mu_k, \operatorname{diag}\sigma_k^2),\qquad
          p(\theta) = \mathcal N(\mathbf 1, s_0^2 I).

The trained weights :math:`\bar W` stay frozen. :func:`fit_posthoc_mixture` maximises, with
Adam over :math:`(\mu, \rho)` (:math:`\sigma = \operatorname{softplus}\rho`) and a temperature
:math:`\log T` fitted jointly (a point estimate, as :func:`~bayesattn.posthoc._svi_core.fit_posthoc`
does), the ELBO per calibration example

.. math:: \frac1{mK}\sum_{j=1}^{mK}\frac1B\sum_b \log\operatorname{softmax}\big(f(x_b;
          \theta_j)/T\big)_{y_b} \;-\; \frac{U}{n},

with :math:`\theta_j` stratified draws (draw :math:`j` from component :math:`j \bmod K`,
:func:`~bayesattn.functional.mixture.stratified_draws`), the likelihood scaled to the ``n``
calibration examples and the mixture's global KL charged once through its convexity bound
:math:`U = \frac1K\sum_k\mathrm{KL}(q_k\|p) \ge \mathrm{KL}(q\|p)` (so the objective stays a lower
bound on the evidence). The ``mK`` draws are folded into the batch, ``(mK·B, …)``, and each
hook applies its factor as ``(mK, B, …)``: one forward pass, no loop over components.

The temperature is fitted jointly because the factors' spread changes how confident the
predictive is: a temperature fitted before (on the trained model) would charge the spread twice.

The predictive :meth:`PosthocMixture.probs` is ``(S, B, C)`` draws
:math:`\operatorname{softmax}(f(x;\theta_s)/T)` (stratified over the components); their mean
is the posterior predictive. ``S`` draws cost ``S`` forward passes of the model's rows, in one
call.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from .._validation import check_bool, check_int, check_real, check_seed, torch_generator
from ..functional.mixture import mixture_kl_bound, stratified_draws
from ..predictive.foreign import Inputs, default_forward, input_batch_size, take_rows
from ._checks import check_labels
from ._svi_core import check_logits_labels, check_step
from .rank1_hooks import Rank1Site, apply_factors, rank1_sites

__all__ = ["PosthocMixture", "fit_posthoc_mixture", "factor_logits"]

Forward = Callable[[nn.Module, Any], Tensor]


def factor_logits(
    model: nn.Module, forward: Forward, x: Inputs, sites: list[Rank1Site], theta: Tensor
) -> Tensor:
    """Logits of ``model`` under each of ``J`` factor draws, in one pass: the ``B`` inputs are
    repeated draw-major into a ``J·B`` batch and every site applies draw ``j`` to its rows.

    Shape:
        x ``(B, …)`` (or a dict of such), theta ``(J, D)`` → ``(J, B, C)``.
    """
    B = input_batch_size(x)
    J = theta.shape[0]
    xs = take_rows(x, torch.arange(B).repeat(J))  # row j·B + b is example b
    with apply_factors(sites, theta):
        logits = forward(model, xs)  # (J·B, C)
    return logits.reshape(J, B, *logits.shape[1:])


@dataclass
class PosthocMixture:
    """A fitted post-hoc mixture (see the module docstring): ``mean``/``std`` ``(K, D)`` of the
    components over the factor sites ``sites``; ``history`` the negative ELBO per example."""

    model: nn.Module
    forward: Forward
    sites: list[Rank1Site]
    mean: Tensor  # (K, D)
    std: Tensor  # (K, D)
    log_temperature: Tensor
    prior_std: float
    history: list[float] = field(default_factory=list)
    max_rows: int = 8192  # rows (draws × examples) per forward pass

    @property
    def num_components(self) -> int:
        return int(self.mean.shape[0])

    @property
    def temperature(self) -> float:
        return float(self.log_temperature.exp())

    @property
    def kl(self) -> float:
        """The mixture's KL from the prior in nats: its convexity upper bound :math:`U` (what
        the ELBO charged); :meth:`kl_bounds` gives :math:`(U, U - \\log K)`."""
        return self.kl_bounds()[0]

    def kl_bounds(self) -> tuple[float, float]:
        up, lo = mixture_kl_bound(self.mean, self.std, 1.0, self.prior_std)
        return float(up), float(lo)

    def factors(self) -> dict[str, tuple[Tensor, Tensor]]:
        """``{site name: (mean (K, size), std (K, size))}``, e.g. ``"…self_attn.q.in"``."""
        return {
            st.name: (
                self.mean[:, st.offset : st.offset + st.size],
                self.std[:, st.offset : st.offset + st.size],
            )
            for st in self.sites
        }

    @torch.no_grad()
    def probs(
        self, x: Inputs, num_samples: int | None = None, *, spread: bool = True,
        seed: int | None = None,
    ) -> Tensor:  # fmt: skip
        """``(S, B, C)`` predictive draws (``S`` defaults to ``K``: one per component; draw
        ``i`` from component ``i mod K``, so ``S`` a multiple of ``K`` weighs them equally);
        ``spread=False``: the component means (point masses). Mean over draws = predictive."""
        K = self.num_components
        S = check_int("num_samples", K if num_samples is None else num_samples, 1)
        check_bool("spread", spread)
        g = torch_generator(check_seed(seed)) if seed is not None else None
        m = math.ceil(S / K)
        theta = stratified_draws(self.mean, self.std if spread else None, m, g)[:S]  # (S, D)
        n = input_batch_size(x)
        rows = max(1, self.max_rows // S)
        was = self.model.training
        self.model.eval()
        try:
            out = [
                factor_logits(self.model, self.forward, take_rows(x, torch.arange(a, min(a + rows, n))), self.sites, theta)
                for a in range(0, n, rows)
            ]  # fmt: skip
        finally:
            self.model.train(was)
        return torch.softmax(torch.cat(out, 1) / self.temperature, -1)  # (S, B, C)


def _check_args(
    num_components: int, prior_std: float, draws: int, steps: int, batch_size: int, lr: float,
    init_scale: float, init_std: float, fit_temperature: bool, progress: bool,
) -> None:  # fmt: skip
    check_bool("fit_temperature", fit_temperature)
    check_bool("progress", progress)
    check_int("num_components", num_components, 1)
    check_real("prior_std", prior_std, gt=0.0)
    for name, v in (("draws_per_component", draws), ("steps", steps), ("batch_size", batch_size)):
        check_int(name, v, 1)
    check_real("lr", lr, gt=0.0)
    check_real("init_scale", init_scale, ge=0.0)
    check_real("init_std", init_std, gt=0.0)


def _init(
    model: nn.Module, sites: list[Rank1Site], K: int, init_scale: float, init_std: float,
    g: torch.Generator, fit_temperature: bool,
) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """Means ``1 + init_scale·ε`` ``(K, D)`` (components start apart, the model nearly as
    trained), ``ρ`` with ``softplus(ρ) = init_std`` and ``log T = 0``, in the model's dtype."""
    D = sites[-1].offset + sites[-1].size
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    mean = 1 + init_scale * torch.randn(K, D, generator=g, dtype=dtype)
    rho = torch.full((K, D), math.log(math.expm1(init_std)), dtype=dtype)
    log_t = torch.zeros((), dtype=dtype, requires_grad=fit_temperature)
    return mean.requires_grad_(), rho.requires_grad_(), log_t


def _tqdm(it: Any) -> Any:
    from tqdm.auto import tqdm

    return tqdm(it, desc="post-hoc mixture")


def _negative_elbo(
    logits: Tensor, y: Tensor, log_t: Tensor, mean: Tensor, rho: Tensor, prior_std: float, n: int
) -> Tensor:
    """The negative ELBO per calibration example: the tempered cross-entropy averaged over the
    ``J`` draws and ``B`` examples, plus the mixture's KL bound over ``n``.

    Shape:
        logits ``(J, B, C)``, y ``(B,)`` → a scalar.
    """
    J = logits.shape[0]
    nll = nn.functional.cross_entropy((logits / log_t.exp()).flatten(0, 1), y.repeat(J))
    std = nn.functional.softplus(rho)
    return nll + mixture_kl_bound(mean, std, 1.0, prior_std)[0] / n


def _elbo_steps(
    model: nn.Module, fwd: Forward, x_cal: Inputs, y_cal: Tensor, sites: list[Rank1Site],
    params: list[Tensor], log_t: Tensor, lr: float, steps: int, batch_size: int, draws: int,
    prior_std: float, gen: torch.Generator, progress: bool,
) -> list[float]:  # fmt: skip
    """Adam on the negative ELBO over ``params = [mean, rho, (log T)]``; the per-step losses."""
    mean, rho = params[0], params[1]
    opt = torch.optim.Adam(params, lr=lr)
    n = input_batch_size(x_cal)
    history: list[float] = []
    it: Any = _tqdm(range(steps)) if progress else range(steps)
    for step in it:
        idx = torch.randint(0, n, (min(batch_size, n),), generator=gen)
        xb, yb = take_rows(x_cal, idx), y_cal[idx]
        theta = stratified_draws(mean, nn.functional.softplus(rho), draws, gen)
        logits = factor_logits(model, fwd, xb, sites, theta)  # (mK, B, C)
        check_logits_labels(logits[0], yb, step)
        loss = _negative_elbo(logits, yb, log_t, mean, rho, prior_std, n)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        check_step(loss, params, step)
        opt.step()
        history.append(float(loss.detach()))
    return history


def fit_posthoc_mixture(
    model: nn.Module,
    x_cal: Inputs,
    y_cal: Tensor,
    num_components: int = 4,
    *,
    forward: Forward | None = None,
    prior_std: float = 0.1,
    draws_per_component: int = 1,
    steps: int = 300,
    lr: float = 0.01,
    batch_size: int = 64,
    init_scale: float = 0.05,
    init_std: float = 0.01,
    fit_temperature: bool = True,
    seed: int = 0,
    progress: bool = False,
) -> PosthocMixture:
    """Fit the post-hoc rank-1 mixture of ``model`` (frozen: its parameters are never given to
    the optimiser, their ``requires_grad`` flags are restored, no hook is left on it) on the
    calibration split ``(x_cal, y_cal)`` (module docstring).

    Args:
        num_components: ``K`` ≥ 1 equal-weight components.
        forward: ``forward(model, x)`` → logits ``(B, C)`` (default ``model(x)``/``model(**x)``).
        prior_std: ``s0`` > 0 of the prior ``N(1, s0²)`` on every factor.
        draws_per_component: ``m``: each step evaluates ``m·K`` draws in one pass.
        steps, lr, batch_size: Adam steps, learning rate, examples per step (``B``).
        init_scale: the components' means start at ``1 + init_scale·N(0, 1)``.
        init_std: their standard deviations start here.
        fit_temperature: fit ``log T`` jointly (else ``T = 1``).
        progress: a tqdm bar over the steps.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module; got {type(model).__name__}")
    _check_args(num_components, prior_std, draws_per_component, steps, batch_size, lr,
                init_scale, init_std, fit_temperature, progress)  # fmt: skip
    gen = torch_generator(check_seed(seed))
    fwd = forward or default_forward
    n = input_batch_size(x_cal)
    check_labels("y_cal", y_cal, n)
    sites = rank1_sites(model)
    mean, rho, log_t = _init(model, sites, num_components, init_scale, init_std, gen,
                             fit_temperature)  # fmt: skip
    params = [mean, rho] + ([log_t] if fit_temperature else [])
    flags = [(p, p.requires_grad) for p in model.parameters()]
    was_training = model.training
    try:
        for p, _ in flags:
            p.requires_grad_(False)
        model.eval()
        history = _elbo_steps(model, fwd, x_cal, y_cal, sites, params, log_t, lr, steps,
                              batch_size, draws_per_component, prior_std, gen, progress)  # fmt: skip
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)
        model.train(was_training)
    std = nn.functional.softplus(rho.detach())
    return PosthocMixture(model, fwd, sites, mean.detach(), std, log_t.detach(), prior_std, history)
