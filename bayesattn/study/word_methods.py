"""The study's methods for words: what a text data set needs beside the networks' own reads.

- ``bag_of_words``: TF-IDF + logistic regression (the baseline every token data set reports).
- ``pretrained`` / ``density_pretrained``: the deterministic network fine-tuned from the data
  set's masked-LM trunk (:mod:`.pretrained`; no text of any class in its corpus), read by its
  entropy / by the density read of its CLS output.
- ``density_bow`` / ``density_pretrained_bow``: the CLS density score (of the network from
  scratch / fine-tuned) + the bag of words' entropy, each standardised on in-distribution
  validation data, summed (no OOD data fits a weight): what the network's features say and
  what the words alone say.

Every one applies only where it can: word-token data sets (:attr:`StudyDataset.words`), and for
the pretrained ones, data sets with pretraining texts. Measured on WordNet and removed (their
numbers are in docs/which-attention.md): the unknown-word rate as a score; the density read of
the CLS output alone (level with the default read), of every layer's CLS summed, of the mean
state of known words; entropy + CLS density + unknown-word rate summed."""

from __future__ import annotations

import time

import torch
from torch import Tensor

from ..calibration import predictive_entropy
from ..calibration.bag_of_words import BagOfWords, fit_bag_of_words
from ..calibration.token_scores import combine_scores
from ..nn.networks import BayesianNetwork
from ..posthoc.features import Features
from ..uncertainty import PredictionResult
from .datasets import StudyDataset
from .density_methods import ClassDensity, member_reads
from .methods import Deterministic, Fitted, Method, register_method
from .runs import Run

__all__ = [
    "bag_of_words",
    "BagOfWordsMethod",
    "TokenDensity",
    "DensityBagOfWords",
    "DensityBagOfWordsPair",
    "Pretrained",
]


def bag_of_words(run: Run) -> tuple[BagOfWords, float]:
    """The run's TF-IDF + logistic regression (``C`` by validation NLL) and the seconds its fit
    took: fitted once per run, shared by the methods that read it (each charged the seconds)."""
    if "bag_of_words" not in run.cache:
        d = run.data
        t0 = time.perf_counter()
        bow = fit_bag_of_words((d.x_train, d.y_train), (d.x_val, d.y_val),
                               d.vocab_size)  # type: ignore[attr-defined]  # fmt: skip
        run.cache["bag_of_words"] = (bow, time.perf_counter() - t0)
    return run.cache["bag_of_words"]


class BagOfWordsMethod(Method):
    """TF-IDF + logistic regression (``C`` by validation NLL); its score is the entropy."""

    name = "bag_of_words"
    description = "TF-IDF + logistic regression, C by validation NLL (the baseline for words)"

    def applies_to(self, dataset: StudyDataset) -> bool:
        return dataset.words

    def fit(self, run: Run) -> Fitted:
        bow, secs = bag_of_words(run)
        f = Fitted([], secs, params={"C": bow.C})
        f.state["bow"] = bow
        return f

    def predict(self, fitted: Fitted, x: Tensor) -> PredictionResult:
        bow: BagOfWords = fitted.state["bow"]
        return PredictionResult(bow.probs(x).float()[None])  # (1, B, C)


class TokenDensity(ClassDensity):
    """The density read (:class:`~.density_methods.ClassDensity`) of the CLS output alone (the
    head's input, one pass without the token view) of member 0, or of the network fine-tuned
    from the pretrained trunk."""

    views = ("cls",)

    def __init__(self, name: str, description: str, pretrained: bool = False) -> None:
        self.name, self.description, self.pretrained = name, description, pretrained

    def applies_to(self, dataset: StudyDataset) -> bool:
        return dataset.words and (not self.pretrained or bool(dataset.pretraining_texts()))

    def members(self, run: Run) -> tuple[list[BayesianNetwork], list[float]]:
        return run.pretrained_members(1) if self.pretrained else run.members(1)

    def features(self, run: Run, split: str, x: Tensor | None = None) -> Features:
        return run.passes(split, x, pretrained=self.pretrained)

    def fit(self, run: Run) -> Fitted:
        f = super().fit(run)
        f.params["view"] = "cls"
        if self.pretrained:
            f.params["pretraining"] = run.cache["pretrained_info"]
        return f


