r"""Explicit Pyro models of a single attention read.

**The categorical model.** For query :math:`q_i` (per batch element and head) the latent
:math:`z_i \in \{1..T_k\}` is the key the query reads:

.. math::

    z_i \sim \operatorname{Categorical}(\pi_i), \qquad
    p(q_i \mid z_i = j) \propto \exp(q_i\cdot k_j/\sqrt d),

    p(z_i = j \mid q_i) = \operatorname{softmax}_j(\log\pi_{ij} + q_i\cdot k_j/\sqrt d), \qquad
    p(q_i) \propto \sum_j \pi_{ij} \exp(q_i\cdot k_j/\sqrt d).

:func:`attention_model` writes this down as a Pyro program; :func:`exact_posterior` and
:func:`exact_evidence` get the posterior and the evidence **by Pyro's exact enumeration** of
:math:`z` (an independent check of :func:`bayesattn.functional.posterior_weights`), and
:func:`fit_categorical_guide` gets the posterior a third way, by SVI with a categorical guide.

**Online belief updates** over a key relevance shared by queries (:class:`OnlineKeyRelevance`,
the Pyro model :func:`relevance_model` and its SVI fit :func:`fit_relevance_guide`) are in
:mod:`bayesattn.models.key_relevance`; they stay importable from here.

**Rows with no allowed key.** If every key of a query has zero prior mass (:math:`\log\pi = -\infty`
everywhere in the row) the categorical model has no valid :math:`z` and its likelihood is undefined;
the functions here raise ``ValueError`` (unlike :func:`bayesattn.functional.posterior_weights`,
which returns a zero row for the network's sake).

Dimension glossary: ``B`` batch, ``H`` heads, ``Tq`` queries, ``Tk`` keys, ``D`` head dim.
"""

from __future__ import annotations

import math

import pyro
import pyro.distributions as dist
import torch
from pyro.infer import SVI, TraceEnum_ELBO, config_enumerate
from pyro.ops.indexing import Vindex
from pyro.optim import PyroOptim
from torch import Tensor

from .._validation import check_finite, check_float_tensor, check_int, check_real, seeded
from ..functional import attention_logits
from ..priors import KeyRelevancePrior

# the online belief updates live in .key_relevance; they stay importable from here
from .key_relevance import OnlineKeyRelevance as OnlineKeyRelevance
from .key_relevance import fit_relevance_guide as fit_relevance_guide
from .key_relevance import relevance_model as relevance_model

__all__ = [
    "attention_model",
    "exact_posterior",
    "exact_evidence",
    "fit_categorical_guide",
    "OnlineKeyRelevance",
    "relevance_model",
    "fit_relevance_guide",
]

#: plate dims of :func:`attention_model`: batch -3, heads -2, queries -1.
_MAX_PLATE_NESTING = 3


# ------------------------------------------------------------------------------------------------
# validation
# ------------------------------------------------------------------------------------------------


def _prepare(
    q: Tensor,
    k: Tensor,
    log_prior: Tensor | KeyRelevancePrior | None,
    scale: float | None,
) -> tuple[Tensor, Tensor]:
    """Validate inputs; return ``(scores, log_pi)``, both ``(B, H, Tq, Tk)``, ``log_pi`` normalised
    per row (``-inf`` kept where the prior has zero mass)."""
    check_finite("q", check_float_tensor("q", q, ndim=4, layout="(B, H, Tq, D)"))
    check_finite("k", check_float_tensor("k", k, ndim=4, layout="(B, H, Tk, D)"))
    if q.shape[:2] != k.shape[:2] or q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"q (B, H, Tq, D) and k (B, H, Tk, D) must share B, H and D; got q {tuple(q.shape)}, "
            f"k {tuple(k.shape)}"
        )
    if k.shape[-2] < 1 or q.shape[-2] < 1:
        raise ValueError(
            f"need at least one query and one key; got q {tuple(q.shape)}, k {tuple(k.shape)}"
        )
    b, h, tq, _ = q.shape
    tk = k.shape[-2]
    full = (b, h, tq, tk)
    scores = attention_logits(q, k, scale)  # (B, H, Tq, Tk)

    if isinstance(log_prior, KeyRelevancePrior):
        log_prior = log_prior(q, k)  # broadcastable to (B, H, Tq, Tk)
    if log_prior is None:
        log_pi = scores.new_full(full, -math.log(tk))  # (B, H, Tq, Tk)
        return scores, log_pi
    if not isinstance(log_prior, Tensor):
        raise TypeError(
            "log_prior must be None, a KeyRelevancePrior or a tensor broadcastable to "
            f"(B, H, Tq, Tk) = {full}; got {type(log_prior).__name__}"
        )
    if not log_prior.is_floating_point():
        raise TypeError(
            f"log_prior must be a floating-point log-prior (-inf = masked), got dtype "
            f"{log_prior.dtype}; convert boolean masks with functional.mask_to_log_prior"
        )
    try:
        ok = log_prior.dim() <= 4 and torch.broadcast_shapes(log_prior.shape, full) == full
    except RuntimeError:
        ok = False
    if not ok:
        raise ValueError(
            f"log_prior must broadcast to (B, H, Tq, Tk) = {full}; got {tuple(log_prior.shape)}"
        )
    if torch.isnan(log_prior).any() or (log_prior == float("inf")).any():
        raise ValueError(
            f"log_prior must not contain NaN or +inf (-inf = masked key); shape "
            f"{tuple(log_prior.shape)}"
        )
    lp = log_prior.to(dtype=scores.dtype, device=scores.device).expand(full)  # (B, H, Tq, Tk)
    norm = torch.logsumexp(lp, dim=-1, keepdim=True)  # (B, H, Tq, 1)
    dead = norm == float("-inf")  # (B, H, Tq, 1)
    if dead.any():
        first = tuple(int(i) for i in dead.squeeze(-1).nonzero()[0])
        raise ValueError(
            f"log_prior masks every key for {int(dead.sum())} (batch, head, query) rows of "
            f"(B, H, Tq, Tk) = {full}, first at (b, h, i) = {first}; the categorical model "
            "z ~ Categorical(pi) is undefined there"
        )
    log_pi = lp - norm  # (B, H, Tq, Tk), each row logsumexp = 0
    return scores, log_pi


