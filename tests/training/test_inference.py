"""Tests for bayesattn.training: SVI / hybrid training, schedules, annealing, checkpoints."""

from __future__ import annotations

import dataclasses
import math

import pyro
import pytest
import torch
from pyro import poutine
from pyro.infer import Predictive, Trace_ELBO

from bayesattn.data import make_ood_sequences, make_reverse_task
from bayesattn.nn.blocks import AttentionConfig
from bayesattn.nn.networks import CausalLM, Seq2Seq, TransformerClassifier, VisionTransformer
from bayesattn.training import (
    CheckpointError,
    History,
    ScaleLatents,
    TrainConfig,
    Trainer,
    fit,
    kl_beta,
    load_checkpoint,
    lr_factor,
    save_checkpoint,
)
from tests.tasks import contains3


def classifier(family="dirichlet", seed=0, num_layers=1, dropout=0.0, **kw):
    torch.manual_seed(seed)
    kw.setdefault("d_model", 32)
    return TransformerClassifier(
        2,
        vocab_size=10,
        nhead=2,
        num_layers=num_layers,
        dim_feedforward=64,
        dropout=dropout,
        max_len=16,
        attention=AttentionConfig(family=family),
        **kw,
    )


def state(net):
    return {k: v.detach().clone() for k, v in net.state_dict().items()}


def assert_same_state(a, b, atol=1e-6):
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=atol, rtol=0, msg=k)


# ---------------------------------------------------------------------------------------------
# learning
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "method, family", [("hybrid", "dirichlet"), ("svi", "logistic_normal"), ("svi", "dirichlet")]
)
@pytest.mark.slow
def test_classifier_learns_in_both_methods(method, family):
    train, val = contains3(384, seed=0), contains3(256, seed=1)
    net = classifier(family)
    cfg = TrainConfig(method=method, epochs=6, batch_size=32, lr=3e-3, warmup_steps=10, progress=False)
    h = fit(net, train, val, config=cfg)
    assert len(h) == 6 and h.step[-1] == 6 * 12
    assert h.train_loss[-1] < h.train_loss[0]  # the (negative) ELBO per example decreases
    assert h.val_acc[-1] >= 0.9 and h.train_acc[-1] >= 0.9
    assert not net.training  # fit leaves the network in eval mode
    metrics = Trainer(net, cfg).evaluate(val)
    assert metrics["accuracy"] >= 0.9
    assert math.isclose(metrics["loss"], h.val_loss[-1], rel_tol=1e-5)


def _seq_uncertainty(net, task, max_len):
    g = net.generate(task.src, max_len=max_len, num_samples=8)
    m = g.mask.float()
    mi = (g.mutual_information * m).sum(1) / m.sum(1)  # (B,) mean over generated steps
    h = (g.entropy * m).sum(1) / m.sum(1)
    return g, mi, h