class DensityBagOfWords(TokenDensity):
    """The CLS density read's predictive; own score: its density score + the bag of words'
    entropy, each standardised on validation, summed (what the network's features say and what
    the words alone say)."""

    def fit(self, run: Run) -> Fitted:
        f = super().fit(run)
        bow, secs = bag_of_words(run)
        f.train_seconds += secs
        f.state["bow"] = bow
        f.params["C"] = bow.C
        f.state["val"] = self._parts(f, run, run.data.x_val)[1]
        return f

    def _parts(
        self, fitted: Fitted, run: Run, x: Tensor
    ) -> tuple[PredictionResult, list[Tensor]]:
        """The read's predictive and ``[density score, bag-of-words entropy]`` (one pass, one
        density evaluation)."""
        res, density = fitted.state["read"].predict_and_score(self.features(run, "", x))
        return res, [density, predictive_entropy(fitted.state["bow"].probs(x).double())]

    def score(self, fitted: Fitted, run: Run, x: Tensor) -> Tensor:
        return self.predict_and_score(fitted, run, x)[1]

    def predict_and_score(
        self, fitted: Fitted, run: Run, x: Tensor
    ) -> tuple[PredictionResult, Tensor]:
        res, parts = self._parts(fitted, run, x)
        return res, combine_scores(parts, fitted.state["val"])


class DensityBagOfWordsPair(DensityBagOfWords):
    """:class:`DensityBagOfWords` on each of the first two networks from scratch (the ensemble's
    first members), averaged: the predictive the two density predictives stacked (``S = 2``),
    the score the mean of the two members' standardised sums (the bag of words, one fit, in
    both), as :class:`~bayesattn.posthoc.ReadEnsemble` of two
    :class:`~bayesattn.posthoc.TextDensityRead` computes it."""

    size = 2

    def fit(self, run: Run) -> Fitted:
        nets, secs = run.members(self.size)
        bow, bow_secs = bag_of_words(run)
        reads, fit_secs = member_reads(run, self.size, self.views, run.passes)
        f = Fitted(list(nets), sum(secs) + bow_secs + fit_secs, params={"C": bow.C, "view": "cls"})
        f.state.update(reads=reads, run=run, bow=bow)
        f.state["val"] = self._each(f, run, run.data.x_val)[1]
        f.params.update(members=self.size, temperature=[r.temperature for r in reads],
                        prior_strength=[r.prior_strengths for r in reads])  # fmt: skip
        return f

    def _each(
        self, fitted: Fitted, run: Run, x: Tensor
    ) -> tuple[PredictionResult, list[list[Tensor]]]:
        """The members' predictives stacked ``(M, B, C)`` and per member ``[density score,
        bag-of-words entropy]`` (per member one pass and one density evaluation)."""
        h = predictive_entropy(fitted.state["bow"].probs(x).double())
        each = [r.predict_and_score(run.passes("", x, member=m))
                for m, r in enumerate(fitted.state["reads"])]  # fmt: skip
        probs = torch.cat([res.probs for res, _ in each])
        return (PredictionResult(probs=probs, kind="posthoc/density_bow_pair"),
                [[s, h] for _, s in each])  # fmt: skip

    def predict(self, fitted: Fitted, x: Tensor) -> PredictionResult:
        run: Run = fitted.state["run"]
        probs = [r.predict(run.passes("", x, member=m)).probs
                 for m, r in enumerate(fitted.state["reads"])]  # fmt: skip
        return PredictionResult(probs=torch.cat(probs), kind="posthoc/density_bow_pair")

    def predict_and_score(
        self, fitted: Fitted, run: Run, x: Tensor
    ) -> tuple[PredictionResult, Tensor]:
        res, each = self._each(fitted, run, x)
        sums = [combine_scores(p, v) for p, v in zip(each, fitted.state["val"], strict=True)]
        return res, torch.stack(sums).mean(0)  # (B,)

    def posterior_kl(self, fitted: Fitted, run: Run) -> tuple[float, float]:
        return 0.0, float(sum(r.kl() for r in fitted.state["reads"]))


class Pretrained(Deterministic):
    """The deterministic network fine-tuned from the masked-LM trunk; its score the entropy."""

    name = "pretrained"
    description = ("the deterministic network fine-tuned from a masked-LM trunk pretrained on "
                   "texts of no class (once per study; each run charged its share)")  # fmt: skip

    def applies_to(self, dataset: StudyDataset) -> bool:
        return bool(dataset.pretraining_texts())

    def fit(self, run: Run) -> Fitted:
        nets, secs = run.pretrained_members(1)
        return Fitted(nets, secs[0], params={"pretraining": run.cache["pretrained_info"]})


for _m in (
    BagOfWordsMethod(),
    Pretrained(),
    TokenDensity(
        "density_pretrained",
        "the CLS density read of the network fine-tuned from the masked-LM trunk",
        pretrained=True,
    ),
    DensityBagOfWords(
        "density_bow",
        "the CLS density score + the bag of words' entropy, each standardised on validation, "
        "summed; the read's predictive",
        pretrained=False,
    ),
    DensityBagOfWordsPair(
        "density_bow_pair",
        "density_bow on each of two networks from scratch (the ensemble's first two), "
        "averaged (ReadEnsemble of two TextDensityReads)",
    ),
    DensityBagOfWords(
        "density_pretrained_bow",
        "density_bow on the network fine-tuned from the masked-LM trunk",
        pretrained=True,
    ),
):
    register_method(_m)