def _empty_guide(*args: object, **kwargs: object) -> None:
    """Guide with no latent sites: every model latent is enumerated."""


# ------------------------------------------------------------------------------------------------
# the categorical model of one attention read
# ------------------------------------------------------------------------------------------------


def attention_model(
    q: Tensor,
    k: Tensor,
    log_prior: Tensor | KeyRelevancePrior | None = None,
    scale: float | None = None,
) -> Tensor:
    r"""Pyro model of one attention read: which key does each query read?

    .. math::

        z_{bhi} \sim \operatorname{Categorical}(\pi_{bhi}), \qquad
        \log p(q_{bhi} \mid z_{bhi} = j) = q_{bhi}\cdot k_{bhj}\,/\sqrt d + \text{const},

    with :math:`\pi_{bhi} = \operatorname{softmax}(\text{log\_prior}_{bhi})` (the log-prior is
    normalised per row; ``-inf`` entries are keys with zero prior mass and stay impossible). The
    likelihood enters as ``pyro.factor("lik", ...)``; it works with ``z`` sampled or enumerated
    (extra leading enumeration dims), so with ``config_enumerate`` and ``TraceEnum_ELBO`` the
    posterior of ``z`` is exact.

    Sites: ``"z"`` (latent key index), ``"lik"`` (factor). Plates: ``"batch"`` (dim -3),
    ``"heads"`` (dim -2), ``"queries"`` (dim -1); use ``max_plate_nesting=3``.

    Args:
        q: per-head queries.
        k: per-head keys.
        log_prior: log key relevance (:math:`\log\pi`, unnormalised, ``-inf`` = masked), e.g. from
            :mod:`bayesattn.priors` or :func:`bayesattn.functional.mask_to_log_prior`; or a
            :class:`~bayesattn.priors.KeyRelevancePrior`, called as ``log_prior(q, k)``. ``None``
            = uniform.
        scale: score scale, default :math:`1/\sqrt d`.

    Returns:
        ``z``, the sampled (or enumerated) key index.

    Raises:
        ValueError: on bad shapes, non-finite ``q``/``k``, NaN/``+inf`` in ``log_prior``, or a row
            whose keys are all masked (the model is undefined there).
        TypeError: on non-tensor or non-floating inputs (e.g. a boolean mask as ``log_prior``).

    Shape:
        q ``(B, H, Tq, D)``, k ``(B, H, Tk, D)``, log_prior broadcastable to ``(B, H, Tq, Tk)``
        → z ``(B, H, Tq)`` (``(Tk, 1, 1, 1)`` when enumerated in parallel).

    Example:
        >>> q, k = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 5, 4)
        >>> tr = pyro.poutine.trace(attention_model).get_trace(q, k)
        >>> tr.nodes["z"]["value"].shape
        torch.Size([1, 2, 3])
    """
    scores, log_pi = _prepare(q, k, log_prior, scale)  # (B, H, Tq, Tk) each
    b, h, tq, _ = scores.shape
    with (
        pyro.plate("batch", b, dim=-3),
        pyro.plate("heads", h, dim=-2),
        pyro.plate("queries", tq, dim=-1),
    ):
        z = pyro.sample("z", dist.Categorical(logits=log_pi))  # (B, H, Tq) or (Tk, 1, 1, 1)
        # Vindex broadcasts z against the batch dims of `scores`: (..., B, H, Tq)
        pyro.factor("lik", Vindex(scores)[..., z])
    return z


