r"""The latent-alignment output layer of :class:`~bayesattn.nn.networks.Seq2Seq`
(``alignment="latent"``): cross-attention as a categorical latent :math:`z_t` over source
positions, marginalised exactly.

.. math::
    \pi_{tj} = \mathrm{softmax}_j\big((W_q h_t)\cdot(W_k m_j)/\sqrt d\big), \qquad
    p(y_t \mid z_t = j) = \mathrm{softmax}\big(W_o\,\mathrm{LN}(g_{tj})\big),\quad
    g_{tj} = u_{tj} + \mathrm{FF}(\mathrm{LN}(u_{tj})),\; u_{tj} = h_t + e(x_j),

and :math:`p(y_t) = \sum_j \pi_{tj}\, p(y_t \mid z_t = j)` (the sum in closed form;
:func:`enumerated_alignment_model` is the same model with Pyro enumeration). ``h_t`` is the
decoder state of the target prefix, ``m_j`` the encoder memory of source word ``j`` (the prior
reads the whole sentence) and ``e(x_j)`` the embedding of the source word itself: the emission sees
only the word it is aligned to, so an alignment is a statement about words (with the contextual
memory in the emission every position could explain every word, and the posterior would stay
at its prior). That is ``emission="word"``.

``emission="context"`` reads the aligned word in its sentence, and the prefix only through a
gate:

.. math::
    p(y_t \mid z_t = j) = \mathrm{softmax}\big(W_o\,\mathrm{LN}(g_{tj})\big),\quad
    u_{tj} = e(x_j) + a \odot W_c m_j + b \odot W_h h_t,

with :math:`g_{tj}` as above and gates :math:`a, b` that start at 0: the model starts as a
one-word emission that does not read the prefix (IBM Model 1's translation table with a neural
prior). :math:`a` opens as the source context helps (a German article's gender is its noun's),
:math:`b` as the prefix does (the end of the sentence, the comma before a clause). While
``uniform_prior`` is on (the IBM Model 1 start) the prefix term is left out: a source word then
has one output distribution for every target position, so a word that explains two target words
gives each at most half its mass, and the likelihood itself prefers one target word per source
word (with the prefix, a noun can explain its article as well as *the* does, by knowing that an
article comes next, and the word emission links it there).

For soft attention, :func:`decoder_alignment` gives the same two ingredients: the last decoder
layer's cross-attention weights as the prior and the prediction with that layer reading only
source position ``j`` as :math:`p(y_t \mid z_t = j)` (the posterior attention of Shankar &
Sarawagi 2019).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal, cast, get_args

import pyro
import pyro.distributions as dist
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._validation import check_int
from ..functional.alignment import alignment_log_prior, mixture_log_probs
from .blocks import Decoder, DecoderLayer
from .linear import linear

__all__ = [
    "EmissionKind",
    "LatentAlignment",
    "enumerated_alignment_model",
    "enumerated_alignment_guide",
    "hard_read",
    "layer_alignment",
    "decoder_alignment",
]

#: what the emission :math:`p(y_t \mid z_t = j)` reads: ``"word"`` the source word and the target
#: prefix, ``"context"`` the source word plus, through gates that start closed, its contextual
#: encoder state and the target prefix
EmissionKind = Literal["word", "context"]


class LatentAlignment(nn.Module):
    """Prior over source positions, per-position emissions and their exact mixture.

    Shape:
        h ``(…, B, Tt, E)``, memory ``(…, B, Ts, E)``, src ``(B, Ts)`` source tokens,
        key_padding_mask ``(B, Ts)`` → ``forward``: ``(…, B, Tt, V)`` log-probabilities of the
        marginal.
    """

    def __init__(
        self,
        d_model: int,
        src_vocab_size: int,
        vocab_size: int,
        dim_feedforward: int,
        layer_norm_eps: float = 1e-5,
        emission: EmissionKind = "context",
    ) -> None:
        if emission not in get_args(EmissionKind):
            raise ValueError(f"emission must be one of {get_args(EmissionKind)}; got {emission!r}")
        check_int("d_model", d_model, 1)
        check_int("src_vocab_size", src_vocab_size, 1)
        check_int("vocab_size", vocab_size, 1)
        check_int("dim_feedforward", dim_feedforward, 1)
        super().__init__()
        self.d_model = d_model
        self.emission: EmissionKind = emission
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.word = nn.Embedding(src_vocab_size, d_model)
        #: ``"context"``: projections of the encoder state and of the prefix state, and their
        #: gates (closed at the start)
        self.context: nn.Linear | None = None
        self.prefix: nn.Linear | None = None
        self.context_gate: nn.Parameter | None = None
        self.prefix_gate: nn.Parameter | None = None
        if emission == "context":
            self.context = nn.Linear(d_model, d_model)
            self.prefix = nn.Linear(d_model, d_model)
            self.context_gate = nn.Parameter(torch.zeros(d_model))
            self.prefix_gate = nn.Parameter(torch.zeros(d_model))
        self.norm1 = nn.LayerNorm(d_model, eps=layer_norm_eps)
        self.linear1 = nn.Linear(d_model, dim_feedforward)
        self.linear2 = nn.Linear(dim_feedforward, d_model)
        self.norm2 = nn.LayerNorm(d_model, eps=layer_norm_eps)
        self.head = nn.Linear(d_model, vocab_size)
        #: a uniform prior over the real source positions (IBM Model 1): train a few epochs with
        #: it first so the emissions learn which words translate which before the prior commits
        #: (``emission="context"`` leaves the prefix out of the emission meanwhile)
        self.uniform_prior = False
        self.register_load_state_dict_pre_hook(_check_saved_emission)

    def log_prior(
        self, h: Tensor, memory: Tensor, key_padding_mask: Tensor | None = None
    ) -> Tensor:
        r""":math:`\log p(z_t = j \mid x, y_{<t})`; ``-inf`` at padded source positions.

        Shape:
            → ``(…, B, Tt, Ts)``.
        """
        q = linear(h, self.q_proj.weight, self.q_proj.bias)  # (…, B, Tt, E)
        k = linear(memory, self.k_proj.weight, self.k_proj.bias)  # (…, B, Ts, E)
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.d_model)  # (…, B, Tt, Ts)
        if self.uniform_prior:
            scores = torch.zeros_like(scores)
        return alignment_log_prior(scores, key_padding_mask)

    def log_emissions(self, h: Tensor, src: Tensor, memory: Tensor | None = None) -> Tensor:
        r""":math:`\log p(y_t = v \mid z_t = j, \dots)` for every position and token
        (``memory``: the encoder states, needed by ``emission="context"``).

        Shape:
            h ``(…, B, Tt, E)``, src ``(B, Ts)``, memory ``(…, B, Ts, E)`` →
            ``(…, B, Tt, Ts, V)``.
        """
        c = self.word(src)  # (B, Ts, E)
        if self.emission == "word":
            return self._head_log_probs(h.unsqueeze(-2) + c.unsqueeze(-3))  # (…,B,Tt,Ts,V)
        assert self.context is not None and self.prefix is not None
        assert self.context_gate is not None and self.prefix_gate is not None
        if memory is None:
            raise ValueError("emission='context' reads the encoder states: pass memory")
        if memory.shape[-3:-1] != src.shape:
            raise ValueError(
                f"memory (…, B, Ts, E) and src (B, Ts) must agree; got {tuple(memory.shape)}, "
                f"{tuple(src.shape)}"
            )
        ctx = linear(memory, self.context.weight, self.context.bias)  # (…, B, Ts, E)
        u = c + self.context_gate * ctx  # (…, B, Ts, E): the word in its sentence
        if self.uniform_prior:  # IBM Model 1: the same emission at every target position
            log_em = self._head_log_probs(u)  # (…, B, Ts, V)
            return log_em.unsqueeze(-3).expand(*h.shape[:-1], *log_em.shape[-2:])
        pre = self.prefix_gate * linear(h, self.prefix.weight, self.prefix.bias)  # (…,B,Tt,E)
        return self._head_log_probs(u.unsqueeze(-3) + pre.unsqueeze(-2))  # (…, B, Tt, Ts, V)

    def _head_log_probs(self, u: Tensor) -> Tensor:
        """``log_softmax(W_o LN(u + FF(LN(u))))`` over the target vocabulary: ``(…, E)`` →
        ``(…, V)``."""
        ff = linear(F.relu(linear(self.norm1(u), self.linear1.weight, self.linear1.bias)),
                    self.linear2.weight, self.linear2.bias)  # fmt: skip
        logits = linear(self.norm2(u + ff), self.head.weight, self.head.bias)
        return torch.log_softmax(logits, dim=-1)

    def forward(
        self, h: Tensor, memory: Tensor, src: Tensor, key_padding_mask: Tensor | None = None
    ) -> Tensor:
        return mixture_log_probs(
            self.log_prior(h, memory, key_padding_mask), self.log_emissions(h, src, memory)
        )


def _check_saved_emission(
    module: LatentAlignment,
    state_dict: dict[str, Tensor],
    prefix: str,
    local_metadata: object,
    strict: bool,
    missing_keys: list[str],
    unexpected_keys: list[str],
    error_msgs: list[str],
) -> None:
    """Load pre-hook: a ``state_dict`` saved with the other emission is an error that says
    which ``emission`` to build (``Seq2Seq``'s latent decoders default to ``"context"``; a
    word-emission checkpoint needs ``emission="word"``). Only a state that holds this module's
    keys is checked (a partial load without them is not)."""
    if not any(isinstance(k, str) and k.startswith(prefix) for k in state_dict):
        return
    saved = "context" if f"{prefix}context_gate" in state_dict else "word"
    if saved != module.emission:
        where = prefix.rstrip(".") or "LatentAlignment"
        error_msgs.append(
            f"{where}: the state_dict holds a {saved!r} emission but the model was built with "
            f"emission={module.emission!r}; build it with emission={saved!r} (latent and "
            "variational decoders default to 'context')"
        )


def enumerated_alignment_model(
    log_prior: Tensor,
    log_emission: Tensor,
    tgt: Tensor,
    mask: Tensor | None = None,
    guided: bool = False,
) -> None:
    r"""The latent-alignment likelihood as a Pyro model: ``z[b, t] ~ Categorical(π_bt)``
    enumerated in parallel (``infer={"enumerate": "parallel"}``) over source positions,
    ``y[b, t] ~ Categorical(p(· | z))`` observed. Under ``TraceEnum_ELBO`` with an empty guide its
    loss is :math:`-\sum_{b,t} \log\sum_j \pi_{btj} p(y_{bt} \mid j)`, the closed form of
    :func:`~bayesattn.functional.alignment.mixture_log_probs` (tested equal).

    Shape:
        log_prior ``(B, Tt, Ts)``, log_emission ``(B, Tt, Ts, V)``, tgt ``(B, Tt)``,
        mask ``(B, Tt)`` (``True`` = scored).

    ``guided=True``: ``z`` comes from a guide (:func:`enumerated_alignment_guide`), so the
    unscored positions' ``z`` is masked out too (with ``z`` summed out in the model, masking it
    would add :math:`\log T_s` per unscored position instead).
    """
    B, T = tgt.shape
    if log_prior.shape[:2] != (B, T) or log_emission.shape[:3] != log_prior.shape:
        raise ValueError(
            "log_prior (B, Tt, Ts), log_emission (B, Tt, Ts, V) and tgt (B, Tt) must agree; got "
            f"{tuple(log_prior.shape)}, {tuple(log_emission.shape)}, {tuple(tgt.shape)}"
        )
    with pyro.plate("tokens", T, dim=-1), pyro.plate("batch", B, dim=-2):
        prior = dist.Categorical(logits=log_prior)
        if guided and mask is not None:
            prior = prior.mask(mask)
        z = pyro.sample("z", prior, infer={"enumerate": "parallel"})  # (B, T) or (Ts, 1, 1)
        # emission rows of the chosen position: log_emission[b, t, z] (enumerated z broadcasts)
        b = torch.arange(B, device=tgt.device)[:, None]  # (B, 1)
        t = torch.arange(T, device=tgt.device)[None, :]  # (1, T)
        d = dist.Categorical(logits=log_emission[b, t, z])  # (…, B, T, V)
        if mask is not None:
            d = d.mask(mask)
        pyro.sample("y", d, obs=tgt)


def enumerated_alignment_guide(
    log_q: Tensor,
    log_emission: Tensor,
    tgt: Tensor,
    mask: Tensor | None = None,
    guided: bool = True,
) -> None:
    r"""The inference network's posterior as a Pyro guide of :func:`enumerated_alignment_model`
    (called with the same arguments, ``log_q`` in place of ``log_prior``):
    ``z[b, t] ~ Categorical(q_bt)`` enumerated in parallel, so ``TraceEnum_ELBO`` computes the
    expectation over ``q`` exactly. Its loss is :math:`-\sum_{b,t}ig[\sum_j q_{btj}\log
    p(y_{bt}\mid j) - \mathrm{KL}(q_{bt}\,\|\,\pi_{bt})ig]`, the closed form of
    :func:`~bayesattn.functional.alignment.alignment_elbo` (tested equal). ``log_emission`` and
    ``guided`` are unused (the model's signature).

    Shape:
        log_q ``(B, Tt, Ts)``, tgt ``(B, Tt)``, mask ``(B, Tt)`` (``True`` = scored).
    """
    B, T = tgt.shape
    if log_q.shape[:2] != (B, T):
        raise ValueError(
            f"log_q (B, Tt, Ts) and tgt (B, Tt) must agree; got {tuple(log_q.shape)}, "
            f"{tuple(tgt.shape)}"
        )
    with pyro.plate("tokens", T, dim=-1), pyro.plate("batch", B, dim=-2):
        q = dist.Categorical(logits=log_q)
        if mask is not None:
            q = q.mask(mask)
        pyro.sample("z", q, infer={"enumerate": "parallel"})


# ---- soft attention's hard reads (the posterior attention of Shankar & Sarawagi 2019) ----------


def hard_read(layer: DecoderLayer, memory: Tensor) -> Tensor:
    r"""A decoder layer's cross-attention output had every head put all its weight on source
    position ``j``: :math:`W_o (W_v m_j + b_v) + b_o` (the value path of a one-hot read).

    Shape:
        memory ``(…, B, Ts, E)`` → ``(…, B, Ts, E)``.
    """
    mha = layer.multihead_attn
    E = mha.embed_dim
    if mha.in_proj_weight is not None:
        wv = mha.in_proj_weight[..., 2 * E :, :]
    else:
        wv = mha.v_proj_weight
    bv = mha.in_proj_bias[..., 2 * E :] if mha.in_proj_bias is not None else None
    v = linear(memory, wv, bv)  # (…, B, Ts, E)
    return linear(v, mha.out_proj.weight, mha.out_proj.bias)


def layer_alignment(
    layer: DecoderLayer,
    tgt: Tensor,
    memory: Tensor,
    tgt_mask: Tensor | None = None,
    memory_key_padding_mask: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    r"""``layer.forward`` (causal), plus its cross-attention weights and its output for every
    *hard* alignment: the cross-attention replaced by a one-hot read of source position ``j``
    (:func:`hard_read`), which gives the per-position predictions :math:`p(y_t \mid z_t = j)`.
    Needs a ``batch_first`` layer.

    Shape:
        tgt ``(…, B, Tt, E)``, memory ``(…, B, Ts, E)`` → out ``(…, B, Tt, E)``, weights
        ``(…, B, H, Tt, Ts)``, hard ``(…, B, Tt, Ts, E)``.
    """
    mha = layer.multihead_attn
    causal = tgt_mask is not None
    pad = memory_key_padding_mask
    prev = mha.record_weights
    mha.record_weights = True
    try:
        if layer.norm_first:
            x = tgt + layer._sa_block(layer.norm1(tgt), tgt_mask, None, causal)
            x2 = x + layer._mha_block(layer.norm2(x), memory, None, pad, False)
            weights = mha.last_weights
            out = x2 + layer._ff_block(layer.norm3(x2))
            h = x.unsqueeze(-2) + hard_read(layer, memory).unsqueeze(-3)  # (…, B, Tt, Ts, E)
            hard = h + layer._ff_block(layer.norm3(h))
        else:
            x = layer.norm1(tgt + layer._sa_block(tgt, tgt_mask, None, causal))
            x2 = layer.norm2(x + layer._mha_block(x, memory, None, pad, False))
            weights = mha.last_weights
            out = layer.norm3(x2 + layer._ff_block(x2))
            h = layer.norm2(x.unsqueeze(-2) + hard_read(layer, memory).unsqueeze(-3))
            hard = layer.norm3(h + layer._ff_block(h))
    finally:
        mha.record_weights, mha.last_weights = prev, None
    if weights is None:  # pragma: no cover - recording is on above
        raise RuntimeError("the cross-attention did not record its weights")
    return out, weights, hard


def decoder_alignment(
    decoder: Decoder, tgt: Tensor, memory: Tensor, memory_key_padding_mask: Tensor | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """``decoder.forward``, plus the last layer's cross-attention weights and the stack's output
    for every hard alignment of that layer (:func:`layer_alignment`).

    Shape:
        tgt ``(…, B, Tt, E)``, memory ``(…, B, Ts, E)`` → out ``(…, B, Tt, E)``, weights
        ``(…, B, H, Tt, Ts)``, hard ``(…, B, Tt, Ts, E)``.
    """
    if not decoder.cross_attention:
        raise ValueError("decoder_alignment needs a Decoder with cross_attention=True")
    layers = cast("Sequence[DecoderLayer]", decoder.layers)
    T = tgt.shape[-2]
    causal = torch.ones(T, T, dtype=torch.bool, device=tgt.device).triu(1)  # (Tt, Tt)
    x = tgt
    for layer in layers[:-1]:
        x = layer(
            x, memory, tgt_mask=causal, memory_key_padding_mask=memory_key_padding_mask,
            tgt_is_causal=True,
        )  # fmt: skip
    out, weights, hard = layer_alignment(layers[-1], x, memory, causal, memory_key_padding_mask)
    if decoder.norm is not None:
        out, hard = decoder.norm(out), decoder.norm(hard)
    return out, weights, hard
