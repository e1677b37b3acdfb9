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

**Online belief updates.** With a key-relevance vector shared by queries,

.. math::

    \pi \sim \operatorname{Dirichlet}(\alpha), \qquad
    z_i \mid \pi \sim \operatorname{Categorical}(\pi), \qquad
    p(q_i \mid z_i = j) \propto \exp(q_i\cdot k_j/\sqrt d),

the mean-field variational Bayes posterior :math:`q(\pi)\,\prod_i q(z_i)` is
:math:`\operatorname{Dirichlet}(\alpha')` with the closed-form coordinate-ascent updates

.. math::

    r_{ij} \propto \exp\big(\psi(\alpha'_j) - \psi(\textstyle\sum_l \alpha'_l)
    + q_i\cdot k_j/\sqrt d\big), \qquad \alpha' = \alpha + \textstyle\sum_i r_{i\cdot},

so each batch of queries adds exactly its size to the total concentration: "belief update as tokens
arrive" (:class:`OnlineKeyRelevance`). :func:`relevance_model` is the same hierarchical model as a
Pyro program and :func:`fit_relevance_guide` fits a Dirichlet guide to it by SVI with :math:`z`
marginalised, the independent check of the closed form.

**Rows with no allowed key.** If every key of a query has zero prior mass (:math:`\log\pi = -\infty`
everywhere in the row) the categorical model has no valid :math:`z` and its likelihood is undefined;
the functions here raise ``ValueError`` (unlike :func:`bayesattn.functional.posterior_weights`,
which returns a zero row for the network's sake).

Dimension glossary: ``B`` batch, ``H`` heads, ``Tq`` queries, ``Tk`` keys, ``D`` head dim, ``N``
queries of an online batch.
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


# ------------------------------------------------------------------------------------------------
# online belief updates: a Dirichlet prior over key relevance shared by queries
# ------------------------------------------------------------------------------------------------


def _as_alpha(
    num_keys: int | None,
    alpha0: float | Tensor,
    name: str = "alpha0",
    dtype: torch.dtype | None = None,
) -> Tensor:
    if isinstance(alpha0, Tensor):
        if not alpha0.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor; got dtype {alpha0.dtype}")
        if alpha0.dim() != 1 or (num_keys is not None and alpha0.shape[0] != num_keys):
            want = f"({num_keys},)" if num_keys is not None else "(Tk,)"
            raise ValueError(f"{name} must have shape {want}; got {tuple(alpha0.shape)}")
        a = alpha0.detach().clone() if dtype is None else alpha0.detach().to(dtype)
    else:
        if num_keys is None:
            raise ValueError(f"num_keys is required when {name} is a number ({alpha0!r})")
        if isinstance(alpha0, bool) or not isinstance(alpha0, (int, float)):
            raise TypeError(f"{name} must be a number or a (Tk,) tensor; got {alpha0!r}")
        a = torch.full((num_keys,), float(alpha0), dtype=dtype or torch.get_default_dtype())
    if a.shape[0] < 1:
        raise ValueError(f"{name} needs at least one key; got shape {tuple(a.shape)}")
    if not bool(torch.isfinite(a).all()) or bool((a <= 0).any()):
        raise ValueError(f"{name} must be finite and > 0; got {a.tolist()}")
    return a


def _check_online_qk(q: Tensor, k: Tensor, num_keys: int | None) -> tuple[Tensor, Tensor]:
    if isinstance(q, Tensor) and q.dim() == 1:
        q = q.unsqueeze(0)  # (1, D): a single query
    check_finite("q", check_float_tensor("q", q, ndim=2, layout="(N, D)"))
    check_finite("k", check_float_tensor("k", k, ndim=2, layout="(Tk, D)"))
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"q (N, D) and k (Tk, D) must share D; got q {tuple(q.shape)}, k {tuple(k.shape)}"
        )
    if num_keys is not None and k.shape[0] != num_keys:
        raise ValueError(f"k must have shape ({num_keys}, D); got {tuple(k.shape)}")
    return q, k


