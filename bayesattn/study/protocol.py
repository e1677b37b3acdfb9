"""The protocol: every dataset × held-out class set × seed is one run (its own split and seeds);
every method is fitted and scored on every run; numbers are pooled over the runs with 95%
t-intervals and paired differences (:mod:`~bayesattn.study.stats`)."""

from __future__ import annotations

import os
import platform
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from .._study_io import abandon_run, begin_run, die_with_parent, finish_run, prepare_out_dir
from .config import StudyConfig
from .datasets import get_dataset
from .methods import ensemble_of, get_method
from .metrics import SCALARS, evaluate, get, primary_score
from .results import (
    DatasetBlock,
    Interval,
    MethodRow,
    PairedInterval,
    PooledRow,
    RunResult,
    SplitSizes,
    StudyResults,
    Win,
)
from .runs import Run
from .stats import paired_interval, t_interval

__all__ = ["run_study", "pool"]

#: metrics of the ensemble-size curve
_CURVE = ("accuracy", "nll", "ece", "auroc_entropy", "auroc_mi", "train_seconds",
          "infer_ms_batch512")  # fmt: skip


def _jsonable(v: Any) -> Any:
    return list(v) if isinstance(v, tuple) else v


def run_study(cfg: StudyConfig) -> StudyResults:
    """Fit, score and write every method on every run; returns the results dict (also written
    as ``results.json``, with ``report.md`` and the figures, to ``cfg.out``). A run that raises
    leaves ``cfg.out`` as it was (:func:`~bayesattn._study_io.abandon_run`)."""
    try:
        return _run_study(cfg)
    except BaseException:
        abandon_run(getattr(cfg, "out", None))
        raise


def _run_study(cfg: StudyConfig) -> StudyResults:
    from tqdm.auto import tqdm

    from . import figures, report

    for name in cfg.methods:
        get_method(name).check_available()  # before anything is written or trained
    for dataset in cfg.dataset_list:
        get_dataset(dataset).check_available()  # ImportError before anything is written
    out = prepare_out_dir(cfg.out, force=True)
    foreign = begin_run(out)  # INCOMPLETE marker; the previous run's listed files go
    t_start = time.perf_counter()
    seeds = [cfg.seed + i for i in range(cfg.seeds)]
    pairs = cfg.pairs()
    results: StudyResults = {
        "config": {k: _jsonable(v) for k, v in asdict(cfg).items()},
        "methods": list(cfg.methods),
        "seeds": seeds,
        "pairs": [list(p) for p in pairs],
        "environment": {
            "torch": torch.__version__,
            "python": platform.python_version(),
            "threads": torch.get_num_threads(),
        },  # fmt: skip
        "datasets": {},
    }
    total = len(cfg.dataset_list) * len(pairs) * len(seeds) * len(cfg.methods)
    bar = tqdm(total=total, desc="study", disable=not cfg.progress)
    for dataset in cfg.dataset_list:
        t_ds = time.perf_counter()
        keys = [(pair, seed) for pair in pairs for seed in seeds]
        if cfg.jobs == 1:
            runs = [_one_run(cfg, out, Run.load(cfg, dataset, p, s), i == 0, bar)
                    for i, (p, s) in enumerate(keys)]  # fmt: skip
        else:
            runs = _parallel_runs(cfg, out, dataset, keys, bar)
        block = pool(runs, list(cfg.methods))
        block["model"] = {k: _jsonable(v) for k, v in cfg.model(dataset).items()}
        block["seconds"] = time.perf_counter() - t_ds
        block["figures"] = figures.dataset_figures(out, dataset, block)
        results["datasets"][dataset] = block
    bar.close()
    results["seconds"] = time.perf_counter() - t_start
    results["files"] = finish_run(out, results, report.render(results), foreign)  # last = complete
    return results


class _NoBar:
    def set_postfix_str(self, s: str) -> None: ...

    def update(self, n: int = 1) -> None: ...


def _run_job(cfg: StudyConfig, out: Path, dataset: str, key: tuple[tuple[int, ...], int],
             first: bool, threads: int) -> RunResult:  # fmt: skip
    """One run in a worker process (``threads`` torch threads)."""
    torch.set_num_threads(threads)
    return _one_run(cfg, out, Run.load(cfg, dataset, key[0], key[1]), first, _NoBar())


