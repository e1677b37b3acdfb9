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
  see :mod:`bayesattn.nn.modes`. In ``"model"`` mode the simplex weights are also
  recorded as the deterministic site ``"<path>.weights"``.

Shape glossary: ``S`` samples (leftmost), ``B`` batch, ``H`` heads, ``Tq``/``Tk`` query/key length,
``E`` embed dim, ``Dh = E / H``.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from pyro.infer.util import is_validation_enabled
from pyro.nn import PyroModule
from torch import Tensor, nn

from .. import functional as BF
from .._deprecation import renamed_submodule_hook
from .._validation import (
    ShapeAssertionError,
    ShapeRuntimeError,
    check_finite,
    check_int,
    check_real,
    check_same_dtype,
)
from ..families import AttentionFamily, FamilyName, get_family
from ..functional.bayesian_read import add_key_prior
from ..priors import KeyRelevancePrior, UniformPrior
from .gp_read import SparseGP
from .modes import AttentionMode, context_mode, current_mode
from .sampling import layer_num_samples
from .supports import (
    AttentionKernel,
    KernelName,
    draw_attention_weights,
    get_kernel,
    kernel_attention,
)

if TYPE_CHECKING:
    from ..functional.supports import SupportWeights

__all__ = [
    "BayesianMultiheadAttention",
    "linear",
    "mha_constructor_args",
    "TorchMultiheadAttention",
]

#: torch's own class, bound at import: code that swaps ``torch.nn.MultiheadAttention`` for ours
#: (the drop-in recipe) still gets torch's layer from :meth:`BayesianMultiheadAttention.to_torch`
TorchMultiheadAttention = nn.MultiheadAttention


def linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """``x @ weight.T + bias`` that also broadcasts *sampled* weights with leading sample dims.

    ``x`` is read as a stack of ``(T, In)`` matrices with batch dims ``(*S, B)``. A sampled
    weight's batch dims are those of Pyro plates: ``(P, 1)`` (particle plate, data plate) lines up
    with ``(P, B)`` by broadcasting; a weight with fewer batch dims than ``x`` (e.g. ``(S,)`` from a
    sample plate) is aligned from the left (``S`` with ``S``). ``F.linear`` cannot do this: it
    needs a 2-D weight (DESIGN §5).

    Shape:
        x ``(*S, B, T, In)``, weight ``(Out, In)`` or ``(*S', Out, In)``, bias ``(Out,)`` or
        ``(*S', Out)``; output ``(*S, B, T, Out)``.
    """
    if weight.dim() == 2 and (bias is None or bias.dim() == 1):
        return F.linear(x, weight, bias)
    nb = x.dim() - 2  # batch dims of x as a stack of (T, In) matrices
    if weight.dim() == 3 and x.dim() == 4 and weight.shape[0] == x.shape[0] > 1:
        # one weight per sample: a batched GEMM (S, B·T, In) @ (S, In, Out), about 10x faster
        # on CPU than matmul broadcasting (S, B, T, In) against (S, 1, In, Out)
        S, B, T, In = x.shape
        x3, wt = x.reshape(S, B * T, In), weight.transpose(-1, -2)
        if bias is not None and bias.dim() == 1:  # the bias in the same kernel
            return torch.baddbmm(bias.to(x.dtype), x3, wt).reshape(S, B, T, -1)
        out = torch.bmm(x3, wt).reshape(S, B, T, -1)
    else:
        w = weight.reshape(weight.shape[:-2] + (1,) * (nb - (weight.dim() - 2)) + weight.shape[-2:])
        out = torch.matmul(x, w.transpose(-1, -2))  # (*S, B, T, Out)
    if bias is not None:
        out = out + bias.reshape(bias.shape[:-1] + (1,) * (nb + 2 - bias.dim()) + bias.shape[-1:])
    return out


def _check_dim(name: str, x: Tensor, expected: int) -> None:
    if x.shape[-1] != expected:
        # torch: an assert for the query, a RuntimeError from the key/value projection
        cls = ShapeAssertionError if name == "query" else ShapeRuntimeError
        raise cls(f"{name} last dim must be {expected}; got shape {tuple(x.shape)}")


def _allow_missing_prior_family(module: nn.Module, incompatible: Any) -> None:
    """Loading a ``torch.nn.MultiheadAttention`` state_dict leaves the prior's and the
    family's own parameters at their initial values instead of failing as missing keys."""
    # incompatible: torch's _IncompatibleKeys (Any: private, see tests/cross_cutting/test_private_apis.py)
    keep = [k for k in incompatible.missing_keys if not _PRIOR_FAMILY_KEY.search(k)]
    incompatible.missing_keys[:] = keep


_PRIOR_FAMILY_KEY = re.compile(r"(^|\.)(prior|family|kernel|gp_read)\.")
#: state_dicts saved before 0.3 hold the family under ``posterior.*``
_OLD_FAMILY_KEYS = renamed_submodule_hook("posterior", "family")


