r"""The inference network of a variational latent-alignment decoder
(:class:`~bayesattn.nn.networks.Seq2Seq` with ``alignment="variational"``): an amortised
posterior :math:`q(z_t \mid x, y)` over source positions that reads the **whole** target, as in
Deng et al. (2018), "Latent alignment and variational attention".

.. math::
    g = \mathrm{BiEnc}\big(e(y_1), \dots, e(y_T)\big), \qquad
    q(z_t = j \mid x, y) = \mathrm{softmax}_j\big((W_q g_t)\cdot(W_k m_j)/\sqrt d\big),

a small bidirectional (unmasked self-attention) encoder over the predicted target words
``tgt[:, 1:]`` whose states score the source memory ``m``; padded source positions get
:math:`q = 0`. Unlike the prior :math:`p(z_t \mid x, y_{<t})` it sees :math:`y_t` and the words
after it. Trained with the model by the ELBO
(:func:`~bayesattn.functional.alignment.alignment_elbo`).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .._validation import check_int
from ..functional.alignment import alignment_log_prior
from .blocks import Encoder
from .linear import linear

__all__ = ["AlignmentInference"]


class AlignmentInference(nn.Module):
    """:math:`\\log q(z_t = j \\mid x, y)` from the target words and the source memory.

    Shape:
        tgt_out ``(B, Tt)`` the predicted target tokens (``tgt[:, 1:]``), memory
        ``(…, B, Ts, E)``, src_pad ``(B, Ts)`` and tgt_pad ``(B, Tt)`` (``True`` = pad) →
        ``(…, B, Tt, Ts)`` log-probabilities, ``-inf`` at padded source positions.
    """

    def __init__(
        self,
        d_model: int,
        nhead: int,
        vocab_size: int,
        max_len: int,
        dim_feedforward: int,
        num_layers: int = 1,
        norm_first: bool = True,
    ) -> None:
        check_int("d_model", d_model, 1)
        check_int("vocab_size", vocab_size, 1)
        check_int("max_len", max_len, 1)
        check_int("num_layers", num_layers, 1)
        super().__init__()
        self.d_model = d_model
        self.tok = nn.Embedding(vocab_size, d_model)
        self.pos = nn.Embedding(max_len, d_model)
        self.encoder = Encoder(
            d_model, nhead, num_layers, None, dim_feedforward=dim_feedforward, dropout=0.0,
            norm_first=norm_first,
        )  # fmt: skip
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)

    def forward(
        self,
        tgt_out: Tensor,
        memory: Tensor,
        src_pad: Tensor | None = None,
        tgt_pad: Tensor | None = None,
    ) -> Tensor:
        B, T = tgt_out.shape
        if T > self.pos.num_embeddings:
            raise ValueError(
                f"tgt_out has {T} positions; the inference network was built for max_len "
                f"{self.pos.num_embeddings}"
            )
        if memory.shape[-3] != B:
            raise ValueError(
                f"memory (…, B, Ts, E) and tgt_out (B, Tt) must have the same batch size; got "
                f"{tuple(memory.shape)}, {tuple(tgt_out.shape)}"
            )
        pos = torch.arange(T, device=tgt_out.device)
        h = self.tok(tgt_out) + self.pos(pos)  # (B, Tt, E)
        pad = tgt_pad if tgt_pad is not None and bool(tgt_pad.any()) else None
        g = self.encoder(h, src_key_padding_mask=pad)  # (B, Tt, E): both directions
        q = linear(g, self.q_proj.weight, self.q_proj.bias)  # (B, Tt, E)
        k = linear(memory, self.k_proj.weight, self.k_proj.bias)  # (…, B, Ts, E)
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.d_model)  # (…, B, Tt, Ts)
        return alignment_log_prior(scores, src_pad)
