"""Merge finished studies into one (:func:`merge_studies`): a method added later (``--methods
new_method`` on the same pairs, seeds and settings) joins the pooled tables and the paired
differences of the first study without rerunning it; studies of the same methods on other seeds
(``--seed 1 --seeds 2`` beside ``--seeds 1``: one protocol split over machines or days) add their
runs."""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

from .._study_io import (
    RESULTS,
    abandon_run,
    begin_run,
    check_out_path,
    finish_run,
    prepare_out_dir,
    register_output,
    study_status,
)
from .legacy import upgrade_results
from .pooling import pool
from .provenance import check_same_code
from .results import DatasetBlock, RunResult, StudyResults
from .runfiles import STUDY_FILE

__all__ = ["merge_studies", "without_times"]

#: config fields that may differ between merged studies (they do not change the numbers)
_FREE = ("methods", "out", "jobs", "progress", "figures", "geometry")
#: config fields that may differ between studies of other runs (their seeds)
_RUNS = ("seed", "seeds")
#: config fields newer than some studies, with their value in a study written before them
_ABSENT = {"smoke": False}


def without_times(o: Any) -> Any:
    """A results block without what depends on the machine's load (times, figure paths)."""
    if isinstance(o, dict):
        return {
            k: without_times(v)
            for k, v in o.items()
            if not (k.startswith("infer_ms") or "seconds" in k or k in ("figures", "first_run"))
        }
    if isinstance(o, list):
        return [without_times(v) for v in o]
    return o


def _load(src: str | Path) -> StudyResults:
    """A finished study's ``results.json``: ``ValueError`` naming ``src`` when the folder holds
    none, holds something else, or is incomplete (a file its results.json lists is missing)."""
    path = Path(src) / RESULTS
    if not path.is_file():
        raise ValueError(f"sources must be finished study folders; no {RESULTS} in {src}")
    try:
        out = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ValueError(f"source {src}: {RESULTS} cannot be read as JSON ({e})") from e
    need = ("config", "datasets", "methods", "seeds", "pairs", "files", "seconds")
    lacking = [k for k in need if not isinstance(out, dict) or k not in out]
    if (
        lacking
        or not isinstance(out.get("config"), dict)
        or not isinstance(out.get("datasets"), dict)
    ):
        raise ValueError(
            f"source {src}: {RESULTS} is not a bayesattn study's results (it lacks "
            f"{lacking or ['a config/datasets mapping']})"
        )
    files = out["files"] if isinstance(out["files"], list) else []
    links = [f for f in files if isinstance(f, str) and (Path(src) / f).is_symlink()]
    if links or (Path(src) / RESULTS).is_symlink():
        raise ValueError(
            f"source {src}: {links or [RESULTS]} are symbolic links; a study folder holds the "
            "files a study wrote, and a merge copies no file from elsewhere (copy the files "
            "themselves into the folder)"
        )
    missing = [f for f in files if not isinstance(f, str) or not (Path(src) / f).is_file()]
    if missing or study_status(src) != "complete":
        raise ValueError(
            f"source {src} is not a complete study: files its {RESULTS} lists are missing "
            f"{missing[:8]}{' ...' if len(missing) > 8 else ''}; rerun or restore it"
        )
    return cast(StudyResults, upgrade_results(out))  # a study from before a rename: current names


def _check_folders(sources: Sequence[str | Path], out: str | Path) -> None:
    """Sources are distinct folders, and ``out`` is none of them."""
    seen: dict[Path, str] = {}
    for s in sources:
        if not isinstance(s, (str, Path)):
            raise TypeError(f"sources must be folder paths; got {s!r}")
        key = Path(s).expanduser().resolve()
        if key in seen:
            raise ValueError(
                f"sources must be distinct studies; {str(s)!r} is the same folder as "
                f"{seen[key]!r} (its runs would count twice)"
            )
        seen[key] = str(s)
    if isinstance(out, (str, Path)) and str(out).strip():
        target = Path(out).expanduser().resolve()
        if target in seen:
            raise ValueError(
                f"out must be a new folder, not one of the sources: --out {str(out)!r} is "
                f"source {seen[target]!r} (merging into it would replace its files while they "
                "are read)"
            )


