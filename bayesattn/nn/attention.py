r"""``BayesianMultiheadAttention``: a drop-in for ``torch.nn.MultiheadAttention`` whose weights are a
posterior over which key each query reads.

* No family (or ``"mean"`` mode): the exact posterior mean
  :math:`y_i = \sum_j \operatorname{softmax}_j(\log\pi_{ij} + q_i\cdot k_j/\sqrt{d})\,v_j`; with a
  uniform prior this reproduces ``torch.nn.MultiheadAttention`` (same parameters, ``state_dict``,
  masks, outputs and weights). Uses the fused ``scaled_dot_product_attention`` when no weights are
  requested.
* With ``family=`` a family from :mod:`bayesattn.families`: the attention weights are a
  ``pyro.sample`` site ``"<module path>.latent"`` (``"latent"`` for a root layer) drawn from the
  family's weight model in ``"model"`` mode and from its amortised guide in ``"guide"`` mode;
  see :mod:`bayesattn.nn.modes`. Without a mode set the layer follows torch's ``train()``/
  ``eval()``: it draws in training mode and is the deterministic posterior mean in eval mode,
  unless draws are asked for (``num_samples=``, ``bayesattn.num_samples(S)``). In ``"model"`` mode the simplex weights are also
  recorded as the deterministic site ``"<path>.weights"``.

The module owns the torch surface (constructor, parameters, fast path, layouts); the argument
checks and masks are :mod:`bayesattn.nn.mha_checks`, and everything after the projections is one
:class:`~bayesattn.nn.read.AttentionRead` over the layer's support (:mod:`bayesattn.nn.supports`),
as torch splits ``nn.MultiheadAttention`` from ``F.multi_head_attention_forward``.

Shape glossary: ``S`` samples (leftmost), ``B`` batch, ``H`` heads, ``Tq``/``Tk`` query/key length,
``E`` embed dim, ``Dh = E / H``.
"""

from __future__ import annotations

from typing import Any

import torch
from pyro.nn import PyroModule
from torch import Tensor, nn

from .._deprecation import renamed_submodule_hook
from .._validation import check_int, check_real
from ..families import AttentionFamily, FamilyName, check_family, get_family
from ..functional.supports import SupportWeights
from ..priors import KeyRelevancePrior, UniformPrior
from .gp_read import SparseGP
from .linear import in_projections, linear
from .mha_checks import (
    CausalHintError,
    causal_hint,
    check_inputs,
    dense_outputs,
    pad_masks,
    pad_nested,
    renest,
    support_outputs,
    to_batch_first,
)
from .modes import AttentionMode, default_mode
from .read import AttentionRead
from .sampling import layer_num_samples
from .supports import DENSE, AttentionSupport, SupportName, get_support
from .torch_surface import (
    PRIOR_FAMILY_KEY,
    TorchMultiheadAttention,
    TorchSurface,
    mha_constructor_args,
)

__all__ = [
    "BayesianMultiheadAttention",
    "CausalHintError",
    "linear",
    "mha_constructor_args",
    "TorchMultiheadAttention",
]

def _allow_missing_prior_family(module: nn.Module, incompatible: Any) -> None:
    """Loading a ``torch.nn.MultiheadAttention`` state_dict leaves the prior's and the
    family's own parameters at their initial values instead of failing as missing keys."""
    # incompatible: torch's _IncompatibleKeys (Any: private, see tests/cross_cutting/test_private_apis.py)
    keep = [k for k in incompatible.missing_keys if not PRIOR_FAMILY_KEY.search(k)]
    incompatible.missing_keys[:] = keep


#: state_dicts saved before 0.3 hold the family under ``posterior.*``
_OLD_FAMILY_KEYS = renamed_submodule_hook("posterior", "family")
#: state_dicts saved before 0.5 hold the support under ``kernel.*``
_OLD_SUPPORT_KEYS = renamed_submodule_hook("kernel", "support")


