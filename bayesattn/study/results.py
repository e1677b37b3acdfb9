"""The shapes of the study's results (typed dicts: what ``results.json`` holds, key by key).

A study's results are JSON, so they are dicts; these types name their keys. A **run**
(:class:`RunResult`) is one data set × held-out pair × seed: per method a :data:`MethodRow`
(the metrics of :mod:`.metrics`, open-keyed: a metric added to ``metrics.SCALARS`` adds a key);
a **data set's block** (:class:`DatasetBlock`) pools its runs: per method a :data:`PooledRow`
(metric → :class:`Interval`), paired differences (:class:`PairedInterval`), the ensemble-size
curve, per-pair means and the :class:`Win` per metric; :class:`StudyResults` is the file."""

from __future__ import annotations

from typing import Any, TypedDict

__all__ = [
    "Interval",
    "PairedInterval",
    "Win",
    "SplitSizes",
    "MethodRow",
    "PooledRow",
    "RunResult",
    "DatasetBlock",
    "StudyResults",
]

#: one method's metrics on one run (``accuracy``, ``nll``, ``held_out``, ``far_ood``,
#: ``corruptions``, ``selective``, ``params``, …; :func:`~bayesattn.study.metrics.evaluate`)
MethodRow = dict[str, Any]
#: one method's pooled metrics on a data set: metric → :class:`Interval`, with
#: ``primary_score`` (str), ``corruption_curve`` and ``params`` (one dict per run)
PooledRow = dict[str, Any]


class Interval(TypedDict):
    """A mean with its 95% t-interval over ``n`` runs (``lo``/``hi``/``half_width`` NaN at
    ``n = 1``)."""

    mean: float
    sd: float
    n: int
    lo: float
    hi: float
    half_width: float


class PairedInterval(Interval):
    """The interval of paired differences (same pair and seed), whether it excludes 0 and the
    two-sided t-test's ``p``."""

    resolved: bool
    p: float


class _WinBase(TypedDict):
    method: str
    mean: float


class Win(_WinBase, total=False):
    """The best method on a metric, the runner-up and their paired difference."""

    runner_up: str
    vs_runner_up: PairedInterval | None


class SplitSizes(TypedDict):
    """Rows of each split of a run."""

    train: int
    val: int
    test: int
    ood_classes: int


class RunResult(TypedDict):
    """Every method on one run (and the ensemble-size curve; figures of the first run)."""

    dataset: str
    pair: list[int]
    seed: int
    data: SplitSizes
    methods: dict[str, MethodRow]
    ensemble_curve: dict[str, MethodRow]
    first_run: dict[str, Any]


class _BlockBase(TypedDict):
    runs: list[RunResult]
    pooled: dict[str, PooledRow]
    paired: dict[str, dict[str, dict[str, PairedInterval]]]
    ensemble_curve: dict[str, dict[str, Interval]]
    per_pair: dict[str, dict[str, dict[str, float]]]
    wins: dict[str, Win]


class DatasetBlock(_BlockBase, total=False):
    """One data set's runs pooled (:func:`~bayesattn.study.protocol.pool`), with the model it
    ran, its seconds and its figures (added by the study)."""

    model: dict[str, Any]
    seconds: float
    figures: dict[str, str]


class _ResultsBase(TypedDict):
    config: dict[str, Any]
    methods: list[str]
    seeds: list[int]
    pairs: list[list[int]]
    environment: dict[str, Any]
    datasets: dict[str, DatasetBlock]


class StudyResults(_ResultsBase, total=False):
    """``results.json``: the configuration, the environment (versions), every data set's
    block, the seconds it took and the files it wrote (the manifest)."""

    seconds: float
    files: list[str]
    #: the configuration's hash (:func:`~bayesattn.study.runfiles.config_hash`)
    config_hash: str
    #: the source folders of a merged study (:func:`~bayesattn.study.merge_studies`)
    merged_from: list[str]
