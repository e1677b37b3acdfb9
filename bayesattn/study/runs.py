"""One run of the study: a dataset (the digits, MNIST-1D or the fortunes' tokens), a held-out class set and a seed, with everything its methods
share (the split, the far-OOD and corrupted sets, the network factory, trained deterministic
members and their pooled features)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyro
import torch
from torch import Tensor

from .._validation import check_int
from ..data import CORRUPTION_KINDS, DigitsData, corrupt_images, load_digits_data
from ..data.far_ood import SEQUENCE_CORRUPTIONS, corrupt_sequences, far_ood_suite
from ..data.fortunes import FortunesData
from ..data.mnist1d import load_mnist1d_data
from ..data.token_ood import TOKEN_CORRUPTIONS, corrupt_tokens, token_far_ood_suite
from ..nn.blocks import AttentionConfig
from ..nn.networks import BayesianNetwork, TransformerClassifier, VisionTransformer
from ..posthoc.features import Features, extract_features
from ..training import fit

if TYPE_CHECKING:  # the config validates method names against the registry, which uses Run
    from .config import StudyConfig

__all__ = ["Run", "SignalTransformer"]


class SignalTransformer(TransformerClassifier):
    """A transformer over 1-D signals: ``(B, T)`` cut into windows of ``patch`` steps every
    ``stride`` steps (default ``stride = patch``: non-overlapping; ``stride < patch``:
    overlapping windows, ``(T - patch) / stride + 1`` tokens), each linearly embedded, a CLS
    token, learned positions.

    Shape:
        x ``(B, T)`` → windows ``(B, (T - patch) / stride + 1, patch)`` → logits
        ``(*S, B, num_classes)``.
    """

    def __init__(
        self,
        num_classes: int,
        length: int = 40,
        patch: int = 4,
        stride: int | None = None,
        **kwargs: Any,
    ) -> None:
        length, patch = check_int("length", length, 1), check_int("patch", patch, 1)
        stride = patch if stride is None else check_int("stride", stride, 1)
        if patch > length or (length - patch) % stride:
            raise ValueError(
                f"windows of patch={patch} every stride={stride} steps must tile length={length} "
                f"exactly ((length - patch) divisible by stride)"
            )
        self.length, self.patch, self.stride = length, patch, stride
        kwargs.setdefault("pooling", "cls")
        super().__init__(
            num_classes, input_dim=patch, max_len=(length - patch) // stride + 1, **kwargs
        )

    def patchify(self, x: Tensor) -> Tensor:
        """``(B, T)`` → ``(B, (T - patch) / stride + 1, patch)`` windows (a view of ``x``)."""
        return x.unfold(-1, self.patch, self.stride)

    def check_batch(self, x: Tensor, y: Tensor | None) -> None:
        if not isinstance(x, Tensor) or x.dim() != 2 or x.shape[1] != self.length:
            raise ValueError(
                f"signals must be (B, {self.length}); got {tuple(getattr(x, 'shape', ()))}"
            )
        super().check_batch(self.patchify(x), y)

    def forward_logits(self, x: Tensor, y: Tensor | None = None, num_samples: int = 1) -> Tensor:
        return super().forward_logits(self.patchify(x), y, num_samples)


def _one_pass(net: TransformerClassifier, x: Tensor) -> Features:
    """Logits and the pooled features the head reads, one pass (no token view)."""
    return extract_features(net, x, tokens=False)


@dataclass
class Run:
    """A dataset × held-out set × seed, and what its methods share (``cache``)."""

    cfg: StudyConfig
    dataset: str
    pair: tuple[int, ...]
    seed: int
    data: DigitsData
    far: dict[str, Tensor]
    corrupted: dict[tuple[str, int], Tensor]
    cache: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def load(cls, cfg: StudyConfig, dataset: str, pair: tuple[int, ...], seed: int) -> Run:
        """The split of ``dataset`` with ``pair`` held out, and its far-OOD sets (with the
        training classes' ``moments`` set) and corrupted sets (all seeded by ``seed``)."""
        if dataset == "fortunes":
            from ..data.fortunes import load_fortunes_data

            data: Any = load_fortunes_data(seed=seed, holdout_classes=pair)
            v = data.vocab_size
            tokens: dict[tuple[str, int], Tensor] = {
                (k, s): corrupt_tokens(data.x_test, k, s, v, seed)
                for k in TOKEN_CORRUPTIONS for s in cfg.severities
            }  # fmt: skip
            far = token_far_ood_suite(data.x_test, v, seed, train=(data.x_train, data.y_train))
            return cls(cfg, dataset, pair, seed, data, far, tokens)
        if dataset == "digits":
            data = load_digits_data(seed=seed, holdout_classes=pair)
            corrupt: Any = corrupt_images
            kinds: tuple[str, ...] = CORRUPTION_KINDS
        else:
            data = load_mnist1d_data(seed=seed, holdout_classes=pair)
            corrupt, kinds = corrupt_sequences, SEQUENCE_CORRUPTIONS
        corrupted = {
            (k, s): corrupt(data.x_test, k, s, seed) for k in kinds for s in cfg.severities
        }
        far = far_ood_suite(data.x_test, seed, train=(data.x_train, data.y_train))
        return cls(cfg, dataset, pair, seed, data, far, corrupted)

    @property
    def model(self) -> dict[str, Any]:
        return self.cfg.model(self.dataset)

    def network(self, attention: AttentionConfig | None) -> TransformerClassifier:
        """A fresh network of this dataset's architecture (``attention=None``: softmax)."""
        m, c = self.model, self.data.num_classes
        kw = dict(d_model=m["d_model"], nhead=m["nhead"], num_layers=m["num_layers"],
                  dim_feedforward=m["dim_feedforward"], dropout=self.cfg.dropout,
                  attention=attention)  # fmt: skip
        if self.dataset == "digits":
            return VisionTransformer(c, image_size=8, patch_size=m["patch"], **kw)
        if self.dataset == "fortunes":
            assert isinstance(self.data, FortunesData)
            vocab, length = self.data.vocab_size, self.data.x_train.shape[1]
            return TransformerClassifier(c, vocab_size=vocab, max_len=length, pooling="cls", **kw)
        return SignalTransformer(
            c, length=self.data.x_train.shape[1], patch=m["patch"], stride=m.get("stride"), **kw
        )

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

    def views(self, split: str, x: Tensor | None = None) -> Features:
        """:class:`~bayesattn.posthoc.Features` ``(logits, cls, tokens)`` of the deterministic
        network (member 0) on a named split (cached) or on ``x`` (the last ``x`` is remembered
        by identity, as in :meth:`features`)."""
        return self._member0("views", extract_features, split, x)

    def passes(self, split: str, x: Tensor | None = None) -> Features:
        """:class:`~bayesattn.posthoc.Features` ``(logits, cls)`` of member 0 without the token
        view (its last layer computes the CLS row only), cached as :meth:`views`."""
        return self._member0("features", _one_pass, split, x)

    def features(self, split: str, x: Tensor | None = None) -> Tensor:
        """Pooled features ``(B, E)`` of the deterministic network (member 0) on a named split
        (cached) or on ``x`` (the last ``x`` is remembered, by identity: a post-hoc method's
        prediction and its own score on the same inputs share one pass through the network,
        as a user's would)."""
        return self.passes(split, x).cls

    def _member0(
        self, kind: str, read: Callable[[TransformerClassifier, Tensor], Any], split: str,
        x: Tensor | None,
    ) -> Any:
        """``read(member 0, inputs)``, cached per named split under ``kind/split``; for explicit
        ``x`` only the last one is kept (by identity), so a prediction and an own score on the
        same inputs share one pass."""
        net = self.members(1)[0][0]
        assert isinstance(net, TransformerClassifier)
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
