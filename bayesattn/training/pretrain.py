r"""Masked-language-model pretraining of a token classifier's trunk (BERT's objective).

A :class:`~bayesattn.nn.networks.TransformerClassifier` over token ids learns, from unlabeled
texts, to predict words hidden from it: of the non-padding positions a fraction ``prob`` is
chosen; of those 80 % are replaced by ``mask_id``, 10 % by a random word, 10 % left as they are
(Devlin et al. 2019), and the loss is the cross-entropy of the original word at the chosen
positions only,

.. math:: \mathcal L = -\frac{1}{|M|}\sum_{(b,t)\in M}\log
          \operatorname{softmax}\big(W_e\,g(h_{bt}) + c\big)_{x_{bt}},

with :math:`h` the encoder's final-normed token states, :math:`g` a dense layer, GELU and
LayerNorm, and the output matrix :math:`W_e` tied to the token embedding
(:class:`MaskedLMHead`). The trunk (embedding, encoder, CLS token) is then fine-tuned on the
labels as usual (:func:`bayesattn.training.fit`); the head is discarded.

Pure pieces: :func:`mask_tokens` (the corruption), :func:`masked_lm_loss`; the loop:
:func:`pretrain_masked_lm` (AdamW, warm-up then cosine decay, gradient clipping, seeded).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm.auto import tqdm

from .._validation import check_int, check_real, check_seed, torch_generator
from ..nn.networks.classifier import TransformerClassifier
from .schedules import lr_scheduler

__all__ = ["MaskedLMHead", "PretrainResult", "mask_tokens", "masked_lm_loss", "transfer_trunk",
           "pretrain_masked_lm"]  # fmt: skip

IGNORE = -100  #: the target of a position the loss does not read (``F.cross_entropy``'s default)


def mask_tokens(
    x: Tensor,
    mask_id: int,
    vocab_size: int,
    *,
    prob: float = 0.15,
    pad_id: int = 0,
    first_word: int = 2,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor]:
    """BERT's corruption of token ids ``x`` ``(B, T)``: ``(inputs, targets)``, both ``(B, T)``.

    Each non-padding position is chosen with probability ``prob``; a chosen position's target is
    its word (``IGNORE`` = -100 elsewhere) and its input is ``mask_id`` (80 %), a random word in
    ``[first_word, vocab_size)`` (10 %) or unchanged (10 %). Ids below ``first_word`` (padding,
    the unknown word) are never drawn as random words.
    """
    if x.dim() != 2 or x.is_floating_point():
        raise ValueError(f"x must be integer token ids (B, T); got {x.dtype} {tuple(x.shape)}")
    check_real("prob", prob, gt=0.0, le=1.0)
    check_int("mask_id", mask_id, 0, vocab_size - 1)
    check_int("first_word", first_word, 0, vocab_size - 1)
    u = torch.rand(x.shape, generator=generator)  # (B, T)
    chosen = (u < prob) & (x != pad_id)
    kind = torch.rand(x.shape, generator=generator)  # (B, T): 80/10/10
    randoms = torch.randint(first_word, vocab_size, x.shape, generator=generator)
    inputs = torch.where(chosen & (kind < 0.8), torch.full_like(x, mask_id), x)
    inputs = torch.where(chosen & (kind >= 0.8) & (kind < 0.9), randoms, inputs)
    targets = torch.where(chosen, x, torch.full_like(x, IGNORE))
    return inputs, targets


class MaskedLMHead(nn.Module):
    r"""The words' logits of token states: dense, GELU, LayerNorm, then the token embedding's
    matrix (tied) plus a bias. ``(..., E) -> (..., V)``.

    With the embedding's initial rows :math:`\mathcal N(0, 1/E)`
    (:data:`~bayesattn.nn.networks.base.TOKEN_INIT_STD`), the LayerNorm'd states give initial
    logits of standard deviation about 1."""

    def __init__(self, embedding: nn.Embedding) -> None:
        super().__init__()
        V, E = embedding.weight.shape
        self.dense = nn.Linear(E, E)
        self.norm = nn.LayerNorm(E)
        self.embedding = embedding  # shared, not copied: the classifier's own rows learn
        self.bias = nn.Parameter(torch.zeros(V))

    def forward(self, h: Tensor) -> Tensor:
        g = self.norm(F.gelu(self.dense(h)))  # (..., E)
        return F.linear(g, self.embedding.weight, self.bias)  # (..., V)


def _token_states(net: TransformerClassifier, x: Tensor) -> Tensor:
    """The encoder's final-normed states of the word positions ``(B, T, E)`` (CLS dropped)."""
    h, _ = net.encode(x, 1)  # (B, T', E)
    return h[:, 1:] if net.cls is not None else h


