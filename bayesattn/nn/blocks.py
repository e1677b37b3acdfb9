r"""Transformer encoder/decoder blocks built from :class:`BayesianMultiheadAttention`.

Parameter names follow ``torch.nn.TransformerEncoderLayer``/``TransformerDecoderLayer`` so their
``state_dict`` loads and, in deterministic (posterior-mean) mode, the outputs agree. Unlike torch
(DESIGN §5), the blocks always call our attention's ``forward``; there is no fused fast path that
skips it. The layers take torch's arguments in torch's order (``batch_first=False`` by default);
the stacks (:class:`Encoder`, :class:`Decoder`) are ``batch_first=True``: ``(B, T, E)``, with
optional extra leading sample dims ``(*S, B, T, E)``.

Which attentions are Bayesian, with which prior and family, is chosen per network by an
:class:`AttentionConfig`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, cast, get_args

import torch
import torch.nn.functional as F
from pyro.nn import PyroModule
from torch import Tensor, nn

from .. import priors as P
from .._validation import check_int, check_real
from ..families import FamilyName, get_family
from .attention import BayesianMultiheadAttention, linear
from .gp_read import SparseGP
from .supports import SupportName, get_support

if TYPE_CHECKING:
    from ..families import AttentionFamily
    from .supports import AttentionSupport

__all__ = ["AttentionConfig", "EncoderLayer", "DecoderLayer", "Encoder", "Decoder"]

#: A built-in key-relevance prior by name (:data:`bayesattn.priors.PRIORS` may hold more).
PriorName = Literal["uniform", "causal", "local", "alibi", "learned", "contextual"]
#: Which attention layers of a stack get the posterior (or a list of layer indices).
LayerSelection = Literal["all", "last"]
#: The attention of a decoder layer: its self-attention or its cross-attention.
AttentionKind = Literal["self", "cross"]
#: How a selected layer reads its values: softmax attention alone, or plus a sparse-GP read.
ReadName = Literal["softmax", "sparse_gp"]
#: A classifier's read-out of the pooled features: a linear layer (the GP read-outs and the
#: epinet were tried for issue 17 and dropped: docs/which-attention.md).
ReadoutName = Literal["linear"]
#: options of :class:`~bayesattn.nn.gp_read.SparseGP` that ``read_kwargs`` takes
_GP_KWARGS = (
    "num_inducing",
    "covariance",
    "lengthscale",
    "outputscale",
    "learn_lengthscale",
    "learn_outputscale",
    "init_scale",
    "init_mean",
    "init_from_data",
    "jitter",
)



def _pyro_module_list(modules: Sequence[nn.Module]) -> nn.ModuleList:
    """``PyroModule[nn.ModuleList](modules)`` (Pyro types ``PyroModule[T]`` as plain ``PyroModule``)."""
    return cast("type[nn.ModuleList]", PyroModule[nn.ModuleList])(modules)

@dataclass
class AttentionConfig:
    """Which attention layers are Bayesian and how.

    Args:
        family: a registered family name (``"dirichlet"``, ``"logistic_normal"``, ``"weibull"``,
            ``"concrete"`` or one added with :func:`~bayesattn.families.register_family`) or
            ``None`` for deterministic attention everywhere.
        prior: a registered prior name (``"uniform"``, ``"causal"``, ``"local"`` (``window`` in
            ``prior_kwargs``), ``"alibi"``, ``"learned"`` (``max_distance``), ``"contextual"`` or
            one added with :func:`~bayesattn.priors.register_prior`), or a callable
            ``(num_heads, head_dim) -> KeyRelevancePrior``.
        layers: ``"all"``, ``"last"`` or a list of layer indices that get the family.
        which: attentions that get it in decoder layers: ``("self", "cross")`` or a subset.
        support: ``None`` (dense) or a registered reduced key support for every *self*-attention
            layer: ``"local"`` (``window``), ``"topk"`` (``k``), ``"lowrank"`` (``rank``,
            ``max_len``), … or one added with :func:`~bayesattn.nn.supports.register_support`,
            options in ``support_kwargs``; see :mod:`bayesattn.nn.supports`.
        read: ``"softmax"`` or ``"sparse_gp"``: the selected layers (``layers``/``which``) add a
            sparse-GP read per head with global inducing keys
            (:class:`~bayesattn.nn.gp_read.SparseGP`; options such as ``num_inducing`` in
            ``read_kwargs``), with or without a ``family``.
        readout: ``"linear"`` (the only value; ``readout_kwargs`` must stay empty): a
            classifier's logits are a linear layer of its pooled (CLS) features. The GP
            read-outs ``"sparse_gp"`` and ``"random_features"`` and the ``"epinet"`` head were
            tried and dropped (0.4 and 0.5; their numbers are in docs/which-attention.md): use
            ``read="sparse_gp"`` or, for a trained network,
            :func:`~bayesattn.interop.posthoc_gp.fit_posthoc_gp`.

    Names resolve through the registries (:mod:`bayesattn.registry`) when the config is made, so
    user-registered families, priors and supports work in every network built from it.
    """

    family: FamilyName | str | None = None
    prior: PriorName | str | Callable[[int, int], P.KeyRelevancePrior] = "uniform"
    layers: LayerSelection | Sequence[int] = "all"
    which: AttentionKind | Sequence[AttentionKind] = ("self", "cross")
    family_kwargs: dict = field(default_factory=dict)
    prior_kwargs: dict = field(default_factory=dict)
    support: SupportName | str | None = None
    support_kwargs: dict = field(default_factory=dict)
    read: ReadName = "softmax"
    read_kwargs: dict = field(default_factory=dict)
    readout: ReadoutName = "linear"
    readout_kwargs: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        get_support(self.support, **self.support_kwargs)  # validates the name and options
        self._check_gp_options()
        if self.family is not None and not isinstance(self.family, str):
            raise TypeError(f"family must be a family name or None; got {self.family!r}")
        if not isinstance(self.prior, str) and not callable(self.prior):
            raise TypeError(
                f"prior must be one of {P.list_priors()} or a callable; got {self.prior!r}"
            )
        if isinstance(self.prior, str):
            P.PRIORS.get(self.prior, argument="prior")  # ValueError listing the registered ones
        if isinstance(self.layers, str):
            if self.layers not in get_args(LayerSelection):
                raise ValueError(
                    f"layers must be 'all', 'last' or a list of ints; got {self.layers!r}"
                )
        elif not isinstance(self.layers, Sequence):
            raise TypeError(
                f"layers must be 'all', 'last' or a list of ints; got {self.layers!r}"
            )
        else:
            for i in self.layers:
                check_int("layers[i]", i)
        if isinstance(self.which, str):
            self.which = (self.which,)
        bad = set(self.which) - set(get_args(AttentionKind))
        if bad:
            raise ValueError(f"which must contain only 'self'/'cross'; got {sorted(bad)}")
        for name in ("family_kwargs", "prior_kwargs"):
            if not isinstance(getattr(self, name), dict):
                raise TypeError(f"{name} must be a dict; got {getattr(self, name)!r}")
        if callable(self.prior) and self.prior_kwargs:
            raise ValueError(
                "prior_kwargs are for named priors; a callable prior gets (num_heads, head_dim) "
                f"only; got prior_kwargs={self.prior_kwargs!r}"
            )
        if isinstance(self.prior, str):
            takes = P.prior_arguments(self.prior)  # None: the factory takes any keyword
            unknown = [] if takes is None else sorted(set(self.prior_kwargs) - set(takes))
            if unknown:
                raise ValueError(
                    f"prior_kwargs {unknown} are not arguments of prior {self.prior!r}; it takes "
                    f"{list(takes or ())}"
                )
            self.build_prior(1, 1)  # validates the values
        if self.family is not None:
            # validates the name and family_kwargs (names and values)
            get_family(self.family, num_heads=1, head_dim=1, **self.family_kwargs)
        elif self.family_kwargs:
            raise ValueError(
                f"family_kwargs {sorted(self.family_kwargs)} given without a family"
            )

    def _check_gp_options(self) -> None:
        for name, value, allowed in (
            ("read", self.read, get_args(ReadName)),
            ("readout", self.readout, get_args(ReadoutName)),
        ):
            if value not in allowed:
                raise ValueError(f"{name} must be one of {allowed}; got {value!r}")
            kw = getattr(self, f"{name}_kwargs")
            if not isinstance(kw, dict):
                raise TypeError(f"{name}_kwargs must be a dict; got {kw!r}")
            if kw and value in ("softmax", "linear"):
                raise ValueError(f"{name}_kwargs {sorted(kw)} given with {name}={value!r}")
            unknown = sorted(set(kw) - set(_GP_KWARGS))  # only read="sparse_gp" takes options
            if unknown:
                raise ValueError(
                    f"{name}_kwargs {unknown} are not options of {name}={value!r}; it takes "
                    f"{list(_GP_KWARGS)}"
                )
        if self.read == "sparse_gp":
            SparseGP(1, 1, 1, **self.read_kwargs)  # validates the values
        if self.read == "sparse_gp" and self.support is not None:
            raise ValueError(
                f"read='sparse_gp' reads over every key; it does not combine with "
                f"support={self.support!r}"
            )

    @property
    def _selects(self) -> bool:
        """Whether the selected layers get anything (a family or a GP read)."""
        return self.family is not None or self.read != "softmax"

    def build_readout(self, in_dim: int, num_classes: int) -> nn.Module:
        """A classifier's read-out of its pooled features: ``nn.Linear(in_dim, num_classes)``."""
        return nn.Linear(in_dim, num_classes)

    def check_layers(self, num_layers: int) -> None:
        """Every index in ``layers`` must name one of ``num_layers`` layers (negative indices
        count from the end, as in Python)."""
        if isinstance(self.layers, str) or not self._selects:
            return
        bad = [i for i in self.layers if not -num_layers <= i < num_layers]
        if bad:
            raise ValueError(
                f"AttentionConfig.layers {list(self.layers)} names layers {bad} of a stack with "
                f"{num_layers} layer(s) (valid: 0..{num_layers - 1} or negative from the end)"
            )

    @classmethod
    def recommended(cls, **overrides: Any) -> AttentionConfig:
        r"""The library's recommended Bayesian attention (the study's ``recommended`` method).

        Logistic-normal weights in the **last** layer only, with an input-dependent scale and a
        weight model centred on the softmax attention (``model_location="attention"``):

        .. math:: y_{ij}\sim\mathcal N(\log\bar p_{ij}, \sigma_0^2)\ \text{(weight model)},\qquad
                  y_{ij}\sim\mathcal N(\log\bar p_{ij}, \sigma_{hi}(q_i)^2)\ \text{(guide)},
                  \qquad w_i = \operatorname{softmax}(y_i).

        Why: the KL then measures spread only (no price for attention being sharp), the latents
        are few (with CLS pooling only the CLS row of the last layer reaches the output: ``H``
        rows per example), so the plain ELBO (``kl_weight=1``) trains without collapse; and
        everything before the last layer is computed once for all posterior samples, so ``S``
        samples cost little more than one deterministic pass (``benchmarks/predictive_speed.py``,
        ``docs/which-attention.md``). Keyword arguments override fields.
        """
        kw: dict = dict(
            family="logistic_normal",
            layers="last",
            family_kwargs={"input_dependent": True, "model_location": "attention"},
        )
        kw.update(overrides)
        return cls(**kw)

    def is_bayesian(self, index: int, num_layers: int, kind: AttentionKind = "self") -> bool:
        if not self._selects or kind not in self.which:
            return False
        if self.layers == "all":
            return True
        if self.layers == "last":
            return index == num_layers - 1
        self.check_layers(num_layers)
        return index in {i % num_layers for i in self.layers}

    def build_prior(self, num_heads: int, head_dim: int) -> P.KeyRelevancePrior:
        """The self-attention prior: ``prior(num_heads, head_dim)`` for a callable, else the
        registered prior of that name (:func:`bayesattn.priors.build_prior`)."""
        if callable(self.prior):
            return self.prior(num_heads, head_dim)
        return P.build_prior(self.prior, num_heads, head_dim, **self.prior_kwargs)

    def build(
        self,
        embed_dim: int,
        num_heads: int,
        index: int,
        num_layers: int,
        kind: AttentionKind,
        **mha_kwargs: Any,
    ) -> BayesianMultiheadAttention:
        head_dim = embed_dim // num_heads
        bayes = self.is_bayesian(index, num_layers, kind)
        family = (
            get_family(self.family, num_heads, head_dim, **self.family_kwargs)
            if bayes and self.family is not None  # is_bayesian: False without a family
            else None
        )
        prior = self.build_prior(num_heads, head_dim) if kind == "self" else P.UniformPrior()
        support = get_support(self.support, **self.support_kwargs) if kind == "self" else None
        gp = (
            SparseGP(num_heads, head_dim, head_dim, **self.read_kwargs)
            if bayes and self.read == "sparse_gp"
            else None
        )
        return BayesianMultiheadAttention(
            embed_dim, num_heads, batch_first=True, prior=prior, family=family, support=support,
            gp_read=gp, **mha_kwargs,
        )  # fmt: skip


