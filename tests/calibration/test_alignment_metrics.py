"""AER, precision and recall of alignment links on hand-made alignments."""

from __future__ import annotations

import pytest
import torch

from bayesattn.calibration import alignment_error_rate, argmax_links, link_precision_recall


def _links(pairs: list[tuple[int, int]], T: int = 3, Ts: int = 3) -> torch.Tensor:
    m = torch.zeros(T, Ts, dtype=torch.bool)
    for t, j in pairs:
        m[t, j] = True
    return m


def test_aer_precision_recall_by_hand() -> None:
    sure = _links([(0, 0), (1, 2)])
    possible = _links([(0, 0), (1, 2), (2, 1)])
    predicted = _links([(0, 0), (1, 1), (2, 1)])
    # |A| = 3, |S| = 2, |A∩S| = 1, |A∩P| = 2: AER = 1 - (1 + 2) / (3 + 2) = 0.4
    assert alignment_error_rate(predicted, sure, possible) == pytest.approx(0.4)
    assert link_precision_recall(predicted, sure, possible) == pytest.approx((2 / 3, 1 / 2))
    # without possible links P = S: AER = 1 - 2 / 5
    assert alignment_error_rate(predicted, sure) == pytest.approx(0.6)
    assert alignment_error_rate(sure, sure) == 0.0
    assert alignment_error_rate(_links([(0, 1)]), _links([(0, 0)])) == 1.0


def test_corpus_level_counts_over_leading_dims() -> None:
    a = torch.stack([_links([(0, 0)]), _links([(0, 1), (1, 1)])])  # (2, T, Ts)
    s = torch.stack([_links([(0, 0)]), _links([(0, 0), (1, 1)])])
    # |A| = 3, |S| = 3, |A∩S| = 2: not the mean of the per-sentence AERs (0 and 0.5)
    assert alignment_error_rate(a, s) == pytest.approx(1 - 4 / 6)


def test_argmax_links_one_per_scored_row() -> None:
    probs = torch.tensor([[[0.2, 0.8], [0.6, 0.4], [0.5, 0.5]]])  # (1, 3, 2)
    rows = torch.tensor([[True, True, False]])
    got = argmax_links(probs, rows)
    assert torch.equal(got, torch.tensor([[[False, True], [True, False], [False, False]]]))


def test_bad_links_raise() -> None:
    with pytest.raises(ValueError, match="sure must have the predicted links' shape"):
        alignment_error_rate(torch.zeros(2, 3, dtype=torch.bool), torch.zeros(3, 3))
    with pytest.raises(ValueError, match="predicted must hold 0/1"):
        alignment_error_rate(torch.full((2, 2), 0.5), torch.zeros(2, 2))
    with pytest.raises(TypeError, match="predicted must be a torch.Tensor"):
        alignment_error_rate([[1]], torch.zeros(1, 1))
    with pytest.raises(ValueError, match="rows must be probs' shape"):
        argmax_links(torch.rand(2, 3), torch.ones(3, dtype=torch.bool))
