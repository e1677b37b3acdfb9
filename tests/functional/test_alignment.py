"""The latent-alignment maths: mixture likelihood and Bayes-rule posterior against loops over
positions, KL/entropy/Jensen-Shannon against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from bayesattn.functional.alignment import (
    alignment_log_posterior,
    alignment_log_prior,
    categorical_entropy,
    categorical_kl,
    jensen_shannon,
    mixture_log_probs,
)


def _random_model(seed: int = 0, B: int = 2, T: int = 3, Ts: int = 4, V: int = 5):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(B, T, Ts, generator=g, dtype=torch.float64)
    em = torch.log_softmax(torch.randn(B, T, Ts, V, generator=g, dtype=torch.float64), -1)
    return scores, em


def test_mixture_equals_sum_over_positions_in_probability_space() -> None:
    scores, em = _random_model()
    pad = torch.tensor([[False, False, False, True], [False, False, False, False]])
    log_prior = alignment_log_prior(scores, pad)
    got = mixture_log_probs(log_prior, em).exp()  # (B, T, V)
    B, T, Ts, V = em.shape
    for b in range(B):
        for t in range(T):
            w = [0.0 if pad[b, j] else math.exp(scores[b, t, j]) for j in range(Ts)]
            z = sum(w)
            for v in range(V):
                want = sum(w[j] / z * math.exp(em[b, t, j, v]) for j in range(Ts))
                assert got[b, t, v].item() == pytest.approx(want, rel=1e-12)
    assert torch.allclose(got.sum(-1), torch.ones(B, T, dtype=torch.float64))


def test_posterior_is_bayes_rule_by_hand() -> None:
    prior = torch.tensor([0.5, 0.3, 0.2, 0.0], dtype=torch.float64)
    lik = torch.tensor([0.1, 0.6, 0.2, 0.9], dtype=torch.float64)  # p(y_t | z = j)
    post = alignment_log_posterior(prior.log(), lik.log()).exp()
    joint = [0.05, 0.18, 0.04, 0.0]
    want = torch.tensor([j / sum(joint) for j in joint], dtype=torch.float64)
    assert torch.allclose(post, want, atol=1e-15)
    assert post[3] == 0.0  # a padded position stays impossible


def test_prior_masks_padded_positions() -> None:
    scores = torch.zeros(1, 2, 3)
    lp = alignment_log_prior(scores, torch.tensor([[False, True, False]]))
    assert torch.equal(lp.exp(), torch.tensor([[[0.5, 0.0, 0.5], [0.5, 0.0, 0.5]]]))


def test_kl_entropy_and_disagreement_by_hand() -> None:
    p = torch.tensor([0.5, 0.5, 0.0], dtype=torch.float64)
    q = torch.tensor([0.25, 0.25, 0.5], dtype=torch.float64)
    assert categorical_kl(p.log(), q.log()).item() == pytest.approx(math.log(2))
    assert categorical_kl(p.log(), p.log()).item() == 0.0
    assert categorical_entropy(p.log()).item() == pytest.approx(math.log(2))
    draws = torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)  # two certain, opposite
    assert jensen_shannon(draws).item() == pytest.approx(math.log(2))
    same = torch.tensor([[0.3, 0.7], [0.3, 0.7]], dtype=torch.float64)
    assert jensen_shannon(same).item() == pytest.approx(0.0, abs=1e-15)
