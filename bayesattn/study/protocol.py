"""The protocol: every dataset × held-out class set × seed is one run (its own split and seeds);
every method is fitted and scored on every run; numbers are pooled over the runs with 95%
t-intervals and paired differences (:mod:`.pooling`).

Runs are independent, so they go to any :class:`concurrent.futures.Executor` (a local process
pool by default, a Dask cluster's ``Client.get_executor()``, …); each finished run is written to
its own file at once (:mod:`.runfiles`), so a study stopped at any moment resumes where it was,
and ``results.json``/``report.md`` are pooled from those files."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Executor, Future, as_completed
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from .._study_io import (
    PREVIOUS,
    abandon_run,
    begin_run,
    die_with_parent,
    finish_run,
    register_output,
    resume_run,
    stop_run,
)
from .config import StudyConfig
from .datasets import get_dataset
from .methods import ensemble_of, get_method, methods_for
from .metrics import evaluate
from .pooling import pool
from .provenance import versions
from .results import MethodRow, RunResult, SplitSizes, StudyResults
from .runfiles import (
    STUDY_FILE,
    StudyPlan,
    plan_study,
    read_run_file,
    run_file_name,
    write_run_file,
    write_study_file,
)
from .runs import Run

__all__ = ["run_study", "pool", "study_config_dict"]

Key = tuple[tuple[int, ...], int]  # (held-out pair, seed)


def _jsonable(v: Any) -> Any:
    return list(v) if isinstance(v, tuple) else v


def study_config_dict(cfg: StudyConfig) -> dict[str, Any]:
    """The configuration as ``results.json`` records it (tuples as lists)."""
    return {k: _jsonable(v) for k, v in asdict(cfg).items()}


def run_study(
    cfg: StudyConfig,
    executor: Executor | None = None,
    *,
    force: bool = False,
    any_version: bool = False,
) -> StudyResults:
    """Fit, score and write every method on every run; returns the results (also written as
    ``results.json``, with ``report.md``, the figures and one file per run, to ``cfg.out``).

    ``executor``: where the runs go (any :class:`concurrent.futures.Executor`: a Dask
    ``Client.get_executor()``, a process pool of yours; its workers must see ``cfg.out``, where
    the first run of a data set writes its figures); ``None``: this process (``cfg.jobs == 1``) or
    a process pool of ``cfg.jobs`` workers that dies with it. The numbers do not depend on it.

    A folder holding a study of the same configuration is **resumed** (its finished runs are read,
    not redone); one of another configuration is refused unless ``force`` (which replaces it), one
    of other code (bayesattn version, git commit) unless ``any_version`` (:mod:`.runfiles`). A
    study that raises or is interrupted keeps its finished runs (the folder says INCOMPLETE and
    why; rerun to resume); one that had finished no run restores the study it was replacing."""
    for name in cfg.methods:
        get_method(name).check_available()  # before anything is written or trained
    for dataset in cfg.dataset_list:
        get_dataset(dataset).check_available()
    config = study_config_dict(cfg)
    plan = plan_study(config, force=force, any_version=any_version)
    wrote: list[Path] = []
    foreign = _open_folder(plan, config, cfg)
    try:
        return _run_study(cfg, plan, foreign, executor, wrote, any_version)
    except BaseException as e:
        if not plan.resume and not wrote and (plan.out / PREVIOUS).is_dir():
            abandon_run(plan.out)  # nothing of the new study finished: the old one comes back
        else:
            stop_run(plan.out, f"{type(e).__name__}: {e}")
        raise


def _open_folder(plan: StudyPlan, config: dict[str, Any], cfg: StudyConfig) -> frozenset[str]:
    """Mark the folder incomplete (resuming: keep its runs; else: set the old study aside) and
    list every run file the study will write, with ``study.json``."""
    foreign = resume_run(plan.out) if plan.resume else begin_run(plan.out)
    names = [STUDY_FILE] + [run_file_name(d, p, s) for d in cfg.dataset_list for p, s in _keys(cfg)]
    for name in names:  # one manifest, written by this process only while workers run
        register_output(plan.out, name)
    if not plan.resume:
        write_study_file(plan.out, config, plan.config_hash)
    return foreign


def _keys(cfg: StudyConfig) -> list[Key]:
    seeds = [cfg.seed + i for i in range(cfg.seeds)]
    return [(pair, seed) for pair in cfg.pairs() for seed in seeds]


def _run_study(
    cfg: StudyConfig,
    plan: StudyPlan,
    foreign: frozenset[str],
    executor: Executor | None,
    wrote: list[Path],
    any_version: bool,
) -> StudyResults:
    from tqdm.auto import tqdm

    from . import figures, report

    out, h, t_start, keys = plan.out, plan.config_hash, time.perf_counter(), _keys(cfg)
    results: StudyResults = {
        "config": study_config_dict(cfg),
        "config_hash": h,
        "methods": list(cfg.methods),
        "seeds": [cfg.seed + i for i in range(cfg.seeds)],
        "pairs": [list(p) for p in cfg.pairs()],
        "environment": {**versions(), "threads": torch.get_num_threads()},
        "datasets": {},
    }

    def stored(dataset: str, key: Key) -> RunResult | None:
        name = run_file_name(dataset, *key)
        return read_run_file(out, name, h, any_version=any_version)

    todo = {d: [(i, k) for i, k in enumerate(keys) if stored(d, k) is None]
            for d in cfg.dataset_list}  # fmt: skip
    total = len(cfg.dataset_list) * len(keys)
    bar = tqdm(total=total, initial=total - sum(map(len, todo.values())), desc="study runs",
               unit="run", disable=not cfg.progress)  # fmt: skip
    own = _local_pool(cfg.jobs) if executor is None and cfg.jobs > 1 else None
    try:
        for dataset in cfg.dataset_list:
            t_ds = time.perf_counter()
            for run, code in _execute(cfg, out, dataset, todo[dataset], own or executor, bar):
                wrote.append(write_run_file(out, run, h, code))
                bar.set_postfix_str(f"{dataset} {tuple(run['pair'])} seed {run['seed']} done")
                bar.update()
            runs = [stored(dataset, k) for k in keys]  # every run from its file
            applied = methods_for(get_dataset(dataset), cfg.methods)
            block = pool([r for r in runs if r is not None], applied)
            block["model"] = {k: _jsonable(v) for k, v in cfg.model(dataset).items()}
            block["seconds"] = time.perf_counter() - t_ds
            block["figures"] = figures.dataset_figures(out, dataset, block)
            results["datasets"][dataset] = block
    finally:
        if own is not None:
            own.shutdown(wait=False, cancel_futures=True)
        bar.close()
    results["seconds"] = time.perf_counter() - t_start
    results["files"] = finish_run(out, results, report.render(results), foreign)  # last
    return results


def _local_pool(jobs: int) -> Executor:
    """``jobs`` worker processes that die with this one (forked where the platform allows, so
    methods and data sets registered by the calling script are known to them)."""
    import multiprocessing as mp
    import os
    from concurrent.futures import ProcessPoolExecutor

    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    return ProcessPoolExecutor(max_workers=jobs, mp_context=ctx, initializer=die_with_parent,
                               initargs=(os.getpid(),))  # fmt: skip


def _execute(
    cfg: StudyConfig,
    out: Path,
    dataset: str,
    todo: list[tuple[int, Key]],
    executor: Executor | None,
    bar: Any,
) -> Any:
    """``(run, versions of the code that ran it)`` of every run in ``todo``, as each finishes:
    here, one after the other (``executor=None``), or on the executor's workers (each with this
    process's torch threads). Runs not finished when the caller stops are cancelled."""
    threads = torch.get_num_threads()
    if executor is None:
        for i, key in todo:
            yield _run_job(cfg, out, dataset, key, i == 0, threads, bar.set_postfix_str)
        return
    futures: list[Future[tuple[RunResult, dict[str, Any]]]] = [
        executor.submit(_run_job, cfg, out, dataset, key, i == 0, threads) for i, key in todo
    ]
    try:
        for fut in as_completed(futures):
            yield fut.result()
    finally:
        for fut in futures:
            fut.cancel()


