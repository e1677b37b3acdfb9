"""A larger real text-classification set of tokens, offline: WordNet 3.0 noun glosses classified
by lexicographer file, read from Debian's ``wordnet-base`` package (``apt-get install
wordnet-base``: ``/usr/share/wordnet/data.noun``, one synset a line, latin-1).

Each synset line holds its lexicographer file number (the second field) and, after ``" | "``,
its gloss: a definition followed by quoted usage examples, which are dropped (they often name
the word being defined). Ten lexicographer files, fixed before any result
(:data:`WORDNET_CLASSES`, each with at least 2,016 noun synsets); a fixed draw (``data_seed``) of
``per_class`` glosses each (2,000 by default), lower-cased word tokens, a vocabulary of the
training split's words seen ``min_count`` times (the held-out classes' own words then unknown),
padded or cut to ``max_len`` = 32 tokens (98 % of the noun glosses are shorter); split like the
digits (:func:`~bayesattn.data.holdout.holdout_split_indices`). Tokenisation, vocabulary and
encoding are the fortunes' (:func:`~bayesattn.data.fortunes.tokens_data`).

Token ids: ``0`` padding, ``1`` unknown word, ``2..`` the vocabulary in decreasing training
frequency."""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .._validation import check_int, check_seed
from .fortunes import FortunesData, tokenize, tokens_data
from .holdout import check_holdout_classes, holdout_split_indices

__all__ = ["WORDNET_CLASSES", "WORDNET_LEXNAMES", "WORDNET_DIR", "WordNetData", "read_glosses",
           "clean_gloss", "load_wordnet_data", "unlabeled_glosses"]  # fmt: skip

#: the ten noun lexicographer files (class ids 0..9 in this order)
WORDNET_CLASSES = ("animal", "plant", "food", "artifact", "person", "location", "body",
                   "substance", "communication", "act")  # fmt: skip
#: WordNet 3.0's lexicographer file numbers of the noun files (``lexnames``)
WORDNET_LEXNAMES: dict[str, int] = {
    "Tops": 3, "act": 4, "animal": 5, "artifact": 6, "attribute": 7, "body": 8, "cognition": 9,
    "communication": 10, "event": 11, "feeling": 12, "food": 13, "group": 14, "location": 15,
    "motive": 16, "object": 17, "person": 18, "phenomenon": 19, "plant": 20, "possession": 21,
    "process": 22, "quantity": 23, "relation": 24, "shape": 25, "state": 26, "substance": 27,
    "time": 28,
}  # fmt: skip
#: where Debian's ``wordnet-base`` package puts the database
WORDNET_DIR = "/usr/share/wordnet"
_QUOTED = re.compile(r'"[^"]*"')


def clean_gloss(gloss: str) -> str:
    """The definition of a gloss: its quoted usage examples removed (a ``;``-separated part
    after the first that still holds an unpaired quote is an example whose other quote is
    missing, as in four of WordNet 3.0's noun glosses, and is dropped too), whitespace and
    leftover separators trimmed."""
    parts = [p.strip() for p in _QUOTED.sub(" ", gloss).split(";")]
    kept = [parts[0].replace('"', " ")] + [p for p in parts[1:] if p and '"' not in p]
    return re.sub(r"\s+", " ", "; ".join(p for p in kept if p.strip())).strip()


@functools.lru_cache(maxsize=4)
def _read(path: str) -> tuple[tuple[str, ...], tuple[int, ...]]:
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(
            f"the WordNet data set needs {file}: Debian's wordnet-base package "
            "(apt-get install wordnet-base), or root= a folder holding WordNet 3.0's data files"
        )
    glosses: list[str] = []
    lexfiles: list[int] = []
    with file.open(encoding="latin-1") as f:
        for line in f:
            if line.startswith("  ") or " | " not in line:  # the licence header
                continue
            head, gloss = line.split(" | ", 1)
            glosses.append(clean_gloss(gloss))
            lexfiles.append(int(head.split(" ", 2)[1]))
    return tuple(glosses), tuple(lexfiles)


def read_glosses(
    root: str | Path = WORDNET_DIR, part: str = "noun"
) -> tuple[list[str], np.ndarray]:
    """Every synset's cleaned gloss of ``data.<part>`` under ``root`` (``part`` one of noun,
    verb, adj, adv) and its lexicographer file number ``(N,)`` int64 (nouns: 3..28,
    :data:`WORDNET_LEXNAMES`)."""
    if part not in ("noun", "verb", "adj", "adv"):
        raise ValueError(f"part must be one of 'noun', 'verb', 'adj', 'adv'; got {part!r}")
    glosses, lexfiles = _read(str(Path(root) / f"data.{part}"))
    return list(glosses), np.asarray(lexfiles, dtype=np.int64)