def _activation(name: str | Callable[[Tensor], Tensor]) -> Callable[[Tensor], Tensor]:
    if callable(name):
        return name
    if name == "relu":
        return F.relu
    if name == "gelu":
        return F.gelu
    raise ValueError(f"activation must be 'relu', 'gelu' or a callable; got {name!r}")


def as_attention_config(attention: AttentionConfig | FamilyName | None) -> AttentionConfig:
    """``None`` → deterministic attention; a family name (``"dirichlet"``) is shorthand for
    ``AttentionConfig(family=name)``; an :class:`AttentionConfig` is used as is."""
    if attention is None:
        return AttentionConfig()
    if isinstance(attention, str):
        return AttentionConfig(family=attention)
    if not isinstance(attention, AttentionConfig):
        raise TypeError(
            f"attention must be an AttentionConfig, a family name or None; got "
            f"{type(attention).__name__}"
        )
    return attention


def _check_block_args(d_model: int, nhead: int, dim_feedforward: int, dropout: float) -> None:
    check_int("d_model", d_model, 1)
    check_int("nhead", nhead, 1)
    check_int("dim_feedforward", dim_feedforward, 1)
    check_real("dropout", dropout, ge=0.0, lt=1.0)
    if d_model % nhead != 0:
        raise ValueError(
            f"d_model must be divisible by nhead; got d_model={d_model}, nhead={nhead}"
        )


