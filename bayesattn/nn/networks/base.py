r"""The network contract's base class, :class:`BayesianNetwork`, and the pieces every built-in
network shares: the token/vector :class:`Embedding`, and the input checks and sample-dim helper of
the networks' passes (:mod:`bayesattn.nn.networks` has the overview).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

import pyro
import pyro.distributions as dist
import torch
from torch import Tensor, nn

from ..._validation import check_int, check_real
from ..contract import REMOVED_PRIVATE_NAMES, REQUIRED, check_sample_argument
from ..modes import (
    attention_mode,
    collect_kl,
    current_mode,
    draws_asked,
    global_values,
)
from .global_sites import GlobalSites, module_flag

__all__ = [
    "BayesianNetwork",
    "Embedding",
    "TrunkMixture",
    "check_tokens",
    "with_samples",
    "validate_common",
]


def check_tokens(name: str, x: Tensor, vocab_size: int) -> None:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor; got {type(x).__name__}")
    if x.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"{name} must hold integer token ids; got dtype {x.dtype}")
    if x.dim() != 2:
        raise ValueError(f"{name} must be 2-D (B, T); got shape {tuple(x.shape)}")
    if x.shape[1] == 0:
        raise ValueError(f"{name} must hold at least one token per sequence; got shape (B, 0)")
    if x.numel() and (int(x.min()) < 0 or int(x.max()) >= vocab_size):
        raise ValueError(
            f"{name} ids must be in [0, {vocab_size}); got min {int(x.min())}, max {int(x.max())}"
        )


def _finite(t: Tensor) -> bool:
    return bool(torch.isfinite(t.detach()).all())


class TrunkMixture(Protocol):
    r"""The optional hook of a network's trunk: a global posterior over the encoder's weights
    whose ``S`` draws enter at layer 0 (:class:`bayesattn.nn.mixture.Rank1Mixture` implements it;
    attach one with :meth:`BayesianNetwork.attach_trunk_mixture`, read it as
    :attr:`BayesianNetwork.trunk_mixture`).

    A network's encoder pass runs inside :meth:`trunk` and hands its logits to
    :meth:`read_logits`; :meth:`kl` is the KL charged once per data set.
    """

    @property
    def num_components(self) -> int:
        """``K``, the mixture's components (draw ``i`` of a stratified pass is component
        ``i % K``)."""
        ...

    def trunk(self, net: nn.Module, num_samples: int) -> AbstractContextManager[int]:
        """Context of one encoder pass of ``net``: the trunk's weights swapped for this pass's
        draws; yields the pass's number of samples ``S`` (it may differ from ``num_samples``)."""
        ...

    def read_logits(self, logits: Tensor, num_samples: int) -> Tensor:
        """The pass's logits ``(S, B, ..., C)`` as the network returns them (``"mean"`` mode:
        the K components' predictive combined)."""
        ...

    def kl(self) -> Tensor:
        r""":math:`\mathrm{KL}(q\|p)` of the trunk's latent (a bound is allowed), in nats."""
        ...


