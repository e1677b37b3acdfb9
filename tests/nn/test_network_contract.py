"""The public network contract (``bayesattn.nn.contract``) with networks a user writes.

Two user networks written only against the contract (``forward_logits`` + ``targets``, optional
``check_batch``): a Bayesian logistic regression (weights Bayesian through
``bayesian_projections``) and a one-layer attention classifier (Bayesian attention). They are
trained with ``Trainer``/``fit``, sampled with ``predict`` and exported with the diagnostics, and
checked against closed forms: the ELBO of a deterministic network is ``N/B`` times the summed
``cross_entropy``; prior-predictive logit differences are Gaussian with known mean and variance;
the posterior predictive is the average of ``softmax`` over weight draws from the guide.
"""

from __future__ import annotations

import inspect
import math

import pytest
import torch
import torch.nn.functional as F
from pyro import poutine
from torch import nn

from bayesattn import diagnostics as D
from bayesattn.nn import (
    BayesianMultiheadAttention,
    BayesianNetwork,
    CausalLM,
    Seq2Seq,
    TransformerClassifier,
    VisionTransformer,
    bayesian_projections,
)
from bayesattn.nn.attention import linear
from bayesattn.nn.contract import (
    OPTIONAL,
    PROVIDED,
    REMOVED_PRIVATE_NAMES,
    REQUIRED,
    NetworkContract,
    check_network,
)
from bayesattn.training import Trainer, fit
from bayesattn.uncertainty import predict

# ---------------------------------------------------------------------------------------------
# networks a user writes
# ---------------------------------------------------------------------------------------------


class LogReg(BayesianNetwork):
    """``p(y | x, W, b) = Categorical(softmax(W x + b))``; x ``(B, D)`` → logits ``(*S, B, C)``."""

    def __init__(self, in_features: int, num_classes: int) -> None:
        super().__init__()
        self.head = nn.Linear(in_features, num_classes)

    def check_batch(self, x, y):
        super().check_batch(x, y)
        if x.dim() != 2 or x.shape[1] != self.head.in_features:
            raise ValueError(f"x must be (B, {self.head.in_features}); got {tuple(x.shape)}")

    def forward_logits(self, x, y=None, num_samples=1):
        h = x.unsqueeze(-2)  # (B, 1, D): linear() reads (*S, B, T, In)
        if num_samples > 1:
            h = h.expand(num_samples, *h.shape)  # (S, B, 1, D)
        return linear(h, self.head.weight, self.head.bias).squeeze(-2)  # (*S, B, C)

    def targets(self, x, y):
        return y, None, 0


class TinyAttention(BayesianNetwork):
    """Tokens ``(B, T)`` → embedding → one Bayesian attention layer → mean pool → logits."""

    def __init__(self, vocab: int, num_classes: int, d: int = 8, family: str = "dirichlet"):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.attn = BayesianMultiheadAttention(d, 2, batch_first=True, family=family)
        self.head = nn.Linear(d, num_classes)

    def forward_logits(self, x, y=None, num_samples=1):
        h = self.embed(x)  # (B, T, d)
        if num_samples > 1:
            h = h.expand(num_samples, *h.shape)  # (S, B, T, d)
        h, _ = self.attn(h, h, h)  # weights drawn per sample and example in sampling modes
        return self.head(h.mean(-2))  # (*S, B, C)

    def targets(self, x, y):
        return y, None, 0


def _blobs(n=64, d=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 2, (n,), generator=g)
    x = torch.randn(n, d, generator=g) + 2.0 * (2 * y[:, None] - 1)  # (n, d), separable
    return x, y


