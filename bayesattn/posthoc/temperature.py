r""":class:`TemperatureRead`: temperature scaling, the simplest post-hoc read.

Features read: ``logits`` only. :math:`T` minimises the calibration split's NLL of
:math:`\operatorname{softmax}(z/T)` (:func:`~bayesattn.calibration.fit_temperature`); the
predictive is that softmax (``S = 1``), the score its predictive entropy, the KL 0 (a point
estimate).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .. import calibration as C
from ..predictive import PredictionResult
from ._checks import check_labels
from .base import PosthocRead
from .features import Features

__all__ = ["TemperatureRead"]


class TemperatureRead(PosthocRead):
    """Temperature scaling of a model's logits (module docstring)."""

    temperature: float = 1.0

    def _fit(self, x: Features, y: Tensor, val: tuple[Any, Tensor] | None) -> None:
        """``T`` on ``(features, y)`` (the calibration split); ``val`` unused."""
        check_labels("y", y, len(x.logits), x.logits.shape[1])
        self.temperature = C.fit_temperature(x.logits, y)
        self.num_classes = x.logits.shape[1]

    def _probs(self, x: Features) -> Tensor:
        return torch.softmax(x.logits / self.temperature, -1)  # (B, C)

    def _predict(self, x: Features, num_samples: int | None) -> PredictionResult:
        if num_samples not in (None, 1):
            raise ValueError(f"num_samples must be None or 1 (the read is deterministic); got "
                             f"{num_samples}")  # fmt: skip
        return PredictionResult(self._probs(x)[None], kind="posthoc/temperature")

    def _score(self, x: Features) -> Tensor:
        return C.predictive_entropy(self._probs(x))

    def kl(self) -> float:
        """0: the temperature is a point estimate."""
        return 0.0

    def _state(self) -> dict[str, Any]:
        return {"temperature": self.temperature}

    def _load(self, state: dict[str, Any]) -> None:
        self.temperature = float(state["temperature"])
