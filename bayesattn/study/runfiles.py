"""A study's runs on disk, one file each, so that a study can stop at any moment and resume.

The folder of a study holds ``study.json`` (its configuration, the configuration's hash and the
versions of the code, written first) and one ``run_<dataset>_<pair>_seed<seed>.json`` per finished
run (its :class:`~bayesattn.study.results.RunResult`, the configuration hash and the versions of
the code that ran it), each written atomically the moment the run finishes. ``results.json`` and
``report.md`` are pooled from the run files, so a study that was stopped and resumed writes the
same results as one that was not (times aside).

**Resuming** (:func:`plan_study`): the same configuration in a folder that holds a study of it
continues it (finished runs are read, not redone); another configuration is refused unless
``force`` (which replaces the study, manifest files only); a study of other code (bayesattn version
or git commit) is refused unless ``any_version``. What may differ between the runs of one study
(:data:`FREE`: the output folder, the progress bar, how many workers) is not hashed."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from .._study_io import RESULTS, is_study_folder, prepare_out_dir
from .._validation import atomic_write_text
from .legacy import upgrade_config, upgrade_run
from .provenance import check_same_code, versions
from .results import RunResult

__all__ = [
    "STUDY_FILE",
    "FREE",
    "config_hash",
    "run_file_name",
    "StudyPlan",
    "plan_study",
    "write_study_file",
    "write_run_file",
    "read_run_file",
]

#: the configuration, its hash and the code's versions of the study in a folder
STUDY_FILE = "study.json"
#: configuration fields that do not change a run's numbers (not hashed)
FREE = ("out", "progress", "jobs")


def config_hash(config: Mapping[str, Any]) -> str:
    """SHA-256 of the configuration's JSON (sorted keys), without the :data:`FREE` fields."""
    kept = {k: v for k, v in config.items() if k not in FREE}
    return hashlib.sha256(json.dumps(kept, sort_keys=True).encode()).hexdigest()


def run_file_name(dataset: str, pair: Sequence[int], seed: int) -> str:
    """``run_<dataset>_<a>-<b>_seed<seed>.json``: the file of one run."""
    return f"run_{dataset}_{'-'.join(map(str, pair))}_seed{seed}.json"


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return None


@dataclass(frozen=True)
class StudyPlan:
    """What a study does with its folder: ``resume`` a study of the same configuration (its
    finished runs are kept) or start a new one (replacing, with ``force``, a study there)."""

    out: Path
    config_hash: str
    resume: bool


def _differences(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    return sorted(k for k in set(a) | set(b) if k not in FREE and a.get(k) != b.get(k))


def _same_study(info: Mapping[str, Any], h: str) -> bool:
    """Whether ``study.json`` (``info``) records a study of the configuration hashed ``h``: the
    same hash, or a study from before a method's rename whose configuration, with current
    method names (:mod:`.legacy`), hashes to ``h`` (it goes on under its recorded hash)."""
    if info.get("config_hash") == h:
        return True
    config = info.get("config")
    return (
        isinstance(config, dict)
        and info.get("config_hash") == config_hash(config)
        and config_hash(upgrade_config(config)) == h
    )


def plan_study(
    config: Mapping[str, Any], *, force: bool = False, any_version: bool = False
) -> StudyPlan:
    """Decide, before anything is written, what a study of ``config`` does with its folder
    (``config["out"]``): a ``ValueError`` for a folder that is not a study's (or an unsafe
    path), for a study of another configuration (unless ``force``) and for a study of other code
    (unless ``any_version``)."""
    out = prepare_out_dir(config["out"], force=True)  # path safety; someone else's folder
    h = config_hash(config)
    info = _read_json(out / STUDY_FILE)
    if not isinstance(info, dict) or not is_study_folder(out):
        info = None
    if info is not None and _same_study(info, h) and not force:
        check_same_code(info.get("versions"), f"the study in {out}", any_version=any_version)
        return StudyPlan(out, str(info["config_hash"]), resume=True)
    finished = (out / RESULTS).is_file()
    if not force and (info is not None or finished):
        theirs = info.get("config") if info is not None else None
        if theirs is None:
            old = _read_json(out / RESULTS)
            theirs = old.get("config") if isinstance(old, dict) else None
        diff = (
            _differences(upgrade_config(theirs), config)
            if isinstance(theirs, dict)
            else ["(not recorded)"]
        )
        raise ValueError(
            f"output folder {str(out)!r} holds a study of another configuration (it differs in "
            f"{diff}); rerun with its settings to resume it, pass --force (force=True) to "
            "replace it (only the files its manifest lists are removed), or give another --out"
        )
    return StudyPlan(out, h, resume=False)


def write_study_file(out: Path, config: Mapping[str, Any], h: str) -> None:
    """``study.json``: the configuration, its hash and this code's versions (atomically; the
    caller registered it in the manifest)."""
    payload = {"config": dict(config), "config_hash": h, "versions": versions()}
    atomic_write_text(out / STUDY_FILE, json.dumps(payload, indent=2, sort_keys=True))


def write_run_file(out: Path, run: RunResult, h: str, code: Mapping[str, Any]) -> Path:
    """One finished run's file, atomically (the caller registered its name): the run, the
    configuration hash and ``code``, the versions of the process that ran it."""
    path = out / run_file_name(run["dataset"], run["pair"], run["seed"])
    payload = {"config_hash": h, "versions": dict(code), "run": run}
    atomic_write_text(path, json.dumps(payload, indent=1, sort_keys=True))
    return path


def read_run_file(out: Path, name: str, h: str, *, any_version: bool) -> RunResult | None:
    """The run in ``out/name``, or ``None`` when there is none (not yet run, or a file a kill
    cut short: atomic writes make that a missing file). ``ValueError`` for a run of another
    configuration or (unless ``any_version``) of other code."""
    path = out / name
    if not path.is_file():
        return None
    payload = _read_json(path)
    if not isinstance(payload, dict) or not isinstance(payload.get("run"), dict):
        raise ValueError(f"run file {path} is not a study's run file; remove it or pass --force")
    if payload.get("config_hash") != h:
        raise ValueError(
            f"run file {path} was made with another configuration (hash "
            f"{str(payload.get('config_hash'))[:12]}…, this study's {h[:12]}…); pass --force to "
            "replace the study"
        )
    check_same_code(payload.get("versions"), f"run file {path}", any_version=any_version)
    return cast(RunResult, upgrade_run(payload["run"]))  # a run from before a rename: current names
