r"""The recommended uncertainty of a token classifier: the density read of its CLS output,
summed with a bag of words' entropy (:class:`TextDensityRead`).

.. math::

    s(x) = \frac{s_D(x) - \mu_D}{\sigma_D} + \frac{H[p_{\mathrm{bow}}(\cdot \mid x)] -
    \mu_H}{\sigma_H}

with :math:`s_D` the :class:`~bayesattn.posthoc.density.DensityRead` score of the CLS output
(the head's input), :math:`p_{\mathrm{bow}}` a TF-IDF + logistic regression of the same token
ids (:mod:`bayesattn.calibration.bag_of_words`, its inverse penalty by validation NLL), and
:math:`\mu, \sigma` the mean and standard deviation of each part on the validation texts of the
known classes: what the network's features say and what the words alone say, on one scale, with
equal weights (no out-of-distribution data fits a weight). The predictive is the density
read's (its density-aware temperature); the bag of words adds to the score only.

On WordNet's held-out topics the sum found held-out classes better than either part, level with
a 5-network ensemble at a quarter of its training time (the study's ``density_bow``); read on
two networks and averaged, ``ReadEnsemble.of([a, b], TextDensityRead)``, it is above the
ensemble, with a lower NLL (``density_bow_pair``; the numbers are on the "Which attention"
page, "Words").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from .._validation import check_int, check_reals
from ..calibration.bag_of_words import DEFAULT_CS, BagOfWordsWeights, fit_bag_of_words
from ..calibration.metrics import predictive_entropy
from ..calibration.token_scores import combine_scores
from ..nn.networks.base import check_tokens
from ..predictive import PredictionResult
from ._density_core import DEFAULT_STRENGTHS
from .base import PosthocRead
from .density import DensityRead

__all__ = ["TextDensityRead"]

#: the names of the two parts of the score, in :meth:`TextDensityRead.parts` order
PARTS = ("density", "bag_of_words_entropy")


def _attribute(model: nn.Module, ours: str, hf: str) -> Any:
    """``model.<ours>`` (our networks), else ``model.config.<hf>`` (a transformers model)."""
    value = getattr(model, ours, None)
    if value is None:
        value = getattr(getattr(model, "config", None), hf, None)
    return value


class TextDensityRead(PosthocRead):
    """The density read of a token classifier's CLS output + a bag of words' entropy (module
    docstring). It reads token ids ``(B, T)``, or a tokenizer's dict (``input_ids``,
    ``attention_mask``, …: the model reads the dict, the bag of words its ``input_ids``); never
    :class:`~bayesattn.posthoc.features.Features` (the bag of words needs the words).

    Args:
        model: the trained token classifier (e.g. a
            :class:`~bayesattn.nn.networks.TransformerClassifier` with ``vocab_size``).
        vocab_size: the number of token ids (``None``: ``model.vocab_size``, or a transformers
            model's ``config.vocab_size``).
        pad_id: the padding id the bag of words does not count (``None``: ``model.pad_id``, or
            ``config.pad_token_id``, else 0).
        views: the density read's views (default ``("cls",)``: the head's input).
        strengths: the density read's candidate prior strengths.
        Cs: the logistic regression's candidate inverse penalties (chosen by validation NLL).
        head, tokens_layer, forward, batch_size: how the features are read
            (:class:`~bayesattn.posthoc.base.PosthocRead`).
    """

    takes_inputs = True

    def __init__(
        self,
        model: nn.Module,
        *,
        vocab_size: int | None = None,
        pad_id: int | None = None,
        views: Sequence[str] = ("cls",),
        strengths: Sequence[float] = DEFAULT_STRENGTHS,
        Cs: Sequence[float] = DEFAULT_CS,
        **kwargs: Any,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(
                "TextDensityRead reads token ids through the model: model must be an nn.Module; "
                f"got {type(model).__name__}"
            )
        super().__init__(model, **kwargs)
        if vocab_size is None:
            vocab_size = _attribute(model, "vocab_size", "vocab_size")
            if vocab_size is None:
                raise ValueError(
                    f"vocab_size: {type(model).__name__} has no vocab_size (nor config.vocab_size: "
                    "not a token model?); give TextDensityRead(model, vocab_size=...)"
                )
        self.vocab_size = check_int("vocab_size", vocab_size, 2)
        if pad_id is None:
            pad_id = _attribute(model, "pad_id", "pad_token_id") or 0
        self.pad_id = check_int("pad_id", pad_id, 0, self.vocab_size - 1)
        self.Cs = tuple(check_reals("Cs", Cs, gt=0))
        self.density = DensityRead(model, views=views, strengths=strengths, **kwargs)
        self.bow_: BagOfWordsWeights | None = None
        self.C_: float | None = None
        self.reference_: Tensor | None = None  # (M, 2) the parts of the validation texts

    # ---- the two parts -------------------------------------------------------------------

    def _ids(self, name: str, x: Any) -> Tensor:
        """The token ids of ``x``: ``x`` itself, or a tokenizer's dict's ``input_ids``."""
        if isinstance(x, Mapping):
            if "input_ids" not in x:
                raise ValueError(
                    f"{name}: a dict of model inputs must hold 'input_ids' (the bag of words "
                    f"reads the words); got keys {sorted(x)}"
                )
            name, x = f"{name}['input_ids']", x["input_ids"]
        check_tokens(name, x, self.vocab_size)  # (B, T) integer ids in [0, vocab_size)
        return x

    def _bow(self) -> BagOfWordsWeights:
        self._check_fitted()
        assert self.bow_ is not None
        return self.bow_

    @property
    def bag_of_words(self) -> BagOfWordsWeights:
        """The fitted TF-IDF + logistic regression, as tensors."""
        return self._bow()

    @property
    def C(self) -> float:
        """The logistic regression's inverse penalty, chosen by validation NLL."""
        self._check_fitted()
        assert self.C_ is not None
        return self.C_

    def _entropy(self, x: Tensor) -> Tensor:
        return predictive_entropy(self._bow().probs(x))  # (B,)

    def _stack(self, density: Tensor, ids: Tensor) -> Tensor:
        """The parts ``(B, 2)`` from the density scores ``(B,)`` and the token ids ``(B, T)``."""
        return torch.stack([density.double(), self._entropy(ids)], -1)

    def parts(self, x: Any) -> Tensor:
        """``(B, 2)`` float64: the density score and the bag of words' entropy (:data:`PARTS`),
        not standardised."""
        self._check_fitted()
        ids = self._ids("x", x)
        return self._stack(self.density.score(x), ids)

    def _combine(self, parts: Tensor) -> Tensor:
        """Each part standardised on its validation values, summed: ``(B, 2)`` → ``(B,)``."""
        assert self.reference_ is not None
        return combine_scores(list(parts.T), list(self.reference_.T))

    # ---- the estimator API -----------------------------------------------------------------

    def _fit(self, x: Any, y: Tensor, val: tuple[Any, Tensor] | None) -> None:
        if val is None:
            raise ValueError(
                "TextDensityRead.fit needs a validation split of the known classes (the density "
                "read's scale and temperature, the bag of words' penalty and the two parts' "
                "scales): fit(x, y, val=(x_val, y_val)); got val=None"
            )
        (xv, yv), ids, ids_v = val, self._ids("x", x), self._ids("val x", val[0])
        if len(ids_v) < 2:
            raise ValueError(f"val needs at least 2 texts to set the parts' scales; got {len(ids_v)}")
        fv = self.density.features(xv)  # one pass over the validation texts, read twice
        self.density.fit(x, y, val=(fv, yv))
        bow = fit_bag_of_words((ids, y), (ids_v, yv), self.vocab_size, self.Cs, pad_id=self.pad_id)
        self.bow_, self.C_ = bow.weights(), bow.C
        self.num_classes = self.density.num_classes
        self.reference_ = self._stack(self.density.score(fv), ids_v)  # (M, 2)

    def _predict(self, x: Any, num_samples: int | None) -> PredictionResult:
        self._ids("x", x)
        return self.density.predict(x, num_samples)

    def _score(self, x: Any) -> Tensor:
        return self._combine(self.parts(x))

    def predict_and_score(
        self, x: Any, num_samples: int | None = None
    ) -> tuple[PredictionResult, Tensor]:
        """:meth:`predict` and :meth:`score` of one feature pass."""
        self._check_fitted()
        ids = self._ids("x", x)
        pred, density = self.density.predict_and_score(x, num_samples)
        return pred, self._combine(self._stack(density, ids))

    def kl(self) -> float:
        """The density read's KL from its prior (nats); the bag of words is a point estimate."""
        return self.density.kl()

    # ---- saving ---------------------------------------------------------------------------

    def _state(self) -> dict[str, Any]:
        assert self.reference_ is not None
        b = self._bow()
        return {
            "density": self.density.state_dict(), "bag_of_words": [b.idf, b.coef, b.bias],
            "C": self.C, "reference": self.reference_,
            "vocab_size": self.vocab_size, "pad_id": self.pad_id,
        }  # fmt: skip

    def _load(self, state: dict[str, Any]) -> None:
        if int(state["vocab_size"]) != self.vocab_size or int(state["pad_id"]) != self.pad_id:
            raise ValueError(
                f"state is of vocab_size={state['vocab_size']}, pad_id={state['pad_id']}; this "
                f"read has vocab_size={self.vocab_size}, pad_id={self.pad_id}"
            )
        self.density.load_state_dict(state["density"])
        idf, coef, bias = state["bag_of_words"]
        self.bow_ = BagOfWordsWeights(idf, coef, bias, pad_id=self.pad_id)
        self.C_ = float(state["C"])
        self.reference_ = state["reference"]