@pytest.mark.slow
def test_seq2seq_learns_reverse_and_is_uncertain_out_of_distribution():
    from scipy.stats import mannwhitneyu

    train = make_reverse_task(1024, length=5, vocab_size=8, seed=0)
    test = make_reverse_task(128, length=5, vocab_size=8, seed=1)
    longer = make_ood_sequences("reverse", 128, "longer", length=5, vocab_size=8, seed=2)
    unseen = make_ood_sequences(
        "reverse", 128, "unseen_tokens", length=5, vocab_size=8, seed=3, num_unseen_tokens=4
    )
    V = unseen.src_vocab_size  # embeddings sized for the unseen tokens (never trained)
    torch.manual_seed(0)
    # a wider logistic-normal prior (σ0 = 3): under the default σ0 = 1 the KL price of sharp
    # cross-attention outweighs the likelihood of a 5-token sequence and reverse is not learned
    att = AttentionConfig(family="logistic_normal", family_kwargs={"model_scale": 3.0})
    net = Seq2Seq(
        V,
        V,
        d_model=32,
        nhead=4,
        num_encoder_layers=1,
        num_decoder_layers=1,
        dim_feedforward=64,
        dropout=0.0,
        max_len=16,
        attention=att,
    )
    cfg = TrainConfig(epochs=8, batch_size=32, lr=1e-2, warmup_steps=20, progress=False)
    h = fit(net, train, test, config=cfg)  # 256 hybrid steps
    assert h.train_loss[-1] < h.train_loss[0]
    assert h.val_acc[-1] >= 0.9  # teacher-forced token accuracy on held-out sequences

    g, mi_id, h_id = _seq_uncertainty(net, test, max_len=7)
    B, L = g.tokens.shape
    assert B == 128 and 1 <= L <= 7 and g.probs.shape == (B, L, V)
    for t in (g.entropy, g.expected_entropy, g.mutual_information):
        assert t.shape == (B, L) and torch.isfinite(t).all() and (t >= 0).all()
    assert g.mask.shape == (B, L) and g.mask[:, 0].all()
    torch.testing.assert_close(g.probs.sum(-1), torch.ones(B, L))
    # greedy decoding with posterior-averaged predictives reverses held-out sequences
    tgt = test.tgt[:, 1 : L + 1]
    valid = tgt != test.pad_id
    assert ((g.tokens == tgt) & valid).sum() / valid.sum() >= 0.8

    _, mi_long, h_long = _seq_uncertainty(net, longer, max_len=18)
    _, _, h_unseen = _seq_uncertainty(net, unseen, max_len=7)
    # OOD inputs: more epistemic (MI) and total (entropy) predictive uncertainty, one-sided
    # Mann–Whitney over 128 sequences each (with unseen tokens only the entropy is checked: their
    # MI is not larger here, the random embeddings being confidently mis-read)
    assert mi_long.mean() > mi_id.mean() and h_long.mean() > h_id.mean()
    assert mannwhitneyu(mi_long, mi_id, alternative="greater").pvalue < 0.05
    assert mannwhitneyu(h_long, h_id, alternative="greater").pvalue < 0.05
    assert mannwhitneyu(h_unseen, h_id, alternative="greater").pvalue < 0.05


def test_causal_lm_trains_from_tensor_dataset_without_labels(capsys):
    torch.manual_seed(0)
    net = CausalLM(
        12,
        d_model=16,
        nhead=2,
        num_layers=1,
        dim_feedforward=32,
        max_len=16,
        attention=AttentionConfig(family="dirichlet", prior="causal"),
    )
    x = torch.randint(3, 12, (40, 9))
    x[:, 0] = 1
    x[:5, 6:] = 0  # some padding: ignored by the token accuracy and the likelihood
    ds = torch.utils.data.TensorDataset(x)
    for method in ("svi", "hybrid"):
        h = fit(net, ds, ds, method=method, epochs=2, batch_size=16, progress=False)
        assert len(h) == 2 and all(math.isfinite(v) for v in h.train_loss + h.val_loss)
        assert all(0.0 <= a <= 1.0 for a in h.train_acc + h.val_acc)
    h = fit(net, ds, ds, epochs=1, batch_size=16, val_loss="elbo", progress=True)
    assert "hybrid" in capsys.readouterr().err  # the tqdm bar was drawn
    assert h.val_loss[0] > 0  # negative ELBO per example


class _LazyParamClassifier(TransformerClassifier):
    """Creates a parameter on its first forward pass (like a lazily built weight autoguide)."""

    def forward_logits(self, x, y=None, num_samples=1):
        if not hasattr(self, "late_bias"):
            self.late_bias = torch.nn.Parameter(torch.zeros(self.num_classes))
        return super().forward_logits(x, y, num_samples) + self.late_bias


@pytest.mark.parametrize("method", ["svi", "hybrid"])
def test_lazily_created_parameters_are_trained(method):
    torch.manual_seed(0)
    net = _LazyParamClassifier(
        2,
        vocab_size=10,
        d_model=16,
        nhead=2,
        num_layers=1,
        max_len=16,
        attention=AttentionConfig(family="dirichlet"),
    )
    trainer = Trainer(net, method=method, epochs=1, batch_size=16, progress=False)
    trainer.fit(contains3(32, 0))
    assert float(net.late_bias.detach().abs().sum()) > 0
    if method == "hybrid":
        assert any(p is net.late_bias for p in trainer.optimizer.param_groups[0]["params"])


def test_vision_transformer_trains_on_float_images():
    torch.manual_seed(0)
    net = VisionTransformer(
        3,
        d_model=16,
        nhead=2,
        num_layers=1,
        dim_feedforward=32,
        attention=AttentionConfig(family="logistic_normal"),
    )
    x, y = torch.randn(24, 8, 8), torch.randint(0, 3, (24,))
    h = fit(net, (x, y), (x, y), method="svi", epochs=1, batch_size=8, progress=False)
    assert math.isfinite(h.train_loss[0]) and h.val_acc[0] is not None


