r"""Online belief updates over key relevance: a Dirichlet prior shared by queries.

With a key-relevance vector shared by queries,

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

The single attention read these extend (categorical ``z``, exact enumeration) is in
:mod:`bayesattn.models.attention_read`.

Dimension glossary: ``Tk`` keys, ``D`` head dim, ``N`` queries of an online batch.
"""

from __future__ import annotations

import pyro
import pyro.distributions as dist
import torch
from pyro.infer import SVI, TraceEnum_ELBO
from pyro.ops.indexing import Vindex
from torch import Tensor

from .._validation import check_finite, check_float_tensor, check_int, check_real, seeded
from ..functional import attention_logits

__all__ = ["OnlineKeyRelevance", "relevance_model", "fit_relevance_guide"]


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