def _run_job(
    cfg: StudyConfig,
    out: Path,
    dataset: str,
    key: Key,
    first: bool,
    threads: int,
    say: Callable[[str], Any] | None = None,
) -> tuple[RunResult, dict[str, Any]]:
    """One run (``threads`` torch threads), with the versions of the code that ran it."""
    torch.set_num_threads(threads)
    run = Run.load(cfg, dataset, key[0], key[1])
    return _one_run(cfg, out, run, first, say or (lambda s: None)), versions()


def _one_run(
    cfg: StudyConfig, out: Path, run: Run, first: bool, say: Callable[[str], Any]
) -> RunResult:
    """Every method on one run (and the ensemble-size curve); figures on the first run."""
    from . import figures

    rows: dict[str, MethodRow] = {}
    extras: dict[str, Any] = {}
    for name in methods_for(run.spec, cfg.methods):
        say(f"{run.dataset} {run.pair} seed {run.seed}: {name}")
        method = get_method(name)
        t0 = time.perf_counter()
        fitted = method.fit(run)
        row, preds = evaluate(method, fitted, run)
        row["wall_seconds"] = time.perf_counter() - t0  # fit (what is not cached) + scoring
        rows[name] = row
        if first and cfg.figures:
            extras[name] = figures.run_figures(out, run, method, fitted, preds)
    curve: dict[str, MethodRow] = {}
    if "ensemble" in cfg.methods:
        for m in range(1, cfg.ensemble_size + 1):
            method = ensemble_of(m)
            row, _ = evaluate(method, method.fit(run), run)
            curve[str(m)] = row
    return RunResult(dataset=run.dataset, pair=list(run.pair), seed=run.seed, data=_sizes(run),
                     methods=rows, ensemble_curve=curve, first_run=extras)  # fmt: skip


def _sizes(run: Run) -> SplitSizes:
    d = run.data
    return SplitSizes(train=len(d.x_train), val=len(d.x_val), test=len(d.x_test),
                      ood_classes=len(d.x_ood_classes))  # fmt: skip
