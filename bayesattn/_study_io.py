"""The study's output folder: safe to name, complete or clearly incomplete, and only ever
cleaned of files a study run wrote.

**Which folder.** :func:`check_out_path` refuses an empty path, ``.``, the working folder or one
above it, the home folder or one above it, and the filesystem root: a study owns its folder.
:func:`prepare_out_dir` also refuses an existing folder that holds files but no study manifest
(it is someone else's), and a study folder unless ``force``.

**The manifest.** While a run is under way, ``INCOMPLETE`` lists (after its first line) every
file the run has written or is about to write (:func:`register_output`, called before each
write); a finished run lists them in ``results.json`` under ``"files"``. A rerun
(:func:`begin_run`, e.g. ``--force``) moves exactly the files those two lists name, never a
file by pattern, into ``.previous-run`` (other files in the folder are kept), removed when the
rerun finishes and put back by :func:`abandon_run` when it raises: a study step that raises
leaves the folder as it was; one that is killed leaves it clearly incomplete.

**Complete** ⇔ ``results.json`` exists (written last, atomically) and every file it lists exists;
otherwise the run is incomplete, and ``INCOMPLETE`` says so to a person looking at the folder.
:func:`study_status` applies that rule. Also the extra checks of ``StudyConfig``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ._validation import atomic_write_text, check_int, check_real

__all__ = [
    "INCOMPLETE",
    "RESULTS",
    "REPORT",
    "check_out_path",
    "prepare_out_dir",
    "is_study_folder",
    "manifest",
    "register_output",
    "begin_run",
    "finish_run",
    "abandon_run",
    "resume_run",
    "stop_run",
    "PREVIOUS",
    "study_status",
    "validate_study_config",
    "die_with_parent",
]

INCOMPLETE = "INCOMPLETE"
RESULTS = "results.json"
REPORT = "report.md"
_HEADER = (
    "A bayesattn study is running here, or was interrupted: the files in this folder are "
    "partial. A finished run has results.json and no INCOMPLETE file. Files of this run:"
)
#: the run's own temporary files (atomic writes): safe to remove by pattern
_TEMP_GLOBS = (f".{RESULTS}.*.tmp", f".{REPORT}.*.tmp", f".{INCOMPLETE}.*.tmp",
               ".study.json.*.tmp", ".run_*.json.*.tmp")  # fmt: skip


#: files a study keeps beside its results without listing them: a pretrained trunk
#: (``bayesattn.study.pretrained``), which a new study in the folder may reuse
_CACHE_GLOBS = (".pretrained-*",)


def _holds_files(out: Path) -> bool:
    """Whether ``out`` holds anything but the study's own temporary files (a study killed
    while writing its first file leaves only one: the folder is as good as empty) and cached
    trunks (copied in to be reused)."""
    return any(not any(p.match(g) for g in (*_TEMP_GLOBS, *_CACHE_GLOBS)) for p in out.iterdir())


def check_out_path(out: Any) -> Path:
    """``out`` as a path a study may own; ``ValueError`` for an empty path, ``.``, the working
    folder or a folder above it, the home folder or one above it, or the filesystem root."""
    if not isinstance(out, (str, Path)):
        raise TypeError(f"out must be a folder path (str); got {type(out).__name__}")
    text = str(out)
    if not text.strip():
        raise ValueError(
            "out must name a folder for the study; got an empty path (it would be the working "
            "folder)"
        )
    p = Path(text).expanduser().resolve()
    cwd, home = Path.cwd().resolve(), Path.home().resolve()
    unsafe = {
        Path(p.anchor): "the filesystem root",
        cwd: "the working folder",
        home: "the home folder",
    }
    what = unsafe.get(p)
    if what is None and p in cwd.parents:
        what = "a folder above the working folder"
    if what is None and p in home.parents:
        what = "a folder above the home folder"
    if what is not None:
        raise ValueError(
            f"refusing output folder {text!r} ({p}): it is {what}; give the study a folder of "
            "its own, e.g. --out bayesattn-study"
        )
    return Path(text).expanduser()


def manifest(out: Path) -> set[str] | None:
    """Names of files earlier study runs wrote in ``out`` (``results.json``'s ``"files"`` and an
    unfinished run's ``INCOMPLETE`` list); ``None`` if ``out`` holds no study manifest."""
    names: set[str] = set()
    found = False
    with contextlib.suppress(OSError, ValueError, TypeError, AttributeError):
        listed = json.loads((out / RESULTS).read_text()).get("files")
        if isinstance(listed, list):
            names |= {f for f in listed if isinstance(f, str)}
            found = True
    with contextlib.suppress(OSError, UnicodeDecodeError):
        lines = (out / INCOMPLETE).read_text().splitlines()
        found = True
        names |= {ln.strip() for ln in lines[1:] if ln.strip()}
    if not found:
        return None
    # only plain names inside the folder, never the folder's other files by a path trick
    return {n for n in names if n and "/" not in n and "\\" not in n and n not in (".", "..")}


def is_study_folder(out: Path) -> bool:
    """Whether ``out`` holds a study manifest (a finished or an unfinished run)."""
    return manifest(out) is not None


def prepare_out_dir(out: str | Path, force: bool = True) -> Path:
    """``out`` (checked by :func:`check_out_path`) as a folder that exists (created if needed).
    ``ValueError`` if it is a file or lies under one, cannot be created, holds files but no
    study manifest, or holds a study and ``force`` is false."""
    out = check_out_path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"output folder {str(out)!r} exists and is a file, not a folder")
    for p in out.parents:
        if p.exists():
            if not p.is_dir():
                raise ValueError(f"output folder {str(out)!r} lies under {str(p)!r}, a file")
            break
    if out.is_dir() and _holds_files(out):
        if not is_study_folder(out):
            raise ValueError(
                f"output folder {str(out)!r} holds files no study run wrote (no results.json or "
                "INCOMPLETE manifest); give an empty or a new folder"
            )
        if not force:
            raise ValueError(
                f"output folder {str(out)!r} holds a study ({study_status(out)}); pass --force "
                "to replace it (only the files its manifest lists are removed)"
            )
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"cannot create the output folder {str(out)!r}: {e}") from e
    return out