# ---------------------------------------------------------------------------------------------
# the ELBO: sites, particles, Predictive
# ---------------------------------------------------------------------------------------------


def test_predictive_returns_attention_and_obs_sites():
    net = classifier(num_layers=2)
    x, _ = contains3(5, seed=0, T=6)
    S = 3
    out = Predictive(net.model, guide=net.guide, num_samples=S)(x, None, 100)
    H, T = 2, 6
    for i in range(2):
        base = f"encoder.layers.{i}.self_attn"
        assert out[f"{base}.latent"].shape == (S, 5, H, T, T)
        w = out[f"{base}.weights"]
        assert w.shape == (S, 5, H, T, T)
        torch.testing.assert_close(w.sum(-1), torch.ones(S, 5, H, T))
    assert out["obs"].shape == (S, 5)
    assert set(out["obs"].unique().tolist()) <= {0, 1}


def test_vectorised_and_sequential_particles_estimate_the_same_elbo():
    """Trace_ELBO vectorised over particles, one-particle Trace_ELBO repeated, and the hybrid
    one-pass ELBO (analytic KL, vectorised) agree within Monte Carlo error."""
    net = classifier("logistic_normal", num_layers=2)
    x, y = contains3(8, seed=0, T=6)
    N, P = 64, 128
    with torch.no_grad():
        seq = torch.tensor(
            [Trace_ELBO().loss(net.model, net.guide, x, y, N) for _ in range(P)]
        )  # (P,)
        vec = Trace_ELBO(num_particles=P, vectorize_particles=True, max_plate_nesting=1).loss(
            net.model, net.guide, x, y, N
        )
        hyb = float(net.elbo_loss(x, y, num_data=N, num_particles=P)[0])
    se = float(seq.std() / math.sqrt(P))
    assert abs(vec - float(seq.mean())) < 5 * math.sqrt(2) * se
    assert abs(hyb - float(seq.mean())) < 5 * math.sqrt(2) * se


@pytest.mark.parametrize("method", ["svi", "hybrid"])
@pytest.mark.parametrize("vectorize", [True, False])
def test_particles_train(method, vectorize):
    net = classifier()
    h = fit(
        net,
        contains3(48, 0),
        method=method,
        epochs=1,
        batch_size=16,
        num_particles=3,
        vectorize_particles=vectorize,
        progress=False,
    )
    assert math.isfinite(h.train_loss[0]) and 0 <= h.train_acc[0] <= 1


def test_meanfield_elbo_option():
    net = classifier()
    h = fit(
        net, contains3(32, 0), method="svi", elbo="meanfield", epochs=1, batch_size=16, progress=False
    )
    assert math.isfinite(h.train_loss[0])


# ---------------------------------------------------------------------------------------------
# annealing, schedules, clipping
# ---------------------------------------------------------------------------------------------


def test_kl_beta_schedule_values():
    assert kl_beta(0, 10) == pytest.approx(1e-3)
    assert kl_beta(5, 10) == pytest.approx(1e-3 + 0.999 * 0.5)
    assert kl_beta(10, 10) == 1.0 and kl_beta(99, 10) == 1.0
    assert kl_beta(0, 0) == 1.0 and kl_beta(3, 4, start=0.2) == pytest.approx(0.8)
    betas = [kl_beta(s, 10) for s in range(12)]
    assert all(b > 0 for b in betas) and betas == sorted(betas)


