"""Tests for bayesattn.training: torch LR schedules against the closed form, and ``fit`` on
map-style datasets, DataLoaders and streams (exact resume)."""

from __future__ import annotations

import dataclasses
import itertools
import warnings

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from bayesattn.nn.blocks import AttentionConfig
from bayesattn.nn.networks import TransformerClassifier
from bayesattn.training import TrainConfig, Trainer, fit, load_checkpoint
from bayesattn.training.data import as_train_data
from bayesattn.training.schedules import lr_factor, lr_scheduler
from tests.tasks import contains3


def classifier(seed=0, dropout=0.1):
    torch.manual_seed(seed)
    return TransformerClassifier(
        2,
        vocab_size=10,
        d_model=16,
        nhead=2,
        num_layers=1,
        dim_feedforward=32,
        dropout=dropout,
        max_len=16,
        attention=AttentionConfig(family="dirichlet"),
    )


def state(net):
    return {k: v.detach().clone() for k, v in net.state_dict().items()}


def assert_same_state(a, b):
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=0, rtol=0, msg=k)


class Pairs(Dataset):
    """A map-style dataset (not a TensorDataset): item i is (x_i, y_i)."""

    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class Stream(IterableDataset):
    """A deterministic stream generated on the fly, chunk by chunk (never all in memory); no
    ``__len__`` unless ``sized``."""

    def __init__(self, n: int, seed: int = 0, sized: bool = False):
        self.n, self.seed, self.sized = n, seed, sized

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed)
        for _ in range(self.n):
            x = torch.randint(1, 10, (8,), generator=g)
            yield x, (x == 3).any().long()

    def __len__(self):
        if not self.sized:
            raise TypeError("unsized")
        return self.n


class Batches(IterableDataset):
    """A stream that yields whole batches of 8 (a DataLoader with batch_size=None)."""

    def __iter__(self):
        x, y = contains3(32, 3)
        yield from zip(x.split(8), y.split(8), strict=True)


# ---------------------------------------------------------------------------------------------
# schedules
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("decay", ["cosine", "linear", "step", "none"])
def test_torch_schedule_reproduces_the_closed_form_step_by_step(decay):
    """The torch scheduler chain gives lr·lr_factor(s) at every step s, past the decay too."""
    worst = 0.0
    for W, T, r, k, g in itertools.product([0, 1, 3], [1, 17], [0.0, 0.2], [1, 5], [0.5, 1.0]):
        p = torch.nn.Parameter(torch.zeros(1))
        opt = torch.optim.AdamW([p], lr=0.3)
        kw = dict(warmup_steps=W, decay=decay, decay_steps=T, min_lr_ratio=r, step_size=k, gamma=g)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no scheduler-order or deprecation warnings
            sched = lr_scheduler(opt, **kw)
            for s in range(40):
                worst = max(worst, abs(opt.param_groups[0]["lr"] - 0.3 * lr_factor(s, **kw)))
                p.grad = torch.ones(1)
                opt.step()
                sched.step()
    assert worst < 1e-12


def test_schedule_uses_stock_torch_schedulers():
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    s = lr_scheduler(opt, warmup_steps=2, decay="cosine", decay_steps=10, min_lr_ratio=0.1)
    assert isinstance(s, torch.optim.lr_scheduler.SequentialLR)
    kinds = [type(x).__name__ for x in s._schedulers]
    assert kinds == ["LinearLR", "CosineAnnealingLR", "ConstantLR"]
    with pytest.raises(ValueError, match="decay"):
        lr_scheduler(opt, decay="exp")