class _FeedForward(PyroModule):
    """Shared parts of a block: self-attention sub-block and feed-forward half
    (``linear1 → act → dropout → linear2``)."""

    def _sa_block(
        self,
        x: Tensor,
        attn_mask: Tensor | None,
        key_padding_mask: Tensor | None,
        is_causal: bool,
    ) -> Tensor:
        y = self.self_attn(
            x,
            x,
            x,
            attn_mask=attn_mask,
            key_padding_mask=key_padding_mask,
            need_weights=False,
            is_causal=is_causal,
        )[0]
        return self.dropout1(y)

    _ff_dropout = "dropout2"  # torch's name of the dropout after the feed-forward sub-block

    def _ff_block(self, x: Tensor) -> Tensor:
        h = self.dropout(self.activation(linear(x, self.linear1.weight, self.linear1.bias)))
        out = linear(h, self.linear2.weight, self.linear2.bias)
        return getattr(self, self._ff_dropout)(out)

    def _init_ff(
        self,
        d_model: int,
        dim_feedforward: int,
        dropout: float,
        activation: str | Callable[[Tensor], Tensor],
        bias: bool,
        fk: dict[str, Any],
    ) -> None:
        self.linear1 = nn.Linear(d_model, dim_feedforward, bias=bias, **fk)
        self.dropout = nn.Dropout(dropout)
        self.linear2 = nn.Linear(dim_feedforward, d_model, bias=bias, **fk)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)
        self.activation = _activation(activation)


