r"""One registry pattern for every extension point (as in timm): name → entry.

A :class:`Registry` maps names to *factories* (a class or a function) that build one sort of
object, or, with ``instances=True``, to ready objects. The library has four:

======================================  ========================  ==================================
registry                                an entry builds           add one with
======================================  ========================  ==================================
:data:`bayesattn.families.FAMILIES`     an ``AttentionFamily``    :func:`bayesattn.register_family`
:data:`bayesattn.priors.PRIORS`         a ``KeyRelevancePrior``   :func:`bayesattn.register_prior`
:data:`bayesattn.nn.supports.SUPPORTS`  a reduced key support     :func:`bayesattn.register_support`
``bayesattn.study.methods``             (is a ``Method`` object)  ``bayesattn.study.register_method``
======================================  ========================  ==================================

Everything that takes one of these by name (:class:`~bayesattn.nn.blocks.AttentionConfig`, the
layers, :func:`~bayesattn.families.get_family`, the study) looks the name up in its registry, so a
class registered under a name works wherever a built-in name does::

    @register_family("my_family")
    class MyFamily(AttentionFamily): ...

    VisionTransformer(..., attention=AttentionConfig(family="my_family"))

Registrations are process-wide: register before you build (or load) a network that names them.
A name is an identifier, registered once (``override=True`` replaces an entry on purpose); an
unknown name is a ``ValueError`` that lists the registered names.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar, overload

__all__ = ["Registry"]

E = TypeVar("E")  # an entry: a factory, or (instances=True) a ready object
F = TypeVar("F")  # what register's decorator receives and returns (an entry)
R = TypeVar("R")  # what a factory builds


class Registry(Generic[E]):
    """Named entries of one sort (the registry's ``noun``).

    Args:
        noun: what an entry is, singular (``"family"``); errors name it.
        base: the class every product (factory mode) or entry (``instances=True``) must be an
            instance of; a class entry must subclass it.
        instances: entries are ready ``base`` objects, not factories (the study's methods).
        register_with: the public function that adds an entry, quoted in errors.
        reserved: names the caller handles itself (``"dense"`` for supports): never registrable.
        required: methods a class entry must override from ``base`` (its extension points): a
            class that implements none of them is refused at registration, not at first use.
    """

    def __init__(
        self,
        noun: str,
        base: type,
        *,
        instances: bool = False,
        register_with: str = "",
        reserved: tuple[str, ...] = (),
        required: tuple[str, ...] = (),
    ) -> None:
        self.noun = noun
        self.required = tuple(required)
        self.plural = noun[:-1] + "ies" if noun.endswith("y") else noun + "s"
        self.base = base
        self.instances = instances
        self.register_with = register_with or f"Registry({noun!r}).register"
        self._entries: dict[str, E] = {}
        self.reserved = tuple(reserved)

    # adding and removing ------------------------------------------------------------------
    @overload
    def register(
        self, name: str, entry: None = None, *, override: bool = False
    ) -> Callable[[F], F]: ...

    @overload
    def register(self, name: str, entry: F, *, override: bool = False) -> F: ...

    def register(self, name: str, entry: Any = None, *, override: bool = False) -> Any:
        """Add ``entry`` under ``name``; without ``entry``, a decorator that adds what it decorates.

        A name already taken is a ``ValueError`` unless ``override=True`` (which replaces it)."""
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"a {self.noun} name must be an identifier string; got {name!r}")
        if name in self.reserved:
            raise ValueError(
                f"the {self.noun} name {name!r} is built in and cannot be registered or "
                f"overridden (reserved: {list(self.reserved)}); choose another name"
            )
        if entry is None:
            return lambda e: self.register(name, e, override=override)
        self._check_entry(name, entry)
        if name in self._entries and not override:
            raise ValueError(
                f"a {self.noun} named {name!r} is already registered ({self._entries[name]!r}); "
                "pass override=True to replace it"
            )
        self._entries[name] = entry
        return entry

    def _check_entry(self, name: str, entry: Any) -> None:
        base = self.base.__name__
        if self.instances:
            if not isinstance(entry, self.base):
                raise TypeError(f"{self.noun} {name!r} must be a {base}; got {entry!r}")
        elif isinstance(entry, type):
            if not issubclass(entry, self.base):
                raise TypeError(
                    f"{self.noun} {name!r}: the class {entry.__name__} does not subclass {base}"
                )
            missing = [m for m in self.required if getattr(entry, m) is getattr(self.base, m)]
            if missing:
                raise TypeError(
                    f"{self.noun} {name!r}: the class {entry.__name__} does not implement "
                    f"{', '.join(missing)} (the extension points of {base} it must override)"
                )
        elif isinstance(entry, self.base) or not callable(entry):
            raise TypeError(
                f"{self.noun} {name!r} must be a {base} subclass or a function returning a "
                f"{base} (register the class, not an instance); got {entry!r}"
            )

    def unregister(self, name: str, *, missing_ok: bool = False) -> E | None:
        """Remove ``name`` and return its entry (``None`` if absent and ``missing_ok``)."""
        if missing_ok and name not in self._entries:
            return None
        entry = self.get(name)
        del self._entries[name]
        return entry

    # looking up ----------------------------------------------------------------------------
    def get(self, name: str, *, argument: str | None = None, also: tuple[str, ...] = ()) -> E:
        """The entry called ``name``. An unknown name is a ``ValueError`` naming ``argument``
        (default: the noun) and listing the registered names (and ``also``: names the caller
        handles itself, such as ``"dense"`` for no support)."""
        if not isinstance(name, str):
            raise TypeError(f"{argument or self.noun} must be a {self.noun} name; got {name!r}")
        if name not in self._entries:
            raise ValueError(
                f"unknown {self.noun} {name!r}; {argument or self.noun} must be one of the "
                f"registered {self.plural} {[*also, *self._entries]} (add one with "
                f"{self.register_with})"
            )
        return self._entries[name]

    def create(self: Registry[Callable[..., R]], name: str, /, **kwargs: Any) -> R:
        """``get(name)(**kwargs)``, checked to be an instance of ``base``."""
        obj = self.get(name)(**kwargs)
        if not isinstance(obj, self.base):
            raise TypeError(
                f"{self.noun} {name!r} built a {type(obj).__name__}, not a {self.base.__name__}"
            )
        return obj

    def arguments(self, name: str) -> tuple[str, ...] | None:
        """The keyword arguments the factory ``name`` takes, in order (``None``: it takes any
        keyword, ``**kwargs``)."""
        factory: Any = self.get(name)
        if isinstance(factory, type):
            owner = next(c for c in factory.__mro__ if "__init__" in c.__dict__)
            if owner is not self.base and issubclass(self.base, owner):
                return ()  # the constructor is inherited from above base (nn.Module's): none
        params = inspect.signature(factory).parameters.values()
        if any(p.kind is p.VAR_KEYWORD for p in params):
            return None
        return tuple(p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))

    def names(self) -> tuple[str, ...]:
        """The registered names, in registration order."""
        return tuple(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(tuple(self._entries))

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.noun!r}, {list(self._entries)})"