def _parallel_runs(cfg: StudyConfig, out: Path, dataset: str,
                   keys: list[tuple[tuple[int, ...], int]], bar: Any) -> list[RunResult]:  # fmt: skip
    """The runs of ``dataset`` on ``cfg.jobs`` worker processes (each with the caller's torch threads), in
    the order of ``keys``.

    Every run seeds its own split, training and sampling, so the numbers are those of
    ``jobs=1`` (``tests/study/test_protocol.py``); only the measured times differ (the runs
    share the machine). Workers are forked where the platform allows (methods registered by the
    calling script are then known to them), spawned elsewhere."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor, as_completed

    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    threads = torch.get_num_threads()
    with ProcessPoolExecutor(max_workers=cfg.jobs, mp_context=ctx, initializer=die_with_parent,
                             initargs=(os.getpid(),)) as pool_:  # fmt: skip
        futures = {pool_.submit(_run_job, cfg, out, dataset, key, i == 0, threads): i
                   for i, key in enumerate(keys)}  # fmt: skip
        done: dict[int, RunResult] = {}
        for fut in as_completed(futures):
            i = futures[fut]
            done[i] = fut.result()
            bar.set_postfix_str(f"{dataset} {keys[i][0]} seed {keys[i][1]} done")
            bar.update(len(cfg.methods))
    return [done[i] for i in range(len(keys))]


def _one_run(cfg: StudyConfig, out: Path, run: Run, first: bool, bar: Any) -> RunResult:
    """Every method on one run (and the ensemble-size curve); figures on the first run."""
    from . import figures

    rows: dict[str, MethodRow] = {}
    extras: dict[str, Any] = {}
    for name in cfg.methods:
        bar.set_postfix_str(f"{run.dataset} {run.pair} seed {run.seed}: {name}")
        method = get_method(name)
        t0 = time.perf_counter()
        fitted = method.fit(run)
        row, preds = evaluate(method, fitted, run)
        row["wall_seconds"] = time.perf_counter() - t0  # fit (what is not cached) + scoring
        rows[name] = row
        if first and cfg.figures:
            extras[name] = figures.run_figures(out, run, method, fitted, preds)
        bar.update()
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


def _values(runs: list[RunResult], method: str, path: tuple[str, ...]) -> list[float] | None:
    vals = [get(r["methods"][method], path) for r in runs]
    nums = [v for v in vals if v is not None]
    return nums if len(nums) == len(vals) else None


def pool(runs: list[RunResult], methods: list[str]) -> DatasetBlock:
    """Pooled numbers of one dataset: per method and metric the mean with a 95% t-interval over
    the runs (pair × seed); paired differences against ``deterministic`` and ``ensemble`` (where
    run); the ensemble-size curve; per-pair means (the appendix); the best method per metric."""
    for r in runs:  # rows of studies older than the primary score: derive it from their AUROCs
        for row in r["methods"].values():
            if "auroc_primary" not in row:
                row["primary_score"], row["auroc_primary"] = primary_score(row)
    pooled: dict[str, PooledRow] = {}
    for m in methods:
        pooled[m] = {"primary_score": runs[0]["methods"][m]["primary_score"]} if runs else {}
        for key, path, _ in SCALARS:
            vals = _values(runs, m, path)
            if vals is not None:
                pooled[m][key] = t_interval(vals)
        pooled[m]["corruption_curve"] = _corruption_curve(runs, m)
        pooled[m]["params"] = [r["methods"][m]["params"] for r in runs]
    paired: dict[str, dict[str, dict[str, PairedInterval]]] = {}
    for ref in ("deterministic", "ensemble"):
        if ref not in methods:
            continue
        paired[ref] = {}
        for m in methods:
            if m == ref:
                continue
            paired[ref][m] = {}
            for key, path, _ in SCALARS:
                a, b = _values(runs, m, path), _values(runs, ref, path)
                if a is not None and b is not None:
                    paired[ref][m][key] = paired_interval(a, b)
    curve: dict[str, dict[str, Interval]] = {}
    if runs and runs[0]["ensemble_curve"]:
        for size in runs[0]["ensemble_curve"]:
            curve[size] = {}
            for key, path, _ in SCALARS:
                if key not in _CURVE:
                    continue
                got = [get(r["ensemble_curve"][size], path) for r in runs]
                nums = [v for v in got if v is not None]
                if len(nums) == len(got):
                    curve[size][key] = t_interval(nums)
    per_pair: dict[str, dict[str, dict[str, float]]] = {}
    for pair in sorted({tuple(r["pair"]) for r in runs}):
        sub = [r for r in runs if tuple(r["pair"]) == pair]
        per_pair[f"{pair[0]}-{pair[1]}" if len(pair) == 2 else "-".join(map(str, pair))] = {
            m: {key: t_interval(v)["mean"] for key, path, _ in SCALARS
                if (v := _values(sub, m, path)) is not None}
            for m in methods
        }  # fmt: skip
    return DatasetBlock(runs=runs, pooled=pooled, paired=paired, ensemble_curve=curve,
                        per_pair=per_pair, wins=_wins(runs, pooled))  # fmt: skip


def _corruption_curve(runs: list[RunResult], m: str) -> dict[str, dict[str, float]]:
    """Mean accuracy and entropy AUROC per corruption kind and severity."""
    first = runs[0]["methods"][m]["corruptions"]
    return {
        c: {k: t_interval([r["methods"][m]["corruptions"][c][k] for r in runs])["mean"]
            for k in ("accuracy", "auroc_entropy")}
        for c in first
    }  # fmt: skip


def _wins(runs: list[RunResult], pooled: dict[str, PooledRow]) -> dict[str, Win]:
    """Per metric with a direction: the method with the best mean, the runner-up, and the paired
    difference best − runner-up (same pair and seed) with its 95% interval."""
    wins = {}
    for key, path, higher in SCALARS:
        have = [m for m in pooled if key in pooled[m]]
        if higher is None or not have:
            continue
        ranked = sorted(have, key=lambda m: pooled[m][key]["mean"], reverse=higher)
        best = ranked[0]
        entry = Win(method=best, mean=pooled[best][key]["mean"])
        if len(ranked) > 1:
            a, b = _values(runs, best, path), _values(runs, ranked[1], path)
            entry["runner_up"] = ranked[1]
            entry["vs_runner_up"] = paired_interval(a, b) if a and b else None
        wins[key] = entry
    return wins