class EncoderLayer(_FeedForward):
    r"""Self-attention + feed-forward block; ``norm_first`` picks pre- or post-norm.

    Arguments are ``torch.nn.TransformerEncoderLayer``'s, in its positional order (``batch_first``
    included, default ``False`` as in torch), then keyword-only ``attn_dropout``, ``prior`` and
    ``family`` for the self-attention.

    Post-norm: :math:`x \leftarrow \mathrm{LN}(x + \mathrm{SA}(x))`,
    :math:`x \leftarrow \mathrm{LN}(x + \mathrm{FF}(x))`; pre-norm: :math:`x \leftarrow x +
    \mathrm{SA}(\mathrm{LN}(x))`, :math:`x \leftarrow x + \mathrm{FF}(\mathrm{LN}(x))`.

    Shape:
        src ``(T, B, E)``, or ``(*S, B, T, E)`` with ``batch_first`` → same.
    """

    def __init__(
        self,
        d_model: int,
        nhead: int,
        dim_feedforward: int = 2048,
        dropout: float = 0.1,
        activation: str | Callable[[Tensor], Tensor] = "relu",
        layer_norm_eps: float = 1e-5,
        batch_first: bool = False,
        norm_first: bool = False,
        bias: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        *,
        attn_dropout: float | None = None,
        prior: P.KeyRelevancePrior | None = None,
        family: AttentionFamily | FamilyName | None = None,
        support: AttentionSupport | SupportName | None = None,
        gp_read: SparseGP | None = None,
    ) -> None:
        _check_block_args(d_model, nhead, dim_feedforward, dropout)
        super().__init__()
        fk: dict[str, Any] = {"device": device, "dtype": dtype}
        self.self_attn = BayesianMultiheadAttention(
            d_model,
            nhead,
            dropout=dropout if attn_dropout is None else attn_dropout,
            bias=bias,
            batch_first=batch_first,
            prior=prior,
            family=family,
            support=support,
            gp_read=gp_read,
            **fk,
        )
        self._init_ff(d_model, dim_feedforward, dropout, activation, bias, fk)
        self.norm_first = norm_first
        self.norm1 = nn.LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **fk)
        self.norm2 = nn.LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **fk)

    def forward(
        self,
        src: Tensor,
        src_mask: Tensor | None = None,
        src_key_padding_mask: Tensor | None = None,
        is_causal: bool = False,
    ) -> Tensor:
        x = src
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), src_mask, src_key_padding_mask, is_causal)
            x = x + self._ff_block(self.norm2(x))
        else:
            x = self.norm1(x + self._sa_block(x, src_mask, src_key_padding_mask, is_causal))
            x = self.norm2(x + self._ff_block(x))
        return x

    def forward_rows(
        self,
        src: Tensor,
        rows: int,
        src_key_padding_mask: Tensor | None = None,
        num_samples: int | None = None,
    ) -> Tensor:
        """The layer's output for its first ``rows`` query tokens only (keys and values: every
        token): equal to ``forward(src, src_key_padding_mask=...)[..., :rows, :]`` without the
        other rows' work (attention rows, feed-forward and LayerNorm act per token). A CLS
        read-out needs ``rows=1``. ``num_samples`` draws that many attention samples in one pass
        from the shared input (stochastic modes).

        Shape:
            src ``(*S, B, T, E)`` → ``(*S | num_samples, B, rows, E)``; needs ``batch_first``.
        """
        if not self.self_attn.batch_first:
            raise ValueError(
                "forward_rows needs a batch_first=True layer (src (*S, B, T, E)); this layer "
                f"has batch_first=False, got src of shape {tuple(src.shape)}"
            )
        check_int("rows", rows, 1, src.shape[-2])

        def attend(q: Tensor, kv: Tensor) -> Tensor:
            y = self.self_attn(
                q,
                kv,
                kv,
                key_padding_mask=src_key_padding_mask,
                need_weights=False,
                num_samples=num_samples,
            )[0]
            return self.dropout1(y)

        x = src[..., :rows, :]  # (…, B, rows, E)
        if self.norm_first:
            kv = self.norm1(src)
            x = x + attend(kv[..., :rows, :], kv)
            return x + self._ff_block(self.norm2(x))
        x = self.norm1(x + attend(x, src))
        return self.norm2(x + self._ff_block(x))


