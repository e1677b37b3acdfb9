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


# ---- issue 33: --jobs 2, --merge, reruns, workers that die with the study -----------------------
def _tiny_cfg(out, jobs: int):
    from bayesattn.study import StudyConfig

    return StudyConfig(out=str(out), methods=("deterministic",), epochs=1, seeds=2, jobs=jobs,
                       num_samples=2, ensemble_size=1, d_model=8, nhead=2, num_layers=1,
                       dim_feedforward=8, severities=(3,), arviz_examples=2, figures=False,
                       progress=False)  # fmt: skip


def _study_once(out: str, jobs: int) -> None:
    from bayesattn.study import run_study

    run_study(_tiny_cfg(out, jobs))


def _merge_once(sources: list[str], out: str) -> None:
    from bayesattn.study.merge import merge_studies

    merge_studies(sources, out)


def _children(pid: int) -> set[int]:
    """Processes whose parent is ``pid`` (Linux ``/proc``)."""
    kids = set()
    for stat in os.listdir("/proc"):
        if stat.isdigit():
            try:
                fields = open(f"/proc/{stat}/stat").read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                kids.add(int(stat))
    return kids


def _alive(pid: int) -> bool:
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")  # a zombie has died (its parent has not reaped it yet)


def _same_results(a, b) -> bool:
    from bayesattn.study.merge import without_times

    def text(folder):
        res = json.loads((folder / RESULTS).read_text())
        res.pop("files", None)
        for k in ("config", "merged_from"):
            res.pop(k, None)
        return json.dumps(without_times(res), sort_keys=True)

    return text(a) == text(b)


def _warm_study_imports():
    import matplotlib.pyplot  # noqa: F401 - warm the imports the child inherits

    from bayesattn import plots  # noqa: F401
    from bayesattn.data import load_digits_data

    load_digits_data(seed=0)


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_killed_study_rerun_gives_the_uninterrupted_results(tmp_path, jobs):
    """SIGKILL of the study's (main) process during its runs and during its figures/report:
    the folder is complete or says INCOMPLETE, its workers die with it, and a rerun gives the
    results.json of an uninterrupted run (times aside)."""
    if not os.path.isdir("/proc/self"):
        pytest.skip("needs /proc to find the worker processes")
    _warm_study_imports()
    ref = tmp_path / "ref"
    _study_once(str(ref), jobs)
    rng = random.Random(jobs)
    out = tmp_path / "study"
    had_workers = 0
    # a random moment while the runs train (with jobs=2: once the workers are there; the tiny
    # study's runs last about a second, so a kill that came after them is tried again), and one
    # in the figures and report at the end
    for wait, lo, hi in (("workers", 0.0, 0.3), ("corruptions_digits.png", 0.0, 0.3)):
        for _attempt in range(4):
            p = _CTX.Process(target=_study_once, args=(str(out), jobs))  # may have workers
            p.start()
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                if wait == "workers" and (jobs == 1 or _children(p.pid)):
                    break
                if wait != "workers" and (out / wait).exists():
                    break
                time.sleep(0.01)
            time.sleep(rng.uniform(lo, hi))
            workers = _children(p.pid)
            p.kill()
            p.join(10)
            had_workers += bool(workers)
            gone = time.monotonic() + 5
            while any(_alive(w) for w in workers) and time.monotonic() < gone:
                time.sleep(0.05)
            left = [w for w in workers if _alive(w)]
            for w in left:  # never leave them behind, even when the test fails
                os.kill(w, 9)
            assert not left, f"workers {left} outlived the study"
            _check_study_folder(out)
            if wait != "workers" or jobs == 1 or workers:
                break
    assert jobs == 1 or had_workers, "no kill landed while the workers ran"
    _study_once(str(out), jobs)  # the rerun over what the kills left
    assert study_status(out) == "complete" and not (out / INCOMPLETE).exists()
    assert _same_results(out, ref)


def test_a_killed_merge_rerun_gives_the_uninterrupted_merge(tmp_path):
    import shutil

    _warm_study_imports()
    a = tmp_path / "a"
    _study_once(str(a), 1)
    b = tmp_path / "b"
    shutil.copytree(a, b)
    ref = tmp_path / "ref"
    _merge_once([str(a), str(b)], str(ref))
    rng = random.Random(3)
    out = tmp_path / "merged"
    seen = []
    for wait, lo, hi in ((None, 0.0, 0.6), (INCOMPLETE, 0.0, 0.3), (RESULTS, 0.0, 0.3)):
        _kill_after(_merge_once, ([str(a), str(b)], str(out)), rng.uniform(lo, hi),
                    wait and out / wait)  # fmt: skip
        seen.append(_check_study_folder(out))
        assert study_status(a) == study_status(b) == "complete"  # sources untouched
    _merge_once([str(a), str(b)], str(out))
    assert study_status(out) == "complete" and _same_results(out, ref)
