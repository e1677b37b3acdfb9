"""The study's data sets: one file each, registered by name (:func:`register_dataset`).

A data set is a :class:`StudyDataset` (how to load a class-held-out split, its corruptions and
far-OOD sets, its network, its model defaults); the protocol, the report and the figures ask the
registered object, never the name.

**Adding one** is one file in this folder: subclass :class:`StudyDataset` (``name``,
``description``, ``model_defaults``, ``token_unit``, ``full_protocol``, ``order``; ``load``,
``corruptions``, ``far_ood``, ``network``, and ``check_available`` if it needs a package or
files) and end the file with ``register_dataset(MyDataset())``. Every module of this package is
imported when the package is (so the new file is found, no list to edit); the configuration, the
CLI's ``--dataset`` choices, the full protocol (``full_protocol = True``) and the report then
know it. A data set defined elsewhere (a script) registers the same way before the study runs.
Built in: :mod:`.digits`, :mod:`.mnist1d`, :mod:`.fortunes`.
"""

from __future__ import annotations

import importlib
import pkgutil

from .base import (
    DATASETS,
    FULL_DATASETS,
    MODEL_DEFAULTS,
    MODEL_KEYS,
    StudyDataset,
    get_dataset,
    register_dataset,
)

__all__ = [
    "StudyDataset",
    "register_dataset",
    "get_dataset",
    "DATASETS",
    "FULL_DATASETS",
    "MODEL_DEFAULTS",
    "MODEL_KEYS",
]

# every module of this folder but the base is a data set that registers itself on import
for _module in pkgutil.iter_modules(__path__):
    if _module.name != "base" and not _module.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_module.name}")
