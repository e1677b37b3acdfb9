"""Encoder–decoder sequence model: :class:`Seq2Seq`."""

from __future__ import annotations

from typing import Any, Literal, get_args

import torch
from torch import Tensor, nn

from ..._validation import check_int
from ...functional.alignment import mixture_log_probs
from ..alignment import LatentAlignment, decoder_alignment
from ..attention import linear
from ..blocks import Decoder, Encoder
from ..config import AttentionConfig
from .base import Embedding, check_tokens, validate_common, with_samples
from .generative import GenerativeNetwork

__all__ = ["AlignmentKind", "Seq2Seq"]

#: decoder kinds: ``"soft"`` cross-attention layers, or a ``"latent"`` categorical alignment
AlignmentKind = Literal["soft", "latent"]


class Seq2Seq(GenerativeNetwork):
    r"""Encoder–decoder transformer (translation, copy, reverse).

    ``model(src, tgt)``: teacher forcing on ``tgt[:, :-1]`` predicting ``tgt[:, 1:]`` (padding
    masked out of the likelihood).

    ``alignment="soft"`` (default): every decoder layer cross-attends to the source (soft
    attention, Bayesian where ``attention`` says). ``alignment="latent"``: the decoder layers are
    causal self-attention only and the source enters through a categorical alignment
    :math:`z_t` over source positions (:class:`~bayesattn.nn.alignment.LatentAlignment`),
    summed out exactly: the logits are :math:`\log\sum_j p(z_t=j\mid x, y_{<t})\,
    p(y_t\mid z_t=j, x, y_{<t})`, normalised log-probabilities, so training (the exact marginal
    likelihood), :meth:`generate` and the per-token uncertainty work unchanged.
    :meth:`alignment_terms` gives the prior over ``z_t`` and each position's likelihood of the
    observed token, for either kind.

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
        alignment: AlignmentKind = "soft",
    ) -> None:
        super().__init__()
        if alignment not in get_args(AlignmentKind):
            raise ValueError(
                f"alignment must be one of {get_args(AlignmentKind)}; got {alignment!r}"
            )
        self.alignment: AlignmentKind = alignment
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
        latent = alignment == "latent"
        self.decoder = Decoder(
            d_model, nhead, num_decoder_layers, attention, cross_attention=not latent, **kw
        )
        self.head: nn.Linear | None = None if latent else nn.Linear(d_model, tgt_vocab_size)
        self.latent: LatentAlignment | None = (
            LatentAlignment(d_model, src_vocab_size, tgt_vocab_size, dim_feedforward)
            if latent
            else None
        )

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
        self,
        tgt_in: Tensor,
        memory: Tensor,
        src_pad: Tensor | None,
        num_samples: int = 1,
        src: Tensor | None = None,
    ) -> Tensor:
        """Logits of ``tgt_in``'s next tokens (``src``: the source tokens, needed by a
        latent-alignment decoder's emissions)."""
        h = with_samples(self.tgt_embed(tgt_in), num_samples)
        if self.latent is not None:
            if src is None:
                raise ValueError("a latent-alignment Seq2Seq decodes with the source tokens src")
            h = self.decoder(h)  # (*S, B, T, E): the target prefix only
            return self.latent(h, memory, src, src_pad)  # (*S, B, T, V) marginal log-probs
        h = self.decoder(
            h,
            memory,
            tgt_key_padding_mask=None,
            memory_key_padding_mask=src_pad,
        )
        return linear(h, self._head.weight, self._head.bias)  # (*S, B, T, V)

    @property
    def _head(self) -> nn.Linear:
        if self.head is None:
            raise ValueError("a latent-alignment Seq2Seq has no soft output head")
        return self.head

    def alignment_terms(
        self, src: Tensor, tgt: Tensor, num_samples: int = 1
    ) -> tuple[Tensor, Tensor, Tensor]:
        r"""The alignment model of every target position (teacher forcing on ``tgt``):
        ``(log_prior, log_lik, logits)`` with ``log_prior[…, t, j]`` :math:`=\log p(z_t = j \mid
        x, y_{<t})` and ``log_lik[…, t, j]`` :math:`=\log p(y_t \mid z_t = j, x, y_{<t})` at the
        observed token ``y_t = tgt[:, t+1]``; ``logits`` as :meth:`forward_logits`.

        ``"latent"``: the model's own prior and emissions (Bayes' rule on them is exact).
        ``"soft"``: the last decoder layer's cross-attention weights (mean over heads) and the
        prediction with that layer's cross-attention reading only source position ``j``
        (the posterior attention of Shankar & Sarawagi 2019). Runs in the caller's attention
        mode and Pyro context, as :meth:`forward_logits`.

        Shape:
            src ``(B, Ts)``, tgt ``(B, Tt)`` → log_prior, log_lik ``(*S, B, Tt-1, Ts)``,
            logits ``(*S, B, Tt-1, V)``.
        """
        mem, pad = self.encode(src, num_samples)
        tgt_in, tgt_out = tgt[:, :-1], tgt[:, 1:]  # (B, T)
        h = with_samples(self.tgt_embed(tgt_in), num_samples)
        if self.latent is not None:
            h = self.decoder(h)
            log_prior = self.latent.log_prior(h, mem, pad)  # (*S, B, T, Ts)
            log_em = self.latent.log_emissions(h, src)  # (*S, B, T, Ts, V)
        else:
            out, weights, hard = decoder_alignment(self.decoder, h, mem, pad)
            head = self._head
            log_prior = weights.mean(-3).clamp_min(0).log()  # (*S, B, T, Ts): head mean
            log_em = torch.log_softmax(linear(hard, head.weight, head.bias), -1)
        logits = (
            mixture_log_probs(log_prior, log_em)
            if self.latent is not None
            else linear(out, self._head.weight, self._head.bias)
        )
        idx = tgt_out[:, :, None, None].expand(*log_em.shape[:-1], 1)  # (*S, B, T, Ts, 1)
        return log_prior, log_em.gather(-1, idx).squeeze(-1), logits

    def forward_logits(self, x: Tensor, y: Tensor | None = None, num_samples: int = 1) -> Tensor:
        if y is None:
            raise ValueError("Seq2Seq needs tgt (teacher forcing) for logits; use generate()")
        mem, pad = self.encode(x, num_samples)
        return self.decode(y[:, :-1], mem, pad, num_samples, x)

    # y: Any, not Tensor | None (the base's type): tgt is required here, None raises on indexing
    def targets(self, x: Tensor, y: Any) -> tuple[Tensor | None, Tensor | None, int]:
        tgt_out = y[:, 1:]
        return tgt_out, tgt_out != self.pad_id, 1

    def _start(self, x: Tensor, num_samples: int) -> tuple[Any, int, torch.device]:
        check_tokens("src", x, self.src_vocab_size)
        mem, pad = self.encode(x, num_samples)
        return (mem, pad, x), x.shape[0], x.device

    def _step_logits(self, prefix: Tensor, state: Any, num_samples: int) -> Tensor:
        mem, pad, src = state
        return self.decode(prefix, mem, pad, num_samples, src)