class OnlineKeyRelevance:
    r"""Closed-form online belief over key relevance :math:`\pi \sim \operatorname{Dir}(\alpha)`.

    The generative story, for fixed keys :math:`k_1..k_{T_k}` and arriving queries :math:`q_i`:

    .. math::

        \pi \sim \operatorname{Dirichlet}(\alpha), \qquad
        z_i \mid \pi \sim \operatorname{Categorical}(\pi), \qquad
        p(q_i \mid z_i = j) \propto \exp(q_i\cdot k_j/\sqrt d).

    :meth:`update` performs the mean-field variational Bayes update for a batch of queries, with
    :math:`\alpha` the belief *before* the batch, iterating to a fixed point

    .. math::

        r_{ij} = \operatorname{softmax}_j\big(\psi(\alpha'_j) - \psi(\textstyle\sum_l\alpha'_l)
        + q_i\cdot k_j/\sqrt d\big), \qquad \alpha' = \alpha + \textstyle\sum_i r_{i\cdot}.

    Since :math:`\sum_j r_{ij} = 1`, every batch adds exactly ``N`` to :math:`\sum_j\alpha_j`.
    Calling :meth:`update` one query at a time is sequential Bayesian filtering
    (:math:`\alpha \leftarrow \alpha + p(z\mid q)` under the current belief).

    Args:
        num_keys: ``Tk``; may be ``None`` if ``alpha0`` is a tensor.
        alpha0: prior concentration, a positive number or a ``(Tk,)`` tensor.
        dtype: dtype of the belief (and of the update's arithmetic); default ``alpha0``'s dtype
            for a tensor, else ``torch.get_default_dtype()``.
        scale: score scale, default :math:`1/\sqrt d`.
        max_iters: coordinate-ascent iterations per update at most.
        tol: stop when :math:`\max_j |\Delta\alpha_j|` falls below it (default: ``1e-12`` in
            float64, ``1e-6`` otherwise, times :math:`1 + \sum\alpha`).

    Shape:
        ``update(q (N, D) or (D,), k (Tk, D))``; ``alpha``, ``mean``: ``(Tk,)``;
        ``responsibilities``: ``(N, Tk)`` of the last batch.

    Example:
        >>> belief = OnlineKeyRelevance(4).update(torch.randn(10, 3), torch.randn(4, 3))
        >>> round(float(belief.alpha.sum()), 4)  # prior mass 4 + one per query
        14.0
    """

    def __init__(
        self,
        num_keys: int | None = None,
        alpha0: float | Tensor = 1.0,
        *,
        dtype: torch.dtype | None = None,
        scale: float | None = None,
        max_iters: int = 500,
        tol: float | None = None,
    ) -> None:
        check_int("num_keys", num_keys, 1, allow_none=True)
        check_int("max_iters", max_iters, 1)
        if dtype is not None and not dtype.is_floating_point:
            raise TypeError(f"dtype must be a floating-point dtype; got {dtype}")
        self._prior = _as_alpha(num_keys, alpha0, dtype=dtype)  # (Tk,)
        self._alpha = self._prior.clone()  # (Tk,)
        self.scale = scale
        self.max_iters = max_iters
        self.tol = tol
        self._resp: Tensor | None = None
        self.num_queries = 0
        #: coordinate-ascent iterations used by the last update, and whether it met ``tol``
        self.last_iters = 0
        self.converged = True

    @property
    def num_keys(self) -> int:
        return int(self._alpha.shape[0])

    @property
    def prior_alpha(self) -> Tensor:
        """The concentration before any update, ``(Tk,)``."""
        return self._prior.clone()

    @property
    def alpha(self) -> Tensor:
        r"""Current Dirichlet concentration :math:`\alpha`, ``(Tk,)``."""
        return self._alpha.clone()

    @property
    def mean(self) -> Tensor:
        r"""Posterior mean key relevance :math:`\alpha/\sum_j\alpha_j`, ``(Tk,)``."""
        return self._alpha / self._alpha.sum()

    @property
    def responsibilities(self) -> Tensor | None:
        r""":math:`r_{ij} = q(z_i = j)` of the last batch, ``(N, Tk)``; ``None`` before updates."""
        return None if self._resp is None else self._resp.clone()

    def reset(self) -> OnlineKeyRelevance:
        """Forget every update: back to the prior."""
        self._alpha = self._prior.clone()
        self._resp = None
        self.num_queries = 0
        return self

    def update(self, q: Tensor, k: Tensor) -> OnlineKeyRelevance:
        """Mean-field VB update of the belief with a batch of queries (see the class docstring).

        Shape:
            q ``(N, D)`` or ``(D,)``, k ``(Tk, D)``.
        """
        q, k = _check_online_qk(q, k, self.num_keys)
        a_prev = self._alpha  # (Tk,)
        s = attention_logits(q.to(a_prev.dtype), k.to(a_prev.dtype), self.scale)  # (N, Tk)
        n = s.shape[0]
        tol = self.tol
        if tol is None:
            tol = 1e-12 if a_prev.dtype == torch.float64 else 1e-6
        tol = tol * (1.0 + float(a_prev.sum()) + n)
        a = a_prev.clone()
        self.converged = False
        self.last_iters = 0
        while self.last_iters < self.max_iters:
            self.last_iters += 1
            # psi(sum alpha) is the same for every j and cancels in the softmax
            r = torch.softmax(torch.digamma(a) + s, dim=-1)  # (N, Tk)
            a_new = a_prev + r.sum(0)  # (Tk,)
            delta = float((a_new - a).abs().max())
            a = a_new
            if delta <= tol:
                self.converged = True
                break
        self._alpha = a
        self._resp = r
        self.num_queries += n
        return self

    def __repr__(self) -> str:
        return (
            f"OnlineKeyRelevance(num_keys={self.num_keys}, num_queries={self.num_queries}, "
            f"alpha={[round(x, 4) for x in self._alpha.tolist()]})"
        )


