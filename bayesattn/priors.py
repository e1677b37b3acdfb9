r"""Priors over key relevance :math:`\pi_{ij} = p(z_i = j)`.

Each prior is a small ``nn.Module`` returning :math:`\log\pi` (unnormalised; ``-inf`` = zero mass),
broadcastable to ``(B, H, Tq, Tk)``. Priors compose by ``+`` (product of priors = sum of log-priors),
e.g. ``CausalPrior() + DistanceDecayPrior(num_heads=8)`` is causal ALiBi.

All priors are called as ``prior(q, k, q_pos=None, k_pos=None)`` with per-head queries
``q (B, H, Tq, Dh)`` and keys ``k (B, H, Tk, Dh)``; positions default to ``arange(Tq)`` and
``arange(Tk)`` (PyTorch's top-left alignment). Pass ``q_pos = arange(Tk - Tq, Tk)`` when decoding
with cached keys.

:data:`PRIORS` names them for ``AttentionConfig(prior=..., prior_kwargs=...)``; a prior of your
own joins with :func:`register_prior` (``docs/extending.md``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, cast

import torch
from pyro.infer.util import is_validation_enabled
from torch import Tensor, nn

from ._validation import check_bool, check_int, check_tensor
from .functional import check_finite
from .registry import Registry

__all__ = [
    "KeyRelevancePrior",
    "UniformPrior",
    "CausalPrior",
    "LocalWindowPrior",
    "DistanceDecayPrior",
    "LearnedPrior",
    "ContextualPrior",
    "SumPrior",
    "alibi_slopes",
    "PRIORS",
    "register_prior",
    "list_priors",
    "build_prior",
    "prior_arguments",
    "add_key_prior",
]


def _positions(pos: Tensor | None, n: int, device: torch.device, name: str) -> Tensor:
    if pos is None:
        return torch.arange(n, device=device)
    check_tensor(name, pos)
    if pos.dim() != 1 or pos.shape[0] != n:
        raise ValueError(f"{name} must have shape ({n},); got {tuple(pos.shape)}")
    return pos.to(device)


def _check_qk(q: Tensor, k: Tensor) -> None:
    check_tensor("q", q)
    check_tensor("k", k)
    if q.dim() != 4 or k.dim() != 4:
        raise ValueError(
            f"priors take per-head q (B, H, Tq, Dh) and k (B, H, Tk, Dh); got q {tuple(q.shape)}, "
            f"k {tuple(k.shape)}"
        )


class KeyRelevancePrior(nn.Module):
    r"""Base class: ``forward(q, k, q_pos, k_pos)`` returns :math:`\log\pi` broadcastable to
    ``(B, H, Tq, Tk)``."""

    def forward(
        self, q: Tensor, k: Tensor, q_pos: Tensor | None = None, k_pos: Tensor | None = None
    ) -> Tensor:
        _check_qk(q, k)
        qp = _positions(q_pos, q.shape[-2], q.device, "q_pos")
        kp = _positions(k_pos, k.shape[-2], k.device, "k_pos")
        return self.log_prior(q, k, qp, kp)

    def log_prior(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        raise NotImplementedError

    def __add__(self, other: KeyRelevancePrior) -> SumPrior:
        if not isinstance(other, KeyRelevancePrior):
            return NotImplemented
        left = list(self.terms) if isinstance(self, SumPrior) else [self]
        right = list(other.terms) if isinstance(other, SumPrior) else [other]
        return SumPrior(*left, *right)


class UniformPrior(KeyRelevancePrior):
    r""":math:`\pi_{ij} = 1/T_k`: no prior information; the posterior is plain softmax attention."""

    def log_prior(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        return q.new_zeros(1, 1, 1, 1)


def _offsets(q_pos: Tensor, k_pos: Tensor) -> Tensor:
    """Signed distance ``i - j`` (query minus key position), shape ``(Tq, Tk)``."""
    return q_pos.unsqueeze(-1) - k_pos.unsqueeze(0)  # (Tq, Tk)


def _neg_inf_where(mask: Tensor, dtype: torch.dtype) -> Tensor:
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(mask, float("-inf"))


class CausalPrior(KeyRelevancePrior):
    r"""Zero mass on future keys: :math:`\log\pi_{ij} = 0` if :math:`j \le i`, else :math:`-\infty`."""

    def log_prior(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        future = _offsets(q_pos, k_pos) < 0  # (Tq, Tk)
        return _neg_inf_where(future, q.dtype)[None, None]  # (1, 1, Tq, Tk)


class LocalWindowPrior(KeyRelevancePrior):
    r"""Zero mass on keys farther than ``window``: :math:`|i - j| \le w` (or :math:`0 \le i-j \le w`
    when ``causal=True``). Banded attention, :math:`O(T\cdot w)` non-zero posterior entries."""

    def __init__(self, window: int, causal: bool = False) -> None:
        super().__init__()
        self.window = check_int("window", window, 0)
        self.causal = check_bool("causal", causal)

    def log_prior(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        d = _offsets(q_pos, k_pos)  # (Tq, Tk)
        far = (d < 0) | (d > self.window) if self.causal else d.abs() > self.window
        return _neg_inf_where(far, q.dtype)[None, None]  # (1, 1, Tq, Tk)

    def extra_repr(self) -> str:
        return f"window={self.window}, causal={self.causal}"


def alibi_slopes(num_heads: int) -> Tensor:
    r"""ALiBi head slopes :math:`m_h = 2^{-8h/H}`, :math:`h = 1..H` (Press et al., 2022); for a
    non-power-of-two ``H`` the standard interleaving of the next power of two is used."""
    num_heads = check_int("num_heads", num_heads, 1)

    def pow2(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    if math.log2(num_heads).is_integer():
        s = pow2(num_heads)
    else:
        p = 2 ** math.floor(math.log2(num_heads))
        s = pow2(p) + pow2(2 * p)[0::2][: num_heads - p]
    return torch.tensor(s)


class DistanceDecayPrior(KeyRelevancePrior):
    r"""ALiBi as a log-prior linear in distance: :math:`\log\pi_{hij} = -m_h\,|i - j|`.

    Args:
        num_heads: number of heads ``H`` (one slope each).
        slopes: optional ``(H,)`` non-negative slopes; default :func:`alibi_slopes`.
        learnable: make the (log-)slopes trainable parameters.
    """

    def __init__(
        self, num_heads: int, slopes: Tensor | None = None, learnable: bool = False
    ) -> None:
        super().__init__()
        num_heads = check_int("num_heads", num_heads, 1)
        if slopes is not None and not isinstance(slopes, (Tensor, list, tuple)):
            raise TypeError(f"slopes must be a tensor or a list of floats; got {slopes!r}")
        s = (
            alibi_slopes(num_heads)
            if slopes is None
            else torch.as_tensor(slopes, dtype=torch.float)
        )
        if s.shape != (num_heads,):
            raise ValueError(f"slopes must have shape (num_heads,) = ({num_heads},); got {s.shape}")
        if (s < 0).any() or not torch.isfinite(s).all():
            raise ValueError("slopes must be finite and non-negative")
        self.num_heads = num_heads
        log_s = s.clamp_min(1e-12).log()
        if learnable:
            self.log_slopes = nn.Parameter(log_s)
        else:
            self.register_buffer("log_slopes", log_s)

    @property
    def slopes(self) -> Tensor:
        return self.log_slopes.exp()

    def log_prior(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        if q.shape[1] not in (1, self.num_heads):
            raise ValueError(f"DistanceDecayPrior has {self.num_heads} heads; q has {q.shape[1]}")
        d = _offsets(q_pos, k_pos).abs().to(q.dtype)  # (Tq, Tk)
        return -self.slopes.to(q.dtype).view(1, -1, 1, 1) * d  # (1, H, Tq, Tk)


class LearnedPrior(KeyRelevancePrior):
    r"""Learned log-relevance per head and relative offset :math:`i - j`, clipped to
    ``[-max_distance, max_distance]`` (T5-style relative bias read as a prior).

    Parameters: ``table (H, 2*max_distance + 1)``, initialised to zero (= uniform prior).
    """

    def __init__(self, num_heads: int, max_distance: int) -> None:
        super().__init__()
        num_heads = check_int("num_heads", num_heads, 1)
        max_distance = check_int("max_distance", max_distance, 0)
        self.num_heads = num_heads
        self.max_distance = max_distance
        self.table = nn.Parameter(torch.zeros(num_heads, 2 * max_distance + 1))

    def log_prior(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        if q.shape[1] not in (1, self.num_heads):
            raise ValueError(f"LearnedPrior has {self.num_heads} heads; q has {q.shape[1]}")
        d = _offsets(q_pos, k_pos).clamp(-self.max_distance, self.max_distance)  # (Tq, Tk)
        idx = d + self.max_distance
        return self.table[:, idx].to(q.dtype).unsqueeze(0)  # (1, H, Tq, Tk)


class ContextualPrior(KeyRelevancePrior):
    r"""Key relevance computed from the keys alone (Bayesian Attention Modules' contextual prior):

    .. math:: \log\pi_{ij} = \log\operatorname{softmax}_j\big(w_2^\top \tanh(W_1 k_j)\big)

    The same for every query; an MLP shared across heads.

    Args:
        head_dim: per-head key dim ``Dh``.
        hidden: hidden width of the MLP.
    """

    def __init__(self, head_dim: int, hidden: int = 32) -> None:
        super().__init__()
        head_dim = check_int("head_dim", head_dim, 1)
        hidden = check_int("hidden", hidden, 1)
        self.head_dim = head_dim
        self.net = nn.Sequential(nn.Linear(head_dim, hidden), nn.Tanh(), nn.Linear(hidden, 1))

    def log_prior(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        if k.shape[-1] != self.head_dim:
            raise ValueError(
                f"ContextualPrior expects keys with last dim {self.head_dim}; got {tuple(k.shape)}"
            )
        if is_validation_enabled():
            check_finite("k", k)
        w = cast(nn.Linear, self.net[0]).weight
        s = self.net(k.to(w.dtype)).squeeze(-1).to(k.dtype)  # (B, H, Tk)
        return torch.log_softmax(s, dim=-1).unsqueeze(-2)  # (B, H, 1, Tk)


class SumPrior(KeyRelevancePrior):
    r"""Product of priors: :math:`\log\pi = \sum_m \log\pi^{(m)}`."""

    def __init__(self, *terms: KeyRelevancePrior) -> None:
        super().__init__()
        if not terms:
            raise ValueError("SumPrior needs at least one prior")
        for t in terms:
            if not isinstance(t, KeyRelevancePrior):
                raise TypeError(f"SumPrior terms must be KeyRelevancePrior; got {type(t).__name__}")
        self.terms = nn.ModuleList(terms)

    def log_prior(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        terms = cast("Sequence[KeyRelevancePrior]", self.terms)  # checked in __init__
        out = terms[0].log_prior(q, k, q_pos, k_pos)
        for t in terms[1:]:
            out = out + t.log_prior(q, k, q_pos, k_pos)
        return out


# --------------------------------------------------------------------------------------------
# priors by name
# --------------------------------------------------------------------------------------------

#: the key-relevance priors by name (:class:`~bayesattn.registry.Registry`), as
#: ``AttentionConfig(prior=name, prior_kwargs=...)`` takes them; add one with
#: :func:`register_prior`. Each is built by :func:`build_prior`.
PRIORS: Registry[Callable[..., KeyRelevancePrior]] = Registry(
    "prior", KeyRelevancePrior, register_with="bayesattn.register_prior"
)
#: ``@register_prior("name")`` on a :class:`KeyRelevancePrior` subclass (or a function returning
#: one) makes ``AttentionConfig(prior="name")`` build it; see :func:`build_prior`.
register_prior = PRIORS.register


def _local(window: int = 4, causal: bool = False) -> LocalWindowPrior:
    return LocalWindowPrior(window, causal)


def _alibi(num_heads: int, learnable: bool = False) -> DistanceDecayPrior:
    return DistanceDecayPrior(num_heads, learnable=learnable)


def _learned(num_heads: int, max_distance: int = 16) -> LearnedPrior:
    return LearnedPrior(num_heads, max_distance)


PRIORS.register("uniform", UniformPrior)
PRIORS.register("causal", CausalPrior)
PRIORS.register("local", _local)
PRIORS.register("alibi", _alibi)
PRIORS.register("learned", _learned)
PRIORS.register("contextual", ContextualPrior)

#: what a layer passes to a prior's factory when its signature names it
_LAYER_ARGUMENTS = ("num_heads", "head_dim")


def prior_arguments(name: str) -> tuple[str, ...] | None:
    """The ``prior_kwargs`` the prior ``name`` takes (``None``: any): its factory's keyword
    arguments less ``num_heads``/``head_dim``, which the layer supplies."""
    args = PRIORS.arguments(name)
    return None if args is None else tuple(a for a in args if a not in _LAYER_ARGUMENTS)


def build_prior(name: str, num_heads: int, head_dim: int, **kwargs: Any) -> KeyRelevancePrior:
    """The registered prior ``name`` for a layer of ``num_heads`` heads of size ``head_dim``:
    ``factory(**kwargs)``, plus ``num_heads=``/``head_dim=`` for the parameters of those names
    its factory has."""
    args = PRIORS.arguments(name) or ()
    layer = {"num_heads": num_heads, "head_dim": head_dim}
    return PRIORS.create(name, **{a: layer[a] for a in _LAYER_ARGUMENTS if a in args}, **kwargs)


def list_priors() -> tuple[str, ...]:
    """The registered prior names (built-in and user), in registration order."""
    return PRIORS.names()


def add_key_prior(
    prior: KeyRelevancePrior,
    log_prior: Tensor | None,
    query: Tensor,
    key: Tensor,
    q_pos: Tensor | None = None,
    k_pos: Tensor | None = None,
) -> Tensor:
    r"""``log_prior + prior(query, key, q_pos, k_pos)``: a key-relevance prior added to a
    log-prior (``None``: just the prior's). Leading sample dims of ``query``/``key`` are folded
    into the batch for the prior (priors see ``(N, H, T, Dh)``) and unfolded after.

    Shape:
        query ``(…, B, H, Tq, Dh)``, key ``(…, B, H, Tk, Dh)``, log_prior broadcastable to
        ``(…, B, H, Tq, Tk)`` → ``(…, B, H|1, Tq|1, Tk)`` (or the prior's ``(1, H|1, Tq|1, Tk)``
        when it does not depend on the batch).
    """
    lead = torch.broadcast_shapes(query.shape[:-3], key.shape[:-3])  # (…, B)
    pq = query.expand(lead + query.shape[-3:]).reshape((-1,) + query.shape[-3:])  # (N, H, Tq, Dh)
    pk = key.expand(lead + key.shape[-3:]).reshape((-1,) + key.shape[-3:])  # (N, H, Tk, Dh)
    lp = prior(pq, pk, q_pos, k_pos)  # (N|1, H|1, Tq|1, Tk)
    if lp.shape[0] != 1:
        lp = lp.reshape(lead + lp.shape[1:])  # (…, B, H|1, Tq|1, Tk)
    return lp if log_prior is None else log_prior + lp
