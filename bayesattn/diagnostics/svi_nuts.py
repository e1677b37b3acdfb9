r"""NUTS as ground truth for SVI on :func:`~bayesattn.models.regression.attention_regression_model`.

:func:`nuts_attention_regression` samples the reference posterior (R-hat, bulk ESS from ArviZ);
:func:`fit_svi_attention_regression` fits an autoguide; :func:`compare_svi_nuts` compares their
posterior means and standard deviations per parameter (and optionally the guide's PSIS
:math:`\hat k`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import pyro
import torch
from pyro import poutine
from torch import Tensor

from .._validation import check_int, seeded
from ..models.regression import (
    AttentionRegressionData,
    attention_regression_model,
    drop_plate_dim,
    simulate_attention_regression,
)
from .arviz_io import arviz_is_v1, to_arviz
from .psis import PSISResult, psis_diagnostic

__all__ = [
    "NUTSResult",
    "nuts_attention_regression",
    "fit_svi_attention_regression",
    "SVINUTSComparison",
    "compare_svi_nuts",
]


def _flat_names(name: str, shape: tuple[int, ...]) -> list[str]:
    if not shape:
        return [name]
    return [f"{name}[{','.join(map(str, i))}]" for i in np.ndindex(*shape)]


def _posterior_dataset(obj: Any) -> Any:
    """The posterior group as an ``xarray.Dataset`` (InferenceData or DataTree)."""
    import xarray as xr

    ds = obj["posterior"]
    return ds if isinstance(ds, xr.Dataset) else ds.to_dataset()


def _flat_stat(ds: Any, names: Sequence[str]) -> np.ndarray:
    return np.concatenate([np.asarray(ds[n].values, dtype=float).reshape(-1) for n in names])


@dataclass
class NUTSResult:
    """NUTS draws of :func:`attention_regression_model` and their convergence diagnostics.

    ``samples[name]`` ``(C, D, *site_shape)``; ``inference_data`` the ArviZ object
    (:func:`to_arviz`); ``rhat``/``ess_bulk`` per scalar parameter (``param_names`` order);
    ``divergences`` total over chains.
    """

    samples: dict[str, Tensor]
    inference_data: Any
    param_names: list[str]
    rhat: np.ndarray
    ess_bulk: np.ndarray
    divergences: int

    @property
    def max_rhat(self) -> float:
        return float(np.max(self.rhat))

    @property
    def min_ess_bulk(self) -> float:
        return float(np.min(self.ess_bulk))


def nuts_attention_regression(
    data: AttentionRegressionData,
    *,
    num_samples: int = 300,
    warmup_steps: int = 300,
    num_chains: int = 2,
    seed: int = 0,
    jit_compile: bool = False,
) -> NUTSResult:
    r"""NUTS on :func:`attention_regression_model`: the reference posterior.

    Chains run **sequentially** in this process with seeds ``seed + c`` (``num_chains > 1`` in
    ``pyro.infer.MCMC`` would fork worker processes, which is slow to start on CPU and fragile
    under test runners); their draws are stacked as ``(chain, draw)`` and exported with
    :func:`to_arviz`; R-hat (rank-normalised split) and bulk ESS come from ArviZ.

    Shape:
        ``samples["M"]`` ``(C, D, d, d)``, ``samples["log_pi"]`` ``(C, D, T-1)``.
    """
    from pyro.infer import MCMC, NUTS

    for name, v in (("num_samples", num_samples), ("num_chains", num_chains)):
        check_int(name, v, 1)
    check_int("warmup_steps", warmup_steps, 0)
    chains: list[dict[str, Tensor]] = []
    divergences = 0
    for c in range(num_chains):
        with seeded(seed + c):
            kernel = NUTS(
                attention_regression_model, jit_compile=jit_compile, ignore_jit_warnings=True
            )
            mcmc = MCMC(
                kernel,
                num_samples=num_samples,
                warmup_steps=warmup_steps,
                num_chains=1,
                disable_progbar=True,
            )
            mcmc.run(*data.args, **data.kwargs)
            chains.append({k: v.detach() for k, v in mcmc.get_samples().items()})
            div = mcmc.diagnostics().get("divergences", {})
            divergences += sum(len(v) for v in div.values())
    samples = {k: torch.stack([ch[k] for ch in chains]) for k in chains[0]}  # (C, D, ...)
    idata = to_arviz(samples)
    rhat, ess, names = _rhat_ess(idata, samples)
    return NUTSResult(samples, idata, names, rhat, ess, divergences)


def _rhat_ess(idata: Any, samples: Mapping[str, Tensor]) -> tuple[np.ndarray, np.ndarray, list]:
    """Rank-normalised split R-hat and bulk ESS per scalar parameter, from ArviZ (0.x or 1.x)."""
    if arviz_is_v1():
        from arviz_stats import ess, rhat
    else:
        from arviz import ess, rhat

    ds = _posterior_dataset(idata)
    order = list(samples)
    r = _flat_stat(rhat(ds), order)
    e = _flat_stat(ess(ds, method="bulk"), order)
    names = [n for k in order for n in _flat_names(k, tuple(samples[k].shape[2:]))]
    return r, e, names


def fit_svi_attention_regression(
    data: AttentionRegressionData,
    *,
    guide: Literal["mvn", "normal"] = "mvn",
    num_steps: int = 1500,
    lr: float = 0.03,
    num_particles: int = 8,
    seed: int = 0,
) -> Any:
    r"""Fit an autoguide to :func:`attention_regression_model` by SVI.

    ``guide="mvn"`` (``AutoMultivariateNormal``, full covariance) or ``"normal"`` (``AutoNormal``,
    mean field). ``Trace_ELBO`` with ``num_particles`` vectorised particles and ``ClippedAdam``
    whose learning rate decays tenfold over the run (the last iterates average out gradient noise).
    Runs in a scoped param store (the fitted parameters live in the returned guide's closure, not
    in the global store) and a forked, seeded RNG.
    """
    from pyro.infer import SVI, Trace_ELBO
    from pyro.infer.autoguide import AutoMultivariateNormal, AutoNormal

    if guide not in ("mvn", "normal"):
        raise ValueError(f"guide must be 'mvn' or 'normal'; got {guide!r}")
    check_int("num_steps", num_steps, 1)
    check_int("num_particles", num_particles, 1)
    cls = AutoMultivariateNormal if guide == "mvn" else AutoNormal
    # scoped store: nothing leaks into the global one; the trained values live in the guide
    # module itself (PyroModule parameters), so the guide works outside the scope
    with seeded(seed), pyro.get_param_store().scope():
        g = cls(attention_regression_model, init_scale=0.1)
        elbo = Trace_ELBO(
            num_particles=num_particles, vectorize_particles=True, max_plate_nesting=1
        )
        optim = pyro.optim.ClippedAdam({"lr": lr, "lrd": 0.1 ** (1.0 / num_steps)})
        svi = SVI(attention_regression_model, g, optim, elbo)
        for _ in range(num_steps):
            svi.step(*data.args, **data.kwargs)
    return g


def _guide_draws(guide: Any, data: AttentionRegressionData, num: int) -> dict[str, Tensor]:
    """``num`` joint draws of the guide's sites, ``(num, *site_shape)``."""
    # an empty scoped store: the guide uses its own (module) parameters, never a same-named
    # parameter of someone else's in the global store
    with (
        torch.no_grad(),
        pyro.get_param_store().scope(),
        pyro.plate("_bayesattn_draws", num, dim=-2),
    ):
        tr = poutine.trace(guide).get_trace(*data.args, **data.kwargs)
    return {
        name: drop_plate_dim(tr.nodes[name]["value"], len(shape))
        for name, shape in (
            ("M", data.true_params["M"].shape),
            ("log_pi", data.true_params["log_pi"].shape),
        )
    }


