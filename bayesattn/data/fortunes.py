"""A real text-classification set of tokens, offline: the fortune cookies of Debian's ``fortunes``
package (``apt-get install fortunes``: ``/usr/share/games/fortunes/<topic>``, one quotation per
``%``-separated entry), classified by topic. Ten topics, chosen before any result by being
subjects (not sources or styles) with at least 198 entries (:data:`FORTUNE_TOPICS`); a fixed
draw (``data_seed``) of ``per_class`` entries each, lower-cased word tokens, a vocabulary of the
training split's words seen ``min_count`` times (the held-out topics' own words are then unknown,
as they would be), padded or cut to ``max_len`` tokens; split like the digits
(:func:`~bayesattn.data.holdout.holdout_split_indices`).

Token ids: ``0`` padding (masked by :class:`~bayesattn.nn.networks.TransformerClassifier`),
``1`` unknown word, ``2..`` the vocabulary in decreasing training frequency."""

from __future__ import annotations

import functools
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np
import torch

from .._validation import check_int, check_seed
from .holdout import HoldoutData, HoldoutSplit, check_holdout_classes, holdout_split_indices

__all__ = ["FORTUNE_TOPICS", "FORTUNES_DIR", "FortunesData", "read_fortunes", "tokenize",
           "load_fortunes_data", "tokens_data", "encode_texts", "build_vocab", "PAD", "UNK",
           "MASK_TOKEN"]  # fmt: skip

#: the ten topics (class ids 0..9 in this order)
FORTUNE_TOPICS = ("art", "computers", "drugs", "education", "food", "law", "literature",
                  "politics", "science", "songs-poems")  # fmt: skip
#: where Debian's ``fortunes`` package puts them
FORTUNES_DIR = "/usr/share/games/fortunes"
PAD, UNK = 0, 1
#: the word of the masked-LM pretraining's mask id (last in a vocabulary built with it)
MASK_TOKEN = "<mask>"
_WORD = re.compile(r"[a-z0-9']+")


def tokenize(text: str) -> list[str]:
    """Lower-cased words (letters, digits, apostrophes)."""
    return _WORD.findall(text.lower())


def _stamp(root: str, topics: tuple[str, ...]) -> tuple[tuple[int, int, int] | None, ...]:
    """Each topic file's ``(mtime_ns, size, inode)`` (``None`` if missing): part of the cache
    key, so a corpus changed on disk is read again."""
    out: list[tuple[int, int, int] | None] = []
    for topic in topics:
        try:
            st = (Path(root) / topic).stat()
        except OSError:
            out.append(None)
            continue
        out.append((st.st_mtime_ns, st.st_size, st.st_ino))
    return tuple(out)


@functools.lru_cache(maxsize=4)
def _read(
    root: str, topics: tuple[str, ...], stamp: tuple[tuple[int, int, int] | None, ...]
) -> tuple[tuple[str, ...], tuple[int, ...]]:
    texts: list[str] = []
    labels: list[int] = []
    for k, topic in enumerate(topics):
        path = Path(root) / topic
        if not path.is_file():
            raise FileNotFoundError(
                f"the fortunes data set needs {path}: Debian's fortunes package "
                "(apt-get install fortunes), or root= a folder with one file per topic"
            )
        raw = path.read_text(encoding="utf-8", errors="replace")
        entries = [e.strip() for e in re.split(r"^%\s*$", raw, flags=re.M)]
        entries = [e for e in entries if tokenize(e)]
        texts += entries
        labels += [k] * len(entries)
    return tuple(texts), tuple(labels)


def read_fortunes(
    root: str | Path = FORTUNES_DIR, topics: Sequence[str] = FORTUNE_TOPICS
) -> tuple[list[str], np.ndarray]:
    """Every entry of every topic file under ``root`` and its topic index ``(N,)`` int64 (read
    once per process while the files are unchanged on disk)."""
    if not topics or len(set(topics)) != len(topics):
        raise ValueError(f"topics must be distinct names; got {list(topics)}")
    key = str(Path(root).resolve())
    texts, labels = _read(key, tuple(topics), _stamp(key, tuple(topics)))
    return list(texts), np.asarray(labels, dtype=np.int64)


@dataclass(frozen=True, eq=False)
class FortunesData(HoldoutData):
    """The fields of :class:`~bayesattn.data.holdout.HoldoutData` for the fortunes: ``x_*`` int64
    token ids ``(N, max_len)``; with the ``vocab`` (id → word, ids 0 and 1 the padding and the
    unknown word) and the topic names."""

    vocab: tuple[str, ...] = ()
    topics: tuple[str, ...] = ()

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)


def _encode(texts: Iterable[str], index: dict[str, int], max_len: int) -> torch.Tensor:
    rows: list[list[int]] = []
    for t in texts:
        ids = [index.get(w, UNK) for w in tokenize(t)][:max_len]
        rows.append(ids + [PAD] * (max_len - len(ids)))
    return torch.tensor(rows, dtype=torch.int64).reshape(len(rows), max_len)  # (N, max_len)