def _own_forward_guard(module: nn.Module, args: tuple[Any, ...]) -> None:
    """Forward pre-hook that does nothing (kept so that layers pickled with it attached load;
    the fast path is chosen by :attr:`BayesianMultiheadAttention._qkv_same_embed_dim`)."""
    return None


def _check_family(family: Any, num_heads: int, head_dim: int) -> AttentionFamily | None:
    """A family name built for the layer, or a family checked against its heads."""
    if isinstance(family, str):
        family = get_family(family, num_heads=num_heads, head_dim=head_dim)
    elif family is not None and not isinstance(family, AttentionFamily):
        raise TypeError(
            f"family must be None, a family name or an AttentionFamily; got {type(family).__name__}"
        )
    if family is not None:
        check_family(family)  # a class that implements its extension points
    if family is not None and family.num_heads not in (1, num_heads):
        raise ValueError(f"family has {family.num_heads} heads but the layer has {num_heads}")
    return family


def _check_support(support: Any) -> AttentionSupport | None:
    """A support name built, or a support module checked (``None``/``"dense"``: every key)."""
    if isinstance(support, str) or support is None:
        return get_support(support)
    if not isinstance(support, AttentionSupport):
        raise TypeError(
            f"support must be None, a support name or an AttentionSupport; got {support!r}"
        )
    return support


def _check_gp(gp_read: Any, num_heads: int, head_dim: int, support: Any) -> SparseGP | None:
    """A GP read that maps each head's queries to head_dim outputs, over every key."""
    if gp_read is None:
        return None
    if not isinstance(gp_read, SparseGP):
        raise TypeError(f"gp_read must be None or a SparseGP; got {type(gp_read).__name__}")
    if (gp_read.groups, gp_read.in_dim, gp_read.out_dim) != (num_heads, head_dim, head_dim):
        raise ValueError(
            f"gp_read must map each of the {num_heads} heads' queries (head_dim "
            f"{head_dim}) to head_dim outputs; got groups={gp_read.groups}, "
            f"in_dim={gp_read.in_dim}, out_dim={gp_read.out_dim}"
        )
    if support is not None:
        raise ValueError("gp_read reads over every key; it does not combine with a support")
    return gp_read


