r"""What the trainers accept as data, and the epoch order that makes resume exact.

:func:`as_train_data` turns any of these into a :class:`DataSource`:

- ``(x, y)``, ``(x,)``, a ``TensorDataset`` or a ``SequenceTask``: ``TrainConfig.batch_size``
  slices of a seeded permutation. Resume is exact (the epoch's permutation and position are
  saved).
- a map-style ``Dataset`` (``__getitem__`` and ``__len__``) of ``(x_i, y_i)`` or ``x_i``: the same
  permutation, items collated by ``default_collate``. Resume is exact.
- a ``DataLoader`` over a map-style dataset: its own sampler, batch size, ``collate_fn`` and
  workers. The sampler runs under a seed drawn from ``TrainConfig.seed`` and the epoch's batches
  (indices) are saved, so resume is exact.
- an ``IterableDataset`` (a stream), or a ``DataLoader`` over one: ``batch_size`` batches (a raw
  dataset) or the loader's; an epoch is one pass. Resume restarts the stream and skips the
  batches of the open epoch already trained on: exact when every pass yields the same items in
  the same order, otherwise the run continues at the right step, epoch and schedule position on
  whatever the stream yields next.

A batch is ``(x, y)`` (a list or tuple of two tensors), ``(x,)`` or ``x`` (``y = None``, e.g. a
:class:`~bayesattn.nn.networks.CausalLM`). A stream is never held in memory: it is iterated once per
epoch (so ``iter(dataset)`` must start a new pass each time). The ELBO needs the number of
training examples :math:`N` (the data plate's size): ``len(dataset)`` where it exists, otherwise
the ``num_data`` given to ``fit``. A stream whose first epoch yields fewer than ``num_data``
examples is a ``ValueError`` (the ELBO would be scaled wrong), unless the dataset declares that it
subsamples a larger set with an attribute ``num_data`` equal to the one given.

Randomness: loader iterators are created, and skipped batches fetched, under :func:`fork_rng`, so
that the data pipeline never shifts the random streams training draws from (dropout, attention
samples). Random transforms inside worker processes (``num_workers > 0``) are seeded per epoch; a
run resumed mid-epoch restarts the workers, so such transforms differ after a resume.
"""

from __future__ import annotations

import contextlib
import math
import random
import warnings
from collections.abc import Iterator, Sized
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, IterableDataset, TensorDataset
from torch.utils.data._utils.collate import default_collate as _torch_collate

from .._validation import check_int, torch_generator

__all__ = [
    "DataSource",
    "TensorSource",
    "DatasetSource",
    "LoaderSource",
    "StreamSource",
    "as_train_data",
    "as_batch",
    "as_tensors",
    "iter_eval_batches",
    "fork_rng",
]

Batch = tuple[Tensor, Tensor | None]


@contextlib.contextmanager
def fork_rng() -> Iterator[None]:
    """Run a block without disturbing the global RNG streams training draws from."""
    py, npst = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=[]):
        yield
    random.setstate(py)
    np.random.set_state(npst)


# ---------------------------------------------------------------------------------------------
# tensors (the in-memory forms fit has always taken)
# ---------------------------------------------------------------------------------------------


def default_collate(items: list[Any]) -> Any:
    """torch's ``default_collate``, with a ``ValueError`` naming the shapes when the items cannot
    be stacked (ragged sequences need padding or a ``DataLoader`` with a ``collate_fn``)."""
    try:
        return _torch_collate(items)
    except RuntimeError as e:
        shapes = sorted(
            {
                tuple(t.shape)
                for it in items
                for t in (it if isinstance(it, (tuple, list)) else (it,))
                if isinstance(t, Tensor)
            }
        )
        raise ValueError(
            f"the items of a batch cannot be stacked by the default collate (tensor shapes "
            f"{shapes[:6]}{' ...' if len(shapes) > 6 else ''}: ragged sequences?); pad them to "
            "one length (with the network's padding index) or pass a DataLoader with its own "
            f"collate_fn (torch: {e})"
        ) from e