def build_vocab(
    texts: Iterable[str], min_count: int = 2, mask_token: bool = False
) -> tuple[str, ...]:
    """A vocabulary (id → word) of the words seen ``min_count`` times in ``texts``: ``"<pad>"``
    (0), ``"<unk>"`` (1), then the words in decreasing frequency (ties by spelling); with
    ``mask_token`` the masked-LM pretraining's :data:`MASK_TOKEN` last (no text encodes to it)."""
    check_int("min_count", min_count, 1)
    counts = Counter(w for t in texts for w in tokenize(t))
    words = sorted((w for w, c in counts.items() if c >= min_count), key=lambda w: (-counts[w], w))
    return ("<pad>", "<unk>", *words, *((MASK_TOKEN,) if mask_token else ()))


def encode_texts(texts: Iterable[str], vocab: Sequence[str], max_len: int) -> torch.Tensor:
    """Token ids ``(N, max_len)`` of ``texts`` in a data set's ``vocab`` (id → word; a word
    not in it is the unknown word 1, padding 0), cut or padded to ``max_len``."""
    check_int("max_len", max_len, 1)
    return _encode(texts, {w: i for i, w in enumerate(vocab) if i >= 2}, max_len)


def load_fortunes_data(
    seed: int = 0,
    holdout_classes: Iterable[int] = (8, 9),
    val_fraction: float = 0.15,
    test_fraction: float = 0.2,
    per_class: int = 198,
    max_len: int = 48,
    min_count: int = 2,
    data_seed: int = 42,
    root: str | Path = FORTUNES_DIR,
) -> FortunesData:
    """The fortunes by topic with a seeded stratified split (``seed``) and ``holdout_classes``
    (topic indices) kept aside as OOD; ``per_class`` entries per topic (a fixed draw,
    ``data_seed``), the vocabulary from the training split.

    Shape:
        Returns :class:`FortunesData` with tokens ``(N, max_len)`` and labels ``(N,)``.
    """
    seed, holdout = check_seed(seed), check_holdout_classes(holdout_classes)
    per_class, max_len = check_int("per_class", per_class, 10), check_int("max_len", max_len, 1)
    min_count = check_int("min_count", min_count, 1)
    texts, labels = read_fortunes(root)
    rng = np.random.default_rng(check_seed(data_seed, "data_seed"))
    keep = []
    for k in range(len(FORTUNE_TOPICS)):
        rows = np.flatnonzero(labels == k)
        if len(rows) < per_class:
            raise ValueError(f"topic {FORTUNE_TOPICS[k]!r} has {len(rows)} < per_class={per_class}")
        keep.append(np.sort(rng.choice(rows, per_class, replace=False)))
    idx = np.concatenate(keep)
    texts, y = [texts[i] for i in idx], labels[idx]
    split = holdout_split_indices(y, holdout, seed, val_fraction, test_fraction)
    return tokens_data(FortunesData, texts, y, split, seed, max_len, min_count,
                       topics=FORTUNE_TOPICS)  # fmt: skip


TokensT = TypeVar("TokensT", bound=FortunesData)


def tokens_data(
    cls: type[TokensT],
    texts: Sequence[str],
    y: np.ndarray,
    split: HoldoutSplit,
    seed: int,
    max_len: int,
    min_count: int,
    topics: tuple[str, ...],
    unlabeled: Sequence[str] = (),
    mask_token: bool = False,
) -> TokensT:
    """The token data set ``cls`` of ``texts`` (labels ``y``, original class ids) cut by
    ``split``: a vocabulary of the words seen ``min_count`` times in the training rows and the
    ``unlabeled`` texts (ids ``2..`` in decreasing frequency, ties by spelling; with
    ``mask_token`` one more id at the end, ``"<mask>"``, for masked-LM pretraining), every split
    encoded and padded or cut to ``max_len`` tokens (shared by every token data set of the
    package)."""
    vocab = build_vocab([*(texts[i] for i in split.train), *unlabeled], min_count, mask_token)
    index = {w: i for i, w in enumerate(vocab) if i >= 2}
    remap = split.remap(y)

    def part(rows: np.ndarray, original: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        ys = y[rows] if original else remap[rows]
        return _encode([texts[i] for i in rows], index, max_len), torch.as_tensor(ys)

    (xtr, ytr), (xv, yv), (xte, yte) = part(split.train), part(split.val), part(split.test)
    xo, yo = part(split.ood, original=True)
    return cls(
        xtr, ytr, xv, yv, xte, yte, split.classes, {c: k for k, c in enumerate(split.classes)},
        split.holdout, xo, yo, seed, vocab=vocab, topics=topics,
    )  # fmt: skip
