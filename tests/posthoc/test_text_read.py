"""The recommended read of a token classifier (bayesattn.posthoc.TextDensityRead): its score is
the standardised sum of the density read and the bag of words' entropy recomputed separately
(DensityRead, scikit-learn's pipeline, combine_scores), its predictive the density read's, its
state saved and loaded with weights_only, and it finds texts of unseen topics."""

from __future__ import annotations

import io

import pytest
import torch
from torch import nn

from bayesattn.calibration import ood_auroc, predictive_entropy
from bayesattn.calibration.bag_of_words import fit_bag_of_words
from bayesattn.calibration.token_scores import combine_scores
from bayesattn.nn.networks import TransformerClassifier
from bayesattn.posthoc import DensityRead, TextDensityRead

pytest.importorskip("sklearn")

V, T, C = 40, 8, 3


def _texts(n: int, seed: int, topics: range = range(C)) -> tuple[torch.Tensor, torch.Tensor]:
    """Topic ``c`` draws half its words from its own ids ``2 + 8c .. 9 + 8c`` and half from
    shared filler ``34 .. 39``; the last two positions are padding."""
    g = torch.Generator().manual_seed(seed)
    y = torch.tensor([topics[i % len(topics)] for i in range(n)])
    own = 2 + 8 * y[:, None] + torch.randint(0, 8, (n, T), generator=g)
    filler = torch.randint(34, 40, (n, T), generator=g)
    x = torch.where(torch.arange(T) % 2 == 0, own, filler)
    x[:, T - 2 :] = 0
    return x, y


@pytest.fixture(scope="module")
def trained():
    torch.manual_seed(0)
    net = TransformerClassifier(C, vocab_size=V, max_len=T, pooling="cls", d_model=16, nhead=2,
                                num_layers=1, dim_feedforward=32, dropout=0.0)  # fmt: skip
    (x, y), val, test = _texts(240, 0), _texts(90, 1), _texts(90, 2)
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    for step in range(60):
        i = torch.arange(step * 32, step * 32 + 32) % len(x)
        opt.zero_grad()
        nn.functional.cross_entropy(net.forward_logits(x[i]), y[i]).backward()
        opt.step()
    net.eval()
    read = TextDensityRead(net).fit(x, y, val=val)
    return net, (x, y), val, test, read


def test_the_score_is_the_standardised_sum_of_the_two_reads(trained):
    net, (x, y), (xv, yv), (xs, _), read = trained
    density = DensityRead(net, views=("cls",)).fit(x, y, val=(xv, yv))
    bow = fit_bag_of_words((x, y), (xv, yv), V)  # scikit-learn's probabilities
    parts = lambda q: [density.score(q), predictive_entropy(bow.probs(q))]  # noqa: E731
    expected = combine_scores(parts(xs), parts(xv))
    torch.testing.assert_close(read.score(xs), expected, rtol=0, atol=1e-9)
    torch.testing.assert_close(read.parts(xs), torch.stack(parts(xs), -1).double(),
                               rtol=0, atol=1e-9)  # fmt: skip
    assert read.C == bow.C and read.num_classes == C
    # the predictive is the density read's; one pass gives both
    assert torch.equal(read.predict(xs).probs, density.predict(xs).probs)
    pred, score = read.predict_and_score(xs)
    assert torch.equal(pred.probs, density.predict(xs).probs)
    torch.testing.assert_close(score, expected, rtol=0, atol=1e-9)
    assert read.kl() == density.kl() > 0
    # standardised on validation: the parts of the validation texts have mean 0, sd 1 each
    z = (read.parts(xv) - read.parts(xv).mean(0)) / read.parts(xv).std(0)
    torch.testing.assert_close(read.score(xv), z.sum(-1), rtol=0, atol=1e-9)


def test_it_finds_texts_of_a_topic_it_never_saw(trained):
    net, _, _, (xs, ys), read = trained
    x_new, _ = _texts(60, 3, topics=range(3, 4))  # topic 3: ids 26..33, never in training
    assert (read.predict(xs).probs[0].argmax(-1) == ys).float().mean() > 0.9
    assert ood_auroc(read.score(xs), read.score(x_new)) > 0.95


def test_the_saved_state_loads_with_weights_only(trained, tmp_path):
    net, _, _, (xs, _), read = trained
    path = tmp_path / "read.pt"
    torch.save(read.state_dict(), path)
    state = torch.load(path, weights_only=True)
    fresh = TextDensityRead(net).load_state_dict(state)
    assert torch.equal(fresh.score(xs), read.score(xs))
    assert torch.equal(fresh.predict(xs).probs, read.predict(xs).probs)
    assert fresh.C == read.C and fresh.kl() == read.kl()
    with pytest.raises(ValueError, match=r"vocab_size=40.*vocab_size=50"):
        TextDensityRead(net, vocab_size=50).load_state_dict(state)
    with pytest.raises(ValueError, match="DensityRead.state_dict"):
        DensityRead(net).load_state_dict(state)
    buf = io.BytesIO()
    with pytest.raises(RuntimeError, match="not fitted"):
        torch.save(TextDensityRead(net).state_dict(), buf)


