"""Old names in saved files, and the last 0.3 deprecation shims (see ``docs/glossary.md``).

The 0.3 spellings of the API were removed in 0.4 (migration table in ``CHANGELOG.md``). What stays
for good is reading files written before 0.3, silently (the file, not the caller, holds the old
name):

* :func:`renamed_state_keys` / :func:`renamed_submodule_hook` — ``state_dict`` keys saved under an
  old submodule name read as the new one.

Still used by the training entry points (``bayesattn.training``, ``bayesattn.lightning``,
``bayesattn.inference``) until their 0.3 spellings go too; then these four go with them:

* :func:`warn_renamed` — the :class:`DeprecationWarning` naming the new spelling;
* :func:`renamed_kwargs` — a decorator accepting old keyword-argument names;
* :func:`module_getattr` — a module ``__getattr__`` serving old attribute names;
* :func:`renamed_attribute` — a property serving an old attribute name.
"""

from __future__ import annotations

import functools
import importlib
import re
import warnings
from collections.abc import Callable, Mapping
from typing import Any, TypeVar, cast

__all__ = [
    "warn_renamed",
    "renamed_kwargs",
    "module_getattr",
    "renamed_attribute",
    "renamed_state_keys",
    "renamed_submodule_hook",
]

F = TypeVar("F", bound=Callable[..., Any])

#: the release in which the deprecated spellings go away
REMOVED_IN = "0.4"


def warn_renamed(old: str, new: str, kind: str, stacklevel: int = 3) -> None:
    """Emit the one ``DeprecationWarning`` of this library: ``old`` is now ``new``."""
    warnings.warn(
        f"{kind} {old!r} is deprecated and will be removed in bayesattn {REMOVED_IN}; "
        f"use {new!r} instead (see docs/glossary.md)",
        DeprecationWarning,
        stacklevel=stacklevel,
    )


def renamed_kwargs(**renames: str) -> Callable[[F], F]:
    """Decorator: ``@renamed_kwargs(old_name="new_name")`` accepts ``old_name=`` with a warning.

    Passing both spellings is a ``TypeError``.
    """

    def deco(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            for old, new in renames.items():
                if old in kwargs:
                    if new in kwargs:
                        raise TypeError(
                            f"{fn.__qualname__}() got both {old!r} (deprecated) and {new!r}"
                        )
                    warn_renamed(f"{old}=", f"{new}=", "keyword argument")
                    kwargs[new] = kwargs.pop(old)
            return fn(*args, **kwargs)

        return cast(F, wrapper)  # functools.wraps keeps fn's signature

    return deco


def module_getattr(
    module: str, renames: Mapping[str, tuple[str, str]], kind: str = "name"
) -> Callable[[str], Any]:
    """A module-level ``__getattr__`` serving ``old`` as ``renames[old] = (new_module, new)``."""

    def __getattr__(name: str) -> Any:
        if name in renames:
            where, new = renames[name]
            obj = getattr(importlib.import_module(where), new)
            warn_renamed(f"{module}.{name}", f"{where}.{new}", kind)
            return obj
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__


def renamed_attribute(old: str, new: str, owner: str) -> property:
    """A property ``old`` that reads and writes attribute ``new`` with a warning."""

    def fget(self: Any) -> Any:
        warn_renamed(f"{owner}.{old}", new, "attribute")
        return getattr(self, new)

    def fset(self: Any, value: Any) -> None:
        warn_renamed(f"{owner}.{old}", new, "attribute")
        setattr(self, new, value)

    return property(fget, fset, doc=f"Deprecated spelling of ``{new}``.")


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
