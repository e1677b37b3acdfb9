"""Whole models pickle: ``torch.save(model)``, ``pickle``, and so ``torch.multiprocessing``
spawn and Lightning's ``ddp_spawn`` (that one is tested with 2 processes in
``tests/training/test_lightning.py``). The unpickled copy computes what the original does and
still reads state_dicts saved under the pre-0.3 key names."""

from __future__ import annotations

import io
import pickle

import pytest
import torch

import bayesattn as ba
from bayesattn.interop import convert
from bayesattn.nn import attention_mode


def _roundtrip(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)


def test_bayesian_network_pickles_and_reads_old_checkpoints():
    torch.manual_seed(0)
    net = ba.TransformerClassifier(
        3, vocab_size=7, d_model=8, nhead=2, num_layers=1, dim_feedforward=16, attention="dirichlet"
    ).eval()
    x = torch.randint(1, 7, (2, 5))
    copy = _roundtrip(net)
    with attention_mode("mean"):
        assert torch.equal(copy(x), net(x))
    # the load-state hook survived: the family saved as ``posterior.*`` still loads
    sd = {k.replace(".family.", ".posterior."): v for k, v in net.state_dict().items()}
    assert any(".posterior." in k for k in sd)
    copy.load_state_dict(sd)
    assert pickle.loads(pickle.dumps(net)) is not None


def test_converted_torch_model_pickles():
    torch.manual_seed(0)
    enc = torch.nn.TransformerEncoder(
        torch.nn.TransformerEncoderLayer(8, 2, 16, batch_first=True, dropout=0.0), 2,
        enable_nested_tensor=False,
    ).eval()
    model = convert(enc, family="logistic_normal")
    x = torch.randn(2, 4, 8)
    copy = _roundtrip(model)
    with attention_mode("mean"), torch.no_grad():
        assert torch.equal(copy(x), model(x))


def test_converted_hf_model_pickles():
    transformers = pytest.importorskip("transformers")
    from bayesattn.interop.hf import convert_hf

    cfg = transformers.BertConfig(
        hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        vocab_size=20, attn_implementation="eager",
    )
    torch.manual_seed(0)
    model = convert_hf(transformers.BertModel(cfg).eval())
    ids = torch.randint(0, 20, (2, 5))
    copy = _roundtrip(model)
    with attention_mode("mean"), torch.no_grad():
        a = copy(input_ids=ids).last_hidden_state
        b = model(input_ids=ids).last_hidden_state
    assert torch.equal(a, b)
    old = {k.replace("bayesattn_family.", "bayesattn_posterior."): v
           for k, v in model.state_dict().items()}
    copy.load_state_dict(old)


def test_lightning_module_pickles():
    pytest.importorskip("lightning")
    pytest.importorskip("torchmetrics")
    from bayesattn.training.lightning import BayesianLightningModule

    net = ba.TransformerClassifier(2, vocab_size=6, d_model=8, nhead=2, num_layers=1,
                                   attention="dirichlet")
    module = pickle.loads(pickle.dumps(BayesianLightningModule(net, kl_anneal_steps=4)))
    module.objective.beta = 0.25  # the unpickled annealed pair reads the unpickled objective's β
    assert module.objective.pair.anneal.beta() == 0.25


def test_trainer_pickles():
    from bayesattn.training.trainer import Trainer

    net = ba.TransformerClassifier(2, vocab_size=6, d_model=8, nhead=2, num_layers=1,
                                   attention="dirichlet")
    trainer = pickle.loads(pickle.dumps(Trainer(net)))
    trainer.objective.beta = 0.5
    assert trainer.objective.pair.anneal.beta() == 0.5
