"""Far-OOD sets and corruptions for padded token sequences ``(N, T)`` (id ``0`` padding, ``1`` the
unknown word, ``2..V-1`` words; :mod:`bayesattn.data.fortunes`), the token counterparts of
:mod:`bayesattn.data.far_ood`. Every set keeps each row's length (its padding).

Far-OOD (:func:`token_far_ood_suite`): ``uniform`` (every word uniform over the vocabulary),
``reversed`` (each row's words in reverse order), ``permuted`` (each row's words shuffled) and,
chosen before any result as the harder set, ``moments``: words drawn i.i.d. from a training
class's unigram distribution, with a length drawn from that class's lengths (the class's first
moments of the bag of words are right, nothing else is).

Corruptions (:func:`corrupt_tokens`, severity 1..5 = fraction ``0.1 … 0.5``): ``substitute``
(that fraction of the words replaced by uniform words), ``unknown`` (replaced by the unknown
word), ``truncate`` (that fraction of each row's last words cut to padding). Draws come from a
``torch.Generator`` seeded with ``seed`` and do not depend on the severity."""

from __future__ import annotations

from typing import Literal, get_args

import torch
from torch import Tensor

from .._validation import check_int, check_seed, torch_generator

__all__ = ["TOKEN_CORRUPTIONS", "token_far_ood_suite", "corrupt_tokens"]

TokenCorruption = Literal["substitute", "unknown", "truncate"]
TOKEN_CORRUPTIONS: tuple[TokenCorruption, ...] = get_args(TokenCorruption)
_FRACTION = (0.1, 0.2, 0.3, 0.4, 0.5)
PAD, UNK = 0, 1


def _check_tokens(x: Tensor, vocab_size: int) -> Tensor:
    if not isinstance(x, Tensor) or x.dim() != 2 or x.is_floating_point() or not len(x):
        raise ValueError(f"x must be non-empty int tokens (N, T); got {getattr(x, 'shape', x)}")
    check_int("vocab_size", vocab_size, 3)
    if int(x.min()) < 0 or int(x.max()) >= vocab_size:
        raise ValueError(f"x ids must be in [0, {vocab_size}); got {int(x.min())}..{int(x.max())}")
    return x.long()


def _shuffle_words(x: Tensor, g: torch.Generator) -> Tensor:
    """Each row's non-padding tokens in a random order (padding stays where it is)."""
    keys = torch.rand(x.shape, generator=g).masked_fill(x == PAD, 2.0)  # pads sort last
    order = torch.argsort(keys, dim=1)
    out = x.gather(1, order)
    return torch.where(x == PAD, x, out)  # rows are left-aligned: pads were last already


def token_far_ood_suite(
    x: Tensor, vocab_size: int, seed: int = 0, train: tuple[Tensor, Tensor] | None = None
) -> dict[str, Tensor]:
    """``{kind: (N, T)}``: ``uniform``, ``reversed``, ``permuted`` from ``x``, and with
    ``train = (x_train, y_train)`` also ``moments`` (``N`` rows).

    Shape:
        x ``(N, T)`` int, left-aligned (padding at the end); x_train ``(M, T)``, y_train ``(M,)``.
    """
    x = _check_tokens(x, vocab_size)
    g = torch_generator(check_seed(seed))
    words = x != PAD
    uniform = torch.randint(2, vocab_size, x.shape, generator=g).masked_fill(~words, PAD)
    lengths = words.sum(1)  # (N,)
    t = torch.arange(x.shape[1])
    rev_idx = (lengths[:, None] - 1 - t).clamp_min(0)  # (N, T)
    reversed_ = x.gather(1, rev_idx).masked_fill(~words, PAD)
    out = {"uniform": uniform, "reversed": reversed_, "permuted": _shuffle_words(x, g)}
    if train is not None:
        out["moments"] = _unigram_draws(*train, len(x), vocab_size, g)
    return out


def _unigram_draws(xt: Tensor, yt: Tensor, n: int, vocab_size: int, g: torch.Generator) -> Tensor:
    """``n`` rows: a class by its training frequency, a length from its rows, words i.i.d. from
    its training unigram counts (plus one, so no word has probability 0)."""
    xt = _check_tokens(xt, vocab_size)
    yt = torch.as_tensor(yt)
    if yt.shape != (len(xt),) or yt.is_floating_point():
        raise ValueError(f"y_train must be (M,) = ({len(xt)},) int labels; got {tuple(yt.shape)}")
    classes, counts = torch.unique(yt, return_counts=True)
    which = torch.multinomial(counts.double(), n, replacement=True, generator=g)  # (n,)
    out = torch.zeros(n, xt.shape[1], dtype=torch.long)
    for i, c in enumerate(classes):
        rows = xt[yt == c]
        lens = (rows != PAD).sum(1)  # (M_c,)
        freq = torch.bincount(rows[rows != PAD], minlength=vocab_size).double() + 1.0
        freq[PAD] = 0.0
        sel = torch.nonzero(which == i).flatten()
        pick = lens[torch.randint(len(lens), (len(sel),), generator=g)]
        draws = torch.multinomial(freq, len(sel) * xt.shape[1], replacement=True, generator=g)
        draws = draws.reshape(len(sel), xt.shape[1])
        draws[torch.arange(xt.shape[1])[None, :] >= pick[:, None]] = PAD
        out[sel] = draws
    return out


def corrupt_tokens(
    x: Tensor, kind: TokenCorruption, severity: int, vocab_size: int, seed: int = 0
) -> Tensor:
    """A corrupted copy of tokens ``x`` (see the module). Shape: ``(N, T)`` → ``(N, T)``."""
    x = _check_tokens(x, vocab_size)
    if kind not in TOKEN_CORRUPTIONS:
        raise ValueError(f"kind must be one of {TOKEN_CORRUPTIONS}, got {kind!r}")
    p = _FRACTION[check_int("severity", severity, 1, 5) - 1]
    g = torch_generator(check_seed(seed))
    words = x != PAD
    u = torch.rand(x.shape, generator=g)  # (N, T), common to every severity
    if kind == "truncate":
        lengths = words.sum(1, keepdim=True)  # (N, 1)
        keep = torch.arange(x.shape[1])[None, :] < (lengths - torch.round(p * lengths)).clamp_min(1)
        return x.masked_fill(~keep, PAD)
    hit = words & (u < p)
    if kind == "unknown":
        return x.masked_fill(hit, UNK)
    repl = torch.randint(2, vocab_size, x.shape, generator=g)
    return torch.where(hit, repl, x)