@pytest.mark.parametrize("method", ["hybrid", "svi"])
def test_trainer_lr_follows_the_closed_form_and_history(method):
    """The optimiser's lr at every step equals TrainConfig.lr·lr_factor (the old behaviour)."""
    cfg = TrainConfig(
        method=method,
        epochs=3,
        batch_size=16,
        lr=0.02,
        warmup_steps=2,
        lr_decay="cosine",
        min_lr_ratio=0.1,
        progress=False,
    )
    trainer = Trainer(classifier(), cfg)
    seen = []
    orig = torch.optim.AdamW.step

    def spy(self, *a, **k):
        seen.append(self.param_groups[0]["lr"])
        return orig(self, *a, **k)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch.optim.AdamW, "step", spy)
        h = trainer.fit(contains3(48, 0))
    steps = 9
    expected = [
        0.02 * lr_factor(s, warmup_steps=2, decay_steps=steps, min_lr_ratio=0.1)
        for s in range(steps)
    ]
    if method == "svi":  # one AdamW per parameter, all on the same schedule
        per = len(seen) // steps
        seen = seen[::per]
    assert seen == pytest.approx(expected, rel=1e-12)
    assert h.lr == pytest.approx([expected[2], expected[5], expected[8]], rel=1e-12)


# ---------------------------------------------------------------------------------------------
# data sources
# ---------------------------------------------------------------------------------------------


def test_map_style_dataset_trains_exactly_like_tensors():
    """Same permutation, same batches: a map-style Dataset gives the tensors' run bit for bit."""
    x, y = contains3(40, 0)
    a, b = classifier(), classifier()
    ha = fit(a, (x, y), epochs=2, batch_size=16, progress=False)
    hb = fit(b, Pairs(x, y), epochs=2, batch_size=16, progress=False)
    assert_same_state(state(a), state(b))
    assert ha.train_loss == hb.train_loss


def _resume_pair(make_data, tmp_path, cfg, **kw):
    """An uninterrupted run, and the same run stopped after 3 steps and resumed in a fresh
    network/trainer; returns both networks and histories."""
    full = classifier()
    h_full = fit(full, make_data(), config=cfg, **kw)
    path = tmp_path / "ckpt.pt"
    fit(
        classifier(),
        make_data(),
        config=dataclasses.replace(cfg, max_steps=3),
        checkpoint_path=path,
        **kw,
    )
    assert load_checkpoint(path)["pos"] == 3  # stopped mid-epoch
    resumed = classifier(seed=7)
    h2 = fit(resumed, make_data(), config=cfg, checkpoint_path=path, resume=True, **kw)
    return full, resumed, h_full, h2


@pytest.mark.parametrize("kind", ["dataset", "loader", "stream", "stream_loader"])
def test_resume_is_exact_for_datasets_loaders_and_deterministic_streams(kind, tmp_path):
    x, y = contains3(80, 0)
    cfg = TrainConfig(epochs=2, batch_size=16, lr=3e-3, warmup_steps=2, progress=False)
    kw = {}
    if kind == "dataset":

        def make():
            return Pairs(x, y)
    elif kind == "loader":  # its own sampler (shuffled, seeded by the trainer) and batch size

        def make():
            return DataLoader(Pairs(x, y), batch_size=12, shuffle=True)
    elif kind == "stream":

        def make():
            return Stream(80)

        kw = {"num_data": 80}
    else:

        def make():
            return DataLoader(Stream(80, sized=True), batch_size=16)

    full, resumed, h_full, h2 = _resume_pair(make, tmp_path, cfg, **kw)
    assert_same_state(state(full), state(resumed))
    for key in ("epoch", "step", "train_loss", "train_acc", "lr"):
        assert getattr(h2, key) == getattr(h_full, key), key


def test_shuffled_loader_order_is_seeded_and_changes_per_epoch():
    x, y = contains3(30, 0)
    src = as_train_data(DataLoader(Pairs(x, y), batch_size=7, shuffle=True), "train_data", 64)
    assert src.source_type == "loader" and src.num_data == 30 and src.batches_per_epoch() == 5
    g1, g2 = torch.Generator().manual_seed(0), torch.Generator().manual_seed(0)
    before = torch.get_rng_state()
    o1, s1 = src.plan(g1, 0)
    o2, _ = src.plan(g2, 0)
    o3, _ = src.plan(g1, 1)
    assert torch.equal(torch.get_rng_state(), before)  # the global RNG is untouched
    assert torch.equal(o1, o2) and not torch.equal(o1, o3)
    assert sorted(o1.tolist()) == list(range(30)) and s1.tolist() == [7, 7, 7, 7, 2]


