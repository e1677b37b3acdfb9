"""A study stopped at any moment resumes (issue 42): one file per finished run with the
configuration's hash and the code's versions; the rerun skips them, and its results equal an
uninterrupted study's bit for bit (times aside); another configuration or other code is refused
unless told; a study that raises or is interrupted keeps its finished runs (issue 43)."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import random
import signal
import time
from concurrent.futures import ProcessPoolExecutor

import pytest

from bayesattn._study_io import INCOMPLETE, RESULTS, study_status
from bayesattn.cli import main
from bayesattn.study import StudyConfig, run_study
from bayesattn.study import methods as M
from bayesattn.study.merge import without_times
from bayesattn.study.provenance import versions
from bayesattn.study.runfiles import STUDY_FILE, run_file_name

pytestmark = pytest.mark.slow  # tiny studies of a few seconds each

_KW = dict(methods=("deterministic",), epochs=1, seeds=3, num_samples=2, ensemble_size=1,
           d_model=8, nhead=2, num_layers=1, dim_feedforward=8, severities=(3,),
           arviz_examples=2, figures=False, progress=False, holdout_classes=(8, 9))  # fmt: skip
_RUNS = [run_file_name("digits", (8, 9), s) for s in range(3)]


def _cfg(out, **kw):
    return StudyConfig(out=str(out), **{**_KW, **kw})


def _text(folder) -> str:
    """results.json without what may differ between two runs of one study: times, files, the
    folder and the environment's thread count."""
    res = json.loads((folder / RESULTS).read_text())
    for k in ("files", "seconds"):
        res.pop(k)
    res["config"].pop("out")
    return json.dumps(without_times(res), sort_keys=True)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("resume") / "ref"
    run_study(_cfg(out))
    return out


def test_every_run_has_its_file_with_the_hash_and_the_versions(reference):
    res = json.loads((reference / RESULTS).read_text())
    env = res["environment"]
    assert {"bayesattn", "commit", "torch", "pyro", "transformers", "python"} <= set(env)
    assert env["bayesattn"] == versions()["bayesattn"] and env["commit"] == versions()["commit"]
    study = json.loads((reference / STUDY_FILE).read_text())
    assert study["config_hash"] == res["config_hash"] and study["versions"] == versions()
    for name, run in zip(_RUNS, res["datasets"]["digits"]["runs"], strict=True):
        payload = json.loads((reference / name).read_text())
        assert payload["config_hash"] == res["config_hash"] and payload["versions"] == versions()
        assert payload["run"] == run  # results.json holds the run files' runs
    assert set(_RUNS) | {STUDY_FILE} <= set(res["files"])


def _study(out: str) -> None:
    run_study(_cfg(out))


def test_a_study_killed_at_a_random_moment_resumes_to_the_uninterrupted_results(
    reference, tmp_path
):
    """SIGKILL at a random moment after the first run's file appears; the rerun keeps the
    finished runs (their files untouched) and equals the uninterrupted study bit for bit."""
    out = tmp_path / "s"
    ctx = mp.get_context("fork")
    p = ctx.Process(target=_study, args=(str(out),))
    p.start()
    deadline = time.monotonic() + 120
    while not (out / _RUNS[0]).exists() and time.monotonic() < deadline and p.is_alive():
        time.sleep(0.01)
    time.sleep(random.Random(7).uniform(0.0, 0.8))
    p.kill()
    p.join(10)
    assert study_status(out) == "incomplete" and (out / INCOMPLETE).is_file()
    kept = {n: (out / n).stat().st_mtime_ns for n in _RUNS if (out / n).exists()}
    assert kept, "the kill landed before a run finished"
    run_study(_cfg(out))  # the same study again: resumes
    assert study_status(out) == "complete" and not (out / INCOMPLETE).exists()
    assert {n: (out / n).stat().st_mtime_ns for n in kept} == kept  # not redone
    assert _text(out) == _text(reference)


