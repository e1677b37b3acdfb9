r"""Global, distance-aware posteriors: a sparse Gaussian process with a Pyro site outside the
data plate (maths in :mod:`bayesattn.functional.gaussian_process`).

:class:`SparseGP` is a function :math:`f_g:\mathbb R^D\to\mathbb R^P` per group ``g`` with a
stationary covariance, inducing inputs :math:`Z_g` and a whitened Gaussian posterior
:math:`q(v_g) = \mathcal N(m_g, S_g)` over the inducing values, one **global** latent
``"<module path>.inducing_values"`` of shape ``(G, P, M)``. It is the **attention read**
(:class:`~bayesattn.nn.attention.BayesianMultiheadAttention` with ``gp_read=``;
``AttentionConfig(read="sparse_gp")``): per head ``h`` and query row ``i``,
:math:`y_{hi} = \sum_j \operatorname{softmax}_j(\cdot)\,v_{hj} + f_h(q_{hi})` with inducing
*keys* :math:`Z_h` in query space (SGPA-like: the read's spread reverts to the prior away from
the inducing keys). Two GP read-outs of the CLS output were tried and dropped in 0.4, with
their numbers in ``docs/which-attention.md``: a DUE-style sparse-GP read-out (it trained to
chance with a zero initial mean and was badly under-confident otherwise) and an SNGP-style
random-feature GP read-out with a Laplace covariance (less accurate and worse calibrated than
the deterministic network, no better held-out AUROC). For a GP read of a trained network use
:func:`~bayesattn.posthoc.GPRead`.

How the global value is drawn, by attention mode (:mod:`bayesattn.nn.modes`; inside an attention
layer the layer's mode, alone the module's own: drawn in training mode, the mean in eval mode
unless ``num_samples`` is given):

``"mean"``: :math:`E_q f = a^\top m` (deterministic). ``"guide"``/``"model"``: a value set by
:func:`~bayesattn.nn.modes.global_values` (networks draw it once, outside the data plate, in
``model``/``guide``/``predict``), else a ``pyro.sample`` at the site (a layer used alone: the
caller keeps it outside any data plate). ``"elbo"``: a reparameterised draw from :math:`q`, its
closed-form :math:`\mathrm{KL}(q(v)\,\|\,\mathcal N(0, I))` recorded **once per pass** as a global
term of the KL collector (``elbo_loss`` adds it unscaled by ``N/B``). Given :math:`v`, each
output draws the conditional noise :math:`\sqrt{r(x)}\,\varepsilon` (independent per input).

Inducing inputs and the length-scale are initialised from the first training batch (a random
subset of its inputs; the median distance between them), or stay at their random initial values
when the module never sees a training batch.
"""

from __future__ import annotations

import math
from typing import Any

import pyro
import pyro.distributions as dist
import torch
import torch.nn.functional as F
from pyro.nn import PyroModule
from torch import Tensor, nn

from .._validation import check_int, check_real
from ..functional.gaussian_process import (
    CovarianceName,
    get_covariance,
    sparse_gp_marginals,
    whitened_kl,
    whitened_projection,
)
from .modes import AttentionMode, current_global_values, current_kl_collector, default_mode

__all__ = ["SparseGP"]


def _inv_softplus(x: float) -> float:
    return x + math.log(-math.expm1(-x))


def draw_global(latent: Any, mode: str, num_samples: int | None) -> Tensor:
    """One pass's value of a global latent (``latent`` has ``site_name``, ``posterior()``,
    ``prior()`` and ``kl()``): a preset value (:func:`~bayesattn.nn.modes.global_values`) if given; in ``"elbo"``
    mode a reparameterised draw from q, recorded once per pass with its KL in the open
    :class:`~bayesattn.nn.modes.KLCollector` (a second call in the pass reuses it); otherwise a ``pyro.sample`` site
    from q (``"guide"``) or the prior, with ``num_samples`` draws as a leading dim."""
    name = latent.site_name
    preset = current_global_values()
    if preset is not None and name in preset:
        return preset[name]
    shape = torch.Size(() if num_samples is None else (num_samples,))
    if mode == "elbo":
        col = current_kl_collector()
        if col is not None and name in col.global_values:
            return col.global_values[name]
        v = latent.posterior().rsample(shape)
        if col is not None:
            col.add_global(name, latent.kl(), v)
        return v
    d = latent.posterior() if mode == "guide" else latent.prior()
    if num_samples is not None:
        d = d.expand(shape)
    return pyro.sample(name, d)


