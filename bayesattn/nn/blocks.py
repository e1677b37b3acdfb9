r"""Transformer encoder/decoder blocks built from :class:`BayesianMultiheadAttention`.

Parameter names follow ``torch.nn.TransformerEncoderLayer``/``TransformerDecoderLayer`` so their
``state_dict`` loads and, in deterministic (posterior-mean) mode, the outputs agree. Unlike torch
(DESIGN §5), the blocks always call our attention's ``forward``; there is no fused fast path that
skips it. The layers take torch's arguments in torch's order (``batch_first=False`` by default);
the stacks (:class:`Encoder`, :class:`Decoder`) are ``batch_first=True``: ``(B, T, E)``, with
optional extra leading sample dims ``(*S, B, T, E)``.

Which attentions are Bayesian, with which prior and family, is chosen per network by an
:class:`~bayesattn.nn.config.AttentionConfig` (importable from here too).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.nn.functional as F
from pyro.nn import PyroModule
from torch import Tensor, nn

from .. import priors as P
from .._validation import check_int, check_real
from ..families import FamilyName
from .attention import BayesianMultiheadAttention, linear

# AttentionConfig and its option types live in .config; they stay importable from here
from .config import AttentionConfig as AttentionConfig
from .config import AttentionRole as AttentionRole
from .config import LayerSelection as LayerSelection
from .config import PriorName as PriorName
from .config import ReadName as ReadName
from .config import ReadoutName as ReadoutName
from .config import as_attention_config as as_attention_config
from .gp_read import SparseGP
from .supports import SupportName

if TYPE_CHECKING:
    from ..families import AttentionFamily
    from .supports import AttentionSupport

__all__ = ["AttentionConfig", "EncoderLayer", "DecoderLayer", "Encoder", "Decoder"]


def _pyro_module_list(modules: Sequence[nn.Module]) -> nn.ModuleList:
    """``PyroModule[nn.ModuleList](modules)`` (Pyro types ``PyroModule[T]`` as plain ``PyroModule``)."""
    return cast("type[nn.ModuleList]", PyroModule[nn.ModuleList])(modules)


def _activation(name: str | Callable[[Tensor], Tensor]) -> Callable[[Tensor], Tensor]:
    if callable(name):
        return name
    if name == "relu":
        return F.relu
    if name == "gelu":
        return F.gelu
    raise ValueError(f"activation must be 'relu', 'gelu' or a callable; got {name!r}")


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
        num_samples: int | None = None,
    ) -> Tensor:
        y = self.self_attn(
            x,
            x,
            x,
            attn_mask=attn_mask,
            key_padding_mask=key_padding_mask,
            need_weights=False,
            is_causal=is_causal,
            num_samples=num_samples,
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
        return self.forward_samples(src, None, src_mask, src_key_padding_mask, is_causal)

    def forward_samples(
        self,
        src: Tensor,
        num_samples: int | None,
        src_mask: Tensor | None = None,
        src_key_padding_mask: Tensor | None = None,
        is_causal: bool = False,
    ) -> Tensor:
        """:meth:`forward` drawing ``num_samples`` attention samples in one pass from the shared
        input: the projections, scores and the guide's parameters are computed once, not per
        sample; equal to ``forward(src.expand(S, *src.shape), ...)`` under the same seed
        (``None``: :meth:`forward`).

        Shape:
            src as :meth:`forward`'s → ``(S, *src.shape)`` (``num_samples = S``).
        """
        x = src
        sa = self._sa_block
        if self.norm_first:
            x = x + sa(self.norm1(x), src_mask, src_key_padding_mask, is_causal, num_samples)
            x = x + self._ff_block(self.norm2(x))
        else:
            x = self.norm1(x + sa(x, src_mask, src_key_padding_mask, is_causal, num_samples))
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

    def forward_samples(
        self,
        tgt: Tensor,
        num_samples: int,
        first: int,
        draws: bool,
        tgt_key_padding_mask: Tensor | None = None,
    ) -> Tensor:
        """A decoder-only stack's pass with ``num_samples = S`` samples entering at layer
        ``first`` (everything before it computed once): that layer draws the ``S`` samples
        itself from the shared input when ``draws`` (its attention is what is random; see
        :meth:`EncoderLayer.forward_samples`), else its input is expanded to ``S`` copies;
        ``first >= len(layers)``: one pass, expanded at the end. Equal to
        ``forward(tgt.expand(S, *tgt.shape))`` under the same seed.

        Shape:
            tgt ``(B, Tt, E)`` → ``(S, B, Tt, E)``.
        """
        if self.cross_attention:
            raise ValueError("forward_samples is for decoder-only stacks (cross_attention=False)")
        x, S = tgt, num_samples
        T = tgt.shape[-2]
        causal = torch.ones(T, T, dtype=torch.bool, device=tgt.device).triu(1)  # (Tt, Tt)
        for i, layer in enumerate(cast("Sequence[EncoderLayer]", self.layers)):
            if i == first and draws:
                x = layer.forward_samples(x, S, causal, tgt_key_padding_mask, True)  # (S,B,T,E)
                continue
            if i == first:
                x = x.expand((S,) + x.shape)  # (S, B, Tt, E)
            x = layer(x, causal, tgt_key_padding_mask, is_causal=True)
        x = self.norm(x) if self.norm is not None else x
        return x.expand((S,) + x.shape) if first >= len(self.layers) else x

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
