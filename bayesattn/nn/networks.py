r"""Whole Bayesian transformers: classifier, ViT, encoder–decoder, decoder-only LM.

Every network is a ``PyroModule`` with

* ``forward(...)``: deterministic logits (posterior-mean attention) unless a mode is set with
  :func:`~bayesattn.nn.modes.attention_mode`;
* ``model(x, y=None, num_data=None)``: the generative model, for ``pyro.infer.SVI`` and
  ``Predictive``: global weight sites (if any projections are Bayesian) outside the data plate,
  attention weights drawn from their priors and ``pyro.sample("obs", Categorical(logits), obs=y)``
  inside ``pyro.plate("data", num_data, subsample=arange(B))`` so the ELBO of a minibatch is scaled
  to a dataset of ``num_data`` examples;
* ``guide(x, y=None, num_data=None)``: the amortised attention posteriors (same layers, posterior
  mode) plus an autoguide for Bayesian projection weights;
* ``elbo_loss(x, y, num_data, beta, num_particles)``: the same ELBO in **one network pass**
  (analytic KLs collected from the layers; used by the hybrid trainer), estimated with
  ``num_particles`` Monte-Carlo particles (Pyro's word) that travel as the pass's sample dim ``S``.

What a network must implement (``forward_logits``, ``targets``) and what the trainers, ``predict``
and the diagnostics call is the network contract, :mod:`bayesattn.nn.contract`.

Shapes: tokens ``(B, T)`` int64 (``pad_id`` = padding) or vectors ``(B, T, D)``; logits
``(*S, B, C)`` for classifiers, ``(*S, B, T, V)`` for sequence models.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast

import pyro
import pyro.distributions as dist
import torch
from pyro import poutine
from pyro.infer.autoguide import AutoGuide, AutoNormal
from pyro.nn import PyroModule
from torch import Tensor, nn
from torch.distributions import Distribution

from .._patches import patchify
from .._validation import check_int, check_real, check_same_dtype
from ..functional import uncertainty_decomposition
from .attention import linear
from .blocks import AttentionConfig, Decoder, Encoder, EncoderLayer, as_attention_config
from .contract import REMOVED_PRIVATE_NAMES, REQUIRED, check_sample_argument
from .modes import (
    AttentionMode,
    attention_mode,
    check_mode,
    collect_kl,
    current_mode,
    global_values,
)
from .spectral import spectral_normalize

__all__ = [
    "BayesianNetwork",
    "TransformerClassifier",
    "VisionTransformer",
    "Seq2Seq",
    "CausalLM",
    "GenerationResult",
]


def _check_tokens(name: str, x: Tensor, vocab_size: int) -> None:
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


class BayesianNetwork(PyroModule):
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
        self._weight_sites: list[tuple[nn.Module, str, str]] = []
        self.weight_guide: AutoGuide | None = None

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
    def forward(self, x: Tensor, y: Tensor | None = None, num_samples: int = 1) -> Tensor:
        """Logits; deterministic posterior-mean attention (and posterior-median Bayesian weights)
        unless an attention mode is set."""
        self.check_batch(x, y)
        check_int("num_samples", num_samples, 1)
        ctx = attention_mode("mean") if current_mode() is None else contextlib.nullcontext()
        values = self.weight_guide.median() if self.weight_guide is not None else None
        with ctx, self.pyro_context, self.weights_from(values):
            return self.forward_logits(x, y, num_samples)

    @property
    def pyro_context(self) -> contextlib.AbstractContextManager:
        """The network's Pyro module context (re-entrant): inside it, the ``PyroSample`` weight
        sites of submodules are named by module path and drawn once per context. Enter it around
        :meth:`forward_logits` when calling that directly."""
        return self._pyro_context

    def weight_sites(self) -> list[tuple[nn.Module, str, str]]:
        """``(module, attribute, site name)`` of each Bayesian projection weight (empty unless
        :func:`~bayesattn.nn.weights.bayesian_projections` was applied)."""
        return list(self._weight_sites)

    def register_weight_site(self, module: nn.Module, attribute: str, name: str) -> None:
        """Record that ``module.attribute`` is a ``PyroSample`` weight site called ``name`` (a
        global site of :meth:`model`); used by :func:`~bayesattn.nn.weights.bayesian_projections`."""
        self._weight_sites.append((module, attribute, name))

    @property
    def bayesian_layers(self) -> list[str]:
        """Module paths of attention layers with a family or a Gaussian-process read, and of
        Gaussian-process read-outs (a module inside one already listed is not listed again)."""
        out: list[str] = []
        for n, m in self.named_modules():
            if getattr(m, "is_bayesian", False) is True and not any(
                n.startswith(o + ".") for o in out
            ):
                out.append(n)
        return out

    def global_latents(self) -> list[Any]:
        """Modules with a global latent (``global_latent = True``: sparse-GP inducing values):
        drawn once per pass and posterior sample, outside the data plate, shared by every
        example; each has ``site_name``, ``prior()``, ``posterior()`` and ``kl()``."""
        return [m for m in self.modules() if getattr(m, "global_latent", False) is True]

    def draw_globals(
        self, mode: AttentionMode, num_samples: int | None = None, site: bool = False
    ) -> dict[str, Tensor] | None:
        """One draw of every global latent: from ``q`` (``"guide"``/``"elbo"``) or the prior
        (``"model"``); ``(S, *shape)`` with ``num_samples=S``; ``None`` in ``"mean"`` mode or
        without global latents. ``site=True`` draws at Pyro sample sites (call it outside the
        data plate: :meth:`model`, :meth:`guide`)."""
        mods = self.global_latents()
        if not mods or mode == "mean":
            return None
        out: dict[str, Tensor] = {}
        with self.pyro_context:
            for m in mods:
                d = m.prior() if mode == "model" else m.posterior()
                if site:
                    out[m.site_name] = pyro.sample(m.site_name, d)
                else:
                    shape = torch.Size(() if num_samples is None else (num_samples,))
                    out[m.site_name] = d.sample(shape)
        return out

    def _num_data(self, num_data: int | None, batch: int) -> int:
        if num_data is None:
            return batch
        if not isinstance(num_data, int) or num_data < batch:
            raise ValueError(f"num_data must be an int >= batch size {batch}; got {num_data!r}")
        return num_data

    def _touch_weight_sites(self) -> dict[str, Tensor]:
        return {full: getattr(mod, attr) for mod, attr, full in self._weight_sites}

    def weight_prior_model(self, *args: Any, **kwargs: Any) -> dict[str, Tensor]:
        """The global (weight-space) part of the model alone: draws every Bayesian weight from
        its prior and returns ``{site name: value}`` (the model of the weight autoguide; ignores
        its arguments)."""
        with self.pyro_context:
            return self._touch_weight_sites()

    @contextlib.contextmanager
    def weights_from(self, values: dict[str, Tensor] | None) -> Iterator[None]:
        """Context manager: use the given ``{site name: value}`` for the Bayesian weights (e.g.
        ``(S, *shape)`` draws that broadcast over the sample dim), hidden from the current trace;
        ``None`` or ``{}`` changes nothing."""
        if not values:
            yield
            return
        with poutine.block(hide=list(values)), poutine.condition(data=values):
            yield

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

    def _weight_kl(self) -> tuple[dict[str, Tensor] | None, Tensor | float]:
        """Draw Bayesian weights from their guide; ``KL(q‖p)`` (analytic for mean-field normal
        guides, single-draw Monte Carlo otherwise)."""
        if self.weight_guide is None:
            return None, 0.0
        gtr = poutine.trace(self.weight_guide).get_trace()
        values: dict[str, Tensor] = {}
        for n, s in gtr.nodes.items():
            if s["type"] != "sample" or (s["infer"] or {}).get("is_auxiliary"):
                continue
            if s["value"] is None:  # pragma: no cover - Pyro fills the value of every sample site
                raise RuntimeError(f"weight guide site {n!r} has no value")
            values[n] = s["value"]
        ptr = poutine.trace(poutine.condition(self.weight_prior_model, data=values)).get_trace()
        if isinstance(self.weight_guide, AutoNormal):
            # AutoNormal samples an auxiliary unconstrained Normal then a Delta; our weight priors
            # have real support, so the auxiliary Normal is q itself and the KL is closed form.
            kl: Tensor | float = 0.0
            for name in values:
                # Pyro types a site's fn as a callable; at sample sites it is a distribution
                q = cast(Distribution, gtr.nodes[name + "_unconstrained"]["fn"])
                p = cast(Distribution, ptr.nodes[name]["fn"])
                kl = kl + torch.distributions.kl_divergence(q, p).sum()
            return values, kl
        return values, gtr.log_prob_sum() - ptr.log_prob_sum()

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
        one layer, such as :meth:`AttentionConfig.recommended`).
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


class _Embedding(nn.Module):
    """Token (or vector) embedding plus learned positions, then dropout.

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
        self.tokens = nn.Embedding(vocab_size, d_model) if vocab_size is not None else None
        self.proj = nn.Linear(input_dim, d_model) if input_dim is not None else None
        self.pos = nn.Embedding(max_len, d_model)
        self.drop = nn.Dropout(dropout)
        self.scale = math.sqrt(d_model)
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
            raise RuntimeError("_Embedding has neither tokens nor proj")
        pos = torch.arange(offset, offset + T, device=x.device)
        return self.drop(h + self.pos(pos))


