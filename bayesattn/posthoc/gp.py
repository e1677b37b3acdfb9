r""":class:`GPRead`: a random-feature Gaussian process on the features a trained classifier's
head reads, fitted on a calibration split (the maths in :mod:`bayesattn.posthoc._gp_core`).

Features read: ``logits`` and ``cls``. With :math:`\phi` the random Fourier features of
``cls`` and :math:`\Sigma = (I + \Phi^\top\Phi)^{-1}` their posterior covariance,

* ``predict(features, num_samples=S)``: ``S`` draws
  :math:`\operatorname{softmax}(z/T + \phi^\top L_\Sigma\varepsilon_s)`, one global
  :math:`\varepsilon_s` per draw;
* ``predict(features)`` (``num_samples=None``): the deterministic mean-field predictive
  :math:`\operatorname{softmax}\big(z / (T_{\rm mf}\sqrt{1 + a\,v(x)})\big)`, ``S = 1``;
* ``score``: the GP variance :math:`\phi^\top\Sigma\phi`;
* ``kl()``: :math:`C\cdot\mathrm{KL}(\mathcal N(0, \Sigma)\,\|\,\mathcal N(0, I))`, the
  Gaussian posterior over the ``R × C`` output weights from their prior.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import Tensor, nn

from .._validation import check_int, check_seed
from ..predictive import PredictionResult
from ._gp_core import PosthocGP, check_outputscales, fit_gp_features
from .base import PosthocRead
from .features import Features

__all__ = ["GPRead"]

_FIELDS = ("rff_weight", "rff_phase", "scale_tril", "half_tril")
_NUMBERS = ("temperature", "lengthscale", "outputscale", "mf_temperature", "mf_scale", "column_kl")


class GPRead(PosthocRead):
    """The post-hoc random-feature GP read (module docstring).

    Args:
        model, head, forward, batch_size: see :class:`~bayesattn.posthoc.base.PosthocRead`.
        num_features: ``R`` random features.
        outputscales: candidate prior variances (units of the tempered logits' variance),
            chosen on the second half of the calibration split by the predictive NLL.
        seed: the random features' and the scale choice's seed.
    """

    def __init__(
        self,
        model: nn.Module | None = None,
        *,
        num_features: int = 256,
        outputscales: Sequence[float] = (0.25, 0.5, 1.0, 2.0, 4.0),
        seed: int = 0,
        batch_size: int = 4096,
        **kwargs: Any,
    ) -> None:
        super().__init__(model, batch_size=batch_size, **kwargs)
        self.num_features = check_int("num_features", num_features, 1)
        self.outputscales = check_outputscales(outputscales)
        self.seed = check_seed(seed)
        self.core_: PosthocGP | None = None

    def _fit(self, x: Features, y: Tensor, val: tuple[Any, Tensor] | None) -> None:
        """The GP is fitted on ``(features, y)`` (the calibration split); ``val`` unused."""
        self.core_ = fit_gp_features(x.logits, x.cls, y, self.num_features, self.outputscales,
                                     self.seed, self.batch_size)  # fmt: skip
        self.num_classes = x.logits.shape[1]

    def _core(self) -> PosthocGP:
        self._check_fitted()
        assert self.core_ is not None
        return self.core_

    def predict(
        self, features: Any, num_samples: int | None = None, *, seed: int | None = None
    ) -> PredictionResult:
        """``S`` sampled draws, or (``num_samples=None``) the mean-field predictive ``S = 1``;
        ``seed``: the draws' generator (``None``: the global one)."""
        self._check_fitted()
        f = self.features(features)
        if num_samples is None:
            return self._predict(f, None)
        check_int("num_samples", num_samples, 1)
        probs = self._core().samples_of(f.logits, f.cls, num_samples, seed)
        return PredictionResult(probs, kind="posthoc/gp")

    def _predict(self, x: Features, num_samples: int | None) -> PredictionResult:
        if num_samples is not None:
            return self.predict(x, num_samples)
        probs = self._core().mean_field_of(x.logits, x.cls)  # (B, C)
        return PredictionResult(probs[None], kind="posthoc/gp-mean-field")

    def _score(self, x: Features) -> Tensor:
        return self._core().variance_of(x.cls)

    @property
    def temperature(self) -> float:
        """:math:`T` of the sampled predictive."""
        return self._core().temperature

    @property
    def outputscale(self) -> float:
        """The chosen prior variance of the random-feature weights' logits."""
        return self._core().outputscale

    @property
    def lengthscale(self) -> float:
        """The RBF length-scale (the median calibration feature distance)."""
        return self._core().lengthscale

    @property
    def mean_field(self) -> tuple[float, float]:
        """``(T_mf, a)`` of the mean-field predictive."""
        core = self._core()
        return core.mf_temperature, core.mf_scale

    def kl(self) -> float:
        """:math:`C \\cdot \\tfrac12(\\operatorname{tr}\\Sigma - R - \\log|\\Sigma|)` (nats, from
        the float64 covariance of the fit)."""
        assert self.num_classes is not None
        return self.num_classes * self._core().column_kl

    def _state(self) -> dict[str, Any]:
        core = self._core()
        out: dict[str, Any] = {k: getattr(core, k) for k in _FIELDS + _NUMBERS}
        out["batch_size"] = core.batch_size
        return out

    def _load(self, state: dict[str, Any]) -> None:
        self.core_ = PosthocGP(
            None, None, None, float(state["temperature"]), state["rff_weight"],
            state["rff_phase"], float(state["lengthscale"]), float(state["outputscale"]),
            state["scale_tril"], int(state["batch_size"]), float(state["mf_temperature"]),
            float(state["mf_scale"]), state["half_tril"], float(state["column_kl"]),
        )  # fmt: skip
