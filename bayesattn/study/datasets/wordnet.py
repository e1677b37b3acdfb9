"""WordNet 3.0 noun glosses by lexicographer file as a study data set (tokens; Debian's
``wordnet-base``): ten classes (animal, plant, food, artifact, person, location, body, substance,
communication, act), 2,000 glosses a class, at most 32 word tokens. The network, corruptions and
far-OOD suite are the fortunes' (:mod:`bayesattn.study.datasets.fortunes`): a transformer over
the word tokens with CLS pooling, 10 epochs; the study's fortunes network chosen again on
WordNet's validation split (``benchmarks/wordnet_tokens.py --select-only``, 1,000 glosses a class:
64 wide .728, 128 wide .729 at 2.5x the time, dropout 0.3 .699, all with the token rows of
``nn.Embedding``'s N(0, 1); with today's N(0, 1/E) rows the 64-wide network reaches .80, level
with a TF-IDF bag of words).

The vocabulary is the words seen twice in the training split and the pretraining texts
(:func:`~bayesattn.data.wordnet.unlabeled_glosses`: verb, adjective, adverb and other-noun
glosses, none of the ten classes), fixed before the study with the methods for words ran: every
method reads the same token ids, and a network fine-tuned from the masked-LM trunk pretrained on
those texts (:mod:`bayesattn.study.pretrained`) finds a pretrained row for most of its words
(84 % of a split's vocabulary; the rest are seen twice only in the training split)."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

from ...data.holdout import HoldoutData
from ...data.wordnet import load_wordnet_data, read_glosses, unlabeled_glosses
from .base import register_dataset
from .fortunes import Fortunes

__all__ = ["WordNet"]


class WordNet(Fortunes):
    """WordNet noun glosses: token ids ``(N, 32)`` (0 padding, 1 unknown), ten classes."""

    name = "wordnet"
    description = (
        "WordNet noun glosses by lexicographer file (word tokens; apt-get install wordnet-base)"
    )
    model_defaults = dict(Fortunes.model_defaults, pretrain_epochs=10)
    full_protocol = True
    order = 3

    def check_available(self) -> None:
        try:
            read_glosses()
        except FileNotFoundError as e:
            raise ImportError(str(e)) from e

    def load(self, seed: int, holdout_classes: tuple[int, ...]) -> HoldoutData:
        texts = list(_pretraining_texts())
        return load_wordnet_data(seed=seed, holdout_classes=holdout_classes, unlabeled=texts)

    def pretraining_texts(self) -> Sequence[str]:
        return _pretraining_texts()


@lru_cache(maxsize=1)
def _pretraining_texts() -> tuple[str, ...]:
    """The unlabeled glosses, read once per process (56,408 texts)."""
    return tuple(unlabeled_glosses())


register_dataset(WordNet())
