r"""The global sites of a network, drawn once per pass outside the data plate and shared by
every example: Bayesian projection weights (:func:`~bayesattn.nn.weights.bayesian_projections`,
with their autoguide ``weight_guide``) and global latents (sparse-GP inducing values).
:class:`GlobalSites` is the base of :class:`~bayesattn.nn.networks.BayesianNetwork` that owns
them; the network's ``model``, ``guide``, ``elbo_loss`` and ``posterior_kl`` call it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, cast

import pyro
import torch
from pyro import poutine
from pyro.infer.autoguide import AutoGuide, AutoNormal
from pyro.nn import PyroModule
from torch import Tensor, nn
from torch.distributions import Distribution

from ..modes import AttentionMode

__all__ = ["GlobalSites", "module_flag"]


def module_flag(m: nn.Module, name: str) -> bool:
    """``getattr(m, name, False) is True`` without a ``PyroModule``'s slow lookup of a name it
    does not have (most modules): only a plain instance or class attribute can be ``True``."""
    if name not in m.__dict__ and not hasattr(type(m), name):
        return False
    return getattr(m, name, False) is True


class GlobalSites(PyroModule):
    """The network's global sites (see the module docstring): its weight sites, their guide
    ``weight_guide`` (``None``: point-estimate weights), and its global latents."""

    def __init__(self) -> None:
        super().__init__()
        self._weight_sites: list[tuple[nn.Module, str, str]] = []
        self.weight_guide: AutoGuide | None = None

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

    def global_latents(self) -> list[Any]:
        """Modules with a global latent (``global_latent = True``: sparse-GP inducing values):
        drawn once per pass and posterior sample, outside the data plate, shared by every
        example; each has ``site_name``, ``prior()``, ``posterior()`` and ``kl()``."""
        return [m for m in self.modules() if module_flag(m, "global_latent")]

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
