r""":class:`AttentionRead`: the attention posteriors of a converted model (and a temperature),
fitted post hoc by SVI with every other weight frozen (the maths in
:mod:`bayesattn.posthoc._svi_core`).

Features read: the model's **inputs** (the read changes the model's pass, so it cannot work
from cached features). ``fit`` maximises the per-example ELBO over the attention families'
parameters and :math:`\log T`; ``predict`` draws ``S`` posterior-predictive samples through
:class:`~bayesattn.predictive.Predictive` (``S`` defaults to 32); ``score`` is their mutual
information; ``kl()`` is 0: the attention posteriors are per example (local), their KL is part
of each example's ELBO, there is no global latent.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from .._validation import check_bool, check_int, check_real, check_seed
from ..predictive import PredictionResult, Predictive
from ..predictive.foreign import take_rows
from ._svi_core import family_parameters, fit_posthoc
from .base import PosthocRead

__all__ = ["AttentionRead"]


class AttentionRead(PosthocRead):
    """SVI over a converted model's attention posteriors and a temperature (module docstring).

    Args:
        model: a model made Bayesian by :func:`bayesattn.convert` or
            :func:`bayesattn.interop.hf.convert_hf` (required).
        forward: ``forward(model, x)`` → logits ``(B, C)``.
        steps, lr, fit_temperature, seed, progress: the SVI (Adam) settings.
        batch_size: examples per SVI step; rows per predictive pass.
        num_samples: the predictive's default ``S``.
    """

    takes_inputs = True

    def __init__(
        self, model: nn.Module, *, steps: int = 200, lr: float = 0.03, fit_temperature: bool = True,
        seed: int = 0, progress: bool = False, num_samples: int = 32, batch_size: int = 64,
        **kwargs: Any,
    ) -> None:  # fmt: skip
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a converted nn.Module; got {type(model).__name__}")
        super().__init__(model, batch_size=batch_size, **kwargs)
        self.steps, self.lr = check_int("steps", steps, 1), check_real("lr", lr, gt=0.0)
        self.seed = check_seed(seed)
        self.fit_temperature = check_bool("fit_temperature", fit_temperature)
        self.progress = check_bool("progress", progress)
        self.num_samples = check_int("num_samples", num_samples, 1)
        self.temperature = 1.0
        self.history: list[float] = []

    def _fit(self, x: Any, y: Tensor, val: tuple[Any, Tensor] | None) -> None:
        """SVI on ``(x, y)`` (the calibration split); ``val`` unused."""
        assert self.model is not None
        fitted = fit_posthoc(
            self.model, x, y, forward=self.forward, steps=self.steps, lr=self.lr,
            batch_size=self.batch_size, fit_temperature=self.fit_temperature, seed=self.seed,
            progress=self.progress,
        )  # fmt: skip
        self.temperature, self.history = fitted.temperature, fitted.history
        with torch.no_grad():
            self.num_classes = int(self._predict(take_rows(x, torch.arange(1)), 1).probs.shape[-1])

    def _predict(self, x: Any, num_samples: int | None) -> PredictionResult:
        engine = Predictive(self.model, num_samples or self.num_samples, batch_size=4096,
                            forward=self.forward, temperature=self.temperature)  # fmt: skip
        return engine(x)

    def _score(self, x: Any) -> Tensor:
        return self._predict(x, None).mutual_information

    def kl(self) -> float:
        """0: no global latent (the attention posteriors' KL is local, per example)."""
        return 0.0

    def _state(self) -> dict[str, Any]:
        assert self.model is not None
        return {"temperature": self.temperature,
                "families": [p.detach().clone() for p in family_parameters(self.model)]}  # fmt: skip

    def _load(self, state: dict[str, Any]) -> None:
        assert self.model is not None
        params = family_parameters(self.model)
        if len(params) != len(state["families"]):
            raise ValueError(
                f"state holds {len(state['families'])} family parameters; the model has "
                f"{len(params)}: load into the model converted the same way"
            )
        with torch.no_grad():
            for p, v in zip(params, state["families"], strict=True):
                p.copy_(v)
        self.temperature = float(state["temperature"])
