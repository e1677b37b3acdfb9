r"""Posterior-predictive draws of a network and their export to ArviZ, through the one engine
(:class:`bayesattn.predictive.Predictive`).

:func:`network_draws` is ``Predictive(network, S).trace(x, y)``: Pyro's ``Predictive`` plus the
pointwise log-likelihood :math:`\log p(y_b\mid x_b, w_s)` of every draw;
:func:`predictive_to_arviz` exports either such draws (from a network) or any predictor's
:class:`~bayesattn.predictive.PredictionResult` (``predict``, MC dropout, ensembles).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from ..predictive import NetworkDraws, PredictionResult, Predictive
from .arviz_io import to_arviz

__all__ = ["NetworkDraws", "network_draws", "predictive_to_arviz"]


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
    r"""Draw ``S`` joint samples from ``network.guide`` and replay ``network.model`` on them:
    ``Predictive(network, num_samples).trace(x, y, ...)``
    (:meth:`bayesattn.predictive.Predictive.trace`).

    This is what ``pyro.infer.Predictive(network.model, guide=network.guide, num_samples=S)``
    does, plus the pointwise log-likelihood of every draw,

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
        x ``(B, ...)``, y ``(B, ...)`` → see :class:`~bayesattn.predictive.NetworkDraws`.
    """
    return Predictive(network, num_samples).trace(
        x,
        y,
        num_data=num_data,
        var_names=var_names,
        obs_name=obs_name,
        parallel=parallel,
        seed=seed,
    )


def _mixture_result_to_arviz(
    result: PredictionResult, y: Tensor | None, num_chains: int, tokens: Sequence[str] | None
) -> Any:
    """A mixture's :class:`PredictionResult` (``components`` set) as ArviZ data: the draws
    ``S = m·K`` as ``(chain, draw, component) = (num_chains, m / num_chains, K)``."""
    comp = result.components
    assert comp is not None
    S, K = result.num_samples, int(comp.max()) + 1
    if not torch.equal(comp.cpu(), torch.arange(S) % K):
        raise ValueError("result.components must be stratified: draw i is component i % K")
    m = S // K
    if m % num_chains:
        raise ValueError(
            f"num_chains={num_chains} must divide the {m} draws per component (S={S}, K={K})"
        )
    lead = (num_chains, m // num_chains)

    def split(t: Tensor) -> Tensor:  # (S, ...) -> (chain, draw, K, ...)
        return t.reshape(lead + (K,) + t.shape[1:])

    att = {f"{name}.weights": split(a.samples) for name, a in result.attention.items()}
    dims = {n: ["component", "example", "head", "query", "key"] for n in att}
    posterior: dict[str, Tensor] = {**att, "probs": split(result.probs)}
    dims["probs"] = ["component", "probs_dim_0", "probs_dim_1"]
    pbar = result.probs.reshape((m, K) + result.probs.shape[1:]).mean(1)  # a stratum's mixture
    draws = torch.distributions.Categorical(probs=pbar.double()).sample()  # (m, B)
    kw: dict[str, Any] = {"posterior_predictive": {"obs": draws.reshape(lead + draws.shape[1:])}}
    if y is not None:
        ll = result.log_likelihood(y).reshape((m, K) + y.shape)  # (m, K, B)
        ll = torch.logsumexp(ll, 1) - math.log(K)  # log of the stratum's mixture predictive
        kw["log_likelihood"] = {"obs": ll.reshape(lead + ll.shape[1:])}
        kw["observed_data"] = {"obs": y}
    coords: dict[str, list] = {"component": list(range(K))}
    if tokens is not None and not any(a.shape[-1] == a.shape[-2] == len(tokens)
                                      for a in att.values()):  # fmt: skip
        tokens = None  # as before: labels only where the attention is over these tokens
    return to_arviz(posterior, dims=dims, coords=coords, tokens=tokens, **kw)


def _result_to_arviz(
    result: PredictionResult, y: Tensor | None, num_chains: int, tokens: Sequence[str] | None
) -> Any:
    """A :class:`PredictionResult` as ArviZ data (see :func:`predictive_to_arviz`)."""
    if result.components is not None:
        return _mixture_result_to_arviz(result, y, num_chains, tokens)
    posterior = {f"{name}.weights": a.samples for name, a in result.attention.items()}
    posterior["probs"] = result.probs  # (S, B, ..., C)
    draws = torch.distributions.Categorical(probs=result.probs.double()).sample()  # (S, B, ...)
    kw: dict[str, Any] = {"posterior_predictive": {"obs": draws}}
    if y is not None:
        kw["log_likelihood"] = {"obs": result.log_likelihood(y)}
        kw["observed_data"] = {"obs": y}
    return to_arviz(posterior, sample_dims=("sample",), num_chains=num_chains, tokens=tokens, **kw)


def _no_inputs_error(source: Any) -> Exception:
    """Why ``source`` given without ``x`` cannot be exported: a ``TypeError`` when it is not a
    network, else a ``ValueError`` asking for the inputs."""
    if not isinstance(source, Predictive) and not callable(getattr(source, "model", None)):
        return TypeError(
            "source must be a network (with model and guide), a Predictive or a "
            f"PredictionResult; got {type(source).__name__}"
        )
    return ValueError(
        f"x (the inputs to draw for) is needed with a network; got {type(source).__name__}"
    )


def _draws_to_arviz(
    draws: NetworkDraws,
    y: Tensor | None,
    tokens: Sequence[str] | None,
    stack_layers: bool,
    coords: Mapping[str, Sequence] | None,
    dims: Mapping[str, Sequence[str]] | None,
    num_chains: int,
) -> Any:
    """A network's :class:`NetworkDraws` as ArviZ data (see :func:`predictive_to_arviz`)."""
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