def test_another_configuration_is_refused_and_force_replaces_it(reference, tmp_path):
    import shutil

    out = tmp_path / "s"
    shutil.copytree(reference, out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(ValueError, match=r"another configuration \(it differs in \['epochs'\]\)"):
        run_study(_cfg(out, epochs=2))
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert main(["study", "--out", str(out), "--epochs", "2", "--no-progress"]) == 2
    run_study(_cfg(out))  # the same configuration: resumed, every run already there
    assert _text(out) == _text(reference)
    run_study(_cfg(out, seeds=1), force=True)
    assert json.loads((out / RESULTS).read_text())["seeds"] == [0]
    assert not (out / _RUNS[1]).exists()  # the replaced study's run files are gone


def test_runs_of_other_code_are_refused_unless_told(reference, tmp_path):
    import shutil

    out = tmp_path / "s"
    shutil.copytree(reference, out)
    payload = json.loads((out / _RUNS[1]).read_text())
    payload["versions"]["commit"] = "0" * 40
    (out / _RUNS[1]).write_text(json.dumps(payload))
    with pytest.raises(ValueError, match=r"run file .*seed1.json was made by other code: commit"):
        run_study(_cfg(out))
    assert run_study(_cfg(out), any_version=True)["datasets"]["digits"]["runs"][1]["seed"] == 1
    assert _text(out) == _text(reference)
    study = json.loads((out / STUDY_FILE).read_text())
    study["versions"]["bayesattn"] = "0.0.1"
    (out / STUDY_FILE).write_text(json.dumps(study))
    with pytest.raises(ValueError, match="the study in .* was made by other code: bayesattn"):
        run_study(_cfg(out))


_FAIL: dict[str, type[BaseException] | None] = {"error": None}


class _FailsOnSeed1(M.Deterministic):
    """The deterministic network, but the run of seed 1 raises ``_FAIL["error"]`` (if set)."""

    name = "r42_fails_seed1"

    def fit(self, run):
        error = _FAIL["error"]
        if run.seed == 1 and error is not None:
            raise error("stopped on seed 1")
        return super().fit(run)


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_a_study_that_raises_or_is_interrupted_keeps_its_finished_runs(tmp_path, error):
    """On today's main a raising run left a new folder with no status and no runs, and Ctrl-C
    lost every finished run; now the folder says INCOMPLETE (and why) and the rerun resumes."""
    M.register_method(_FailsOnSeed1())
    out = tmp_path / "s"
    try:
        _FAIL["error"] = error
        with pytest.raises(error, match="stopped on seed 1"):
            run_study(_cfg(out, methods=("r42_fails_seed1",)))
        assert study_status(out) == "incomplete"
        assert "It stopped: " in (out / INCOMPLETE).read_text().splitlines()[0]
        assert (out / _RUNS[0]).is_file() and not (out / _RUNS[1]).exists()
        first = (out / _RUNS[0]).stat().st_mtime_ns
        _FAIL["error"] = None
        run_study(_cfg(out, methods=("r42_fails_seed1",)))
        assert study_status(out) == "complete" and (out / _RUNS[0]).stat().st_mtime_ns == first
    finally:
        _FAIL["error"] = None
        M._REGISTRY.unregister("r42_fails_seed1", missing_ok=True)


def test_any_process_executor_gives_the_numbers_of_one_process(reference, tmp_path):
    ctx = mp.get_context("fork")
    with ProcessPoolExecutor(2, mp_context=ctx) as ex:
        run_study(_cfg(tmp_path / "s"), ex)
    assert _text(tmp_path / "s") == _text(reference)


def test_a_merge_refuses_a_source_whose_files_are_symbolic_links(reference, tmp_path):
    """On today's main ``--merge`` followed a symlink a source lists (``shutil.copyfile``) and
    copied a file from anywhere into ``--out``."""
    import shutil

    from bayesattn.study.merge import merge_studies

    secret = tmp_path / "secret.txt"
    secret.write_text("not the study's")
    a, b = tmp_path / "a", tmp_path / "b"
    shutil.copytree(reference, a)
    shutil.copytree(reference, b)
    res = json.loads((b / RESULTS).read_text())
    res["files"].append("figure.png")
    (b / RESULTS).write_text(json.dumps(res))
    os.symlink(secret, b / "figure.png")
    with pytest.raises(ValueError, match=r"\['figure.png'\] are symbolic links"):
        merge_studies([a, b], tmp_path / "m")
    assert not (tmp_path / "m").exists()
    res = json.loads((a / RESULTS).read_text())
    res["environment"]["commit"] = "f" * 40
    (a / RESULTS).write_text(json.dumps(res))
    (b / "figure.png").unlink()
    res = json.loads((b / RESULTS).read_text())
    res["files"].remove("figure.png")
    (b / RESULTS).write_text(json.dumps(res))
    with pytest.raises(ValueError, match=r"source .*a was made by other code: commit"):
        merge_studies([a, b], tmp_path / "m")
    assert merge_studies([a, b], tmp_path / "m", any_version=True)["seeds"] == [0, 1, 2]


def test_sigint_to_the_command_keeps_the_finished_runs(tmp_path):
    """Ctrl-C (SIGINT) during ``bayesattn study``: exit 130, finished runs kept, rerun resumes."""
    import subprocess
    import sys

    out = tmp_path / "s"
    args = [sys.executable, "-m", "bayesattn.cli", "study", "--out", str(out), "--no-progress",
            "--methods", "deterministic", "--epochs", "1", "--seeds", "3", "--holdout-classes",
            "8", "9", "--samples", "2", "--ensemble-size", "1"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    p = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 180
    while not (out / _RUNS[0]).exists() and time.monotonic() < deadline and p.poll() is None:
        time.sleep(0.05)
    if p.poll() is not None:
        pytest.skip("the study finished before it could be interrupted")
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 130 and "finished runs are kept" in err, err[-2000:]
    assert study_status(out) == "incomplete" and (out / _RUNS[0]).is_file()


# ---- on a real engine: a Dask LocalCluster of 2 workers x 1 thread ----------------------------
def _cluster():
    distributed = pytest.importorskip("distributed")
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                       dashboard_address=None, silence_logs=50)  # fmt: skip
    return cluster, distributed.Client(cluster)


def _in_thread(fn):
    """Run ``fn()`` in a thread; returns (thread, box) with box["result"] or box["error"]."""
    import threading

    box: dict = {}

    def target():
        try:
            box["result"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            box["error"] = e

    t = threading.Thread(target=target, daemon=True)
    t.start()
    return t, box


def _wait_for(cond, timeout=180.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_a_dask_cluster_gives_the_numbers_of_one_process_and_survives_a_killed_worker(
    reference, tmp_path
):
    """The study on a LocalCluster equals ``--jobs 1`` bit for bit; a worker SIGKILLed while it
    runs a run has that run redone on a worker, and the study still equals the uninterrupted
    one."""
    cluster, client = _cluster()
    try:
        run_study(_cfg(tmp_path / "dask"), client.get_executor())
        assert _text(tmp_path / "dask") == _text(reference)
        pids = client.run(os.getpid)  # worker address -> process id
        t, box = _in_thread(lambda: run_study(_cfg(tmp_path / "killed"), client.get_executor()))
        _wait_for(lambda: any(client.processing().values()) or not t.is_alive())
        if not t.is_alive():  # an error before any run started, or a study too fast to catch
            assert "error" not in box, box["error"]
            pytest.skip("the study finished before a worker could be killed")
        time.sleep(random.Random(11).uniform(0.0, 0.3))
        busy = [w for w, tasks in client.processing().items() if tasks]
        os.kill(pids[busy[0]] if busy else next(iter(pids.values())), signal.SIGKILL)
        t.join(300)
        assert "error" not in box, box.get("error")
        assert _text(tmp_path / "killed") == _text(reference)
    finally:
        client.close()
        cluster.close()


def test_a_lost_scheduler_leaves_the_finished_runs_and_the_rerun_completes(reference, tmp_path):
    cluster, client = _cluster()
    out = tmp_path / "s"
    try:
        t, box = _in_thread(lambda: run_study(_cfg(out), client.get_executor()))
        _wait_for(lambda: (out / _RUNS[0]).exists() or "error" in box or "result" in box)
        client.close()  # the scheduler is gone for the study: its pending runs are lost
        cluster.close()
        t.join(300)
    finally:
        client.close()
        cluster.close()
    if "result" in box:
        pytest.skip("the study finished before the scheduler was lost")
    assert "error" in box and study_status(out) == "incomplete"
    kept = {n: (out / n).stat().st_mtime_ns for n in _RUNS if (out / n).exists()}
    assert kept
    run_study(_cfg(out))  # the rerun (here on this machine) finishes it
    assert {n: (out / n).stat().st_mtime_ns for n in kept} == kept
    assert _text(out) == _text(reference)
