r"""Draws from a network's guide with its model replayed on them, and their export to ArviZ.

:func:`network_draws` is ``Predictive`` plus the pointwise log-likelihood
:math:`\log p(y_b\mid x_b, w_s)` of every draw; :func:`predictive_to_arviz` exports posterior
attention weights, the posterior predictive, the observed labels and that log-likelihood;
:func:`prediction_to_arviz` does the same for any predictor's
:class:`~bayesattn.uncertainty.PredictionResult`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyro
import torch
from pyro import poutine
from torch import Tensor

from .._validation import check_int, seeded
from ._util import _eval_mode, _max_plate_nesting, _per_draw
from .arviz_io import to_arviz

__all__ = ["NetworkDraws", "network_draws", "prediction_to_arviz", "predictive_to_arviz"]


@dataclass
class NetworkDraws:
    """Joint draws from a network's guide with its model replayed on them.

    Shapes: ``sites[name]`` ``(S, *site_shape)`` (global weight sites may carry a singleton dim,
    ``(S, 1, Out, In)``, as in ``Predictive``); ``predictive`` ``(S, B, ...)`` draws of ``obs``;
    ``log_likelihood`` ``(S, B)`` unscaled :math:`\\log p(y_b\\mid x_b, w_s)` (``None`` without
    ``y``).
    """

    sites: dict[str, Tensor]
    predictive: Tensor
    log_likelihood: Tensor | None


def _trace_pass(network: Any, x: Tensor, y: Tensor | None, num_data: int | None) -> tuple[Any, Any]:
    """One guide trace and the model replayed on it: ``(guide_trace, model_trace)``."""
    gtr = poutine.trace(network.guide).get_trace(x, y, num_data)
    mtr = poutine.trace(poutine.replay(network.model, trace=gtr)).get_trace(x, y, num_data)
    return gtr, mtr


def _select_sites(mtr: Any, var_names: Sequence[str] | None, obs_name: str) -> list[str]:
    """The sites to keep: ``var_names`` (validated) or every deterministic site but ``obs`` and
    every global GP latent (``*inducing_values``, ``*output_weights``,
    :mod:`bayesattn.nn.gp_read`)."""
    if obs_name not in mtr.nodes:
        raise ValueError(f"the model has no site {obs_name!r}")
    if var_names is None:
        return [
            n
            for n, s in mtr.nodes.items()
            if s["type"] == "sample"
            and n != obs_name
            and (
                s["infer"].get("_deterministic")
                or n.split(".")[-1] in ("inducing_values", "output_weights")
            )
        ]
    names = list(var_names)
    missing = [n for n in names if n not in mtr.nodes or mtr.nodes[n]["type"] != "sample"]
    if missing:
        available = [n for n, s in mtr.nodes.items() if s["type"] == "sample" and n != obs_name]
        raise ValueError(f"unknown sites {missing}; the model's sites are {available}")
    return names


def _obs_terms(tr: Any, obs_name: str, has_y: bool) -> tuple[Tensor, Tensor | None]:
    """A predictive draw of the observed site and its unscaled, masked log-likelihood."""
    site = tr.nodes[obs_name]
    fn = site["fn"]
    pred = fn.sample()
    if not has_y:
        return pred, None
    lp = fn.log_prob(site["value"])  # unscaled: no num_data/B factor
    if site["mask"] is not None:
        lp = torch.where(site["mask"], lp, torch.zeros_like(lp))
    return pred, lp


def _draws_parallel(
    network: Any,
    x: Tensor,
    y: Tensor | None,
    num_data: int | None,
    S: int,
    names: Sequence[str],
    obs_name: str,
    dim: int,
) -> tuple[dict[str, Tensor], Tensor, Tensor | None]:
    """All ``S`` draws in one pass under an outer plate at ``dim`` (left of the model's plates)."""
    with pyro.plate("_bayesattn_draws", S, dim=dim):
        _, mtr = _trace_pass(network, x, y, num_data)
    pred, lp = _obs_terms(mtr, obs_name, y is not None)
    ll = _per_draw(lp, S, dim) if lp is not None else None
    if ll is not None and ll.shape[1] != x.shape[0]:
        raise RuntimeError(f"log-likelihood has shape {tuple(ll.shape)}; expected (S, B)")
    return {n: mtr.nodes[n]["value"] for n in names}, pred, ll


def _draws_loop(
    network: Any,
    x: Tensor,
    y: Tensor | None,
    num_data: int | None,
    first: Any,
    S: int,
    names: Sequence[str],
    obs_name: str,
) -> tuple[dict[str, Tensor], Tensor, Tensor | None]:
    """``S`` draws one pass at a time, the model trace ``first`` being the first of them."""
    traces = [first] + [_trace_pass(network, x, y, num_data)[1] for _ in range(S - 1)]
    terms = [_obs_terms(tr, obs_name, y is not None) for tr in traces]
    pred = torch.stack([p for p, _ in terms])  # (S, B, ...)
    lls = [lp for _, lp in terms if lp is not None]  # all S of them when y is given
    ll = torch.stack(lls) if y is not None else None  # (S, B)
    sites = {n: torch.stack([tr.nodes[n]["value"] for tr in traces]) for n in names}
    return sites, pred, ll


def network_draws(
    network: Any,
    x: Tensor,
    y: Tensor | None = None,
    num_samples: int = 100,
    *,
    num_data: int | None = None,
    var_names: Sequence[str] | None = None,
    obs_name: str = "obs",
    parallel: bool = True,
    seed: int | None = None,
) -> NetworkDraws:
    r"""Draw ``S`` joint samples from ``network.guide`` and replay ``network.model`` on them.

    This is what ``Predictive(network.model, guide=network.guide, num_samples=S)`` does, plus the
    pointwise log-likelihood of every draw,

    .. math:: \ell_{sb} = \log p(y_b \mid x_b, w_s), \qquad w_s \sim q(w\mid x),

    read from the replayed model's ``obs`` site as ``fn.log_prob(y)``: **unscaled**, i.e. without
    the ``num_data / B`` factor that the data plate applies in the ELBO (``trace.log_prob_sum()``
    includes it). ``parallel=True`` draws all ``S`` in one vectorised pass (an outer plate left of
    the model's plates); ``parallel=False`` loops. Runs under ``torch.no_grad`` with the network in
    eval mode (no dropout).

    Args:
        var_names: sites to keep in ``sites``; default every deterministic ``*.weights`` site
            (the attention weights). Any latent or deterministic site name is allowed.
        seed: draw under a forked torch RNG seeded with ``seed``.

    Shape:
        x ``(B, ...)``, y ``(B, ...)`` → see :class:`NetworkDraws`.
    """
    check_int("num_samples", num_samples, 1)
    for attr in ("model", "guide"):
        if not callable(getattr(network, attr, None)):
            raise TypeError(f"network must have a callable .{attr}; got {type(network).__name__}")
    S = num_samples
    with torch.no_grad(), _eval_mode(network), seeded(seed):
        # one unvectorised pass: validates, initialises autoguides, finds the plate nesting
        gtr, mtr = _trace_pass(network, x, y, num_data)
        names = _select_sites(mtr, var_names, obs_name)
        if parallel:
            dim = -(_max_plate_nesting(gtr, mtr) + 1)
            sites, pred, ll = _draws_parallel(network, x, y, num_data, S, names, obs_name, dim)
        else:
            sites, pred, ll = _draws_loop(network, x, y, num_data, mtr, S, names, obs_name)
        if pred.shape[0] != S:
            pred = pred.expand((S,) + pred.shape[1:])
    return NetworkDraws(sites=sites, predictive=pred, log_likelihood=ll)


def prediction_to_arviz(
    result: Any,
    y: Tensor | None = None,
    *,
    num_chains: int = 1,
    tokens: Sequence[str] | None = None,
) -> Any:
    r"""Any predictor's output, from the one posterior-predictive path, as ArviZ data.

    ``result`` is a :class:`~bayesattn.uncertainty.PredictionResult` from
    :func:`~bayesattn.uncertainty.predict`, :func:`~bayesattn.uncertainty.predict_mc_dropout` or
    :func:`~bayesattn.uncertainty.predict_ensemble`: the per-sample class probabilities (a
    function of each posterior draw) and kept attention samples (``"<layer>.weights"``) go to the
    ``posterior`` group as ``"probs"``, one label drawn from each sample's predictive to
    ``posterior_predictive`` (``"obs"``), and with labels ``y`` the pointwise
    :math:`\log p_s(y_b\mid x_b)` to ``log_likelihood`` (``"obs"``) and ``y`` to
    ``observed_data``, so ``az.loo``/``az.compare`` rank Bayesian attention, MC dropout and
    ensembles on the same footing. Draws are independent, ``(chain, draw) = (num_chains, S /
    num_chains)``.
    """
    from ..uncertainty import PredictionResult

    if not isinstance(result, PredictionResult):
        raise TypeError(f"result must be a PredictionResult; got {type(result).__name__}")
    posterior = {f"{name}.weights": a.samples for name, a in result.attention.items()}
    posterior["probs"] = result.probs  # (S, B, ..., C)
    draws = torch.distributions.Categorical(probs=result.probs.double()).sample()  # (S, B, ...)
    kw: dict[str, Any] = {"posterior_predictive": {"obs": draws}}
    if y is not None:
        kw["log_likelihood"] = {"obs": result.log_likelihood(y)}
        kw["observed_data"] = {"obs": y}
    return to_arviz(posterior, sample_dims=("sample",), num_chains=num_chains, tokens=tokens, **kw)


def predictive_to_arviz(
    network: Any,
    x: Tensor,
    y: Tensor | None = None,
    num_samples: int = 100,
    *,
    num_data: int | None = None,
    var_names: Sequence[str] | None = None,
    tokens: Sequence[str] | None = None,
    stack_layers: bool = False,
    parallel: bool = True,
    seed: int | None = None,
    coords: Mapping[str, Sequence] | None = None,
    dims: Mapping[str, Sequence[str]] | None = None,
    num_chains: int = 1,
) -> Any:
    r"""Posterior attention of a network as an ArviZ object, with predictive checks and LOO data.

    Draws ``S`` samples with :func:`network_draws` and exports (as one chain of ``S`` draws, or
    ``num_chains`` pseudo-chains):

    * ``posterior``: the attention weights ``<path>.weights`` (or ``var_names``),
      dims ``(chain, draw, example, head, query, key)``, and the draws of global sparse-GP
      latents ``<path>.inducing_values`` ``(chain, draw, [1,] group, output, inducing)``;
    * ``posterior_predictive``: ``obs`` drawn from :math:`p(y\mid x, w_s)`;
    * ``observed_data``: ``obs = y`` (if given);
    * ``log_likelihood``: ``obs`` :math:`=\log p(y_b\mid x_b, w_s)`, unscaled (if ``y`` given),
      ready for ``az.loo``.

    A network with deterministic attention has no attention sites: its ``posterior`` group is
    omitted (``az.loo`` then needs ``reff=1.0``, which is right for independent draws anyway).

    Shape:
        x ``(B, ...)``, y ``(B, ...)`` → see above.
    """
    draws = network_draws(
        network,
        x,
        y,
        num_samples,
        num_data=num_data,
        var_names=var_names,
        parallel=parallel,
        seed=seed,
    )
    return to_arviz(
        draws.sites or None,
        posterior_predictive={"obs": draws.predictive},
        observed_data={"obs": y} if y is not None else None,
        log_likelihood={"obs": draws.log_likelihood} if y is not None else None,
        sample_dims=("sample",),
        tokens=tokens,
        stack_layers=stack_layers,
        coords=coords,
        dims=dims,
        num_chains=num_chains,
    )
