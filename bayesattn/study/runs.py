"""One run of the study: a registered data set (:mod:`.datasets`), a held-out class set and a
seed, with everything its methods share (the split, the far-OOD and corrupted sets, the network
factory, trained deterministic members and their pooled features)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import Field, dataclass, field
from typing import Any, ClassVar, Protocol

import pyro
import torch
from torch import Tensor

from ..data.holdout import HoldoutData
from ..nn.blocks import AttentionConfig
from ..nn.networks import BayesianNetwork, TransformerClassifier
from ..posthoc.features import Features, extract_features
from ..training import fit
from ..training.pretrain import transfer_trunk
from .datasets import StudyDataset, get_dataset
from .pretrained import pretrained_trunk

__all__ = ["Run", "RunSettings"]


class RunSettings(Protocol):
    """The settings a run and its methods read (:class:`~bayesattn.study.StudyConfig` is one;
    the run does not import the configuration, which sits above the methods: it checks method
    names against their registry). A dataclass (methods derive variants with
    ``dataclasses.replace``)."""

    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]
    num_samples: int
    ensemble_size: int
    dropout: float
    kl_anneal_epochs: int
    kl_weight: float
    knn_ks: Sequence[int]
    severities: Sequence[int]
    arviz_examples: int
    geometry: bool
    seeds: int
    smoke: bool
    out: Any

    def pairs(self) -> list[tuple[int, ...]]:
        """The held-out class sets of the study (a run's share of shared costs)."""
        ...

    def model(self, dataset: str) -> dict[str, Any]:
        """Architecture and training settings on ``dataset``."""
        ...


def _one_pass(net: TransformerClassifier, x: Tensor) -> Features:
    """Logits and the pooled features the head reads, one pass (no token view)."""
    return extract_features(net, x, tokens=False)


@dataclass
class Run:
    """A dataset × held-out set × seed, and what its methods share (``cache``)."""

    cfg: RunSettings
    dataset: str
    pair: tuple[int, ...]
    seed: int
    data: HoldoutData
    far: dict[str, Tensor]
    corrupted: dict[tuple[str, int], Tensor]
    cache: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def load(cls, cfg: RunSettings, dataset: str, pair: tuple[int, ...], seed: int) -> Run:
        """The split of ``dataset`` (a registered :class:`~bayesattn.study.datasets.StudyDataset`)
        with ``pair`` held out, and its corrupted sets and far-OOD sets (with the training
        classes' ``moments`` set), all seeded by ``seed``."""
        ds = get_dataset(dataset)
        data = ds.load(seed, pair)
        corrupted = ds.corruptions(data, cfg.severities, seed)
        return cls(cfg, dataset, pair, seed, data, ds.far_ood(data, seed), corrupted)

    @property
    def spec(self) -> StudyDataset:
        """The run's data set (its loader, network and defaults)."""
        return get_dataset(self.dataset)

    @property
    def model(self) -> dict[str, Any]:
        return self.cfg.model(self.dataset)

    def network(self, attention: AttentionConfig | None) -> TransformerClassifier:
        """A fresh network of this dataset's architecture (``attention=None``: softmax)."""
        return self.spec.network(self.data, self.model, self.cfg.dropout, attention)

    def train(self, net: BayesianNetwork, seed: int, bayes: bool, kl_weight: float = 1.0) -> float:
        """Train ``net`` (hybrid ELBO; cross-entropy for a deterministic one) and return the
        seconds it took. Every training starts from an empty Pyro param store; the validation
        loss picks the epoch restored (``val_samples=0``: no posterior-predictive validation
        metrics, which the study computes itself, so they do not cost training time)."""
        m, d = self.model, self.data
        pyro.clear_param_store()
        steps = math.ceil(len(d.x_train) / m["batch_size"])
        t0 = time.perf_counter()
        fit(net, (d.x_train, d.y_train), val_data=(d.x_val, d.y_val), method="hybrid",
            epochs=m["epochs"], batch_size=m["batch_size"], lr=m["lr"], weight_decay=1e-4,
            warmup_steps=steps, kl_anneal_steps=self.cfg.kl_anneal_epochs * steps if bayes else 0,
            kl_weight=kl_weight, seed=seed, progress=False, restore_best=True,
            early_stopping_patience=None, val_samples=0)  # fmt: skip
        return time.perf_counter() - t0

    def members(self, n: int) -> tuple[list[BayesianNetwork], list[float]]:
        """The first ``n`` deterministic networks (member ``i`` seeded ``seed + 1000 i``, so
        member seeds never collide with other runs' seeds), trained once per run and shared by
        ``deterministic``, the ensemble (curve), MC dropout and the post-hoc methods; with their
        training seconds."""
        nets, secs = self.cache.setdefault("members", ([], []))
        while len(nets) < n:
            s = self.seed + 1000 * len(nets)
            torch.manual_seed(s)
            net = self.network(None)
            secs.append(self.train(net, s, bayes=False))
            nets.append(net.eval())
        return nets[:n], secs[:n]

    def pretrained_members(self, n: int) -> tuple[list[BayesianNetwork], list[float]]:
        """As :meth:`members` (same seeds, same training), each network's trunk first copied
        from the data set's masked-LM trunk (:func:`~bayesattn.study.pretrained.
        pretrained_trunk`, word by word into this split's vocabulary); the seconds are the
        fine-tuning's plus this run's share of the pretraining (its seconds over the study's
        runs on the data set, since one trunk serves them all)."""
        nets, secs = self.cache.setdefault("pretrained_members", ([], []))
        if len(nets) >= n:
            return nets[:n], secs[:n]
        length = self.data.x_train.shape[1]
        trunk, vocab, info = pretrained_trunk(self.spec, self.model, length, self.cfg.out,
                                              smoke=self.cfg.smoke)  # fmt: skip
        share = float(info["seconds"]) / (len(self.cfg.pairs()) * self.cfg.seeds)
        self.cache["pretrained_info"] = {**info, "seconds_per_run": share}
        while len(nets) < n:
            s = self.seed + 1000 * len(nets)
            torch.manual_seed(s)
            net = self.network(None)
            found = transfer_trunk(trunk, vocab, net, self.data.vocab)  # type: ignore[attr-defined]
            self.cache["pretrained_info"]["vocabulary_found"] = found
            secs.append(share + self.train(net, s, bayes=False))
            nets.append(net.eval())
        return nets[:n], secs[:n]

    def views(self, split: str, x: Tensor | None = None, member: int = 0) -> Features:
        """:class:`~bayesattn.posthoc.Features` ``(logits, cls, tokens)`` of the deterministic
        network (``member``: which of :meth:`members`, 0 by default) on a named split (cached)
        or on ``x`` (the last ``x`` is remembered by identity, as in :meth:`features`)."""
        return self._member("views", extract_features, split, x, member=member)

    def passes(
        self, split: str, x: Tensor | None = None, pretrained: bool = False, member: int = 0
    ) -> Features:
        """:class:`~bayesattn.posthoc.Features` ``(logits, cls)`` of member 0 (``pretrained``:
        of :meth:`pretrained_members`' first; ``member``: another member) without the token
        view (its last layer computes the CLS row only), cached as :meth:`views`."""
        kind = "pretrained_features" if pretrained else "features"
        return self._member(kind, _one_pass, split, x, pretrained, member)

    def features(self, split: str, x: Tensor | None = None) -> Tensor:
        """Pooled features ``(B, E)`` of the deterministic network (member 0) on a named split
        (cached) or on ``x`` (the last ``x`` is remembered, by identity: a post-hoc method's
        prediction and its own score on the same inputs share one pass through the network,
        as a user's would)."""
        return self.passes(split, x).cls

    def _member(
        self,
        kind: str,
        read: Callable[[TransformerClassifier, Tensor], Any],
        split: str,
        x: Tensor | None,
        pretrained: bool = False,
        member: int = 0,
    ) -> Any:
        """``read(member 0, inputs)`` (``member``: another member), cached per named split under
        ``kind/split``; for explicit ``x`` only the last one is kept (by identity), so a
        prediction and an own score on the same inputs share one pass."""
        net = (self.pretrained_members if pretrained else self.members)(member + 1)[0][member]
        assert isinstance(net, TransformerClassifier)
        kind = kind if member == 0 else f"{kind}@{member}"
        if x is not None:
            last = self.cache.get(f"{kind}/last")
            if last is not None and last[0] is x:
                return last[1]
            out = read(net, x)
            self.cache[f"{kind}/last"] = (x, out)
            return out
        key = f"{kind}/{split}"
        if key not in self.cache:
            self.cache[key] = read(net, getattr(self.data, f"x_{split}"))
        return self.cache[key]