def predictive_to_arviz(
    source: Any,
    x: Tensor | None = None,
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
    r"""The posterior predictive as an ArviZ object, with predictive checks and LOO data.

    ``source`` is either

    * a **network** (anything with ``model``/``guide``; or a
      :class:`~bayesattn.predictive.Predictive` built on one, whose ``num_samples`` is then
      used): ``S`` draws by :func:`network_draws` from inputs ``x`` exported as

      - ``posterior``: the attention weights ``<path>.weights`` (or ``var_names``),
        dims ``(chain, draw, example, head, query, key)``, and the draws of global sparse-GP
        latents ``<path>.inducing_values`` ``(chain, draw, [1,] group, output, inducing)``;
      - ``posterior_predictive``: ``obs`` drawn from :math:`p(y\mid x, w_s)`;
      - ``observed_data``: ``obs = y`` (if given);
      - ``log_likelihood``: ``obs`` :math:`=\log p(y_b\mid x_b, w_s)`, unscaled (if ``y``
        given), ready for ``az.loo``.

      A network with deterministic attention has no attention sites: its ``posterior`` group
      is omitted (``az.loo`` then needs ``reff=1.0``, right for independent draws anyway).

    * a :class:`~bayesattn.predictive.PredictionResult` (from ``Predictive(...)(x)``,
      :func:`~bayesattn.uncertainty.predict`, ``predict_mc_dropout``, ``predict_ensemble``; pass
      no ``x``): the per-sample class probabilities and the kept attention samples
      (``"<layer>.weights"``) to ``posterior`` (``"probs"``), one label drawn from each sample's
      predictive to ``posterior_predictive`` (``"obs"``), and with labels ``y`` the pointwise
      :math:`\log p_s(y_b\mid x_b)` to ``log_likelihood`` and ``y`` to ``observed_data``, so
      ``az.loo``/``az.compare`` rank Bayesian attention, MC dropout and ensembles on the same
      footing. Of the keywords, only ``tokens`` and ``num_chains`` apply. A mixture
      posterior's result (``result.components`` set, :mod:`bayesattn.nn.mixture`) gets a
      ``component`` dim: its ``S = m·K`` stratified draws become ``(chain, draw, component)``
      in ``posterior`` (attention weights ``(…, component, example, head, query, key)``,
      ``probs``); ``posterior_predictive`` and ``log_likelihood`` hold one value per stratum
      (one draw of each component): a label from, and :math:`\log` of, the stratum's mixture
      predictive :math:`\frac1K\sum_k p_{mk}`, so ``az.loo`` sees ``m`` draws.

    Draws are independent: ``(chain, draw) = (num_chains, S / num_chains)``.

    Shape:
        x ``(B, ...)``, y ``(B, ...)`` → see above.
    """
    if isinstance(source, PredictionResult):
        if x is not None:
            raise ValueError(
                "x is for drawing from a network; a PredictionResult already holds its draws "
                f"(got x of shape {tuple(getattr(x, 'shape', ()))}); pass y=... by keyword"
            )
        return _result_to_arviz(source, y, num_chains, tokens)
    if x is None:
        raise _no_inputs_error(source)
    if isinstance(source, Predictive):
        source, num_samples = source.network, source.num_samples
    draws = network_draws(
        source,
        x,
        y,
        num_samples,
        num_data=num_data,
        var_names=var_names,
        parallel=parallel,
        seed=seed,
    )
    return _draws_to_arviz(draws, y, tokens, stack_layers, coords, dims, num_chains)