@dataclass
class SVINUTSComparison:
    r"""Posterior means and standard deviations of an SVI guide against NUTS, per scalar
    parameter (``param_names``), with NUTS' R-hat, bulk ESS and Monte-Carlo error of the mean
    (:math:`\mathrm{sd}/\sqrt{\mathrm{ESS}}`) and the guide's PSIS :math:`\hat k`."""

    param_names: list[str]
    nuts_mean: np.ndarray
    nuts_sd: np.ndarray
    nuts_mcse: np.ndarray
    svi_mean: np.ndarray
    svi_sd: np.ndarray
    rhat: np.ndarray
    ess_bulk: np.ndarray
    num_svi_draws: int
    psis: PSISResult | None
    nuts: NUTSResult = field(repr=False)

    @property
    def mean_error_in_sd(self) -> np.ndarray:
        r""":math:`|\bar\theta_{\text{SVI}} - \bar\theta_{\text{NUTS}}| / \mathrm{sd}_{\text{NUTS}}`."""
        return np.abs(self.svi_mean - self.nuts_mean) / self.nuts_sd

    @property
    def sd_ratio(self) -> np.ndarray:
        r""":math:`\mathrm{sd}_{\text{SVI}} / \mathrm{sd}_{\text{NUTS}}`."""
        return self.svi_sd / self.nuts_sd

    def table(self) -> Any:
        """A ``pandas.DataFrame`` of the comparison (pandas comes with ArviZ)."""
        import pandas as pd

        return pd.DataFrame(
            {
                "nuts_mean": self.nuts_mean,
                "svi_mean": self.svi_mean,
                "nuts_sd": self.nuts_sd,
                "svi_sd": self.svi_sd,
                "mean_error_in_sd": self.mean_error_in_sd,
                "sd_ratio": self.sd_ratio,
                "nuts_mcse": self.nuts_mcse,
                "rhat": self.rhat,
                "ess_bulk": self.ess_bulk,
            },
            index=self.param_names,
        )


