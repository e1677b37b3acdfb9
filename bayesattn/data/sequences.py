"""Seeded sequence tasks: :class:`SequenceTask` (token ids, vocabularies, gold alignments),
copy / reverse / sort over integer tokens, and out-of-distribution variants of them.

Token ids: ``PAD=0``, ``BOS=1``, ``EOS=2``; ordinary tokens start at ``3``. ``src`` holds the plain
source tokens right-padded with PAD (no BOS/EOS); ``tgt`` is ``BOS w_0 ... w_{L-1} EOS PAD ...``.
Alignments are ``(src_pos, tgt_pos)`` pairs where ``tgt_pos`` indexes the target *words*
(``tgt[:, 1:]``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import torch
from torch import Tensor

from .._validation import check_int, check_real, check_seed, check_tensor, torch_generator

__all__ = [
    "PAD_ID",
    "BOS_ID",
    "EOS_ID",
    "SPECIAL_TOKENS",
    "SequenceTask",
    "make_copy_task",
    "make_reverse_task",
    "make_sort_task",
    "make_ood_sequences",
    "OOD_SEQUENCE_KINDS",
]


PAD_ID = 0
BOS_ID = 1
EOS_ID = 2
SPECIAL_TOKENS: tuple[str, ...] = ("<pad>", "<bos>", "<eos>")
_NUM_SPECIAL = len(SPECIAL_TOKENS)

Alignment = list[tuple[int, int]]


@dataclass
class SequenceTask:
    """A batch of source/target token-id sequences with vocabularies.

    ``src`` rows are the source tokens right-padded with ``pad_id`` (no BOS/EOS).
    ``tgt`` rows are ``bos_id, words..., eos_id`` right-padded with ``pad_id``; feed
    ``tgt[:, :-1]`` to a decoder and predict ``tgt[:, 1:]``. ``alignments[i]`` lists
    ``(src_pos, tgt_pos)`` pairs for example ``i``, sorted, with ``tgt_pos`` indexing
    ``tgt[i, 1:]``. ``meta`` records how the task was generated.

    Shape:
        src: ``(N, S)`` int64; tgt: ``(N, T)`` int64.
    """

    src: Tensor
    tgt: Tensor
    src_vocab: list[str]
    tgt_vocab: list[str]
    pad_id: int = PAD_ID
    bos_id: int = BOS_ID
    eos_id: int = EOS_ID
    alignments: list[Alignment] | None = None
    src_text: list[str] | None = None
    tgt_text: list[str] | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("src", "tgt"):
            t = check_tensor(name, getattr(self, name), 2)
            if t.dtype != torch.int64:
                raise TypeError(f"{name} must have dtype torch.int64, got {t.dtype}")
        if self.src.shape[0] != self.tgt.shape[0]:
            raise ValueError(
                f"src and tgt must have the same number of rows, got {self.src.shape[0]} "
                f"and {self.tgt.shape[0]}"
            )
        n = self.src.shape[0]
        for name in ("alignments", "src_text", "tgt_text"):
            value = getattr(self, name)
            if value is not None and len(value) != n:
                raise ValueError(f"{name} must have {n} entries, got {len(value)}")

    def __len__(self) -> int:
        return int(self.src.shape[0])

    @property
    def src_vocab_size(self) -> int:
        return len(self.src_vocab)

    @property
    def tgt_vocab_size(self) -> int:
        return len(self.tgt_vocab)

    def src_padding_mask(self) -> Tensor:
        """Boolean mask, True at PAD (PyTorch ``key_padding_mask`` convention).

        Shape:
            Returns ``(N, S)`` bool.
        """
        return self.src == self.pad_id

    def tgt_padding_mask(self) -> Tensor:
        """Boolean mask, True at PAD positions of ``tgt``.

        Shape:
            Returns ``(N, T)`` bool.
        """
        return self.tgt == self.pad_id

    def src_lengths(self) -> Tensor:
        """Number of non-PAD source tokens per row.

        Shape:
            Returns ``(N,)`` int64.
        """
        return (self.src != self.pad_id).sum(dim=1)

    def _vocab(self, which: Literal["src", "tgt"]) -> list[str]:
        if which == "src":
            return self.src_vocab
        if which == "tgt":
            return self.tgt_vocab
        raise ValueError(f"which must be 'src' or 'tgt', got {which!r}")

    def decode(
        self,
        ids: Tensor | Sequence[int],
        which: Literal["src", "tgt"] = "tgt",
        strip_special: bool = True,
    ) -> list[str]:
        """Map one row of token ids to token strings.

        With ``strip_special`` (default) BOS and PAD are dropped and decoding stops at
        the first EOS.

        Shape:
            ids: ``(L,)``. Returns a list of at most ``L`` strings.
        """
        vocab = self._vocab(which)
        if isinstance(ids, Tensor):
            if ids.ndim != 1:
                raise ValueError(f"ids must be 1-D, got shape {tuple(ids.shape)}")
            id_list = [int(i) for i in ids.tolist()]
        else:
            id_list = [int(i) for i in ids]
        out: list[str] = []
        for i in id_list:
            if not 0 <= i < len(vocab):
                raise ValueError(f"token id {i} is outside the {which} vocabulary of {len(vocab)}")
            if strip_special:
                if i == self.eos_id:
                    break
                if i in (self.pad_id, self.bos_id):
                    continue
            out.append(vocab[i])
        return out

    def encode(
        self, tokens: Sequence[str] | str, which: Literal["src", "tgt"] = "src"
    ) -> list[int]:
        """Map token strings (or a whitespace-separated string) to ids, no specials added.

        Shape:
            Returns a list of ``len(tokens)`` ids.
        """
        vocab = self._vocab(which)
        lookup = {t: i for i, t in enumerate(vocab)}
        words = tokens.split() if isinstance(tokens, str) else list(tokens)
        unknown = [t for t in words if t not in lookup]
        if unknown:
            raise ValueError(f"tokens {unknown!r} are not in the {which} vocabulary")
        return [lookup[t] for t in words]

    def alignment_matrix(self) -> Tensor:
        """Dense gold alignments: ``A[i, t, s] = 1`` if target word ``t`` aligns to ``s``.

        Shape:
            Returns ``(N, T - 1, S)`` float32, rows indexed like ``tgt[:, 1:]``.
        """
        if self.alignments is None:
            raise ValueError("this task has no alignments (alignments is None)")
        n, s = self.src.shape
        out = torch.zeros(n, self.tgt.shape[1] - 1, s)  # (N, T-1, S)
        for i, pairs in enumerate(self.alignments):
            for sp, tp in pairs:
                out[i, tp, sp] = 1.0
        return out

    def subset(self, index: Tensor | Sequence[int]) -> SequenceTask:
        """Rows ``index`` of this task as a new task (vocabularies are shared copies).

        Shape:
            index: ``(M,)``. Returns a task with ``M`` rows.
        """
        idx = torch.as_tensor(index, dtype=torch.long)
        if idx.ndim != 1:
            raise ValueError(f"index must be 1-D, got shape {tuple(idx.shape)}")
        rows = idx.tolist()

        def pick(values: list[Any] | None) -> list[Any] | None:
            return None if values is None else [values[i] for i in rows]

        return SequenceTask(
            src=self.src[idx].clone(),
            tgt=self.tgt[idx].clone(),
            src_vocab=list(self.src_vocab),
            tgt_vocab=list(self.tgt_vocab),
            pad_id=self.pad_id,
            bos_id=self.bos_id,
            eos_id=self.eos_id,
            alignments=pick(self.alignments),
            src_text=pick(self.src_text),
            tgt_text=pick(self.tgt_text),
            meta=dict(self.meta),
        )


# --------------------------------------------------------------------------------------
# algorithmic tasks: copy / reverse / sort
# --------------------------------------------------------------------------------------

_ALGORITHMIC_TASKS = ("copy", "reverse", "sort")


def _token_vocab(vocab_size: int) -> list[str]:
    return list(SPECIAL_TOKENS) + [str(k) for k in range(vocab_size)]


def _algorithmic_task(
    name: str,
    n: int,
    length: int,
    vocab_size: int,
    seed: int,
    min_length: int | None,
    *,
    num_unseen: int = 0,
    unseen_fraction: float = 0.0,
    meta: dict[str, Any] | None = None,
) -> SequenceTask:
    n = check_int("n", n, 1)
    length = check_int("length", length, 1)
    vocab_size = check_int("vocab_size", vocab_size, 1)
    seed = check_seed(seed)
    if min_length is None:
        min_length = length
    min_length = check_int("min_length", min_length, 1)
    if min_length > length:
        raise ValueError(f"min_length must be <= length={length}, got {min_length}")

    g = torch_generator(seed)
    lengths = torch.randint(min_length, length + 1, (n,), generator=g)  # (N,)
    first = _NUM_SPECIAL
    tokens = torch.randint(first, first + vocab_size, (n, length), generator=g)  # (N, S)
    pos = torch.arange(length)
    valid = pos[None, :] < lengths[:, None]  # (N, S)
    if num_unseen:
        unseen = torch.randint(
            first + vocab_size, first + vocab_size + num_unseen, (n, length), generator=g
        )  # (N, S)
        use_unseen = torch.rand((n, length), generator=g) < unseen_fraction  # (N, S)
        # force at least one unseen token per row, at a random valid position
        forced = torch.floor(torch.rand(n, generator=g) * lengths).long()  # (N,)
        use_unseen[torch.arange(n), forced] = True
        tokens = torch.where(use_unseen, unseen, tokens)
    src = tokens.masked_fill(~valid, PAD_ID)  # (N, S)

    if name == "copy":
        perm = pos.expand(n, length)  # (N, L) tgt word t <- src position t
    elif name == "reverse":
        perm = (lengths[:, None] - 1 - pos[None, :]).clamp(min=0)  # (N, L)
    else:  # sort, stable so ties keep source order
        keys = src.masked_fill(~valid, torch.iinfo(torch.int64).max)
        perm = torch.sort(keys, dim=1, stable=True).indices  # (N, L)
    words = torch.gather(src, 1, perm).masked_fill(~valid, PAD_ID)  # (N, L)

    tgt = torch.full((n, length + 2), PAD_ID, dtype=torch.int64)  # (N, T)
    tgt[:, 0] = BOS_ID
    tgt[:, 1 : length + 1] = words
    tgt[torch.arange(n), lengths + 1] = EOS_ID

    perm_rows = perm.tolist()
    alignments = [sorted((perm_rows[i][t], t) for t in range(int(lengths[i]))) for i in range(n)]
    vocab = _token_vocab(vocab_size + num_unseen)
    info = {
        "task": name,
        "length": length,
        "min_length": min_length,
        "vocab_size": vocab_size,
        "seed": seed,
    }
    info.update(meta or {})
    return SequenceTask(
        src=src,
        tgt=tgt,
        src_vocab=vocab,
        tgt_vocab=list(vocab),
        alignments=alignments,
        meta=info,
    )


def make_copy_task(
    n: int, length: int = 8, vocab_size: int = 10, seed: int = 0, min_length: int | None = None
) -> SequenceTask:
    """Copy task: the target repeats the source.

    Tokens are uniform over ``vocab_size`` symbols (ids ``3 .. 3 + vocab_size - 1``,
    named ``"0", "1", ...``). Sequence lengths are uniform in ``[min_length, length]``
    (all ``length`` when ``min_length`` is None). Target word ``t`` aligns to source
    position ``t``.

    Shape:
        src: ``(n, length)``; tgt: ``(n, length + 2)``.
    """
    return _algorithmic_task("copy", n, length, vocab_size, seed, min_length)


def make_reverse_task(
    n: int, length: int = 8, vocab_size: int = 10, seed: int = 0, min_length: int | None = None
) -> SequenceTask:
    """Reverse task: the target is the source reversed (padding stays at the end).

    Target word ``t`` aligns to source position ``L - 1 - t`` for a row of length ``L``.

    Shape:
        src: ``(n, length)``; tgt: ``(n, length + 2)``.
    """
    return _algorithmic_task("reverse", n, length, vocab_size, seed, min_length)


def make_sort_task(
    n: int, length: int = 8, vocab_size: int = 10, seed: int = 0, min_length: int | None = None
) -> SequenceTask:
    """Sort task: the target is the source sorted ascending by token id.

    Alignments follow a stable sort: equal tokens keep their source order.

    Shape:
        src: ``(n, length)``; tgt: ``(n, length + 2)``.
    """
    return _algorithmic_task("sort", n, length, vocab_size, seed, min_length)


_TASK_FNS: dict[Callable[..., SequenceTask], str] = {
    make_copy_task: "copy",
    make_reverse_task: "reverse",
    make_sort_task: "sort",
}

#: how out-of-distribution sequences differ from training (:func:`make_ood_sequences`)
OodSequenceKind = Literal["longer", "unseen_tokens"]
OOD_SEQUENCE_KINDS: tuple[OodSequenceKind, ...] = get_args(OodSequenceKind)


def make_ood_sequences(
    task_fn: Callable[..., SequenceTask] | str,
    n: int,
    kind: OodSequenceKind = "longer",
    *,
    length: int = 8,
    vocab_size: int = 10,
    seed: int = 0,
    min_length: int | None = None,
    ood_length: int | None = None,
    num_unseen_tokens: int = 5,
    unseen_fraction: float = 0.5,
) -> SequenceTask:
    """Out-of-distribution variants of a copy / reverse / sort task.

    ``task_fn`` is :func:`make_copy_task`, :func:`make_reverse_task`,
    :func:`make_sort_task` or their names. ``length``, ``vocab_size`` and ``min_length``
    describe the *training* distribution.

    * ``"longer"``: lengths uniform in ``[length + 1, ood_length]`` (default
      ``2 * length``), same vocabulary and ids as training.
    * ``"unseen_tokens"``: training lengths, but the vocabulary is extended by
      ``num_unseen_tokens`` ids ``3 + vocab_size ..`` never produced in training; each
      position uses one with probability ``unseen_fraction`` and every row has at least
      one. Training-token ids are unchanged, so size embeddings with
      ``len(ood.src_vocab)`` to score these rows.

    For the translation task, use ``patterns`` instead (e.g. train on ``"perfect"`` and
    evaluate on ``"subordinate"``).

    Shape:
        src: ``(n, S)`` with ``S = ood_length`` or ``length``; tgt: ``(n, S + 2)``.
    """
    if isinstance(task_fn, str):
        if task_fn not in _ALGORITHMIC_TASKS:
            raise ValueError(f"task_fn must be one of {_ALGORITHMIC_TASKS}, got {task_fn!r}")
        name = task_fn
    elif callable(task_fn) and task_fn in _TASK_FNS:
        name = _TASK_FNS[task_fn]
    else:
        raise ValueError(
            "task_fn must be make_copy_task, make_reverse_task, make_sort_task or one of "
            f"{_ALGORITHMIC_TASKS}, got {task_fn!r}"
        )
    length = check_int("length", length, 1)
    if kind == "longer":
        if ood_length is None:
            ood_length = 2 * length
        ood_length = check_int("ood_length", ood_length, 1)
        if ood_length <= length:
            raise ValueError(f"ood_length must be > length={length}, got {ood_length}")
        return _algorithmic_task(
            name,
            n,
            ood_length,
            vocab_size,
            seed,
            length + 1,
            meta={"ood": "longer", "train_length": length},
        )
    if kind == "unseen_tokens":
        num_unseen = check_int("num_unseen_tokens", num_unseen_tokens, 1)
        check_real("unseen_fraction", unseen_fraction, ge=0.0, le=1.0)
        vocab_size = check_int("vocab_size", vocab_size, 1)
        return _algorithmic_task(
            name,
            n,
            length,
            vocab_size,
            seed,
            min_length,
            num_unseen=num_unseen,
            unseen_fraction=float(unseen_fraction),
            meta={
                "ood": "unseen_tokens",
                "train_vocab_size": _NUM_SPECIAL + vocab_size,
                "num_unseen_tokens": num_unseen,
            },
        )
    raise ValueError(f"kind must be one of {OOD_SEQUENCE_KINDS}, got {kind!r}")