def masked_lm_loss(net: TransformerClassifier, head: MaskedLMHead, inputs: Tensor,
                   targets: Tensor) -> tuple[Tensor, Tensor]:  # fmt: skip
    """Mean cross-entropy over the chosen positions and the number of them correct."""
    h = _token_states(net, inputs)  # (B, T, E)
    keep = targets != IGNORE  # (B, T)
    logits = head(h[keep])  # (M, V): the chosen positions only
    loss = F.cross_entropy(logits, targets[keep]) if keep.any() else h.sum() * 0.0
    return loss, (logits.argmax(-1) == targets[keep]).sum()


@dataclass
class PretrainResult:
    """What :func:`pretrain_masked_lm` measured: per epoch the mean training loss and, with
    ``val``, the validation loss and the masked-word accuracy; the wall time (s)."""

    train_loss: list[float] = field(default_factory=list)
    val_loss: list[float] = field(default_factory=list)
    val_accuracy: list[float] = field(default_factory=list)
    seconds: float = 0.0


def _check_net(net: TransformerClassifier, mask_id: int) -> int:
    if not isinstance(net, TransformerClassifier) or net.vocab_size is None:
        raise TypeError(
            "net must be a TransformerClassifier over token ids (vocab_size given); got "
            f"{type(net).__name__}"
            + ("" if not isinstance(net, TransformerClassifier) else " with vector inputs")
        )
    V = net.vocab_size
    check_int("mask_id", mask_id, 2 if net.pad_id == 0 else 0, V - 1)
    if mask_id == net.pad_id:
        raise ValueError(f"mask_id must not be the padding id {net.pad_id}")
    return V


def _check_texts(x: Tensor, val: Tensor | None, V: int) -> None:
    for name, t in (("x", x), ("val", val)):
        if t is None:
            continue
        if not isinstance(t, Tensor) or t.dim() != 2 or t.is_floating_point() or len(t) == 0:
            raise ValueError(f"{name} must be integer token ids (N, T), N > 0; got "
                             f"{getattr(t, 'dtype', type(t).__name__)} "
                             f"{tuple(getattr(t, 'shape', ()))}")  # fmt: skip
        if int(t.min()) < 0 or int(t.max()) >= V:
            raise ValueError(f"{name} ids must be in [0, vocab_size={V}); got "
                             f"[{int(t.min())}, {int(t.max())}]")  # fmt: skip


def pretrain_masked_lm(
    net: TransformerClassifier,
    x: Tensor,
    *,
    mask_id: int,
    val: Tensor | None = None,
    epochs: int = 5,
    batch_size: int = 128,
    lr: float = 1e-3,
    weight_decay: float = 0.01,
    warmup_fraction: float = 0.05,
    prob: float = 0.15,
    clip_norm: float = 1.0,
    seed: int = 0,
    progress: bool = True,
) -> PretrainResult:
    """Train ``net``'s trunk in place as a masked language model of the texts ``x`` ``(N, T)``.

    Args:
        net: a token :class:`~bayesattn.nn.networks.TransformerClassifier`; its embedding,
            positions, CLS token and encoder are trained (its classification head is not).
        x: unlabeled token ids ``(N, T)`` in the network's vocabulary (``T`` ≤ its ``max_len``).
        mask_id: the id that hides a word (a vocabulary row the texts never use).
        val: held-aside texts ``(M, T)``: per epoch their loss and masked-word accuracy, under
            a fixed corruption (seed ``seed + 1``).
        epochs, batch_size, lr, weight_decay, warmup_fraction, clip_norm: AdamW with linear
            warm-up over ``warmup_fraction`` of the steps, then cosine decay to 0.
        prob: the fraction of words chosen (:func:`mask_tokens`).
        seed: the data order, the corruption and the head's initialisation.

    Returns:
        :class:`PretrainResult`; ``net`` is left in eval mode.
    """
    V = _check_net(net, mask_id)
    _check_texts(x, val, V)
    epochs, batch_size = check_int("epochs", epochs, 1), check_int("batch_size", batch_size, 1)
    check_real("lr", lr, gt=0.0)
    check_real("warmup_fraction", warmup_fraction, ge=0.0, lt=1.0)
    seed = check_seed(seed)
    gen = torch_generator(seed)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        head = MaskedLMHead(net.embed.tokens)  # type: ignore[arg-type]
    params = list({id(p): p for p in [*net.parameters(), *head.parameters()]}.values())
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    steps_per_epoch = math.ceil(len(x) / batch_size)
    total = epochs * steps_per_epoch
    sched = lr_scheduler(opt, warmup_steps=int(warmup_fraction * total), decay_steps=total)
    pad = net.pad_id if net.pad_id is not None else -1
    val_batch = None
    if val is not None:
        val_batch = mask_tokens(val, mask_id, V, prob=prob, pad_id=pad,
                                generator=torch_generator(seed + 1))  # fmt: skip
    out = PretrainResult()
    t0 = time.perf_counter()
    bar = tqdm(total=total, desc="masked-LM pretraining", disable=not progress, leave=False)
    for _ in range(epochs):
        net.train()
        head.train()
        order = torch.randperm(len(x), generator=gen)
        total_loss = 0.0
        for i in range(0, len(x), batch_size):
            inputs, targets = mask_tokens(x[order[i : i + batch_size]], mask_id, V, prob=prob,
                                          pad_id=pad, generator=gen)  # fmt: skip
            total_loss += _step(net, head, inputs, targets, opt, params, clip_norm) * len(inputs)
            sched.step()
            bar.update(1)
        out.train_loss.append(total_loss / len(x))
        if val_batch is not None:
            vl, va = _evaluate(net, head, *val_batch, batch_size)
            out.val_loss.append(vl)
            out.val_accuracy.append(va)
            bar.set_postfix(val_loss=f"{vl:.3f}", val_acc=f"{va:.3f}")
    bar.close()
    out.seconds = time.perf_counter() - t0
    net.eval()
    return out