def relevance_model(
    q: Tensor,
    k: Tensor,
    alpha0: float | Tensor = 1.0,
    scale: float | None = None,
) -> Tensor:
    r"""Pyro model of the shared key-relevance belief (the story of :class:`OnlineKeyRelevance`):

    .. math::

        \pi \sim \operatorname{Dirichlet}(\alpha_0), \qquad
        z_i \mid \pi \sim \operatorname{Categorical}(\pi), \qquad
        \log p(q_i \mid z_i = j) = q_i\cdot k_j/\sqrt d + \text{const}.

    Sites: ``"pi"`` (``(Tk,)``), ``"z"`` (marked ``enumerate="parallel"``, so ``TraceEnum_ELBO``
    marginalises it: :math:`p(q_i\mid\pi) \propto \sum_j \pi_j e^{q_i\cdot k_j/\sqrt d}`),
    ``"lik"``.
    Plate ``"queries"`` at dim -1; use ``max_plate_nesting=1``.

    Shape:
        q ``(N, D)``, k ``(Tk, D)``, alpha0 a number or ``(Tk,)`` → pi ``(Tk,)``.
    """
    q, k = _check_online_qk(q, k, None)
    alpha = _as_alpha(k.shape[0], alpha0).to(dtype=q.dtype, device=q.device)  # (Tk,)
    s = attention_logits(q, k, scale)  # (N, Tk)
    pi = pyro.sample("pi", dist.Dirichlet(alpha))  # (Tk,) or (P, 1, Tk) with particles
    with pyro.plate("queries", s.shape[0], dim=-1):
        z = pyro.sample(
            "z", dist.Categorical(probs=pi), infer={"enumerate": "parallel"}
        )  # (N,) or (Tk, 1) when enumerated
        pyro.factor("lik", Vindex(s)[..., z])  # (..., N)
    return pi


def fit_relevance_guide(
    q: Tensor,
    k: Tensor,
    alpha0: float | Tensor = 1.0,
    scale: float | None = None,
    *,
    num_steps: int = 500,
    lr: float = 0.1,
    num_particles: int = 8,
    average_last: float = 0.5,
    seed: int = 0,
) -> Tensor:
    r"""Fit a Dirichlet guide :math:`q(\pi) = \operatorname{Dirichlet}(\beta)` to
    :func:`relevance_model` by SVI and return :math:`\beta`.

    ``TraceEnum_ELBO`` marginalises ``z`` exactly; :math:`\pi` is reparameterised, with
    ``num_particles`` vectorised particles per step. ``pyro.optim.ClippedAdam`` decays the learning
    rate tenfold over the run, and the returned :math:`\beta` is the average of the iterates over
    the last ``average_last`` fraction of steps (Polyak averaging) to damp Monte-Carlo noise. The
    guide starts at the prior, :math:`\beta = \alpha_0`. Scoped param store and forked, seeded torch
    RNG, as in :func:`fit_categorical_guide`.

    Unlike :class:`OnlineKeyRelevance` (mean field over :math:`(\pi, z)`), this approximates the
    collapsed posterior :math:`p(\pi\mid q)` directly, so the two agree closely but not exactly.

    Shape:
        q ``(N, D)``, k ``(Tk, D)``, alpha0 a number or ``(Tk,)`` → ``(Tk,)`` (detached).
    """
    check_int("num_steps", num_steps, 1)
    check_real("lr", lr, gt=0.0)
    check_int("num_particles", num_particles, 1)
    check_real("average_last", average_last, gt=0.0, le=1.0)
    q, k = _check_online_qk(q, k, None)
    alpha = _as_alpha(k.shape[0], alpha0).to(dtype=q.dtype, device=q.device)  # (Tk,)
    qd, kd = q.detach(), k.detach()

    def guide(*args: object, **kwargs: object) -> None:
        beta = pyro.param("pi_concentration", alpha.clone(), constraint=dist.constraints.positive)
        pyro.sample("pi", dist.Dirichlet(beta))

    start_avg = num_steps - max(1, int(round(average_last * num_steps)))
    total = torch.zeros_like(alpha)
    count = 0
    with seeded(check_int("seed", seed)), pyro.get_param_store().scope():
        elbo = TraceEnum_ELBO(
            max_plate_nesting=1, num_particles=num_particles, vectorize_particles=True
        )
        optim = pyro.optim.ClippedAdam({"lr": lr, "lrd": 0.1 ** (1.0 / num_steps)})
        svi = SVI(relevance_model, guide, optim, elbo)
        for step in range(num_steps):
            svi.step(qd, kd, alpha, scale)
            if step >= start_avg:
                total = total + pyro.param("pi_concentration").detach().log()
                count += 1
    return (total / count).exp()  # geometric mean of the iterates, (Tk,)