def test_scale_latents_touches_only_latent_sites():
    net = classifier(num_layers=2)
    x, y = contains3(4, seed=0, T=5)
    N, beta = 40, 0.25
    with ScaleLatents(beta):
        gtr = poutine.trace(net.guide).get_trace(x, y, N)
        mtr = poutine.trace(poutine.replay(net.model, trace=gtr)).get_trace(x, y, N)
    plain = poutine.trace(net.guide).get_trace(x, y, N)
    latents = [n for n in gtr.nodes if n.endswith(".latent")]
    assert len(latents) == 2
    for name in latents:  # latent sites: scale N/B · β in guide and model
        assert gtr.nodes[name]["scale"] == pytest.approx(N / 4 * beta)
        assert mtr.nodes[name]["scale"] == pytest.approx(N / 4 * beta)
        assert plain.nodes[name]["scale"] == pytest.approx(N / 4)
    assert mtr.nodes["obs"]["is_observed"]
    assert mtr.nodes["obs"]["scale"] == pytest.approx(N / 4)  # likelihood untouched
    for name in [n for n in mtr.nodes if n.endswith(".weights")]:  # deterministic: untouched
        assert mtr.nodes[name]["scale"] == pytest.approx(N / 4)
    assert mtr.nodes["data"]["scale"] == 1.0
    # the annealed ELBO is E log p(y|w) - β KL: log-weight of latent sites scaled by β
    lp_m = mtr.nodes[latents[0]]["fn"].log_prob(mtr.nodes[latents[0]]["value"]).sum().detach()
    mtr.compute_log_prob()
    assert float(mtr.nodes[latents[0]]["log_prob_sum"].detach()) == pytest.approx(
        float(lp_m) * N / 4 * beta, rel=1e-5
    )
    with pytest.raises(ValueError, match="beta > 0"), ScaleLatents(0.0):
        poutine.trace(net.guide).get_trace(x, y, N)


def test_annealed_pair_scales_latents_and_keeps_each_particles_logits():
    from pyro.infer import TraceMeanField_ELBO

    from bayesattn.training.kl import AnnealedPair

    net = classifier()
    x, y = contains3(4, seed=0, T=5)
    beta = [0.5]
    pair = AnnealedPair(net, lambda: beta[0])  # β read at every site
    with pytest.raises(RuntimeError, match="has not run"):
        pair.pop_logits()
    gtr = poutine.trace(pair.guide).get_trace(x, y, 8)
    mtr = poutine.trace(poutine.replay(pair.model, trace=gtr)).get_trace(x, y, 8)
    latent = next(n for n in gtr.nodes if n.endswith(".latent"))
    assert gtr.nodes[latent]["scale"] == mtr.nodes[latent]["scale"] == pytest.approx(8 / 4 * 0.5)
    assert mtr.nodes["obs"]["scale"] == pytest.approx(8 / 4)
    torch.testing.assert_close(pair.pop_logits(), mtr.nodes["_RETURN"]["value"].detach())
    beta[0] = 1.0  # β = 1: the pair's ELBO is the network's own
    elbo = TraceMeanField_ELBO(num_particles=3, max_plate_nesting=1)
    pyro.set_rng_seed(0)
    ours = elbo.differentiable_loss(pair.model, pair.guide, x, y, 8)
    assert pair.pop_logits().shape == (3, 4, 2)  # three sequential particles, stacked
    pyro.set_rng_seed(0)
    torch.testing.assert_close(ours, elbo.differentiable_loss(net.model, net.guide, x, y, 8))
    pair.model(x, y, 8)
    pair.clear()
    with pytest.raises(RuntimeError):
        pair.pop_logits()
    with pytest.raises(TypeError, match=r"Linear lacks \['model', 'guide'\]"):
        AnnealedPair(torch.nn.Linear(2, 2))


@pytest.mark.parametrize("method", ["svi", "hybrid"])
def test_kl_annealing_in_training(method):
    net = classifier()
    trainer = Trainer(net, method=method, epochs=3, batch_size=16, kl_anneal_steps=4, progress=False)
    h = trainer.fit(contains3(32, 0))  # 2 steps per epoch
    assert [trainer.beta(s) for s in range(5)] == pytest.approx(
        [1e-3 + 0.999 * s / 4 for s in range(5)]
    )
    assert h.beta == pytest.approx([trainer.beta(1), trainer.beta(3), 1.0])


def test_lr_factor_values():
    f = [lr_factor(s, warmup_steps=4, decay="cosine", decay_steps=14) for s in range(16)]
    assert f[:4] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert f[9] == pytest.approx(0.5)  # half way through the cosine
    assert f[14] == pytest.approx(0.0) and f[15] == pytest.approx(0.0)
    assert lr_factor(14, decay="cosine", decay_steps=14, min_lr_ratio=0.1) == pytest.approx(0.1)
    assert lr_factor(7, decay="linear", decay_steps=14) == pytest.approx(0.5)
    assert lr_factor(25, decay="step", step_size=10, gamma=0.5) == pytest.approx(0.25)
    assert lr_factor(1000, decay="none") == 1.0


