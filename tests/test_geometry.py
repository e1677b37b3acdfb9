"""bayesattn.geometry against closed forms: entropies, distances, principal angles."""

from __future__ import annotations

import math

import pytest
import torch

from bayesattn.geometry import (
    attention_distance_by_layer,
    attention_entropy,
    head_projection_weights,
    head_subspace_angles,
    mean_attention_distance,
    mean_distance_per_head,
)
from bayesattn.nn.attention import BayesianMultiheadAttention
from bayesattn.nn.blocks import AttentionConfig
from bayesattn.nn.networks import CausalLM, Seq2Seq, TransformerClassifier
from bayesattn.nn.weights import bayesian_projections

SMALL = dict(d_model=8, nhead=2, dim_feedforward=16, dropout=0.0)


# ---- entropy and distance -------------------------------------------------------------------


def test_entropy_closed_forms():
    for tk in (1, 2, 7):
        u = torch.full((3, 2, 5, tk), 1.0 / tk)
        torch.testing.assert_close(attention_entropy(u), torch.full((3, 2, 5), math.log(tk)))
    assert torch.all(attention_entropy(torch.eye(4)) == 0)  # one-hot rows (0 log 0 = 0)
    w = torch.tensor([[0.5, 0.25, 0.25, 0.0]])
    expected = -(0.5 * math.log(0.5) + 2 * 0.25 * math.log(0.25))  # = 1.5 log 2
    assert attention_entropy(w).item() == pytest.approx(expected)
    assert attention_entropy(torch.softmax(torch.randn(2, 3, 6), -1)).shape == (2, 3)


def test_mean_distance_hand_built():
    # query 0 reads key 0; query 1 splits 50/50 between keys 0 and 3; query 2 reads key 0;
    # query 3 is uniform: distances 0, (1 + 2)/2, 2, (3 + 2 + 1 + 0)/4
    w = torch.tensor(
        [
            [1.0, 0.0, 0.0, 0.0],
            [0.5, 0.0, 0.0, 0.5],
            [1.0, 0.0, 0.0, 0.0],
            [0.25, 0.25, 0.25, 0.25],
        ]
    )
    torch.testing.assert_close(mean_attention_distance(w), torch.tensor([0.0, 1.5, 2.0, 1.5]))
    assert torch.all(mean_attention_distance(torch.eye(5)) == 0)  # diagonal: distance 0
    # causal uniform: query i reads keys 0..i uniformly → mean distance i / 2
    T = 6
    causal = torch.tril(torch.ones(T, T))
    causal = causal / causal.sum(-1, keepdim=True)
    torch.testing.assert_close(mean_attention_distance(causal), torch.arange(T) / 2.0)
    # explicit positions: cross-attention from 2 queries at positions 10, 20 to keys at 0, 5
    wq = torch.tensor([[0.0, 1.0], [0.5, 0.5]])
    d = mean_attention_distance(wq, q_pos=torch.tensor([10.0, 20.0]), k_pos=torch.tensor([0, 5]))
    torch.testing.assert_close(d, torch.tensor([5.0, 17.5]))
    # batched (B, H, Tq, Tk)
    batch = torch.stack([torch.eye(4), torch.eye(4).flip(-1)]).unsqueeze(0)  # (1, 2, 4, 4)
    torch.testing.assert_close(
        mean_attention_distance(batch), torch.tensor([[[0.0, 0, 0, 0], [3.0, 1, 1, 3]]])
    )


def test_mean_distance_per_head_and_query_mask():
    eye, flip = torch.eye(4), torch.eye(4).flip(-1)
    w = torch.stack([eye, flip]).expand(3, 2, 4, 4)  # (B=3, H=2, 4, 4)
    torch.testing.assert_close(mean_distance_per_head(w), torch.tensor([0.0, 2.0]))
    mask = torch.tensor([True, True, False, False]).expand(3, 4)  # only queries 0, 1
    torch.testing.assert_close(mean_distance_per_head(w, mask), torch.tensor([0.0, 2.0]))
    mask = torch.tensor([True, False, False, False]).expand(3, 4)  # query 0 reads key 3
    torch.testing.assert_close(mean_distance_per_head(w, mask), torch.tensor([0.0, 3.0]))
    # extra leading sample dim (S, B, H, Tq, Tk)
    torch.testing.assert_close(
        mean_distance_per_head(w.expand(5, 3, 2, 4, 4), mask), torch.tensor([0.0, 3.0])
    )


