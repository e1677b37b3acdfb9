"""The TF-IDF + logistic regression baseline of the token data sets
(bayesattn.calibration.bag_of_words): the counts against a loop, the probabilities against
scikit-learn's own text pipeline on the same words, the validation choice of C, and the row's
metrics on a task where the answer is known."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from bayesattn.calibration import negative_log_likelihood
from bayesattn.calibration.bag_of_words import bag_of_words_row, fit_bag_of_words, token_counts

pytest.importorskip("sklearn")


def _texts(n: int, seed: int, classes: int = 3, vocab: int = 30, length: int = 8) -> tuple:
    """Class ``c`` draws its words from ``2 + 8c .. 2 + 8c + 9`` (overlapping blocks), with
    trailing padding."""
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % classes
    x = 2 + 8 * y[:, None] + torch.randint(0, 10, (n, length), generator=g)
    x = x.clamp_max(vocab - 1)
    x[:, length - 2 :] = 0
    return x, y


def test_token_counts_match_a_loop():
    x = torch.tensor([[3, 3, 1, 0, 0], [2, 4, 4, 4, 0]])
    c = token_counts(x, vocab_size=5).toarray()
    expected = np.zeros((2, 5))
    for i, row in enumerate(x.tolist()):
        for t in row:
            if t != 0:
                expected[i, t] += 1
    assert np.array_equal(c, expected)
    with pytest.raises(ValueError, match="ids in"):
        token_counts(x, vocab_size=4)
    with pytest.raises(ValueError, match="x must be"):
        token_counts(x.float(), vocab_size=5)


def test_probabilities_match_sklearns_text_pipeline():
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression

    (xt, yt), (xv, yv) = _texts(90, 0), _texts(30, 1)
    bow = fit_bag_of_words((xt, yt), (xv, yv), vocab_size=30, Cs=(1.0,))

    def words(x: torch.Tensor) -> list[str]:
        return [" ".join(f"w{t}" for t in row if t != 0) for row in x.tolist()]

    vec = TfidfVectorizer(token_pattern=r"\S+")
    lr = LogisticRegression(C=1.0, max_iter=2000).fit(vec.fit_transform(words(xt)), yt.numpy())
    ref = lr.predict_proba(vec.transform(words(xv)))
    assert np.allclose(bow.probs(xv).numpy(), ref, atol=1e-6)


def test_c_is_chosen_by_validation_nll():
    (xt, yt), (xv, yv) = _texts(90, 0), _texts(60, 1)
    Cs = (0.01, 1.0, 100.0)
    nlls = [fit_bag_of_words((xt, yt), (xv, yv), 30, Cs=(c,)).val_nll for c in Cs]
    bow = fit_bag_of_words((xt, yt), (xv, yv), 30, Cs=Cs)
    assert bow.C == Cs[int(np.argmin(nlls))]
    assert bow.val_nll == pytest.approx(negative_log_likelihood(bow.probs(xv), yv))
    with pytest.raises(ValueError, match="Cs"):
        fit_bag_of_words((xt, yt), (xv, yv), 30, Cs=(0.0,))


def test_row_separates_known_classes_from_texts_of_unseen_words():
    (xt, yt), (xv, yv), (xs, ys) = _texts(150, 0), _texts(60, 1), _texts(60, 2)
    g = torch.Generator().manual_seed(3)
    x_ood = torch.randint(26, 30, (40, 8), generator=g)  # words no class draws (26..29)
    x_ood[:, :4] = 1  # and unknown words
    data = SimpleNamespace(x_train=xt, y_train=yt, x_val=xv, y_val=yv, x_test=xs, y_test=ys,
                           x_ood_classes=x_ood, vocab_size=30)  # fmt: skip
    row = bag_of_words_row(data)
    assert row["accuracy"] > 0.9 and row["nll"] < 0.5
    assert row["auroc_entropy"] > 0.9 and row["auroc_maxprob"] > 0.9
    assert 0 <= row["ece"] <= 1 and row["C"] in (0.1, 1.0, 10.0, 100.0, 1000.0)


@pytest.mark.parametrize("classes", [2, 3])
def test_the_tensor_weights_give_sklearns_probabilities(classes):
    (xt, yt), (xv, yv) = _texts(90, 0, classes), _texts(30, 1, classes)
    xv[0] = 0  # a text of padding only
    xv[1, :3] = 1  # unknown words count as one more word
    bow = fit_bag_of_words((xt, yt), (xv, yv), vocab_size=30)
    w = bow.weights()
    assert w.coef.shape == (classes, 30) and w.vocab_size == 30
    torch.testing.assert_close(w.probs(xv), bow.probs(xv), rtol=0, atol=1e-12)
    torch.testing.assert_close(w.probs(xt), bow.probs(xt), rtol=0, atol=1e-12)
    # another padding id: that id is not counted, on both paths
    xt7, xv7 = torch.where(xt == 0, 7, xt), torch.where(xv == 0, 7, xv)
    b7 = fit_bag_of_words((xt7, yt), (xv7, yv), vocab_size=30, pad_id=7)
    torch.testing.assert_close(b7.weights().probs(xv7), b7.probs(xv7), rtol=0, atol=1e-12)


def test_the_tensor_weights_refuse_bad_shapes_and_ids():
    from bayesattn.calibration.bag_of_words import BagOfWordsWeights, tfidf_logistic_probs

    idf, coef, bias = torch.ones(5, dtype=torch.float64), torch.zeros(3, 5), torch.zeros(3)
    with pytest.raises(ValueError, match=r"\(V,\), \(C, V\), \(C,\).*\[\(5,\), \(3, 4\), \(3,\)\]"):
        BagOfWordsWeights(idf, coef[:, :4], bias)
    with pytest.raises(ValueError, match="C >= 2"):
        BagOfWordsWeights(idf, coef[:1], bias[:1])
    with pytest.raises(ValueError, match="pad_id"):
        BagOfWordsWeights(idf, coef, bias, pad_id=5)
    with pytest.raises(ValueError, match=r"ids in \[0, 5\)"):
        tfidf_logistic_probs(torch.tensor([[1, 5]]), idf, coef, bias)
    with pytest.raises(ValueError, match="integer token ids"):
        tfidf_logistic_probs(torch.ones(2, 3), idf, coef, bias)