def test_stream_is_not_materialised_and_elbo_uses_num_data(monkeypatch):
    """A stream trains batch by batch; the data plate's scale is the given N."""
    seen = []
    orig = TransformerClassifier.elbo_loss

    def spy(self, x, y, num_data=None, **k):
        seen.append((len(x), num_data))
        return orig(self, x, y, num_data=num_data, **k)

    monkeypatch.setattr(TransformerClassifier, "elbo_loss", spy)
    stream = Stream(40)
    stream.num_data = 1000  # a declared subsample of a set of 1000
    h = fit(
        classifier(),
        stream,
        num_data=1000,
        epochs=2,
        batch_size=16,
        lr_decay="none",
        progress=False,
    )
    train_calls = seen[1:]  # the first is the set-up's dry run
    assert [b for b, _ in train_calls] == [16, 16, 8] * 2
    assert {n for _, n in train_calls} == {1000}
    assert h.step == [3, 6]


def test_data_errors_name_the_argument():
    x, y = contains3(32, 0)
    with pytest.raises(ValueError, match="num_data"):
        fit(classifier(), Stream(32), epochs=1, progress=False)  # unsized, no num_data
    with pytest.raises(ValueError, match=r"train_data \(batch 0\).*labels y"):
        fit(classifier(), Pairs(x, y + 1), epochs=1, progress=False)
    with pytest.raises(TypeError, match="batch must be a tensor x or a pair"):
        fit(
            classifier(),
            DataLoader(Pairs(x, y), batch_size=8, collate_fn=lambda b: b),
            epochs=1,
            progress=False,
        )
    batched = DataLoader(Batches(), batch_size=None)  # the stream yields whole batches
    with pytest.raises(ValueError, match="decay_steps"):  # batches per epoch unknown
        fit(classifier(), batched, num_data=32, epochs=1, progress=False)
    h = fit(classifier(), batched, num_data=32, epochs=1, decay_steps=4, progress=False)
    assert h.step == [4]
    with pytest.raises(ValueError, match="val_loss='elbo'"):
        fit(classifier(), (x, y), Stream(16), epochs=1, val_loss="elbo", progress=False)


def test_validation_on_a_loader_matches_tensors():
    x, y = contains3(32, 0)
    xv, yv = contains3(20, 1)
    trainer = Trainer(classifier(), epochs=1, batch_size=16, progress=False)
    trainer.fit((x, y))
    a = trainer.evaluate((xv, yv))
    b = trainer.evaluate(DataLoader(Pairs(xv, yv), batch_size=6))
    c = trainer.evaluate(Stream(20, seed=5))
    assert a["loss"] == pytest.approx(b["loss"], rel=1e-6)
    assert a["accuracy"] == b["accuracy"]
    assert 0 < c["loss"] < 5


# ---------------------------------------------------------------------------------------------
# the objective (training/objective.py) and validation (training/validation.py)
# ---------------------------------------------------------------------------------------------


def _grads(net):
    return {n: p.grad.clone() for n, p in net.named_parameters() if p.grad is not None}


@pytest.mark.parametrize(
    "method, particles, vectorize",
    [("hybrid", 1, True), ("hybrid", 3, True), ("hybrid", 3, False), ("svi", 1, True),
     ("svi", 2, False)],
)
def test_objective_loss_and_loss_and_grads_agree(method, particles, vectorize):
    """The Lightning path (a differentiable loss) and the Trainer path (back-propagated per
    particle, gradients in per-example units) are one objective: same value, same gradients."""
    from bayesattn.training.objective import ElboObjective
    from bayesattn.training.param_store import sync_param_store

    x, y = contains3(12, 0)
    net = classifier(dropout=0.0)
    cfg = TrainConfig(method=method, num_particles=particles, vectorize_particles=vectorize,
                      kl_anneal_steps=4, kl_start=0.1)
    sync_param_store(net, x, y, 40)
    obj = ElboObjective(net, cfg)
    assert obj.set_step(2) == pytest.approx(0.1 + 0.9 * 2 / 4)  # kl_beta's closed form
    torch.manual_seed(1)
    loss, logits = obj.loss(x, y, 40)
    loss.backward()
    g_loss = _grads(net)
    net.zero_grad(set_to_none=True)
    torch.manual_seed(1)
    step = obj.loss_and_grads(x, y, 40)
    g_step = {n: p.grad for n, p in net.named_parameters() if p.grad is not None}
    assert step.loss == pytest.approx(float(loss.detach()), rel=1e-5)
    torch.testing.assert_close(step.logits, logits)
    assert logits.shape == ((particles,) if particles > 1 else ()) + (12, 2)
    assert g_loss.keys() == g_step.keys() and g_loss
    for k in g_loss:
        scale = float(g_loss[k].abs().max())  # float32 sums in another order: ~1e-6 relative
        torch.testing.assert_close(g_step[k], g_loss[k], rtol=0, atol=1e-4 * scale, msg=k)
    if method == "hybrid" and particles == 1:  # independent: the network's own ELBO over N
        torch.manual_seed(1)
        ref, _ = net.elbo_loss(x, y, num_data=40, beta=obj.beta)
        assert float(loss.detach()) == pytest.approx(float(ref.detach()) / 40, rel=1e-6)


