"""Pooling a data set's runs: per method and metric the mean with a 95% t-interval over the runs
(pair × seed), paired differences against the references, the ensemble-size curve, per-pair
means and the best method per metric (:mod:`~bayesattn.study.stats`)."""

from __future__ import annotations

from .metrics import SCALARS, get, primary_score
from .results import DatasetBlock, Interval, PairedInterval, PooledRow, RunResult, Win
from .stats import paired_interval, t_interval

__all__ = ["pool"]

#: metrics of the ensemble-size curve
_CURVE = ("accuracy", "nll", "ece", "auroc_entropy", "auroc_mi", "train_seconds",
          "infer_ms_batch512")  # fmt: skip


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