def compare_svi_nuts(
    data: AttentionRegressionData | None = None,
    *,
    guide: Literal["mvn", "normal"] = "mvn",
    nuts: NUTSResult | None = None,
    num_samples: int = 300,
    warmup_steps: int = 300,
    num_chains: int = 2,
    svi_steps: int = 1500,
    num_svi_draws: int = 4000,
    psis_samples: int = 0,
    seed: int = 0,
    jit_compile: bool = False,
) -> SVINUTSComparison:
    r"""Check an SVI autoguide against NUTS on :func:`attention_regression_model`.

    Runs :func:`nuts_attention_regression` (or reuses ``nuts``), fits
    :func:`fit_svi_attention_regression` with ``guide``, and compares posterior means and
    standard deviations per parameter. Expect, for a well-identified near-Gaussian posterior,
    :math:`|\Delta\text{mean}| \lesssim 0.25\,\mathrm{sd}` plus Monte-Carlo error for both guides
    and ``sd_ratio`` near 1 for ``"mvn"``; mean field (``"normal"``) minimises
    :math:`\mathrm{KL}(q\|p)`, which for correlated Gaussians matches the *conditional* variances
    :math:`1/\Lambda_{ii}` (:math:`\Lambda` = posterior precision), never larger than the
    marginal ones: its ``sd_ratio`` is :math:`\le 1`, the more so the stronger the correlations.
    ``psis_samples > 0`` also reports the guide's PSIS :math:`\hat k`.
    """
    data = data if data is not None else simulate_attention_regression(seed=seed)
    if nuts is None:
        nuts = nuts_attention_regression(
            data,
            num_samples=num_samples,
            warmup_steps=warmup_steps,
            num_chains=num_chains,
            seed=seed,
            jit_compile=jit_compile,
        )
    check_int("num_svi_draws", num_svi_draws, 1)
    g = fit_svi_attention_regression(data, guide=guide, num_steps=svi_steps, seed=seed)
    with seeded(seed + 1000):
        draws = _guide_draws(g, data, num_svi_draws)
    order = list(nuts.samples)
    nuts_flat = torch.cat(
        [nuts.samples[k].reshape(nuts.samples[k].shape[:2] + (-1,)) for k in order], dim=-1
    ).reshape(-1, len(nuts.param_names))  # (C*D, P)
    svi_flat = torch.cat([draws[k].reshape(num_svi_draws, -1) for k in order], dim=-1)  # (n, P)
    nuts_sd = nuts_flat.std(0).numpy()
    psis = None
    if psis_samples:
        with pyro.get_param_store().scope():
            psis = psis_diagnostic(
                attention_regression_model,
                g,
                *data.args,
                num_samples=psis_samples,
                vectorize=True,
                seed=seed + 2000,
                **data.kwargs,
            )
    return SVINUTSComparison(
        param_names=nuts.param_names,
        nuts_mean=nuts_flat.mean(0).numpy(),
        nuts_sd=nuts_sd,
        nuts_mcse=nuts_sd / np.sqrt(nuts.ess_bulk),
        svi_mean=svi_flat.mean(0).numpy(),
        svi_sd=svi_flat.std(0).numpy(),
        rhat=nuts.rhat,
        ess_bulk=nuts.ess_bulk,
        num_svi_draws=num_svi_draws,
        psis=psis,
        nuts=nuts,
    )