def _squeeze_support_batch(w: SupportWeights) -> None:
    """Drop the batch dim of size 1 of support weights, in place, for an unbatched call:
    ``(…, 1, H, Tq, K)`` → ``(…, H, Tq, K)`` (and the index, dropped mass, global rows alike)."""
    w.weights = w.weights.squeeze(-4)
    if w.index is not None and w.index.dim() >= 4:
        w.index = w.index.squeeze(-4)
    if w.dropped_mass is not None:
        w.dropped_mass = w.dropped_mass.squeeze(-3)
    if w.global_weights is not None:
        w.global_weights = w.global_weights.squeeze(-4)


class CausalHintError(RuntimeError, ValueError):
    """``is_causal=True`` without an ``attn_mask``: a ``RuntimeError`` with torch's message (code
    written for ``torch.nn.MultiheadAttention`` catches that) that is also a ``ValueError``
    (bad arguments are ``ValueError``s in this library)."""


_CAUSAL_HINT_ERROR = (
    "Need attn_mask if specifying the is_causal hint. You may use the Transformer module method "
    "`generate_square_subsequent_mask` to create this mask."
)  # torch's own message, raised in the same case


def _own_forward_guard(module: nn.Module, args: tuple[Any, ...]) -> None:
    """Forward pre-hook that does nothing (kept for code that imported it; no longer attached:
    the fast path is now chosen by :attr:`BayesianMultiheadAttention._qkv_same_embed_dim`)."""
    return None


def _check_finite(name: str, x: Tensor) -> None:
    """Finite check that also works inside ``torch.compile``/``torch.export`` graphs (there it
    is an in-graph assert: :func:`bayesattn._validation.check_finite`)."""
    check_finite(name, x)


def _nested_lengths(x: Tensor) -> list[int]:
    return [int(t.shape[0]) for t in x.unbind()]


def _lengths_to_padding_mask(lengths: list[int], T: int, device: torch.device) -> Tensor:
    """``(B, T)`` bool, True where a position is padding."""
    ar = torch.arange(T, device=device)  # (T,)
    return ar.unsqueeze(0) >= torch.tensor(lengths, device=device).unsqueeze(1)  # (B, T)


def mha_constructor_args(m: nn.Module) -> dict[str, Any]:
    """The constructor arguments that rebuild ``m`` (a ``torch.nn.MultiheadAttention`` or a
    :class:`BayesianMultiheadAttention`: they share these attributes) with the same shapes, on
    the same device and dtype; used to convert between the two."""
    if not isinstance(m, (TorchMultiheadAttention, BayesianMultiheadAttention)):
        raise TypeError(
            f"m must be a torch.nn.MultiheadAttention or a BayesianMultiheadAttention; got "
            f"{type(m).__name__}"
        )
    ref = m.in_proj_weight if m.in_proj_weight is not None else m.q_proj_weight
    return {
        "embed_dim": m.embed_dim,
        "num_heads": m.num_heads,
        "dropout": m.dropout,
        "bias": m.in_proj_bias is not None,
        "add_bias_kv": m.bias_k is not None,
        "add_zero_attn": m.add_zero_attn,
        "kdim": m.kdim,
        "vdim": m.vdim,
        "batch_first": m.batch_first,
        "device": ref.device,
        "dtype": ref.dtype,
    }


def _causal_hint(
    attn_mask: Tensor | None, key_padding_mask: Tensor | None, is_causal: bool, need_weights: bool
) -> tuple[Tensor | None, bool]:
    """torch's reading of ``is_causal``: a hint that ``attn_mask`` is causal, which it needs; the
    causal structure replaces the mask without padding and weights, else the mask is used."""
    if not is_causal:
        return attn_mask, False
    if attn_mask is None:
        raise CausalHintError(_CAUSAL_HINT_ERROR)
    if key_padding_mask is None and not need_weights:
        return None, True  # torch: the hint stands for the mask
    return attn_mask, False  # torch: the mask is used, the hint dropped


def _pad_masks(
    attn_mask: Tensor | None, key_padding_mask: Tensor | None
) -> tuple[Tensor | None, Tensor | None]:
    """Both masks widened by one allowed key (for ``bias_k`` or ``add_zero_attn``)."""
    attn_mask = F.pad(attn_mask, (0, 1)) if attn_mask is not None else None
    if key_padding_mask is not None:
        key_padding_mask = F.pad(key_padding_mask, (0, 1))
    return attn_mask, key_padding_mask