def _as_4d(x: Tensor, full: tuple[int, int, int, int]) -> Tensor:
    # compute_marginals squeezes leading size-1 dims; restore them.
    while x.dim() < 4:
        x = x.unsqueeze(0)
    return x.expand(full)


def exact_posterior(
    q: Tensor,
    k: Tensor,
    log_prior: Tensor | KeyRelevancePrior | None = None,
    scale: float | None = None,
) -> Tensor:
    r"""Posterior :math:`p(z_{bhi} = j \mid q)` of :func:`attention_model`, by Pyro's enumeration.

    Runs ``TraceEnum_ELBO(max_plate_nesting=3).compute_marginals`` on the model with ``z``
    enumerated in parallel and an empty guide, so the answer comes from Pyro's sum-product
    contraction of :math:`\log\pi + \text{lik}`, not from a softmax of ours. It equals
    :func:`bayesattn.functional.posterior_weights` (checked in the tests) and is differentiable.

    Raises:
        ValueError: as :func:`attention_model` (notably rows with every key masked).

    Shape:
        q ``(B, H, Tq, D)``, k ``(B, H, Tk, D)``, log_prior broadcastable to ``(B, H, Tq, Tk)``
        → ``(B, H, Tq, Tk)``, rows summing to 1, exact zeros at masked keys.
    """
    _prepare(q, k, log_prior, scale)  # validate up front, with our error messages
    log_pi: Tensor | None = (
        log_prior(q, k) if isinstance(log_prior, KeyRelevancePrior) else log_prior
    )
    b, h, tq, _ = q.shape
    tk = k.shape[-2]
    # Pyro's compute_marginals fails on plates of size 1 (KeyError in the ring's broadcast,
    # pyro-ppl/pyro#3102). Rows are independent given the data, so duplicate every size-1 plate
    # dim, run the enumeration on the copies and keep the first copy: the marginals are identical.
    rb, rh, rq = (2 if n == 1 else 1 for n in (b, h, tq))
    qq = q.repeat(rb, rh, rq, 1)  # (B', H', Tq', D)
    kk = k.repeat(rb, rh, 1, 1)  # (B', H', Tk, D)
    lp = None
    if log_pi is not None:  # broadcastable to (B, H, Tq, Tk)
        lp = log_pi.expand(b, h, tq, tk).repeat(rb, rh, rq, 1)  # (B', H', Tq', Tk)
    if tk == 1:
        # an enumerated dim of size 1 trips the same code path: add a dummy key of zero prior mass
        kk = torch.cat([kk, torch.zeros_like(kk)], dim=-2)  # (B', H', 2, D)
        dummy = qq.new_zeros(qq.shape[:-1] + (2,))  # (B', H', Tq', 2)
        dummy[..., 1] = float("-inf")
        lp = dummy if lp is None else torch.cat([lp.to(dummy.dtype), dummy[..., 1:]], dim=-1)
    model = config_enumerate(attention_model, default="parallel")
    elbo = TraceEnum_ELBO(max_plate_nesting=_MAX_PLATE_NESTING)
    marginals = elbo.compute_marginals(model, _empty_guide, qq, kk, lp, scale)
    padded = (qq.shape[0], qq.shape[1], qq.shape[2], kk.shape[2])
    probs = _as_4d(marginals["z"].probs, padded)  # (B', H', Tq', Tk')
    return probs[:b, :h, :tq, :tk]  # (B, H, Tq, Tk)