def test_predictive_scores_average_particle_probabilities():
    from bayesattn.training.objective import predictive_scores

    logits = torch.randn(3, 4, 5, 7)  # (P, B, T, C)
    out = predictive_scores(logits, target_dims=2)
    torch.testing.assert_close(out.exp(), torch.softmax(logits, -1).mean(0))
    one = logits[0]
    assert predictive_scores(one, target_dims=2) is one  # one pass: the logits themselves


def test_validation_metrics_match_calibration_on_the_whole_set():
    """Batch-wise sums give the metrics of all predictions at once (bayesattn.calibration)."""
    from bayesattn.calibration import accuracy, expected_calibration_error, negative_log_likelihood
    from bayesattn.training.validation import ValidationBatch, ValidationMetrics

    g = torch.Generator().manual_seed(0)
    probs = torch.softmax(3 * torch.randn(50, 4, generator=g), -1)
    y = torch.randint(0, 4, (50,), generator=g)
    m = ValidationMetrics(n_bins=10)
    for sl in (slice(0, 7), slice(7, 30), slice(30, 50)):
        m.update(ValidationBatch(1.5, sl.stop - sl.start, probs[sl], y[sl]))
    out = m.compute()
    assert out["loss"] == pytest.approx(3 * 1.5 / 50)
    assert out["accuracy"] == pytest.approx(accuracy(probs, y))
    assert out["nll"] == pytest.approx(negative_log_likelihood(probs, y), rel=1e-6)
    assert out["ece"] == pytest.approx(expected_calibration_error(probs, y, n_bins=10), abs=1e-9)


def test_evaluate_reports_the_posterior_predictive():
    """Trainer.evaluate: the deterministic loss plus the posterior predictive of
    bayesattn.uncertainty.predict (accuracy, NLL, ECE), the RNG untouched."""
    from bayesattn.calibration import expected_calibration_error
    from bayesattn.uncertainty import predict

    x, y = contains3(32, 0)
    xv, yv = contains3(24, 1)
    trainer = Trainer(classifier(), epochs=1, batch_size=16, val_samples=4, progress=False)
    h = trainer.fit((x, y), (xv, yv))
    assert h.val_nll[-1] is not None and h.val_ece[-1] is not None
    before = torch.get_rng_state()
    m = trainer.evaluate((xv, yv))
    assert torch.equal(torch.get_rng_state(), before)
    assert m["loss"] == pytest.approx(h.val_loss[-1]) and m["nll"] == pytest.approx(h.val_nll[-1])
    net = trainer.network
    with torch.no_grad():
        torch.manual_seed(7)
        ref = -net.likelihood(net(xv), None, 0).log_prob(yv).mean()
    assert m["loss"] == pytest.approx(float(ref), rel=1e-5)
    p = predict(net, xv, num_samples=4, keep_attention=False).mean_probs  # other draws
    assert m["accuracy"] == pytest.approx(float((p.argmax(-1) == yv).double().mean()), abs=0.15)
    assert abs(m["ece"] - expected_calibration_error(p, yv)) < 0.15
    assert 0 < m["nll"] < 2