def _write_incomplete(out: Path, names: set[str], note: str = "") -> None:
    header = _HEADER
    if note:  # why the run stopped, on the header line (the names follow it)
        one_line = " ".join(note.split())[:300]
        header = _HEADER.replace(
            "Files of this run:", f"It stopped: {one_line}. Files of this run:"
        )
    atomic_write_text(out / INCOMPLETE, "\n".join([header, *sorted(names)]) + "\n")


def register_output(out: Path, name: str) -> Path:
    """Add ``name`` to the running study's manifest (``INCOMPLETE``) and return ``out / name``;
    call it before writing the file, so an interrupted run's files are still known."""
    if not name or "/" in name or "\\" in name:
        raise ValueError(f"study outputs are plain file names; got {name!r}")
    names = manifest(out) or set()
    if name not in names:
        _write_incomplete(out, names | {name})
    return out / name


#: the files of the run being replaced, kept until the new run finishes (restored if it raises)
PREVIOUS = ".previous-run"
#: folders with a run begun (and not finished or abandoned) in this process
_ACTIVE: set[Path] = set()


def _key(out: Any) -> Path | None:
    try:
        return Path(out).expanduser().resolve()
    except (TypeError, ValueError, OSError):
        return None


def begin_run(out: Path) -> frozenset[str]:
    """Mark ``out`` incomplete, then move the files of earlier runs its manifest lists (and its
    ``INCOMPLETE`` list) into ``out/.previous-run`` (so a rerun, e.g. ``--force``, leaves only
    the new run's files once it finishes, and :func:`abandon_run` can put them back if it
    raises). A ``.previous-run`` left by a killed run is discarded (that run was replacing it).
    Returns the names of the other files already there (not the study's; kept, and not listed
    as the run's)."""
    old = manifest(out) or set()
    prev = out / PREVIOUS
    shutil.rmtree(prev, ignore_errors=True)
    names = [RESULTS, REPORT, *sorted(f for f in old if f not in (INCOMPLETE, RESULTS, REPORT))]
    keep = [n for n in (INCOMPLETE, *names) if (out / n).is_file()]
    if keep:  # the run being replaced (finished, or the files of an unfinished one)
        prev.mkdir()
    if INCOMPLETE in keep:
        shutil.copyfile(out / INCOMPLETE, prev / INCOMPLETE)
    _write_incomplete(out, old)  # an interrupted clean-up still knows what to remove
    for name in names:  # results.json first: from here on, not complete
        with contextlib.suppress(FileNotFoundError, IsADirectoryError, NotADirectoryError):
            if (out / name).is_file():
                os.replace(out / name, prev / name)
    for g in _TEMP_GLOBS:
        for f in out.glob(g):
            with contextlib.suppress(FileNotFoundError, IsADirectoryError):
                f.unlink()
    _write_incomplete(out, set())
    key = _key(out)
    if key is not None:
        _ACTIVE.add(key)
    return frozenset(p.name for p in out.iterdir() if p.name not in (INCOMPLETE, PREVIOUS))


def resume_run(out: Path) -> frozenset[str]:
    """Continue the study in ``out``: mark it incomplete (``INCOMPLETE`` lists every file of its
    manifest) and remove its ``results.json`` (written again when it finishes); every other file
    is kept (its finished runs). A ``.previous-run`` left by a killed replacement is discarded.
    Returns the names of the other files there (not the study's; kept, not listed)."""
    old = manifest(out) or set()
    foreign = frozenset(
        p.name for p in out.iterdir() if p.name not in old | {INCOMPLETE, PREVIOUS, RESULTS}
    )
    _write_incomplete(out, old - {RESULTS})
    with contextlib.suppress(FileNotFoundError):
        (out / RESULTS).unlink()
    shutil.rmtree(out / PREVIOUS, ignore_errors=True)
    key = _key(out)
    if key is not None:
        _ACTIVE.add(key)
    return foreign


