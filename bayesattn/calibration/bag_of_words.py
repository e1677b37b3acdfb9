r"""The linear baseline every token data set reports: TF-IDF of the token ids + multinomial
logistic regression (scikit-learn), on exactly the inputs the network sees (the same
vocabulary, the same ``max_len`` cut; padding ignored, the unknown word one more column).

Counts :math:`n_{iw}` of word :math:`w` in text :math:`i` become
:math:`\big(n_{iw}\,(\log\frac{1 + N}{1 + \mathrm{df}_w} + 1)\big)` rows scaled to unit
:math:`\ell_2` norm (scikit-learn's smoothed ``TfidfTransformer``, the document frequencies of
the training texts); the L2 penalty :math:`1/C` of the logistic regression is chosen among
``Cs`` by the validation NLL (in-distribution data only). The held-out AUROC is by the
predictive entropy :math:`-\sum_c p_c \log p_c`, declared before any result.

A fitted :class:`BagOfWords` also gives its weights as tensors (:meth:`BagOfWords.weights`,
:class:`BagOfWordsWeights`): the same probabilities computed in torch
(:func:`tfidf_logistic_probs`), with no scikit-learn object to pickle, so a read that holds it
saves with ``torch.save`` and loads with ``torch.load(weights_only=True)``."""

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

__all__ = ["BagOfWords", "BagOfWordsWeights", "fit_bag_of_words", "bag_of_words_row", "token_counts",
           "tfidf_logistic_probs"]  # fmt: skip

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


def _check_ids(x: Any, vocab_size: int) -> Tensor:
    if not isinstance(x, Tensor) or x.dim() != 2 or x.is_floating_point():
        raise ValueError(f"x must be (N, T) integer token ids; got {getattr(x, 'shape', x)!r:.80}")
    if x.numel() and (int(x.min()) < 0 or int(x.max()) >= vocab_size):
        raise ValueError(
            f"x must hold ids in [0, {vocab_size}); got [{int(x.min())}, {int(x.max())}]"
        )
    return x


def token_counts(x: Tensor, vocab_size: int, pad_id: int = 0) -> Any:
    """The sparse count matrix ``(N, vocab_size)`` (``scipy.sparse.csr_matrix``) of token ids
    ``x`` ``(N, T)``; ``pad_id`` positions are not counted."""
    from scipy.sparse import csr_matrix

    _check_ids(x, check_int("vocab_size", vocab_size, 1))
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
    pad_id: int = 0

    def probs(self, x: Tensor) -> Tensor:
        """Class probabilities ``(N, C)`` float64 of token ids ``x`` ``(N, T)``."""
        feats = self.tfidf.transform(token_counts(x, self.vocab_size, self.pad_id))
        return torch.as_tensor(self.model.predict_proba(feats), dtype=torch.float64)

    def weights(self) -> BagOfWordsWeights:
        """The fitted TF-IDF and logistic regression as float64 tensors (a binary regression's
        one row :math:`w` becomes the two rows :math:`(0, w)`: the same softmax)."""
        coef = torch.as_tensor(self.model.coef_, dtype=torch.float64)  # (C or 1, V)
        bias = torch.as_tensor(self.model.intercept_, dtype=torch.float64)  # (C or 1,)
        if coef.shape[0] == 1:
            coef = torch.cat([torch.zeros_like(coef), coef])
            bias = torch.cat([torch.zeros_like(bias), bias])
        idf = torch.as_tensor(self.tfidf.idf_, dtype=torch.float64)  # (V,)
        return BagOfWordsWeights(idf, coef, bias, self.pad_id)


@dataclass
class BagOfWordsWeights:
    """A TF-IDF + logistic regression as tensors: ``idf (V,)``, ``coef (C, V)``, ``bias (C,)``
    and the id not counted, ``pad_id`` (:func:`tfidf_logistic_probs`)."""

    idf: Tensor
    coef: Tensor
    bias: Tensor
    pad_id: int = 0

    def __post_init__(self) -> None:
        _check_weights(self.idf, self.coef, self.bias)
        check_int("pad_id", self.pad_id, 0, self.vocab_size - 1)

    @property
    def vocab_size(self) -> int:
        return int(self.idf.shape[0])

    def probs(self, x: Tensor) -> Tensor:
        """Class probabilities ``(N, C)`` float64 of token ids ``x`` ``(N, T)``."""
        return tfidf_logistic_probs(x, self.idf, self.coef, self.bias, self.pad_id)


