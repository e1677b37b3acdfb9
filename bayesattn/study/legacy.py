"""Method names of earlier releases, read under their current names (standard library only:
the docs scripts load this file by path).

A study's files keep the method names it ran under (the published ``studies/*/results.json`` are
never rewritten); every reader of results (a resumed study's run files, a merge's sources, the
results pages, the benchmark scripts) passes what it read through :func:`upgrade_results` (or
:func:`upgrade_run`), so old and new files pool, merge and compare under one name.
:data:`LEGACY_METHOD_NAMES` is the one map of renames. Only method names are renamed: the file
names a study wrote (``files``, the figures of ``first_run``) stay what they are on disk.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, TypeVar

__all__ = [
    "LEGACY_METHOD_NAMES",
    "current_method_name",
    "upgrade_config",
    "upgrade_run",
    "upgrade_block",
    "upgrade_results",
]

#: an old method name -> its current name (``recommended`` became ``last_layer`` when
#: ``AttentionConfig.recommended()`` became the plain softmax configuration)
LEGACY_METHOD_NAMES: Mapping[str, str] = MappingProxyType({"recommended": "last_layer"})

_T = TypeVar("_T")


def current_method_name(name: str) -> str:
    """``name``'s current name (``name`` itself unless it is a legacy name)."""
    return LEGACY_METHOD_NAMES.get(name, name)


def _keys(d: Mapping[str, _T], where: str) -> dict[str, _T]:
    """``d`` with its method-name keys current, in their order; an old and a new name of one
    method in the same mapping is a ``ValueError`` (the file is not one study's)."""
    out: dict[str, _T] = {}
    for k, v in d.items():
        new = current_method_name(k)
        if new in out:
            raise ValueError(f"{where} holds method {new!r} under two names (one is its old "
                             "name); a study's results name each method once")  # fmt: skip
        out[new] = v
    return out


def _names(names: Any) -> Any:
    if not isinstance(names, list):
        return names
    return [current_method_name(n) if isinstance(n, str) else n for n in names]


def upgrade_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a study configuration with its ``methods`` current."""
    out = copy.deepcopy(dict(config))
    if "methods" in out:
        out["methods"] = _names(out["methods"])
    return out


def _upgrade_run(run: dict[str, Any]) -> None:
    for key in ("methods", "first_run"):
        if isinstance(run.get(key), dict):
            run[key] = _keys(run[key], f"run {key!r}")


def upgrade_run(run: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of one run (:class:`~bayesattn.study.results.RunResult`) with current names."""
    out = copy.deepcopy(dict(run))
    _upgrade_run(out)
    return out


def _upgrade_block(block: dict[str, Any]) -> None:
    runs = block.get("runs")
    for run in runs if isinstance(runs, list) else []:
        if isinstance(run, dict):
            _upgrade_run(run)
    if isinstance(block.get("pooled"), dict):
        block["pooled"] = _keys(block["pooled"], "pooled")
    for key in ("paired", "per_pair"):  # baseline / pair -> method -> metrics
        if isinstance(block.get(key), dict):
            block[key] = {
                k: _keys(v, key) if isinstance(v, dict) else v for k, v in block[key].items()
            }
    if isinstance(block.get("paired"), dict):  # the baselines are methods too
        block["paired"] = _keys(block["paired"], "paired")
    wins = block.get("wins")
    for win in wins.values() if isinstance(wins, dict) else []:
        for role in ("method", "runner_up"):
            if isinstance(win, dict) and isinstance(win.get(role), str):
                win[role] = current_method_name(win[role])


def upgrade_block(block: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of one data set's block (:class:`~bayesattn.study.results.DatasetBlock`) with
    current names (its runs, pooled rows, paired differences, per-pair means and wins)."""
    out = copy.deepcopy(dict(block))
    _upgrade_block(out)
    return out


def upgrade_results(results: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a study's ``results.json`` with every method name current
    (:data:`LEGACY_METHOD_NAMES`); a file without legacy names comes back equal to itself."""
    out = copy.deepcopy(dict(results))
    if "methods" in out:
        out["methods"] = _names(out["methods"])
    if isinstance(out.get("config"), dict):
        out["config"] = upgrade_config(out["config"])
    datasets = out.get("datasets")
    for block in datasets.values() if isinstance(datasets, dict) else []:
        if isinstance(block, dict):
            _upgrade_block(block)
    return out