def stop_run(out: Path, reason: str) -> None:
    """A run of this process that raised (or was interrupted) but keeps what it finished: the
    folder stays incomplete, ``INCOMPLETE``'s first line says why it stopped, and the files of a
    run it was replacing (``.previous-run``) are removed; rerunning the study resumes it."""
    key = _key(out)
    if key is not None:
        _ACTIVE.discard(key)
    with contextlib.suppress(OSError):
        _write_incomplete(out, manifest(out) or set(), note=reason)
    shutil.rmtree(out / PREVIOUS, ignore_errors=True)


def abandon_run(out: Any) -> None:
    """Undo a run of this process that raised after :func:`begin_run`: remove the files it
    wrote (its ``INCOMPLETE`` list) and put back those of the run it was replacing, so the folder
    is as it was before. Nothing happens for a folder without a begun run."""
    key = _key(out)
    if key is None or key not in _ACTIVE:
        return
    _ACTIVE.discard(key)
    folder = Path(out).expanduser()
    written = manifest(folder) or set()
    for name in written | {RESULTS, REPORT}:
        with contextlib.suppress(FileNotFoundError, IsADirectoryError):
            (folder / name).unlink()
    prev = folder / PREVIOUS
    restored_incomplete = False
    if prev.is_dir():
        for f in prev.iterdir():
            if f.name == INCOMPLETE:
                restored_incomplete = True
            os.replace(f, folder / f.name)
        shutil.rmtree(prev, ignore_errors=True)
    if not restored_incomplete:
        with contextlib.suppress(FileNotFoundError):
            (folder / INCOMPLETE).unlink()


def finish_run(
    out: Path, results: Mapping[str, Any], report: str, foreign: frozenset[str] = frozenset()
) -> list[str]:
    """Write ``report.md``, then ``results.json`` (last, with ``files``: every file of the run,
    those in the folder but not in ``foreign``), both atomically; then remove ``INCOMPLETE`` and
    the replaced run's files (``.previous-run``). Returns ``files``."""
    register_output(out, REPORT)
    atomic_write_text(out / REPORT, report)
    files = sorted(
        p.name
        for p in out.iterdir()
        if p.is_file()
        and p.name not in (INCOMPLETE, RESULTS, *foreign)
        and not p.name.startswith(".")
    )
    listed = [*files, RESULTS]
    atomic_write_text(
        out / RESULTS, json.dumps({**results, "files": listed}, indent=2, sort_keys=True)
    )
    with contextlib.suppress(FileNotFoundError):
        (out / INCOMPLETE).unlink()
    shutil.rmtree(out / PREVIOUS, ignore_errors=True)
    key = _key(out)
    if key is not None:
        _ACTIVE.discard(key)
    return listed


def study_status(out: str | Path) -> str:
    """``"complete"`` (``results.json`` loads and every file it lists exists), ``"incomplete"``
    (anything else in the folder) or ``"missing"`` (no folder or an empty one)."""
    out = Path(out)
    if not out.is_dir() or not _holds_files(out):
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
    for name in ("epochs", "batch_size", "d_model", "nhead", "num_layers", "dim_feedforward"):
        check_int(name, getattr(cfg, name), 1, allow_none=True)
    for name in ("num_samples", "ensemble_size", "arviz_examples"):
        check_int(name, getattr(cfg, name), 1)
    for name in ("seed", "kl_anneal_epochs", "rotation_seed"):
        check_int(name, getattr(cfg, name), 0)
    if cfg.d_model is not None and cfg.nhead is not None and cfg.d_model % cfg.nhead:
        raise ValueError(
            f"d_model must be divisible by nhead; got d_model={cfg.d_model}, nhead={cfg.nhead}"
        )
    if cfg.lr is not None:
        check_real("lr", cfg.lr, gt=0.0)
    check_real("kl_weight", cfg.kl_weight, gt=0.0, le=1.0)
    check_real("dropout", cfg.dropout, ge=0.0, lt=1.0)
    if isinstance(cfg.severities, (str, bytes)) or not len(cfg.severities):
        raise ValueError(f"severities must be a non-empty list in 1..5; got {cfg.severities!r}")
    for s in cfg.severities:
        check_int("severities[i]", s, 1, 5)
    for name in ("progress", "geometry", "figures", "smoke"):
        if not isinstance(getattr(cfg, name), bool):
            raise TypeError(f"{name} must be a bool; got {getattr(cfg, name)!r}")
    if not isinstance(cfg.extra, dict):
        raise TypeError(f"extra must be a dict; got {cfg.extra!r}")


def die_with_parent(parent_pid: int) -> None:
    """Make this (worker) process die when ``parent_pid`` does, even by SIGKILL: the kernel's
    parent-death signal where Linux offers it, and a watchdog thread that polls the parent (any
    POSIX). Called as a worker pool's ``initializer``: a study's workers never outlive it."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            pr_set_pdeathsig = 1
            libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:  # the parent died before the signal was armed
        os._exit(1)

    def watch() -> None:
        while True:
            time.sleep(0.5)
            if os.getppid() != parent_pid:
                os._exit(1)

    threading.Thread(target=watch, name="bayesattn-parent-watch", daemon=True).start()
