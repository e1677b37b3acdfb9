"""Old names in saved files (see ``docs/glossary.md``).

The 0.3 spellings of the API were removed in 0.4 (migration table in ``CHANGELOG.md``). What stays
for good is reading files written before 0.3, silently (the file, not the caller, holds the old
name):

* :func:`renamed_state_keys` / :func:`renamed_submodule_hook` — ``state_dict`` keys saved under an
  old submodule name read as the new one.

Names that moved in a release keep working for one more with a ``DeprecationWarning``:
:func:`moved_names` (a module's ``__getattr__`` with a table of replacements),
:func:`moved_module` (the same for names that moved unchanged to one new module) and
:func:`deprecated` (a call's warning).
"""

from __future__ import annotations

import functools
import importlib
import re
import warnings
from collections.abc import Callable
from types import ModuleType
from typing import Any

__all__ = [
    "deprecated",
    "moved_module",
    "moved_names",
    "renamed_state_keys",
    "renamed_submodule_hook",
]


def renamed_state_keys(
    keys: Any, old: str, new: str, known: Any = None
) -> dict[str, str]:
    """``{old_key: new_key}`` for the keys with a path component ``old`` (``a.old.b`` →
    ``a.new.b``, and Pyro's parameter names ``a.old$$$b``); with ``known`` (the new keys that
    exist), only those that land in it."""
    pat = re.compile(rf"(^|\.){re.escape(old)}(?=\.|\$\$\$)")
    out = {}
    for k in keys:
        if isinstance(k, str) and pat.search(k):
            nk = pat.sub(lambda m: f"{m.group(1)}{new}", k)
            if known is None or (nk in known and k not in known):
                out[k] = nk
    return out


def _rename_submodule_keys(
    old: str, new: str, module: Any, state_dict: Any, prefix: str, *args: Any
) -> None:
    """The hook of :func:`renamed_submodule_hook` (top level, so modules holding it pickle)."""
    head, to = f"{prefix}{old}.", f"{prefix}{new}."
    for k in [k for k in state_dict if isinstance(k, str) and k.startswith(head)]:
        nk = to + k[len(head) :]
        if nk not in state_dict:
            state_dict[nk] = state_dict.pop(k)


def renamed_submodule_hook(old: str, new: str) -> Callable[..., None]:
    """A ``register_load_state_dict_pre_hook`` hook: keys ``<prefix><old>.*`` of the
    ``state_dict`` being loaded are read as ``<prefix><new>.*`` (a submodule renamed).

    A ``functools.partial`` of a top-level function, not a closure: a module that registered
    it can still be pickled (``torch.save(model)``, ``torch.multiprocessing`` spawn, DDP).
    """
    return functools.partial(_rename_submodule_keys, old, new)


def moved_names(module: str, table: dict[str, tuple[str, str, str]]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for names that moved (kept one release): ``table`` maps an old
    name to ``(new module, new name, what to use instead)``; looking the old name up gives the
    new object with a ``DeprecationWarning`` naming the replacement."""

    def __getattr__(name: str) -> Any:
        if name not in table:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        where, attr, instead = table[name]
        warnings.warn(
            f"{module}.{name} is deprecated and will be removed in the next release; use "
            f"{instead} (see the migration table in docs/posthoc-reads.md)",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(where), attr)

    return __getattr__


def deprecated(name: str, instead: str) -> None:
    """Warn that ``name`` (a function or class kept one release) is deprecated."""
    warnings.warn(
        f"{name} is deprecated and will be removed in the next release; use {instead} (see "
        "the migration table in docs/posthoc-reads.md)",
        DeprecationWarning,
        stacklevel=3,
    )


def moved_module(old: str, new: ModuleType, names: Any) -> Callable[[str], Any]:
    """The module ``__getattr__`` (PEP 562) of ``old``, a module whose ``names`` moved to
    ``new``: ``old.<name>`` warns with a ``DeprecationWarning`` naming the new path and returns
    ``new.<name>``; any other name is an ``AttributeError``."""
    moved = frozenset(names)

    def __getattr__(name: str) -> Any:
        if name not in moved:
            raise AttributeError(f"module {old!r} has no attribute {name!r}")
        warnings.warn(
            f"{old}.{name} moved to {new.__name__}.{name}; the old path is deprecated and will be "
            "removed in the next release",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(new, name)

    return __getattr__