def _with_samples(h: Tensor, num_samples: int) -> Tensor:
    """Prepend a sample dim ``(S, B, T, E)`` when ``num_samples = S > 1``."""
    return h.expand((num_samples,) + h.shape) if num_samples > 1 else h


def _validate_common(d_model: int, nhead: int, num_layers: int, max_len: int) -> None:
    for name, v in (("d_model", d_model), ("nhead", nhead), ("num_layers", num_layers)):
        check_int(name, v, 1)
    check_int("max_len", max_len, 1)
    if d_model % nhead:
        raise ValueError(
            f"d_model must be divisible by nhead; got d_model={d_model}, nhead={nhead}"
        )


# ---------------------------------------------------------------------------------------------
# classifiers
# ---------------------------------------------------------------------------------------------


class TransformerClassifier(BayesianNetwork):
    """Sequence → class. Token inputs (``vocab_size``; ``pad_id`` positions are masked) or vector
    inputs (``input_dim``); ``pooling="mean"`` (masked mean) or ``"cls"`` (a learned token).
    ``spectral_norm=c`` bounds the spectral norm of every encoder projection (attention Q/K/V and
    output, feed-forward) by ``c`` (:func:`~bayesattn.nn.spectral.spectral_normalize`): a
    distance-preserving residual trunk for distance-aware reads (SNGP, DDU).

    Shape:
        x ``(B, T)`` or ``(B, T, input_dim)`` → logits ``(*S, B, num_classes)``.
    """

    def __init__(
        self,
        num_classes: int,
        vocab_size: int | None = None,
        input_dim: int | None = None,
        d_model: int = 64,
        nhead: int = 4,
        num_layers: int = 2,
        dim_feedforward: int = 128,
        dropout: float = 0.1,
        attn_dropout: float | None = None,
        max_len: int = 512,
        pooling: Literal["mean", "cls"] = "mean",
        norm_first: bool = True,
        pad_id: int | None = 0,
        attention: AttentionConfig | None = None,
        spectral_norm: float | None = None,
    ) -> None:
        super().__init__()
        _validate_common(d_model, nhead, num_layers, max_len)
        check_int("num_classes", num_classes, 2)
        if vocab_size is not None:
            check_int("vocab_size", vocab_size, 1)
            if pad_id is not None:
                check_int("pad_id", pad_id, 0, vocab_size - 1)
        if pooling not in ("mean", "cls"):
            raise ValueError(f"pooling must be 'mean' or 'cls'; got {pooling!r}")
        self.num_classes = num_classes
        self.vocab_size = vocab_size
        self.input_dim = input_dim
        self.pooling = pooling
        self.pad_id = pad_id if vocab_size is not None else None
        self.embed = _Embedding(d_model, vocab_size, input_dim, max_len + 1, dropout)
        self.cls = nn.Parameter(torch.zeros(d_model)) if pooling == "cls" else None
        self.encoder = Encoder(
            d_model,
            nhead,
            num_layers,
            attention,
            dim_feedforward=dim_feedforward,
            dropout=dropout,
            attn_dropout=attn_dropout,
            norm_first=norm_first,
        )
        # nn.Linear read-out of the pooled features (AttentionConfig.build_readout)
        self.head = as_attention_config(attention).build_readout(d_model, num_classes)
        self.spectral_norm = spectral_norm
        if spectral_norm is not None:
            spectral_normalize(self.encoder, spectral_norm)

    def check_batch(self, x: Tensor, y: Tensor | None) -> None:
        if self.vocab_size is not None:
            _check_tokens("x", x, self.vocab_size)
        else:
            if not isinstance(x, Tensor) or not x.is_floating_point() or x.dim() != 3:
                raise ValueError(
                    f"x must be a float tensor (B, T, {self.input_dim}); got "
                    f"{getattr(x, 'shape', type(x).__name__)}"
                )
            if x.shape[-1] != self.input_dim:
                raise ValueError(
                    f"x last dim must be input_dim={self.input_dim}; got {tuple(x.shape)}"
                )
            if x.shape[1] == 0:
                raise ValueError(f"x must hold at least one position; got shape {tuple(x.shape)}")
            check_same_dtype("x", x, self.embed.pos.weight.dtype, type(self).__name__)
        if y is not None:
            if not isinstance(y, Tensor):
                raise TypeError(f"y must be a torch.Tensor of labels; got {type(y).__name__}")
            if y.is_floating_point() or y.is_complex() or y.dtype == torch.bool:
                raise TypeError(f"y must hold integer labels; got dtype {y.dtype}")
            if y.dim() != 1 or y.shape[0] != x.shape[0]:
                raise ValueError(
                    f"y must be (B,) = ({x.shape[0]},) labels; got shape {tuple(y.shape)}"
                )
            if y.numel() and (int(y.min()) < 0 or int(y.max()) >= self.num_classes):
                raise ValueError(
                    f"labels y must be in [0, {self.num_classes}); got min {int(y.min())}, "
                    f"max {int(y.max())}"
                )

    def padding_mask(self, x: Tensor) -> Tensor | None:
        """``True`` at padding tokens (PyTorch ``key_padding_mask`` convention)."""
        if self.pad_id is None:
            return None
        pad = x == self.pad_id
        return pad if bool(pad.any()) else None  # no padding: no mask, no masking work

    def encode(
        self, x: Tensor, num_samples: int = 1, cls_only: bool = False
    ) -> tuple[Tensor, Tensor | None]:
        """Encoder states ``(*S, B, T', E)`` and the padding mask ``(B, T')``.

        Particles enter just before the first layer that is random in the current mode (see
        :meth:`first_stochastic_layer`): everything before it is computed once and shared by
        all ``S`` samples. With ``cls_only`` (CLS pooling) the last layer computes only the CLS
        row, the one row the head reads (``(*S, B, 1, E)``): exact, since attention rows,
        feed-forward and LayerNorm act on each query token separately.
        """
        h = self.embed(x)  # (B, T, E)
        pad = self.padding_mask(x)
        if self.cls is not None:
            h = torch.cat([self.cls.expand(h.shape[0], 1, -1), h], dim=1)  # (B, 1+T, E)
            if pad is not None:
                pad = torch.cat([pad.new_zeros(pad.shape[0], 1), pad], dim=1)
        layers = self._encoder_layers()
        n = len(layers)
        mix: Any = self._modules.get("trunk_mixture")  # nn.mixture: K packed sub-trunks
        # a mixture's pass has K·P draws (ELBO) or K component means ("mean") from layer 0
        ctx = mix.trunk(self, num_samples) if mix is not None else contextlib.nullcontext()
        with ctx as S:
            num_samples = num_samples if S is None else S
            first, by_attention = self._first_random() if num_samples > 1 else (n, False)
            for i, layer in enumerate(layers):
                rows_only = cls_only and i == n - 1
                # the layer draws the S samples itself when its attention is the first random
                # thing
                draws = rows_only and i == first and by_attention
                if i == first and not draws:
                    h = _with_samples(h, num_samples)  # (S, B, T', E)
                if rows_only:
                    h = layer.forward_rows(h, 1, pad, num_samples if draws else None)
                else:
                    h = layer(h, src_key_padding_mask=pad)
        if first >= n:
            h = _with_samples(h, num_samples)  # nothing random: S identical copies
        norm = self.encoder.norm
        return (norm(h) if norm is not None else h), pad

    def _encoder_layers(self) -> Sequence[EncoderLayer]:
        # the Encoder's nn.ModuleList holds EncoderLayers (typed as holding any Module)
        return cast("Sequence[EncoderLayer]", self.encoder.layers)

    def first_stochastic_layer(self) -> int:
        """Index of the first encoder layer whose output is random in the current attention
        mode (``num_layers`` if none is): 0 while any dropout is active (training mode with
        ``dropout > 0``) or the network has Bayesian projection weights or a trunk mixture
        (:mod:`bayesattn.nn.mixture`), else the first layer
        with a family (none in ``"mean"`` mode). Posterior samples share everything
        computed before it."""
        return self._first_random()[0]

    def _first_random(self) -> tuple[int, bool]:
        """``(first_stochastic_layer, whether that layer's randomness is its attention alone)``."""
        n = len(self.encoder.layers)
        if (
            self.weight_guide is not None
            or "trunk_mixture" in self._modules
            or any(isinstance(m, nn.Dropout) and m.training and m.p > 0 for m in self.modules())
        ):
            return 0, False
        if current_mode() == "mean":
            return n, False
        for i, layer in enumerate(self._encoder_layers()):
            if layer.self_attn.is_bayesian:
                return i, True
        return n, False

    def forward_logits(self, x: Tensor, y: Tensor | None = None, num_samples: int = 1) -> Tensor:
        # the last layer's other rows are only computed when its attention map is being recorded
        recording = self._encoder_layers()[-1].self_attn.record_weights
        h, pad = self.encode(x, num_samples, cls_only=self.cls is not None and not recording)
        if self.cls is not None:
            pooled = h[..., 0, :]
        elif pad is None:
            pooled = h.mean(-2)
        else:
            keep = (~pad).to(h.dtype).unsqueeze(-1)  # (B, T, 1)
            pooled = (h * keep).sum(-2) / keep.sum(-2).clamp_min(1.0)
        head = cast(nn.Linear, self.head)
        # linear() reads x as (*S, B, T, In); pooled has no T, so give it one
        out = linear(pooled.unsqueeze(-2), head.weight, head.bias)  # (*S, B, 1, C)
        mix: Any = self._modules.get("trunk_mixture")  # "mean" mode: the K components' mean
        return out.squeeze(-2) if mix is None else mix.read_logits(out.squeeze(-2), num_samples)

    def targets(self, x: Tensor, y: Tensor | None) -> tuple[Tensor | None, Tensor | None, int]:
        return y, None, 0


