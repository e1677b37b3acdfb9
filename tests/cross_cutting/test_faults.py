"""Kill -9 at random moments: training with checkpoints and the study leave either a complete,
loadable result or a clearly incomplete one on disk, never something that looks finished.

The work runs in a forked child process (it inherits the imports, so a kill costs no start-up)
that is sent SIGKILL after a random delay; the parent then inspects what is on disk. The delays
come from a seeded generator; where they land (mid-step, mid-write, mid-figure) varies with the
machine's speed, which is the point.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import random
import time

import pyro
import pytest
import torch

import bayesattn as ba
from bayesattn import training as I
from bayesattn._study_io import INCOMPLETE, REPORT, RESULTS, study_status
from bayesattn.nn import AttentionConfig

pytestmark = [  # whole programs killed mid-run (``make test-fast`` skips them)
    pytest.mark.slow,
    pytest.mark.skipif("fork" not in mp.get_all_start_methods(), reason="needs os.fork (POSIX)"),
]
_CTX = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else None


def _kill_after(target, args, delay: float, wait_for=None) -> None:
    """Start ``target(*args)`` in a forked child; SIGKILL it ``delay`` seconds after the start,
    or after the file ``wait_for`` appears (so the kill lands in steady-state work)."""
    p = _CTX.Process(target=target, args=args, daemon=True)
    p.start()
    deadline = time.monotonic() + 60
    while wait_for is not None and not wait_for.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(delay)
    p.kill()  # SIGKILL
    p.join(10)
    assert p.exitcode is not None, "the child did not die"


def _net():
    torch.manual_seed(0)
    return ba.TransformerClassifier(2, vocab_size=6, d_model=8, nhead=2, num_layers=1,
                                    dim_feedforward=8, attention=AttentionConfig("dirichlet"))


def _data():
    g = torch.Generator().manual_seed(1)
    x = torch.randint(1, 6, (8, 4), generator=g)
    return x, (x == 3).any(1).long()


def _train_forever(path: str) -> None:
    # one batch per epoch: a checkpoint is written after every step
    pyro.clear_param_store()
    I.fit(_net(), _data(), epochs=10**6, batch_size=8, checkpoint_path=path, resume="auto",
          progress=False)
    os._exit(0)


def test_killed_training_leaves_a_loadable_checkpoint_or_none(tmp_path):
    rng = random.Random(0)
    ckpt = tmp_path / "ckpt.pt"
    epochs_seen = []
    for i in range(4):  # the first kill may come before any checkpoint, the others after one
        _kill_after(_train_forever, (str(ckpt),), rng.uniform(0.0, 0.6), ckpt if i else None)
        if not ckpt.exists():
            continue  # killed before the first checkpoint: nothing that looks finished
        state = I.load_checkpoint(ckpt)  # complete and verified (SHA-256), or this raises
        epochs_seen.append(int(state["epoch"]))
    assert epochs_seen, "no kill came after the first checkpoint"
    assert epochs_seen == sorted(epochs_seen), "a kill lost progress already checkpointed"
    # resume="auto" continues from what the kills left (and removes stale temporary files)
    pyro.clear_param_store()
    last = epochs_seen[-1]
    h = I.fit(_net(), _data(), epochs=last + 1, batch_size=8, checkpoint_path=ckpt,
              resume="auto", progress=False)
    assert len(h.train_loss) == last + 1
    assert not list(tmp_path.glob(".ckpt.pt.*.tmp"))
    assert I.load_checkpoint(ckpt)["epoch"] == last + 1


def _study_forever(out: str) -> None:
    from bayesattn.study import StudyConfig, run_study

    cfg = StudyConfig(out=out, methods=("deterministic",), epochs=1, num_samples=2,
                      ensemble_size=1, d_model=8, nhead=2, num_layers=1, dim_feedforward=8,
                      severities=(3,), arviz_examples=2, progress=False)
    while True:  # later kills land in a rerun over a complete folder (the --force path)
        run_study(cfg)


def _check_study_folder(out) -> str:
    status = study_status(out)
    if (out / RESULTS).exists():
        assert status == "complete", "results.json present but the run is not complete"
        res = json.loads((out / RESULTS).read_text())
        assert list(res["methods"]) == ["deterministic"] and (out / REPORT).is_file()
        for f in res["files"]:
            assert (out / f).stat().st_size > 0, f
            if f.endswith(".png"):
                assert (out / f).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f
    elif status != "missing":
        assert status == "incomplete" and (out / INCOMPLETE).is_file(), (
            "an unfinished folder without results.json must say INCOMPLETE"
        )
    return status


def test_killed_study_is_complete_or_clearly_incomplete(tmp_path):
    import matplotlib.pyplot  # noqa: F401 - warm the imports the child inherits

    from bayesattn import plots  # noqa: F401
    from bayesattn.data import load_digits_data

    load_digits_data(seed=0)
    rng = random.Random(1)
    out = tmp_path / "study"
    # a random moment in each phase: set-up/training, figures and final writes, and a rerun
    # over a complete folder (begin_run, as with --force)
    phases = [(None, 0.2, 3.0), ("reliability_deterministic.png", 0.0, 1.0), (RESULTS, 0.0, 2.0)]
    seen = []
    for wait, lo, hi in phases:
        _kill_after(_study_forever, (str(out),), rng.uniform(lo, hi), wait and out / wait)
        seen.append(_check_study_folder(out))
    assert seen.count("missing") < len(seen), f"no kill landed after the run started: {seen}"