class DecoderLayer(_FeedForward):
    r"""Causal self-attention, cross-attention to the encoder memory (fusing two evidence sources),
    feed-forward; pre- or post-norm like :class:`EncoderLayer`.

    Arguments are ``torch.nn.TransformerDecoderLayer``'s, in its positional order (``batch_first``
    default ``False`` as in torch), then keyword-only ``attn_dropout`` and ``self_``/``cross_``
    ``prior``/``family``.

    Shape:
        tgt ``(Tt, B, E)``, memory ``(Ts, B, E)``; with ``batch_first`` tgt ``(*S, B, Tt, E)``,
        memory ``(*S, B, Ts, E)`` → like tgt.
    """

    _ff_dropout = "dropout3"

    def __init__(
        self,
        d_model: int,
        nhead: int,
        dim_feedforward: int = 2048,
        dropout: float = 0.1,
        activation: str | Callable[[Tensor], Tensor] = "relu",
        layer_norm_eps: float = 1e-5,
        batch_first: bool = False,
        norm_first: bool = False,
        bias: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        *,
        attn_dropout: float | None = None,
        self_prior: P.KeyRelevancePrior | None = None,
        self_family: AttentionFamily | FamilyName | None = None,
        cross_prior: P.KeyRelevancePrior | None = None,
        cross_family: AttentionFamily | FamilyName | None = None,
        self_support: AttentionSupport | SupportName | None = None,
    ) -> None:
        _check_block_args(d_model, nhead, dim_feedforward, dropout)
        super().__init__()
        fk: dict[str, Any] = {"device": device, "dtype": dtype}
        ad = dropout if attn_dropout is None else attn_dropout
        self.self_attn = BayesianMultiheadAttention(
            d_model,
            nhead,
            ad,
            bias,
            batch_first=batch_first,
            prior=self_prior,
            family=self_family,
            support=self_support,
            **fk,
        )
        self.multihead_attn = BayesianMultiheadAttention(
            d_model,
            nhead,
            ad,
            bias,
            batch_first=batch_first,
            prior=cross_prior,
            family=cross_family,
            **fk,
        )
        self._init_ff(d_model, dim_feedforward, dropout, activation, bias, fk)
        self.norm_first = norm_first
        self.norm1 = nn.LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **fk)
        self.norm2 = nn.LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **fk)
        self.norm3 = nn.LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **fk)
        self.dropout3 = nn.Dropout(dropout)

    def _mha_block(
        self,
        x: Tensor,
        mem: Tensor,
        attn_mask: Tensor | None,
        key_padding_mask: Tensor | None,
        is_causal: bool,
    ) -> Tensor:
        y = self.multihead_attn(
            x,
            mem,
            mem,
            attn_mask=attn_mask,
            key_padding_mask=key_padding_mask,
            need_weights=False,
            is_causal=is_causal,
        )[0]
        return self.dropout2(y)

    def forward(
        self,
        tgt: Tensor,
        memory: Tensor,
        tgt_mask: Tensor | None = None,
        memory_mask: Tensor | None = None,
        tgt_key_padding_mask: Tensor | None = None,
        memory_key_padding_mask: Tensor | None = None,
        tgt_is_causal: bool = False,
        memory_is_causal: bool = False,
    ) -> Tensor:
        x = tgt
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), tgt_mask, tgt_key_padding_mask, tgt_is_causal)
            x = x + self._mha_block(
                self.norm2(x), memory, memory_mask, memory_key_padding_mask, memory_is_causal
            )
            x = x + self._ff_block(self.norm3(x))
        else:
            x = self.norm1(x + self._sa_block(x, tgt_mask, tgt_key_padding_mask, tgt_is_causal))
            x = self.norm2(
                x
                + self._mha_block(x, memory, memory_mask, memory_key_padding_mask, memory_is_causal)
            )
            x = self.norm3(x + self._ff_block(x))
        return x