def exact_evidence(
    q: Tensor,
    k: Tensor,
    log_prior: Tensor | KeyRelevancePrior | None = None,
    scale: float | None = None,
) -> Tensor:
    r"""Log marginal likelihood of :func:`attention_model`, by Pyro's enumeration.

    .. math::

        \log p(q) = \sum_{b,h,i} \log \sum_j \pi_{bhij}\, \exp(q_{bhi}\cdot k_{bhj}/\sqrt d),

    with :math:`\pi` the per-row normalised prior (queries are conditionally independent, so the
    evidence is a sum over rows). With an empty guide and ``z`` enumerated, the ELBO of
    ``TraceEnum_ELBO`` *is* the log evidence; this returns ``-loss`` (``-differentiable_loss``,
    which carries gradients, when an input requires grad).

    Shape:
        q ``(B, H, Tq, D)``, k ``(B, H, Tk, D)``, log_prior broadcastable to ``(B, H, Tq, Tk)``
        → scalar ``()``.
    """
    if isinstance(log_prior, KeyRelevancePrior):
        check_finite("q", check_float_tensor("q", q, ndim=4, layout="(B, H, Tq, D)"))
        check_finite("k", check_float_tensor("k", k, ndim=4, layout="(B, H, Tk, D)"))
        log_prior = log_prior(q, k)  # broadcastable to (B, H, Tq, Tk)
    model = config_enumerate(attention_model, default="parallel")
    elbo = TraceEnum_ELBO(max_plate_nesting=_MAX_PLATE_NESTING)
    inputs = (q, k, log_prior)
    if torch.is_grad_enabled() and any(isinstance(x, Tensor) and x.requires_grad for x in inputs):
        return -elbo.differentiable_loss(model, _empty_guide, q, k, log_prior, scale)
    # nothing to differentiate: Pyro's ``loss`` returns a float
    loss = elbo.loss(model, _empty_guide, q, k, log_prior, scale)
    return torch.tensor(-loss, dtype=q.dtype, device=q.device)


def fit_categorical_guide(
    q: Tensor,
    k: Tensor,
    log_prior: Tensor | KeyRelevancePrior | None = None,
    scale: float | None = None,
    *,
    num_steps: int = 500,
    lr: float = 0.1,
    seed: int = 0,
) -> Tensor:
    r"""Fit :math:`q_\phi(z_{bhi} = j) = \operatorname{softmax}_j(\phi_{bhij})` to
    :func:`attention_model` by SVI and return the fitted probabilities.

    The guide samples ``"z"`` inside the same plates with ``infer={"enumerate": "parallel"}``, so
    ``TraceEnum_ELBO`` computes the ELBO exactly,

    .. math::

        \mathcal L(\phi) = \log p(q) - \operatorname{KL}\big(q_\phi(z)\,\|\,p(z\mid q)\big),

    with no Monte-Carlo noise; Adam drives the KL to zero, i.e. :math:`q_\phi \to p(z\mid q)`.
    Convergence slows for very peaked posteriors (keys of probability :math:`\ll 10^{-2}` have
    small gradients): raise ``num_steps`` there.
    Keys with zero prior mass get zero guide mass (their logits are fixed at ``-inf``), which keeps
    the KL finite. Runs in a scoped param store (nothing leaks into, or is read from, the global
    one) and under a forked torch RNG seeded with ``seed`` (the global RNG state is untouched).

    Shape:
        q ``(B, H, Tq, D)``, k ``(B, H, Tk, D)``, log_prior broadcastable to ``(B, H, Tq, Tk)``
        → ``(B, H, Tq, Tk)`` (detached).
    """
    check_int("num_steps", num_steps, 1)
    check_real("lr", lr, gt=0.0)
    scores, log_pi = _prepare(q, k, log_prior, scale)  # validates; (B, H, Tq, Tk)
    b, h, tq, _ = scores.shape
    support_mask = torch.where(log_pi > float("-inf"), 0.0, float("-inf")).to(scores.dtype)
    init = torch.zeros_like(scores).detach()  # uniform over allowed keys

    def guide(*args: object, **kwargs: object) -> None:
        phi = pyro.param("z_logits", init.clone())  # (B, H, Tq, Tk)
        with (
            pyro.plate("batch", b, dim=-3),
            pyro.plate("heads", h, dim=-2),
            pyro.plate("queries", tq, dim=-1),
        ):
            pyro.sample(
                "z",
                dist.Categorical(logits=phi + support_mask),
                infer={"enumerate": "parallel"},
            )

    # the data do not need gradients: fit only the guide. The normalised log-prior stands in for
    # log_prior (same model), so a KeyRelevancePrior is evaluated once, not at every step.
    qd, kd, lp = q.detach(), k.detach(), log_pi.detach()
    with seeded(check_int("seed", seed)), pyro.get_param_store().scope():
        svi = SVI(
            attention_model,
            guide,
            PyroOptim(torch.optim.Adam, {"lr": lr}),  # = pyro.optim.Adam (built at import time)
            TraceEnum_ELBO(max_plate_nesting=_MAX_PLATE_NESTING),
        )
        for _ in range(num_steps):
            svi.step(qd, kd, lp, scale)
        phi = pyro.param("z_logits").detach()  # (B, H, Tq, Tk)
    return torch.softmax(phi + support_mask, dim=-1)  # (B, H, Tq, Tk)
