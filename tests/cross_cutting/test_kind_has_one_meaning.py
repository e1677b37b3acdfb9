""""kind" has the glossary's one meaning, how a predictive's samples were drawn
(``PredictionResult.kind``). Its other meanings were renamed in 0.6; the old attribute names
warn (``DeprecationWarning``) and give the new value for one release."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import bayesattn
from bayesattn.nn.fold import fold_plan
from bayesattn.nn.networks import TransformerClassifier
from bayesattn.posthoc.rank1_hooks import rank1_sites
from bayesattn.predictive import Predictive
from bayesattn.training import as_train_data


def _converted() -> nn.Module:
    layer = nn.TransformerEncoderLayer(8, 2, 16, 0.0, batch_first=True)
    enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
    return bayesattn.convert(nn.Sequential(enc), family="dirichlet")


def test_the_renamed_attributes_warn_and_give_the_new_value():
    net = TransformerClassifier(3, vocab_size=7, d_model=8, nhead=2, num_layers=1)
    cases = [
        (Predictive(net), "model_type", "network"),
        (Predictive(_converted()), "model_type", "foreign"),
        (as_train_data((torch.zeros(4, 2), torch.zeros(4, dtype=torch.long)), "x", 2),
         "source_type", "tensors"),
        (fold_plan(_converted()), "library", "torch"),
    ]  # fmt: skip
    for obj, new, value in cases:
        assert getattr(obj, new) == value
        with pytest.warns(DeprecationWarning, match=r"\.kind is deprecated: use "):
            assert obj.kind == value


def test_rank1_sites_say_which_module_is_hooked():
    site = rank1_sites(_converted())[0]
    assert site.hooked == "mha"
    with pytest.warns(DeprecationWarning, match="Rank1Site.kind is deprecated"):
        assert site.kind == "mha"


def test_prediction_results_keep_their_kind():
    net = TransformerClassifier(3, vocab_size=7, d_model=8, nhead=2, num_layers=1).eval()
    r = Predictive(net, 2, dropout=True)(torch.randint(0, 7, (4, 5)))
    assert r.kind == "mc_dropout"
