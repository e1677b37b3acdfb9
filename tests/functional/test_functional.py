import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bayesattn import functional as BF


def test_logits_match_manual_and_scale_override():
    q, k = torch.randn(2, 3, 4, 8), torch.randn(2, 3, 5, 8)
    ref = torch.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(8)
    torch.testing.assert_close(BF.attention_logits(q, k), ref)
    torch.testing.assert_close(BF.attention_logits(q, k, scale=0.5), ref * math.sqrt(8) * 0.5)
    with pytest.raises(ValueError, match="scale"):
        BF.attention_logits(q, k, scale=-1.0)
    with pytest.raises(ValueError, match="last"):
        BF.attention_logits(q, torch.randn(2, 3, 5, 7))


def test_posterior_matches_softmax_and_bayes_rule():
    logits = torch.randn(4, 6, dtype=torch.float64)
    log_prior = torch.randn(4, 6, dtype=torch.float64)
    w = BF.posterior_weights(logits, log_prior)
    # Bayes' rule written out: prior * likelihood / evidence
    joint = log_prior.exp() * logits.exp()
    torch.testing.assert_close(w, joint / joint.sum(-1, keepdim=True))
    torch.testing.assert_close(BF.log_posterior_weights(logits, log_prior), w.log())


def test_all_masked_row_gives_zero_weights_output_and_gradient():
    q = torch.randn(1, 1, 3, 4, requires_grad=True)
    k, v = torch.randn(1, 1, 5, 4), torch.randn(1, 1, 5, 2)
    lp = torch.zeros(1, 1, 3, 5)
    lp[..., 1, :] = float("-inf")  # query 1 may read no key
    out, w = BF.attention(q, k, v, lp)
    assert torch.all(w[..., 1, :] == 0) and torch.all(out[..., 1, :] == 0)
    assert torch.isfinite(out).all()
    out.sum().backward()
    assert torch.isfinite(q.grad).all() and torch.all(q.grad[..., 1, :] == 0)
    assert torch.all(BF.log_posterior_weights(torch.zeros(1, 5), lp[0, 0, 1:2]) == float("-inf"))


def test_mask_conversion_all_forms():
    B, H, Tq, Tk = 2, 3, 4, 5
    kw = dict(batch_size=B, num_heads=H, tgt_len=Tq, src_len=Tk)
    assert BF.mask_to_log_prior(**kw) is None
    bm = torch.rand(Tq, Tk) < 0.3
    lp = BF.mask_to_log_prior(bm, **kw)
    assert lp.shape == (1, 1, Tq, Tk) and torch.equal(lp[0, 0] == float("-inf"), bm)
    fm = torch.randn(B * H, Tq, Tk)
    torch.testing.assert_close(BF.mask_to_log_prior(fm, **kw), fm.view(B, H, Tq, Tk))
    kpm = torch.zeros(B, Tk, dtype=torch.bool)
    kpm[1, -1] = True
    lp = BF.mask_to_log_prior(None, kpm, **kw)
    assert lp.shape == (B, 1, 1, Tk) and lp[1, 0, 0, -1] == float("-inf") and lp[0].eq(0).all()
    causal = BF.mask_to_log_prior(None, None, True, **kw)
    expected = torch.ones(Tq, Tk).tril().eq(0)
    assert torch.equal(causal[0, 0] == float("-inf"), expected)
    both = BF.mask_to_log_prior(fm, kpm, **kw)
    torch.testing.assert_close(both, fm.view(B, H, Tq, Tk) + lp)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(attn_mask=torch.zeros(3, 5, dtype=torch.bool)), r"attn_mask 2-D.*\(4, 5\).*\(3, 5\)"),
        (dict(attn_mask=torch.zeros(5, 4, 5)), r"attn_mask 3-D.*\(6, 4, 5\)"),
        (dict(attn_mask=torch.zeros(4, 5, dtype=torch.int64)), "attn_mask must be a bool or float"),
        (dict(attn_mask=torch.full((4, 5), float("nan"))), "attn_mask.*NaN"),
        (dict(attn_mask=torch.zeros(2, 2, 4, 5)), r"4-D shape must broadcast"),
        (dict(key_padding_mask=torch.zeros(2, 4, dtype=torch.bool)), r"key_padding_mask.*\(2, 5\)"),
        (dict(key_padding_mask=torch.zeros(2, 5, dtype=torch.int32)), "key_padding_mask must be"),
    ],
)
def test_mask_errors_name_argument_and_shapes(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        BF.mask_to_log_prior(**kwargs, batch_size=2, num_heads=3, tgt_len=4, src_len=5)


def test_causal_offset_bottom_right():
    lp = BF.causal_log_prior(2, 4, offset=2)
    assert torch.equal(lp == 0, torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.bool))


def test_check_finite():
    BF.check_finite("x", torch.ones(2))
    with pytest.raises(ValueError, match=r"x must be finite; got 1 NaN and 1 Inf.*\(3,\)"):
        BF.check_finite("x", torch.tensor([1.0, float("nan"), float("inf")]))


def test_sample_dims_broadcast_in_attend():
    w = torch.softmax(torch.randn(7, 2, 3, 4, 5), -1)  # (S, B, H, Tq, Tk)
    v = torch.randn(2, 3, 5, 6)  # (B, H, Tk, Dv)
    out = BF.attend(w, v)
    assert out.shape == (7, 2, 3, 4, 6)
    torch.testing.assert_close(out[3], w[3] @ v)
    with pytest.raises(ValueError, match="Tk"):
        BF.attend(w, torch.randn(2, 3, 4, 6))


@settings(max_examples=25, deadline=None)
@given(
    tq=st.integers(1, 6),
    tk=st.integers(1, 6),
    d=st.integers(1, 8),
    seed=st.integers(0, 10_000),
)
def test_attention_equals_torch_sdpa(tq, tk, d, seed):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, t, d, generator=g, dtype=torch.float64) for t in (tq, tk, tk))
    mask = torch.randn(tq, tk, generator=g, dtype=torch.float64)
    out, w = BF.attention(q, k, v, mask)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, tq, dtype=torch.float64))


def test_scale_rejects_bool_and_mask_rejects_plus_inf():
    q = torch.randn(2, 3)
    with pytest.raises(ValueError, match="scale"):
        BF.attention_logits(q, q, scale=True)
    bad = torch.zeros(2, 2)
    bad[0, 0] = float("inf")
    with pytest.raises(ValueError, match=r"\+inf"):
        BF.mask_to_log_prior(bad, batch_size=1, num_heads=1, tgt_len=2, src_len=2)


def test_check_finite_does_not_flag_a_sum_that_overflows():
    BF.check_finite("x", torch.full((4,), 3e38))  # finite values whose sum is inf
    with pytest.raises(ValueError, match="got 0 NaN and 1 Inf"):
        BF.check_finite("x", torch.tensor([1.0, -float("inf")]))