def _token_task(n=48, T=5, seed=0):
    """Class 1 iff token 3 occurs."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(4, 8, (n, T), generator=g)
    y = torch.randint(0, 2, (n,), generator=g)
    pos = torch.randint(0, T, (n,), generator=g)
    x[y == 1, pos[y == 1]] = 3
    return x, y


# ---------------------------------------------------------------------------------------------
# the protocol
# ---------------------------------------------------------------------------------------------

BUILT_INS = [
    lambda: TransformerClassifier(3, vocab_size=10, d_model=8, nhead=2, num_layers=1),
    lambda: VisionTransformer(3, d_model=8, nhead=2, num_layers=1),
    lambda: Seq2Seq(9, 9, d_model=8, nhead=2, num_encoder_layers=1, num_decoder_layers=1),
    lambda: CausalLM(9, d_model=8, nhead=2, num_layers=1),
    lambda: LogReg(3, 2),
    lambda: TinyAttention(8, 2),
]


@pytest.mark.parametrize("make", BUILT_INS)
def test_every_network_satisfies_the_protocol(make):
    net = make()
    assert isinstance(net, NetworkContract)
    assert check_network(net) is net
    # the 0.2 private spellings are gone (0.4)
    for old in REMOVED_PRIVATE_NAMES:
        assert not hasattr(net, old), (type(net).__name__, old)


def test_protocol_lists_every_member_once():
    members = {n for n in vars(NetworkContract) if not n.startswith("_")}
    members |= set(NetworkContract.__annotations__)
    listed = REQUIRED + OPTIONAL + PROVIDED
    assert len(set(listed)) == len(listed)
    assert members == set(listed)


def test_missing_required_method_is_a_clear_type_error():
    class NoTargets(BayesianNetwork):
        def forward_logits(self, x, y=None, num_samples=1):
            return x

    with pytest.raises(TypeError, match=r"NoTargets does not implement targets\(\)"):
        NoTargets()

    class Nothing(BayesianNetwork):
        pass

    with pytest.raises(TypeError, match=r"forward_logits\(\), targets\(\)"):
        Nothing()

    class Duck:  # not a BayesianNetwork: the protocol check names what is missing
        def forward_logits(self, x, y=None, num_samples=1):
            return x

    assert not isinstance(Duck(), NetworkContract)
    with pytest.raises(
        TypeError, match=r"Duck\) does not implement .*missing targets, check_batch"
    ):
        check_network(Duck())


@pytest.mark.parametrize("method", ["forward_logits", "forward"])
def test_old_sample_argument_is_refused_at_class_creation(method):
    """A user network still declaring ``num_particles`` (the pre-0.4 spelling of the sample
    count) is a ``TypeError`` naming the argument and its new name, when the class is made."""

    def old(self, x, y=None, num_particles=1):
        return x

    with pytest.raises(TypeError, match="num_particles") as err:
        type("OldSpelling", (LogReg,), {method: old})
    assert "num_samples" in str(err.value)
    assert method in str(err.value)


def test_old_sample_argument_is_refused_by_check_network():
    """An object that is not a ``BayesianNetwork`` is checked by ``check_network``: an old
    ``num_particles`` argument is a ``TypeError`` naming both spellings (no alias accepted)."""

    class Wrapper:  # not a BayesianNetwork: every member is a LogReg's
        def __init__(self):
            self.inner = LogReg(3, 2)

        def __getattr__(self, name):
            return getattr(self.__dict__["inner"], name)

    assert check_network(Wrapper()) is not None

    def old(self, x, y=None, num_particles=1):
        return x

    duck = type("OldDuck", (Wrapper,), {"forward_logits": old})()
    with pytest.raises(TypeError, match="num_particles") as err:
        check_network(duck)
    assert "num_samples" in str(err.value)
    assert "OldDuck.forward_logits" in str(err.value)


def test_new_sample_argument_is_the_contract_spelling():
    """Every contract method that takes the sample count names it ``num_samples``; the ELBO
    estimator keeps Pyro's ``num_particles`` (Monte-Carlo samples of the estimate)."""
    for cls in (NetworkContract, BayesianNetwork, TransformerClassifier, VisionTransformer,
                Seq2Seq, CausalLM, LogReg, TinyAttention):  # fmt: skip
        for m in ("forward_logits", "forward"):
            params = inspect.signature(getattr(cls, m)).parameters
            assert "num_samples" in params and "num_particles" not in params, (cls, m)
        params = inspect.signature(cls.elbo_loss).parameters
        assert "num_particles" in params and "num_samples" not in params, cls
    net, x = LogReg(3, 2), torch.randn(4, 3)
    assert net(x, num_samples=3).shape == (3, 4, 2)
    with pytest.raises(TypeError, match="num_particles"):
        net(x, num_particles=3)


