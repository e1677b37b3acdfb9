"""Sequence classification: :class:`TransformerClassifier`."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Literal, cast

import torch
from torch import Tensor, nn

from ..._validation import check_int, check_same_dtype
from ..attention import linear
from ..blocks import Encoder, EncoderLayer
from ..config import AttentionConfig
from .base import BayesianNetwork, Embedding, check_tokens, validate_common, with_samples

__all__ = ["TransformerClassifier"]


class TransformerClassifier(BayesianNetwork):
    """Sequence → class. Token inputs (``vocab_size``; ``pad_id`` positions are masked) or vector
    inputs (``input_dim``); ``pooling="mean"`` (masked mean) or ``"cls"`` (a learned token).

    Shape:
        x ``(B, T)`` or ``(B, T, input_dim)`` → logits ``(*S, B, num_classes)``.
    """

    def __init__(
        self,
        num_classes: int,
        vocab_size: int | None = None,
        input_dim: int | None = None,
        d_model: int = 64,
        nhead: int = 4,
        num_layers: int = 2,
        dim_feedforward: int = 128,
        dropout: float = 0.1,
        attn_dropout: float | None = None,
        max_len: int = 512,
        pooling: Literal["mean", "cls"] = "mean",
        norm_first: bool = True,
        pad_id: int | None = 0,
        attention: AttentionConfig | None = None,
    ) -> None:
        super().__init__()
        validate_common(d_model, nhead, num_layers, max_len)
        check_int("num_classes", num_classes, 2)
        if vocab_size is not None:
            check_int("vocab_size", vocab_size, 1)
            if pad_id is not None:
                check_int("pad_id", pad_id, 0, vocab_size - 1)
        if pooling not in ("mean", "cls"):
            raise ValueError(f"pooling must be 'mean' or 'cls'; got {pooling!r}")
        self.num_classes = num_classes
        self.vocab_size = vocab_size
        self.input_dim = input_dim
        self.pooling = pooling
        self.pad_id = pad_id if vocab_size is not None else None
        self.embed = Embedding(d_model, vocab_size, input_dim, max_len + 1, dropout)
        self.cls = nn.Parameter(torch.zeros(d_model)) if pooling == "cls" else None
        self.encoder = Encoder(
            d_model,
            nhead,
            num_layers,
            attention,
            dim_feedforward=dim_feedforward,
            dropout=dropout,
            attn_dropout=attn_dropout,
            norm_first=norm_first,
        )
        self.head = nn.Linear(d_model, num_classes)  # the read-out of the pooled features

    def check_batch(self, x: Tensor, y: Tensor | None) -> None:
        if self.vocab_size is not None:
            check_tokens("x", x, self.vocab_size)
        else:
            if not isinstance(x, Tensor) or not x.is_floating_point() or x.dim() != 3:
                raise ValueError(
                    f"x must be a float tensor (B, T, {self.input_dim}); got "
                    f"{getattr(x, 'shape', type(x).__name__)}"
                )
            if x.shape[-1] != self.input_dim:
                raise ValueError(
                    f"x last dim must be input_dim={self.input_dim}; got {tuple(x.shape)}"
                )
            if x.shape[1] == 0:
                raise ValueError(f"x must hold at least one position; got shape {tuple(x.shape)}")
            check_same_dtype("x", x, self.embed.pos.weight.dtype, type(self).__name__)
        if y is not None:
            if not isinstance(y, Tensor):
                raise TypeError(f"y must be a torch.Tensor of labels; got {type(y).__name__}")
            if y.is_floating_point() or y.is_complex() or y.dtype == torch.bool:
                raise TypeError(f"y must hold integer labels; got dtype {y.dtype}")
            if y.dim() != 1 or y.shape[0] != x.shape[0]:
                raise ValueError(
                    f"y must be (B,) = ({x.shape[0]},) labels; got shape {tuple(y.shape)}"
                )
            if y.numel() and (int(y.min()) < 0 or int(y.max()) >= self.num_classes):
                raise ValueError(
                    f"labels y must be in [0, {self.num_classes}); got min {int(y.min())}, "
                    f"max {int(y.max())}"
                )

    def padding_mask(self, x: Tensor) -> Tensor | None:
        """``True`` at padding tokens (PyTorch ``key_padding_mask`` convention)."""
        if self.pad_id is None:
            return None
        pad = x == self.pad_id
        return pad if bool(pad.any()) else None  # no padding: no mask, no masking work

    def encode(
        self, x: Tensor, num_samples: int = 1, cls_only: bool = False
    ) -> tuple[Tensor, Tensor | None]:
        """Encoder states ``(*S, B, T', E)`` and the padding mask ``(B, T')``.

        Samples enter at the first layer that is random in the current mode (see
        :meth:`first_stochastic_layer`): everything before it is computed once and shared by
        all ``S`` samples; when that layer's randomness is its attention alone, the layer draws
        the ``S`` samples itself from the shared input (projections, scores and the guide's
        parameters once: :meth:`EncoderLayer.forward_samples`). With ``cls_only`` (CLS pooling) the last layer computes only the CLS
        row, the one row the head reads (``(*S, B, 1, E)``): exact, since attention rows,
        feed-forward and LayerNorm act on each query token separately.
        """
        h = self.embed(x)  # (B, T, E)
        pad = self.padding_mask(x)
        if self.cls is not None:
            h = torch.cat([self.cls.expand(h.shape[0], 1, -1), h], dim=1)  # (B, 1+T, E)
            if pad is not None:
                pad = torch.cat([pad.new_zeros(pad.shape[0], 1), pad], dim=1)
        layers = self._encoder_layers()
        n = len(layers)
        mix = self.trunk_mixture  # the optional trunk hook (nn.mixture: K packed sub-trunks)
        # a mixture's pass has K·P draws (ELBO) or K component means ("mean") from layer 0
        ctx = mix.trunk(self, num_samples) if mix is not None else contextlib.nullcontext()
        with ctx as S:
            num_samples = num_samples if S is None else S
            first, by_attention = self._first_random() if num_samples > 1 else (n, False)
            for i, layer in enumerate(layers):
                # the layer draws the S samples itself when its attention is the first random
                # thing: its projections, scores and guide are computed once for all S
                draws = i == first and by_attention
                if i == first and not draws:
                    h = with_samples(h, num_samples)  # (S, B, T', E)
                S_i = num_samples if draws else None
                if cls_only and i == n - 1:
                    h = layer.forward_rows(h, 1, pad, S_i)  # (S, B, 1, E)
                elif draws:
                    h = layer.forward_samples(h, S_i, src_key_padding_mask=pad)  # (S,B,T',E)
                else:
                    h = layer(h, src_key_padding_mask=pad)
        if first >= n:
            h = with_samples(h, num_samples)  # nothing random: S identical copies
        norm = self.encoder.norm
        return (norm(h) if norm is not None else h), pad

    def patchify(self, x: Tensor) -> Tensor:
        """The inputs as the encoder's embedding takes them (here ``x`` itself; image and
        signal networks cut it into patches)."""
        return x

    def forward_features(self, x: Tensor, tokens: bool = True) -> tuple[Tensor, Tensor | None]:
        r"""One deterministic pass (``S = 1``, the current attention mode) up to the head:
        ``(cls, tokens)`` (timm's ``forward_features``/``forward_head`` split).

        ``cls`` ``(B, E)`` is what the head reads (the final-normed CLS state, or with
        ``pooling="mean"`` the masked mean of the token states); ``tokens`` ``(B, E)`` the
        mean of the final-normed token states, the CLS token and padding excluded (``None``
        with ``pooling="mean"``, where it is ``cls``, or ``tokens=False``: then a CLS-pooled
        network's last layer computes the CLS row only, as :meth:`forward_logits` does).
        ``forward_head(*forward_features(x))`` are the logits ``(B, C)``.
        """
        h, pad = self.encode(self.patchify(x), 1, cls_only=self.cls is not None and not tokens)
        if h.dim() != 3:  # a trunk mixture draws its K components even at S = 1
            raise ValueError(
                f"forward_features reads one deterministic pass (B, T, E); this network's "
                f"encoder gave {tuple(h.shape)} (a trunk mixture): use forward_logits"
            )
        if self.cls is None:
            return _masked_mean(h, pad), None  # (B, E)
        if not tokens:
            return h[..., 0, :], None
        body = h[..., 1:, :]  # (B, T, E)
        return h[..., 0, :], _masked_mean(body, None if pad is None else pad[:, 1:])

    def forward_head(self, cls: Tensor, tokens: Tensor | None = None) -> Tensor:
        """Logits ``(B, C)`` of the pooled features ``cls`` ``(B, E)`` (``tokens`` unused: the
        head reads the pooled state only)."""
        return self.head(cls)

    def _encoder_layers(self) -> Sequence[EncoderLayer]:
        # the Encoder's nn.ModuleList holds EncoderLayers (typed as holding any Module)
        return cast("Sequence[EncoderLayer]", self.encoder.layers)

    def first_stochastic_layer(self) -> int:
        """Index of the first encoder layer whose output is random in the current attention
        mode (``num_layers`` if none is): 0 while any dropout is active (training mode with
        ``dropout > 0``) or the network has Bayesian projection weights or a trunk mixture
        (:mod:`bayesattn.nn.mixture`), else the first layer
        with a family (none in ``"mean"`` mode). Posterior samples share everything
        computed before it."""
        return self._first_random()[0]

    def _first_random(self) -> tuple[int, bool]:
        """``(first_stochastic_layer, whether that layer's randomness is its attention alone)``."""
        return self.first_random_in(self._encoder_layers())

    def forward_logits(self, x: Tensor, y: Tensor | None = None, num_samples: int = 1) -> Tensor:
        # the last layer's other rows are only computed when its attention map is being recorded
        recording = self._encoder_layers()[-1].self_attn.record_weights
        h, pad = self.encode(x, num_samples, cls_only=self.cls is not None and not recording)
        if self.cls is not None:
            pooled = h[..., 0, :]
        elif pad is None:
            pooled = h.mean(-2)
        else:
            keep = (~pad).to(h.dtype).unsqueeze(-1)  # (B, T, 1)
            pooled = (h * keep).sum(-2) / keep.sum(-2).clamp_min(1.0)
        head = self.head
        # linear() reads x as (*S, B, T, In); pooled has no T, so give it one
        out = linear(pooled.unsqueeze(-2), head.weight, head.bias)  # (*S, B, 1, C)
        mix = self.trunk_mixture  # "mean" mode: the K components' mean
        return out.squeeze(-2) if mix is None else mix.read_logits(out.squeeze(-2), num_samples)

    def targets(self, x: Tensor, y: Tensor | None) -> tuple[Tensor | None, Tensor | None, int]:
        return y, None, 0


def _masked_mean(h: Tensor, pad: Tensor | None) -> Tensor:
    """Mean over the positions ``(B, T, E) -> (B, E)``, padding (``pad (B, T)`` ``True``)
    excluded."""
    if pad is None:
        return h.mean(-2)
    keep = (~pad).to(h.dtype).unsqueeze(-1)  # (B, T, 1)
    return (h * keep).sum(-2) / keep.sum(-2).clamp_min(1.0)