class _Foreign(nn.Module):
    """A torch token classifier with no ``vocab_size`` attribute."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(V, 8)
        self.head = nn.Linear(8, C)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(x).mean(1))


def test_bad_input_is_refused(trained):
    net, (x, y), (xv, yv), _, read = trained
    with pytest.raises(TypeError, match="model must be an nn.Module"):
        TextDensityRead(None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"vocab_size: _Foreign has no vocab_size \(nor config.vocab_size"):
        TextDensityRead(_Foreign())
    torch.manual_seed(0)
    foreign = TextDensityRead(_Foreign().eval(), vocab_size=V, head="head").fit(x, y, val=(xv, yv))
    assert foreign.score(xv).shape == (len(xv),)  # a model we did not write, given vocab_size
    with pytest.raises(ValueError, match="pad_id"):
        TextDensityRead(net, pad_id=V)
    with pytest.raises(ValueError, match="Cs"):
        TextDensityRead(net, Cs=(0.0,))
    with pytest.raises(ValueError, match="views"):
        TextDensityRead(net, views=("words",))
    with pytest.raises(ValueError, match="val=None"):
        TextDensityRead(net).fit(x, y)
    with pytest.raises(RuntimeError, match="not fitted"):
        TextDensityRead(net).score(x)
    with pytest.raises(TypeError, match="integer token ids"):
        read.score(x.float())
    with pytest.raises(ValueError, match=r"x ids must be in \[0, 40\); got min 40, max 40"):
        read.score(torch.full((2, T), V))
    with pytest.raises(ValueError, match=r"must be 2-D \(B, T\); got shape \(8,\)"):
        read.parts(x[0])
    with pytest.raises(ValueError, match="val x ids"):
        TextDensityRead(net).fit(x, y, val=(xv + V, yv))


def test_a_hugging_face_classifier_gives_its_vocabulary_and_padding():
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=V, hidden_size=16, num_hidden_layers=1,
                                  num_attention_heads=2, intermediate_size=32, num_labels=C,
                                  pad_token_id=3)  # fmt: skip
    bert = transformers.BertForSequenceClassification(cfg).eval()
    read = TextDensityRead(bert)
    assert (read.vocab_size, read.pad_id) == (V, 3)
    (x, y), (xv, yv), (xs, _) = _texts(120, 0), _texts(60, 1), _texts(30, 2)
    read.fit(x, y, val=(xv, yv))
    density = DensityRead(bert, views=("cls",)).fit(x, y, val=(xv, yv))
    torch.testing.assert_close(read.parts(xs)[:, 0], density.score(xs).double())
    assert read.bag_of_words.pad_id == 3
    # a tokenizer's dict: the model reads the dict (its attention_mask leaves padding out of the
    # token view), the bag of words its input_ids; padding (id 3) counts in neither
    def as_dict(t: torch.Tensor) -> dict[str, torch.Tensor]:  # padding 0 → the tokenizer's 3
        return {"input_ids": torch.where(t == 0, 3, t), "attention_mask": (t != 0).long()}

    batch, mask = as_dict(xs), (xs != 0).long()
    by_dict = TextDensityRead(bert).fit(as_dict(x), y, val=(as_dict(xv), yv))
    ref = DensityRead(bert, views=("cls",)).fit(as_dict(x), y, val=(as_dict(xv), yv))
    torch.testing.assert_close(by_dict.parts(batch)[:, 0], ref.score(batch).double())
    bow = fit_bag_of_words((as_dict(x)["input_ids"], y), (as_dict(xv)["input_ids"], yv), V,
                           pad_id=3)  # fmt: skip
    torch.testing.assert_close(by_dict.parts(batch)[:, 1],
                               predictive_entropy(bow.probs(batch["input_ids"])))  # fmt: skip
    assert torch.equal(by_dict.predict_and_score(batch)[1], by_dict.score(batch))
    with pytest.raises(ValueError, match=r"must hold 'input_ids'.*\['attention_mask'\]"):
        by_dict.score({"attention_mask": mask})


def test_a_dataloader_fits_the_same_read(trained):
    net, (x, y), (xv, yv), (xs, _), read = trained
    loader = lambda a, b: torch.utils.data.DataLoader(  # noqa: E731
        torch.utils.data.TensorDataset(a, b), batch_size=32)
    again = TextDensityRead(net).fit(loader(x, y), val=loader(xv, yv))
    torch.testing.assert_close(again.score(xs), read.score(xs), rtol=0, atol=1e-9)