def test_default_check_batch_names_argument_and_shapes():
    net = LogReg(3, 2)
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        net(3.0)
    with pytest.raises(ValueError, match=r"same batch size; got x \(4, 3\), y \(5,\)"):
        net.model(torch.zeros(4, 3), torch.zeros(5, dtype=torch.long))
    with pytest.raises(ValueError, match=r"x must be \(B, 3\)"):
        net(torch.zeros(4, 2))


@pytest.mark.parametrize(("old", "new"), list(REMOVED_PRIVATE_NAMES.items()))
def test_old_private_overrides_are_refused(old, new):
    """0.4 removed the 0.2 private aliases: a subclass overriding only the private name (which
    would never be called) is a TypeError naming both spellings; defining the public name is
    fine."""
    with pytest.raises(TypeError, match=rf"{old!r}.*{new!r}"):
        type("Old", (LogReg,), {old: lambda self, *a, **k: None})
    type("New", (LogReg,), {new: getattr(LogReg, new)})


# ---------------------------------------------------------------------------------------------
# trained, sampled, diagnosed
# ---------------------------------------------------------------------------------------------


def test_deterministic_elbo_is_scaled_cross_entropy():
    net = LogReg(3, 2)
    x, y = _blobs(16)
    loss, logits = net.elbo_loss(x, y, num_data=160)
    expected = 10.0 * F.cross_entropy(net.head(x), y, reduction="sum")
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(logits, net.head(x))
    # the model's obs site scores the same likelihood (unscaled log-probs)
    tr = poutine.trace(net.model).get_trace(x, y, 160)
    lp = tr.nodes["obs"]["fn"].log_prob(y)
    torch.testing.assert_close(lp, torch.log_softmax(net.head(x), -1)[torch.arange(16), y])


@pytest.mark.parametrize("method", ["hybrid", "svi"])
def test_user_network_trains_with_trainer(method):
    x, y = _blobs(64)
    net = LogReg(3, 2)
    bayesian_projections(net, targets="head.weight", init_scale=0.05)
    before = Trainer(net, method=method, progress=False).evaluate((x, y))
    hist = fit(net, (x, y), (x, y), method=method, epochs=4, batch_size=16, lr=0.05, progress=False)
    assert len(hist) == 4
    assert hist.val_acc[-1] >= 0.95
    assert hist.val_loss[-1] < before["loss"]


def test_user_attention_network_trains_samples_and_exports():
    x, y = _token_task()
    net = TinyAttention(8, 2)
    hist = fit(net, (x, y), epochs=2, batch_size=16, lr=0.02, progress=False, num_particles=2)
    assert all(math.isfinite(v) for v in hist.train_loss)
    r = predict(net, x[:6], num_samples=5)
    assert r.probs.shape == (5, 6, 2)
    assert r.attention["attn"].samples.shape == (5, 6, 2, 5, 5)
    torch.testing.assert_close(r.probs.sum(-1), torch.ones(5, 6))
    assert float(r.mutual_information.min()) >= -1e-6
    # mean mode: every sample is the deterministic forward
    m = predict(net, x[:6], num_samples=3, mode="mean")
    with torch.no_grad():
        net.eval()
        torch.testing.assert_close(m.probs[1], torch.softmax(net(x[:6]), -1))
    # diagnostics: the network's guide and model as ArviZ data
    idata = D.predictive_to_arviz(net, x[:6], y[:6], num_samples=4, seed=0)
    assert idata.posterior["attn.weights"].shape == (1, 4, 6, 2, 5, 5)
    assert idata.log_likelihood["obs"].shape == (1, 4, 6)
    assert D.predictive_to_arviz(r, y=y[:6]).posterior["probs"].shape == (1, 5, 6, 2)