@pytest.mark.parametrize("method", ["svi", "hybrid"])
def test_optimiser_follows_the_warmup_schedule(method):
    net = classifier()
    cfg = TrainConfig(
        method=method, lr=0.01, warmup_steps=4, lr_decay="none", epochs=5, batch_size=16, progress=False
    )
    trainer = Trainer(net, cfg)
    for k in (1, 2, 3, 6):
        trainer.config = dataclasses.replace(cfg, max_steps=k)
        trainer.fit(contains3(32, 0))
        if method == "hybrid":
            lrs = [g["lr"] for g in trainer.optimizer.param_groups]
        else:
            lrs = [
                s.optimizer.param_groups[0]["lr"] for s in trainer.pyro_optim.optim_objs.values()
            ]
        assert lrs and lrs == pytest.approx([0.01 * min(1.0, (k + 1) / 4)] * len(lrs))


def test_gradient_clipping_bounds_the_norm_hybrid(monkeypatch):
    net = classifier()
    trainer = Trainer(net, method="hybrid", epochs=1, batch_size=16, clip_norm=0.05, progress=False)
    seen = []
    orig = torch.optim.AdamW.step

    def spy(self, *a, **k):
        grads = [p.grad for g in self.param_groups for p in g["params"] if p.grad is not None]
        seen.append(float(torch.nn.utils.get_total_norm(grads)))
        return orig(self, *a, **k)

    monkeypatch.setattr(torch.optim.AdamW, "step", spy)
    trainer.fit(contains3(48, 0))
    assert len(seen) == 3
    assert max(seen) <= 0.05 * (1 + 1e-4)
    assert trainer.last_grad_norm > 0.05  # the unclipped norm was larger: clipping acted


def test_gradient_clipping_is_global_in_svi(monkeypatch):
    net = classifier()
    trainer = Trainer(net, method="svi", max_steps=1, batch_size=16, clip_norm=0.05, progress=False)
    sq = []
    orig = torch.optim.AdamW.step

    def spy(self, *a, **k):  # svi: one AdamW per parameter
        sq.extend(float(p.grad.pow(2).sum()) for g in self.param_groups for p in g["params"])
        return orig(self, *a, **k)

    monkeypatch.setattr(torch.optim.AdamW, "step", spy)
    trainer.fit(contains3(48, 0))
    assert len(sq) == len(list(net.parameters()))
    assert math.sqrt(sum(sq)) <= 0.05 * (1 + 1e-4) < trainer.last_grad_norm


# ---------------------------------------------------------------------------------------------
# early stopping
# ---------------------------------------------------------------------------------------------


def test_early_stopping_triggers_and_restores_best():
    x, y = contains3(96, 0)
    xv, yv = contains3(64, 1)
    net = classifier()
    # validation labels flipped: the better the fit, the worse the validation loss
    cfg = TrainConfig(epochs=30, batch_size=32, lr=1e-2, early_stopping_patience=2, progress=False)
    trainer = Trainer(net, cfg)
    h = trainer.fit((x, y), (xv, 1 - yv))
    assert h.stopped_early and len(h) < 30
    assert len(h) == h.best_epoch + 2
    assert h.best_val_loss == min(h.val_loss)
    restored = trainer.evaluate((xv, 1 - yv))["loss"]
    assert restored == pytest.approx(h.best_val_loss, rel=1e-6)


def test_eval_every():
    h = fit(
        classifier(),
        contains3(32, 0),
        contains3(16, 1),
        epochs=5,
        batch_size=16,
        eval_every=2,
        progress=False,
    )
    assert [v is not None for v in h.val_loss] == [False, True, False, True, True]