def test_distance_by_layer_on_networks():
    clf = TransformerClassifier(3, vocab_size=7, num_layers=2, **SMALL)
    x = torch.randint(1, 7, (4, 5))
    x[:, -2:] = 0  # padding
    out = attention_distance_by_layer(clf, x)
    assert list(out) == ["encoder.layers.0.self_attn", "encoder.layers.1.self_attn"]
    assert all(v.shape == (2,) and torch.all(v >= 0) for v in out.values())
    # independent check: record the weights by hand and average over the 3 real queries
    layer = clf.encoder.layers[0].self_attn
    layer.record_weights = True
    clf.eval()
    with torch.no_grad():
        clf(x)
    w = layer.last_weights  # (B, H, T, T)
    layer.record_weights, layer.last_weights = False, None
    expected = mean_attention_distance(w)[..., :3].mean((0, 2))
    torch.testing.assert_close(out["encoder.layers.0.self_attn"], expected)
    assert not any(m.record_weights for m in clf.modules() if hasattr(m, "record_weights"))
    # Bayesian attention, CLS pooling: deterministic (posterior mean) and includes the CLS slot
    bclf = TransformerClassifier(
        3,
        vocab_size=7,
        num_layers=1,
        pooling="cls",
        attention=AttentionConfig("dirichlet"),
        **SMALL,
    )
    a = attention_distance_by_layer(bclf, x)
    b = attention_distance_by_layer(bclf, x)
    torch.testing.assert_close(a, b)
    # causal LM: uniform-ish weights over the past → distances within [0, T-1]
    lm = CausalLM(7, num_layers=2, **SMALL)
    d = attention_distance_by_layer(lm, torch.randint(1, 7, (2, 6)))
    assert len(d) == 2 and all(torch.all((v >= 0) & (v <= 4)) for v in d.values())
    # encoder–decoder needs the target: self and cross attentions of the decoder are included
    s2s = Seq2Seq(6, 7, num_encoder_layers=1, num_decoder_layers=1, **SMALL)
    tgt = torch.tensor([[1, 3, 4, 2], [1, 5, 5, 2]])
    d = attention_distance_by_layer(s2s, torch.randint(3, 6, (2, 5)), tgt)
    assert set(d) == {
        "encoder.layers.0.self_attn",
        "decoder.layers.0.self_attn",
        "decoder.layers.0.multihead_attn",
    }


# ---- head subspace angles -------------------------------------------------------------------


def _mha_with_q(wq: torch.Tensor, num_heads: int) -> BayesianMultiheadAttention:
    E = wq.shape[0]
    mha = BayesianMultiheadAttention(E, num_heads)
    with torch.no_grad():
        mha.in_proj_weight[:E] = wq
    return mha


def test_identical_heads_give_zero_angles():
    torch.manual_seed(0)
    block = torch.randn(2, 6)  # (Dh, E): each head reads the same 2-D subspace of R^6
    mix = torch.randn(2, 2)  # a different basis of the same subspace
    mha = _mha_with_q(torch.cat([block, mix @ block, 3.0 * block]), num_heads=3)
    ang = head_subspace_angles(mha, "q")
    assert ang.shape == (3, 3, 2) and ang.dtype == torch.float64
    assert ang.abs().max() < 1e-5


def test_orthogonal_heads_give_ninety_degrees():
    # E = 4, H = 2, Dh = 2: head 0 reads span{e1, e2}, head 1 reads span{e3, e4}
    mha = _mha_with_q(torch.eye(4), num_heads=2)
    ang = head_subspace_angles(mha, "q")
    torch.testing.assert_close(ang[0, 1], torch.full((2,), 90.0, dtype=torch.float64))
    torch.testing.assert_close(ang[1, 0], torch.full((2,), 90.0, dtype=torch.float64))
    assert ang[0, 0].abs().max() < 1e-6 and ang[1, 1].abs().max() < 1e-6
    mean = head_subspace_angles(mha, "q", mean=True)
    torch.testing.assert_close(mean, torch.tensor([[0.0, 90.0], [90.0, 0.0]], dtype=torch.float64))


