r"""The trace pass: Pyro's ``Predictive`` for a network's ``model``/``guide`` pair, plus the
pointwise log-likelihood of every draw.

``S`` joint draws from ``network.guide`` with ``network.model`` replayed on them; any latent or
deterministic site can be kept, the observed site gives a predictive draw and

.. math:: \ell_{sb} = \log p(y_b \mid x_b, w_s), \qquad w_s \sim q(w\mid x),

**unscaled** (without the ``num_data / B`` factor of the data plate). Used through
:meth:`bayesattn.predictive.Predictive.trace`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyro
import torch
from pyro import poutine
from torch import Tensor

from .._validation import seeded

__all__ = ["NetworkDraws", "eval_mode", "max_plate_nesting", "per_draw", "sample_trace"]


@contextlib.contextmanager
def eval_mode(module: Any) -> Iterator[None]:
    """Temporarily put a torch module in eval mode (no dropout), restoring every flag after."""
    if not isinstance(module, torch.nn.Module):
        yield
        return
    flags = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        yield
    finally:
        for m, t in flags:
            m.training = t


def max_plate_nesting(*traces: Any) -> int:
    """Deepest vectorised plate dim over the traces; rejects enumerated sites."""
    nest = 0
    for tr in traces:
        for site in tr.nodes.values():
            if site["type"] != "sample":
                continue
            if site["infer"].get("enumerate"):
                raise ValueError(
                    f"site {site['name']!r} is enumerated; marginalise discrete latents first"
                )
            for f in site["cond_indep_stack"]:
                if f.vectorized and f.dim is not None:
                    nest = max(nest, -f.dim)
    return nest


def per_draw(t: Tensor, num: int, dim: int) -> Tensor:
    """Move the draw dim (``dim`` from the right of a batch-shaped tensor) to the front:
    ``(num, -1)`` with every other batch dim flattened (singletons included)."""
    k = -dim
    if t.dim() < k:
        t = t.reshape((1,) * (k - t.dim()) + t.shape)
    t = t.movedim(-k, 0)
    return t.expand((num,) + t.shape[1:]).reshape(num, -1)


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
    every global GP latent (``*inducing_values``, :mod:`bayesattn.nn.gp_read`)."""
    if obs_name not in mtr.nodes:
        raise ValueError(f"the model has no site {obs_name!r}")
    if var_names is None:
        return [
            n
            for n, s in mtr.nodes.items()
            if s["type"] == "sample"
            and n != obs_name
            and (s["infer"].get("_deterministic") or n.split(".")[-1] == "inducing_values")
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
    ll = per_draw(lp, S, dim) if lp is not None else None
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


def sample_trace(
    network: Any,
    x: Tensor,
    y: Tensor | None,
    num_samples: int,
    *,
    num_data: int | None = None,
    var_names: Sequence[str] | None = None,
    obs_name: str = "obs",
    parallel: bool = True,
    seed: int | None = None,
) -> NetworkDraws:
    """``S`` guide draws with the model replayed on them (see the module docstring), under
    ``torch.no_grad`` with the network in eval mode; ``parallel``: one vectorised pass under an
    outer plate left of the model's plates, else a loop; ``seed``: a forked, seeded RNG."""
    for attr in ("model", "guide"):
        if not callable(getattr(network, attr, None)):
            raise TypeError(f"network must have a callable .{attr}; got {type(network).__name__}")
    S = num_samples
    with torch.no_grad(), eval_mode(network), seeded(seed):
        # one unvectorised pass: validates, initialises autoguides, finds the plate nesting
        gtr, mtr = _trace_pass(network, x, y, num_data)
        names = _select_sites(mtr, var_names, obs_name)
        if parallel:
            dim = -(max_plate_nesting(gtr, mtr) + 1)
            sites, pred, ll = _draws_parallel(network, x, y, num_data, S, names, obs_name, dim)
        else:
            sites, pred, ll = _draws_loop(network, x, y, num_data, mtr, S, names, obs_name)
        if pred.shape[0] != S:
            pred = pred.expand((S,) + pred.shape[1:])
    return NetworkDraws(sites=sites, predictive=pred, log_likelihood=ll)