# ---------------------------------------------------------------------------------------------
# checkpoints
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["svi", "hybrid"])
def test_resume_reproduces_the_uninterrupted_run(method, tmp_path):
    """N steps in one go == N/2 steps + checkpoint + fresh network/trainer + resume (stopped
    mid-epoch; dropout on, so the RNG state must be restored too)."""
    train, val = contains3(96, 0), contains3(32, 1)
    cfg = TrainConfig(
        method=method,
        epochs=3,
        batch_size=32,
        lr=3e-3,
        warmup_steps=2,
        kl_anneal_steps=4,
        clip_norm=0.5,
        num_particles=2,
        early_stopping_patience=5,
        restore_best=False,
        progress=False,
    )
    full = classifier(num_layers=2, dropout=0.1)
    h_full = fit(full, train, val, config=cfg)  # 9 steps
    path = tmp_path / "ckpt.pt"
    # the param store still holds `full`'s tensors under the same names: must not matter
    first = classifier(num_layers=2, dropout=0.1)
    h1 = fit(first, train, val, config=dataclasses.replace(cfg, max_steps=4), checkpoint_path=path)
    assert h1.step[-1] == 4 and len(h1) == 2  # one epoch + a partial record
    resumed = classifier(seed=123, num_layers=2, dropout=0.1)  # other init: all from the file
    if method == "svi":
        h2 = fit(resumed, train, val, config=cfg, checkpoint_path=path, resume=True)
    else:  # config=None: the checkpoint's own configuration, with an override
        h2 = fit(resumed, train, val, checkpoint_path=path, resume=True, max_steps=None)
    assert_same_state(state(full), state(resumed))
    for key in ("epoch", "step", "train_loss", "train_acc", "val_loss", "lr", "beta"):
        assert getattr(h2, key) == pytest.approx(getattr(h_full, key), abs=1e-6), key


def test_checkpoint_loads_weights_only_and_is_atomic(tmp_path, monkeypatch):
    path = tmp_path / "run" / "ckpt.pt"
    trainer = Trainer(classifier(), method="svi", epochs=2, batch_size=16, progress=False)
    trainer.fit(contains3(32, 0), contains3(16, 1), checkpoint_path=path)
    raw = torch.load(path, weights_only=True)
    assert raw["format"] == "bayesattn.checkpoint" and raw["step"] == 4 and raw["epoch"] == 2
    assert raw["config"]["method"] == "svi" and raw["method"] == "svi" and isinstance(raw["config"], dict)
    assert isinstance(raw["history"], dict) and len(raw["history"]["train_loss"]) == 2
    assert set(raw["rng"]) >= {"torch", "python", "numpy", "data"}
    assert raw["optimizer"] and all("$$$" in k or "." in k for k in raw["optimizer"])
    assert raw["network"].keys() == trainer.network.state_dict().keys()
    assert [p.name for p in path.parent.iterdir()] == ["ckpt.pt"]  # no temporary files left
    # a failure while writing leaves the previous checkpoint intact and no temporary file
    before = path.read_bytes()

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", boom)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(path, trainer)
    assert path.read_bytes() == before and [p.name for p in path.parent.iterdir()] == ["ckpt.pt"]


def _checkpoint(tmp_path, **kw):
    path = tmp_path / "ckpt.pt"
    net = classifier(**kw)
    fit(net, contains3(32, 0), epochs=1, batch_size=16, checkpoint_path=path, progress=False)
    return path