def _step(net: TransformerClassifier, head: MaskedLMHead, inputs: Tensor, targets: Tensor,
          opt: torch.optim.Optimizer, params: list[nn.Parameter], clip_norm: float) -> float:  # fmt: skip
    """One optimiser step on a corrupted batch; its loss."""
    loss, _ = masked_lm_loss(net, head, inputs, targets)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    nn.utils.clip_grad_norm_(params, clip_norm)
    opt.step()
    return loss.item()


@torch.no_grad()
def _evaluate(net: TransformerClassifier, head: MaskedLMHead, inputs: Tensor, targets: Tensor,
              batch_size: int) -> tuple[float, float]:  # fmt: skip
    net.eval()
    head.eval()
    loss_sum, right, n = 0.0, 0, 0
    for i in range(0, len(inputs), batch_size):
        t = targets[i : i + batch_size]
        m = int((t != IGNORE).sum())
        if m == 0:
            continue
        loss, correct = masked_lm_loss(net, head, inputs[i : i + batch_size], t)
        loss_sum, right, n = loss_sum + float(loss) * m, right + int(correct), n + m
    return loss_sum / max(n, 1), right / max(n, 1)


@torch.no_grad()
def transfer_trunk(
    src: TransformerClassifier,
    src_vocab: tuple[str, ...] | list[str],
    dst: TransformerClassifier,
    dst_vocab: tuple[str, ...] | list[str],
) -> float:
    """Copy a pretrained trunk into ``dst`` (in place): positions, CLS token and encoder as they
    are, token-embedding rows by word (``dst``'s words that ``src_vocab`` lacks keep their own
    initialisation; padding and the unknown word are copied by id). The classification head is
    ``dst``'s own. Returns the fraction of ``dst_vocab`` found in ``src_vocab``.

    Raises ``ValueError`` when the two trunks differ in shape (width, layers, length)."""
    for name, net, vocab in (("src", src, src_vocab), ("dst", dst, dst_vocab)):
        if not isinstance(net, TransformerClassifier) or net.embed.tokens is None:
            raise TypeError(f"{name} must be a token TransformerClassifier; got "
                            f"{type(net).__name__}")  # fmt: skip
        if len(vocab) != net.embed.tokens.num_embeddings:
            raise ValueError(f"{name}_vocab has {len(vocab)} words; {name}'s embedding has "
                             f"{net.embed.tokens.num_embeddings} rows")  # fmt: skip
    s_state = {
        k: v for k, v in src.state_dict().items() if not k.startswith(("head.", "embed.tokens."))
    }
    d_state = dst.state_dict()
    bad = [f"{k}: {tuple(v.shape)} vs {tuple(d_state[k].shape) if k in d_state else 'missing'}"
           for k, v in s_state.items() if k not in d_state or d_state[k].shape != v.shape]  # fmt: skip
    if bad:
        raise ValueError(f"src and dst trunks differ: {'; '.join(bad[:4])}")
    dst.load_state_dict(s_state, strict=False)
    index = {w: i for i, w in enumerate(src_vocab)}
    rows = [(j, index[w]) for j, w in enumerate(dst_vocab) if w in index]
    d_rows, s_rows = (
        (torch.tensor(c) for c in zip(*rows, strict=True)) if rows else (torch.empty(0),) * 2
    )
    dst.embed.tokens.weight[d_rows.long()] = src.embed.tokens.weight[s_rows.long()]  # type: ignore[union-attr]
    return len(rows) / len(dst_vocab)