def _copied(name: str, every: Sequence[str] = (), kept: Sequence[str] = ()) -> bool:
    """Whether a merge copies a source's file: its figures and ArviZ files, not its results,
    report, ``study.json`` or run files (the merged study is pooled from the results), nor the
    files of a method of ``every`` not ``kept`` (``<dataset>_<figure>_<method>.<ext>``; the
    longest method name that ends the file's stem is its method)."""
    is_run = name.startswith("run_") and name.endswith(".json")
    stem = name.rsplit(".", 1)[0]
    method = max((m for m in every if stem.endswith("_" + m)), key=len, default=None)
    of_dropped = method is not None and method not in kept
    return name not in (RESULTS, "report.md", STUDY_FILE) and not is_run and not of_dropped


def _key(run: RunResult) -> tuple[tuple[int, ...], int]:
    return tuple(run["pair"]), int(run["seed"])


def merge_studies(
    sources: Sequence[str | Path],
    out: str | Path,
    *,
    any_version: bool = False,
    methods: Sequence[str] | None = None,
) -> StudyResults:
    """One study from finished ``sources`` run with the same datasets, held-out pairs and
    settings (all but ``methods``, the seeds and how they ran): the union of their runs
    (a run is a pair and a seed), every run with the union of the methods (first source first),
    pooled again with intervals and paired differences; written to ``out`` (a study folder:
    ``results.json``, ``report.md``, the sources' figures).

    A run in more than one source gets each source's methods, and a method in more than one must
    have the same numbers in each (times aside): the runs are seeded, so this is a
    reproducibility check, and a ``ValueError`` names the method and run that differ. Every run
    of the merged study must have every method (a ``ValueError`` names the run and what it
    lacks): new seeds come with the methods of the study they join. A source made by other code
    (another bayesattn version or git commit than this one, or none recorded) is refused unless
    ``any_version``. A file a source lists that is a symbolic link is refused (a merge copies the
    sources' own files, never one from elsewhere). ``methods`` keeps only those (each in some
    source; ``None``: all): a study of new seeds joins one that also ran methods it did not."""
    from . import figures, report

    if isinstance(sources, (str, Path)) or len(sources) < 2:
        raise ValueError(f"sources must name at least two studies; got {sources!r}")
    _check_folders(sources, out)
    check_out_path(out)
    loaded = [_load(s) for s in sources]
    for src, r in zip(sources, loaded, strict=True):
        check_same_code(r.get("environment"), f"source {src}", any_version=any_version)
    base = loaded[0]
    for src, r in zip(sources[1:], loaded[1:], strict=True):
        diff = sorted(
            k for k in set(base["config"]) | set(r["config"])
            if k not in _FREE + _RUNS
            and base["config"].get(k, _ABSENT.get(k)) != r["config"].get(k, _ABSENT.get(k))
        )  # fmt: skip
        if diff or set(r["datasets"]) != set(base["datasets"]):
            raise ValueError(
                f"sources must share their settings; {src} differs from {sources[0]} in "
                f"{diff or ['datasets']}"
            )
    every = list(dict.fromkeys(m for r in loaded for m in r["methods"]))
    methods = _kept(every, methods)
    merged = StudyResults(**base)
    merged["methods"], merged["datasets"] = methods, {}
    merged["merged_from"] = [str(s) for s in sources]
    merged.pop("config_hash", None)  # a merged study is pooled from its sources, not resumable
    seeds = sorted({int(seed) for r in loaded for seed in r["seeds"]})
    merged["seeds"] = seeds
    merged["config"] = dict(base["config"], methods=methods, out=str(out), seed=seeds[0],
                            seeds=len(seeds))  # fmt: skip
    # everything is merged and checked before the output folder is touched: a merge that
    # raises leaves --out as it was
    # in the study's own order (results.json is written with sorted keys)
    order = [d for d in base["config"].get("datasets") or () if d in base["datasets"]]
    order += sorted(set(base["datasets"]) - set(order))
    pooled = {d: _merge_dataset(d, loaded, methods) for d in order}
    out_dir = prepare_out_dir(out, force=True)
    foreign = begin_run(out_dir)
    try:
        for src, r in zip(sources, loaded, strict=True):  # the figures the sources wrote
            for name in r.get("files", []):
                if _copied(name, every, methods) and (Path(src) / name).is_file():
                    shutil.copyfile(Path(src) / name, register_output(out_dir, name))
        for dataset, new in pooled.items():
            new["figures"] = figures.dataset_figures(out_dir, dataset, new)
            merged["datasets"][dataset] = new
        merged["seconds"] = sum(r["seconds"] for r in loaded)
        merged.pop("files", None)
        merged["files"] = finish_run(out_dir, merged, report.render(merged), foreign)
    except BaseException:
        abandon_run(out_dir)  # --out as it was
        raise
    return merged


