"""The study's settings (:class:`StudyConfig`) and the per-dataset model defaults."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

from .._study_io import validate_study_config
from ..data.holdout import check_holdout_classes, rotation_pairs

__all__ = [
    "StudyConfig",
    "DATASETS",
    "FULL_DATASETS",
    "MODEL_DEFAULTS",
    "DEFAULT_ROTATION",
    "MethodNames",
    "use_method_names",
    "method_names",
]

#: held-out pairs of the default study (``make study``) when neither ``holdout_classes`` nor
#: ``holdout_rotation`` is given
DEFAULT_ROTATION = 2

Dataset = Literal["digits", "mnist1d", "fortunes"]
DATASETS: tuple[Dataset, ...] = ("digits", "mnist1d", "fortunes")
#: the datasets of the full protocol: two of signals and one of tokens (``fortunes`` needs
#: Debian's ``fortunes`` package: ``apt-get install fortunes``)
FULL_DATASETS: tuple[Dataset, ...] = ("digits", "mnist1d", "fortunes")

#: per-dataset architecture and training defaults (a ``StudyConfig`` field left at ``None``
#: takes the dataset's value). digits: a ViT over 2×2 patches (16 tokens + CLS); mnist1d: a
#: transformer over the 40-step sequence cut into overlapping windows of ``patch`` steps every
#: ``stride`` steps (9 tokens + CLS). The MNIST-1D model (0.5) reaches about .91 test accuracy in
#: about 17 s of one core; the 0.4 one (3 layers, 40 epochs, non-overlapping windows of 4) .90 in
#: about 50 s (docs/which-attention.md, "The MNIST-1D model").
#: fortunes: a transformer over the word tokens, CLS pooling; 10 epochs, chosen on validation NLL
#: (2.03 against 2.76 at 20 epochs, two runs) at half the training cost (docs/which-attention.md,
#: "Tokens").
MODEL_DEFAULTS: dict[str, dict[str, Any]] = {
    "digits": dict(d_model=32, nhead=4, num_layers=2, dim_feedforward=64, epochs=20, lr=3e-3,
                   batch_size=64, patch=2),
    "mnist1d": dict(d_model=64, nhead=4, num_layers=2, dim_feedforward=128, epochs=30, lr=5e-3,
                    batch_size=128, patch=8, stride=4),
    "fortunes": dict(d_model=64, nhead=4, num_layers=2, dim_feedforward=128, epochs=10, lr=3e-3,
                     batch_size=64, patch=1),
}  # fmt: skip
_MODEL_KEYS = ("d_model", "nhead", "num_layers", "dim_feedforward", "epochs", "lr", "batch_size")


class MethodNames(NamedTuple):
    """The method names a configuration is checked against and takes its defaults from: live
    views of the method registry (:data:`~bayesattn.study.methods.METHODS`, ``DEFAULT_METHODS``
    and ``FULL_METHODS``), handed over by :mod:`bayesattn.study.methods` through
    :func:`use_method_names`, so that the configuration imports nothing from the methods."""

    registered: Sequence[str]
    default: Sequence[str]
    full: Sequence[str]


_METHOD_NAMES: list[MethodNames] = []  # the names use_method_names installed (one entry)


def use_method_names(names: MethodNames) -> None:
    """Install the method names configurations are checked against (called by
    :mod:`bayesattn.study.methods` when it is imported, before any configuration is built)."""
    _METHOD_NAMES[:] = [names]


def method_names() -> MethodNames:
    """The installed method names (a ``RuntimeError`` before the methods are registered)."""
    if not _METHOD_NAMES:
        raise RuntimeError(
            "no study methods are registered yet: import bayesattn.study (which registers them) "
            "before building a StudyConfig"
        )
    return _METHOD_NAMES[0]


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
    dataset: Dataset = "digits"
    datasets: Sequence[Dataset] = ()
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
        """The whole protocol: the three datasets of :data:`FULL_DATASETS`, 5 disjoint held-out
        pairs × 5 seeds, the methods of :data:`~bayesattn.study.methods.FULL_METHODS`, on 2
        worker processes (``jobs``)."""
        full_methods = tuple(method_names().full)
        base: dict[str, Any] = dict(
            datasets=FULL_DATASETS, holdout_rotation=5, seeds=5, methods=full_methods, jobs=2
        )
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
        out = dict(MODEL_DEFAULTS[dataset])
        for k in _MODEL_KEYS:
            if getattr(self, k) is not None:
                out[k] = getattr(self, k)
        return out

    def __post_init__(self) -> None:
        names = method_names()
        validate_study_config(self)
        self.methods = tuple(self.methods) if self.methods else tuple(names.default)
        for d in (self.dataset, *self.datasets):
            if d not in DATASETS:
                raise ValueError(f"dataset must be one of {DATASETS}; got {d!r}")
        bad = [m for m in self.methods if m not in names.registered]
        if bad:
            raise ValueError(
                f"methods must be a non-empty subset of {names.registered}; got "
                f"{list(self.methods)}"
            )
        if len(set(self.methods)) != len(self.methods):
            raise ValueError(f"methods must not repeat a method; got {list(self.methods)}")
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