def _check_mask_dims(
    query: Tensor,
    key: Tensor,
    num_heads: int,
    key_padding_mask: Tensor | None,
    attn_mask: Tensor | None,
) -> None:
    """Mask dims as ``torch.nn.MultiheadAttention`` checks them (an ``AssertionError`` that is
    also a ``ValueError``), with torch's phrase in the message so code matching it still works."""
    if query.dim() not in (2, 3):
        return  # leading sample dims: our own extension, checked later
    batched = query.dim() == 3
    if key_padding_mask is not None and key_padding_mask.dim() != (2 if batched else 1):
        kpm_shape = "(B, Tk)" if batched else "(Tk,) for unbatched input"
        raise ShapeAssertionError(
            f"key_padding_mask must be {kpm_shape}; got shape {tuple(key_padding_mask.shape)} (torch: "
            f"expected `key_padding_mask` to be `None` or {2 if batched else 1}-D but found "
            f"{key_padding_mask.dim()}-D tensor instead)"
        )
    if attn_mask is None:
        return
    if attn_mask.dim() not in (2, 3, 4):
        raise ShapeAssertionError(
            f"attn_mask must be 2-D (Tq, Tk), 3-D (B*H, Tq, Tk) or 4-D (B, H, Tq, Tk); got shape "
            f"{tuple(attn_mask.shape)} (torch: expected `attn_mask` to be `None`, 2-D or 3-D but "
            f"found {attn_mask.dim()}-D tensor instead)"
        )
    if not batched and attn_mask.dim() == 3:
        want = (num_heads, query.shape[0], key.shape[0])
        if tuple(attn_mask.shape) != want:
            raise ShapeAssertionError(
                f"attn_mask 3-D shape must be (H, Tq, Tk) = {want} for unbatched input; got "
                f"{tuple(attn_mask.shape)} (torch: Expected `attn_mask` shape to be {want} but "
                f"got {torch.Size(attn_mask.shape)})"
            )


