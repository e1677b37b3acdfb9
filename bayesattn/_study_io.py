"""The study's output folder: complete or clearly incomplete, never something that looks finished.

A run (:func:`begin_run`) first removes the previous run's outputs (``results.json``,
``report.md``, the ``*.png`` figures and ``*.nc`` ArviZ files, stale temporary files) and writes
``INCOMPLETE``; it ends (:func:`finish_run`) by writing ``report.md`` and then ``results.json``
atomically (temporary file + ``os.replace``) and removing ``INCOMPLETE``. So:

* **complete** ⇔ ``results.json`` exists (it is written last, lists every file of the run under
  ``"files"``, and each of them exists);
* otherwise the run is incomplete, and ``INCOMPLETE`` says so to a person looking at the folder.

:func:`study_status` applies that rule. Also the extra checks of ``StudyConfig``.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

from ._validation import atomic_write_text, check_int, check_real

__all__ = [
    "INCOMPLETE",
    "RESULTS",
    "REPORT",
    "prepare_out_dir",
    "begin_run",
    "finish_run",
    "study_status",
    "validate_study_config",
]

INCOMPLETE = "INCOMPLETE"
RESULTS = "results.json"
REPORT = "report.md"
_OUTPUT_GLOBS = ("*.png", "*.nc", f".{RESULTS}.*.tmp", f".{REPORT}.*.tmp")


def prepare_out_dir(out: str | Path) -> Path:
    """``out`` as a folder that exists (created if needed); ``ValueError`` if it is a file or
    lies under one, or cannot be created."""
    if not isinstance(out, (str, Path)):
        raise TypeError(f"out must be a folder path (str); got {type(out).__name__}")
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"output folder {str(out)!r} exists and is a file, not a folder")
    for p in out.parents:
        if p.exists():
            if not p.is_dir():
                raise ValueError(f"output folder {str(out)!r} lies under {str(p)!r}, a file")
            break
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"cannot create the output folder {str(out)!r}: {e}") from e
    return out


def begin_run(out: Path) -> frozenset[str]:
    """Mark ``out`` incomplete, then remove the previous run's outputs (so a rerun, e.g.
    ``--force``, leaves only the new run's files). Returns the names of the other files already
    there (not the study's; kept, and not listed as the run's)."""
    atomic_write_text(
        out / INCOMPLETE,
        "A bayesattn study is running here, or was interrupted: the files in this folder are "
        "partial. A finished run has results.json and no INCOMPLETE file.\n",
    )
    old: list[str] = []
    with contextlib.suppress(OSError, ValueError, TypeError, AttributeError):
        old = list(json.loads((out / RESULTS).read_text()).get("files", []))
    victims = {out / RESULTS, out / REPORT}
    victims |= {out / f for f in old if isinstance(f, str) and "/" not in f and f != INCOMPLETE}
    for g in _OUTPUT_GLOBS:
        victims |= set(out.glob(g))
    for f in [out / RESULTS, *victims]:  # results.json first: from here on, not complete
        with contextlib.suppress(FileNotFoundError, IsADirectoryError):
            f.unlink()
    return frozenset(p.name for p in out.iterdir() if p.name != INCOMPLETE)


def finish_run(
    out: Path, results: dict[str, Any], report: str, foreign: frozenset[str] = frozenset()
) -> None:
    """Write ``report.md``, then ``results.json`` (last, listing every file of the run: those in
    the folder but not in ``foreign``), both atomically; then remove ``INCOMPLETE``."""
    atomic_write_text(out / REPORT, report)
    files = sorted(
        p.name
        for p in out.iterdir()
        if p.is_file()
        and p.name not in (INCOMPLETE, RESULTS, *foreign)
        and not p.name.startswith(".")
    )
    results["files"] = [*files, RESULTS]
    atomic_write_text(out / RESULTS, json.dumps(results, indent=2, sort_keys=True))
    with contextlib.suppress(FileNotFoundError):
        (out / INCOMPLETE).unlink()


def study_status(out: str | Path) -> str:
    """``"complete"`` (``results.json`` loads and every file it lists exists), ``"incomplete"``
    (anything else in the folder) or ``"missing"`` (no folder or an empty one)."""
    out = Path(out)
    if not out.is_dir() or not any(out.iterdir()):
        return "missing"
    try:
        res = json.loads((out / RESULTS).read_text())
    except (OSError, ValueError):
        return "incomplete"
    files = res.get("files") if isinstance(res, dict) else None
    if not isinstance(files, list) or not all((out / f).is_file() for f in files):
        return "incomplete"
    return "complete"


def validate_study_config(cfg: Any) -> None:
    """Checks of ``StudyConfig`` fields beyond its own (each error names the field)."""
    if not isinstance(cfg.out, (str, Path)):
        raise TypeError(f"out must be a folder path (str); got {cfg.out!r}")
    if isinstance(cfg.methods, str):
        raise TypeError(f"methods must be a list of method names; got the string {cfg.methods!r}")
    for name in ("epochs", "num_samples", "ensemble_size", "batch_size", "d_model", "nhead",
                 "num_layers", "dim_feedforward", "arviz_examples"):
        check_int(name, getattr(cfg, name), 1)
    for name in ("seed", "kl_anneal_epochs"):
        check_int(name, getattr(cfg, name), 0)
    if cfg.d_model % cfg.nhead:
        raise ValueError(
            f"d_model must be divisible by nhead; got d_model={cfg.d_model}, nhead={cfg.nhead}"
        )
    check_real("lr", cfg.lr, gt=0.0)
    check_real("kl_weight", cfg.kl_weight, gt=0.0, le=1.0)
    check_real("dropout", cfg.dropout, ge=0.0, lt=1.0)
    if isinstance(cfg.severities, (str, bytes)) or not len(cfg.severities):
        raise ValueError(f"severities must be a non-empty list in 1..5; got {cfg.severities!r}")
    for s in cfg.severities:
        check_int("severities[i]", s, 1, 5)
    if not isinstance(cfg.progress, bool):
        raise TypeError(f"progress must be a bool; got {cfg.progress!r}")
    if not isinstance(cfg.extra, dict):
        raise TypeError(f"extra must be a dict; got {cfg.extra!r}")