def _kept(every: list[str], methods: Sequence[str] | None) -> list[str]:
    """The methods a merge keeps: ``every`` source's, or those of them named in ``methods``."""
    if methods is None:
        return every
    if isinstance(methods, str) or not methods or any(m not in every for m in methods):
        raise ValueError(f"methods must name methods of the sources ({every}); got {methods!r}")
    return [m for m in every if m in methods]


def _merge_dataset(dataset: str, loaded: list[StudyResults], methods: list[str]) -> DatasetBlock:
    """One dataset's runs of every source, merged and pooled (no figures yet)."""
    base = loaded[0]
    block = base["datasets"][dataset]
    def kept(run: RunResult) -> RunResult:  # a copy with the merged methods only
        run = json.loads(json.dumps(run))
        run["methods"] = {m: row for m, row in run["methods"].items() if m in methods}
        return run

    runs = {_key(run): kept(run) for run in block["runs"]}
    for r in loaded[1:]:
        other = {_key(run): kept(run) for run in r["datasets"][dataset]["runs"]}
        for key, run in other.items():
            if key not in runs:  # a run of other seeds: joins as it is
                runs[key] = run
                continue
            mine = runs[key]
            for m, row in run["methods"].items():
                if m in mine["methods"]:
                    if without_times(mine["methods"][m]) != without_times(row):
                        raise ValueError(
                            f"method {m!r} differs between the sources on {dataset} pair "
                            f"{key[0]} seed {key[1]}: not the same settings or code"
                        )
                else:
                    mine["methods"][m] = row
            if not mine["ensemble_curve"]:
                mine["ensemble_curve"] = run["ensemble_curve"]
            mine["first_run"] = {**run.get("first_run", {}), **mine.get("first_run", {})}
    pair_order = {tuple(p): i for i, p in enumerate(base["pairs"])}
    ordered = [runs[k] for k in sorted(runs, key=lambda k: (pair_order.get(k[0], 1 << 30), k))]
    # a method that applies to none of this data set's runs (a method for words on images)
    methods = [m for m in methods if any(m in run["methods"] for run in ordered)]
    for run in ordered:
        missing = [m for m in methods if m not in run["methods"]]
        if missing:
            raise ValueError(
                f"every run must have every method; {dataset} pair {run['pair']} seed "
                f"{run['seed']} lacks {missing} (a study of new seeds must run the methods "
                "of the studies it joins)"
            )
    new = pool(ordered, methods)
    new["model"] = block["model"]
    new["seconds"] = sum(r["datasets"][dataset]["seconds"] for r in loaded)
    return new