def test_prior_predictive_matches_closed_form():
    """Prior mode: ``W_ij ~ N(0, s^2)`` so ``l_1 - l_0 = (w_1 - w_0)·x + b_1 - b_0`` is
    ``N(b_1 - b_0, 2 s^2 |x|^2)``; read back from the sampled probabilities."""
    s, S = 0.7, 4000
    net = LogReg(3, 2)
    bayesian_projections(net, targets="head.weight", prior_scale=s)
    assert [name for _, _, name in net.weight_sites()] == ["head.weight"]
    x = torch.tensor([[1.0, -2.0, 0.5], [0.0, 0.3, 0.1]])
    p = predict(net, x, num_samples=S, mode="model").probs  # (S, 2, 2)
    diff = (p[..., 1].log() - p[..., 0].log()).double()  # (S, 2)
    b = net.head.bias.detach().double()
    mean, var = b[1] - b[0], 2 * s**2 * x.double().pow(2).sum(-1)  # (2,)
    se = (var / S).sqrt()
    assert bool(((diff.mean(0) - mean).abs() < 4 * se).all()), (diff.mean(0), mean)
    torch.testing.assert_close(diff.var(0), var, rtol=0.08, atol=0.0)


def test_posterior_predictive_is_average_softmax_over_guide_draws():
    torch.manual_seed(1)
    net = LogReg(3, 2)
    bayesian_projections(net, targets="head.weight", init_scale=0.8)
    x = torch.tensor([[1.0, -2.0, 0.5], [0.0, 0.3, 0.1], [2.0, 2.0, -1.0]])
    S = 2000
    got = predict(net, x, num_samples=S).mean_probs  # (3, 2)
    with torch.no_grad(), poutine.block():
        draws = torch.stack([net.weight_guide()["head.weight"] for _ in range(S)])  # (S, C, D)
    p = torch.softmax(x @ draws.transpose(-1, -2) + net.head.bias.detach(), -1)  # (S, 3, 2)
    se = (2 * p.var(0) / S).sqrt()  # of the difference of two independent S-draw averages
    assert float(p.var(0).min()) > 1e-3  # the draws do differ
    assert bool(((got - p.mean(0)).abs() < 4 * se).all()), (got, p.mean(0), se)
    # mean mode uses the guide's median, as forward() does
    med = net.weight_guide.median()["head.weight"]
    with torch.no_grad():
        torch.testing.assert_close(
            predict(net, x, num_samples=2, mode="mean").probs[0],
            torch.softmax(x @ med.T + net.head.bias, -1),
        )


def test_network_draws_log_likelihood_is_categorical():
    net = LogReg(3, 2)
    x, y = _blobs(8)
    d = D.network_draws(net, x, y, num_samples=3, seed=0)
    with torch.no_grad():
        expected = torch.log_softmax(net.head(x), -1)[torch.arange(8), y]  # (B,)
    torch.testing.assert_close(d.log_likelihood, expected.expand(3, 8))


def test_lightning_trains_a_user_network_that_declares_num_classes():
    """The Lightning module needs only the contract plus ``num_classes`` (its metrics' size)."""
    L = pytest.importorskip("lightning")
    from torch.utils.data import DataLoader, TensorDataset

    from bayesattn.training.lightning import BayesianLightningModule

    x, y = _blobs(64)
    net = LogReg(3, 2)
    with pytest.raises(TypeError, match="num_classes"):
        BayesianLightningModule(net)
    net.num_classes = 2
    with torch.no_grad():
        net.head.weight.zero_(), net.head.bias.zero_()  # start at chance: every logit equal
        assert (net(x).argmax(-1) == y).float().mean().item() < 0.6
    module = BayesianLightningModule(net, lr=0.05, warmup_steps=1)
    trainer = L.Trainer(
        max_epochs=3, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(module, DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True))
    with torch.no_grad():
        acc = (net(x).argmax(-1) == y).float().mean().item()
    assert acc > 0.9  # the blobs are separable: the user network learned through Lightning
