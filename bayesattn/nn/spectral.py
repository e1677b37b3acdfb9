r"""Spectral normalisation of a trunk's projections (SNGP, Liu et al. 2020; DDU, Mukhoti et al.
2021): every selected weight is rescaled so that its largest singular value is at most ``coeff``,

.. math:: W_{\rm sn} = W \cdot \min\big(1, c / \hat\sigma(W)\big),

:math:`\hat\sigma` by power iteration (one step per training forward, as
``torch.nn.utils.parametrizations.spectral_norm``; the vectors persist in buffers). With
residual blocks :math:`x + f(x)` whose :math:`f` is :math:`c`-Lipschitz, :math:`c < 1`, the trunk
is bi-Lipschitz: distances between inputs are neither collapsed nor blown up, which is what a
distance-aware read (a GP variance, a class-conditional density) needs. The pre-norm LayerNorm
inside each block is not constrained (as in SNGP's BERT): the bound is on the projections.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn
from torch.nn.utils import parametrize

__all__ = ["SpectralBound", "spectral_normalize", "TRUNK_WEIGHTS"]

#: the projections of every encoder layer: attention Q/K/V (in_proj), output, feed-forward
TRUNK_WEIGHTS: tuple[str, ...] = (
    "*self_attn.in_proj_weight",
    "*self_attn.out_proj.weight",
    "*linear1.weight",
    "*linear2.weight",
)


class SpectralBound(nn.Module):
    """The parametrization :math:`W \\mapsto W\\min(1, c/\\hat\\sigma(W))` of a ``(O, I)`` weight
    (register with ``torch.nn.utils.parametrize.register_parametrization``)."""

    def __init__(self, weight: Tensor, coeff: float, n_power_iterations: int = 1) -> None:
        super().__init__()
        if weight.dim() != 2:
            raise ValueError(f"weight must be 2-D (O, I); got {tuple(weight.shape)}")
        self.coeff, self.n_power_iterations = float(coeff), int(n_power_iterations)
        g = torch.Generator().manual_seed(0)  # deterministic start, independent of the seed
        u = torch.randn(weight.shape[0], generator=g).to(weight)
        v = torch.randn(weight.shape[1], generator=g).to(weight)
        self.register_buffer("u", u / u.norm())
        self.register_buffer("v", v / v.norm())
        with torch.no_grad():
            self._power(weight.detach(), 15)

    u: Tensor
    v: Tensor

    @torch.no_grad()
    def _power(self, W: Tensor, steps: int) -> None:
        for _ in range(steps):
            v = W.T @ self.u
            self.v.copy_(v / v.norm().clamp_min(1e-12))
            u = W @ self.v
            self.u.copy_(u / u.norm().clamp_min(1e-12))

    def sigma(self, W: Tensor) -> Tensor:
        """The power-iteration estimate of the largest singular value of ``W``."""
        return self.u @ W @ self.v

    def forward(self, W: Tensor) -> Tensor:
        if self.training:
            self._power(W.detach(), self.n_power_iterations)
        s = self.sigma(W)
        return W * torch.clamp(self.coeff / s.clamp_min(1e-12), max=1.0)


def spectral_normalize(
    module: nn.Module,
    coeff: float = 0.95,
    targets: Sequence[str] = TRUNK_WEIGHTS,
    n_power_iterations: int = 1,
) -> list[str]:
    """Bound the spectral norm of every parameter of ``module`` whose dotted name matches one of
    ``targets`` (fnmatch patterns) by ``coeff``; returns the names bounded. Idempotent per
    parameter (a parameter already bounded is skipped). Raises ``ValueError`` when nothing
    matches (a silent no-op would leave the trunk unconstrained)."""
    if isinstance(coeff, bool) or not isinstance(coeff, (int, float)) or not (
        math.isfinite(coeff) and coeff > 0
    ):
        raise ValueError(f"coeff must be a finite number > 0; got {coeff!r}")
    if isinstance(n_power_iterations, bool) or not isinstance(n_power_iterations, int) or (
        n_power_iterations < 1
    ):
        raise ValueError(f"n_power_iterations must be an int >= 1; got {n_power_iterations!r}")
    chosen: list[tuple[nn.Module, str, str]] = []
    for mod_name, mod in module.named_modules():
        for p_name, p in list(mod.named_parameters(recurse=False)):
            full = f"{mod_name}.{p_name}" if mod_name else p_name
            if p is not None and p.dim() == 2 and any(fnmatch.fnmatch(full, t) for t in targets):
                chosen.append((mod, p_name, full))
    done = [full for _, _, full in _bounded(module)]
    todo = [(m, n, f) for m, n, f in chosen if f not in done]
    if not chosen and not done:
        raise ValueError(
            f"no 2-D parameter of {type(module).__name__} matches targets {list(targets)}"
        )
    for mod, p_name, _ in todo:
        w = getattr(mod, p_name)
        parametrize.register_parametrization(
            mod, p_name, SpectralBound(w, coeff, n_power_iterations)
        )
    return [f for _, _, f in todo]


def _bounded(module: nn.Module) -> list[tuple[nn.Module, str, str]]:
    """``(module, parameter, dotted name)`` of every parameter already bounded."""
    out = []
    for mod_name, mod in module.named_modules():
        for p_name, plist in getattr(mod, "parametrizations", {}).items():
            if any(isinstance(p, SpectralBound) for p in plist):
                out.append((mod, p_name, f"{mod_name}.{p_name}" if mod_name else p_name))
    return out