def unlabeled_glosses(
    root: str | Path = WORDNET_DIR,
    exclude: Sequence[str] = WORDNET_CLASSES,
    parts: Sequence[str] = ("noun", "verb", "adj", "adv"),
) -> list[str]:
    """Text for pretraining that holds none of the classified glosses: every non-empty gloss
    of the ``parts`` (WordNet 3.0: 20,864 nouns of the other lexicographer files, 13,767
    verbs, 18,156 adjectives, 3,621 adverbs) whose noun lexicographer file is not one of
    ``exclude`` (by default all ten classes, so no held-out class of any pair is in it)."""
    bad = [c for c in exclude if c not in WORDNET_LEXNAMES]
    if bad:
        raise ValueError(f"exclude must name noun lexicographer files; unknown: {bad}")
    out: list[str] = []
    for part in parts:
        glosses, lexfiles = read_glosses(root, part)
        drop = {WORDNET_LEXNAMES[c] for c in exclude} if part == "noun" else set()
        out += [
            g
            for g, f in zip(glosses, lexfiles.tolist(), strict=True)
            if f not in drop and tokenize(g)
        ]
    return out


@dataclass(frozen=True, eq=False)
class WordNetData(FortunesData):
    """The fields of :class:`~bayesattn.data.fortunes.FortunesData` for the WordNet glosses:
    ``x_*`` int64 token ids ``(N, max_len)``, the ``vocab`` and the class names (``topics``:
    the lexicographer files of :data:`WORDNET_CLASSES`)."""


def load_wordnet_data(
    seed: int = 0,
    holdout_classes: Iterable[int] = (8, 9),
    val_fraction: float = 0.15,
    test_fraction: float = 0.2,
    per_class: int = 2000,
    max_len: int = 32,
    min_count: int = 2,
    data_seed: int = 42,
    root: str | Path = WORDNET_DIR,
    classes: Sequence[str] = WORDNET_CLASSES,
    unlabeled: Sequence[str] = (),
    mask_token: bool = False,
) -> WordNetData:
    """WordNet noun glosses by lexicographer file with a seeded stratified split (``seed``) and
    ``holdout_classes`` (indices into ``classes``) kept aside as OOD; ``per_class`` glosses per
    class (a fixed draw, ``data_seed``; non-empty glosses only), the vocabulary from the
    training split and the ``unlabeled`` texts (pretraining: :func:`unlabeled_glosses`, with
    ``mask_token`` for the mask id, the vocabulary's last).

    Shape:
        Returns :class:`WordNetData` with tokens ``(N, max_len)`` and labels ``(N,)``.
    """
    classes = tuple(classes)
    unknown = [c for c in classes if c not in WORDNET_LEXNAMES]
    if len(classes) < 3 or len(set(classes)) != len(classes) or unknown:
        raise ValueError(
            f"classes must be at least 3 distinct noun lexicographer files "
            f"({', '.join(WORDNET_LEXNAMES)}); got {list(classes)}"
        )
    seed = check_seed(seed)
    holdout = check_holdout_classes(holdout_classes, len(classes))
    per_class, max_len = check_int("per_class", per_class, 10), check_int("max_len", max_len, 1)
    min_count = check_int("min_count", min_count, 1)
    glosses, lexfiles = read_glosses(root)
    rng = np.random.default_rng(check_seed(data_seed, "data_seed"))
    keep = []
    for name in classes:
        rows = np.flatnonzero(lexfiles == WORDNET_LEXNAMES[name])
        rows = np.asarray([i for i in rows if tokenize(glosses[i])], dtype=np.int64)
        if len(rows) < per_class:
            raise ValueError(f"class {name!r} has {len(rows)} glosses < per_class={per_class}")
        keep.append(np.sort(rng.choice(rows, per_class, replace=False)))
    idx = np.concatenate(keep)
    texts = [glosses[i] for i in idx]
    y = np.repeat(np.arange(len(classes), dtype=np.int64), per_class)
    split = holdout_split_indices(y, holdout, seed, val_fraction, test_fraction, len(classes))
    return tokens_data(WordNetData, texts, y, split, seed, max_len, min_count, topics=classes,
                       unlabeled=unlabeled, mask_token=mask_token)  # fmt: skip