def test_history_from_before_the_predictive_metrics_loads():
    from bayesattn.training.history import History

    old = {"epoch": [1, 2], "step": [2, 4], "train_loss": [1.0, 0.5], "train_acc": [0.5, 0.6],
           "val_loss": [None, 0.7], "val_acc": [None, 0.6], "lr": [0.1, 0.1], "beta": [1, 1],
           "seconds": [0.1, 0.1]}
    h = History.from_dict(old)
    assert h.val_nll == [None, None] and h.val_ece == [None, None] and len(h) == 2
    assert History.from_dict(h.to_dict()) == h


def test_val_samples_zero_is_the_deterministic_predictive():
    """``val_samples=0``: accuracy and NLL of the posterior-mean network (one pass)."""
    x, y = contains3(32, 0)
    xv, yv = contains3(24, 1)
    trainer = Trainer(classifier(), epochs=1, batch_size=16, val_samples=0, progress=False)
    trainer.fit((x, y))
    m = trainer.evaluate((xv, yv))
    with torch.no_grad():
        logits = trainer.network(xv)
    assert m["accuracy"] == float((logits.argmax(-1) == yv).double().mean())
    assert m["nll"] == pytest.approx(m["loss"], rel=1e-5)  # the deterministic NLL, twice
    with pytest.raises(ValueError, match="val_samples"):
        TrainConfig(val_samples=-1)


# ---- issue 33: round 4 ------------------------------------------------------------------------
_SMALL = dict(d_model=8, nhead=2, num_layers=1, dim_feedforward=16)


class _Short(IterableDataset):
    """``n`` examples per pass, no ``__len__``; ``bad_epoch``: a bad label in that pass."""

    def __init__(self, n: int, bad_pass: int | None = None) -> None:
        self.n, self.bad_pass, self.passes = n, bad_pass, 0

    def __iter__(self):
        self.passes += 1
        g = torch.Generator().manual_seed(0)
        for i in range(self.n):
            y = torch.randint(0, 2, (), generator=g)
            if self.passes == self.bad_pass and i == self.n - 1:
                y = torch.tensor(7)
            yield torch.randint(1, 6, (4,), generator=g), y


def test_a_stream_shorter_than_num_data_is_refused_at_the_end_of_the_epoch():
    """24 examples declared as num_data=1000: the ELBO would be scaled 40 times too high; the
    error comes at the end of the first epoch and leaves the network and param store as they
    were. A stream that subsamples a larger set declares it (``dataset.num_data``)."""
    import pyro

    pyro.clear_param_store()
    net = TransformerClassifier(2, vocab_size=6, **_SMALL)
    before = [p.detach().clone() for p in net.parameters()]
    with pytest.raises(ValueError, match=r"yielded 24 examples in one epoch but num_data=1000.*"
                       r"pass num_data=24"):  # fmt: skip
        fit(net, _Short(24), num_data=1000, epochs=2, batch_size=8, progress=False)
    assert all(torch.equal(a, b) for a, b in zip(before, net.parameters(), strict=True))
    assert not list(pyro.get_param_store().keys())
    sub = _Short(24)
    sub.num_data = 1000  # a declared subsample of a set of 1000
    h = fit(net, sub, num_data=1000, epochs=2, batch_size=8, progress=False)
    assert len(h.train_loss) == 2
    with warnings.catch_warnings():  # a stream of num_data examples (drop_last remainder): none
        warnings.simplefilter("error")
        fit(TransformerClassifier(2, vocab_size=6, **_SMALL), _Short(24), num_data=24,
            epochs=1, batch_size=8, progress=False)  # fmt: skip
        fit(TransformerClassifier(2, vocab_size=6, **_SMALL), _Short(26), num_data=26,
            epochs=1, batch_size=8, drop_last=True, progress=False)  # fmt: skip


class _Ragged(Dataset):
    def __len__(self) -> int:
        return 6

    def __getitem__(self, i):
        return torch.randint(1, 6, (3 + i,)), torch.tensor(i % 2)


