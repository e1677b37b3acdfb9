r"""Diagnostics: ArviZ export, PSIS :math:`\hat k` for variational fits, LOO model comparison, and
NUTS as ground truth for a small attention model.

**ArviZ export, both API generations.** :func:`to_arviz` turns posterior draws (torch or numpy)
into an ``arviz.InferenceData`` (arviz 0.x) or an ``xarray.DataTree`` (arviz >= 1.0, via
``arviz_base.from_dict``); :func:`to_arviz_dict` is the version-independent part (the nested
``{group: {var: array}}`` dict with ``dims``/``coords``). Attention-weight variables
(``"<path>.weights"``/``"<path>.latent"``, shape ``(..., B, H, Tq, Tk)``) get the dims
``("example", "head", "query", "key")`` (plus ``"layer"`` when stacked), ``query``/``key``
indexed by position and, with ``tokens``, the words as the coordinates ``query_token``/``key_token``. :func:`predictive_to_arviz`, the one ArviZ export of
predictions, draws from a network's guide through the predictive engine
(:meth:`bayesattn.predictive.Predictive.trace`), replays its model and exports posterior attention
weights, the posterior predictive, the observed labels and the pointwise log-likelihood
:math:`\log p(y_b\mid x_b, w_s)`; or exports any predictor's
:class:`~bayesattn.predictive.PredictionResult`. :func:`alignment_to_arviz` exports the prior and
posterior alignments of :func:`bayesattn.predictive.alignment_posterior` with the source and
target words as coordinates beside the positions.

**What ArviZ diagnostics mean for variational draws.** Draws from a variational guide are
independent, so they are stored as **one chain** of ``S`` draws, ``(chain, draw) = (1, S)``. For
them the MCMC diagnostics are trivially fine and say nothing about the fit:

* bulk/tail ESS :math:`\approx S` (draws are i.i.d. by construction);
* R-hat needs at least two chains (ArviZ returns NaN for one); ``num_chains=C`` splits the
  i.i.d. draws into ``C`` pseudo-chains, and then R-hat :math:`\approx 1` trivially;
* MCSE = sd/√S is a correct Monte-Carlo error *of expectations under q*, not under the posterior;
* ``az.summary`` means/sds/HDIs describe :math:`q`, ``plot_forest``/``plot_posterior`` plot
  :math:`q`; they are useful to *look at* attention uncertainty, not to validate it.

Whether :math:`q` is a good approximation of the posterior is what **PSIS** measures
(:func:`psis_diagnostic`, Yao et al. 2018, "Yes, but did it work?"): with
:math:`\log w_s = \log p(x, \theta_s) - \log q(\theta_s)`, :math:`\theta_s\sim q`, the Pareto shape
:math:`\hat k` of the weights' upper tail reads

* :math:`\hat k < 0.5`: **good**, q is close to the posterior; importance sampling (and the
  variational estimates) are reliable;
* :math:`0.5 \le \hat k \le 0.7`: **ok**, usable, PSIS-corrected estimates converge slowly;
* :math:`\hat k > 0.7`: **unreliable**, q misses posterior mass (typically too narrow or shifted).

PSIS-LOO on variational draws (:func:`compare_attention_variants`) is likewise an approximation
under :math:`q`; its per-observation :math:`\hat k` flags points where that breaks down. On
**held-out** data the ``elpd_loo`` it reports estimates the held-out log predictive density
slightly conservatively (LOO removes each point's influence, which held-out points never had);
the ranking between models is what matters.

**NUTS as ground truth.** :func:`attention_regression_model` is a one-layer attention regression
small enough for NUTS (:func:`nuts_attention_regression`); :func:`compare_svi_nuts` fits an
autoguide to the same model and compares posterior means and standard deviations with NUTS.

ArviZ (and xarray) are imported lazily inside the functions; ``import bayesattn.diagnostics`` does
not import them.

**Modules, one concern each** (every name below is also importable from ``bayesattn.diagnostics``):
:mod:`~bayesattn.diagnostics.arviz_io` (ArviZ export), :mod:`~bayesattn.diagnostics.draws`
(network draws and their export), :mod:`~bayesattn.diagnostics.psis` (PSIS :math:`\hat k`; the tail
fit is Pyro's ``fit_generalized_pareto``, the same in every environment),
:mod:`~bayesattn.diagnostics.loo` (LOO comparison), :mod:`~bayesattn.diagnostics.svi_nuts` (SVI
against NUTS). The attention-regression model itself lives in :mod:`bayesattn.models.regression`.

Dimension glossary: ``S`` draws, ``C`` chains, ``D`` draws per chain, ``B`` examples, ``H`` heads,
``Tq``/``Tk`` queries/keys, ``L`` stacked layers, ``N`` data points, ``d`` feature dim.
"""

from __future__ import annotations

from ..models.regression import (
    AttentionRegressionData,
    attention_regression_model,
    simulate_attention_regression,
)
from .alignment_io import alignment_to_arviz
from .arviz_io import ATTENTION_DIMS as ATTENTION_DIMS  # module constants, kept importable here
from .arviz_io import SAMPLE_DIMS as SAMPLE_DIMS
from .arviz_io import arviz_major_version, to_arviz, to_arviz_dict
from .draws import NetworkDraws, network_draws, predictive_to_arviz
from .loo import compare_attention_variants, pointwise_log_likelihood
from .psis import KHAT_INTERPRETATIONS, PSISResult, interpret_khat, psis_diagnostic, psis_smooth
from .svi_nuts import (
    NUTSResult,
    SVINUTSComparison,
    compare_svi_nuts,
    fit_svi_attention_regression,
    nuts_attention_regression,
)

__all__ = [
    # ArviZ export
    "arviz_major_version",
    "to_arviz_dict",
    "to_arviz",
    "NetworkDraws",
    "network_draws",
    "predictive_to_arviz",
    "alignment_to_arviz",
    # variational diagnostics
    "KHAT_INTERPRETATIONS",
    "interpret_khat",
    "psis_smooth",
    "PSISResult",
    "psis_diagnostic",
    # model comparison
    "pointwise_log_likelihood",
    "compare_attention_variants",
    # NUTS ground truth
    "AttentionRegressionData",
    "simulate_attention_regression",
    "attention_regression_model",
    "NUTSResult",
    "nuts_attention_regression",
    "fit_svi_attention_regression",
    "SVINUTSComparison",
    "compare_svi_nuts",
]