def _check_weights(idf: Any, coef: Any, bias: Any) -> None:
    ts = (idf, coef, bias)
    ok = (
        all(isinstance(t, Tensor) and t.is_floating_point() for t in ts)
        and idf.dim() == 1 and coef.dim() == 2 and bias.dim() == 1
        and coef.shape == (bias.shape[0], idf.shape[0]) and bias.shape[0] >= 2
    )  # fmt: skip
    if not ok:
        shapes = [tuple(getattr(t, "shape", ())) for t in ts]
        raise ValueError(
            f"idf, coef, bias must be float (V,), (C, V), (C,) with C >= 2; got {shapes}"
        )


def tfidf_logistic_probs(
    x: Tensor, idf: Tensor, coef: Tensor, bias: Tensor, pad_id: int = 0, batch_size: int = 512
) -> Tensor:
    r""":math:`\mathrm{softmax}(W f + b)` with :math:`f = (n \odot \mathrm{idf}) /
    \lVert n \odot \mathrm{idf} \rVert_2` (0 for a text of padding only), :math:`n` the
    word counts of a text (``pad_id`` not counted): scikit-learn's ``TfidfTransformer`` (l2
    norm) then ``LogisticRegression.predict_proba``.

    Shape:
        x ``(N, T)`` ids in ``[0, V)``, idf ``(V,)``, coef ``(C, V)``, bias ``(C,)`` → ``(N, C)``.
    """
    _check_weights(idf, coef, bias)
    V = int(idf.shape[0])
    check_int("pad_id", pad_id, 0, V - 1)
    _check_ids(x, V)
    out = []
    for i in range(0, len(x), batch_size):
        xb = x[i : i + batch_size]  # (n, T)
        n = torch.zeros(len(xb), V, dtype=torch.float64).scatter_add_(
            1, xb.long(), torch.ones(xb.shape, dtype=torch.float64)
        )  # (n, V)
        n[:, pad_id] = 0.0
        f = n * idf.double()  # (n, V)
        f = f / f.norm(dim=1, keepdim=True).clamp_min(1e-300)
        out.append(torch.softmax(f @ coef.double().T + bias.double(), -1))  # (n, C)
    return torch.cat(out) if out else torch.zeros(0, coef.shape[0], dtype=torch.float64)


def fit_bag_of_words(
    train: tuple[Tensor, Tensor],
    val: tuple[Tensor, Tensor],
    vocab_size: int,
    Cs: Sequence[float] = DEFAULT_CS,
    pad_id: int = 0,
) -> BagOfWords:
    """TF-IDF + logistic regression on ``train = (x, y)`` token ids ``(N, T)`` and labels
    ``(N,)`` (``pad_id`` not counted); the inverse penalty ``C`` among ``Cs`` with the lowest
    NLL on ``val``."""
    tfidf_cls, lr_cls = _sklearn()
    if not Cs or any(not (float(c) > 0) for c in Cs):
        raise ValueError(f"Cs must be a non-empty sequence of numbers > 0; got {Cs}")
    (xt, yt), (xv, yv) = train, val
    counts = lambda x: token_counts(x, vocab_size, pad_id)  # noqa: E731
    tfidf = tfidf_cls().fit(counts(xt))
    ft, fv = tfidf.transform(counts(xt)), tfidf.transform(counts(xv))
    best: BagOfWords | None = None
    for c in Cs:
        model = lr_cls(C=float(c), max_iter=2000).fit(ft, yt.numpy())
        if list(model.classes_) != list(range(len(model.classes_))):
            raise ValueError(f"y_train must hold every class 0..C-1; got {model.classes_}")
        pv = torch.as_tensor(model.predict_proba(fv), dtype=torch.float64)
        nll = negative_log_likelihood(pv, yv)
        if best is None or nll < best.val_nll:
            best = BagOfWords(tfidf, model, vocab_size, float(c), nll, pad_id)
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