class VisionTransformer(TransformerClassifier):
    """ViT for small images: non-overlapping ``patch_size`` patches → linear embedding → a
    :class:`TransformerClassifier` with a CLS token (8×8 digits with 2×2 patches: 16 tokens).

    Shape:
        x ``(B, H, W)`` or ``(B, C, H, W)`` → logits ``(*S, B, num_classes)``.
    """

    def __init__(
        self,
        num_classes: int,
        image_size: int = 8,
        patch_size: int = 2,
        in_channels: int = 1,
        **kwargs: Any,
    ) -> None:
        check_int("image_size", image_size, 1)
        check_int("patch_size", patch_size, 1)
        check_int("in_channels", in_channels, 1)
        if image_size % patch_size:
            raise ValueError(
                f"image_size must be divisible by patch_size; got {image_size}, {patch_size}"
            )
        self.image_size, self.patch_size, self.in_channels = image_size, patch_size, in_channels
        n = (image_size // patch_size) ** 2
        kwargs.setdefault("pooling", "cls")
        kwargs.setdefault("max_len", n)
        super().__init__(num_classes, input_dim=in_channels * patch_size**2, **kwargs)

    def patchify(self, x: Tensor) -> Tensor:
        """``(B, C, H, W)`` → ``(B, N, C·p·p)`` row-major patches."""
        if x.dim() == 3:
            x = x.unsqueeze(1)
        return patchify(x, self.patch_size)

    def check_batch(self, x: Tensor, y: Tensor | None) -> None:
        if not isinstance(x, Tensor):
            raise TypeError(f"images must be a torch.Tensor; got {type(x).__name__}")
        s, c = self.image_size, self.in_channels
        ok = x.dim() == 3 and c == 1 and x.shape[1:] == (s, s)
        ok = ok or (x.dim() == 4 and x.shape[1:] == (c, s, s))
        if not ok:
            raise ValueError(
                f"images must be (B, {s}, {s}) or (B, {c}, {s}, {s}); got {tuple(x.shape)}"
            )
        super().check_batch(self.patchify(x), y)

    def forward_logits(self, x: Tensor, y: Tensor | None = None, num_samples: int = 1) -> Tensor:
        return super().forward_logits(self.patchify(x), y, num_samples)


# ---------------------------------------------------------------------------------------------
# sequence models
# ---------------------------------------------------------------------------------------------


@dataclass
class GenerationResult:
    """Tokens generated by sequential posterior sampling and their per-token uncertainty.

    Shapes: ``tokens (B, L)`` (after BOS; ``pad_id`` after EOS), ``probs (B, L, V)`` predictive
    (posterior-averaged) distribution at each step, ``entropy``/``expected_entropy``/
    ``mutual_information`` ``(B, L)`` with ``MI = H[E p] − E[H p] ≥ 0``, ``mask (B, L)`` valid steps.
    """

    tokens: Tensor
    probs: Tensor
    entropy: Tensor
    expected_entropy: Tensor
    mutual_information: Tensor
    mask: Tensor


class _Generative(BayesianNetwork):
    pad_id: int
    bos_id: int
    eos_id: int

    def _step_logits(self, prefix: Tensor, state: Any, num_samples: int) -> Tensor:
        raise NotImplementedError

    def _start(self, x: Tensor, num_samples: int) -> tuple[Any, int, torch.device]:
        raise NotImplementedError

    def _check_special_ids(self, vocab_size: int, which: str) -> None:
        for name in ("pad_id", "bos_id", "eos_id"):
            v = check_int(name, getattr(self, name), 0)
            if v >= vocab_size:
                raise ValueError(f"{name} = {v} is not an id of the {which} ({vocab_size} ids)")

    @torch.no_grad()
    def generate(
        self,
        x: Tensor,
        max_len: int,
        num_samples: int = 8,
        mode: AttentionMode = "guide",
    ) -> GenerationResult:
        """Autoregressive decoding as sequential posterior sampling.

        At every step the attention weights are drawn afresh (``num_samples`` draws in one
        vectorised pass); the next token is the argmax of the posterior-averaged predictive
        :math:`\\bar p = \\frac1S\\sum_s p(\\cdot\\mid w_s)`, and its entropy :math:`H[\\bar p]`,
        expected entropy :math:`\\frac1S\\sum_s H[p_s]` and mutual information are recorded.
        ``mode="mean"`` decodes deterministically (MI = 0).
        """
        check_int("max_len", max_len, 1)
        check_int("num_samples", num_samples, 1)
        mode = check_mode(mode)
        S = num_samples if mode != "mean" else 1
        with attention_mode(mode), self.pyro_context:
            state, B, device = self._start(x, S)
            prefix = torch.full((B, 1), self.bos_id, dtype=torch.long, device=device)
            done = torch.zeros(B, dtype=torch.bool, device=device)
            out, probs_l, masks = [], [], []
            stats: list[tuple[Tensor, Tensor, Tensor]] = []  # (H, E[H], MI) per step
            for _ in range(max_len):
                logits = self._step_logits(prefix, state, S)[..., -1, :]  # (S?, B, V)
                p = torch.softmax(logits, -1)
                p = p if p.dim() == 3 else p.unsqueeze(0)  # (S, B, V)
                stats.append(uncertainty_decomposition(p))  # as PredictionResult: (B,) each
                pbar = p.mean(0)  # (B, V)
                nxt = pbar.argmax(-1)
                nxt = torch.where(done, torch.full_like(nxt, self.pad_id), nxt)
                masks.append(~done)
                out.append(nxt)
                probs_l.append(pbar)
                done = done | (nxt == self.eos_id)
                prefix = torch.cat([prefix, nxt[:, None]], dim=1)
                if bool(done.all()):
                    break
        H_t, EH_t, MI_t = (torch.stack(t, 1) for t in zip(*stats, strict=True))  # (B, L)
        return GenerationResult(
            tokens=torch.stack(out, 1),
            probs=torch.stack(probs_l, 1),
            entropy=H_t,
            expected_entropy=EH_t,
            mutual_information=MI_t,
            mask=torch.stack(masks, 1),
        )


class Seq2Seq(_Generative):
    """Encoder–decoder transformer (translation, copy, reverse).

    ``model(src, tgt)``: teacher forcing on ``tgt[:, :-1]`` predicting ``tgt[:, 1:]`` (padding
    masked out of the likelihood).

    Shape:
        src ``(B, Ts)``, tgt ``(B, Tt)`` (BOS … EOS PAD…) → logits ``(*S, B, Tt-1, V_tgt)``.
    """

    def __init__(
        self,
        src_vocab_size: int,
        tgt_vocab_size: int,
        d_model: int = 64,
        nhead: int = 4,
        num_encoder_layers: int = 2,
        num_decoder_layers: int = 2,
        dim_feedforward: int = 128,
        dropout: float = 0.1,
        attn_dropout: float | None = None,
        max_len: int = 128,
        norm_first: bool = True,
        pad_id: int = 0,
        bos_id: int = 1,
        eos_id: int = 2,
        attention: AttentionConfig | None = None,
    ) -> None:
        super().__init__()
        _validate_common(d_model, nhead, num_encoder_layers, max_len)
        _validate_common(d_model, nhead, num_decoder_layers, max_len)
        self.src_vocab_size, self.tgt_vocab_size = src_vocab_size, tgt_vocab_size
        self.pad_id, self.bos_id, self.eos_id = pad_id, bos_id, eos_id
        check_int("tgt_vocab_size", tgt_vocab_size, 1)
        self._check_special_ids(tgt_vocab_size, "target vocabulary")
        kw: dict[str, Any] = dict(
            dim_feedforward=dim_feedforward,
            dropout=dropout,
            attn_dropout=attn_dropout,
            norm_first=norm_first,
        )
        self.src_embed = _Embedding(d_model, src_vocab_size, None, max_len, dropout)
        self.tgt_embed = _Embedding(d_model, tgt_vocab_size, None, max_len, dropout)
        self.encoder = Encoder(d_model, nhead, num_encoder_layers, attention, **kw)
        self.decoder = Decoder(d_model, nhead, num_decoder_layers, attention, **kw)
        self.head = nn.Linear(d_model, tgt_vocab_size)

    def check_batch(self, x: Tensor, y: Tensor | None) -> None:
        _check_tokens("src", x, self.src_vocab_size)
        if y is not None:
            _check_tokens("tgt", y, self.tgt_vocab_size)
            if y.shape[0] != x.shape[0]:
                raise ValueError(
                    f"src and tgt must have the same batch size; got {tuple(x.shape)}, "
                    f"{tuple(y.shape)}"
                )
            if y.shape[1] < 2:
                raise ValueError(f"tgt needs >= 2 tokens (BOS … EOS); got shape {tuple(y.shape)}")

    def encode(self, src: Tensor, num_samples: int = 1) -> tuple[Tensor, Tensor | None]:
        is_pad = src == self.pad_id  # (B, Ts)
        pad = is_pad if bool(is_pad.any()) else None
        h = _with_samples(self.src_embed(src), num_samples)
        return self.encoder(h, src_key_padding_mask=pad), pad

    def decode(
        self, tgt_in: Tensor, memory: Tensor, src_pad: Tensor | None, num_samples: int = 1
    ) -> Tensor:
        h = _with_samples(self.tgt_embed(tgt_in), num_samples)
        h = self.decoder(
            h,
            memory,
            tgt_key_padding_mask=None,
            memory_key_padding_mask=src_pad,
        )
        return linear(h, self.head.weight, self.head.bias)  # (*S, B, T, V)

    def forward_logits(self, x: Tensor, y: Tensor | None = None, num_samples: int = 1) -> Tensor:
        if y is None:
            raise ValueError("Seq2Seq needs tgt (teacher forcing) for logits; use generate()")
        mem, pad = self.encode(x, num_samples)
        return self.decode(y[:, :-1], mem, pad, num_samples)

    # y: Any, not Tensor | None (the base's type): tgt is required here, None raises on indexing
    def targets(self, x: Tensor, y: Any) -> tuple[Tensor | None, Tensor | None, int]:
        tgt_out = y[:, 1:]
        return tgt_out, tgt_out != self.pad_id, 1

    def _start(self, x: Tensor, num_samples: int) -> tuple[Any, int, torch.device]:
        _check_tokens("src", x, self.src_vocab_size)
        mem, pad = self.encode(x, num_samples)
        return (mem, pad), x.shape[0], x.device

    def _step_logits(self, prefix: Tensor, state: Any, num_samples: int) -> Tensor:
        mem, pad = state
        return self.decode(prefix, mem, pad, num_samples)


class CausalLM(_Generative):
    """Decoder-only language model: ``model(x)`` predicts ``x[:, 1:]`` from ``x[:, :-1]``.

    ``generate(prompt, max_len)`` continues ``prompt (B, T0)`` (which should start with BOS).

    Shape:
        x ``(B, T)`` → logits ``(*S, B, T-1, V)``.
    """

    def __init__(
        self,
        vocab_size: int,
        d_model: int = 64,
        nhead: int = 4,
        num_layers: int = 2,
        dim_feedforward: int = 128,
        dropout: float = 0.1,
        attn_dropout: float | None = None,
        max_len: int = 128,
        norm_first: bool = True,
        pad_id: int = 0,
        bos_id: int = 1,
        eos_id: int = 2,
        attention: AttentionConfig | None = None,
    ) -> None:
        super().__init__()
        _validate_common(d_model, nhead, num_layers, max_len)
        self.vocab_size = check_int("vocab_size", vocab_size, 1)
        self.pad_id, self.bos_id, self.eos_id = pad_id, bos_id, eos_id
        self._check_special_ids(vocab_size, "vocabulary")
        self.embed = _Embedding(d_model, vocab_size, None, max_len, dropout)
        self.decoder = Decoder(
            d_model,
            nhead,
            num_layers,
            attention,
            cross_attention=False,
            dim_feedforward=dim_feedforward,
            dropout=dropout,
            attn_dropout=attn_dropout,
            norm_first=norm_first,
        )
        self.head = nn.Linear(d_model, vocab_size)

    def check_batch(self, x: Tensor, y: Tensor | None) -> None:
        _check_tokens("x", x, self.vocab_size)
        if x.shape[1] < 2:
            raise ValueError(f"x needs >= 2 tokens to predict the next; got shape {tuple(x.shape)}")

    def _logits_of(self, tokens: Tensor, num_samples: int) -> Tensor:
        h = _with_samples(self.embed(tokens), num_samples)
        h = self.decoder(h, tgt_key_padding_mask=None)
        return linear(h, self.head.weight, self.head.bias)  # (*S, B, T, V)

    def forward_logits(self, x: Tensor, y: Tensor | None = None, num_samples: int = 1) -> Tensor:
        return self._logits_of(x[:, :-1], num_samples)

    def targets(self, x: Tensor, y: Tensor | None) -> tuple[Tensor | None, Tensor | None, int]:
        t = x[:, 1:]
        return t, t != self.pad_id, 1

    def _start(self, x: Tensor, num_samples: int) -> tuple[Any, int, torch.device]:
        _check_tokens("prompt", x, self.vocab_size)
        return x, x.shape[0], x.device

    def _step_logits(self, prefix: Tensor, state: Any, num_samples: int) -> Tensor:
        return self._logits_of(torch.cat([state, prefix[:, 1:]], dim=1), num_samples)
