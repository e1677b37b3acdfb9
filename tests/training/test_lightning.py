"""Tests for bayesattn.training.lightning: the LightningModule, ELBO scaling across processes, and a real
2-process DDP run on CPU (gloo) against a 1-process run with the same global batch."""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("lightning")
pytest.importorskip("torchmetrics")

import lightning as L  # noqa: E402
from torch.utils.data import DataLoader, IterableDataset, TensorDataset  # noqa: E402

from bayesattn import (  # noqa: E402
    AttentionConfig,
    CausalLM,
    Seq2Seq,
    TransformerClassifier,
    bayesian_projections,
)
from bayesattn.calibration import expected_calibration_error  # noqa: E402
from bayesattn.data import make_reverse_task  # noqa: E402
from bayesattn.training.lightning import BayesianLightningModule, predictive_probs  # noqa: E402
from bayesattn.training.schedules import lr_factor  # noqa: E402
from tests.tasks import contains3  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
HELPER = ROOT / "tests" / "training" / "ddp_run.py"
# float64 runs: one process and two agree to round-off (measured ~1e-12); a wrong data-plate
# scale moves parameters by > 1e-3 (test_rank_losses_average_to_the_global_batch_loss)
TOL = 1e-9


def _trainer(**kw) -> L.Trainer:
    kw.setdefault("accelerator", "cpu")
    kw.setdefault("devices", 1)
    return L.Trainer(
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **kw,
    )


def weight_net(seed=0):
    torch.manual_seed(seed)
    net = TransformerClassifier(
        2,
        vocab_size=10,
        d_model=8,
        nhead=2,
        num_layers=1,
        dim_feedforward=16,
        dropout=0.0,
        max_len=8,
        attention=AttentionConfig(family=None),
    )
    bayesian_projections(net, targets=("*self_attn.in_proj_weight", "*linear1.weight"))
    return net


def _load_helper():
    spec = importlib.util.spec_from_file_location("ddp_run", HELPER)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