def test_ragged_sequences_through_the_default_collate_are_a_clear_error():
    net = TransformerClassifier(2, vocab_size=6, **_SMALL)
    with pytest.raises(ValueError, match=r"cannot be stacked .*ragged sequences\?.*collate_fn"):
        fit(net, _Ragged(), epochs=1, batch_size=3, progress=False)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_an_unavailable_device_is_a_clear_error():
    net = TransformerClassifier(2, vocab_size=6, **_SMALL)
    x, y = torch.randint(1, 6, (8, 4)), torch.randint(0, 2, (8,))
    with pytest.raises(ValueError, match="TrainConfig.device is 'cuda' but CUDA is not available"):
        fit(net, (x, y), epochs=1, device="cuda", progress=False)
    with pytest.raises(ValueError, match="device"):
        TrainConfig(device="cuda:1")


@pytest.mark.parametrize("method", ["hybrid", "svi"])
def test_a_fit_that_raises_leaves_the_network_and_param_store_as_they_were(method):
    import pyro

    pyro.clear_param_store()
    net = TransformerClassifier(2, vocab_size=6, attention="dirichlet", **_SMALL)
    net.train()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    loader = DataLoader(_Short(16, bad_pass=4), batch_size=4)  # after steps were taken
    with pytest.raises(ValueError, match=r"epoch \d, batch 3\): labels y must be in"):
        fit(net, loader, num_data=16, epochs=3, method=method, decay_steps=12, progress=False)
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())
    assert net.training and not list(pyro.get_param_store().keys())
    # a trainer already set up is put back too: its step, history and weights
    tr = Trainer(net, epochs=1, method=method, decay_steps=12, progress=False)
    tr.fit(DataLoader(_Short(16), batch_size=4), num_data=16)
    state = {k: v.clone() for k, v in net.state_dict().items()}
    step, epochs = tr.step, len(tr.history.train_loss)
    tr.config.epochs = 3
    with pytest.raises(ValueError, match="labels y must be in"):
        tr.fit(DataLoader(_Short(16, bad_pass=2), batch_size=4), num_data=16)
    assert tr.step == step and len(tr.history.train_loss) == epochs
    assert all(torch.equal(state[k], v) for k, v in net.state_dict().items())


def test_ragged_items_through_a_users_dataloader_are_a_clear_error():
    """A user's ``DataLoader`` with torch's default collate over ragged items: the same clear
    error as a bare dataset (torch's was a RuntimeError from inside its collate)."""
    net = TransformerClassifier(2, vocab_size=6, **_SMALL)
    before = [p.detach().clone() for p in net.parameters()]
    with pytest.raises(ValueError, match=r"cannot be stacked .*ragged sequences\?.*collate_fn"):
        fit(net, DataLoader(_Ragged(), batch_size=2), epochs=1, progress=False)
    assert all(torch.equal(a, b) for a, b in zip(before, net.parameters(), strict=True))


def test_a_foreign_model_with_labels_past_its_classes_is_refused_unchanged():
    import pyro

    pyro.clear_param_store()
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    before = [p.detach().clone() for p in model.parameters()]
    x, y = torch.randn(8, 4), torch.tensor([0, 1, 2, 0, 1, 2, 0, 3])
    with pytest.raises(ValueError, match=r"labels y must be in \[0, 3\) for a model that returns "
                       r"3 logits per example; got min 0, max 3"):  # fmt: skip
        fit(model, (x, y), epochs=1, batch_size=8, progress=False)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert not list(pyro.get_param_store().keys())  # the param store as it was


def test_a_meta_device_model_is_refused_before_training():
    net = TransformerClassifier(2, vocab_size=6, **_SMALL).to("meta")
    x = torch.randint(1, 6, (8, 4))
    with pytest.raises(ValueError, match=r"network's parameter .* is on the meta device .*to_empty"):
        fit(net, (x, (x == 3).any(1).long()), epochs=1, batch_size=4, progress=False)
    foreign = torch.nn.Linear(4, 2, device="meta")
    with pytest.raises(ValueError, match="'module.weight' is on the meta device"):
        fit(foreign, (torch.randn(8, 4), torch.zeros(8, dtype=torch.long)), epochs=1,
            batch_size=4, progress=False)  # fmt: skip
