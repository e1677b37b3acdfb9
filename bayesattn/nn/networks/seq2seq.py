"""Encoder–decoder sequence model: :class:`Seq2Seq`."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from ..._validation import check_int
from ..attention import linear
from ..blocks import Decoder, Encoder
from ..config import AttentionConfig
from .base import Embedding, check_tokens, validate_common, with_samples
from .generative import GenerativeNetwork

__all__ = ["Seq2Seq"]


class Seq2Seq(GenerativeNetwork):
    """Encoder–decoder transformer (translation, copy, reverse).

    ``model(src, tgt)``: teacher forcing on ``tgt[:, :-1]`` predicting ``tgt[:, 1:]`` (padding
    masked out of the likelihood).

    Shape:
        src ``(B, Ts)``, tgt ``(B, Tt)`` (BOS … EOS PAD…) → logits ``(*S, B, Tt-1, V_tgt)``.
    """

    def __init__(
        self,
        src_vocab_size: int,
        tgt_vocab_size: int,
        d_model: int = 64,
        nhead: int = 4,
        num_encoder_layers: int = 2,
        num_decoder_layers: int = 2,
        dim_feedforward: int = 128,
        dropout: float = 0.1,
        attn_dropout: float | None = None,
        max_len: int = 128,
        norm_first: bool = True,
        pad_id: int = 0,
        bos_id: int = 1,
        eos_id: int = 2,
        attention: AttentionConfig | None = None,
    ) -> None:
        super().__init__()
        validate_common(d_model, nhead, num_encoder_layers, max_len)
        validate_common(d_model, nhead, num_decoder_layers, max_len)
        self.src_vocab_size, self.tgt_vocab_size = src_vocab_size, tgt_vocab_size
        self.pad_id, self.bos_id, self.eos_id = pad_id, bos_id, eos_id
        check_int("tgt_vocab_size", tgt_vocab_size, 1)
        self._check_special_ids(tgt_vocab_size, "target vocabulary")
        kw: dict[str, Any] = dict(
            dim_feedforward=dim_feedforward,
            dropout=dropout,
            attn_dropout=attn_dropout,
            norm_first=norm_first,
        )
        self.src_embed = Embedding(d_model, src_vocab_size, None, max_len, dropout)
        self.tgt_embed = Embedding(d_model, tgt_vocab_size, None, max_len, dropout)
        self.encoder = Encoder(d_model, nhead, num_encoder_layers, attention, **kw)
        self.decoder = Decoder(d_model, nhead, num_decoder_layers, attention, **kw)
        self.head = nn.Linear(d_model, tgt_vocab_size)

    def check_batch(self, x: Tensor, y: Tensor | None) -> None:
        check_tokens("src", x, self.src_vocab_size)
        if y is not None:
            check_tokens("tgt", y, self.tgt_vocab_size)
            if y.shape[0] != x.shape[0]:
                raise ValueError(
                    f"src and tgt must have the same batch size; got {tuple(x.shape)}, "
                    f"{tuple(y.shape)}"
                )
            if y.shape[1] < 2:
                raise ValueError(f"tgt needs >= 2 tokens (BOS … EOS); got shape {tuple(y.shape)}")

    def encode(self, src: Tensor, num_samples: int = 1) -> tuple[Tensor, Tensor | None]:
        is_pad = src == self.pad_id  # (B, Ts)
        pad = is_pad if bool(is_pad.any()) else None
        h = with_samples(self.src_embed(src), num_samples)
        return self.encoder(h, src_key_padding_mask=pad), pad

    def decode(
        self, tgt_in: Tensor, memory: Tensor, src_pad: Tensor | None, num_samples: int = 1
    ) -> Tensor:
        h = with_samples(self.tgt_embed(tgt_in), num_samples)
        h = self.decoder(
            h,
            memory,
            tgt_key_padding_mask=None,
            memory_key_padding_mask=src_pad,
        )
        return linear(h, self.head.weight, self.head.bias)  # (*S, B, T, V)

    def forward_logits(self, x: Tensor, y: Tensor | None = None, num_samples: int = 1) -> Tensor:
        if y is None:
            raise ValueError("Seq2Seq needs tgt (teacher forcing) for logits; use generate()")
        mem, pad = self.encode(x, num_samples)
        return self.decode(y[:, :-1], mem, pad, num_samples)

    # y: Any, not Tensor | None (the base's type): tgt is required here, None raises on indexing
    def targets(self, x: Tensor, y: Any) -> tuple[Tensor | None, Tensor | None, int]:
        tgt_out = y[:, 1:]
        return tgt_out, tgt_out != self.pad_id, 1

    def _start(self, x: Tensor, num_samples: int) -> tuple[Any, int, torch.device]:
        check_tokens("src", x, self.src_vocab_size)
        mem, pad = self.encode(x, num_samples)
        return (mem, pad), x.shape[0], x.device

    def _step_logits(self, prefix: Tensor, state: Any, num_samples: int) -> Tensor:
        mem, pad = state
        return self.decode(prefix, mem, pad, num_samples)