def _block_kwargs(kw: dict) -> dict:
    allowed = {
        "dim_feedforward",
        "dropout",
        "activation",
        "layer_norm_eps",
        "norm_first",
        "bias",
        "attn_dropout",
    }
    bad = set(kw) - allowed
    if bad:
        raise TypeError(f"unexpected block arguments {sorted(bad)}; allowed: {sorted(allowed)}")
    return kw


def _self_attention_layer(
    cfg: AttentionConfig, d_model: int, nhead: int, i: int, num_layers: int, kw: dict[str, Any]
) -> EncoderLayer:
    """Layer ``i`` of ``num_layers``: an :class:`EncoderLayer` whose self-attention ``cfg``
    builds (batch-first, as every block of ours)."""
    a = cfg.build(d_model, nhead, i, num_layers, "self")
    return EncoderLayer(
        d_model, nhead, batch_first=True, prior=a.prior, family=a.family, support=a.support,
        gp_read=a.gp_read, **kw,
    )  # fmt: skip


class Encoder(PyroModule):
    """A stack of :class:`EncoderLayer` (each built separately: distinct Pyro sites and
    family parameters), with a final LayerNorm when ``norm_first`` (pre-norm).

    Shape:
        src ``(*S, B, T, E)`` → same.
    """

    def __init__(
        self,
        d_model: int,
        nhead: int,
        num_layers: int,
        attention: AttentionConfig | None = None,
        **block_kwargs: Any,
    ) -> None:
        check_int("num_layers", num_layers, 1)
        super().__init__()
        cfg = as_attention_config(attention)
        cfg.check_layers(num_layers)
        kw = _block_kwargs(block_kwargs)
        layers = []
        for i in range(num_layers):
            layers.append(_self_attention_layer(cfg, d_model, nhead, i, num_layers, kw))
        self.layers = _pyro_module_list(layers)
        self.norm = nn.LayerNorm(d_model) if kw.get("norm_first", False) else None

    def forward(
        self,
        src: Tensor,
        mask: Tensor | None = None,
        src_key_padding_mask: Tensor | None = None,
        is_causal: bool = False,
    ) -> Tensor:
        x = src
        for layer in self.layers:
            x = layer(x, mask, src_key_padding_mask, is_causal)
        return self.norm(x) if self.norm is not None else x