class BayesianMultiheadAttention(PyroModule):
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
        kernel: ``None``/``"dense"`` (every key), or an efficient kernel over a reduced key
            support (:mod:`bayesattn.nn.supports`): ``"local"``, ``"topk"``, ``"lowrank"`` (default
            options) or an :class:`~bayesattn.nn.supports.AttentionKernel` such as
            ``LocalKernel(window=64)``. With a kernel, returned weights are a
            :class:`~bayesattn.functional.supports.SupportWeights`.

    State_dicts saved before 0.3 with the family under ``posterior.*`` load as ``family.*``.

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
        kernel: AttentionKernel | KernelName | None = None,
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
        fk: dict[str, Any] = {"device": device, "dtype": dtype}
        self.embed_dim = embed_dim
        self.kdim = kdim if kdim is not None else embed_dim
        self.vdim = vdim if vdim is not None else embed_dim
        self._same_embed = self.kdim == embed_dim and self.vdim == embed_dim  # packed in_proj
        self.num_heads = num_heads
        self.dropout = float(dropout)
        self.batch_first = batch_first
        self.head_dim = embed_dim // num_heads

        if not self._same_embed:
            self.q_proj_weight = nn.Parameter(torch.empty((embed_dim, embed_dim), **fk))
            self.k_proj_weight = nn.Parameter(torch.empty((embed_dim, self.kdim), **fk))
            self.v_proj_weight = nn.Parameter(torch.empty((embed_dim, self.vdim), **fk))
            self.register_parameter("in_proj_weight", None)
        else:
            self.in_proj_weight = nn.Parameter(torch.empty((3 * embed_dim, embed_dim), **fk))
            self.register_parameter("q_proj_weight", None)
            self.register_parameter("k_proj_weight", None)
            self.register_parameter("v_proj_weight", None)
        if bias:
            self.in_proj_bias = nn.Parameter(torch.empty(3 * embed_dim, **fk))
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias, **fk)
        if add_bias_kv:
            self.bias_k: nn.Parameter | None = nn.Parameter(torch.empty((1, 1, embed_dim), **fk))
            self.bias_v: nn.Parameter | None = nn.Parameter(torch.empty((1, 1, embed_dim), **fk))
        else:
            self.bias_k = self.bias_v = None
        self.add_zero_attn = add_zero_attn
        self._reset_parameters()

        self.prior = prior if prior is not None else UniformPrior()
        if isinstance(family, str):
            family = get_family(family, num_heads=num_heads, head_dim=self.head_dim)
        elif family is not None and not isinstance(family, AttentionFamily):
            raise TypeError(
                f"family must be None, a family name or an AttentionFamily; "
                f"got {type(family).__name__}"
            )
        if family is not None and family.num_heads not in (1, num_heads):
            raise ValueError(f"family has {family.num_heads} heads but the layer has {num_heads}")
        self.family = family
        if isinstance(kernel, str) or kernel is None:
            kernel = get_kernel(kernel)
        elif not isinstance(kernel, AttentionKernel):
            raise TypeError(f"kernel must be None, a name or an AttentionKernel; got {kernel!r}")
        self.kernel = kernel  # None: dense attention
        if gp_read is not None:
            if not isinstance(gp_read, SparseGP):
                raise TypeError(f"gp_read must be None or a SparseGP; got {type(gp_read).__name__}")
            if (gp_read.groups, gp_read.in_dim, gp_read.out_dim) != (num_heads,) + (
                self.head_dim,
            ) * 2:
                raise ValueError(
                    f"gp_read must map each of the {num_heads} heads' queries (head_dim "
                    f"{self.head_dim}) to head_dim outputs; got groups={gp_read.groups}, "
                    f"in_dim={gp_read.in_dim}, out_dim={gp_read.out_dim}"
                )
            if kernel is not None:
                raise ValueError("gp_read reads over every key; it does not combine with a kernel")
        self.gp_read = gp_read  # None: the softmax read alone
        self.record_weights = False  # when True, forward keeps its weights in ``last_weights``
        self.last_weights: Tensor | None = None  # (…, B, H, Tq, Tk)
        self.register_load_state_dict_pre_hook(_OLD_FAMILY_KEYS)
        self.register_load_state_dict_post_hook(_allow_missing_prior_family)
        self._sync_fastpath_guard()

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        if (
            name in ("family", "prior", "record_weights", "gp_read")
            and "record_weights" in self.__dict__
        ):
            self._sync_fastpath_guard()

    def _matches_torch(self) -> bool:
        """True when torch's fused kernels compute exactly this layer *now*: uniform prior, no
        kernel, no GP read, weights not recorded, no sampled projections, and deterministic (no family) or
        in ``"mean"`` mode. Only then may torch's layers skip our ``forward``. (Read straight
        from the instance dicts: torch asks on every call, and ``PyroModule.__getattr__`` is
        slow.)"""
        d = self.__dict__
        mods = d["_modules"]
        if (
            d.get("record_weights")
            or d["_pyro_samples"]
            or mods.get("kernel", d.get("kernel")) is not None
            or mods.get("gp_read", d.get("gp_read")) is not None
            or not isinstance(mods.get("prior"), UniformPrior)
        ):
            return False
        if mods.get("family", d.get("family")) is None:
            return True
        # the mode is read from a context variable: inside torch.compile stay on our forward
        return not torch.compiler.is_compiling() and current_mode() == "mean"

    @property
    def _qkv_same_embed_dim(self) -> bool:
        """torch's attribute, read by ``torch.nn.TransformerEncoderLayer``/``TransformerEncoder``
        to choose their fused fast path (which reads the projections and never calls our
        ``forward``): True only when the projections are packed and :meth:`_matches_torch`.
        So a Bayesian layer in ``"mean"`` mode keeps torch's fast path, and one that draws
        weights (or has a prior, a kernel, recorded weights) turns it off. The layout itself
        is ``_same_embed``."""
        return bool(self._same_embed) and self._matches_torch()

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

    # ------------------------------------------------------------------------------------------
    def merge_masks(
        self, attn_mask: Tensor | None, key_padding_mask: Tensor | None, query: Tensor
    ) -> tuple[Tensor | None, int | None]:
        """As ``torch.nn.MultiheadAttention.merge_masks`` (called by torch's encoder layer on its
        fast path): one mask and its type, 0 ``attn_mask`` ``(T, T)``, 1 ``key_padding_mask``
        ``(B, T)``, 2 both merged to ``(B, H, T, T)``.

        Shape:
            query ``(B, T, E)``.
        """
        mask_type: int | None = None
        merged: Tensor | None = None
        if key_padding_mask is not None:
            mask_type, merged = 1, key_padding_mask
        if attn_mask is not None:
            B, T, _ = query.shape
            mask_type = 2
            if attn_mask.dim() == 3:
                am = attn_mask.view(B, -1, T, T)  # (B, H, T, T)
            else:
                am = attn_mask.view(1, 1, T, T).expand(B, self.num_heads, -1, -1)  # (B, H, T, T)
            merged = am
            if key_padding_mask is not None:
                kp = key_padding_mask.view(B, 1, 1, T).expand(-1, self.num_heads, -1, -1)
                merged = am + kp
        return merged, mask_type

    def to_torch(self) -> TorchMultiheadAttention:
        """The deterministic (posterior-mean) layer as a plain ``torch.nn.MultiheadAttention``
        with copies of the same parameters. Only a uniform prior has one."""
        if not isinstance(self.prior, UniformPrior):
            raise TypeError(
                f"to_torch: a layer with prior {type(self.prior).__name__} has no "
                "torch.nn.MultiheadAttention equivalent (only UniformPrior)"
            )
        m = TorchMultiheadAttention(**mha_constructor_args(self))
        sd = {k: v for k, v in self.state_dict().items() if not _PRIOR_FAMILY_KEY.search(k)}
        m.load_state_dict(sd)
        m.train(self.training)
        return m

    def __prepare_scriptable__(self) -> TorchMultiheadAttention:
        """``torch.jit.script`` scripts the posterior-mean layer (:meth:`to_torch`): TorchScript
        cannot compile Pyro sample sites, so a scripted layer is always deterministic."""
        return self.to_torch()

    def _reset_parameters(self) -> None:
        """Same initialisation as ``torch.nn.MultiheadAttention``."""
        if self._same_embed:
            nn.init.xavier_uniform_(self.in_proj_weight)
        else:
            nn.init.xavier_uniform_(self.q_proj_weight)
            nn.init.xavier_uniform_(self.k_proj_weight)
            nn.init.xavier_uniform_(self.v_proj_weight)
        if self.in_proj_bias is not None:
            nn.init.constant_(self.in_proj_bias, 0.0)
            nn.init.constant_(self.out_proj.bias, 0.0)
        if self.bias_k is not None and self.bias_v is not None:  # both or neither
            nn.init.xavier_normal_(self.bias_k)
            nn.init.xavier_normal_(self.bias_v)

    @property
    def is_bayesian(self) -> bool:
        """True when the layer has a family over its attention weights or a GP read."""
        return self.family is not None or self.gp_read is not None

    def mode(self) -> AttentionMode:
        """The effective mode: the context's (:func:`~bayesattn.nn.modes.attention_mode`) or the
        layer default (``"guide"`` with a family or a GP read, ``"mean"`` without)."""
        if not self.is_bayesian:
            return "mean"
        m = context_mode()  # read once at trace time inside torch.compile (compile in one mode)
        return "guide" if m is None else m

    # ------------------------------------------------------------------------------------------
    def _projections(
        self, query: Tensor, key: Tensor, value: Tensor, self_attn: bool
    ) -> tuple[Tensor, Tensor, Tensor]:
        E = self.embed_dim
        b: Tensor | None = self.in_proj_bias
        bq, bk, bv = (None, None, None) if b is None else (b[:E], b[E : 2 * E], b[2 * E :])
        if self._same_embed:
            w = self.in_proj_weight
            wq, wk, wv = w[..., :E, :], w[..., E : 2 * E, :], w[..., 2 * E :, :]
        else:
            wq, wk, wv = self.q_proj_weight, self.k_proj_weight, self.v_proj_weight
        if b is not None and b.dtype != wq.dtype:  # as torch's fused kernel: bias follows weights
            b = b.to(wq.dtype)
            bq, bk, bv = b[:E], b[E : 2 * E], b[2 * E :]
        if b is not None and b.dim() > 1:  # sampled biases (*S, 3E)
            bq, bk, bv = b[..., :E], b[..., E : 2 * E], b[..., 2 * E :]
        if self._same_embed and self_attn and w.dim() == 2 and (b is None or b.dim() == 1):
            q, k, v = F.linear(query, w, b).chunk(3, dim=-1)  # one matmul for self-attention
            return q, k, v
        return linear(query, wq, bq), linear(key, wk, bk), linear(value, wv, bv)

    def _split_heads(self, x: Tensor) -> Tensor:
        *lead, T, _ = x.shape
        return x.reshape(*lead, T, self.num_heads, self.head_dim).transpose(-3, -2)  # (…, H, T, Dh)

    def _validate(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        key_padding_mask: Tensor | None,
        attn_mask: Tensor | None,
    ) -> None:
        for name, t in (("query", query), ("key", key), ("value", value)):
            if not isinstance(t, Tensor):
                raise TypeError(f"{name} must be a torch.Tensor; got {type(t).__name__}")
            if not t.is_floating_point():
                raise TypeError(f"{name} must be floating point; got dtype {t.dtype}")
            if t.dim() < 2:
                raise ShapeAssertionError(
                    f"{name} must be 2-D (unbatched) or 3-D (batched); got shape {tuple(t.shape)}"
                )
            check_same_dtype(name, t, self.out_proj.weight.dtype, "BayesianMultiheadAttention")
            if t.device != self.out_proj.weight.device:
                raise ValueError(
                    f"{name} is on {t.device} but the layer's weights are on "
                    f"{self.out_proj.weight.device}: move the input or the layer (.to(device))"
                )
        if query.device.type == "meta" and (
            self.kernel is not None or self.family is not None or self.gp_read is not None
        ):
            raise ValueError(
                "meta tensors (no values) go through deterministic dense attention only: this "
                "layer has a kernel, a family or a GP read, whose reads look at the values"
            )
        if not (query.dim() == key.dim() == value.dim()):
            raise ShapeAssertionError(
                f"query, key and value must have the same number of dims; got "
                f"{tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)} (torch: "
                f"expected `key` and `value` to be {query.dim()}-D but found {key.dim()}-D and "
                f"{value.dim()}-D tensors respectively)"
            )
        _check_dim("query", query, self.embed_dim)
        _check_dim("key", key, self.kdim)
        _check_dim("value", value, self.vdim)
        if query.dim() < 2:
            raise ValueError(
                f"query must be 2-D (unbatched), 3-D (batched) or have leading sample dims; got "
                f"shape {tuple(query.shape)}"
            )
        if key.shape[:-1] != value.shape[:-1]:
            raise ShapeAssertionError(
                f"key and value must share all but the last dim; got key {tuple(key.shape)}, "
                f"value {tuple(value.shape)}"
            )
        for name, m in (("key_padding_mask", key_padding_mask), ("attn_mask", attn_mask)):
            if m is not None and not isinstance(m, Tensor):
                raise TypeError(f"{name} must be a Tensor or None; got {type(m).__name__}")
        _check_mask_dims(query, key, self.num_heads, key_padding_mask, attn_mask)
        if is_validation_enabled():
            _check_finite("query", query)
            if key is not query:
                _check_finite("key", key)
            if value is not key:
                _check_finite("value", value)

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
        kern = self.kernel
        if (
            is_causal
            and attn_mask is not None
            and kern is not None
            and not kern.supports_masks
            and kern.supports_causal
        ):
            # a kernel that takes is_causal but no attn_mask (cluster_topk): the causal mask
            # given with the hint is read as the hint, with or without padding
            attn_mask = None
        else:
            attn_mask, is_causal = _causal_hint(
                attn_mask, key_padding_mask, is_causal, need_weights
            )
        self._validate(query, key, value, key_padding_mask, attn_mask)
        # the one way in: the keyword, defaulting to bayesattn.num_samples(S) for an input
        # without sample dims (bayesattn.nn.sampling.layer_num_samples)
        reads_context = query.dim() == 3 and self.is_bayesian
        num_samples = layer_num_samples(num_samples, reads_context=reads_context)
        self_attn = query is key and key is value
        unbatched = query.dim() == 2
        query, key, value, key_padding_mask = self._batch_first(
            query, key, value, key_padding_mask, unbatched
        )  # (…, B, T, E)
        q, k, v, attn_mask, key_padding_mask = self._heads(
            query, key, value, attn_mask, key_padding_mask, self_attn
        )  # (…, B, H, T, Dh)
        if self.kernel is not None:  # efficient read over a reduced key support
            out, sw = kernel_attention(
                self, q, k, v, attn_mask, key_padding_mask, is_causal, q_pos, k_pos,
                need_weights, average_attn_weights, num_samples,
            )  # fmt: skip
            if unbatched and sw is not None:
                _squeeze_support_batch(sw)
            return self._to_caller_layout(self._merge_heads(out), unbatched), sw
        log_prior = self._log_prior(attn_mask, key_padding_mask, is_causal, q, k, q_pos, k_pos)
        mode = self.mode()
        wmode = mode if self.family is not None else "mean"  # how the weights are drawn
        out, w = self._read(wmode, q, k, v, log_prior, need_weights, num_samples)  # (…,B,H,Tq,·)
        drawn = wmode != "mean"  # out/w already carry num_samples draws
        if self.gp_read is not None:  # + f_h(q_i): global inducing keys, one draw per sample
            if num_samples is not None and drawn:  # the family drew S weights: S GP draws too
                qs = q.expand((num_samples,) + q.shape)  # (S, …, B, H, Tq, Dh)
                out = out + self.gp_read(qs, leading_samples=num_samples)
            elif num_samples is None and q.dim() > 4:  # the input carries sample dims already:
                out = out + self.gp_read(q, leading_samples=q.shape[0])  # one draw per sample
            else:
                out = out + self.gp_read(q, num_samples=num_samples)  # (S?, …, B, H, Tq, Dh)
                if num_samples is not None and mode != "mean":
                    drawn = True
                    if w is not None:
                        w = w.expand((num_samples,) + w.shape)  # the softmax weights, S times
        return self._outputs(
            out, w, "mean" if not drawn else "guide", num_samples, unbatched, need_weights,
            average_attn_weights,
        )  # fmt: skip

    def _batch_first(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        key_padding_mask: Tensor | None,
        unbatched: bool,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        """Inputs as ``(…, B, T, E)``: unbatched ``(T, E)`` gains a batch of one, sequence-first
        ``(…, T, B, E)`` is transposed; the batch sizes of query and key must agree."""
        if unbatched:  # (T, E) → (1, T, E)
            query, key, value = query.unsqueeze(0), key.unsqueeze(0), value.unsqueeze(0)
            if key_padding_mask is not None:
                if key_padding_mask.dim() != 1:
                    raise ShapeAssertionError(
                        f"key_padding_mask must be 1-D (Tk,) for unbatched input; got shape "
                        f"{tuple(key_padding_mask.shape)}"
                    )
                key_padding_mask = key_padding_mask.unsqueeze(0)
        elif not self.batch_first:  # (*S, T, B, E) → (*S, B, T, E)
            query, key, value = (x.transpose(-3, -2) for x in (query, key, value))
        if key.shape[-3] != query.shape[-3]:
            raise ShapeRuntimeError(
                f"query and key must have the same batch size; got query {tuple(query.shape)}, "
                f"key {tuple(key.shape)} (batch_first={self.batch_first})"
            )
        return query, key, value, key_padding_mask

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
            attn_mask, key_padding_mask = _pad_masks(attn_mask, key_padding_mask)
        q, k, v = self._split_heads(q), self._split_heads(k), self._split_heads(v)  # (…,B,H,T,Dh)
        if self.add_zero_attn:
            k = torch.cat([k, k.new_zeros(k.shape[:-2] + (1, self.head_dim))], dim=-2)
            v = torch.cat([v, v.new_zeros(v.shape[:-2] + (1, self.head_dim))], dim=-2)
            attn_mask, key_padding_mask = _pad_masks(attn_mask, key_padding_mask)
        return q, k, v, attn_mask, key_padding_mask

    def _log_prior(
        self,
        attn_mask: Tensor | None,
        key_padding_mask: Tensor | None,
        is_causal: bool,
        q: Tensor,
        k: Tensor,
        q_pos: Tensor | None,
        k_pos: Tensor | None,
    ) -> Tensor | None:
        """log π: the masks as a log-prior plus the key-relevance prior (``None``: uniform)."""
        log_prior = BF.mask_to_log_prior(
            attn_mask,
            key_padding_mask,
            is_causal,
            batch_size=q.shape[-4],
            num_heads=self.num_heads,
            tgt_len=q.shape[-2],
            src_len=k.shape[-2],
            dtype=q.dtype,
            device=q.device,
        )  # (B|1, H|1, Tq|1, Tk) or None
        if not isinstance(self.prior, UniformPrior):
            log_prior = add_key_prior(self.prior, log_prior, q, k, q_pos, k_pos)
        return log_prior

    def _read(
        self,
        mode: AttentionMode,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        log_prior: Tensor | None,
        need_weights: bool,
        num_samples: int | None,
    ) -> tuple[Tensor, Tensor | None]:
        """The attention read ``out = w @ v`` ``(…, B, H, Tq, Dh)`` and the weights ``w``
        ``(…, B, H, Tq, Tk)`` (exact posterior in ``"mean"`` mode, else drawn; ``None`` on the
        fused path, which never forms them)."""
        dropout_p = self.dropout if self.training else 0.0
        if mode == "mean" and not need_weights and not self.record_weights:
            return self._fused(q, k, v, log_prior, dropout_p), None  # (…, B, H, Tq, Dh)
        logits = BF.attention_logits(q, k)  # (…, B, H, Tq, Tk)
        if mode == "mean" and log_prior is None and not torch.is_grad_enabled():
            # inference: softmax in place over the fresh scores; skipping a new (B,H,Tq,Tk)
            # allocation (page faults) is most of the cost of returning weights at large T
            w = torch._softmax(logits, -1, False, out=logits)
        elif mode == "mean":
            w = BF.posterior_weights(logits, log_prior)
        else:
            # the Bayesian read (functional.bayesian_read) at this layer's sites, as on a support
            w = draw_attention_weights(self, mode, logits, log_prior, q, k, num_samples)
        if self.record_weights:
            self.last_weights = w.detach()  # before attention dropout: rows sum to 1
        if dropout_p > 0:
            w = F.dropout(w, dropout_p, training=True)  # returned like torch: after dropout
        return BF.attend(w, v), w  # (…, B, H, Tq, Dh)

    def _outputs(
        self,
        out: Tensor,
        w: Tensor | None,
        mode: AttentionMode,
        num_samples: int | None,
        unbatched: bool,
        need_weights: bool,
        average_attn_weights: bool,
    ) -> tuple[Tensor, Tensor | None]:
        """Heads merged and projected, back to the caller's layout; the weights as torch returns
        them (head-averaged unless ``average_attn_weights=False``; ``S`` identical copies of a
        deterministic read when ``num_samples`` is given)."""
        out = self._merge_heads(out)  # (…, B, Tq, E)
        if num_samples is not None and w is not None and mode == "mean":
            w = w.expand((num_samples,) + w.shape)  # deterministic: S identical draws
        if num_samples is not None and mode == "mean":
            out = out.expand((num_samples,) + out.shape)
        out = self._to_caller_layout(out, unbatched)
        if not need_weights or w is None:
            return out, None
        if average_attn_weights:
            w = w.mean(dim=-3)  # (…, B, Tq, Tk)
        if unbatched:
            w = w.squeeze(-3 if average_attn_weights else -4)
        return out, w

    def _merge_heads(self, out: Tensor) -> Tensor:
        """Heads concatenated and projected out: ``(…, B, H, Tq, Dh)`` → ``(…, B, Tq, E)``."""
        Tq = out.shape[-2]
        out = out.transpose(-3, -2).reshape(out.shape[:-3] + (Tq, self.embed_dim))  # (…,B,Tq,E)
        return linear(out, self.out_proj.weight, self.out_proj.bias)

    def _to_caller_layout(self, out: Tensor, unbatched: bool) -> Tensor:
        """``(…, B, Tq, E)`` back to the caller's layout: ``(…, Tq, E)`` unbatched, ``(…, Tq, B,
        E)`` sequence-first."""
        if unbatched:
            return out.squeeze(-3)
        if not self.batch_first:
            return out.transpose(-3, -2)  # (…, Tq, B, E)
        return out

    def site_name(self, name: str) -> str:
        """The Pyro site ``"<module path>.<name>"`` of this layer (``name`` for a root layer):
        ``site_name("latent")`` holds the drawn latent, ``site_name("weights")`` the weights."""
        return self._pyro_get_fullname(name)

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
        """NestedTensor inputs ``(B, T_b, E)``: pad, mask the padding, run, re-nest the output."""
        if not self.batch_first:
            raise ValueError("NestedTensor inputs need batch_first=True (they are batch-first)")
        if attn_mask is not None or key_padding_mask is not None:
            raise ValueError(
                "attn_mask/key_padding_mask are not supported with NestedTensor inputs: the "
                "nested lengths already define the padding"
            )
        if not (query.is_nested and key.is_nested and value.is_nested):
            raise ValueError("query, key and value must all be NestedTensors or all be Tensors")
        q_len = _nested_lengths(query)
        k_len = _nested_lengths(key)
        if _nested_lengths(value) != k_len:
            raise ValueError(f"key and value lengths differ: {k_len} vs {_nested_lengths(value)}")
        self_attn = query is key and key is value
        q = torch.nested.to_padded_tensor(query, 0.0)  # (B, Tq, E)
        k = q if self_attn else torch.nested.to_padded_tensor(key, 0.0)  # (B, Tk, kdim)
        v = k if self_attn else torch.nested.to_padded_tensor(value, 0.0)  # (B, Tk, vdim)
        kpm = _lengths_to_padding_mask(k_len, k.shape[1], k.device)  # (B, Tk)
        if is_causal:  # the nested form carries no mask: build torch's causal one
            Tq, Tk = q.shape[1], k.shape[1]
            attn_mask = torch.ones(Tq, Tk, dtype=torch.bool, device=q.device).triu(1)
        out, w = self.forward(
            q, k, v, kpm, need_weights, attn_mask, average_attn_weights, False,
            num_samples=num_samples, q_pos=q_pos, k_pos=k_pos,
        )  # fmt: skip
        # (…, B, Tq, E) padded → nested over the batch (sample dims stay in each component)
        pieces = [out[..., b, : q_len[b], :] for b in range(len(q_len))]
        return torch.nested.as_nested_tensor(pieces, layout=query.layout), w

    def _fused(self, q: Tensor, k: Tensor, v: Tensor, log_prior: Tensor | None, p: float) -> Tensor:
        """``F.scaled_dot_product_attention`` with rows that have no allowed key set to zero."""
        dead = None
        if log_prior is not None:
            dead = ~(log_prior > float("-inf")).any(-1, keepdim=True)  # (…, Tq|1, 1)
            if torch.compiler.is_compiling():  # no data-dependent branch in a graph
                log_prior = log_prior.masked_fill(dead, 0.0)
            elif bool(dead.any()):
                log_prior = log_prior.masked_fill(dead, 0.0)
            else:
                dead = None
        lead = q.shape[:-3]  # (…, B)
        if len(lead) > 1 and k.shape[:-2] == q.shape[:-2] and v.shape[:-2] == q.shape[:-2]:
            # torch's CPU flash kernel takes 4-D inputs only (5-D falls back to the math path,
            # several times slower): fold the sample dims into the batch
            def fold(t: Tensor) -> Tensor:
                return t.reshape((-1,) + t.shape[-3:])

            lp = None if log_prior is None else fold(log_prior.expand(lead + log_prior.shape[-3:]))
            out = F.scaled_dot_product_attention(
                fold(q), fold(k), fold(v), attn_mask=lp, dropout_p=p
            )
            out = out.reshape(q.shape[:-1] + v.shape[-1:])
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=log_prior, dropout_p=p)
        if dead is not None:
            out = out.masked_fill(dead, 0.0)
        return out

    def extra_repr(self) -> str:
        fam = type(self.family).__name__ if self.family is not None else None
        return (
            f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, dropout={self.dropout}, "
            f"batch_first={self.batch_first}, family={fam}"
        )
