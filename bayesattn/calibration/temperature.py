"""Post-hoc temperature scaling: :class:`TemperatureScaler` and :func:`fit_temperature`."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from .._validation import check_int
from .checks import F64, check_labels, to_float64, to_tensor


def _check_logits(logits: Any, name: str = "logits") -> Tensor:
    t = to_tensor(logits, name)
    if t.dim() != 2 or t.shape[0] == 0 or t.shape[1] == 0:
        raise ValueError(
            f"{name} must be 2-D and non-empty with shape (N, C), got shape {tuple(t.shape)}"
        )
    return to_float64(t, name)


class TemperatureScaler(nn.Module):
    """Post-hoc temperature scaling (Guo et al., 2017): ``p = softmax(z / T)``.

    The single parameter is ``log_temperature`` (so ``T = exp(log_temperature) > 0``).
    :meth:`fit` minimises the NLL ``−(1/N) Σ_i log softmax(z_i / T)_{y_i}`` with L-BFGS.

    Shape:
        forward: logits ``(..., C)`` → probs ``(..., C)``.
    """

    def __init__(self, temperature: float = 1.0) -> None:
        super().__init__()
        if not (isinstance(temperature, (int, float)) and math.isfinite(temperature)) or (
            temperature <= 0
        ):
            raise ValueError(f"temperature must be a finite float > 0, got {temperature!r}")
        self.log_temperature = nn.Parameter(torch.tensor(math.log(temperature)))

    @property
    def temperature(self) -> float:
        """The fitted temperature ``T = exp(log_temperature)``."""
        return float(self.log_temperature.detach().exp())

    def forward(self, logits: Tensor) -> Tensor:
        """Calibrated probabilities ``softmax(logits / T)`` over the last dimension."""
        if not isinstance(logits, Tensor):
            logits = to_tensor(logits, "logits")
        if not logits.is_floating_point():
            logits = logits.to(torch.get_default_dtype())
        if logits.dim() < 1 or logits.shape[-1] == 0:
            raise ValueError(
                f"logits must have a non-empty class dimension (..., C), got shape "
                f"{tuple(logits.shape)}"
            )
        t = self.log_temperature.to(device=logits.device, dtype=logits.dtype).exp()
        return torch.softmax(logits / t, dim=-1)

    def fit(self, logits: Tensor, labels: Tensor, max_iter: int = 100) -> TemperatureScaler:
        """Fit ``T`` by minimising the NLL of ``softmax(logits / T)`` on ``(logits, labels)``.

        Optimisation runs in float64 with ``torch.optim.LBFGS`` (strong-Wolfe line search)
        starting from the current temperature; the result is copied into ``log_temperature``.

        Shape:
            logits ``(N, C)``, labels ``(N,)``.
        """
        check_int("max_iter", max_iter, 1)
        z = _check_logits(logits)
        y = check_labels(labels, z.shape[0], z.shape[1])
        log_t = self.log_temperature.detach().to(device="cpu", dtype=F64).clone()
        log_t.requires_grad_(True)
        opt = torch.optim.LBFGS(
            [log_t],
            lr=1.0,
            max_iter=max_iter,
            tolerance_grad=1e-10,
            tolerance_change=1e-12,
            line_search_fn="strong_wolfe",
        )

        def closure() -> Tensor:
            opt.zero_grad()
            loss = nn.functional.cross_entropy(z / log_t.exp(), y)
            loss.backward()
            return loss

        with torch.enable_grad():
            opt.step(closure)
        if not bool(torch.isfinite(log_t).all()):
            raise RuntimeError("temperature scaling diverged (non-finite log-temperature)")
        with torch.no_grad():
            self.log_temperature.copy_(log_t.detach().to(self.log_temperature))
        return self


def fit_temperature(logits: Tensor, labels: Tensor, max_iter: int = 100) -> float:
    """Fit a :class:`TemperatureScaler` and return the temperature ``T``.

    Shape:
        logits ``(N, C)``, labels ``(N,)`` → float.
    """
    return TemperatureScaler().fit(logits, labels, max_iter=max_iter).temperature