class BayesianNetwork(GlobalSites):
    r"""Base class of every network: the public network contract (:mod:`bayesattn.nn.contract`).

    A subclass **must** implement

    * :meth:`forward_logits` ``(x, y=None, num_samples=1)``: logits ``(*S, B, ..., C)``;
    * :meth:`targets` ``(x, y)``: ``(targets, mask, event_dims)`` the likelihood scores,

    and **may** override :meth:`check_batch` (input validation) and :meth:`likelihood` (the
    observation distribution; categorical by default). Everything else (:meth:`forward`,
    :meth:`model`, :meth:`guide`, :meth:`elbo_loss`, the weight-space pieces) is built from these
    and is what :class:`~bayesattn.training.Trainer`, :func:`~bayesattn.uncertainty.predict`, the
    Lightning module and :mod:`~bayesattn.diagnostics` call. The 0.2 private names
    (``_forward_logits``, ``_targets``, ``_check_batch``, ``_obs_dist``, ``_weights_from``,
    ``_weight_prior_model``), aliases through 0.3, are gone: a subclass defining one of them
    without the public name is a ``TypeError`` at class creation. A subclass whose ``forward_logits`` or ``forward`` declares ``num_particles``
    (the sample count's spelling before 0.4) is a ``TypeError`` at class creation: rename it
    ``num_samples``.
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # a subclass written against the 0.2 private names (``_forward_logits``...) would never
        # be called: refuse it (the aliases were removed in 0.4)
        for old, new in REMOVED_PRIVATE_NAMES.items():
            if old in cls.__dict__ and new not in cls.__dict__:
                raise TypeError(
                    f"{cls.__name__} defines {old!r}, the 0.2 private name of {new!r} (an alias "
                    f"through 0.3, removed in 0.4): rename the method to {new!r}"
                )
        # the sample dim of a pass is ``num_samples``: refuse a ``num_particles`` declaration
        check_sample_argument(cls, cls.__dict__)

    def __init__(self) -> None:
        missing = [
            n for n in REQUIRED if getattr(type(self), n) is getattr(BayesianNetwork, n, None)
        ]
        if missing:
            raise TypeError(
                f"{type(self).__name__} does not implement "
                + ", ".join(f"{n}()" for n in missing)
                + ", required of every BayesianNetwork (see bayesattn.nn.contract)"
            )
        super().__init__()
        #: the optional trunk hook (:meth:`attach_trunk_mixture`); ``None`` without one
        self.trunk_mixture: TrunkMixture | None = None

    # ---- required of subclasses --------------------------------------------------------------
    def forward_logits(self, x: Tensor, y: Tensor | None = None, num_samples: int = 1) -> Tensor:
        r"""Logits of one network pass: ``(B, ..., C)``, or ``(S, B, ..., C)`` with a leading
        sample dim when ``num_samples = S > 1``. **Required.**

        Runs in whatever attention mode and Pyro context the caller set up (``model``, ``guide``,
        ``forward`` and ``predict`` do that); it must not call ``check_batch``. Attention layers
        draw their weights :math:`w\sim p(w)` or :math:`q(w\mid x)` as the mode says; with
        ``S > 1`` the ``S`` draws travel as the leading dim (e.g. expand the input to
        ``(S, B, ...)`` before the first random layer). ``y`` is given for teacher forcing and
        may be ignored.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement forward_logits()")

    def targets(self, x: Tensor, y: Tensor | None) -> tuple[Tensor | None, Tensor | None, int]:
        """What the likelihood scores: ``(targets, mask, event_dims)``. **Required.**

        ``targets`` has the logits' shape without the class dim (``(B,)`` labels for a
        classifier, ``(B, T)`` tokens for a sequence model); when ``y`` is needed but not given
        it is ``None`` (or the method raises); ``mask`` (same shape, ``True`` = scored) or ``None``; ``event_dims`` the
        number of trailing target dims that form one example's event (0 for a classifier, 1 for
        per-token targets), so ``log p(y_b | x_b)`` sums over them.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement targets()")

    # ---- optional, with defaults --------------------------------------------------------------
    def check_batch(self, x: Tensor, y: Tensor | None) -> None:
        """Validate a batch before any pass; raise ``TypeError``/``ValueError`` naming the
        argument and the shapes seen. The default checks that ``x`` is a tensor with a batch dim
        and that ``y`` (if given) is a tensor of the same batch size; subclasses extend."""
        if not isinstance(x, Tensor):
            raise TypeError(f"x must be a torch.Tensor; got {type(x).__name__}")
        if x.dim() < 1:
            raise ValueError(f"x must have a leading batch dim; got shape {tuple(x.shape)}")
        if y is not None:
            if not isinstance(y, Tensor):
                raise TypeError(f"y must be a torch.Tensor; got {type(y).__name__}")
            if y.dim() < 1 or y.shape[0] != x.shape[0]:
                raise ValueError(
                    f"x and y must have the same batch size; got x {tuple(x.shape)}, "
                    f"y {tuple(y.shape)}"
                )

    def likelihood(
        self, logits: Tensor, mask: Tensor | None, event_dims: int
    ) -> dist.TorchDistribution:
        r"""The observation distribution :math:`p(y\mid x, w)` of ``targets``: by default
        ``Categorical(logits)``, masked by ``mask`` and with ``event_dims`` trailing dims moved
        into the event, so ``log_prob(targets)`` is ``(*S, B)``. Raises ``FloatingPointError`` on
        non-finite logits."""
        if not bool(torch.isfinite(logits.detach().sum())) and not _finite(logits):
            raise FloatingPointError(
                f"the network's logits hold NaN/inf values (shape {tuple(logits.shape)}): its "
                "parameters or activations have overflowed"
            )
        d = dist.Categorical(logits=logits)
        if mask is not None:
            d = d.mask(mask)
        return d.to_event(event_dims) if event_dims else d

    # ---- provided ------------------------------------------------------------------------------
    def forward(
        self, x: Tensor, y: Tensor | None = None, num_samples: int | None = None
    ) -> Tensor:
        """Logits (``(S, B, ..., C)`` with ``num_samples=S``); posterior-median Bayesian weights.

        Without an attention mode set the attention is the deterministic posterior mean, unless
        draws are asked for: an explicit ``num_samples=`` or a :func:`bayesattn.num_samples`
        context draws from the guide (``"guide"``), in ``train()`` and ``eval()`` alike."""
        self.check_batch(x, y)
        check_int("num_samples", num_samples, 1, allow_none=True)
        if current_mode() is not None:
            ctx: contextlib.AbstractContextManager = contextlib.nullcontext()
        else:
            asked = num_samples is not None or draws_asked()
            ctx = attention_mode("guide" if asked else "mean")
        values = self.weight_guide.median() if self.weight_guide is not None else None
        with ctx, self.pyro_context, self.weights_from(values):
            return self.forward_logits(x, y, 1 if num_samples is None else num_samples)

    def attach_trunk_mixture(self, hook: TrunkMixture) -> None:
        """Attach ``hook`` as :attr:`trunk_mixture` (a submodule: its parameters are the
        network's, saved under ``trunk_mixture.``). Raises ``TypeError`` unless ``hook`` is an
        ``nn.Module``, ``ValueError`` if one is already attached."""
        if not isinstance(hook, nn.Module):
            raise TypeError(
                f"hook must be an nn.Module implementing TrunkMixture; got {type(hook).__name__}"
            )
        if self.trunk_mixture is not None:
            raise ValueError(
                f"{type(self).__name__} already has a trunk mixture "
                f"({type(self.trunk_mixture).__name__}); detach_trunk_mixture() first"
            )
        self.trunk_mixture = hook

    def detach_trunk_mixture(self) -> TrunkMixture | None:
        """Remove the trunk hook (the network becomes its shared point-estimate trunk) and
        return it (``None`` if there was none)."""
        hook, self.trunk_mixture = self.trunk_mixture, None
        return hook

    @property
    def bayesian_layers(self) -> list[str]:
        """Module paths of attention layers with a family or a Gaussian-process read, and of
        Gaussian-process read-outs (a module inside one already listed is not listed again)."""
        out: list[str] = []
        for n, m in self.named_modules():
            if module_flag(m, "is_bayesian") and not any(n.startswith(o + ".") for o in out):
                out.append(n)
        return out

    def first_random_in(self, layers: Sequence[Any]) -> tuple[int, bool]:
        """``(i, by_attention)``: the index of the first of ``layers`` (a stack's self-attention
        layers, each with ``self_attn``) whose output is random in the current attention mode
        (``len(layers)`` if none is), and whether its attention is what makes it random (then
        it can draw the samples itself from the shared input). 0 while any dropout is active,
        or with Bayesian projection weights or a trunk mixture; ``len(layers)`` in ``"mean"``
        mode. Posterior samples share everything computed before layer ``i``."""
        n = len(layers)
        if (
            self.weight_guide is not None
            or self.trunk_mixture is not None
            or any(isinstance(m, nn.Dropout) and m.training and m.p > 0 for m in self.modules())
        ):
            return 0, False
        if current_mode() == "mean":
            return n, False
        for i, layer in enumerate(layers):
            if layer.self_attn.is_bayesian:
                return i, True
        return n, False

    def _num_data(self, num_data: int | None, batch: int) -> int:
        if num_data is None:
            return batch
        if not isinstance(num_data, int) or num_data < batch:
            raise ValueError(f"num_data must be an int >= batch size {batch}; got {num_data!r}")
        return num_data

    def model(self, x: Tensor, y: Tensor | None = None, num_data: int | None = None) -> Tensor:
        """Generative model: priors over weights and attention, categorical likelihood."""
        self.check_batch(x, y)
        B = x.shape[0]
        N = self._num_data(num_data, B)
        with self.pyro_context:
            self._touch_weight_sites()  # global sites: outside the data plate
            g = self.draw_globals("model", site=True)
            with pyro.plate("data", N, subsample=torch.arange(B, device=x.device)):
                with attention_mode("model"), global_values(g):
                    logits = self.forward_logits(x, y)
                targets, mask, ev = self.targets(x, y)
                pyro.sample("obs", self.likelihood(logits, mask, ev), obs=targets)
        return logits

    def guide(self, x: Tensor, y: Tensor | None = None, num_data: int | None = None) -> None:
        """Amortised attention posteriors (+ autoguide over Bayesian weights)."""
        self.check_batch(x, y)
        B = x.shape[0]
        N = self._num_data(num_data, B)
        with self.pyro_context:
            values = self.weight_guide() if self.weight_guide is not None else None
            g = self.draw_globals("guide", site=True)  # outside the data plate
            if not self.bayesian_layers:
                return  # no latent attention: nothing in the data plate to guide, no network pass
            with pyro.plate("data", N, subsample=torch.arange(B, device=x.device)):
                with attention_mode("guide"), self.weights_from(values), global_values(g):
                    self.forward_logits(x, y)

    def elbo_loss(
        self,
        x: Tensor,
        y: Tensor | None,
        num_data: int | None = None,
        beta: float = 1.0,
        num_particles: int = 1,
    ) -> tuple[Tensor, Tensor]:
        r"""Negative ELBO of a minibatch in one network pass, and the logits ``(*S, B, ..., C)``.

        .. math:: -\frac{N}{B}\sum_b \Big(E_q \log p(y_b\mid x_b, w) - \beta\,
                  \mathrm{KL}(q(w_b\mid x_b)\,\|\,p(w_b))\Big) + \beta\,\mathrm{KL}_{\text{weights}}
                  + \beta\,\mathrm{KL}_{\text{global}}

        ``num_particles = P`` is the number of Monte-Carlo samples of the ELBO estimate
        (averaged), as in Pyro's ``Trace_ELBO(num_particles=P)``. The particles are vectorised:
        the pass is ``forward_logits(x, y, num_samples=P)``, so they travel as its leading sample
        dim ``S = P`` through the whole network. Global
        latents (sparse-GP inducing values) are drawn once per pass and their KL is charged once,
        not scaled by ``N/B``: with ``num_data`` the full data set size on every rank, the DDP
        average of the ranks' losses is the full-data negative ELBO's estimate.
        """
        self.check_batch(x, y)
        check_int("num_particles", num_particles, 1)
        check_real("beta", beta, ge=0.0)
        if self.targets(x[:1], None if y is None else y[:1])[0] is None:
            raise ValueError(f"{type(self).__name__}.elbo_loss needs targets y; got y=None")
        B = x.shape[0]
        N = self._num_data(num_data, B)
        with self.pyro_context:
            values, kl_w = self._weight_kl()
            with collect_kl() as col, self.weights_from(values):
                col.num_data = N
                logits = self.forward_logits(x, y, num_particles)  # (S?, B, ...), S = P
        targets, mask, ev = self.targets(x, y)
        if targets is None:
            raise ValueError(f"{type(self).__name__}.elbo_loss needs targets y; got y=None")
        ll = self.likelihood(logits, mask, ev).log_prob(targets)  # (S?, B)
        kl = col.total()
        per_example = ll - beta * kl  # (S?, B)
        if per_example.dim() > 1:  # a sample dim: particles (and a mixture's K components)
            per_example = per_example.mean(0)
        loss = -(N / B) * per_example.sum() + beta * (kl_w + col.global_total())
        return loss, logits

    @torch.no_grad()
    def posterior_kl(
        self, x: Tensor, y: Tensor | None = None, batch_size: int = 256, num_samples: int = 1
    ) -> tuple[Tensor, float]:
        r"""``KL(q‖p)`` of the trained posterior: the terms :meth:`elbo_loss` charges (at
        ``beta = 1``), in nats.

        Returns ``(local, global_)``: ``local`` ``(B,)`` the per-example KL of the attention
        latents of each input of ``x`` (``y`` for sequence models that read targets), and
        ``global_`` the KL charged once per data set: global latents (sparse-GP inducing values)
        plus Bayesian weights. The ELBO's KL over a data set of ``N`` examples is
        :math:`\sum_n \mathrm{KL}_n + \mathrm{KL}_{\text{global}}`. A network without latents
        gives zeros. Evaluated in eval mode (no dropout) with one draw of the weights and the
        globals; each layer's KL is analytic where its family registers one, but with latents in
        several layers a later layer's KL depends on the earlier layers' draws, so ``local`` is
        then a Monte Carlo estimate averaged over ``num_samples`` draws (exact for latents in
        one layer, such as :meth:`AttentionConfig.last_layer`).
        """
        self.check_batch(x, y)
        check_int("batch_size", batch_size, 1)
        check_int("num_samples", num_samples, 1)
        if x.shape[0] == 0:
            raise ValueError(f"x must hold at least one input; got shape {tuple(x.shape)}")
        was_training = self.training
        self.eval()
        parts: list[Tensor] = []
        try:
            with self.pyro_context:
                values, kl_w = self._weight_kl()
                global_kl = kl_w + sum(float(m.kl()) for m in self.global_latents())
                g = self.draw_globals("guide")  # one draw for every chunk
                for i in range(0, x.shape[0], batch_size):
                    xb = x[i : i + batch_size]
                    yb = None if y is None else y[i : i + batch_size]
                    with collect_kl() as col, self.weights_from(values), global_values(g):
                        self.forward_logits(xb, yb, num_samples)
                    kl, B = col.total(), xb.shape[0]
                    if isinstance(kl, Tensor):
                        parts.append(kl.reshape(-1, B).mean(0))  # (S?, B) -> (B,)
                    else:
                        dt = xb.dtype if xb.is_floating_point() else torch.get_default_dtype()
                        parts.append(torch.zeros(B, device=xb.device, dtype=dt))  # float KLs
        finally:
            self.train(was_training)
        return torch.cat(parts), float(global_kl)


# ---------------------------------------------------------------------------------------------
# embeddings
# ---------------------------------------------------------------------------------------------


#: the standard deviation of a token embedding's coordinates as the encoder first sees them
#: (rows drawn :math:`\mathcal N(0, 1/E)`, then multiplied by :math:`\sqrt E`): the scale of the
#: learned positions
TOKEN_INIT_STD = 1.0


class Embedding(nn.Module):
    r"""Token (or vector) embedding plus learned positions, then dropout.

    Token rows start at :math:`\mathcal N(0, 1/E)` (Vaswani et al. 2017; unit scale after the
    :math:`\sqrt E` multiplier, :data:`TOKEN_INIT_STD`), not at ``nn.Embedding``'s
    :math:`\mathcal N(0, 1)`, which the multiplier turns into vectors :math:`\sqrt E` times
    larger than the positions: a word seen a few times in training then stayed a large random
    vector that the rest of the network had to learn to ignore. On WordNet glosses (1,000 a
    class, validation accuracy of the study's token network) this took the network from .728 to
    .803; smaller rows (0.1 or 0.02 per coordinate) reached .823 there but left a toy task with
    ten frequent tokens unlearned in 30 epochs (the positions then drown the words), so the
    default is the scale of the positions (``benchmarks/wordnet_tokens.py``).

    Shape: ``(B, T)`` int or ``(B, T, D)`` float → ``(B, T, E)``.
    """

    def __init__(
        self,
        d_model: int,
        vocab_size: int | None,
        input_dim: int | None,
        max_len: int,
        dropout: float,
    ) -> None:
        super().__init__()
        if (vocab_size is None) == (input_dim is None):
            raise ValueError("give exactly one of vocab_size (tokens) or input_dim (vectors)")
        if vocab_size is not None:
            check_int("vocab_size", vocab_size, 1)
        if input_dim is not None:
            check_int("input_dim", input_dim, 1)
        check_int("max_len", max_len, 1)
        self.scale = math.sqrt(d_model)
        self.tokens = nn.Embedding(vocab_size, d_model) if vocab_size is not None else None
        if self.tokens is not None:
            nn.init.normal_(self.tokens.weight, std=TOKEN_INIT_STD / self.scale)
        self.proj = nn.Linear(input_dim, d_model) if input_dim is not None else None
        self.pos = nn.Embedding(max_len, d_model)
        self.drop = nn.Dropout(dropout)
        self.max_len = max_len

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        T = x.shape[1]
        if T + offset > self.max_len:
            raise ValueError(f"sequence length {T + offset} exceeds max_len={self.max_len}")
        if self.tokens is not None:
            h = self.tokens(x) * self.scale  # (B, T, E)
        elif self.proj is not None:
            h = self.proj(x)  # (B, T, E)
        else:  # pragma: no cover - __init__ builds exactly one of them
            raise RuntimeError("Embedding has neither tokens nor proj")
        pos = torch.arange(offset, offset + T, device=x.device)
        return self.drop(h + self.pos(pos))


def with_samples(h: Tensor, num_samples: int) -> Tensor:
    """Prepend a sample dim ``(S, B, T, E)`` when ``num_samples = S > 1``."""
    return h.expand((num_samples,) + h.shape) if num_samples > 1 else h


def validate_common(d_model: int, nhead: int, num_layers: int, max_len: int) -> None:
    for name, v in (("d_model", d_model), ("nhead", nhead), ("num_layers", num_layers)):
        check_int(name, v, 1)
    check_int("max_len", max_len, 1)
    if d_model % nhead:
        raise ValueError(
            f"d_model must be divisible by nhead; got d_model={d_model}, nhead={nhead}"
        )