# ---------------------------------------------------------------------------------------------
# ELBO scaling across ranks (in one process: the algebra DDP relies on)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["hybrid", "svi"])
def test_rank_losses_average_to_the_global_batch_loss(method):
    """R ranks with batches of b, each scaling its plate to the full N, average (as DDP does) to
    the gradient of one process on the global batch; scaling to the rank's shard N/R does not."""
    x, y = contains3(32, 0, T=6)
    module = BayesianLightningModule(weight_net(), method=method).double()
    N = 32

    def grads(xb, yb, n):
        module.zero_grad()
        torch.manual_seed(5)  # the same global (weight) draw on every rank, as in training
        loss, _ = module.elbo_per_example(xb, yb, n)
        loss.backward()
        return {k: p.grad.clone() for k, p in module.named_parameters() if p.grad is not None}

    full = grads(x[:8], y[:8], N)
    ranks = [grads(x[r:8:2], y[r:8:2], N) for r in range(2)]
    avg = {k: (ranks[0][k] + ranks[1][k]) / 2 for k in full}
    assert _max_diff(full, avg) < 1e-12
    shard = [grads(x[r:8:2], y[r:8:2], N // 2) for r in range(2)]
    wrong = {k: (shard[0][k] + shard[1][k]) / 2 for k in full}
    assert _max_diff(full, wrong) > 1e-4  # the weight KL counted twice: the check can fail


# ---------------------------------------------------------------------------------------------
# real DDP: 2 processes (gloo) vs 1 process, and resume from the DDP checkpoint
# ---------------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_two_processes(tmp_path, out, *args: str) -> list[dict]:
    """``tests/training/ddp_run.py --devices 2 --out out *args`` in a fresh 2-process run (gloo, one
    thread each); returns each rank's info record."""
    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(_free_port()),
        PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    )
    for k in ("LOCAL_RANK", "RANK", "WORLD_SIZE", "NODE_RANK", "SLURM_NTASKS", "SLURM_JOB_ID"):
        env.pop(k, None)
    proc = subprocess.run(
        [sys.executable, str(HELPER), "--devices", "2", "--out", str(out), *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, f"DDP run failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.slow
def test_ddp_two_processes_equal_one_process_and_resume(tmp_path):
    out = tmp_path / "ddp"
    infos = _run_two_processes(tmp_path, out)
    assert len({i["pid"] for i in infos}) == 2  # two processes
    for r, info in enumerate(infos):
        assert info["rank"] == r and info["world_size"] == 2
        assert info["num_data"] == 32  # the full dataset on every rank, not its 16-example shard
        assert info["batch_size"] == 4 and info["global_step"] == 8
    ddp = torch.load(out / "params.pt", weights_only=True)

    helper = _load_helper()
    one = helper.run(1, tmp_path / "one")  # batch 8 = 2 ranks × 4, the same order
    assert _max_diff(ddp, one) < TOL
    moved = _max_diff(one, helper.run(1, tmp_path / "zero", epochs=0))
    assert moved > 1e-2  # training moved the parameters far more than the tolerance

    # the DDP checkpoint after epoch 1 resumes (here in one process) to the same end point
    resumed = helper.run(1, tmp_path / "resumed", resume=out / "epoch0.ckpt")
    assert _max_diff(ddp, resumed) < TOL


@pytest.mark.slow
def test_ddp_spawn_pickles_the_module_into_two_processes(tmp_path):
    """``strategy="ddp_spawn"`` pickles the module (network, Pyro sites, load-state hooks, the
    KL-annealed pair) into 2 fresh processes; they train as 2-process DDP does, and rank 0's
    weights come back equal to a 1-process run with the same global batch."""
    out = tmp_path / "spawn"
    infos = _run_two_processes(tmp_path, out, "--epochs", "1", "--strategy", "ddp_spawn")
    assert len({i["pid"] for i in infos}) == 2  # two spawned workers
    assert all(i["world_size"] == 2 and i["global_step"] == 4 for i in infos)
    spawned = torch.load(out / "params.pt", weights_only=True)  # main process, after fit
    one = _load_helper().run(1, tmp_path / "one", epochs=1)
    assert _max_diff(spawned, one) < TOL


# ---------------------------------------------------------------------------------------------
# the module under Lightning's Trainer (one process)
# ---------------------------------------------------------------------------------------------


def _spy_lrs(module):
    seen = []

    class Spy(L.Callback):
        def on_before_optimizer_step(self, trainer, pl_module, optimizer):
            seen.append(optimizer.param_groups[0]["lr"])

    return seen, Spy()


@pytest.mark.parametrize("method", ["hybrid", "svi"])
def test_classifier_trains_and_validates_with_torchmetrics(method):
    x, y = contains3(48, 0, T=6)
    xv, yv = contains3(32, 1, T=6)
    torch.manual_seed(0)
    net = TransformerClassifier(
        2,
        vocab_size=10,
        d_model=16,
        nhead=2,
        num_layers=1,
        dim_feedforward=32,
        attention=AttentionConfig(family="dirichlet"),
    )
    module = BayesianLightningModule(
        net,
        method=method,
        lr=0.01,
        warmup_steps=2,
        lr_decay="cosine",
        min_lr_ratio=0.1,
        kl_anneal_steps=3,
        num_samples=4,
    )
    seen, spy = _spy_lrs(module)
    tr = _trainer(max_epochs=2, callbacks=[spy], num_sanity_val_steps=0)
    tr.fit(
        module,
        DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True),
        DataLoader(TensorDataset(xv, yv), batch_size=32),
    )
    m = {k: float(v) for k, v in tr.callback_metrics.items()}
    for key in ("train/loss", "train/acc", "val/acc", "val/nll", "val/ece"):
        assert key in m and torch.isfinite(torch.tensor(m[key])), key
    assert 0 <= m["val/ece"] <= 1 and m["val/nll"] > 0
    assert m["train/beta"] == pytest.approx(1.0)  # annealed over 3 of 6 steps
    # the torch schedule: lr·lr_factor at every one of the 6 steps
    expected = [
        0.01 * lr_factor(s, warmup_steps=2, decay_steps=6, min_lr_ratio=0.1) for s in range(6)
    ]
    assert seen == pytest.approx(expected, rel=1e-12)
    # validation metrics: the posterior predictive, checked against our own calibration code
    torch.manual_seed(0)
    probs, t = predictive_probs(net, xv, yv, num_samples=4)
    assert probs.shape == (32, 2) and torch.equal(t, yv)
    ece = expected_calibration_error(probs, yv, n_bins=15)
    from torchmetrics.functional.classification import multiclass_calibration_error

    tm = float(multiclass_calibration_error(probs, yv, num_classes=2, n_bins=15, norm="l1"))
    assert tm == pytest.approx(ece, abs=1e-6)


def test_sequence_models_train_under_lightning():
    task = make_reverse_task(32, length=5, vocab_size=8, seed=0)
    torch.manual_seed(0)
    s2s = Seq2Seq(
        task.src_vocab_size,
        task.tgt_vocab_size,
        d_model=16,
        nhead=2,
        num_encoder_layers=1,
        num_decoder_layers=1,
        dim_feedforward=32,
        max_len=16,
        attention=AttentionConfig(family="dirichlet", which=("cross",)),
    )
    lm = CausalLM(
        8,
        d_model=16,
        nhead=2,
        num_layers=1,
        dim_feedforward=32,
        max_len=16,
        attention=AttentionConfig(family="logistic_normal"),
    )
    data = {
        "s2s": TensorDataset(task.src, task.tgt),
        "lm": TensorDataset(task.tgt[:, :7].clamp_max(7)),
    }
    for name, net in (("s2s", s2s), ("lm", lm)):
        module = BayesianLightningModule(net, lr=3e-3, kl_weight=0.01, num_samples=3)
        tr = _trainer(max_steps=2, num_sanity_val_steps=0, limit_val_batches=1)
        tr.fit(module, DataLoader(data[name], batch_size=16), DataLoader(data[name], batch_size=16))
        m = {k: float(v) for k, v in tr.callback_metrics.items()}
        assert {"val/acc", "val/nll", "val/ece"} <= set(m), name
        assert module.num_data == 32
    probs, targets = predictive_probs(s2s, task.src[:4], task.tgt[:4], num_samples=3)
    mask = task.tgt[:4, 1:] != s2s.pad_id
    assert probs.shape == (int(mask.sum()), task.tgt_vocab_size) and targets.shape == (
        int(mask.sum()),
    )
    torch.testing.assert_close(probs.sum(-1), torch.ones(len(probs)))


@pytest.mark.parametrize("kind", ["classifier", "lm"])
@pytest.mark.parametrize("val_loss", ["nll", "elbo"])
def test_both_loops_validate_the_same_way(kind, val_loss):
    """The Lightning module logs what Trainer.evaluate reports (one validation function): with
    nothing random in the network the two agree to float round-off."""
    from bayesattn.training import Trainer

    torch.manual_seed(0)
    if kind == "classifier":
        net = TransformerClassifier(2, vocab_size=10, d_model=8, nhead=2, num_layers=1,
                                    dim_feedforward=16, attention=AttentionConfig(family=None))
        data = TensorDataset(*contains3(20, 1, T=6))
    else:
        net = CausalLM(8, d_model=8, nhead=2, num_layers=1, dim_feedforward=16, max_len=8,
                       attention=AttentionConfig(family=None))
        data = TensorDataset(torch.randint(1, 8, (20, 6)))
    assert not net.bayesian_layers and net.weight_guide is None
    expected = Trainer(net, val_loss=val_loss, eval_batch_size=8).evaluate(data)
    module = BayesianLightningModule(net, val_loss=val_loss, num_samples=3, num_data=20)
    m = _trainer().validate(module, DataLoader(data, batch_size=8), verbose=False)[0]
    for key, name in (("loss", "val/loss"), ("accuracy", "val/acc"), ("nll", "val/nll"),
                      ("ece", "val/ece")):
        assert m[name] == pytest.approx(expected[key], rel=1e-5, abs=1e-6), key


class _Stream(IterableDataset):
    def __iter__(self):
        x, y = contains3(16, 2, T=6)
        yield from zip(x, y, strict=True)


def test_module_errors_name_the_problem():
    with pytest.raises(TypeError, match="BayesianNetwork"):
        BayesianLightningModule(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="num_samples"):
        BayesianLightningModule(weight_net(), num_samples=0)
    with pytest.raises(ValueError, match="lr_decay"):
        BayesianLightningModule(weight_net(), lr_decay="exp")
    module = BayesianLightningModule(weight_net(), lr_decay="none")
    with pytest.raises(ValueError, match="num_data=N"):
        _trainer(max_steps=1).fit(module, DataLoader(_Stream(), batch_size=8))
    module = BayesianLightningModule(weight_net(), lr_decay="none", num_data=16)
    _trainer(max_steps=1).fit(module, DataLoader(_Stream(), batch_size=8))  # a stream trains


def test_a_checkpoint_without_network_class_is_a_clear_error():
    """issue 33: a checkpoint whose 'bayesattn' entry lacks a field (KeyError before)."""
    module = BayesianLightningModule(weight_net(), lr_decay="none", num_data=16)
    ckpt: dict = {}
    module.on_save_checkpoint(ckpt)
    for field in ("network_class", "config", "num_data"):
        damaged = {"bayesattn": {k: v for k, v in ckpt["bayesattn"].items() if k != field}}
        with pytest.raises(ValueError, match=f"lacks \\['{field}'\\]"):
            module.on_load_checkpoint(damaged)
    module.on_load_checkpoint(ckpt)  # the whole entry loads
