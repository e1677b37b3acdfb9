r"""The attention read: one object that turns per-head ``q, k, v`` into the attention output.

For query :math:`q_i` and keys :math:`k_1..k_{T_k}` the exact posterior over the key the query
reads is

.. math::

    p(z_i = j \mid q_i) \propto \pi_{ij}\,\exp(q_i\cdot k_j/\sqrt{d}),

i.e. ``softmax(log π + logits)`` with ``logits = q·k/√d`` (:mod:`bayesattn.functional`), over a
*support* of key slots (:mod:`bayesattn.nn.supports`; dense attention is the support of every
key). A *family* (:mod:`bayesattn.families`) makes the weights :math:`w_i` on the simplex a
latent variable: a weight model :math:`p(w_i\mid\pi_i, k)` and an amortised guide
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

:class:`AttentionRead` does, once for every caller, what follows the scores: mean or draw
(:func:`sample_attention_weights`), record, attention dropout, attend, and the optional GP term.
The layer (:class:`~bayesattn.nn.attention.BayesianMultiheadAttention`) builds one per call; the
supports receive its :meth:`AttentionRead.draw`, never the layer; the Hugging Face interface
(:mod:`bayesattn.interop.hf`) reads transformers' own scores through :meth:`AttentionRead.from_logits`.

Shape glossary: ``S`` samples (leftmost), ``B`` batch, ``H`` heads, ``Tq`` queries, ``Tk`` keys,
``K`` keys on the support (``Tk`` for dense attention), ``Dh`` head dim.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol, get_args

import pyro
import torch
import torch.nn.functional as F
from pyro.contrib.autoname import scope
from torch import Tensor

from .._validation import check_bool, check_int, check_real, check_type
from ..families import AttentionFamily
from ..functional import supports as K
from ..functional.posterior import allowed_keys
from .gp_read import SparseGP
from .modes import AttentionMode, check_mode, current_kl_collector
from .supports.base import AttentionSupport

__all__ = [
    "DrawMode",
    "DRAW_MODES",
    "KLSink",
    "sample_attention_weights",
    "AttentionRead",
    "ReadOut",
    "FOREIGN_FAMILY_ATTR",
]

#: the attribute under which a foreign attention module (a transformers one made Bayesian by
#: :func:`bayesattn.interop.hf.convert_hf`) carries its family
FOREIGN_FAMILY_ATTR = "bayesattn_family"

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
        d = d_one = family.model(lp_full, logits, key=key)
    else:
        d = d_one = family.guide(logits, lp_full, query=query)
    if num_samples is not None:
        d = d.expand(torch.Size((num_samples,)) + d.batch_shape)  # (S, …, B, H, Tq)
        if allowed is not None:
            allowed = allowed.expand((num_samples,) + allowed.shape)  # (S, …, B, H, Tq, K)
    if mode == "elbo":
        latent = d.rsample()
        if kl_sink is not None:
            p = family.model(lp_full, logits, key=key)
            if num_samples is not None and family.analytic_kl:  # the same for every draw
                kl = family.kl(d_one, p).sum((-2, -1))  # (…, B): computed once
                kl_sink.add(site, kl.expand((num_samples,) + kl.shape))  # (S, …, B)
                return family.to_weights(latent, allowed)
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


@dataclass
class ReadOut:
    """What a read returns.

    Attributes:
        out: ``(*S, …, B, H, Tq, Dh)``, the read (with the GP term when there is one).
        weights: ``(*S, …, B, H, Tq, K)`` on the support, after dropout; ``None`` on a fast path
            that never forms them.
        global_weights: ``(*S, …, B, H, Gq, Tk)``, the global queries' rows (local + global).
        support: the support the weights live on (``None`` on a fast path).
        recorded: the weights before dropout as ``(…, Tq, Tk)`` (low rank: over its ``r`` slots),
            when the read was asked to record them.
        drawn: ``out``/``weights`` carry the draws (a leading ``S`` when ``num_samples`` is set).
    """

    out: Tensor
    weights: Tensor | None = None
    global_weights: Tensor | None = None
    support: K.ReducedSupport | None = None
    recorded: Tensor | None = None
    drawn: bool = False


@dataclass
class AttentionRead:
    """One layer's read for one call: mean or draw, record, dropout, attend — once.

    Args:
        family: the family over the weights (``None``: the exact posterior, no draw).
        mode: the layer's mode (:mod:`bayesattn.nn.modes`); weights are drawn when it is not
            ``"mean"`` and there is a family.
        site: the Pyro site of the latent (``"<module path>.latent"``).
        weights_site: the deterministic site of the weights in ``"model"`` mode.
        num_samples: ``S`` draws in one pass, or ``None``.
        dropout_p: attention dropout (0 outside training).
        record: keep the weights before dropout in :attr:`ReadOut.recorded`.
        gp: a sparse-GP term :math:`f_h(q_i)` added to the read, or ``None``.
        kl_sink: where ``"elbo"`` mode puts the KL (``None``: the
            :func:`~bayesattn.nn.modes.collect_kl` open when the draw is made, if any).
    """

    family: AttentionFamily | None
    mode: AttentionMode
    site: str = "latent"
    weights_site: str = "weights"
    num_samples: int | None = None
    dropout_p: float = 0.0
    record: bool = False
    gp: SparseGP | None = None
    kl_sink: KLSink | None = None

    def __post_init__(self) -> None:
        check_type("family", self.family, AttentionFamily, allow_none=True)
        check_mode(self.mode)
        check_type("site", self.site, str)
        check_type("weights_site", self.weights_site, str)
        check_int("num_samples", self.num_samples, 1, allow_none=True)
        self.dropout_p = check_real("dropout_p", self.dropout_p, ge=0.0, le=1.0)
        check_bool("record", self.record)
        check_type("gp", self.gp, SparseGP, allow_none=True)

    @property
    def draws(self) -> bool:
        """True when the weights are drawn (a family, not in ``"mean"`` mode)."""
        return self.family is not None and self.mode != "mean"

    def draw(self, logits: Tensor, log_prior: Tensor | None, q: Tensor, k: Tensor) -> Tensor:
        """One draw of the weights at this read's sites (the supports' :data:`Drawer`).

        Shape:
            logits ``(…, B, H, Tq, K)`` → weights ``(*S, …, B, H, Tq, K)``.
        """
        if self.family is None:
            raise ValueError("a read without a family has no draws: use mode='mean'")
        return sample_attention_weights(
            self.family, self.mode, logits, log_prior, q, k, site=self.site,
            weights_site=self.weights_site, num_samples=self.num_samples,
            kl_sink=self.kl_sink if self.kl_sink is not None else current_kl_collector(),
        )  # fmt: skip

    def _dropout(self, w: Tensor) -> Tensor:
        return F.dropout(w, self.dropout_p, training=True) if self.dropout_p > 0 else w

    def __call__(
        self,
        support: AttentionSupport,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        log_prior: object,
        key_padding_mask: Tensor | None = None,
        is_causal: bool = False,
        need_weights: bool = True,
    ) -> ReadOut:
        """The read of ``v`` over ``support`` (``log_prior`` as the support takes it:
        :meth:`AttentionSupport.log_prior`); the GP term is added to the output.

        Shape:
            q ``(…, B, H, Tq, Dh)``, k/v ``(…, B, H, Tk, Dh)`` → out ``(*S, …, B, H, Tq, Dh)``.
        """
        res = self._support_read(support, q, k, v, log_prior, key_padding_mask, is_causal,
                                 need_weights)  # fmt: skip
        return self._with_gp(res, q) if self.gp is not None else res

    def _support_read(
        self,
        support: AttentionSupport,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        log_prior: object,
        key_padding_mask: Tensor | None,
        is_causal: bool,
        need_weights: bool,
    ) -> ReadOut:
        if not need_weights and not self.record:  # the supports' lean paths
            if self.draws:
                out = support.sample_output(self.draw, q, k, v, log_prior, self.dropout_p)
            else:
                out = support.mean_output(q, k, v, log_prior, key_padding_mask, self.dropout_p)
            if out is not None:
                return ReadOut(out, drawn=self.draws)
        red, v_read = support.reduce(q, k, v, log_prior, key_padding_mask, is_causal)
        g, rows = red.global_support, red.global_rows
        gw: Tensor | None = None
        if not self.draws:
            w = support.posterior_weights(red)  # (…, B, H, Tq, K)
            gw = g.posterior_weights() if g is not None else None  # (…, B, H, Gq, Tk)
        else:
            w = self.draw(red.logits, red.log_prior, q, k)
            if g is not None and rows is not None:  # the global queries' rows: a second site
                with scope(prefix="global"):
                    gw = self.draw(g.logits, g.log_prior, q.index_select(-2, rows), k)
        recorded = self._recorded(w, gw, red) if self.record else None
        w, gw = self._dropout(w), (self._dropout(gw) if gw is not None else None)
        out = K.support_attend(w, red, v_read, global_weights=gw)  # (*S, …, B, H, Tq, Dh)
        return ReadOut(out, w, gw, red, recorded, self.draws)

    @staticmethod
    def _recorded(w: Tensor, gw: Tensor | None, red: K.ReducedSupport) -> Tensor:
        """The weights before dropout as ``(…, Tq, Tk)`` (over the slots for low rank)."""
        if red.index is None:
            return w.detach()
        rec = K.SupportWeights(
            w.detach(), red.index, red.num_keys, None, False, red.global_rows,
            None if gw is None else gw.detach(),
        )  # fmt: skip
        return rec.to_dense()

    def _with_gp(self, res: ReadOut, q: Tensor) -> ReadOut:
        r"""``out + f_h(q_i)``: the GP's global inducing keys, one GP draw per weight draw."""
        gp, S = self.gp, self.num_samples
        assert gp is not None
        if S is not None and res.drawn:  # the family drew S weights: S GP draws too
            qs = q.expand((S,) + q.shape)  # (S, …, B, H, Tq, Dh)
            res.out = res.out + gp(qs, leading_samples=S, mode=self.mode)
        elif S is None and q.dim() > 4:  # the input carries sample dims already:
            res.out = res.out + gp(q, leading_samples=q.shape[0], mode=self.mode)  # one per sample
        else:
            res.out = res.out + gp(q, num_samples=S, mode=self.mode)  # (S?, …, B, H, Tq, Dh)
            if S is not None and self.mode != "mean":
                res.drawn = True
                if res.weights is not None:
                    res.weights = res.weights.expand((S,) + res.weights.shape)  # S times
        return res

    def from_logits(
        self,
        logits: Tensor,
        log_prior: Tensor | None,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mean: Callable[[Tensor], Tensor],
    ) -> tuple[Tensor, Tensor]:
        """The read over every key from scores computed elsewhere (a model we did not write):
        ``mean(logits)`` in ``"mean"`` mode (the model's own softmax), else a draw; then
        dropout and attend.

        Shape:
            logits ``(B, H, Tq, Tk)``, v ``(B, H, Tk, Dv)`` → ``((B, H, Tq, Dv), (B, H, Tq, Tk))``.
        """
        w = self.draw(logits, log_prior, q, k) if self.draws else mean(logits)
        w = self._dropout(w)
        return torch.matmul(w, v), w
