import pytest
import torch

from bayesattn import functional as BF
from bayesattn.priors import (
    CausalPrior,
    ContextualPrior,
    DistanceDecayPrior,
    LearnedPrior,
    LocalWindowPrior,
    SumPrior,
    UniformPrior,
    alibi_slopes,
)

B, H, TQ, TK, D = 2, 4, 5, 6, 8


@pytest.fixture
def qk():
    return torch.randn(B, H, TQ, D), torch.randn(B, H, TK, D)


def _full(lp):
    return lp.expand(B, H, TQ, TK)


def test_uniform_is_plain_softmax(qk):
    q, k = qk
    lp = UniformPrior()(q, k)
    logits = BF.attention_logits(q, k)
    torch.testing.assert_close(BF.posterior_weights(logits, lp), torch.softmax(logits, -1))


def test_causal_matches_torch_causal_mask(qk):
    q, k = qk
    lp = _full(CausalPrior()(q, k))[0, 0]
    ref = torch.ones(TQ, TK).tril().logical_not()  # torch's is_causal (top-left aligned)
    assert torch.equal(lp == float("-inf"), ref)
    # bottom-right alignment for cached decoding
    lp2 = CausalPrior()(q, k, q_pos=torch.arange(TK - TQ, TK))[0, 0]
    assert torch.equal(lp2 == float("-inf"), torch.ones(TQ, TK).tril(TK - TQ).logical_not())


@pytest.mark.parametrize("causal", [False, True])
def test_local_window_band(qk, causal):
    q, k = qk
    lp = _full(LocalWindowPrior(2, causal=causal)(q, k))[0, 0]
    for i in range(TQ):
        for j in range(TK):
            ok = (0 <= i - j <= 2) if causal else abs(i - j) <= 2
            assert (lp[i, j] == 0) == ok and (lp[i, j] == float("-inf")) == (not ok)


def test_alibi_slopes_and_distance_decay(qk):
    q, k = qk
    s = alibi_slopes(8)
    torch.testing.assert_close(s, torch.tensor([2.0 ** (-(i + 1)) for i in range(8)]))
    assert alibi_slopes(6).shape == (6,)
    prior = DistanceDecayPrior(H)
    lp = _full(prior(q, k))
    for h in range(H):
        for i in range(TQ):
            for j in range(TK):
                torch.testing.assert_close(lp[0, h, i, j], -prior.slopes[h] * abs(i - j))


def test_learned_prior_table_lookup_and_clipping(qk):
    q, k = qk
    prior = LearnedPrior(H, max_distance=2)
    with torch.no_grad():
        prior.table.copy_(torch.randn_like(prior.table))
    lp = _full(prior(q, k))
    for i in range(TQ):
        for j in range(TK):
            d = max(-2, min(2, i - j))
            torch.testing.assert_close(lp[1, 3, i, j], prior.table[3, d + 2])
    lp.sum().backward()
    assert prior.table.grad is not None and prior.table.grad.abs().sum() > 0


def test_contextual_prior_depends_on_keys_only_and_is_normalised(qk):
    q, k = qk
    prior = ContextualPrior(D, hidden=16)
    lp = prior(q, k)
    assert lp.shape == (B, H, 1, TK)
    torch.testing.assert_close(lp.exp().sum(-1), torch.ones(B, H, 1))
    torch.testing.assert_close(prior(torch.randn_like(q), k), lp)  # independent of queries
    assert not torch.allclose(prior(q, torch.randn_like(k)), lp)


def test_composition_is_sum_of_log_priors(qk):
    q, k = qk
    a, b, c = CausalPrior(), DistanceDecayPrior(H), LocalWindowPrior(1)
    s = a + b + c
    assert isinstance(s, SumPrior) and len(s.terms) == 3
    torch.testing.assert_close(_full(s(q, k)), _full(a(q, k)) + _full(b(q, k)) + _full(c(q, k)))
    # product of priors: posterior ∝ π_a π_b exp(qk): equals applying the masks one by one
    w = BF.posterior_weights(BF.attention_logits(q, k), s(q, k))
    assert torch.all(w[..., 0, 1:] == 0) and torch.allclose(w.sum(-1), torch.ones(B, H, TQ))


def test_prior_parameters_are_registered():
    s = LearnedPrior(2, 3) + DistanceDecayPrior(2, learnable=True)
    names = {n for n, _ in s.named_parameters()}
    assert names == {"terms.0.table", "terms.1.log_slopes"}


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: LocalWindowPrior(-1), "window"),
        (lambda: LocalWindowPrior(1.5), "window"),
        (lambda: DistanceDecayPrior(4, slopes=torch.ones(3)), r"slopes must have shape"),
        (lambda: DistanceDecayPrior(2, slopes=torch.tensor([1.0, -1.0])), "non-negative"),
        (lambda: LearnedPrior(0, 2), "num_heads"),
        (lambda: LearnedPrior(2, -1), "max_distance"),
        (lambda: ContextualPrior(0), "head_dim"),
        (lambda: SumPrior(), "at least one"),
        (lambda: SumPrior(CausalPrior(), "x"), "KeyRelevancePrior"),
        (lambda: alibi_slopes(0), "num_heads"),
    ],
)
def test_invalid_hyperparameters(make, match):
    with pytest.raises((ValueError, TypeError), match=match):
        make()


def test_bad_shapes(qk):
    q, k = qk
    with pytest.raises(ValueError, match=r"q \(B, H, Tq, Dh\)"):
        CausalPrior()(q[0], k[0])
    with pytest.raises(ValueError, match=r"q_pos must have shape \(5,\)"):
        CausalPrior()(q, k, q_pos=torch.arange(3))
    with pytest.raises(ValueError, match="last dim 8"):
        ContextualPrior(8)(q, k[..., :4])
    with pytest.raises(ValueError, match="DistanceDecayPrior has 3 heads"):
        DistanceDecayPrior(3)(q, k)


def test_contextual_prior_works_in_float64_and_learned_prior_checks_heads(qk):
    q, k = qk
    lp = ContextualPrior(D)(q.double(), k.double())
    assert lp.dtype == torch.float64
    with pytest.raises(ValueError, match="LearnedPrior has 3 heads"):
        LearnedPrior(3, 2)(q, k)