def as_tensors(data: Any, name: str) -> tuple[Tensor, Tensor | None]:
    """``(x, y)`` tuple/list, a ``TensorDataset`` of 1 or 2 tensors, or an object with
    ``.src``/``.tgt`` (a :class:`bayesattn.data.SequenceTask`) → ``(x, y or None)``."""
    tensors: tuple[Any, ...]
    if isinstance(data, TensorDataset):
        tensors = tuple(data.tensors)
    elif isinstance(data, (tuple, list)):
        tensors = tuple(data)
    elif hasattr(data, "src") and hasattr(data, "tgt"):
        tensors = (data.src, data.tgt)
    else:
        raise TypeError(
            f"{name} must be a tuple (x, y), a TensorDataset, a SequenceTask, a Dataset, an "
            f"IterableDataset or a DataLoader; got {type(data).__name__}"
        )
    if len(tensors) == 1:
        tensors = (tensors[0], None)
    if len(tensors) != 2:
        raise ValueError(f"{name} must hold (x, y) or (x,); got {len(tensors)} items")
    x, y = tensors
    if not isinstance(x, Tensor):
        raise TypeError(f"{name}: x must be a torch.Tensor; got {type(x).__name__}")
    if y is not None and not isinstance(y, Tensor):
        raise TypeError(f"{name}: y must be a torch.Tensor or None; got {type(y).__name__}")
    if x.dim() == 0 or len(x) == 0:
        raise ValueError(f"{name} is empty (x has shape {tuple(x.shape)})")
    if y is not None:
        if y.dim() == 0 or len(y) != len(x):
            raise ValueError(
                f"{name}: len(x) != len(y) ({len(x)} vs {len(y) if y.dim() else 'scalar'})"
            )
        if y.is_floating_point() or y.is_complex() or y.dtype == torch.bool:
            raise TypeError(f"{name}: y must hold integer labels/tokens; got dtype {y.dtype}")
    return x, y


def as_batch(batch: Any, name: str) -> Batch:
    """A collated batch (``(x, y)``, ``[x, y]``, ``(x,)`` or ``x``) → ``(x, y or None)``."""
    if isinstance(batch, Tensor):
        return batch, None
    if isinstance(batch, (tuple, list)) and len(batch) in (1, 2):
        x = batch[0]
        y = batch[1] if len(batch) == 2 else None
        if isinstance(x, Tensor) and (y is None or isinstance(y, Tensor)):
            if y is not None and (y.is_floating_point() or y.is_complex() or y.dtype == torch.bool):
                raise TypeError(f"{name}: y must hold integer labels/tokens; got dtype {y.dtype}")
            if y is not None and y.dim() and len(y) != len(x):
                raise ValueError(f"{name}: len(x) != len(y) ({len(x)} vs {len(y)})")
            return x, y
    got = type(batch).__name__
    if isinstance(batch, (tuple, list)):
        got += f" of {len(batch)} ({', '.join(type(b).__name__ for b in batch)})"
    raise TypeError(f"{name}: a batch must be a tensor x or a pair of tensors (x, y); got {got}")


def _sized(obj: Any) -> int | None:
    try:
        return len(obj)
    except TypeError:
        return None


# ---------------------------------------------------------------------------------------------
# sources
# ---------------------------------------------------------------------------------------------


