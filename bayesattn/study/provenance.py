"""Which code made a result: the versions of bayesattn (and its git commit, where the package
runs from a git checkout), torch, Pyro, transformers and Python, recorded in ``results.json``
and in every run file; :func:`check_same_code` refuses results of other code."""

from __future__ import annotations

import functools
import platform
import subprocess
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = ["versions", "check_same_code", "CODE_KEYS"]

#: what must agree for two results to come from the same code
CODE_KEYS = ("bayesattn", "commit")


def _dist_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _git_commit(folder: Path) -> tuple[str | None, bool | None]:
    """``(HEAD commit, whether tracked files differ from it)`` of the checkout holding
    ``folder``; ``(None, None)`` outside a git checkout (an installed wheel)."""
    try:
        head = subprocess.run(["git", "-C", str(folder), "rev-parse", "HEAD"], capture_output=True,
                              text=True, timeout=10, check=True).stdout.strip()  # fmt: skip
        dirty = subprocess.run(["git", "-C", str(folder), "status", "--porcelain",
                                "--untracked-files=no"], capture_output=True, text=True,
                               timeout=10, check=True).stdout.strip()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None, None
    return head or None, bool(dirty)


@functools.lru_cache(maxsize=1)
def versions() -> dict[str, Any]:
    """``{"bayesattn", "commit", "dirty", "torch", "pyro", "transformers", "python"}`` of this
    process (cached: a process runs one code). ``commit``/``dirty`` are ``None`` outside a git
    checkout; a package that is not installed is ``None``."""
    import torch

    from .. import __version__

    commit, dirty = _git_commit(Path(__file__).resolve().parent)
    return {
        "bayesattn": __version__,
        "commit": commit,
        "dirty": dirty,
        "torch": torch.__version__,
        "pyro": _dist_version("pyro-ppl"),
        "transformers": _dist_version("transformers"),
        "python": platform.python_version(),
    }


def check_same_code(found: Mapping[str, Any] | None, where: str, *, any_version: bool) -> None:
    """``ValueError`` (naming ``where`` and what differs) unless ``found`` (a result's recorded
    versions; ``None``: recorded none) came from this code: the same bayesattn version and git
    commit. ``any_version=True`` accepts any (``--any-version``)."""
    if any_version:
        return
    mine = versions()
    found = found or {}
    differ = {k: (found.get(k), mine[k]) for k in CODE_KEYS if found.get(k) != mine[k]}
    if differ:
        what = ", ".join(f"{k} {a!r} (this code: {b!r})" for k, (a, b) in differ.items())
        raise ValueError(
            f"{where} was made by other code: {what}; rerun it with this code, or pass "
            "--any-version (any_version=True) to accept it"
        )