class Decoder(PyroModule):
    """A stack of :class:`DecoderLayer` with causal self-attention; final LayerNorm if pre-norm.

    With ``cross_attention=False`` the layers are decoder-only (GPT-style: an
    :class:`EncoderLayer` with causal attention).

    Shape:
        tgt ``(*S, B, Tt, E)``, memory ``(*S, B, Ts, E)`` → ``(*S, B, Tt, E)``.
    """

    def __init__(
        self,
        d_model: int,
        nhead: int,
        num_layers: int,
        attention: AttentionConfig | None = None,
        cross_attention: bool = True,
        **block_kwargs: Any,
    ) -> None:
        check_int("num_layers", num_layers, 1)
        super().__init__()
        cfg = as_attention_config(attention)
        cfg.check_layers(num_layers)
        if cross_attention and cfg.read != "softmax":
            raise ValueError(
                f"read={cfg.read!r} is for self-attention stacks (Encoder, decoder-only); a "
                "Decoder with cross_attention=True takes read='softmax'"
            )
        kw = _block_kwargs(block_kwargs)
        self.cross_attention = cross_attention
        layers: list[nn.Module] = []
        for i in range(num_layers):
            if cross_attention:
                sa = cfg.build(d_model, nhead, i, num_layers, "self")
                ca = cfg.build(d_model, nhead, i, num_layers, "cross")
                layers.append(
                    DecoderLayer(
                        d_model,
                        nhead,
                        batch_first=True,
                        self_prior=sa.prior,
                        self_family=sa.family,
                        cross_prior=ca.prior,
                        cross_family=ca.family,
                        self_support=sa.support,
                        **kw,
                    )
                )
            else:
                layers.append(_self_attention_layer(cfg, d_model, nhead, i, num_layers, kw))
        self.layers = _pyro_module_list(layers)
        self.norm = nn.LayerNorm(d_model) if kw.get("norm_first", False) else None

    def forward(
        self,
        tgt: Tensor,
        memory: Tensor | None = None,
        tgt_key_padding_mask: Tensor | None = None,
        memory_key_padding_mask: Tensor | None = None,
    ) -> Tensor:
        if self.cross_attention and memory is None:
            raise ValueError("Decoder with cross_attention=True needs memory")
        x = tgt
        T = tgt.shape[-2]
        causal = torch.ones(T, T, dtype=torch.bool, device=tgt.device).triu(1)  # (Tt, Tt)
        for layer in self.layers:
            if self.cross_attention:
                x = layer(
                    x,
                    memory,
                    tgt_mask=causal,
                    tgt_key_padding_mask=tgt_key_padding_mask,
                    memory_key_padding_mask=memory_key_padding_mask,
                    tgt_is_causal=True,
                )
            else:
                x = layer(x, causal, tgt_key_padding_mask, is_causal=True)
        return self.norm(x) if self.norm is not None else x