class SparseGP(PyroModule):
    r"""``G`` independent sparse GPs :math:`\mathbb R^D\to\mathbb R^P` with a global posterior over
    their whitened inducing values (see the module docstring).

    Args:
        groups: ``G`` (the heads of an attention read).
        in_dim: ``D``; out_dim: ``P``; num_inducing: ``M``.
        covariance: ``"rbf"`` or ``"matern52"``.
        lengthscale, outputscale: initial :math:`\ell` and :math:`\sigma^2` (per group).
        learn_lengthscale, learn_outputscale: whether the ELBO trains them (a learned
            :math:`\sigma^2` can shrink the read to nothing when the logits do not need it).
        init_scale: initial :math:`S = s^2 I` (``1``: the prior's, KL 0 at the start).
        init_mean: initial :math:`m \sim \mathcal N(0, s_m^2 I)`; ``0`` (KL 0) suits a read
            added to softmax attention; a GP that is the whole output (no softmax read beside
            it) needs ``s_m > 0``: with :math:`m = 0` its mean is 0 for every input, so no
            gradient reaches the features and nothing trains.
        init_from_data: initialise :math:`Z` and :math:`\ell` from the first training batch.
        jitter: added to :math:`C_{ZZ}`'s diagonal.

    Shape:
        x ``(*, G, N, D)`` → ``(*, G, N, P)``; with ``num_samples=S`` → ``(S, *, G, N, P)``.
    """

    is_bayesian = True  # a latent the posterior predictive must sample
    global_latent = True  # drawn once per pass, outside the data plate

    def __init__(
        self,
        groups: int,
        in_dim: int,
        out_dim: int,
        num_inducing: int = 32,
        covariance: CovarianceName = "rbf",
        lengthscale: float = 1.0,
        outputscale: float = 1.0,
        learn_lengthscale: bool = True,
        learn_outputscale: bool = True,
        init_scale: float = 1.0,
        init_mean: float = 0.0,
        init_from_data: bool = True,
        jitter: float = 1e-5,
    ) -> None:
        for name, v in (("groups", groups), ("in_dim", in_dim), ("out_dim", out_dim)):
            check_int(name, v, 1)
        check_int("num_inducing", num_inducing, 1)
        for name, x in (("lengthscale", lengthscale), ("outputscale", outputscale)):
            check_real(name, x, gt=0.0)
        check_real("init_scale", init_scale, gt=0.0)
        check_real("init_mean", init_mean, ge=0.0)
        check_real("jitter", jitter, ge=0.0)
        get_covariance(covariance)  # validates the name
        super().__init__()
        G, D, P, M = groups, in_dim, out_dim, num_inducing
        self.groups, self.in_dim, self.out_dim, self.num_inducing = G, D, P, M
        self.covariance: CovarianceName = covariance
        self.jitter = float(jitter)
        self.init_from_data = init_from_data
        self.inducing = nn.Parameter(torch.randn(G, M, D))  # (G, M, D)
        raw_ls = torch.full((G,), _inv_softplus(lengthscale))
        raw_os = torch.full((G,), _inv_softplus(outputscale))
        if learn_lengthscale:
            self.raw_lengthscale = nn.Parameter(raw_ls)
        else:
            self.register_buffer("raw_lengthscale", raw_ls)
        if learn_outputscale:
            self.raw_outputscale = nn.Parameter(raw_os)
        else:
            self.register_buffer("raw_outputscale", raw_os)
        self.q_mean = nn.Parameter(init_mean * torch.randn(G, P, M))  # (G, P, M)
        self.q_tril_offdiag = nn.Parameter(torch.zeros(G, M, M))  # strictly lower part used
        self.q_tril_rawdiag = nn.Parameter(torch.full((G, M), _inv_softplus(init_scale)))
        self.register_buffer("initialised", torch.tensor(not init_from_data))

    # ---- parameters ---------------------------------------------------------------------------
    @property
    def lengthscale(self) -> Tensor:
        """:math:`\\ell` per group ``(G,)``."""
        return F.softplus(self.raw_lengthscale)

    @property
    def outputscale(self) -> Tensor:
        """:math:`\\sigma^2` per group ``(G,)``: the prior variance of ``f`` (also far from Z)."""
        return F.softplus(self.raw_outputscale)

    def q_scale_tril(self) -> Tensor:
        """:math:`L_S` ``(G, M, M)``: lower triangular with a positive diagonal."""
        diag = F.softplus(self.q_tril_rawdiag) + 1e-6  # (G, M)
        return torch.tril(self.q_tril_offdiag, -1) + torch.diag_embed(diag)

    @property
    def site_name(self) -> str:
        """The global Pyro site of the whitened inducing values ``(G, P, M)``."""
        with self._pyro_context:  # the network's (shared) context: the full module path
            return self._pyro_get_fullname("inducing_values")

    def posterior(self) -> dist.TorchDistribution:
        """:math:`q(v)` with event shape ``(G, P, M)``."""
        loc = self.q_mean  # (G, P, M)
        tril = self.q_scale_tril().unsqueeze(1).expand(loc.shape + loc.shape[-1:])  # (G,P,M,M)
        return dist.MultivariateNormal(loc, scale_tril=tril).to_event(2)

    def prior(self) -> dist.TorchDistribution:
        """:math:`p(v) = \\mathcal N(0, I)` with event shape ``(G, P, M)``."""
        loc = torch.zeros_like(self.q_mean)
        eye = torch.eye(self.num_inducing, dtype=loc.dtype, device=loc.device)
        return dist.MultivariateNormal(loc, scale_tril=eye.expand(loc.shape + eye.shape[-1:])).to_event(2)

    def kl(self) -> Tensor:
        """:math:`\\mathrm{KL}(q(v)\\,\\|\\,p(v))` in nats (closed form, a scalar)."""
        return whitened_kl(self.q_mean, self.q_scale_tril())

    # ---- initialisation from data -------------------------------------------------------------
    @torch.no_grad()
    def _init_from(self, x: Tensor) -> None:
        """Z ← a random subset of the batch's inputs (per group), ℓ ← their median distance."""
        G, M, D = self.inducing.shape
        pts = x.detach().reshape(-1, G, x.shape[-2], D).transpose(0, 1).reshape(G, -1, D)
        n = pts.shape[1]
        idx = torch.randperm(n, device=x.device)[:M] if n >= M else torch.randint(n, (M,))
        z = pts[:, idx.to(pts.device)]  # (G, M, D)
        z = z + 1e-2 * z.std() * torch.randn_like(z)
        self.inducing.copy_(z.to(self.inducing.dtype))
        d = torch.cdist(z, z)  # (G, M, M)
        off = ~torch.eye(M, dtype=torch.bool, device=d.device)
        med = d[:, off].median(-1).values if M > 1 else d.new_ones(G)  # (G,)
        self.raw_lengthscale.copy_(torch.log(torch.expm1(med.clamp_min(1e-3))))
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.broadcast(self.inducing.data, 0)  # every rank: rank 0's init
            torch.distributed.broadcast(self.raw_lengthscale.data, 0)
        self.initialised.fill_(True)

    # ---- the draw -----------------------------------------------------------------------------
    def _value(self, mode: str, num_samples: int | None) -> Tensor:
        """The inducing values ``(G, P, M)`` or ``(S, G, P, M)`` for this pass."""
        return draw_global(self, mode, num_samples)

    def forward(
        self,
        x: Tensor,
        num_samples: int | None = None,
        leading_samples: int | None = None,
        mode: AttentionMode | None = None,
    ) -> Tensor:
        """``f(x)`` in ``mode`` (the attention layer's; ``None``: the module's own,
        :func:`~bayesattn.nn.modes.default_mode`: drawn in training mode or when ``num_samples``
        is given, the mean :math:`E_q f` in eval mode).

        ``num_samples=S``: ``x`` has no sample dim; draw ``S`` values, output ``(S, *, G, N, P)``.
        ``leading_samples=S``: ``x``'s leading dim is already a sample dim of size ``S``; draw
        ``S`` values (one per sample) unless a value is set from outside."""
        if x.dim() < 3 or x.shape[-3] != self.groups or x.shape[-1] != self.in_dim:
            raise ValueError(
                f"x must be (*, G={self.groups}, N, D={self.in_dim}); got {tuple(x.shape)}"
            )
        if self.training and not bool(self.initialised):
            self._init_from(x)
        if mode is None:
            mode = default_mode(self.training, draws=num_samples is not None)
        a, r = whitened_projection(
            x, self.inducing, self.lengthscale, self.outputscale, self.covariance, self.jitter
        )  # (*, G, N, M), (*, G, N)
        if mode == "mean":
            return a @ self.q_mean.transpose(-1, -2)  # (*, G, N, P)
        n_draw = num_samples if num_samples is not None else leading_samples
        v = self._value(mode, n_draw)  # (G, P, M) | (S, G, P, M)
        if num_samples is not None:
            a, r = a.unsqueeze(0), r.unsqueeze(0)  # (1, *, G, N, M)
        # batch dims of v: fewer than x's are aligned from the left (an (S,) draw per sample
        # with x (S, B, ...)), as many or more broadcast as usual (Pyro plates: (S, 1) with (B,))
        lv, la = v.shape[:-3], a.shape[:-3]
        if len(lv) < len(la):
            v = v.reshape(lv + (1,) * (len(la) - len(lv)) + v.shape[-3:])  # (S, 1.., G, P, M)
        mean = a @ v.transpose(-1, -2)  # (S?, *, G, N, P)
        noise = torch.randn(mean.shape, dtype=mean.dtype, device=mean.device)
        return mean + r.sqrt().unsqueeze(-1) * noise

    def marginals(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Posterior mean ``(*, G, N, P)`` and variance ``(*, G, N)`` of ``f(x)`` under ``q``."""
        a, r = whitened_projection(
            x, self.inducing, self.lengthscale, self.outputscale, self.covariance, self.jitter
        )
        return sparse_gp_marginals(a, r, self.q_mean, self.q_scale_tril())

    def extra_repr(self) -> str:
        return (
            f"groups={self.groups}, in_dim={self.in_dim}, out_dim={self.out_dim}, "
            f"num_inducing={self.num_inducing}, covariance={self.covariance!r}"
        )
