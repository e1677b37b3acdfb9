"""The folded predictive of converted models: samples start at the first Bayesian layer.

The independent slow path is batched repetition of the whole model (``fold=False``): every
example ``S`` times through every layer. With the same seed both draw the same weights in the
same order, so their samples are equal; the layers before the fold run once on ``B`` rows.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import bayesattn
from bayesattn import AttentionConfig
from bayesattn.nn.fold import fold_plan
from bayesattn.predictive.foreign import sample_foreign
from bayesattn.uncertainty import predict

E, H, K, S = 16, 4, 3, 6


class Classifier(nn.Module):
    def __init__(self, batch_first: bool = True, nested: bool = False, layers: int = 3) -> None:
        super().__init__()
        self.batch_first = batch_first
        layer = nn.TransformerEncoderLayer(E, H, 32, 0.1, batch_first=batch_first)
        self.enc = nn.TransformerEncoder(layer, layers, enable_nested_tensor=nested)
        self.head = nn.Linear(E, K)

    def forward(self, x: torch.Tensor, pad: torch.Tensor | None = None) -> torch.Tensor:
        h = self.enc(x if self.batch_first else x.transpose(0, 1), src_key_padding_mask=pad)
        return self.head((h if self.batch_first else h.transpose(0, 1)).mean(-2))


def _samples(model, x, fold, forward=None, seed=1):
    torch.manual_seed(seed)
    return sample_foreign(model, x, S, None, "guide", forward, 1.0, False, fold=fold).probs


def _rows_seen(module: nn.Module) -> list[int]:
    """Rows (dim 0 of the first input) of every call of ``module``."""
    rows: list[int] = []
    module.register_forward_pre_hook(lambda m, a, k: rows.append(_dim0(a, k)), with_kwargs=True)
    return rows


def _dim0(args, kwargs) -> int:
    v = args[0] if args else next(iter(kwargs.values()))
    return _dim0(v, {}) if isinstance(v, tuple) else int(v.shape[0])


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize(
    "recipe",
    [{"config": AttentionConfig.last_layer()}, {"family": "dirichlet"},
     {"family": "logistic_normal", "layers": [1]}],
)  # fmt: skip
def test_torch_folded_samples_equal_full_repetition_and_the_prefix_runs_once(batch_first, recipe):
    torch.manual_seed(0)
    model = bayesattn.convert(Classifier(batch_first), **recipe)
    x = torch.randn(5, 7, E)
    k = list(model.enc.layers).index(fold_plan(model).layers[0])  # the fold layer
    rows: list[list[int]] = [[] for _ in model.enc.layers]
    for i, m in enumerate(model.enc.layers):  # (sample ×) batch rows of each layer's output
        m.register_forward_hook(lambda m, a, o, r=rows[i]: r.append(o.numel() // (7 * E)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the fold applies: no fallback warning
        folded = _samples(model, x, True)
    assert rows == [[5]] * k + [[S * 5]] * (3 - k)  # the prefix once on B rows
    full = _samples(model, x, False)
    torch.testing.assert_close(folded, full, rtol=0, atol=1e-6)
    assert folded.shape == (S, 5, K) and folded.std(0).max() > 1e-4  # the draws differ


def test_the_fold_layer_sees_b_rows_later_layers_s_times_b_rows_and_masks_follow():
    torch.manual_seed(0)
    model = bayesattn.convert(Classifier(layers=4), family="dirichlet", layers=[1])
    x = {"x": torch.randn(5, 7, E), "pad": torch.zeros(5, 7, dtype=torch.bool)}
    x["pad"][2:, 4:] = True  # padded keys: the later layers need the mask repeated S times
    rows = [_rows_seen(m) for m in model.enc.layers]
    head = _rows_seen(model.head)
    folded = _samples(model, x, True)
    assert rows == [[5], [5], [S * 5], [S * 5]] and head == [S * 5]
    torch.testing.assert_close(folded, _samples(model, x, False), rtol=0, atol=1e-6)


def test_models_the_fold_cannot_follow_fall_back_to_full_repetition_with_a_warning():
    torch.manual_seed(0)
    nested = bayesattn.convert(Classifier(nested=True), config=AttentionConfig.last_layer())
    x = {"x": torch.randn(5, 7, E), "pad": torch.zeros(5, 7, dtype=torch.bool)}
    x["pad"][2:, 4:] = True  # a nested tensor reaches the fold layer

    class Reordered(nn.Module):  # registered b, a; runs a, b: a Bayesian layer before the fold
        def __init__(self) -> None:
            super().__init__()
            self.b, self.a = Classifier(), Classifier()

        def forward(self, x):
            return self.b(self.a.enc(x))

    reordered = bayesattn.convert(Reordered(), family="dirichlet")
    for model, xs in ((nested, x), (reordered, torch.randn(5, 7, E))):
        with pytest.warns(UserWarning, match="batched repetition of the whole model"):
            got = _samples(model, xs, True)
        torch.testing.assert_close(got, _samples(model, xs, False), rtol=0, atol=0)  # same state


def test_mean_mode_and_predict_are_unchanged():
    torch.manual_seed(0)
    model = bayesattn.convert(Classifier().eval(), config=AttentionConfig.last_layer())
    x = torch.randn(5, 7, E)
    with torch.no_grad():
        want = torch.softmax(model(x), -1)
    mean = predict(model, x, 4, mode="mean").probs
    assert torch.equal(mean, want.expand(4, 5, K))
    torch.manual_seed(3)
    a = predict(model, x, S).probs  # the default path folds
    torch.manual_seed(3)
    b = sample_foreign(model, x, S, None, "guide", None, 1.0, False, fold=False).probs
    torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def _bert(layers: int = 3):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(
        hidden_size=E, num_hidden_layers=layers, num_attention_heads=H, intermediate_size=32,
        vocab_size=20, max_position_embeddings=16, num_labels=K, attn_implementation="eager",
        initializer_range=0.5,
    )  # fmt: skip
    return transformers.BertForSequenceClassification(cfg).eval()


def _ids(n=5):
    ids = torch.randint(1, 20, (n, 8))
    mask = torch.ones_like(ids)
    mask[2:, 6:] = 0
    return {"input_ids": ids, "attention_mask": mask}


@pytest.mark.parametrize(
    "recipe", [{"config": AttentionConfig.last_layer()}, {"family": "dirichlet", "layers": [1]}]
)
def test_hf_folded_samples_equal_full_repetition_and_the_prefix_runs_once(recipe):
    from bayesattn.interop.hf import convert_hf

    torch.manual_seed(0)
    model = convert_hf(_bert(), **recipe)
    x = _ids()
    rows: list[list[int]] = [[] for _ in range(3)]
    for i, m in enumerate(model.bert.encoder.layer):  # rows of each layer's output
        m.register_forward_hook(lambda m, a, out, r=rows[i]: r.append(_dim0([out], {})))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        folded = _samples(model, x, True)
    k = 2 if "config" in recipe else 1  # the fold layer: its output has S·B rows
    assert rows == [[5]] * k + [[S * 5]] * (3 - k)
    torch.testing.assert_close(folded, _samples(model, x, False), rtol=0, atol=1e-6)
    assert folded.shape == (S, 5, K) and folded.std(0).max() > 1e-4


def test_hf_models_that_pick_rows_by_the_input_batch_fall_back():
    transformers = pytest.importorskip("transformers")
    from bayesattn.interop.hf import convert_hf

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        n_embd=E, n_layer=2, n_head=H, vocab_size=20, n_positions=16, num_labels=K,
        attn_implementation="eager", pad_token_id=0, bos_token_id=1, eos_token_id=1,
    )  # fmt: skip
    model = convert_hf(transformers.GPT2ForSequenceClassification(cfg).eval(), family="dirichlet")
    x = _ids()  # GPT-2's head indexes the last token of each of the B input rows
    with pytest.warns(UserWarning, match=r"got shape \(5, 3\) for 30 input rows"):
        got = _samples(model, x, True)
    torch.testing.assert_close(got, _samples(model, x, False), rtol=0, atol=0)
