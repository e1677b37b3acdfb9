r"""Priors over projection weights: turn chosen parameters of a network into ``PyroSample`` sites.

Weight-space uncertainty (Bayesian neural networks): for each selected parameter
:math:`W` (e.g. ``*.self_attn.in_proj_weight``, ``*.linear1.weight``) the model gets the prior
:math:`W_{ij}\sim\mathcal N(0, s^2)` with :math:`s = ` ``prior_scale`` (default
:math:`1/\sqrt{\text{fan-in}}`), a *global* site named by module path
(``encoder.layers.0.self_attn.in_proj_weight``) drawn outside the data plate, and the network's
guide gains an autoguide over these sites (``AutoNormal`` mean-field, or
``AutoLowRankMultivariateNormal``), initialised at the current (e.g. pretrained) values. The
amortised attention guide and the autoguide compose in :meth:`BayesianNetwork.guide`.

Sampled weights carry leading sample dims through :func:`~bayesattn.nn.attention.linear`, so
vectorised particles and ``Predictive(parallel=True)`` work.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Sequence
from typing import Literal, get_args

import pyro
import pyro.distributions as dist
from pyro import poutine
from pyro.infer.autoguide import AutoLowRankMultivariateNormal, AutoNormal, init_to_value
from pyro.nn import PyroModule, PyroSample
from pyro.nn.module import to_pyro_module_
from torch import Tensor, nn

from .attention import BayesianMultiheadAttention
from .networks import BayesianNetwork

__all__ = ["bayesian_projections", "DEFAULT_TARGETS"]

DEFAULT_TARGETS = ("*self_attn.in_proj_weight", "*self_attn.out_proj.weight")


#: Autoguide over Bayesian projection weights: ``AutoNormal`` or ``AutoLowRankMultivariateNormal``.
WeightGuide = Literal["normal", "lowrank"]
WEIGHT_GUIDES: tuple[WeightGuide, ...] = get_args(WeightGuide)


def bayesian_projections(
    network: BayesianNetwork,
    targets: Sequence[str] = DEFAULT_TARGETS,
    prior_scale: float | None = None,
    guide: WeightGuide = "normal",
    init_scale: float = 0.01,
    rank: int | None = None,
) -> list[str]:
    """Make the parameters whose full names match ``targets`` (``fnmatch`` patterns over
    ``named_parameters()`` names) Bayesian; returns the Pyro site names.

    Args:
        network: a :class:`~bayesattn.nn.networks.BayesianNetwork`.
        targets: patterns, e.g. ``"*self_attn.in_proj_weight"``, ``"*linear1.weight"``.
        prior_scale: prior std; ``None`` = ``1/sqrt(fan_in)`` per parameter.
        guide: ``"normal"`` (``AutoNormal``) or ``"lowrank"`` (``AutoLowRankMultivariateNormal``).
        init_scale: initial posterior std of the autoguide.
    """
    _check_projection_args(network, guide, prior_scale, init_scale)
    if isinstance(targets, str):
        targets = (targets,)
    names = _target_names(network, targets)
    init = {full: _make_weight_site(network, full, prior_scale) for full in names}
    _check_sites_attached(network, init)
    wg = _weight_guide(network, guide, init, init_scale, rank)
    network.weight_guide = wg
    # Create the guide's parameters now (so optimisers and state_dicts see them), in a private
    # param store: a stale global entry of the same name must not overwrite the fresh values.
    with pyro.get_param_store().scope():
        wg()
    return names


def _check_projection_args(
    network: BayesianNetwork, guide: str, prior_scale: float | None, init_scale: float
) -> None:
    """The arguments of :func:`bayesian_projections`, on a network not yet converted."""
    if not isinstance(network, BayesianNetwork):
        raise TypeError(f"network must be a BayesianNetwork; got {type(network).__name__}")
    if guide not in WEIGHT_GUIDES:
        raise ValueError(f"guide must be 'normal' or 'lowrank'; got {guide!r}")
    if prior_scale is not None and not (prior_scale > 0 and math.isfinite(prior_scale)):
        raise ValueError(f"prior_scale must be positive and finite; got {prior_scale!r}")
    if not init_scale > 0:
        raise ValueError(f"init_scale must be positive; got {init_scale!r}")
    if network.weight_sites():
        raise ValueError("bayesian_projections was already applied to this network")


def _target_names(network: BayesianNetwork, targets: Sequence[str]) -> list[str]:
    """The full names of the parameters matching ``targets`` (never the weight guide's, a
    family's or a prior's own parameters); at least one."""
    names = [
        n
        for n, _ in network.named_parameters()
        if any(fnmatch.fnmatchcase(n, t) for t in targets)
        and not n.startswith("weight_guide.")
        and ".family." not in n
        and ".prior." not in n
    ]
    if not names:
        raise ValueError(f"targets {list(targets)} match no parameter of the network")
    return names


def _make_weight_site(network: BayesianNetwork, full: str, prior_scale: float | None) -> Tensor:
    """Replace the parameter ``full`` (of a linear or attention layer) by a ``PyroSample`` site
    with the prior ``N(0, s²)`` (``s = prior_scale``, default ``1/sqrt(fan_in)``), registered
    as a weight site of the network; returns its current value (the guide's initial location)."""
    path, _, pname = full.rpartition(".")
    module = network.get_submodule(path)
    if not isinstance(module, (nn.Linear, BayesianMultiheadAttention)):
        raise ValueError(
            f"only projection weights of attention layers and linear layers can be made "
            f"Bayesian (they broadcast sampled weights); {full} belongs to a "
            f"{type(module).__name__}"
        )
    if not isinstance(module, PyroModule):
        to_pyro_module_(module, recurse=False)
        module = network.get_submodule(path)  # attribute access links it to the root's context
    value = getattr(module, pname).detach().clone()
    fan_in = value.shape[-1] if value.dim() > 1 else value.shape[0]
    s = prior_scale if prior_scale is not None else 1.0 / math.sqrt(fan_in)
    delattr(module, pname)
    prior = dist.Normal(value.new_zeros(()), value.new_tensor(s))
    setattr(module, pname, PyroSample(prior.expand(value.shape).to_event(value.dim())))
    network.register_weight_site(module, pname, full)
    return value


def _weight_guide(
    network: BayesianNetwork,
    guide: WeightGuide,
    init: dict[str, Tensor],
    init_scale: float,
    rank: int | None,
) -> AutoNormal | AutoLowRankMultivariateNormal:
    """The autoguide over the network's weight prior, initialised at ``init``."""
    if guide == "normal":
        return AutoNormal(
            network.weight_prior_model,
            init_loc_fn=init_to_value(values=init),
            init_scale=init_scale,
        )
    return AutoLowRankMultivariateNormal(
        network.weight_prior_model,
        init_loc_fn=init_to_value(values=init),
        init_scale=init_scale,
        rank=rank,
    )


def _check_sites_attached(network: BayesianNetwork, init: dict) -> None:
    """The weight prior must hold exactly the new sites, named by module path: otherwise a module
    did not join the network's Pyro context (its sites would be named wrongly or drawn apart).
    Conditioned on ``init``, so no random number is drawn."""
    prior = poutine.condition(network.weight_prior_model, data=init)
    with poutine.block(), poutine.trace() as tr:
        prior()
    seen = sorted(n for n, s in tr.trace.nodes.items() if s["type"] == "sample")
    if seen != sorted(init):
        raise RuntimeError(
            f"could not attach the weights to the network's Pyro context: its weight prior "
            f"draws sites {seen}, expected {sorted(init)}"
        )
