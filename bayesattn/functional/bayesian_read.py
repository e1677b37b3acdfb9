r"""The Bayesian read: drawing attention weights from a family, one function for every path.

For query :math:`q_i` and keys :math:`k_1..k_{T_k}` the exact posterior over the key the query
reads is

.. math::

    p(z_i = j \mid q_i) \propto \pi_{ij}\,\exp(q_i\cdot k_j/\sqrt{d}),

i.e. ``softmax(log π + logits)`` with ``logits = q·k/√d`` (:mod:`bayesattn.functional`). A
*family* (:mod:`bayesattn.families`) makes the weights :math:`w_i` on the simplex a latent
variable: a weight model :math:`p(w_i\mid\pi_i, k)` and an amortised guide
:math:`q(w_i\mid \ell_i, \log\pi_i, q_i)` centred on that posterior. One draw, in each mode:

``"guide"``
    :math:`\text{latent} \sim q` at the Pyro site ``site`` (event shape ``(H, Tq, K)``).
``"model"``
    :math:`\text{latent} \sim p` at the same site (under a replayed guide trace the site takes the
    guide's value and scores it under :math:`p`); the simplex weights are also recorded as the
    deterministic site ``weights_site``.
``"elbo"``
    :math:`\text{latent} \sim q` by ``rsample`` *without* a Pyro site, and
    :math:`\mathrm{KL}(q\,\|\,p)` summed over heads and queries, shape ``(*S, …, B)``, is added to
    ``kl_sink`` under the name ``site``.

Then :math:`w = \text{family.to\_weights(latent, allowed)}`: keys the log-prior rules out
(:math:`\log\pi = -\infty`) get exactly zero weight, rows with no allowed key are zero.

:func:`sample_attention_weights` is that draw. The dense layer
(:class:`~bayesattn.nn.attention.BayesianMultiheadAttention`), the reduced-support kernels
(:mod:`bayesattn.nn.supports`, where ``K`` is the support size) and the Hugging Face interop
(:mod:`bayesattn.interop.hf`) all call it. :func:`add_key_prior` evaluates a key-relevance prior
on inputs with leading sample dims, for the same callers.

Shape glossary: ``S`` samples (leftmost), ``B`` batch, ``H`` heads, ``Tq`` queries, ``Tk`` keys,
``K`` keys on the support (``Tk`` for dense attention), ``Dh`` head dim.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, Protocol, get_args

import pyro
import torch
from torch import Tensor

from .posterior import allowed_keys

if TYPE_CHECKING:
    from ..families import AttentionFamily
    from ..priors import KeyRelevancePrior

__all__ = ["DrawMode", "DRAW_MODES", "KLSink", "sample_attention_weights", "add_key_prior"]

#: The modes that draw weights (``"mean"`` is the exact posterior: no draw).
DrawMode = Literal["guide", "model", "elbo"]
DRAW_MODES: tuple[DrawMode, ...] = get_args(DrawMode)


class KLSink(Protocol):
    """Where ``"elbo"`` mode puts each site's KL (e.g. :class:`bayesattn.nn.modes.KLCollector`)."""

    def add(self, name: str, kl: Tensor) -> None: ...


def sample_attention_weights(
    family: AttentionFamily,
    mode: str,
    logits: Tensor,
    log_prior: Tensor | None,
    query: Tensor,
    key: Tensor,
    *,
    site: str = "latent",
    weights_site: str = "weights",
    num_samples: int | None = None,
    kl_sink: KLSink | None = None,
) -> Tensor:
    r"""Draw simplex attention weights from ``family`` (see the module docstring for the maths).

    Args:
        family: the family over the weights (its ``guide``, ``model``, ``kl``, ``to_weights``).
        mode: ``"guide"``, ``"model"`` or ``"elbo"`` (:data:`DRAW_MODES`).
        logits: ``q·k/√d`` on the support (the model's own scores in the interop).
        log_prior: :math:`\log\pi`, broadcastable to ``logits`` (``-inf``: key ruled out), or
            ``None`` (uniform, every key allowed).
        query, key: the per-head queries and keys; the guide may read ``query``, the weight model
            ``key`` (BAM's contextual prior).
        site: the Pyro sample site of the latent (``"elbo"``: the KL's name in ``kl_sink``).
        weights_site: the deterministic site of the weights in ``"model"`` mode.
        num_samples: ``S`` draws in one call (a leading ``S`` on the result), or ``None``.
        kl_sink: receives :math:`\mathrm{KL}(q\|p)` ``(*S, …, B)`` in ``"elbo"`` mode (``None``:
            not computed).

    Shape:
        logits ``(…, B, H, Tq, K)``, log_prior broadcastable to it, query ``(…, B, H, Tq, Dh)``,
        key ``(…, B, H, Tk, Dh)`` → weights ``(*S, …, B, H, Tq, K)``.
    """
    if mode not in DRAW_MODES:
        raise ValueError(f"mode must be one of {DRAW_MODES}; got {mode!r}")
    lp_full = log_prior.expand_as(logits) if log_prior is not None else None  # (…, B, H, Tq, K)
    allowed = None if lp_full is None else allowed_keys(logits + lp_full)  # None: every key
    if mode == "model":
        d = family.model(lp_full, logits, key=key)
    else:
        d = family.guide(logits, lp_full, query=query)
    if num_samples is not None:
        d = d.expand(torch.Size((num_samples,)) + d.batch_shape)  # (S, …, B, H, Tq)
        if allowed is not None:
            allowed = allowed.expand((num_samples,) + allowed.shape)  # (S, …, B, H, Tq, K)
    if mode == "elbo":
        latent = d.rsample()
        if kl_sink is not None:
            p = family.model(lp_full, logits, key=key)
            if num_samples is not None:
                p = p.expand(d.batch_shape)
            kl = family.kl(d, p)  # (*S, …, B, H, Tq)
            kl_sink.add(site, kl.sum((-2, -1)))  # (*S, …, B)
        return family.to_weights(latent, allowed)
    latent = pyro.sample(site, d.to_event(2))
    w = family.to_weights(latent, allowed)  # (*S, …, B, H, Tq, K)
    if mode == "model":
        pyro.deterministic(weights_site, w, event_dim=3)
    return w


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
