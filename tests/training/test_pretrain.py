"""Masked-LM pretraining: the corruption's proportions, the loss against a hand-written
cross-entropy, learning on a synthetic language, and the trunk transfer by word."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from bayesattn.nn.networks import TransformerClassifier
from bayesattn.training.pretrain import (
    IGNORE,
    MaskedLMHead,
    mask_tokens,
    masked_lm_loss,
    pretrain_masked_lm,
    transfer_trunk,
)

V, MASK = 30, 29


def tiny(vocab: int = V, width: int = 16) -> TransformerClassifier:
    return TransformerClassifier(3, vocab_size=vocab, max_len=12, pooling="cls", d_model=width,
                                 nhead=2, num_layers=1, dim_feedforward=32, dropout=0.0)  # fmt: skip


def test_mask_tokens_proportions_and_padding() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randint(2, MASK, (400, 50), generator=g)
    x[:, 40:] = 0  # padding
    inputs, targets = mask_tokens(x, MASK, V, prob=0.3, generator=g)
    chosen = targets != IGNORE
    words = x != 0
    assert not chosen[~words].any()  # padding is never chosen
    assert abs(chosen.sum().item() / words.sum().item() - 0.3) < 0.01
    assert torch.equal(targets[chosen], x[chosen])
    assert torch.equal(inputs[~chosen], x[~chosen])  # unchosen positions untouched
    masked = (inputs == MASK) & chosen
    n = chosen.sum().item()
    assert abs(masked.sum().item() / n - 0.8) < 0.02
    kept = (inputs == x) & chosen
    # unchanged: the 10 % kept plus random draws that hit the same word (1/27 of the 10 %)
    assert abs(kept.sum().item() / n - (0.1 + 0.1 / 27)) < 0.015
    assert int(inputs[chosen & ~masked].min()) >= 2  # random words never padding or unknown


def test_mask_tokens_bad_input() -> None:
    with pytest.raises(ValueError, match="prob"):
        mask_tokens(torch.ones(2, 3, dtype=torch.long), MASK, V, prob=0.0)
    with pytest.raises(ValueError, match="mask_id"):
        mask_tokens(torch.ones(2, 3, dtype=torch.long), V, V)
    with pytest.raises(ValueError, match="token ids"):
        mask_tokens(torch.ones(2, 3), MASK, V)


def test_masked_lm_loss_is_cross_entropy_at_the_chosen_positions() -> None:
    torch.manual_seed(0)
    net, x = tiny().eval(), torch.randint(2, MASK, (4, 10))
    head = MaskedLMHead(net.embed.tokens)  # type: ignore[arg-type]
    inputs, targets = mask_tokens(x, MASK, V, prob=0.5, generator=torch.Generator().manual_seed(1))
    loss, correct = masked_lm_loss(net, head, inputs, targets)
    # by hand: every position's words' logits from the full token states, then the chosen ones
    h = net.encoder.norm(net.encoder(torch.cat(
        [net.cls.expand(4, 1, -1), net.embed(inputs)], 1)))[:, 1:]  # type: ignore[union-attr]  # fmt: skip
    g = F.layer_norm(F.gelu(h @ head.dense.weight.T + head.dense.bias), (16,),
                     head.norm.weight, head.norm.bias)  # fmt: skip
    logits = g @ net.embed.tokens.weight.T + head.bias  # type: ignore[union-attr]
    keep = targets != IGNORE
    ref = F.cross_entropy(logits[keep], targets[keep])
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-6)
    assert int(correct) == int((logits[keep].argmax(-1) == targets[keep]).sum())


def test_head_is_tied_to_the_embedding() -> None:
    net = tiny()
    head = MaskedLMHead(net.embed.tokens)  # type: ignore[arg-type]
    x = torch.randint(2, MASK, (2, 6))
    inputs, targets = mask_tokens(x, MASK, V, prob=1.0, generator=torch.Generator().manual_seed(0))
    masked_lm_loss(net, head, inputs, targets)[0].backward()
    grad = net.embed.tokens.weight.grad  # type: ignore[union-attr]
    assert grad is not None and grad[targets[targets != IGNORE]].abs().sum() > 0
    assert head.embedding.weight is net.embed.tokens.weight  # type: ignore[union-attr]


def test_pretraining_learns_a_synthetic_language() -> None:
    """Texts that repeat one word: a hidden word is any other word of its text, so masked-word
    accuracy must climb from chance (1/27) to near 1."""
    g = torch.Generator().manual_seed(0)
    x = torch.randint(2, MASK, (600, 1), generator=g).expand(600, 10).clone()  # (600, 10)
    net = tiny()
    before = [p.detach().clone() for p in net.head.parameters()]
    res = pretrain_masked_lm(net, x[:500], mask_id=MASK, val=x[500:], epochs=12, batch_size=32,
                             lr=1e-2, seed=0, progress=False)  # fmt: skip
    assert len(res.train_loss) == len(res.val_accuracy) == 12
    assert res.val_accuracy[0] < 0.5 < 0.9 < res.val_accuracy[-1], res.val_accuracy
    assert res.val_loss[-1] < res.val_loss[0]
    assert all(torch.equal(a, b) for a, b in zip(before, net.head.parameters(), strict=True))
    assert not net.training


def test_pretraining_is_seeded() -> None:
    x = torch.randint(2, MASK, (64, 8), generator=torch.Generator().manual_seed(0))
    states = []
    for _ in range(2):
        torch.manual_seed(123)
        net = tiny()
        pretrain_masked_lm(net, x, mask_id=MASK, epochs=1, batch_size=16, seed=5, progress=False)
        states.append(net.state_dict())
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])


def test_pretrain_bad_input() -> None:
    net = tiny()
    with pytest.raises(ValueError, match=r"x ids must be in \[0, vocab_size=30\)"):
        pretrain_masked_lm(net, torch.full((4, 5), V), mask_id=MASK, progress=False)
    with pytest.raises(ValueError, match="mask_id"):
        pretrain_masked_lm(net, torch.ones(4, 5, dtype=torch.long), mask_id=0, progress=False)
    with pytest.raises(ValueError, match="val must be integer token ids"):
        pretrain_masked_lm(net, torch.ones(4, 5, dtype=torch.long), mask_id=MASK,
                           val=torch.ones(4, 5), progress=False)  # fmt: skip
    vec = TransformerClassifier(3, input_dim=4, d_model=16, nhead=2, num_layers=1)
    with pytest.raises(TypeError, match="over token ids"):
        pretrain_masked_lm(vec, torch.ones(4, 5, dtype=torch.long), mask_id=MASK, progress=False)


def test_transfer_trunk_copies_by_word() -> None:
    torch.manual_seed(0)
    src_vocab = ("<pad>", "<unk>", "cat", "dog", "fish", "<mask>")
    dst_vocab = ("<pad>", "<unk>", "dog", "bird", "cat")
    src, dst = tiny(len(src_vocab)), tiny(len(dst_vocab))
    fresh_bird = dst.embed.tokens.weight[3].clone()  # type: ignore[union-attr]
    head = dst.head.weight.clone()
    frac = transfer_trunk(src, src_vocab, dst, dst_vocab)
    assert frac == pytest.approx(4 / 5)
    s, d = src.embed.tokens.weight, dst.embed.tokens.weight  # type: ignore[union-attr]
    for j, w in enumerate(dst_vocab):
        if w in src_vocab:
            assert torch.equal(d[j], s[src_vocab.index(w)])
    assert torch.equal(d[3], fresh_bird)
    assert torch.equal(dst.head.weight, head)  # the head is the destination's own
    for k, v in src.state_dict().items():
        if not k.startswith(("head.", "embed.tokens.")):
            assert torch.equal(dst.state_dict()[k], v), k


def test_transfer_trunk_refuses_other_shapes() -> None:
    with pytest.raises(ValueError, match="trunks differ"):
        transfer_trunk(tiny(5, 16), ("a",) * 5, tiny(5, 8), ("a",) * 5)
    with pytest.raises(ValueError, match="src_vocab has 3 words"):
        transfer_trunk(tiny(5), ("a",) * 3, tiny(5), ("a",) * 5)
