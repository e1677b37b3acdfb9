"""Encoder–decoder sequence model: :class:`Seq2Seq`."""

from __future__ import annotations

from typing import Any, Literal, get_args

import torch
from torch import Tensor, nn

from ..._validation import check_int, check_real
from ...functional.alignment import alignment_elbo, mixture_log_probs
from ..alignment import EmissionKind, LatentAlignment, decoder_alignment
from ..alignment_inference import AlignmentInference
from ..attention import linear
from ..blocks import Decoder, Encoder
from ..config import AttentionConfig
from ..modes import collect_kl
from .base import Embedding, check_tokens, validate_common, with_samples
from .generative import GenerativeNetwork

__all__ = ["AlignmentKind", "Seq2Seq"]

#: decoder kinds: ``"soft"`` cross-attention layers, a ``"latent"`` categorical alignment
#: (exact marginal likelihood) or a ``"variational"`` one (the same model trained by the ELBO
#: with an inference network :math:`q(z_t \mid x, y)`)
AlignmentKind = Literal["soft", "latent", "variational"]


def _resolve_emission(emission: EmissionKind | None, alignment: AlignmentKind) -> EmissionKind:
    """The emission a decoder gets: ``None`` is ``"context"`` for a latent or variational
    decoder and ``"word"`` (no emission module) for soft attention, which takes no other."""
    if emission is not None and emission not in get_args(EmissionKind):
        raise ValueError(
            f"emission must be None or one of {get_args(EmissionKind)}; got {emission!r}"
        )
    if alignment == "soft":
        if emission not in (None, "word"):
            raise ValueError(
                "emission chooses a latent-alignment decoder's p(y_t | z_t = j); it needs "
                f"alignment='latent' or 'variational', got alignment={alignment!r}"
            )
        return "word"
    return "context" if emission is None else emission


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

    ``alignment="variational"``: the latent-alignment model of ``"latent"`` (same prior,
    emissions, logits and generation) plus an inference network :math:`q(z_t \mid x, y)` that
    reads the whole target (:class:`~bayesattn.nn.alignment_inference.AlignmentInference`);
    :meth:`elbo_loss` maximises the exact ELBO (sum over source positions enumerated),
    :math:`(1-\lambda)\sum_t \big[\sum_j q_{tj}\log p(y_t\mid z_t=j) -
    \mathrm{KL}(q_t\,\|\,\pi_t)\big] + \lambda \log p(y\mid x)` with
    :math:`\lambda` = ``marginal_weight`` (Deng et al. 2018 add the marginal likelihood too).
    :meth:`inference_log_posterior` gives :math:`\log q`. Pyro's :meth:`model` (SVI training)
    scores the exact marginal likelihood; only :meth:`elbo_loss` reads ``q``.

    ``emission`` (latent and variational decoders): what :math:`p(y_t \mid z_t = j)` reads,
    ``"context"`` (their default) the source word :math:`x_j` and, through gates that start
    closed, its contextual encoder state and the target prefix, ``"word"`` the source word and
    the target prefix (:class:`~bayesattn.nn.alignment.LatentAlignment`). ``None`` (default)
    picks ``"context"`` for a latent or variational decoder; soft attention has no emission
    (``None`` or ``"word"``).

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
        marginal_weight: float = 0.0,
        emission: EmissionKind | None = None,
    ) -> None:
        super().__init__()
        if alignment not in get_args(AlignmentKind):
            raise ValueError(
                f"alignment must be one of {get_args(AlignmentKind)}; got {alignment!r}"
            )
        check_real("marginal_weight", marginal_weight, ge=0.0, le=1.0)
        if marginal_weight and alignment != "variational":
            raise ValueError(
                "marginal_weight mixes the marginal likelihood into a variational decoder's "
                f"ELBO; it needs alignment='variational', got alignment={alignment!r}"
            )
        emission = _resolve_emission(emission, alignment)
        self.alignment: AlignmentKind = alignment
        #: weight of the exact marginal likelihood in a variational decoder's objective
        self.marginal_weight = float(marginal_weight)
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
        latent = alignment != "soft"
        self.decoder = Decoder(
            d_model, nhead, num_decoder_layers, attention, cross_attention=not latent, **kw
        )
        self.head: nn.Linear | None = None if latent else nn.Linear(d_model, tgt_vocab_size)
        self.latent: LatentAlignment | None = (
            LatentAlignment(
                d_model, src_vocab_size, tgt_vocab_size, dim_feedforward, emission=emission
            )
            if latent
            else None
        )
        self.inference: AlignmentInference | None = (
            AlignmentInference(d_model, nhead, tgt_vocab_size, max_len, dim_feedforward,
                               norm_first=norm_first)
            if alignment == "variational"
            else None
        )  # fmt: skip

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

        ``"latent"``, ``"variational"``: the model's own prior and emissions (Bayes' rule on
        them is exact).
        ``"soft"``: the last decoder layer's cross-attention weights (mean over heads) and the
        prediction with that layer's cross-attention reading only source position ``j``
        (the posterior attention of Shankar & Sarawagi 2019). Runs in the caller's attention
        mode and Pyro context, as :meth:`forward_logits`.

        Shape:
            src ``(B, Ts)``, tgt ``(B, Tt)`` → log_prior, log_lik ``(*S, B, Tt-1, Ts)``,
            logits ``(*S, B, Tt-1, V)``.
        """
        tgt_out = tgt[:, 1:]  # (B, T)
        if self.latent is not None:
            _, _, log_prior, log_em = self._latent_terms(src, tgt, num_samples)
        else:
            mem, pad = self.encode(src, num_samples)
            h = with_samples(self.tgt_embed(tgt[:, :-1]), num_samples)
            out, weights, hard = decoder_alignment(self.decoder, h, mem, pad)
            head = self._head
            log_prior = weights.mean(-3).clamp_min(0).log()  # (*S, B, T, Ts): head mean
            log_em = torch.log_softmax(linear(hard, head.weight, head.bias), -1)
        logits = (
            mixture_log_probs(log_prior, log_em)
            if self.latent is not None
            else linear(out, self._head.weight, self._head.bias)
        )
        return log_prior, _at_target(log_em, tgt_out), logits

    def _latent_terms(
        self, src: Tensor, tgt: Tensor, num_samples: int
    ) -> tuple[Tensor, Tensor | None, Tensor, Tensor]:
        """``(memory, src_pad, log_prior (*S, B, T, Ts), log_emission (*S, B, T, Ts, V))`` of a
        latent-alignment decoder (teacher forcing on ``tgt``)."""
        if self.latent is None:
            raise ValueError("a soft-attention Seq2Seq has no latent alignment")
        mem, pad = self.encode(src, num_samples)
        h = self.decoder(with_samples(self.tgt_embed(tgt[:, :-1]), num_samples))  # target prefix
        log_em = self.latent.log_emissions(h, src, mem)  # (*S, B, T, Ts, V)
        return mem, pad, self.latent.log_prior(h, mem, pad), log_em

    def _log_q(self, memory: Tensor, src_pad: Tensor | None, tgt: Tensor) -> Tensor:
        if self.inference is None:
            raise ValueError(
                "only a Seq2Seq with alignment='variational' has an inference network; got "
                f"alignment={self.alignment!r}"
            )
        tgt_out = tgt[:, 1:]  # (B, T)
        return self.inference(tgt_out, memory, src_pad, tgt_out == self.pad_id)

    def inference_log_posterior(self, src: Tensor, tgt: Tensor, num_samples: int = 1) -> Tensor:
        r""":math:`\log q(z_t = j \mid x, y)` of a variational decoder's inference network for
        every predicted target word (rows like ``tgt[:, 1:]``; ``-inf`` at padded source
        positions). Runs in the caller's mode and Pyro context, as :meth:`alignment_terms`.

        Shape:
            src ``(B, Ts)``, tgt ``(B, Tt)`` → ``(*S, B, Tt-1, Ts)``.
        """
        self.check_batch(src, tgt)
        check_int("num_samples", num_samples, 1)
        mem, pad = self.encode(src, num_samples)
        return self._log_q(mem, pad, tgt)

    def elbo_loss(
        self,
        x: Tensor,
        y: Tensor | None,
        num_data: int | None = None,
        beta: float = 1.0,
        num_particles: int = 1,
    ) -> tuple[Tensor, Tensor]:
        r"""Negative ELBO of a minibatch and the logits (as the base class). A variational
        decoder's likelihood term is its alignment ELBO per target word, exact
        (:func:`~bayesattn.functional.alignment.alignment_elbo`), mixed with the marginal
        likelihood by ``marginal_weight``:
        :math:`(1-\lambda)\big[\sum_j q_{tj}\log p(y_t\mid j) - \mathrm{KL}(q_t\|\pi_t)\big]
        + \lambda\log\sum_j \pi_{tj}\,p(y_t\mid j)`. ``beta`` weighs the attention and weight
        KLs only: the alignment's KL is part of the bound on :math:`\log p(y\mid x)` (it is
        what trains the prior :math:`\pi`), not annealed."""
        if self.inference is None:
            return super().elbo_loss(x, y, num_data, beta, num_particles)
        self.check_batch(x, y)
        check_int("num_particles", num_particles, 1)
        check_real("beta", beta, ge=0.0)
        if y is None:
            raise ValueError(f"{type(self).__name__}.elbo_loss needs targets y; got y=None")
        B = x.shape[0]
        N = self._num_data(num_data, B)
        with self.pyro_context:
            values, kl_w = self._weight_kl()
            with collect_kl() as col, self.weights_from(values):
                col.num_data = N
                mem, pad, log_prior, log_em = self._latent_terms(x, y, num_particles)
                log_q = self._log_q(mem, pad, y)  # (*S, B, T, Ts)
        tgt_out, mask = y[:, 1:], y[:, 1:] != self.pad_id  # (B, T)
        logits = mixture_log_probs(log_prior, log_em)  # (*S, B, T, V)
        elbo = alignment_elbo(log_q, log_prior, _at_target(log_em, tgt_out))  # (*S, B, T)
        marginal = logits.gather(-1, tgt_out.expand(*logits.shape[:-1])[..., None])[..., 0]
        lam = self.marginal_weight
        per_token = (1 - lam) * elbo + lam * marginal if lam else elbo  # (*S, B, T)
        ll = torch.where(mask, per_token, torch.zeros_like(per_token)).sum(-1)  # (*S, B)
        per_example = ll - beta * col.total()
        if per_example.dim() > 1:  # a sample dim: particles
            per_example = per_example.mean(0)
        loss = -(N / B) * per_example.sum() + beta * (kl_w + col.global_total())
        return loss, logits

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


def _at_target(log_em: Tensor, tgt_out: Tensor) -> Tensor:
    """Each position's emission at the observed token: ``(*S, B, T, Ts, V)``, ``(B, T)`` →
    ``(*S, B, T, Ts)``."""
    idx = tgt_out[:, :, None, None].expand(*log_em.shape[:-1], 1)  # (*S, B, T, Ts, 1)
    return log_em.gather(-1, idx).squeeze(-1)