class BayesianMultiheadAttention(TorchSurface, PyroModule):
    r"""Multi-head attention as posterior inference over the key each query reads.

    Args: as :class:`torch.nn.MultiheadAttention` (``embed_dim, num_heads, dropout=0.0, bias=True,
    add_bias_kv=False, add_zero_attn=False, kdim=None, vdim=None, batch_first=False, device=None,
    dtype=None``) plus

    Keyword Args:
        prior: a :class:`~bayesattn.priors.KeyRelevancePrior` added to the masks' log-prior
            (default uniform: plain softmax attention).
        family: ``None`` (deterministic), an :class:`~bayesattn.families.AttentionFamily`
            or a family name (``"dirichlet"``, ``"logistic_normal"``, ``"weibull"``,
            ``"concrete"``) built with ``num_heads`` heads.
        support: ``None``/``"dense"`` (every key), or a reduced key support
            (:mod:`bayesattn.nn.supports`): ``"local"``, ``"topk"``, ``"lowrank"`` (default
            options) or an :class:`~bayesattn.nn.supports.AttentionSupport` such as
            ``LocalSupport(window=64)``. On a reduced support, returned weights are a
            :class:`~bayesattn.functional.supports.SupportWeights`.
        gp_read: a :class:`~bayesattn.nn.gp_read.SparseGP` term added to the read (dense only).

    State_dicts saved before 0.3 with the family under ``posterior.*`` load as ``family.*``, and
    those saved before 0.5 with the support under ``kernel.*`` as ``support.*``.

    Shape:
        query ``(Tq, B, E)`` (``(B, Tq, E)`` if ``batch_first``; ``(Tq, E)`` unbatched; with
        ``batch_first`` any extra leading sample dims ``(*S, B, Tq, E)`` broadcast), key/value
        ``(Tk, B, kdim/vdim)``; without ``batch_first`` extra leading dims ``(*S, Tq, B, E)``
        are sample dims too. Returns ``(output, weights)``; output like query, weights
        ``(B, Tq, Tk)`` averaged over heads or ``(B, H, Tq, Tk)``; ``num_samples=S`` prepends
        ``S`` to both.

    Example:
        >>> mha = BayesianMultiheadAttention(16, 4, batch_first=True, family="dirichlet")
        >>> x = torch.randn(2, 5, 16)
        >>> y, w = mha(x, x, x, num_samples=8)  # 8 weight draws, projections computed once
        >>> y.shape, w.shape
        (torch.Size([8, 2, 5, 16]), torch.Size([8, 2, 5, 5]))
    """

    __constants__ = ["batch_first"]

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        add_bias_kv: bool = False,
        add_zero_attn: bool = False,
        kdim: int | None = None,
        vdim: int | None = None,
        batch_first: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        *,
        prior: KeyRelevancePrior | None = None,
        family: AttentionFamily | FamilyName | None = None,
        support: AttentionSupport | SupportName | None = None,
        gp_read: SparseGP | None = None,
    ) -> None:
        check_int("embed_dim", embed_dim, 1)
        check_int("num_heads", num_heads, 1)
        if embed_dim % num_heads != 0:
            raise ValueError(
                f"embed_dim must be divisible by num_heads; got embed_dim={embed_dim}, "
                f"num_heads={num_heads}"
            )
        check_real("dropout", dropout, ge=0.0, lt=1.0)
        check_int("kdim", kdim, 1, allow_none=True)
        check_int("vdim", vdim, 1, allow_none=True)
        if prior is not None and not isinstance(prior, KeyRelevancePrior):
            raise TypeError(f"prior must be a KeyRelevancePrior; got {type(prior).__name__}")
        super().__init__()
        self.embed_dim = embed_dim
        self.kdim = kdim if kdim is not None else embed_dim
        self.vdim = vdim if vdim is not None else embed_dim
        self._same_embed = self.kdim == embed_dim and self.vdim == embed_dim  # packed in_proj
        self.num_heads = num_heads
        self.dropout = float(dropout)
        self.batch_first = batch_first
        self.head_dim = embed_dim // num_heads
        self._init_parameters(bias, add_bias_kv, {"device": device, "dtype": dtype})
        self.add_zero_attn = add_zero_attn
        self._reset_parameters()
        self.prior = prior if prior is not None else UniformPrior()
        self.family = _check_family(family, num_heads, self.head_dim)
        self.support = _check_support(support)  # None: every key (the read uses DENSE)
        self.gp_read = _check_gp(gp_read, num_heads, self.head_dim, self.support)
        self.record_weights = False  # when True, forward keeps its weights in ``last_weights``
        self.last_weights: Tensor | None = None  # (…, B, H, Tq, Tk)
        self.register_load_state_dict_pre_hook(_OLD_FAMILY_KEYS)
        self.register_load_state_dict_pre_hook(_OLD_SUPPORT_KEYS)
        self.register_load_state_dict_post_hook(_allow_missing_prior_family)
        self._sync_fastpath_guard()

    def _init_parameters(self, bias: bool, add_bias_kv: bool, fk: dict[str, Any]) -> None:
        """torch's parameters, same names and shapes (packed ``in_proj_weight`` when q, k and v
        share the embed dim)."""
        E = self.embed_dim
        if not self._same_embed:
            self.q_proj_weight = nn.Parameter(torch.empty((E, E), **fk))
            self.k_proj_weight = nn.Parameter(torch.empty((E, self.kdim), **fk))
            self.v_proj_weight = nn.Parameter(torch.empty((E, self.vdim), **fk))
            self.register_parameter("in_proj_weight", None)
        else:
            self.in_proj_weight = nn.Parameter(torch.empty((3 * E, E), **fk))
            self.register_parameter("q_proj_weight", None)
            self.register_parameter("k_proj_weight", None)
            self.register_parameter("v_proj_weight", None)
        if bias:
            self.in_proj_bias = nn.Parameter(torch.empty(3 * E, **fk))
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = nn.Linear(E, E, bias=bias, **fk)
        if add_bias_kv:
            self.bias_k: nn.Parameter | None = nn.Parameter(torch.empty((1, 1, E), **fk))
            self.bias_v: nn.Parameter | None = nn.Parameter(torch.empty((1, 1, E), **fk))
        else:
            self.bias_k = self.bias_v = None

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        if (
            name in ("family", "prior", "record_weights", "gp_read")
            and "record_weights" in self.__dict__
        ):
            self._sync_fastpath_guard()

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Layers pickled before 0.5 hold their support as ``kernel``."""
        mods = state.get("_modules", {})
        if "kernel" in mods:
            mods["support"] = mods.pop("kernel")
        elif "kernel" in state:
            state["support"] = state.pop("kernel")
        super().__setstate__(state)

    def _sync_fastpath_guard(self) -> None:
        """Nothing to do (the fast path is decided by :attr:`_qkv_same_embed_dim` at call time);
        removes the guard hook of layers built before that."""
        hooks = self._forward_pre_hooks
        for k in [k for k, h in hooks.items() if h is _own_forward_guard]:
            del hooks[k]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # PyroModule.__call__ enters a Pyro context manager that torch.compile cannot trace;
        # a layer without Pyro parameters/samples needs none of it.
        if torch.compiler.is_compiling() and not self._pyro_params and not self._pyro_samples:
            return nn.Module.__call__(self, *args, **kwargs)
        return super().__call__(*args, **kwargs)

    def _projections(
        self, query: Tensor, key: Tensor, value: Tensor, self_attn: bool
    ) -> tuple[Tensor, Tensor, Tensor]:
        """``q, k, v`` ``(…, B, T, E)`` through torch's packed or separate input projections
        (the bias is read first: a sampled projection draws in that order)."""
        b: Tensor | None = self.in_proj_bias
        if self._same_embed:
            w = self.in_proj_weight
            E = self.embed_dim
            wq, wk, wv = w[..., :E, :], w[..., E : 2 * E, :], w[..., 2 * E :, :]
        else:
            w, wq, wk, wv = None, self.q_proj_weight, self.k_proj_weight, self.v_proj_weight
        return in_projections(query, key, value, (wq, wk, wv), b, w, self_attn)

    def _split_heads(self, x: Tensor) -> Tensor:
        *lead, T, _ = x.shape
        return x.reshape(*lead, T, self.num_heads, self.head_dim).transpose(-3, -2)  # (…, H, T, Dh)

    @property
    def is_bayesian(self) -> bool:
        """True when the layer has a family over its attention weights or a GP read."""
        return self.family is not None or self.gp_read is not None

    def mode(self, draws: bool = False) -> AttentionMode:
        """The effective mode: ``"mean"`` without a family or a GP read; else the context's
        (:func:`~bayesattn.nn.modes.attention_mode`) or, without one, torch's ``train()``/
        ``eval()`` (:func:`~bayesattn.nn.modes.default_mode`): ``"guide"`` in training mode,
        ``"mean"`` (the posterior mean, deterministic) in eval mode unless draws are asked for
        (``draws``: a ``num_samples`` keyword; or a ``bayesattn.num_samples(S)`` context).
        Inside ``torch.compile`` the contexts are read once, at trace time."""
        if not self.is_bayesian:
            return "mean"
        return default_mode(self.training, draws)

    def site_name(self, name: str) -> str:
        """The Pyro site ``"<module path>.<name>"`` of this layer (``name`` for a root layer):
        ``site_name("latent")`` holds the drawn latent, ``site_name("weights")`` the weights."""
        return self._pyro_get_fullname(name)

    def attention_read(self, num_samples: int | None) -> AttentionRead:
        """This call's :class:`~bayesattn.nn.read.AttentionRead`: the family, mode and sites of
        the layer, its attention dropout (training only), recording and GP term (a
        ``num_samples`` asks for draws, in eval mode too)."""
        mode = self.mode(draws=num_samples is not None)
        drawn = self.family is not None and mode != "mean"  # sites only where there are draws
        return AttentionRead(
            self.family,
            mode,
            self.site_name("latent") if drawn else "latent",
            self.site_name("weights") if drawn else "weights",
            num_samples,
            self.dropout if self.training else 0.0,
            self.record_weights,
            self.gp_read,
        )

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        key_padding_mask: Tensor | None = None,
        need_weights: bool = True,
        attn_mask: Tensor | None = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
        *,
        num_samples: int | None = None,
        q_pos: Tensor | None = None,
        k_pos: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | SupportWeights | None]:
        """See the class docstring. ``num_samples`` draws that many weight samples in one pass
        (in ``"mean"`` mode, or without a family, the ``S`` draws are identical: a view,
        so shapes do not depend on the mode); it is the layer's one way in for the sample count:
        left out, it defaults to ``bayesattn.num_samples(S)``'s ``S`` for a ``(B, T, E)`` input,
        and an input that already has leading sample dims gets one draw per entry
        (:func:`~bayesattn.nn.sampling.layer_num_samples`). ``q_pos``/``k_pos`` are positions
        passed to positional priors.

        ``is_causal`` follows torch: it is a hint that ``attn_mask`` is causal and needs that mask
        (``RuntimeError`` otherwise); without ``key_padding_mask`` and with ``need_weights=False``
        the causal structure is used, else the mask. NestedTensor inputs (batch-first, no masks)
        are padded, masked and returned as NestedTensors."""
        if any(isinstance(t, Tensor) and t.is_nested for t in (query, key, value)):
            return self._forward_nested(
                query, key, value, key_padding_mask, need_weights, attn_mask,
                average_attn_weights, is_causal, num_samples, q_pos, k_pos,
            )  # fmt: skip
        support = self.support if self.support is not None else DENSE
        attn_mask, is_causal = self._check_call(
            support, query, key, value, key_padding_mask, need_weights, attn_mask, is_causal
        )
        # the one way in: the keyword, defaulting to bayesattn.num_samples(S) for an input
        # without sample dims (bayesattn.nn.sampling.layer_num_samples)
        reads_context = query.dim() == 3 and self.is_bayesian
        num_samples = layer_num_samples(num_samples, reads_context=reads_context)
        self_attn = query is key and key is value
        unbatched = query.dim() == 2
        query, key, value, key_padding_mask = to_batch_first(
            query, key, value, key_padding_mask, unbatched, self.batch_first
        )  # (…, B, T, E)
        q, k, v, attn_mask, key_padding_mask = self._heads(
            query, key, value, attn_mask, key_padding_mask, self_attn
        )  # (…, B, H, T, Dh)
        extra_key = self.bias_k is not None or self.add_zero_attn
        support.check_options(attn_mask=attn_mask, is_causal=is_causal, prior=self.prior,
                              extra_key=extra_key)  # fmt: skip
        log_prior = support.log_prior(
            self.prior, attn_mask, key_padding_mask, is_causal, q, k, q_pos, k_pos
        )
        res = self.attention_read(num_samples)(
            support, q, k, v, log_prior, key_padding_mask, bool(is_causal) and attn_mask is None,
            need_weights,
        )  # fmt: skip
        if res.recorded is not None:
            self.last_weights = res.recorded
        out = self._merge_heads(res.out)  # (*S, …, B, Tq, E)
        if self.support is not None:
            return support_outputs(out, res, unbatched, self.batch_first, need_weights,
                                   average_attn_weights)  # fmt: skip
        return dense_outputs(out, res, num_samples, unbatched, self.batch_first, need_weights,
                             average_attn_weights)  # fmt: skip

    def _forward_nested(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        key_padding_mask: Tensor | None,
        need_weights: bool,
        attn_mask: Tensor | None,
        average_attn_weights: bool,
        is_causal: bool,
        num_samples: int | None,
        q_pos: Tensor | None,
        k_pos: Tensor | None,
    ) -> tuple[Tensor, Tensor | SupportWeights | None]:
        """:meth:`forward` of NestedTensor inputs (torch's ragged batches): padded and masked,
        the padded batch attended, the output returned as a NestedTensor."""
        q_pad, k_pad, v_pad, kpm, attn_mask, q_len = pad_nested(
            query, key, value, key_padding_mask, attn_mask, is_causal, self.batch_first
        )
        out, w = self.forward(
            q_pad, k_pad, v_pad, kpm, need_weights, attn_mask, average_attn_weights, False,
            num_samples=num_samples, q_pos=q_pos, k_pos=k_pos,
        )  # fmt: skip
        return renest(out, q_len, query.layout), w

    def _check_call(
        self,
        support: AttentionSupport,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        key_padding_mask: Tensor | None,
        need_weights: bool,
        attn_mask: Tensor | None,
        is_causal: bool,
    ) -> tuple[Tensor | None, bool]:
        """torch's calling convention, checked as torch checks it: ``is_causal`` as a hint
        about ``attn_mask`` (:func:`~bayesattn.nn.mha_checks.causal_hint`), then the inputs'
        shapes, dtypes and masks; returns the mask and causal flag to use."""
        hint_only = not support.supports_masks and support.supports_causal  # cluster_topk
        attn_mask, causal = causal_hint(
            attn_mask, key_padding_mask, is_causal, need_weights, hint_only
        )
        check_inputs(
            query, key, value, key_padding_mask, attn_mask,
            dims=(self.embed_dim, self.kdim, self.vdim), num_heads=self.num_heads,
            weight=self.out_proj.weight,
            reads_values=self.support is not None or self.is_bayesian,
        )  # fmt: skip
        return attn_mask, causal

    def _heads(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        attn_mask: Tensor | None,
        key_padding_mask: Tensor | None,
        self_attn: bool,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor | None, Tensor | None]:
        """Projected, per-head ``q, k, v`` ``(…, B, H, T, Dh)``, with torch's ``bias_k``/``bias_v``
        and ``add_zero_attn`` keys appended (and the masks padded to match)."""
        q, k, v = self._projections(query, key, value, self_attn)  # (…, B, T, E)
        if self.bias_k is not None and self.bias_v is not None:  # both or neither
            lead = k.shape[:-2]
            k = torch.cat([k, self.bias_k.reshape(1, 1, -1).expand(*lead, 1, -1)], dim=-2)
            v = torch.cat([v, self.bias_v.reshape(1, 1, -1).expand(*lead, 1, -1)], dim=-2)
            attn_mask, key_padding_mask = pad_masks(attn_mask, key_padding_mask)
        q, k, v = self._split_heads(q), self._split_heads(k), self._split_heads(v)  # (…,B,H,T,Dh)
        if self.add_zero_attn:
            k = torch.cat([k, k.new_zeros(k.shape[:-2] + (1, self.head_dim))], dim=-2)
            v = torch.cat([v, v.new_zeros(v.shape[:-2] + (1, self.head_dim))], dim=-2)
            attn_mask, key_padding_mask = pad_masks(attn_mask, key_padding_mask)
        return q, k, v, attn_mask, key_padding_mask

    def _merge_heads(self, out: Tensor) -> Tensor:
        """Heads concatenated and projected out: ``(…, B, H, Tq, Dh)`` → ``(…, B, Tq, E)``."""
        Tq = out.shape[-2]
        out = out.transpose(-3, -2).reshape(out.shape[:-3] + (Tq, self.embed_dim))  # (…,B,Tq,E)
        return linear(out, self.out_proj.weight, self.out_proj.bias)

    def extra_repr(self) -> str:
        fam = type(self.family).__name__ if self.family is not None else None
        return (
            f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, dropout={self.dropout}, "
            f"batch_first={self.batch_first}, family={fam}"
        )