@pytest.mark.parametrize("damage", ["garbage", "truncate", "tamper"])
def test_corrupt_checkpoint_raises_naming_the_path(tmp_path, damage):
    path = _checkpoint(tmp_path)
    data = path.read_bytes()
    if damage == "garbage":
        path.write_bytes(b"\x00not a checkpoint\xff" * 64)
    elif damage == "truncate":
        path.write_bytes(data[: len(data) // 2])
    else:  # readable archive whose contents no longer match their digest
        st = torch.load(path, weights_only=True)
        st["network"]["head.bias"] += 1.0
        torch.save(st, path)
    with pytest.raises(CheckpointError, match="ckpt.pt") as err:
        load_checkpoint(path)
    assert isinstance(err.value, ValueError)
    net = classifier(seed=5)
    before = state(net)
    with pytest.raises(CheckpointError, match="ckpt.pt"):
        fit(
            net,
            contains3(32, 0),
            epochs=2,
            batch_size=16,
            checkpoint_path=path,
            resume=True,
            progress=False,
        )
    assert_same_state(before, state(net), atol=0)  # nothing was (partially) loaded


def test_checkpoint_with_other_architecture_names_the_keys(tmp_path):
    path = _checkpoint(tmp_path, num_layers=1)
    net = classifier(num_layers=2, seed=5)
    before = state(net)
    with pytest.raises(CheckpointError, match=r"missing keys \[.*encoder\.layers\.1\.") as err:
        fit(
            net,
            contains3(32, 0),
            epochs=2,
            batch_size=16,
            checkpoint_path=path,
            resume=True,
            progress=False,
        )
    assert "ckpt.pt" in str(err.value)
    assert_same_state(before, state(net), atol=0)
    path = _checkpoint(tmp_path, d_model=16)
    with pytest.raises(CheckpointError, match="mismatched shapes"):
        fit(
            classifier(),
            contains3(32, 0),
            epochs=2,
            batch_size=16,
            checkpoint_path=path,
            resume=True,
            progress=False,
        )
    with pytest.raises(CheckpointError, match="batch_size=16"):
        fit(
            classifier(d_model=16),
            contains3(32, 0),
            epochs=2,
            batch_size=8,
            checkpoint_path=path,
            resume=True,
            progress=False,
        )
    with pytest.raises(CheckpointError, match="method 'hybrid'"):
        fit(
            classifier(),
            contains3(32, 0),
            method="svi",
            epochs=2,
            batch_size=16,
            checkpoint_path=path,
            resume=True,
            progress=False,
        )
    with pytest.raises(FileNotFoundError):
        fit(classifier(), contains3(32, 0), checkpoint_path=tmp_path / "nope.pt", resume=True)


@pytest.mark.parametrize("method", ["hybrid", "svi"])
def test_check_state_fits_names_each_mismatch(method):
    """Every way a state can fail to fit a run is a CheckpointError naming what differs; the
    trainer's own state fits (checked directly, as :meth:`Trainer.load_state_dict` does)."""
    from bayesattn.training.checkpoint import check_state_fits

    trainer = Trainer(classifier(), method=method, epochs=1, batch_size=16, progress=False)
    trainer.fit(contains3(32, 0))
    st = trainer.state_dict()
    fits = dict(
        where="'here'",
        config=trainer.config,
        data={"source_type": "tensors", "batch_size": 16},
        num_data=32,
        network=trainer.network,
        optimizer=trainer.optimizer,
        param_names=trainer.param_names,
    )
    check_state_fits(st, **fits)  # its own state fits
    cases = [
        ({"method": "svi" if method == "hybrid" else "hybrid"}, {}, "made with method"),
        ({}, {"data": {"source_type": "stream", "batch_size": 16}}, "train_data of type 'tensors'"),
        # a checkpoint before 0.6 names the source's type "kind": read as such
        ({"data": {"kind": "stream", "batch_size": 8}}, {"data": {"source_type": "stream",
         "batch_size": 16}}, "stream with batch_size=8; got 16"),
        ({"data": {"source_type": "stream", "batch_size": 8}}, {"data": {"source_type": "stream",
         "batch_size": 16}}, "stream with batch_size=8; got 16"),
        ({"config": {**st["config"], "drop_last": True}}, {}, "drop_last=True"),
        ({"num_data": 31}, {}, "31 training examples; got 32"),
        ({"network": {**st["network"], "extra": torch.zeros(1)}}, {}, r"unexpected keys \['extra'\]"),
    ]
    if method == "hybrid":
        groups = [{**g, "params": g["params"][1:]} for g in st["optimizer"]["param_groups"]]
        bad_opt = {**st["optimizer"], "param_groups": groups}
        cases.append(({"optimizer": bad_opt}, {}, "optimiser holds"))
    else:
        cases.append(({"optimizer": {**st["optimizer"], "nope": {}}}, {}, r"unknown .*'nope'"))
    for change, fit_change, message in cases:
        with pytest.raises(CheckpointError, match=message) as err:
            check_state_fits({**st, **change}, **{**fits, **fit_change})
        assert "'here'" in str(err.value)
    if method == "hybrid":
        with pytest.raises(ValueError, match="optimizer is required"):
            check_state_fits(st, **{**fits, "optimizer": None})


def test_stale_param_store_does_not_hijack_svi_training():
    """Two networks with the same Pyro names in one process: SVI must optimise the one being
    trained (the global param store holds the first one's tensors under those names)."""
    a = classifier(seed=0)
    fit(a, contains3(32, 0), method="svi", epochs=1, batch_size=16, progress=False)
    a_after, b = state(a), classifier(seed=1)
    b_before = state(b)
    fit(b, contains3(32, 0), method="svi", epochs=1, batch_size=16, progress=False)
    assert_same_state(a_after, state(a), atol=0)
    assert not torch.equal(b_before["head.weight"], state(b)["head.weight"])


# ---------------------------------------------------------------------------------------------
# history, configuration, bad inputs
# ---------------------------------------------------------------------------------------------


def test_history_plot_and_dict(tmp_path):
    from matplotlib.figure import Figure

    h = fit(
        classifier(),
        contains3(32, 0),
        contains3(16, 1),
        epochs=3,
        batch_size=16,
        kl_anneal_steps=3,
        early_stopping_patience=5,
        progress=False,
    )
    d = h.to_dict()
    assert len(d["train_loss"]) == 3 and d["best_epoch"] in (1, 2, 3)
    assert History.from_dict(d).to_dict() == d
    fig = h.plot(tmp_path / "history.png")
    assert isinstance(fig, Figure) and len(fig.axes) == 4
    assert (tmp_path / "history.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    "field, value",
    [
        ("method", "mcmc"),
        ("epochs", 0),
        ("max_steps", 0),
        ("batch_size", 0),
        ("lr", -1.0),
        ("lr", float("nan")),
        ("weight_decay", -0.1),
        ("warmup_steps", -1),
        ("lr_decay", "exp"),
        ("min_lr_ratio", 2.0),
        ("clip_norm", 0.0),
        ("kl_anneal_steps", 1.5),
        ("kl_start", 0.0),
        ("num_particles", 0),
        ("vectorize_particles", "yes"),
        ("elbo", "tracegraph"),
        ("seed", -1),
        ("progress", 1),
        ("early_stopping_patience", 0),
        ("eval_every", 0),
        ("val_loss", "acc"),
        ("device", "gpu7"),
    ],
)
def test_config_validation_names_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        TrainConfig(**{field: value})


@pytest.mark.parametrize(
    "case, exc, match",
    [
        ("label_out_of_range", ValueError, r"train_data.*labels y must be in \[0, 2\)"),
        ("length_mismatch", ValueError, r"len\(x\) != len\(y\)"),
        ("empty", ValueError, "train_data is empty"),
        ("batch_size", ValueError, "batch_size"),
        ("bad_option", ValueError, "lr_decay"),
        ("unknown_option", TypeError, "learning_rate"),
        ("no_labels", ValueError, "needs targets"),
        ("float_labels", TypeError, "integer"),
        ("bad_tokens", ValueError, r"train_data: x ids must be in \[0, 10\)"),
        ("bad_val", ValueError, "val_data"),
        ("not_data", TypeError, "train_data"),
    ],
)
def test_bad_inputs_raise_before_training(case, exc, match):
    net = classifier()
    before = state(net)
    x, y = contains3(32, 0)
    train, val, kw = (x, y), None, {}
    if case == "label_out_of_range":
        train = (x, y + 1)
    elif case == "length_mismatch":
        train = (x, y[:-1])
    elif case == "empty":
        train = (x[:0], y[:0])
    elif case == "batch_size":
        kw = {"batch_size": 0}
    elif case == "bad_option":
        kw = {"lr_decay": "exponential"}
    elif case == "unknown_option":
        kw = {"learning_rate": 0.1}
    elif case == "no_labels":
        train = (x, None)
    elif case == "float_labels":
        train = (x, y.float())
    elif case == "bad_tokens":
        train = (x + 5, y)
    elif case == "bad_val":
        val = (x[:4], y[:4] + 2)
    elif case == "not_data":
        train = {"x": x, "y": y}
    with pytest.raises(exc, match=match):
        fit(net, train, val, epochs=1, progress=False, **kw)
    assert_same_state(before, state(net), atol=0)
    assert len(pyro.get_param_store()) == 0  # nothing ran


def test_kl_weight_scales_the_whole_schedule():
    from bayesattn.training import TrainConfig, kl_beta

    assert kl_beta(0, 10, 0.1, final=0.01) == pytest.approx(0.001)
    assert kl_beta(10, 10, 0.1, final=0.01) == pytest.approx(0.01)
    assert kl_beta(5, 0, final=0.5) == 0.5
    with pytest.raises(ValueError, match="kl_weight"):
        TrainConfig(kl_weight=0.0)