def test_known_principal_angles():
    # head 0: span{e1, e2}; head 1: span{e1, cos(t) e2 + sin(t) e3} → angles 0 and t
    t = math.radians(30.0)
    wq = torch.zeros(4, 4)
    wq[0, 0] = wq[1, 1] = 1.0
    wq[2, 0] = 1.0
    wq[3, 1], wq[3, 2] = math.cos(t), math.sin(t)
    ang = head_subspace_angles(_mha_with_q(wq, 2), "q")
    torch.testing.assert_close(ang[0, 1], torch.tensor([0.0, 30.0], dtype=torch.float64))
    torch.testing.assert_close(ang[1, 0], ang[0, 1])  # symmetric


def test_angles_for_k_v_o_and_torch_mha():
    torch.manual_seed(1)
    ref = torch.nn.MultiheadAttention(8, 2)
    ours = BayesianMultiheadAttention(8, 2)
    ours.load_state_dict(ref.state_dict())
    for which in ("q", "k", "v", "o"):
        a = head_subspace_angles(ours, which)
        torch.testing.assert_close(a, head_subspace_angles(ref, which))
        assert a.shape == (2, 2, 4)
        assert torch.all((a >= 0) & (a <= 90))
        assert torch.all(a[0, 0] < 1e-5) and torch.all(a[0, 1] > 1.0)  # random heads differ
    W = head_projection_weights(ours, "k")
    torch.testing.assert_close(W[1], ours.in_proj_weight[12:16].detach().T)
    Wo = head_projection_weights(ours, "o")
    torch.testing.assert_close(Wo[1], ours.out_proj.weight[:, 4:8].detach())
    # separate projection weights (kdim != embed_dim)
    cross = BayesianMultiheadAttention(8, 2, kdim=5, vdim=3)
    assert head_subspace_angles(cross, "k").shape == (2, 2, 4)
    assert head_projection_weights(cross, "v").shape == (2, 3, 4)


def test_bayesian_projection_weights_need_an_explicit_weight():
    net = TransformerClassifier(3, vocab_size=7, num_layers=1, **SMALL)
    bayesian_projections(net, targets="*in_proj_weight")
    mha = net.encoder.layers[0].self_attn
    with pytest.raises(ValueError, match="PyroSample"):
        head_subspace_angles(mha, "q")
    med = net.weight_guide.median()["encoder.layers.0.self_attn.in_proj_weight"]
    assert head_subspace_angles(mha, "q", weight=med).shape == (2, 2, 4)
    assert head_subspace_angles(mha, "o").shape == (2, 2, 4)  # out_proj stayed deterministic


# ---- errors ---------------------------------------------------------------------------------


def test_bad_inputs():
    with pytest.raises(TypeError, match="weights must be a torch.Tensor"):
        attention_entropy([[0.5, 0.5]])
    with pytest.raises(ValueError, match=r"at least 2 dims \(\.\.\., Tq, Tk\)"):
        attention_entropy(torch.ones(3))
    with pytest.raises(TypeError, match="floating-point tensor"):
        mean_attention_distance(torch.ones(2, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="q_pos must have last dim 3"):
        mean_attention_distance(torch.ones(3, 4) / 4, q_pos=torch.arange(4))
    with pytest.raises(ValueError, match=r"\(\.\.\., H, Tq, Tk\)"):
        mean_distance_per_head(torch.ones(3, 3))
    with pytest.raises(ValueError, match="does not broadcast"):
        mean_distance_per_head(torch.ones(2, 2, 3, 3), torch.ones(5, 3, dtype=torch.bool))
    with pytest.raises(TypeError, match="bool"):
        mean_distance_per_head(torch.ones(2, 2, 3, 3), torch.ones(2, 3))
    with pytest.raises(TypeError, match="torch.nn.Module"):
        attention_distance_by_layer("net", torch.ones(2, 3))
    with pytest.raises(TypeError, match="no BayesianMultiheadAttention"):
        attention_distance_by_layer(torch.nn.Linear(3, 3), torch.ones(2, 3))
    with pytest.raises(TypeError, match="mha must be"):
        head_subspace_angles(torch.nn.Linear(4, 4))
    mha = BayesianMultiheadAttention(8, 2)
    with pytest.raises(ValueError, match="which must be"):
        head_subspace_angles(mha, "x")
    with pytest.raises(ValueError, match="weight must be"):
        head_subspace_angles(mha, "q", weight=torch.ones(7, 8))
    with pytest.raises(ValueError, match="weight for 'o' must be"):
        head_subspace_angles(mha, "o", weight=torch.ones(8, 4))
