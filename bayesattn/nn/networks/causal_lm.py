"""Decoder-only language model: :class:`CausalLM`."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from ..._validation import check_int
from ..attention import linear
from ..blocks import Decoder
from ..config import AttentionConfig
from .base import Embedding, check_tokens, validate_common
from .generative import GenerativeNetwork

__all__ = ["CausalLM"]


class CausalLM(GenerativeNetwork):
    """Decoder-only language model: ``model(x)`` predicts ``x[:, 1:]`` from ``x[:, :-1]``.

    ``generate(prompt, max_len)`` continues ``prompt (B, T0)`` (which should start with BOS).

    Shape:
        x ``(B, T)`` → logits ``(*S, B, T-1, V)``.
    """

    def __init__(
        self,
        vocab_size: int,
        d_model: int = 64,
        nhead: int = 4,
        num_layers: int = 2,
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
        validate_common(d_model, nhead, num_layers, max_len)
        self.vocab_size = check_int("vocab_size", vocab_size, 1)
        self.pad_id, self.bos_id, self.eos_id = pad_id, bos_id, eos_id
        self._check_special_ids(vocab_size, "vocabulary")
        self.embed = Embedding(d_model, vocab_size, None, max_len, dropout)
        self.decoder = Decoder(
            d_model,
            nhead,
            num_layers,
            attention,
            cross_attention=False,
            dim_feedforward=dim_feedforward,
            dropout=dropout,
            attn_dropout=attn_dropout,
            norm_first=norm_first,
        )
        self.head = nn.Linear(d_model, vocab_size)

    def check_batch(self, x: Tensor, y: Tensor | None) -> None:
        check_tokens("x", x, self.vocab_size)
        if x.shape[1] < 2:
            raise ValueError(f"x needs >= 2 tokens to predict the next; got shape {tuple(x.shape)}")

    def _logits_of(self, tokens: Tensor, num_samples: int) -> Tensor:
        """Logits ``(*S, B, T, V)``: the ``S`` samples enter at the first random layer (see
        :meth:`~bayesattn.nn.networks.BayesianNetwork.first_random_in`), everything before it
        is computed once."""
        h = self.embed(tokens)  # (B, T, E)
        if num_samples > 1:
            first, draws = self.first_random_in(list(self.decoder.layers))
            h = self.decoder.forward_samples(h, num_samples, first, draws)  # (S, B, T, E)
        else:
            h = self.decoder(h, tgt_key_padding_mask=None)
        return linear(h, self.head.weight, self.head.bias)  # (*S, B, T, V)

    def forward_logits(self, x: Tensor, y: Tensor | None = None, num_samples: int = 1) -> Tensor:
        return self._logits_of(x[:, :-1], num_samples)

    def targets(self, x: Tensor, y: Tensor | None) -> tuple[Tensor | None, Tensor | None, int]:
        t = x[:, 1:]
        return t, t != self.pad_id, 1

    def _start(self, x: Tensor, num_samples: int) -> tuple[Any, int, torch.device]:
        check_tokens("prompt", x, self.vocab_size)
        return x, x.shape[0], x.device

    def _step_logits(self, prefix: Tensor, state: Any, num_samples: int) -> Tensor:
        return self._logits_of(torch.cat([state, prefix[:, 1:]], dim=1), num_samples)
