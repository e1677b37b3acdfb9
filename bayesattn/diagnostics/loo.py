r"""PSIS-LOO model comparison of networks on held-out data, through ArviZ (either generation).

:func:`pointwise_log_likelihood` gives :math:`\log p(y_b\mid x_b, w_s)` over guide draws;
:func:`compare_attention_variants` exports each network with
:func:`~bayesattn.diagnostics.draws.predictive_to_arviz`, runs ``loo`` (``reff = 1``: independent
variational draws) and ranks them with ``compare``. PSIS-LOO on variational draws is an
approximation under :math:`q`; its per-observation :math:`\hat k` flags points where that breaks
down. Its :math:`\hat k` are ArviZ's (``loo`` smooths internally); with arviz 0.x they equal
:func:`~bayesattn.diagnostics.psis.psis_smooth` on :math:`-\log p(y_b\mid x_b, w_s)` (tested).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor

from .arviz_io import arviz_is_v1
from .draws import network_draws, predictive_to_arviz

__all__ = ["pointwise_log_likelihood", "compare_attention_variants"]


def pointwise_log_likelihood(
    network: Any,
    x: Tensor,
    y: Tensor,
    num_samples: int = 100,
    *,
    num_data: int | None = None,
    parallel: bool = True,
    seed: int | None = None,
) -> Tensor:
    r"""Pointwise log-likelihood :math:`\log p(y_b\mid x_b, w_s)` over guide draws
    :math:`w_s\sim q(w\mid x)` (unscaled by ``num_data``; see :func:`network_draws`).

    Shape:
        x ``(B, ...)``, y ``(B, ...)`` → ``(S, B)``.
    """
    if y is None:
        raise ValueError("pointwise_log_likelihood needs the observed y")
    draws = network_draws(
        network, x, y, num_samples, num_data=num_data, var_names=[], parallel=parallel, seed=seed
    )
    assert draws.log_likelihood is not None
    return draws.log_likelihood


def _loo(obj: Any) -> Any:
    """PSIS-LOO with ``reff = 1`` (independent variational draws) in either ArviZ generation."""
    if arviz_is_v1():
        from arviz_stats import loo

        return loo(obj, reff=1.0)
    import arviz as az

    return az.loo(obj, reff=1.0)


def compare_attention_variants(
    variants: Mapping[str, tuple[Any, Tensor, Tensor]],
    num_samples: int = 200,
    *,
    seed: int | None = 0,
    parallel: bool = True,
) -> Any:
    r"""Rank networks (e.g. attention variants) by PSIS-LOO on held-out data: ``az.compare``.

    For each ``name -> (network, x_heldout, y_heldout)`` the pointwise log-likelihood
    :math:`\log p(y_b\mid x_b, w_s)` over ``num_samples`` guide draws is exported with
    :func:`predictive_to_arviz`, ``az.loo`` (``reff = 1``: independent draws) gives
    :math:`\widehat{\mathrm{elpd}}_{\text{loo}} = \sum_b \log \sum_s \tilde w_{sb}\,
    p(y_b\mid x_b, w_s)`, and ``az.compare`` ranks them (best first). The networks should be
    compared on the same held-out set. See the module docstring for what LOO on held-out data
    and variational draws means.

    Returns:
        the ``az.compare`` DataFrame (index = variant names, best first; column ``elpd_loo`` in
        arviz 0.x, ``elpd`` in 1.x).
    """
    if not isinstance(variants, Mapping) or len(variants) < 2:
        raise ValueError("variants must be a mapping with at least two name -> (network, x, y)")
    elpds = {}
    for name, spec in variants.items():
        if not isinstance(spec, tuple | list) or len(spec) != 3:
            raise TypeError(f"variants[{name!r}] must be (network, x, y); got {spec!r}")
        net, x, y = spec
        obj = predictive_to_arviz(net, x, y, num_samples, seed=seed, parallel=parallel)
        elpds[name] = _loo(obj)
    if arviz_is_v1():
        from arviz_stats import compare

        return compare(elpds)
    import arviz as az

    return az.compare(elpds, ic="loo")
