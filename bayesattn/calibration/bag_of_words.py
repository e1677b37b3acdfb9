r"""The linear baseline every token data set reports: TF-IDF of the token ids + multinomial
logistic regression (scikit-learn), on exactly the inputs the network sees (the same
vocabulary, the same ``max_len`` cut; padding ignored, the unknown word one more column).

Counts :math:`n_{iw}` of word :math:`w` in text :math:`i` become
:math:`\big(n_{iw}\,(\log\frac{1 + N}{1 + \mathrm{df}_w} + 1)\big)` rows scaled to unit
:math:`\ell_2` norm (scikit-learn's smoothed ``TfidfTransformer``, the document frequencies of
the training texts); the L2 penalty :math:`1/C` of the logistic regression is chosen among
``Cs`` by the validation NLL (in-distribution data only). The held-out AUROC is by the
predictive entropy :math:`-\sum_c p_c \log p_c`, declared before any result."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .._validation import check_int
from .metrics import (
    accuracy,
    expected_calibration_error,
    negative_log_likelihood,
    predictive_entropy,
)
from .ood import ood_auroc

__all__ = ["BagOfWords", "fit_bag_of_words", "bag_of_words_row", "token_counts"]

#: the inverse penalties tried (a decade grid)
DEFAULT_CS: tuple[float, ...] = (0.1, 1.0, 10.0, 100.0, 1000.0)


def _sklearn() -> tuple[Any, Any]:
    try:
        from sklearn.feature_extraction.text import TfidfTransformer
        from sklearn.linear_model import LogisticRegression
    except ImportError as exc:  # pragma: no cover - scikit-learn is in the study extra
        raise ImportError(
            "the bag-of-words baseline needs scikit-learn: pip install bayesattn[study]"
        ) from exc
    return TfidfTransformer, LogisticRegression


def token_counts(x: Tensor, vocab_size: int, pad_id: int = 0) -> Any:
    """The sparse count matrix ``(N, vocab_size)`` (``scipy.sparse.csr_matrix``) of token ids
    ``x`` ``(N, T)``; ``pad_id`` positions are not counted."""
    from scipy.sparse import csr_matrix

    check_int("vocab_size", vocab_size, 1)
    if not isinstance(x, Tensor) or x.dim() != 2 or x.is_floating_point():
        raise ValueError(f"x must be (N, T) integer token ids; got {getattr(x, 'shape', x)!r:.80}")
    if x.numel() and (int(x.min()) < 0 or int(x.max()) >= vocab_size):
        raise ValueError(
            f"x must hold ids in [0, {vocab_size}); got [{int(x.min())}, {int(x.max())}]"
        )
    ids = x.cpu().numpy()
    rows = np.repeat(np.arange(ids.shape[0]), ids.shape[1])
    cols = ids.reshape(-1)
    keep = cols != pad_id
    data = np.ones(int(keep.sum()), dtype=np.float64)
    return csr_matrix((data, (rows[keep], cols[keep])), shape=(ids.shape[0], vocab_size))


@dataclass
class BagOfWords:
    """A fitted TF-IDF + logistic regression (:func:`fit_bag_of_words`)."""

    tfidf: Any
    model: Any
    vocab_size: int
    C: float
    val_nll: float

    def probs(self, x: Tensor) -> Tensor:
        """Class probabilities ``(N, C)`` float64 of token ids ``x`` ``(N, T)``."""
        feats = self.tfidf.transform(token_counts(x, self.vocab_size))
        return torch.as_tensor(self.model.predict_proba(feats), dtype=torch.float64)


def fit_bag_of_words(
    train: tuple[Tensor, Tensor],
    val: tuple[Tensor, Tensor],
    vocab_size: int,
    Cs: Sequence[float] = DEFAULT_CS,
) -> BagOfWords:
    """TF-IDF + logistic regression on ``train = (x, y)`` token ids ``(N, T)`` and labels
    ``(N,)``; the inverse penalty ``C`` among ``Cs`` with the lowest NLL on ``val``."""
    tfidf_cls, lr_cls = _sklearn()
    if not Cs or any(not (float(c) > 0) for c in Cs):
        raise ValueError(f"Cs must be a non-empty sequence of numbers > 0; got {Cs}")
    (xt, yt), (xv, yv) = train, val
    tfidf = tfidf_cls().fit(token_counts(xt, vocab_size))
    ft, fv = (
        tfidf.transform(token_counts(xt, vocab_size)),
        tfidf.transform(token_counts(xv, vocab_size)),
    )
    best: BagOfWords | None = None
    for c in Cs:
        model = lr_cls(C=float(c), max_iter=2000).fit(ft, yt.numpy())
        if list(model.classes_) != list(range(len(model.classes_))):
            raise ValueError(f"y_train must hold every class 0..C-1; got {model.classes_}")
        pv = torch.as_tensor(model.predict_proba(fv), dtype=torch.float64)
        nll = negative_log_likelihood(pv, yv)
        if best is None or nll < best.val_nll:
            best = BagOfWords(tfidf, model, vocab_size, float(c), nll)
    assert best is not None
    return best


def bag_of_words_row(data: Any, Cs: Sequence[float] = DEFAULT_CS) -> dict[str, float]:
    """The baseline's row on a token data set (any with ``x_train, y_train, x_val, y_val,
    x_test, y_test, x_ood_classes`` and ``vocab_size``, e.g.
    :class:`~bayesattn.data.fortunes.FortunesData`): test accuracy, NLL, ECE, the held-out
    classes' AUROC by predictive entropy (and by ``1 - max p``), the chosen ``C``."""
    bow = fit_bag_of_words((data.x_train, data.y_train), (data.x_val, data.y_val),
                           data.vocab_size, Cs)  # fmt: skip
    p, po = bow.probs(data.x_test), bow.probs(data.x_ood_classes)
    return {
        "accuracy": accuracy(p, data.y_test),
        "nll": negative_log_likelihood(p, data.y_test),
        "ece": expected_calibration_error(p, data.y_test),
        "auroc_entropy": ood_auroc(predictive_entropy(p), predictive_entropy(po)),
        "auroc_maxprob": ood_auroc(1 - p.max(-1).values, 1 - po.max(-1).values),
        "C": bow.C,
    }
