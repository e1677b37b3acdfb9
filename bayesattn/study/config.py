"""The study's settings (:class:`StudyConfig`). The configuration checks its data sets against
the data-set registry (:mod:`.datasets`, whose per-data-set model defaults it reads) and its
methods against the method registry (:mod:`.methods`, with the modules that register the density
and mixture methods), both imported here: no name reaches it by import order."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .._study_io import validate_study_config
from ..data.holdout import check_holdout_classes, rotation_pairs
from . import density_methods, mixture_methods, word_methods  # noqa: F401 - they register
from .datasets import DATASETS, FULL_DATASETS, MODEL_DEFAULTS, MODEL_KEYS, get_dataset
from .legacy import LEGACY_METHOD_NAMES
from .methods import DEFAULT_METHODS, FULL_METHODS, METHODS, get_method

__all__ = [
    "StudyConfig",
    "DATASETS",
    "FULL_DATASETS",
    "MODEL_DEFAULTS",
    "DEFAULT_ROTATION",
    "MAX_SEED",
]

#: the largest first seed: a run's seeds (``seed + i``, members ``seed + 1000 i``, …) stay far
#: inside what torch's and numpy's generators take
MAX_SEED = 2**32 - 1

#: held-out pairs of the default study (``make study``) when neither ``holdout_classes`` nor
#: ``holdout_rotation`` is given
DEFAULT_ROTATION = 2


@dataclass
class StudyConfig:
    """Settings of :func:`~bayesattn.study.run_study`.

    ``datasets`` (default: just ``dataset``) are run one after the other. On each, the held-out
    classes are ``holdout_classes`` (one pair), or the first ``holdout_rotation=K`` of a seeded
    cut of the ten classes into disjoint pairs (:func:`~bayesattn.data.holdout.rotation_pairs`,
    ``rotation_seed``; give one or the other, neither: ``K =`` :data:`DEFAULT_ROTATION`); every pair is run on ``seeds`` seeds (``seed, seed+1, …``: split,
    initialisation and sampling). Model fields left at ``None`` take :data:`MODEL_DEFAULTS`
    of the dataset. ``jobs > 1`` runs the (pair, seed) runs of a dataset on that many worker
    processes (same numbers, less wall time on a machine with the cores). ``quick()`` is the
    smoke preset (``smoke=True``: the run checks that everything runs, its numbers are not
    results, and the report and the terminal table say so), ``full()`` the whole protocol.
    """

    out: str = "bayesattn-study"
    dataset: str = "digits"
    datasets: Sequence[str] = ()
    methods: Sequence[str] = ()
    epochs: int | None = None
    seed: int = 0
    seeds: int = 3
    holdout_classes: Sequence[int] = ()
    holdout_rotation: int | None = None
    rotation_seed: int = 0
    num_samples: int = 8
    timing_samples: Sequence[int] = (1, 8, 32)
    ensemble_size: int = 5
    d_model: int | None = None
    nhead: int | None = None
    num_layers: int | None = None
    dim_feedforward: int | None = None
    dropout: float = 0.1
    batch_size: int | None = None
    lr: float | None = None
    kl_anneal_epochs: int = 5
    kl_weight: float = 1e-3
    severities: Sequence[int] = (1, 3, 5)
    knn_ks: Sequence[int] = (1, 5, 10, 20, 50)
    arviz_examples: int = 16
    geometry: bool = True
    figures: bool = True
    progress: bool = True
    jobs: int = 1
    smoke: bool = False
    extra: dict = field(default_factory=dict)

    @classmethod
    def quick(cls, **kw: Any) -> StudyConfig:
        """A smoke run of a minute or two: one pair, 2 seeds, 5 epochs, an ensemble of 2."""
        base: dict[str, Any] = dict(
            epochs=5, seeds=2, holdout_classes=(8, 9), num_samples=8, ensemble_size=2,
            severities=(3,), arviz_examples=4, geometry=False, smoke=True,
        )  # fmt: skip
        if "holdout_rotation" in kw:
            base.pop("holdout_classes")
        base.update(kw)
        return cls(**base)

    @classmethod
    def full(cls, **kw: Any) -> StudyConfig:
        """The whole protocol: the four datasets of :data:`FULL_DATASETS`, 5 disjoint held-out
        pairs × 5 seeds, the methods of :data:`~bayesattn.study.methods.FULL_METHODS`, on 2
        worker processes (``jobs``)."""
        base: dict[str, Any] = dict(
            datasets=tuple(FULL_DATASETS), holdout_rotation=5, seeds=5, methods=tuple(FULL_METHODS),
            jobs=2,
        )  # fmt: skip
        if kw.get("holdout_classes"):
            base.pop("holdout_rotation")
        base.update(kw)
        return cls(**base)

    def pairs(self) -> list[tuple[int, ...]]:
        """The held-out class sets, one study run per set and seed."""
        if self.holdout_classes:
            return [tuple(sorted(self.holdout_classes))]
        pairs = rotation_pairs(self.holdout_rotation or DEFAULT_ROTATION, seed=self.rotation_seed)
        return [tuple(p) for p in pairs]

    @property
    def dataset_list(self) -> tuple[str, ...]:
        """The datasets run, in order."""
        return tuple(self.datasets) or (self.dataset,)

    def model(self, dataset: str) -> dict[str, Any]:
        """Architecture and training settings on ``dataset`` (explicit fields win)."""
        out = dict(get_dataset(dataset).model_defaults)
        for k in MODEL_KEYS:
            if getattr(self, k) is not None:
                out[k] = getattr(self, k)
        return out

    def __post_init__(self) -> None:
        validate_study_config(self)
        if self.seed > MAX_SEED:
            raise ValueError(f"seed must be an int in 0..{MAX_SEED}; got {self.seed}")
        self.methods = tuple(self.methods) if self.methods else tuple(DEFAULT_METHODS)
        for d in (self.dataset, *self.datasets):
            if d not in DATASETS:
                raise ValueError(f"dataset must be one of {tuple(DATASETS)}; got {d!r}")
        bad = [m for m in self.methods if m not in METHODS]
        if bad:
            renamed = "".join(
                f" ({m!r} is now called {LEGACY_METHOD_NAMES[m]!r})"
                for m in bad if m in LEGACY_METHOD_NAMES
            )  # fmt: skip
            raise ValueError(
                f"methods must be a non-empty subset of {tuple(METHODS)}; got "
                f"{list(self.methods)}{renamed}"
            )
        if len(set(self.methods)) != len(self.methods):
            raise ValueError(f"methods must not repeat a method; got {list(self.methods)}")
        specs = [get_dataset(d) for d in self.dataset_list]
        idle = [m for m in self.methods if not any(get_method(m).applies_to(s) for s in specs)]
        if idle:
            raise ValueError(
                f"methods {idle} apply to none of the datasets {list(self.dataset_list)} (methods "
                "for words need a word-token data set; pretrained ones one with pretraining texts)"
            )
        for name in ("seeds", "num_samples", "ensemble_size", "jobs"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive int; got {v!r}")
        if not self.timing_samples or any(
            isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in self.timing_samples
        ):
            raise ValueError(f"timing_samples must be ints >= 1; got {list(self.timing_samples)}")
        if not self.knn_ks or any(
            isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in self.knn_ks
        ):
            raise ValueError(f"knn_ks must be ints >= 1; got {list(self.knn_ks)}")
        h = list(self.holdout_classes)
        if h and self.holdout_rotation is not None:
            raise ValueError(
                f"give holdout_classes (one pair) or holdout_rotation (K pairs), not both; got "
                f"holdout_classes={h}, holdout_rotation={self.holdout_rotation}"
            )
        try:
            check_holdout_classes(h)
        except (ValueError, TypeError) as e:
            raise ValueError(f"holdout_classes must be distinct digits 0..9: {e}") from None
        r = self.holdout_rotation
        if r is not None and (isinstance(r, bool) or not isinstance(r, int) or not 1 <= r <= 5):
            raise ValueError(f"holdout_rotation must be None or an int in 1..5; got {r!r}")
        if any(s not in (1, 2, 3, 4, 5) for s in self.severities):
            raise ValueError(f"severities must be in 1..5; got {list(self.severities)}")