class DataSource:
    """Batches of one training set, epoch by epoch.

    Attributes:
        source_type: ``"tensors"``, ``"dataset"``, ``"loader"`` or ``"stream"`` (``kind``
            before 0.6: deprecated, removed in the next release).
        num_data: examples in one pass (``None``: unknown, a stream without ``__len__``).
        batch_size: examples per batch (``None``: set by the loader's batch sampler, or
            unknown).
        shuffled: whether :meth:`plan` draws an order (``False``: a stream, in its own order).
    """

    source_type = ""
    shuffled = True

    def __init__(self, name: str) -> None:
        self.name = name
        self.num_data: int | None = None
        self.batch_size: int | None = None

    def batches_per_epoch(self) -> int | None:
        """Batches in one epoch (``None``: unknown until the stream ends)."""
        raise NotImplementedError

    def first_batch(self) -> Batch:
        """A batch from the start of the data (to set a trainer up), RNG untouched."""
        raise NotImplementedError

    def plan(self, generator: torch.Generator, epoch: int) -> tuple[Tensor, Tensor | None] | None:
        """The epoch's order: example indices ``(N,)`` and batch sizes (``None``: fixed
        ``batch_size``); ``None`` for a stream. Draws from ``generator`` only."""
        raise NotImplementedError

    def batches(self, plan: tuple[Tensor, Tensor | None] | None, start: int) -> Iterator[Batch]:
        """The epoch's batches from batch ``start`` on."""
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        """What a checkpoint records about the data (checked on resume)."""
        return {"source_type": self.source_type, "batch_size": self.batch_size}

    @property
    def kind(self) -> str:
        """Deprecated spelling of :attr:`source_type` ("kind" is how a predictive's samples were
        drawn); removed in the next release."""
        warnings.warn(
            "DataSource.kind is deprecated: use DataSource.source_type",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.source_type


def _chunks(order: Tensor, sizes: Tensor | None, batch_size: int, drop_last: bool) -> list[Tensor]:
    if sizes is not None:
        return list(torch.split(order, sizes.tolist()))
    out = list(torch.split(order, batch_size))
    if drop_last and out and len(out[-1]) < batch_size:
        out.pop()
    return out


class TensorSource(DataSource):
    """In-memory ``(x, y)``: slices of a permutation drawn from the trainer's generator."""

    source_type = "tensors"
    num_data: int
    batch_size: int

    def __init__(self, x: Tensor, y: Tensor | None, batch_size: int, drop_last: bool, name: str):
        super().__init__(name)
        self.x, self.y = x, y
        self.num_data, self.batch_size, self.drop_last = len(x), batch_size, drop_last

    def batches_per_epoch(self) -> int:
        n, bs = self.num_data, self.batch_size
        return n // bs if self.drop_last else math.ceil(n / bs)

    def first_batch(self) -> Batch:
        bs = min(self.num_data, self.batch_size)
        return self.x[:bs], None if self.y is None else self.y[:bs]

    def plan(self, generator: torch.Generator, epoch: int) -> tuple[Tensor, Tensor | None]:
        return torch.randperm(self.num_data, generator=generator), None

    def batches(self, plan: Any, start: int) -> Iterator[Batch]:  # plan: what plan() returned
        order, _ = plan
        bs, nb = self.batch_size, self.batches_per_epoch()
        for i in range(start, nb):
            idx = order[i * bs : (i + 1) * bs]
            yield self.x[idx], None if self.y is None else self.y[idx]


class _FixedBatches(torch.utils.data.Sampler):
    """A batch sampler over precomputed index batches (the saved epoch plan)."""

    def __init__(self, batches: list[Tensor]) -> None:
        self.batches_ = batches

    def __iter__(self) -> Iterator[list[int]]:
        for b in self.batches_:
            yield b.tolist()

    def __len__(self) -> int:
        return len(self.batches_)


def _loader_kwargs(loader: DataLoader | None) -> dict[str, Any]:
    """Settings of ``loader`` that a copy with another batch sampler keeps."""
    if loader is None:
        return {"collate_fn": default_collate}
    collate = loader.collate_fn
    kw: dict[str, Any] = {
        # torch's default collate (the DataLoader's own default): ours, which names ragged items
        "collate_fn": default_collate if collate is _torch_collate else collate,
        "num_workers": loader.num_workers,
        "pin_memory": loader.pin_memory,
        "timeout": loader.timeout,
        "worker_init_fn": loader.worker_init_fn,
        "multiprocessing_context": loader.multiprocessing_context,
        "persistent_workers": False,
    }
    if loader.num_workers > 0:
        kw["prefetch_factor"] = loader.prefetch_factor
    return kw


class DatasetSource(DataSource):
    """A map-style dataset: a seeded permutation (as :class:`TensorSource`), items collated by a
    ``DataLoader`` (with ``loader``'s settings when it came in one)."""

    source_type = "dataset"
    num_data: int
    batch_size: int | None

    def __init__(
        self,
        dataset: Dataset,
        batch_size: int | None,
        drop_last: bool,
        name: str,
        loader: DataLoader | None = None,
    ) -> None:
        super().__init__(name)
        n = _sized(dataset)
        if n is None:
            raise TypeError(f"{name}: a map-style dataset needs __len__")
        if n == 0:
            raise ValueError(f"{name} is empty (len(dataset) == 0)")
        self.dataset, self.loader = dataset, loader
        self.num_data, self.batch_size, self.drop_last = n, batch_size, drop_last

    def batches_per_epoch(self) -> int:
        n, bs = self.num_data, self.batch_size
        if bs is None:  # only a DataLoader's batch sampler (LoaderSource) sets no batch size
            raise ValueError(f"{self.name}: no batch_size to count the batches of an epoch")
        return n // bs if self.drop_last else math.ceil(n / bs)

    def _load(self, batches: list[Tensor], seed: int) -> Iterator[Batch]:
        gen = torch_generator(seed)  # worker seeds; never the global RNG
        loader = DataLoader(
            self.dataset,
            batch_sampler=_FixedBatches(batches),
            generator=gen,
            **_loader_kwargs(self.loader),
        )
        for k, batch in enumerate(loader):
            yield as_batch(batch, f"{self.name} (batch {k})")

    def first_batch(self) -> Batch:
        with fork_rng():
            bs = min(self.num_data, self.batch_size or self.num_data)
            return next(iter(self._load([torch.arange(bs)], 0)))

    def plan(self, generator: torch.Generator, epoch: int) -> tuple[Tensor, Tensor | None]:
        return torch.randperm(self.num_data, generator=generator), None

    def batches(self, plan: Any, start: int) -> Iterator[Batch]:  # plan: what plan() returned
        order, sizes = plan
        chunks = _chunks(order, sizes, self.batch_size or 1, self.drop_last)
        seed = int(order[:8].sum())  # worker seeds: a function of the epoch plan
        yield from self._load(chunks[start:], seed)


class LoaderSource(DatasetSource):
    """A ``DataLoader`` over a map-style dataset: its sampler and batch sampler decide the order
    (run under a seed drawn from the trainer's generator, so that the epoch's batches are a
    function of ``TrainConfig.seed``); the batches are saved as the epoch plan."""

    source_type = "loader"

    def __init__(self, loader: DataLoader, name: str) -> None:
        if loader.batch_sampler is None:
            raise ValueError(
                f"{name}: a DataLoader with batch_size=None over a map-style dataset yields "
                f"single examples; give it a batch_size"
            )
        super().__init__(loader.dataset, loader.batch_size, loader.drop_last, name, loader)
        self.batch_sampler = loader.batch_sampler

    def batches_per_epoch(self) -> int:
        if not isinstance(self.batch_sampler, Sized):
            raise TypeError(f"{self.name}: the DataLoader's batch_sampler has no len()")
        return len(self.batch_sampler)

    def first_batch(self) -> Batch:
        with fork_rng():
            first = next(iter(self.batch_sampler), None)
            if first is None:
                raise ValueError(f"{self.name}: the DataLoader yields no batch")
            return next(iter(self._load([torch.as_tensor(list(first), dtype=torch.int64)], 0)))

    def plan(self, generator: torch.Generator, epoch: int) -> tuple[Tensor, Tensor | None]:
        seed = int(torch.randint(0, 2**62, (1,), generator=generator))
        sampler: Any = getattr(self.batch_sampler, "sampler", None)
        if hasattr(sampler, "set_epoch"):  # DistributedSampler and friends
            sampler.set_epoch(epoch)
        own = getattr(sampler, "generator", None)
        if isinstance(own, torch.Generator):  # a sampler with its own generator: reseed it
            own.manual_seed(seed)
        with fork_rng():
            torch.manual_seed(seed)
            batches = [torch.as_tensor(list(b), dtype=torch.int64) for b in self.batch_sampler]
        if not batches:
            raise ValueError(f"{self.name}: the DataLoader yields no batch")
        order = torch.cat(batches)
        sizes = torch.tensor([len(b) for b in batches], dtype=torch.int64)
        return order, sizes


class StreamSource(DataSource):
    """An ``IterableDataset`` (or a ``DataLoader`` over one): one pass per epoch, in the stream's
    own order; resume skips the batches of the open epoch already trained on."""

    source_type = "stream"
    shuffled = False
    num_data: int

    def __init__(
        self,
        data: IterableDataset | DataLoader,
        batch_size: int,
        drop_last: bool,
        name: str,
        num_data: int | None,
    ) -> None:
        super().__init__(name)
        if isinstance(data, DataLoader):
            self.loader = data
            self.batch_size = data.batch_size
            dataset = data.dataset
        else:
            self.loader = DataLoader(
                data, batch_size=batch_size, drop_last=drop_last, collate_fn=default_collate
            )
            self.batch_size = batch_size
            dataset = data
        n = _sized(dataset)
        if num_data is not None and n is not None and num_data != n:
            raise ValueError(
                f"num_data={num_data} but {name} holds {n} examples (num_data is for streams "
                "without __len__)"
            )
        if num_data is not None:
            n = num_data
        if n is None:
            raise ValueError(
                f"{name}: a stream without __len__ needs num_data (the number of training "
                f"examples the ELBO is scaled to): fit(network, stream, num_data=N)"
            )
        self.num_data = n
        self.drop_last = bool(getattr(self.loader, "drop_last", drop_last))
        # a stream that subsamples a larger set says so: ``dataset.num_data`` = that set's size
        self.subsamples = getattr(dataset, "num_data", None) == n

    def batches_per_epoch(self) -> int | None:
        n = _sized(self.loader) if _sized(self.loader.dataset) is not None else None
        if n is not None:
            return n
        if self.batch_size:
            f = math.floor if self.drop_last else math.ceil
            return max(1, int(f(self.num_data / self.batch_size)))
        return None

    def _iter(self) -> Iterator[Any]:
        with fork_rng():  # creating the iterator draws worker seeds from the global RNG
            return iter(self.loader)

    def first_batch(self) -> Batch:
        with fork_rng():
            it = self._iter()
            try:
                batch = next(it)
            except StopIteration:
                raise ValueError(f"{self.name}: the stream yields no batch") from None
            return as_batch(batch, f"{self.name} (batch 0)")

    def plan(self, generator: torch.Generator, epoch: int) -> None:
        ds = self.loader.dataset
        if hasattr(ds, "set_epoch"):
            ds.set_epoch(epoch)
        return None

    def batches(self, plan: tuple[Tensor, Tensor | None] | None, start: int) -> Iterator[Batch]:
        it = self._iter()
        with fork_rng():  # batches already trained on: fetched, not used, RNG untouched
            for _ in range(start):
                try:
                    next(it)
                except StopIteration:
                    raise ValueError(
                        f"{self.name}: the stream ended after fewer than the {start} batches "
                        f"the checkpoint had trained on in this epoch"
                    ) from None
        k, seen = start, 0
        for batch in it:
            b = as_batch(batch, f"{self.name} (batch {k})")
            seen += int(b[0].shape[0])
            if start == 0 and seen > self.num_data:
                raise ValueError(
                    f"{self.name}: the stream yielded more than num_data={self.num_data} examples "
                    f"in one epoch ({seen} by batch {k}); num_data is the number of training "
                    "examples the ELBO is scaled to, at least the examples of one pass"
                )
            yield b
            k += 1
        dropped = self.batch_size if self.drop_last and self.batch_size else 1  # a remainder
        if start == 0 and self.num_data - seen >= dropped and not self.subsamples:
            raise ValueError(
                f"{self.name}: the stream yielded {seen} examples in one epoch but num_data="
                f"{self.num_data}: the ELBO would be scaled to {self.num_data} training examples. "
                f"If each pass is the whole training set, pass num_data={seen}; a stream that "
                f"subsamples a larger set of {self.num_data} examples says so with an attribute "
                f"num_data = {self.num_data} on the dataset (nothing was trained: the network and "
                "the Pyro param store are as they were)"
            )


def as_train_data(
    data: Any,
    name: str,
    batch_size: int,
    drop_last: bool = False,
    num_data: int | None = None,
) -> DataSource:
    """The :class:`DataSource` for anything ``fit`` takes (see the module docstring).

    Args:
        data: tensors, a dataset or a ``DataLoader``.
        name: the argument's name, for error messages.
        batch_size, drop_last: batching of tensors and datasets (a ``DataLoader`` has its own).
        num_data: the number of training examples (overrides ``len``; needed for an unsized
            stream).
    """
    check_int("num_data", num_data, 1, allow_none=True)
    if isinstance(data, DataLoader):
        if isinstance(data.dataset, IterableDataset):
            return StreamSource(data, batch_size, drop_last, name, num_data)
        src: DataSource = LoaderSource(data, name)
    elif isinstance(data, IterableDataset):
        return StreamSource(data, batch_size, drop_last, name, num_data)
    elif isinstance(data, Dataset) and not isinstance(data, TensorDataset):
        src = DatasetSource(data, batch_size, drop_last, name)
    else:
        x, y = as_tensors(data, name)
        src = TensorSource(x, y, batch_size, drop_last, name)
    if num_data is not None and num_data != src.num_data:
        raise ValueError(
            f"num_data={num_data} but {name} holds {src.num_data} examples (num_data is for "
            f"streams without __len__)"
        )
    return src


def iter_eval_batches(data: Any, name: str, batch_size: int) -> tuple[Iterator[Batch], int | None]:
    """Batches of evaluation data in order (no shuffling), and the number of examples (``None``
    for an unsized stream). Tensors are sliced, datasets batched by ``batch_size``, a
    ``DataLoader`` is used as given."""
    if isinstance(data, DataLoader):
        loader, n = data, _sized(data.dataset)
    elif isinstance(data, (Dataset, IterableDataset)) and not isinstance(data, TensorDataset):
        loader, n = (
            DataLoader(data, batch_size=batch_size, collate_fn=default_collate),
            _sized(data),
        )
    else:
        x, y = as_tensors(data, name)

        def slices() -> Iterator[Batch]:
            for i in range(0, len(x), batch_size):
                yield x[i : i + batch_size], None if y is None else y[i : i + batch_size]

        return slices(), len(x)

    def batches() -> Iterator[Batch]:
        with fork_rng():
            it = iter(loader)
        for k, b in enumerate(it):
            yield as_batch(b, f"{name} (batch {k})")

    return batches(), n
