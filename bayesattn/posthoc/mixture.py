r""":class:`MixtureRead`: a K-component mixture posterior over rank-1 factors of a frozen
model's attention projections, fitted post hoc by the ELBO (the maths in
:mod:`bayesattn.posthoc._mixture_core`, the hooks in :mod:`bayesattn.posthoc.rank1_hooks`).

Features read: the model's **inputs** (the factors change the model's pass). ``predict``
gives ``S`` draws (default ``K``, stratified: draw ``i`` from component ``i mod K``, recorded in
``PredictionResult.components``); ``score`` their mutual information; ``kl()`` the mixture's
KL convexity bound :math:`U = \frac1K\sum_k \mathrm{KL}(q_k\|p)` (what the ELBO charged).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from .._validation import check_int, check_real
from ..predictive import PredictionResult
from ..predictive.foreign import default_forward, take_rows
from ._mixture_core import PosthocMixture, fit_posthoc_mixture
from .base import PosthocRead
from .rank1_hooks import rank1_sites

__all__ = ["MixtureRead"]


class MixtureRead(PosthocRead):
    """The post-hoc rank-1 mixture of a frozen model's attention (module docstring).

    Args:
        model: a torch or Hugging Face model with attention layers (required).
        num_components: ``K``; the other settings as
            :func:`~bayesattn.posthoc._mixture_core.fit_posthoc_mixture`.
    """

    takes_inputs = True

    def __init__(self, model: nn.Module, *, num_components: int = 4, batch_size: int = 64,
                 **settings: Any) -> None:  # fmt: skip
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be an nn.Module; got {type(model).__name__}")
        forward = settings.pop("forward", None)
        super().__init__(model, forward=forward, batch_size=batch_size)
        self.num_components, self.settings = num_components, settings
        self.core_: PosthocMixture | None = None

    def _fit(self, x: Any, y: Tensor, val: tuple[Any, Tensor] | None) -> None:
        """The ELBO on ``(x, y)`` (the calibration split); ``val`` unused."""
        assert self.model is not None
        self.core_ = fit_posthoc_mixture(
            self.model, x, y, self.num_components, forward=self.forward,
            batch_size=self.batch_size, **self.settings,
        )  # fmt: skip
        self.num_classes = int(self._predict(take_rows(x, torch.arange(1)), 1).probs.shape[-1])

    def _core(self) -> PosthocMixture:
        if self.core_ is None:
            raise RuntimeError("MixtureRead is not fitted: call fit(...) first")
        return self.core_

    def predict(
        self, features: Any, num_samples: int | None = None, *, seed: int | None = None
    ) -> PredictionResult:
        """``S`` stratified draws (module docstring); ``seed``: the draws' generator (``None``:
        the global one)."""
        self._check_fitted()
        if num_samples is not None:
            check_int("num_samples", num_samples, 1)
        return self._predict(features, num_samples, seed)

    @property
    def temperature(self) -> float:
        """The fitted temperature :math:`T` of the draws' logits."""
        return self._core().temperature

    def _predict(
        self, x: Any, num_samples: int | None, seed: int | None = None
    ) -> PredictionResult:
        core = self._core()
        probs = core.probs(x, num_samples, seed=seed)  # (S, B, C)
        K = core.num_components
        return PredictionResult(probs, kind="posthoc/mixture",
                                components=torch.arange(probs.shape[0]) % K)  # fmt: skip

    def _score(self, x: Any) -> Tensor:
        return self._predict(x, None).mutual_information

    def kl(self) -> float:
        """The mixture's KL convexity upper bound from the prior (nats)."""
        return self._core().kl_bounds()[0]

    def _state(self) -> dict[str, Any]:
        core = self._core()
        return {"mean": core.mean, "std": core.std, "log_temperature": core.log_temperature,
                "prior_std": core.prior_std, "history": list(core.history)}  # fmt: skip

    def _load(self, state: dict[str, Any]) -> None:
        assert self.model is not None
        sites = rank1_sites(self.model)
        D = sites[-1].offset + sites[-1].size
        if state["mean"].shape[-1] != D:
            raise ValueError(
                f"state's factors have D = {state['mean'].shape[-1]}; the model's sites have "
                f"D = {D}: load into the same architecture"
            )
        self.core_ = PosthocMixture(
            self.model, self.forward or default_forward, sites, state["mean"], state["std"],
            state["log_temperature"], check_real("prior_std", float(state["prior_std"]), gt=0.0),
            list(state["history"]),
        )  # fmt: skip
