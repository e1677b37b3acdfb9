"""What the study needs of a data set (:class:`StudyDataset`) and the registry of them.

A data set of the study is one object: how to load a class-held-out split of it, how to corrupt
its test inputs (the shift sets) and which far-OOD sets it has, the network that reads it, and
its model defaults (architecture and training). The protocol, the report and the figures ask the
registered object, never the data set's name (:func:`get_dataset`)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, ClassVar

from torch import Tensor

from ...data.holdout import HoldoutData
from ...nn.blocks import AttentionConfig
from ...nn.networks import TransformerClassifier
from ...registry import Registry

__all__ = [
    "StudyDataset",
    "register_dataset",
    "get_dataset",
    "DATASETS",
    "FULL_DATASETS",
    "MODEL_DEFAULTS",
    "MODEL_KEYS",
]

#: the architecture and training keys every data set's ``model_defaults`` gives (``StudyConfig``
#: fields of these names override them); a data set may add its own (``patch``, ``stride``)
MODEL_KEYS = ("d_model", "nhead", "num_layers", "dim_feedforward", "epochs", "lr", "batch_size")


class StudyDataset(ABC):
    """A data set of the study. Subclasses set the class attributes and implement
    :meth:`load`, :meth:`corruptions`, :meth:`far_ood` and :meth:`network`; an instance is
    registered with :func:`register_dataset`.

    Every method is deterministic given its ``seed`` (the split, the corruptions and the far-OOD
    draws of a run are seeded by the run's seed; :meth:`network` draws its initialisation from
    torch's global generator, which the study seeds before calling it)."""

    #: the name runs, results and the CLI use (an identifier)
    name: ClassVar[str] = ""
    #: one line: what the inputs are
    description: ClassVar[str] = ""
    #: architecture and training defaults: every key of :data:`MODEL_KEYS`, ``patch`` (what a
    #: token is made of, in :attr:`token_unit`) and any key :meth:`network` reads
    model_defaults: ClassVar[Mapping[str, Any]] = {}
    #: what a token of ``patch`` is made of, for the report (``"pixels²"``, ``"steps"``)
    token_unit: ClassVar[str] = "steps"
    #: run by the full protocol (:meth:`~bayesattn.study.StudyConfig.full`)
    full_protocol: ClassVar[bool] = False
    #: where it is listed (:data:`DATASETS`): by ``order``, then name
    order: ClassVar[int] = 100
    #: the attention-geometry figures apply (images: the first run's geometry report)
    geometry: ClassVar[bool] = False

    @property
    def words(self) -> bool:
        """Whether the inputs are word-token ids (``token_unit == "word"``: padding 0, the
        unknown word 1), which the bag-of-words baseline and the unknown-word rate read."""
        return self.token_unit == "word"

    def pretraining_texts(self) -> Sequence[str] | None:
        """Unlabeled texts a trunk may be pretrained on (a masked language model), none of them
        from a class of the data set (so from no held-out class of any run); ``None`` (the
        default): the data set has none, and the methods that fine-tune a pretrained trunk do
        not apply to it."""
        return None

    @property
    def figure_prefix(self) -> str:
        """File-name prefix of this data set's figures (``"<name>_"``)."""
        return f"{self.name}_"

    def check_available(self) -> None:
        """Raise ``ImportError`` (saying what to install) if the data set cannot be loaded here;
        called before a study writes or trains anything. Nothing to check by default."""
        return None

    @abstractmethod
    def load(self, seed: int, holdout_classes: tuple[int, ...]) -> HoldoutData:
        """The split seeded by ``seed`` with ``holdout_classes`` held out."""

    @abstractmethod
    def corruptions(
        self, data: HoldoutData, severities: Sequence[int], seed: int
    ) -> dict[tuple[str, int], Tensor]:
        """``{(kind, severity): corrupted x_test}`` for every kind and each severity (1..5)."""

    @abstractmethod
    def far_ood(self, data: HoldoutData, seed: int) -> dict[str, Tensor]:
        """``{name: inputs}``: the far-OOD sets built from ``data`` (nothing of the held-out
        classes), ``moments`` among them (fitted to the training split)."""

    @abstractmethod
    def network(
        self,
        data: HoldoutData,
        model: Mapping[str, Any],
        dropout: float,
        attention: AttentionConfig | None,
    ) -> TransformerClassifier:
        """A fresh network for ``data`` with the architecture ``model`` (:attr:`model_defaults`
        with the configuration's overrides) and ``attention`` (``None``: softmax)."""

    @staticmethod
    def sizes(
        model: Mapping[str, Any], dropout: float, attention: AttentionConfig | None
    ) -> dict[str, Any]:
        """The keyword arguments every study network shares (width, heads, depth, dropout,
        attention)."""
        return dict(d_model=model["d_model"], nhead=model["nhead"],
                    num_layers=model["num_layers"], dim_feedforward=model["dim_feedforward"],
                    dropout=dropout, attention=attention)  # fmt: skip


#: the registered data sets (a :class:`~bayesattn.registry.Registry` of ready instances)
_REGISTRY: Registry[StudyDataset] = Registry(
    "dataset", StudyDataset, instances=True, register_with="bayesattn.study.register_dataset"
)


def register_dataset(dataset: StudyDataset, *, override: bool = False) -> StudyDataset:
    """Add ``dataset`` under ``dataset.name`` (a name already taken: ``ValueError`` unless
    ``override``). Checks that it says what it is and gives every model default."""
    if not isinstance(dataset, StudyDataset):
        raise TypeError(f"dataset must be a StudyDataset instance; got {dataset!r}")
    if not isinstance(dataset.description, str) or not dataset.description.strip():
        raise ValueError(f"dataset {dataset.name!r} needs a description (one line)")
    missing = [k for k in (*MODEL_KEYS, "patch") if k not in dataset.model_defaults]
    if missing:
        raise ValueError(
            f"dataset {dataset.name!r}: model_defaults must give {[*MODEL_KEYS, 'patch']}; "
            f"missing {missing}"
        )
    _REGISTRY.register(dataset.name, dataset, override=override)
    return dataset


def get_dataset(name: str) -> StudyDataset:
    """The registered data set called ``name`` (unknown: ``ValueError`` listing them)."""
    return _REGISTRY.get(name, argument="dataset")


def _ordered(full_only: bool = False) -> tuple[str, ...]:
    entries = [_REGISTRY.get(n) for n in _REGISTRY]
    entries = [d for d in entries if d.full_protocol or not full_only]
    return tuple(d.name for d in sorted(entries, key=lambda d: (d.order, d.name)))


class _Names(Sequence[str]):
    """A live, ordered view of registered data-set names (later registrations show up)."""

    def __init__(self, full_only: bool) -> None:
        self._full_only = full_only

    def __getitem__(self, i: Any) -> Any:
        return _ordered(self._full_only)[i]

    def __len__(self) -> int:
        return len(_ordered(self._full_only))

    def __iter__(self) -> Iterator[str]:
        return iter(_ordered(self._full_only))

    def __contains__(self, name: object) -> bool:
        return name in _ordered(self._full_only)

    def __repr__(self) -> str:
        return repr(_ordered(self._full_only))


class _ModelDefaults(Mapping[str, Mapping[str, Any]]):
    """A live view: data-set name → its ``model_defaults``."""

    def __getitem__(self, name: str) -> Mapping[str, Any]:
        return get_dataset(name).model_defaults

    def __iter__(self) -> Iterator[str]:
        return iter(_ordered())

    def __len__(self) -> int:
        return len(_REGISTRY)


#: every registered data set, in order
DATASETS: Sequence[str] = _Names(full_only=False)
#: the data sets of the full protocol (``full_protocol = True``), in order
FULL_DATASETS: Sequence[str] = _Names(full_only=True)
#: data-set name → its architecture and training defaults (a ``StudyConfig`` field left at
#: ``None`` takes the data set's value)
MODEL_DEFAULTS: Mapping[str, Mapping[str, Any]] = _ModelDefaults()
